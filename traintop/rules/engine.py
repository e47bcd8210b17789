"""The rules engine: pure functions of the store, with hysteresis, producing findings.

No I/O and no Textual here. A rule says, at each evaluation, for which subjects
(``gpu0``, ``host``, ``process``) its condition holds and why; the engine turns that
into findings (``traintop.findings.Finding``: frozen, a change is a new record) that start
only once the condition has held for ``raise_after`` seconds and end only once it has been
false for ``clear_after`` seconds, so noise does not make them flap. A rule may also say,
for a raised alert, that its condition has plainly reversed (``REVERSED``: the alert ends
at once) or that it lapsed, with the current numbers (``LAPSED``: the evidence follows
them while the alert waits to clear).

A finding must also hold *now*: besides its own window, each rule is asked again over only the
last few seconds (``now_s``, at least a dozen samples), with every window it reads cut to that.
An alert starts only when both say so, and ends once the recent verdict has failed for
``SETTLE_S`` (its end is when it stopped holding), however much of the old cause its longer
window still holds. A rule whose verdict is already about now (a stall counts the seconds since
the last step, an error is an event) says ``now_s = None``.

A rule judged after the fact, over a time range already read (the cross-host rules, on
Prometheus's grid: rules/across/), says ``after_the_fact = True``: its finding starts where its
situation began (the verdict's first instant, or its ``since``) and ends at the last instant it
held, and a gap shorter than ``clear_after`` is bridged before it is raised as after. A verdict
may name the host it is about (``Verdict.host``); the finding carries it, with the rule's scope.

A stronger finding explains weaker ones (``explains``: a stall explains idle GPUs, a slow rank
the others' waiting): while both are up the weaker one carries ``explained_by`` and is shown
under it, never as a cause of its own. A cause never begins after its effect: a finding explains
only those whose situation began no earlier than its own (``CAUSE_SLACK_S`` apart at most: the
rules' windows fill at different rates). A situation begins when the rule's verdict first held,
or where the rule knows better, when it says (``Verdict.since``: the stall, at the last step).

While an alert is up its evidence is the latest sentence (the numbers now); when it ends,
it keeps the most informative sentence seen while its condition fully held: the one
quoting the most measured figures, the latest of those on a tie, with the advice that came
with it (a finding may drop a remedy that does not fit now; a change of advice makes the
older sentences stale). That is what a recording and ``analyze`` keep.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

from traintop import metrics
from traintop.attribution import GpuFeed, WorkerLoad, gpu_feeds
from traintop.findings import Finding, Severity
from traintop.rules.config import DEFAULT, Thresholds
from traintop.rules.declaration import Declared
from traintop.samples import Frame, GpuSample, HostSample, ProcessSample, RankSample
from traintop.store import Store, mean


@dataclass(frozen=True, slots=True)
class Verdict:
    """One rule's verdict for one subject at one evaluation."""

    subject: str
    evidence: str
    severity: Severity | None = None  # None: the rule's default
    state: str = "holds"  # HOLDS, WEAK, LAPSED or REVERSED
    remedies: tuple[str, ...] | None = None  # None: the rule's; a rule may drop advice that does not fit now
    since: float | None = None  # when the situation began, where the rule knows (None: when the verdict first held)
    host: str | None = None  # the host it is about (a cross-host rule's verdict); None: the store's own

    @property
    def holding(self) -> bool:
        return self.state in (HOLDS, WEAK)


HOLDS = "holds"  # the condition holds at the rule's thresholds
WEAK = "weak"  # it holds only by the relaxed thresholds of a raised alert: keeps it up, is not its best evidence
LAPSED = "lapsed"  # it does not hold; the evidence shows the numbers now while the alert waits to clear
REVERSED = "reversed"  # it has plainly reversed (not noise): a raised alert ends now

_FIGURE = re.compile(r"\d+(?:\.\d+)?")

DEFAULT_NOW_S = 5.0  # "now": the last few seconds a rule is asked about again
NOW_MIN_SAMPLES = 6  # ... and never fewer samples than this (6 s at 1 Hz; a rule that counts more says so)
RECENT_MIN_N = 4  # the fewest samples a rule's series may hold there
SETTLE_S = 4.0  # a raised alert ends once its recent verdict has failed this long
CAUSE_SLACK_S = 5.0  # a cause's situation may seem to begin this much after its effect's (windows fill unevenly)


