"""Score traintop's diagnosis against the labelled corpus of real H200 runs.

Every run in tests/fixtures/corpus/ was recorded four ways at once (with the probe, without it,
an nvidia-smi query log, a dmon log; scripts/h200_corpus.sh) while the job wrote down what it
was doing, second by second. This re-runs the rules over each source (the recordings also
thinned to 1 Hz) and compares, second by second, what traintop said with what the job said
(bench/corpus_labels.py says what each label expects, allows and contradicts). Per rule and
source, over the situations that expect the rule (a run's labelled seconds that expect it, in a
row; a rule about repetition, the pause, has one situation per run: all of its labelled seconds):

  allowed    the start latency the rule is allowed (``allowed_start``): its raise_after, the span
             its verdict must see hold now (its now_s; where it judges now itself, its own window),
             and one evaluation
  recall     covered seconds / labelled seconds, both counted from the situation's start plus the
             allowed latency ("—" where no situation lasts that long)
  start      the longest wait from a situation's start to its finding's ("miss": never named)
  end        the longest a finding stayed up after its situation ended
  precision  the share of the rule's finding-seconds that a label expects or allows (or that
             fall within END_GRACE_S after the situation it names ended)
  wrong      seconds a finding was up whose advice the label contradicts (never allowed)
  blind      such seconds in a source that cannot carry what tells them apart (reported)

Runs are split (tests/fixtures/corpus/splits.json) into the training split, the runs the rules
were tuned on, and the held-out split, scored without tuning on them; each has its table. The
time ledger and MFU are scored too (bench/ledger_score.py).

    python bench/diagnosis_score.py                      # the tables
    python bench/diagnosis_score.py --detail             # and every run's situations and findings
    python bench/diagnosis_score.py --check tests/fixtures/corpus/score-baseline.json   # CI's gate
    python bench/diagnosis_score.py --write-baseline     # regenerate the baseline (deliberately)

``--check`` exits 1 (``check``) on any wrong-advice second in the training split (in the held-out
split, on more wrong-advice seconds than the baseline recorded: a held-out run is scored, never
tuned on; mending what it shows moves it to training, where none is allowed), on a rule and source pair that is in
the baseline and not scored or scored and not in the baseline, on a recall or precision below
the baseline's, a start or end latency above it, a situation missed that was not, and on a ledger
bucket or MFU off by more than the gate (5 points, 10 %) where the baseline did not already
record that miss (a recorded miss may not grow).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import pathlib
import sys
from collections import Counter, defaultdict

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from corpus_labels import LABELS, SOURCES, carried, label  # noqa: E402

CORPUS = REPO / "tests" / "fixtures" / "corpus"
BASELINE = CORPUS / "score-baseline.json"
SPLITS = CORPUS / "splits.json"
END_GRACE_S = 10.0  # a finding may take this long to end once its cause has (the goal for "end")
RECALL_SLACK = 0.02  # --check: a recall or precision this much below the baseline is a drop (rounding)
LATENCY_SLACK_S = 1.0  # --check: a start or end latency this much above the baseline is a rise
EVAL_S = 1.0  # the engine judges once a second: a finding may come that much after it could
REPEATED = ("pause",)  # rules about a pattern over a run: all its labelled seconds are one situation


def runs(corpus: pathlib.Path = CORPUS) -> list[str]:
    return sorted(p.name[: -len(".labels.jsonl.gz")] for p in corpus.glob("*.labels.jsonl.gz"))


def splits(corpus: pathlib.Path = CORPUS) -> dict[str, list[str]]:
    """{"training": [...], "held_out": [...]}: every run of the corpus in exactly one (ValueError if not)."""
    data = json.loads((corpus / SPLITS.name).read_text())
    out = {k: list(data.get(k, [])) for k in ("training", "held_out")}
    named = Counter(out["training"] + out["held_out"])
    twice = sorted(n for n, k in named.items() if k > 1)
    missing = sorted(set(runs(corpus)) - set(named))
    unknown = sorted(set(named) - set(runs(corpus)))
    if twice or missing or unknown:
        raise ValueError("splits.json: " + "; ".join(
            f"{what}: {', '.join(names)}" for what, names in (("in both splits", twice), ("in no split", missing),
                                                                ("not in the corpus", unknown)) if names))
    return out


@dataclasses.dataclass(frozen=True)
class Segment:
    label: str
    t0: float
    t1: float


def label_lines(name: str, corpus: pathlib.Path = CORPUS) -> list[dict]:
    return [json.loads(x) for x in gzip.open(corpus / f"{name}.labels.jsonl.gz", "rt")]


def segments(name: str, corpus: pathlib.Path = CORPUS, rank: object = "lowest") -> list[Segment]:
    """The job's own timeline: one rank's phases (its lowest by default), then ``ended`` from its exit on."""
    lines = label_lines(name, corpus)
    if rank == "lowest":
        ranks = {x.get("rank") for x in lines}
        rank = None if None in ranks else min(ranks)
    lines = sorted((x for x in lines if x.get("rank") == rank), key=lambda x: x["t"])
    out: list[Segment] = []
    for x in lines:
        if out and out[-1].label == x["phase"]:
            continue
        if out:
            out[-1] = dataclasses.replace(out[-1], t1=x["t"])
        out.append(Segment(x["phase"], x["t"], math.inf))
    exit_t = next((x["t"] for x in reversed(lines) if x["event"] == "exit"), lines[-1]["t"] + 1.0)
    out[-1] = dataclasses.replace(out[-1], t1=exit_t)
    out.append(Segment("ended", exit_t, math.inf))
    return out


def at_1hz(frames):
    """One frame a second with point samples only, as a 1-Hz recorder would have seen it."""
    return [dataclasses.replace(f, gpus=tuple(dataclasses.replace(g, util_min=None, util_max=None) for g in f.gpus))
            for k, f in enumerate(frames) if k % 10 == 0]


def load(name: str, source: str, corpus: pathlib.Path = CORPUS):
    from traintop.sources.importers import load as import_log
    from traintop.record.recording import RecordingReader

    if source in ("smi-100ms", "dmon-1s"):
        log = import_log(str(corpus / f"{name}-{'smi.csv' if source == 'smi-100ms' else 'dmon.txt'}.gz"))
        return log.info, list(log.frames())
    r = RecordingReader(str(corpus / f"{name}-{'probe' if source.startswith('probe') else 'noprobe'}.ttrec"))
    frames = list(r.frames())
    if source.startswith("noprobe"):
        # that recorder was attached by PID with no probe directory of its own, but it found the
        # job's probes all the same: what it would have seen without them is NVML and psutil alone
        frames = [dataclasses.replace(f, ranks=(), stacks=()) for f in frames]
    return r.info, at_1hz(frames) if source.endswith("1Hz") else frames


def default_rules():
    from traintop.rules import default_rules as rules

    return rules()


def judge(info, frames, config=None, rules=None):
    """Every finding the rules raise over these frames, as the live dashboard would have.
    ``rules``: a function that returns the engine's rules (default: the default engine's)."""
    from traintop.watch.monitor import Monitor
    from traintop.rules import DEFAULT, RulesEngine

    engine = RulesEngine(rules=(rules or default_rules)(), config=config if config is not None else DEFAULT)
    mon = Monitor(info, engine=engine)
    for f in frames:
        mon.ingest(f)
    mon.engine.close_all(frames[-1].t)
    return list(mon.engine.alerts)


def allowed_start(rule, config=None) -> float:
    """The start latency a rule is allowed: its raise_after, the span its verdict must see hold now
    (its now_s; where it judges now itself, its own window), and one evaluation."""
    from traintop.rules import DEFAULT
    from traintop.rules import pause
    from traintop.rules.engine import DEFAULT_NOW_S

    c = config if config is not None else DEFAULT
    own = {"stall": c.stall_min_s, "idle_gpu": c.idle_window_s, "step_regression": c.step_regression_window_s,
           "pause": pause.MIN_DATA_S + pause.EVERY_S}
    now_s = getattr(rule, "now_s", DEFAULT_NOW_S)
    span = own.get(rule.id, now_s or 0.0)
    return rule.raise_after + span + EVAL_S


@dataclasses.dataclass
class Cell:
    """One rule's score on one source, summed over the runs of a split."""

    allowed: float | None = None  # the start latency allowed (None: no situation expects the rule)
    found: float = 0.0  # labelled seconds after the allowed latency the finding was up
    due: float = 0.0  # labelled seconds after the allowed latency
    segments: int = 0  # situations
    misses: list = dataclasses.field(default_factory=list)  # runs where a situation was never named
    start: float = 0.0  # the longest start latency
    end: float = 0.0  # the longest end latency
    up: float = 0.0  # finding-seconds
    good: float = 0.0  # of those, expected or allowed
    wrong: float = 0.0
    blind: float = 0.0  # wrong-advice seconds where the source cannot carry what tells them apart
    wrong_where: list = dataclasses.field(default_factory=list)
    false_where: list = dataclasses.field(default_factory=list)

    @property
    def recall(self) -> float | None:
        return self.found / self.due if self.due else None

    @property
    def precision(self) -> float | None:
        return self.good / self.up if self.up else None