def _pid_for(ctx: "RuleContext", subject: str) -> int | None:
    """The process a remedy's ``--pid PID`` means: the attached job, else the one process on that GPU."""
    if ctx.process is not None:
        return ctx.process.pid
    i = metrics.gpu_index(subject)
    if i is not None:
        procs = [p for g in ctx.gpus() if g.index == i for p in g.processes]
        if len(procs) == 1:
            return procs[0].pid
    return None


def fill_pid(remedies: tuple[str, ...], pid: int | None) -> tuple[str, ...]:
    """``py-spy dump --pid PID`` with the real PID where it is known."""
    if pid is None:
        return remedies
    return tuple(r.replace("--pid PID", f"--pid {pid}") for r in remedies)


def informative(evidence: str) -> int:
    """How many measured figures a sentence quotes."""
    return len(_FIGURE.findall(evidence))


@dataclass(frozen=True, slots=True)
class RuleContext:
    store: Store
    now: float
    config: Thresholds
    is_active: Callable[..., bool]  # an alert is raised (possibly waiting to clear): (rule, subject[, host])
    is_holding: Callable[..., bool] = lambda rule, subject, host=None: False  # its condition holds now
    pause_stacks: dict = field(default_factory=dict)  # pid -> the latest StackDump its probe took in a pause (live)
    _cache: dict = field(default_factory=dict)  # what several rules ask of one evaluation
    across: Any = None  # a cross-host rule's read range (rules/across/grid.py); None on one host's store

    @property
    def frame(self) -> Frame | None:
        return self.store.latest

    @property
    def process(self) -> ProcessSample | None:
        """The attached job's latest sample (alive or not), if one is attached."""
        frame = self.store.latest
        return frame.process if frame else None

    @property
    def host(self) -> HostSample | None:
        frame = self.store.latest
        return frame.host if frame else None

    def gpus(self) -> tuple[GpuSample, ...]:
        """The latest sample of every GPU."""
        frame = self.store.latest
        return frame.gpus if frame else ()

    def gpu_indices(self) -> list[int]:
        return [g.index for g in self.gpus()]

    def ranks(self) -> list[tuple[str, RankSample]]:
        """Every probed rank of the latest frame with its subject (``rank0``; the series prefix too)."""
        frame = self.store.latest
        return [(metrics.rank_id(r, k), r) for k, r in enumerate(frame.ranks if frame else ())]

    # -- what feeds each GPU (traintop.attribution): judge a GPU by its own rank's data ---------
    def feed(self, gpu: int) -> GpuFeed:
        feeds = self._cache.get("feeds")
        if feeds is None:
            feeds = self._cache["feeds"] = gpu_feeds(self.store.latest)
        return feeds.get(gpu) or GpuFeed(gpu, frozenset())

    def worker_load(self, gpu: int) -> WorkerLoad:
        """The loader workers feeding this GPU's rank(s), by the starvation rule's definition of busy."""
        return WorkerLoad(self.feed(gpu).workers, self.config.starvation_busy_worker_cpu)

    def input_wait(self, gpu: int, window_s: float) -> float | None:
        """Mean share of time this GPU's rank(s) waited for input (probe), None without 3 readings."""
        vals = [v for subject, _ in self.feed(gpu).ranks for v in self.rank_window(subject, "input_wait", window_s)]
        return sum(vals) / len(vals) if len(vals) >= 3 else None

    # -- series: names from traintop.metrics (an unknown name raises) --------------------------
    # The rules ask for the same few windows many times an evaluation (GPU 0's utilization
    # over 20 s, seven times): each is read from the store once. What comes back is shared:
    # a rule reads it, never changes it.
    def values(self, key: str, window_s: float) -> list[float]:
        """The values present over the last ``window_s`` seconds."""
        k = ("values", key, window_s)
        got = self._cache.get(k)
        if got is None:
            got = self._cache[k] = self.store.present(key, window_s)
        return got

    def pairs(self, key: str, window_s: float, *, min_n: int = 0, min_span: float = 0.0) -> list[tuple[float, float]]:
        """(t, value) pairs over the window; [] unless at least ``min_n`` of them span ``min_span`` of it."""
        k = ("pairs", key, window_s)
        pairs = self._cache.get(k)
        if pairs is None:
            pairs = self._cache[k] = self.store.window_pairs(key, window_s)
        if len(pairs) < max(min_n, 1) or pairs[-1][0] - pairs[0][0] < min_span * window_s:
            return []
        return pairs

    def gpu_window(self, index: int, name: str, window_s: float) -> list[float]:
        return self.values(metrics.gpu_key(index, name), window_s)

    def gpu_mean(self, index: int, name: str, window_s: float) -> float | None:
        return mean(self.gpu_window(index, name, window_s))

    def gpu_reasons(self, index: int, window_s: float) -> list[int]:
        """The clock-event reason masks over the window."""
        return [int(r) for r in self.gpu_window(index, "reasons", window_s)]

    def gpu_pairs(self, index: int, name: str, window_s: float, *, min_n: int = 0,
                  min_span: float = 0.0) -> list[tuple[float, float]]:
        return self.pairs(metrics.gpu_key(index, name), window_s, min_n=min_n, min_span=min_span)

    def rank_window(self, rank_subject: str, name: str, window_s: float) -> list[float]:
        return self.values(metrics.rank_key(rank_subject, name), window_s)

    def rank_pairs(self, rank_subject: str, name: str, window_s: float, *, min_n: int = 0,
                   min_span: float = 0.0) -> list[tuple[float, float]]:
        return self.pairs(metrics.rank_key(rank_subject, name), window_s, min_n=min_n, min_span=min_span)

    def host_window(self, name: str, window_s: float) -> list[float]:
        return self.values(metrics.host_key(name), window_s)

    def proc_window(self, name: str, window_s: float) -> list[float]:
        return self.values(metrics.proc_key(name), window_s)


class RecentContext(RuleContext):
    """The same store, every window cut to the last ``recent_s`` seconds: what holds *now*."""

    __slots__ = ("recent_s",)
    recent_s: float

    def __init__(self, base: RuleContext, recent_s: float) -> None:
        super().__init__(store=base.store, now=base.now, config=base.config, is_active=base.is_active,
                         is_holding=base.is_holding, _cache={})
        object.__setattr__(self, "recent_s", recent_s)

    def values(self, key: str, window_s: float) -> list[float]:
        return super().values(key, min(window_s, self.recent_s))

    def pairs(self, key: str, window_s: float, *, min_n: int = 0, min_span: float = 0.0) -> list[tuple[float, float]]:
        # a rule's sample count is for its whole window: a few seconds at 1 Hz hold fewer
        return super().pairs(key, min(window_s, self.recent_s), min_n=min(min_n, RECENT_MIN_N), min_span=min_span)


class Rule(Declared, Protocol):
    """A single-host rule: its declaration (rules/declaration.py; ``HostRule`` gives the defaults),
    its hysteresis, and its verdicts on the store."""

    raise_after: float
    clear_after: float

    def evaluate(self, ctx: RuleContext) -> Iterable[Verdict]: ...

    # optional: now_s (float | None, DEFAULT_NOW_S when absent), explains_all_gpus, after_the_fact