def _label_at(segs: list[Segment], t: float) -> str:
    if t < segs[0].t0:
        return "startup"
    for s in segs:
        if s.t0 <= t < s.t1:
            return s.label
    return "ended"


def _active(alerts, t: float, t_last: float) -> dict[str, float]:
    """The rules with a finding up at ``t`` (not explained by a stronger one), each with its start."""
    out: dict[str, float] = {}
    for a in alerts:
        if a.start <= t < (a.end if a.end is not None else t_last + 1) and not getattr(a, "explained_by", None):
            out[a.rule] = min(a.start, out.get(a.rule, a.start))
    return out


def _segment_start(segs: list[Segment], t: float) -> float:
    return next((s.t0 for s in segs if s.t0 <= t < s.t1), segs[-1].t0 if t >= segs[-1].t0 else -math.inf)


@dataclasses.dataclass
class Situation:
    """What a run's labels expect of one rule: the labelled intervals, in order."""

    expect: tuple[str, ...]
    parts: list[tuple[float, float]]
    labels: list[str]


def situations(segs: list[Segment], source: str) -> list[Situation]:
    """Consecutive segments that expect the same findings are one situation; a rule about repetition
    (REPEATED) has one per run, all of its labelled seconds."""
    out: list[Situation] = []
    repeated: dict[tuple, Situation] = {}
    for s in segs:
        lab = label(s.label)
        if not lab.expect or not carried(lab, source):
            continue
        if lab.expect[0] in REPEATED:
            if lab.expect in repeated:
                repeated[lab.expect].parts.append((s.t0, s.t1))
                repeated[lab.expect].labels.append(s.label)
                continue
            repeated[lab.expect] = Situation(lab.expect, [(s.t0, s.t1)], [s.label])
            out.append(repeated[lab.expect])
        elif out and out[-1].expect == lab.expect and out[-1].parts[-1][1] == s.t0 and lab.expect[0] not in REPEATED:
            out[-1].parts[-1] = (out[-1].parts[-1][0], s.t1)
            out[-1].labels.append(s.label)
        else:
            out.append(Situation(lab.expect, [(s.t0, s.t1)], [s.label]))
    return out


def score_run(name: str, source: str, cells: dict, detail: list | None = None, config=None,
              corpus: pathlib.Path = CORPUS, rules=None) -> None:
    segs = segments(name, corpus)
    info, frames = load(name, source, corpus)
    if not frames:
        return
    alerts = judge(info, frames, config, rules)
    by_id = {r.id: r for r in (rules or default_rules)()}
    t_first, t_last = frames[0].t, frames[-1].t
    grid = [t_first + k for k in range(int(t_last - t_first) + 1)]
    up = {t: _active(alerts, t, t_last) for t in grid}
    for sit in situations(segs, source):
        parts = [(max(lo, t_first), min(hi, t_last)) for lo, hi in sit.parts]
        parts = [(lo, hi) for lo, hi in parts if hi - lo >= 1]
        if not parts:
            continue
        cell = cells[(sit.expect[0], source)]
        allowed = min(allowed_start(by_id[r], config) if r in by_id else 0.0 for r in sit.expect)
        cell.allowed = allowed
        cell.segments += 1
        origin = parts[0][0]
        inside = [t for t in grid if any(lo <= t < hi for lo, hi in parts)]
        due = [t for t in inside if t >= origin + allowed]
        hit = [t for t in inside if set(up[t]) & set(sit.expect)]
        cell.due += len(due)
        what = f"{source:13} {name}: {'+'.join(dict.fromkeys(sit.labels))} {len(inside)} s, {'/'.join(sit.expect)}"
        if not hit:
            cell.misses.append(name)
            if detail is not None:
                detail.append(f"  {what} never raised ({len(due)} s due after {allowed:.0f} s)")
            continue
        start = hit[0] - origin
        cell.start = max(cell.start, start)
        covered = [t for t in due if t in set(hit)]
        cell.found += len(covered)
        hi = parts[-1][1]
        still = 0.0
        for t in (t for t in grid if t >= hi):
            if not set(up[t]) & set(sit.expect):
                break
            still = t - hi + 1
        if sit.parts[-1][1] < t_last:
            cell.end = max(cell.end, still)
        if detail is not None:
            detail.append(f"  {what} from +{start:.0f} s, {len(covered)}/{len(due)} s covered after {allowed:.0f} s, "
                          f"ended {still:.0f} s after")
    # a finding that was right may take END_GRACE_S to go once its situation has
    ends = [(s.t1, set(label(s.label).expect) | set(label(s.label).allow)) for s in segs]
    for t in grid:
        lab = label(_label_at(segs, t))
        if lab.ignore:
            continue
        began = _segment_start(segs, t)
        for rule, since in up[t].items():
            cell = cells[(rule, source)]
            cell.up += 1
            # a finding right before may take END_GRACE_S to go; one already up when the situation
            # changed gets as long to go before its advice counts as wrong
            grace = any(e <= t < e + END_GRACE_S and rule in exp for e, exp in ends)
            carried_over = since < began <= t < began + END_GRACE_S
            if rule in lab.expect or rule in lab.allow or grace:
                cell.good += 1
            else:
                where = f"{name}:{_label_at(segs, t)}"
                if where not in cell.false_where:
                    cell.false_where.append(where)
            if rule in lab.wrong and not grace and not carried_over:
                if not carried(lab, source, rule):
                    cell.blind += 1
                    continue
                cell.wrong += 1
                where = f"{name}:{_label_at(segs, t)}"
                if where not in cell.wrong_where:
                    cell.wrong_where.append(where)