@dataclass
class _Track:
    """One rule and subject, followed from one evaluation to the next (the engine's own)."""

    first_true: float | None = None
    last_true: float | None = None
    alert: Finding | None = None  # its latest record; the engine replaces it whenever it changes
    best: str = ""  # the most informative evidence while the condition fully held
    best_remedies: tuple[str, ...] | None = None  # the advice that came with it
    best_figures: int | None = None  # informative(best), counted once
    not_now_since: float | None = None  # a raised alert's recent verdict has failed since then
    onset: float | None = None  # when its situation began (Verdict.since, else when the verdict first held)
    restored: bool = False  # taken up from a recording: kept until the store holds enough to judge it now
    since: float | None = None  # the earliest ``Verdict.since`` of its run (a rule judged after the fact)

    @property
    def up(self) -> bool:
        return self.raised() is not None

    def raised(self) -> Finding | None:
        """Its finding while raised (not ended), else None."""
        return self.alert if self.alert is not None and self.alert.end is None else None

    def keep_if_better(self, evidence: str, remedies: tuple[str, ...]) -> None:
        # advice that changed (underuse once memory creeps) makes the older sentence stale
        if evidence == self.best and remedies == self.best_remedies:
            return
        if self.best_figures is None:
            self.best_figures = informative(self.best)
        figures = informative(evidence)
        if remedies != self.best_remedies or figures >= self.best_figures:
            self.best, self.best_remedies, self.best_figures = evidence, remedies, figures

    def ended(self, now: float, rule=None) -> dict:
        """The changes that end its finding at ``now`` (for a rule judged after the fact, at the last
        instant it held): it keeps its most informative sentence."""
        if getattr(rule, "after_the_fact", False) and self.last_true is not None:
            now = self.last_true
        self.not_now_since = None
        changes: dict = {"end": now}
        if self.best:
            changes["evidence"] = self.best
            if self.best_remedies is not None:
                changes["remedies"] = self.best_remedies
        return changes