def score(names=None, sources=SOURCES, detail: list | None = None, config=None, corpus: pathlib.Path = CORPUS,
          rules=None, pairs=None):
    """The cells of these runs (default: all) over these sources; ``pairs``: (run, source) pairs instead."""
    cells: dict = defaultdict(Cell)
    todo = pairs if pairs is not None else [(n, s) for n in (runs(corpus) if names is None else names) for s in sources]
    for name, source in todo:
        score_run(name, source, cells, detail, config, corpus, rules)
    return cells


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:.0f} %"


def table(cells: dict, sources=SOURCES) -> str:
    rules = sorted({r for r, _ in cells})
    head = (f"{'rule':15} {'source':13} {'sit':>3} {'allowed':>7} {'recall':>7} {'start':>6} {'end':>5} "
            f"{'precision':>9} {'up s':>5} {'wrong':>5} {'blind':>5}")
    out = [head, "-" * len(head)]
    for rule in rules:
        for source in sources:
            c = cells.get((rule, source))
            if c is None:
                continue
            start = "miss" if c.misses and not c.found and c.start == 0 else (f"{c.start:.0f} s" if c.segments else "—")
            out.append(f"{rule:15} {source:13} {c.segments:>3} {(f'{c.allowed:.0f} s' if c.allowed is not None else '—'):>7} "
                       f"{_pct(c.recall):>7} {start:>6} {(f'{c.end:.0f} s' if c.segments else '—'):>5} "
                       f"{_pct(c.precision):>9} {c.up:>5.0f} {c.wrong:>5.0f} {c.blind:>5.0f}"
                       + (f"  misses: {', '.join(c.misses)}" if c.misses else "")
                       + (f"  wrong: {', '.join(c.wrong_where)}" if c.wrong_where else ""))
    return "\n".join(out)


def to_json(cells: dict) -> dict:
    return {f"{rule}|{source}": {"segments": c.segments, "allowed_s": c.allowed, "recall": c.recall,
                                 "due_s": c.due, "precision": c.precision, "start_s": c.start, "end_s": c.end,
                                 "up_s": c.up, "wrong_s": c.wrong, "blind_s": c.blind, "misses": c.misses,
                                 "wrong_where": c.wrong_where, "false_where": c.false_where}
            for (rule, source), c in sorted(cells.items())}


def check_cells(cells: dict, baseline: dict, split: str = "training") -> list[str]:
    """What fails CI in one split's findings (see the module's docstring)."""
    problems = []
    now = to_json(cells)
    for key in sorted(set(now) | set(baseline)):
        c, was = now.get(key), baseline.get(key)
        where = f"{split} {key}"
        if c is None:
            problems.append(f"{where}: in the baseline, no longer scored (the rule never came, and nothing expects it)")
            continue
        allowed = (was or {}).get("wrong_s", 0.0) if split == "held_out" else 0.0
        if c["wrong_s"] > allowed:
            problems.append(f"{where}: {c['wrong_s']:.0f} wrong-advice seconds ({', '.join(c['wrong_where'])})"
                            + (f", was {allowed:.0f}" if allowed else ""))
        if was is None:
            problems.append(f"{where}: not in the baseline (a new rule or source is scored: regenerate it, "
                            "python bench/diagnosis_score.py --write-baseline)")
            continue
        for metric in ("recall", "precision"):
            if was[metric] is not None and (c[metric] is None or c[metric] < was[metric] - RECALL_SLACK):
                problems.append(f"{where}: {metric} {_pct(c[metric])}, was {_pct(was[metric])}")
        for metric in ("start_s", "end_s"):
            if c[metric] > was[metric] + LATENCY_SLACK_S:
                problems.append(f"{where}: {metric[:-2]} latency {c[metric]:.0f} s, was {was[metric]:.0f} s")
        new = Counter(c["misses"]) - Counter(was["misses"])
        if new:
            problems.append(f"{where}: situations missed that were named: {', '.join(sorted(new.elements()))}")
    return problems


def check(result: dict, baseline: dict) -> list[str]:
    """Every problem of a whole result (``evaluate``) against the baseline."""
    import ledger_score

    problems = []
    for split in ("training", "held_out"):
        problems += check_cells(result[split], baseline.get(split, {}), split)
    problems += ledger_score.check(result["ledger"], result["mfu"], baseline.get("ledger", {}), baseline.get("mfu", {}))
    return problems


def evaluate(detail: list | None = None, corpus: pathlib.Path = CORPUS, names=None) -> dict:
    """The cells of each split, and the ledger and MFU rows, over the corpus (or only ``names``)."""
    import ledger_score

    parts = splits(corpus)
    keep = (lambda n: True) if names is None else (lambda n: n in names)
    out: dict = {split: score([n for n in parts[split] if keep(n)], detail=detail, corpus=corpus)
                 for split in ("training", "held_out")}
    chosen = [n for n in runs(corpus) if keep(n)]
    out["ledger"] = ledger_score.ledger_rows(chosen, corpus)
    out["mfu"] = ledger_score.mfu_rows(chosen, corpus)
    return out


def to_baseline(result: dict) -> dict:
    return {"training": to_json(result["training"]), "held_out": to_json(result["held_out"]),
            "ledger": result["ledger"], "mfu": result["mfu"]}


def report(result: dict, corpus: pathlib.Path = CORPUS) -> str:
    import ledger_score

    parts = splits(corpus)
    out = [f"Training split ({len(parts['training'])} runs: the rules were tuned on them)", table(result["training"]), ""]
    if parts["held_out"]:
        out += [f"Held-out split ({len(parts['held_out'])} runs, scored without tuning on them)",
                table(result["held_out"]), ""]
    else:
        out += ["Held-out split: no runs yet (every run of the corpus has been used to tune the rules)", ""]
    out += [ledger_score.ledger_table(result["ledger"]), "", ledger_score.mfu_table(result["mfu"])]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--detail", action="store_true", help="every run's situations and when they were named")
    ap.add_argument("--json", help="write the scores here")
    ap.add_argument("--check", help="a baseline JSON: exit 1 on any problem (see above)")
    ap.add_argument("--write-baseline", action="store_true", help=f"write the scores to {BASELINE.relative_to(REPO)}")
    ap.add_argument("--runs", help="comma-separated run names (default: all)")
    args = ap.parse_args()
    unknown = {x["phase"] for n in runs() for x in label_lines(n)} - set(LABELS)
    if unknown:
        print(f"diagnosis_score: labels without a meaning in bench/corpus_labels.py: {', '.join(sorted(unknown))}",
              file=sys.stderr)
        return 2
    try:
        splits()
    except ValueError as e:
        print(f"diagnosis_score: {e}", file=sys.stderr)
        return 2
    if args.write_baseline and args.runs:
        print("diagnosis_score: the baseline is the whole corpus's: --write-baseline takes no --runs", file=sys.stderr)
        return 2
    detail: list | None = [] if args.detail else None
    result = evaluate(detail, names=set(args.runs.split(",")) if args.runs else None)
    if detail:
        print("\n".join(detail))
        print()
    print(report(result))
    for path in ([args.json] if args.json else []) + ([str(BASELINE)] if args.write_baseline else []):
        pathlib.Path(path).write_text(json.dumps(to_baseline(result), indent=1) + "\n")
    if args.check:
        import ledger_score

        problems = check(result, json.loads(pathlib.Path(args.check).read_text()))
        for p in ledger_score.known_misses(result["ledger"], result["mfu"]):
            print(f"KNOWN MISS (recorded in the baseline, may not grow) {p}")
        for p in problems:
            print(f"FAIL {p}")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