@dataclass
class RulesEngine:
    rules: list[Rule]
    config: Thresholds = DEFAULT
    eval_every_s: float = 1.0
    max_history: int = 500
    dropped: int = 0  # ended findings let go to stay within max_history
    _findings: dict = field(default_factory=dict)  # id -> its latest Finding, in the order they were raised (bounded)
    _tracks: dict = field(default_factory=dict)
    _last_eval: float | None = None
    _next_id: int = 1
    _changed: dict = field(default_factory=dict)  # id -> the latest record of what changed this evaluation
    pause_stacks: dict = field(default_factory=dict)  # pid -> StackDump: the monitor keeps the probes' latest
    # A replay of a recording these rules made (``follow``): its findings start and end where the
    # recording says, by start; the rules still run for the evidence's figures of now.
    _follow: list | None = None
    _follow_ids: dict = field(default_factory=dict)  # id -> its recorded finding
    _follow_next: int = 0  # the first of them not yet started
    _follow_end: float | None = None  # the recording's last sample: what ends there was ended by the session

    @property
    def alerts(self) -> list[Finding]:
        """Every finding kept, oldest first: frozen records (the engine makes a new one on each change)."""
        return list(self._findings.values())

    @property
    def active(self) -> list[Finding]:
        return [a for a in self._findings.values() if a.end is None]

    def reset(self) -> None:
        self._findings.clear()
        self._tracks.clear()
        self._last_eval = None
        self._follow_next = 0

    def follow(self, alerts: list[Finding] | None, session_end: float | None = None) -> None:
        """From now on take the findings' starts and ends from ``alerts`` (a recording's, made by these
        rules and thresholds), so a replay shows each where the live session raised and ended it,
        whichever way it got there; None: judge again. Call it before playing from the start."""
        self._follow = sorted(alerts, key=lambda a: (a.start, a.id)) if alerts is not None else None
        self._follow_ids = {a.id: a for a in self._follow or ()}
        self._follow_end = session_end
        self._follow_next = 0

    @property
    def following(self) -> bool:
        return self._follow is not None

    def _ended_by(self, a: Finding, now: float) -> bool:
        """Whether a recorded finding has ended at ``now``: one that ends at the recording's last
        sample was closed because the session stopped, and is up to that sample."""
        return a.end is not None and a.end <= now and not (self._follow_end is not None and a.end >= self._follow_end)

    def restore(self, alerts: list[Finding], now: float, session_end: float | None = None) -> None:
        """Take up the findings a recording says were raised by ``now`` (a replay's seek): those
        active then carry on, with their hysteresis, as if the rules had run up to ``now``.

        A finding that ends at ``session_end`` (the recording's last sample) was closed because
        the session stopped, not because its condition cleared: up to that sample it is active,
        as it was when the recording played to its end."""
        self.reset()
        kept = []
        for a in sorted(alerts, key=lambda a: a.start):
            if a.start > now:
                continue
            ended = a.end is not None and a.end <= now and not (session_end is not None and a.end >= session_end)
            a = dataclasses.replace(a, end=a.end if ended else None)
            kept.append(a)
            if a.end is None:
                self._tracks[(a.rule, a.subject, a.host)] = _Track(first_true=a.start, last_true=now, alert=a,
                                                           best=a.evidence, best_remedies=a.remedies, restored=True)
        self._findings = {a.id: a for a in kept[-self.max_history:]}
        self._next_id = max((a.id for a in alerts), default=0) + 1
        self._last_eval = None
        self._follow_next = bisect.bisect_right([a.start for a in self._follow or ()], now)

    def _update(self, tr: _Track, **changes) -> Finding:
        """A new record of ``tr``'s finding with ``changes``, kept and counted as changed (only a raised
        finding changes)."""
        assert tr.alert is not None
        a = tr.alert = dataclasses.replace(tr.alert, **changes)
        self._findings[a.id] = self._changed[a.id] = a
        return a

    def _is_active(self, rule_id: str, subject: str, host: str | None = None) -> bool:
        tr = self._tracks.get((rule_id, subject, host))
        return bool(tr and tr.up)

    def evaluate(self, store: Store, now: float | None = None, force: bool = False) -> list[Finding]:
        """Evaluate every rule; return the findings that started, changed or ended (their latest records)."""
        if now is None:
            now = store.t_last
        if now is None:
            return []
        if not force and self._last_eval is not None and (
                now < self._last_eval or _period(now, self.eval_every_s) == _period(self._last_eval, self.eval_every_s)):
            return []
        self._last_eval = now
        return self.judge(store, now)

    def judge(self, store: Store, now: float, across: Any = None) -> list[Finding]:
        """Every rule at ``now`` (``evaluate`` without its pacing; ``across``: the read range a
        cross-host rule judges, cluster/judge.py plays it instant by instant)."""
        self._changed = {}
        following = self._follow is not None
        if following:
            self._take_recorded(now)
        holding_now: set[tuple[str, str, str | None]] = set()
        ctx = RuleContext(store=store, now=now, config=self.config, is_active=self._is_active,
                          is_holding=lambda rule_id, subject, host=None: (rule_id, subject, host) in holding_now,
                          pause_stacks=self.pause_stacks, across=across)
        recent_min_s = NOW_MIN_SAMPLES * _interval(store) if across is None else 0.0
        for rule in self.rules:  # in order: a later rule may defer to an earlier one's verdict
            self._judge(rule, ctx, holding_now, recent_min_s, following)
        self._explain()
        self._forget_oldest()
        return list(self._changed.values())

    def _judge(self, rule, ctx: RuleContext, holding_now: set[tuple[str, str, str | None]], recent_min_s: float,
               following: bool) -> None:
        """One rule at ``ctx.now``: the subjects it holds for noted in ``holding_now`` (for the rules
        after it), then each of its findings raised, updated or ended."""
        verdicts = {(f.subject, f.host): f for f in rule.evaluate(ctx)}
        holding = {key: f for key, f in verdicts.items() if f.holding}
        holding_now.update((rule.id, *key) for key in holding)
        now_check = _NowCheck(rule, ctx, max(getattr(rule, "now_s", DEFAULT_NOW_S) or 0.0, recent_min_s))
        for verdict in holding.values():
            self._hold(rule, verdict.subject, verdict, ctx, now_check, following)
        for (rule_id, subject, host), tr in self._tracks.items():
            if rule_id == rule.id:
                self._settle(rule, subject, tr, verdicts.get((subject, host)), (subject, host) in holding, now_check,
                             ctx, following)

    def _hold(self, rule, subject: str, verdict, ctx: RuleContext, now_check: _NowCheck, following: bool) -> None:
        """A verdict that holds: its finding raised once it has held for ``raise_after`` and holds now
        too (not while following a recording), or the raised one's evidence, severity and remedies
        brought up to date."""
        now = ctx.now
        tr = self._tracks.setdefault((rule.id, subject, verdict.host), _Track())
        if tr.first_true is None:
            tr.first_true = now
        tr.last_true = now
        if verdict.since is not None and (tr.since is None or verdict.since < tr.since):
            tr.since = verdict.since
        severity = verdict.severity or rule.severity
        remedies = fill_pid(rule.remedies if verdict.remedies is None else verdict.remedies, _pid_for(ctx, subject))
        if tr.up:
            if verdict.state == HOLDS and now_check(subject):  # the kept sentence held now too
                tr.keep_if_better(verdict.evidence, remedies)
                severity = max(tr.alert.severity, severity)
            else:
                severity = tr.alert.severity
            if tr.alert.evidence != verdict.evidence or tr.alert.severity != severity \
                    or tr.alert.remedies != remedies:
                self._update(tr, evidence=verdict.evidence, severity=severity, remedies=remedies)
        elif not following and verdict.state == HOLDS and now - tr.first_true >= rule.raise_after \
                and now_check(subject):
            start = min(tr.first_true, tr.since if tr.since is not None else now) \
                if getattr(rule, "after_the_fact", False) else now
            tr.alert = Finding(rule.id, rule.title, subject, severity, start, None, verdict.evidence,
                               remedies, id=self._next_id, host=verdict.host,
                               scope=None if verdict.host is None else rule.scope)
            tr.best, tr.best_remedies, tr.best_figures = verdict.evidence, remedies, None
            tr.not_now_since = None
            tr.onset = tr.first_true
            self._next_id += 1
            self._findings[tr.alert.id] = self._changed[tr.alert.id] = tr.alert
        if tr.up and verdict.since is not None and (tr.onset is None or verdict.since < tr.onset):
            tr.onset = verdict.since

    def _settle(self, rule, subject: str, tr: _Track, verdict, held: bool, now_check: _NowCheck,
                ctx: RuleContext, following: bool) -> None:
        """A track of ``rule`` after its verdicts (``verdict`` None where it gave none for ``subject``):
        its finding ended where the verdict reverses, where its cause has ended for ``SETTLE_S``, or
        where it has not held for ``clear_after``; a lapsed verdict's evidence taken up."""
        now = ctx.now
        if not held and (not getattr(rule, "after_the_fact", False) or tr.last_true is None
                         or now - tr.last_true >= rule.clear_after):  # after the fact: short gaps bridged
            tr.first_true = tr.since = None
        alert = tr.raised()
        if alert is None:
            return
        if following:  # it ends where the recording says; the figures follow now
            if not held and verdict is not None and verdict.state == LAPSED and alert.evidence != verdict.evidence:
                self._update(tr, evidence=verdict.evidence)
            return
        if verdict is not None and verdict.state == REVERSED:
            self._update(tr, **tr.ended(now, rule))
            return
        if tr.restored and ctx.store.span() < now_check.recent_s:
            pass  # taken up from a recording with little history yet: nothing to judge now by
        elif not now_check(subject):  # its cause has ended, whatever the longer window still holds
            if tr.not_now_since is None:
                tr.not_now_since = now
            elif now - tr.not_now_since >= SETTLE_S:
                self._update(tr, **tr.ended(tr.not_now_since))
                tr.first_true = now if held else None  # raised again only after raise_after
                return
        else:
            tr.not_now_since = None
        if held:
            return
        if tr.last_true is not None and now - tr.last_true >= rule.clear_after:
            self._update(tr, **tr.ended(now, rule))
        elif verdict is not None and verdict.state == LAPSED and alert.evidence != verdict.evidence:
            self._update(tr, evidence=verdict.evidence)

    def _forget_oldest(self) -> None:
        """Beyond ``max_history`` findings, the oldest ended ones go (counted in ``dropped``)."""
        if len(self._findings) > self.max_history:
            keep_from = len(self._findings) - self.max_history
            dropped = [i for i, a in list(self._findings.items())[:keep_from] if a.end is not None]
            for i in dropped:
                del self._findings[i]
            self.dropped += len(dropped)

    def _take_recorded(self, now: float) -> None:
        """Follow the recording to ``now``: its findings started by then are up (or ended, where
        they ended by then), with their recorded id and start; those it ended by then end."""
        follow = self._follow or []
        while self._follow_next < len(follow) and follow[self._follow_next].start <= now:
            a = follow[self._follow_next]
            self._follow_next += 1
            if self._ended_by(a, now):
                self._findings[a.id] = self._changed[a.id] = a
                continue
            a = dataclasses.replace(a, end=None)
            self._tracks[(a.rule, a.subject, a.host)] = _Track(first_true=a.start, last_true=now, alert=a,
                                                       best=a.evidence, best_remedies=a.remedies, restored=True)
            self._findings[a.id] = self._changed[a.id] = a
        for tr in self._tracks.values():
            a = self._follow_ids.get(tr.alert.id) if tr.up else None
            if a is not None and self._ended_by(a, now):
                self._update(tr, end=a.end, evidence=a.evidence, remedies=a.remedies)

    def _explain(self) -> None:
        """Mark each active finding that a stronger active one explains (see ``explains``)."""
        up = [tr for tr in self._tracks.values() if tr.up]
        if not up:
            return
        rules = {r.id: r for r in self.rules}
        strong = [(t, rules[t.alert.rule]) for t in up if getattr(rules.get(t.alert.rule), "explains", ())]
        explainable = {i for _, rule in strong for i in rule.explains}
        for tr in up:
            a = tr.alert
            if a.rule not in explainable and a.explained_by is None:
                continue
            by = None
            for cause, rule in strong:
                b = cause.alert
                if b.id == a.id or a.rule not in rule.explains or not _before(cause, tr):
                    continue
                if b.subject == a.subject or (getattr(rule, "explains_all_gpus", False)
                                              and (a.subject.startswith(("gpu", "rank")) or a.subject in ("gpus", "process"))):
                    by = f"{b.rule} {b.subject}"
                    break
            if by != a.explained_by:
                self._update(tr, explained_by=by)

    def close_all(self, now: float) -> list[Finding]:
        """End every active finding (the session ended)."""
        self._changed = {}
        rules = {r.id: r for r in self.rules}
        for (rule_id, _, _), tr in self._tracks.items():
            if tr.up:
                self._update(tr, **tr.ended(now, rules.get(rule_id)))
        for i, a in self._findings.items():
            if a.end is None:  # not followed by a track (none should be): ended as it stands
                self._findings[i] = self._changed[i] = dataclasses.replace(a, end=now)
        return list(self._changed.values())


def _before(cause: _Track, effect: _Track) -> bool:
    """The cause's situation began no later than the effect's (within CAUSE_SLACK_S); both are raised."""
    if cause.onset is None or effect.onset is None:  # taken up from a recording: its start is all there is
        assert cause.alert is not None and effect.alert is not None
        return cause.alert.start <= effect.alert.start + CAUSE_SLACK_S
    return cause.onset <= effect.onset + CAUSE_SLACK_S


def _period(t: float, every: float) -> int:
    """The evaluation period ``t`` falls in, on a grid of absolute time counted in the milliseconds a
    recording keeps: live, a re-run and a replay evaluate at the same samples however they began."""
    return int(round(t * 1000)) // max(1, int(round(every * 1000)))


def _interval(store: Store) -> float:
    """The sampling interval, from the last 10 s of samples (0.5 s before there are any)."""
    times = store.times(10.0)
    if len(times) < 2:
        return 0.5
    return max((times[-1] - times[0]) / (len(times) - 1), 0.01)


class _NowCheck:
    """Whether a rule's verdict for a subject holds over the last ``recent_s`` seconds too
    (the rule is asked again, once, only if somebody needs to know)."""

    __slots__ = ("rule", "ctx", "recent_s", "verdicts")

    def __init__(self, rule, ctx: RuleContext, recent_s: float) -> None:
        self.rule, self.ctx, self.recent_s = rule, ctx, recent_s
        self.verdicts: dict | None = None

    def __call__(self, subject: str) -> bool:
        if getattr(self.rule, "now_s", DEFAULT_NOW_S) is None:
            return True  # its verdict is about now already
        if self.verdicts is None:
            self.verdicts = {f.subject: f for f in self.rule.evaluate(RecentContext(self.ctx, self.recent_s))}
        f = self.verdicts.get(subject)
        return f is not None and f.holding
