"""Pauses: the job's steps stop, again and again, for something other than its input.

The probe's time ledger (traintop/injob/goodput.py) says where each rank's wall time went: a
checkpoint (inside torch.save or torch.distributed.checkpoint), an evaluation (forward passes
with grad off and no optimizer step), a wait in a blocking collective (a barrier while another
rank saves alone), a compile, or "other" (a step overdue with none of those:
logging, a host sync, garbage collection; the probe sends the training thread's stack from such a
gap). Repeated pauses that take a real share of the time leave the GPU idle meanwhile; they are
never data starvation (no input wait) nor a small batch (the GPU works between them).
"""

from __future__ import annotations

from traintop.metrics import gpu_subject
from traintop.rules.declaration import HostRule
from traintop.rules.engine import REVERSED, Verdict, RuleContext, Severity
from traintop.stacks import user_call
from traintop.units import fmt_duration

PAUSED = ("checkpoint", "eval", "collective", "other")
WHAT = {"checkpoint": "checkpoints (torch.save / torch.distributed.checkpoint)",
        "collective": "waits for the other ranks in blocking collectives (a barrier, an object collective)",
        "eval": "evaluation (forward passes with grad off, no optimizer step)",
        "other": "pauses outside the input pipeline (its step overdue: no checkpoint, evaluation or input wait)"}
REMEDY_OF = {"checkpoint": "Checkpoints:", "eval": "Evaluation:", "collective": "Collective waits:",
             "other": "Other pauses:"}
IN_PAUSE = 0.5  # a sample with at least this share of pause is part of a gap
MIN_DATA_S = 30.0  # judged once this much of the ledger is there (then over up to pause_window_s)
STALE_S = 10.0  # a rank whose probe is silent this long is not judged
EVERY_S = 5.0  # the window is long and pauses come and go over minutes: judged this often


class Pause(HostRule):
    id = "pause"
    title = "Training pauses"
    severity = Severity.WARNING
    raise_after = 5.0
    clear_after = 30.0
    now_s = None  # judged over its window: pauses are intermittent by nature
    explains = ("underuse", "idle_gpu", "step_regression")
    remedies = (
        "Checkpoints: save asynchronously (torch.distributed.checkpoint.async_save), less often, or only what "
        "resuming needs; write to local disk and copy off in the background.",
        "Evaluation: evaluate less often or on a subset; run it on a separate GPU or job.",
        "Collective waits: a barrier while one rank saves, evaluates or logs alone holds every other rank: "
        "let every rank write its share (torch.distributed.checkpoint) or save asynchronously; gather metrics "
        "as tensors, not with all_gather_object (it pickles on the CPU and synchronises).",
        "Other pauses: the stacks say where (press s; `traintop analyze` lists them): a .item() or print "
        "of a GPU tensor each step, logging that synchronises, or gc.collect() in the loop.",
    )

    _at: float | None = None
    _verdicts: tuple = ()
    _raised: frozenset = frozenset()  # subjects it has judged paused (to end them with the job)

    def evaluate(self, ctx: RuleContext):
        proc = ctx.process
        if proc is not None and not proc.alive:  # the job has ended: its pauses end now, not 30 s later
            self._at, self._verdicts = None, ()
            return tuple(Verdict(s, "the job has ended", state=REVERSED) for s in self._raised
                         if ctx.is_active(self.id, s))
        if self._at is not None and 0.0 <= ctx.now - self._at < EVERY_S:
            return self._verdicts
        self._at, self._verdicts = ctx.now, tuple(self._judge(ctx))
        self._raised = self._raised | {v.subject for v in self._verdicts}
        return self._verdicts

    def _judge(self, ctx: RuleContext):
        c = ctx.config
        w = c.pause_window_s
        found: list[tuple] = []  # (subject, rank label, main bucket, its share, text, its kinds, its job)
        for subject, r in ctx.ranks():
            if r.age is not None and r.age > STALE_S:
                continue  # its probe stopped reporting
            shares = {b: ctx.rank_pairs(subject, "time_" + b, w, min_n=10) for b in PAUSED}
            span = max((p[-1][0] - p[0][0] for p in shares.values() if p), default=0.0)
            if span < MIN_DATA_S:
                continue
            n = max(len(p) for p in shares.values())
            times = sorted({t for p in shares.values() for t, _ in p})
            per_t = {t: 0.0 for t in times}
            for p in shares.values():
                for t, v in p:
                    per_t[t] += v
            # only the samples inside a gap: a share spread over every step (a per-step all-reduce
            # waiting a little, a .item() per step) slows each step, it is no pause
            total = {b: sum(v for t, v in p if per_t[t] >= IN_PAUSE) / n for b, p in shares.items() if p}
            total = {b: v for b, v in total.items() if v > 0}
            pause = sum(total.values())
            if pause < c.pause_min_share:
                continue
            gaps, in_gap = 0, False
            for t in times:
                now_in = per_t[t] >= IN_PAUSE
                gaps += now_in and not in_gap
                in_gap = now_in
            if gaps < c.pause_min_gaps:
                continue
            main = max(total, key=lambda b: total[b])
            parts = [f"{b} {v * 100:.0f} %" for b, v in sorted(total.items(), key=lambda kv: -kv[1]) if v >= 0.005]
            text = (f"{r.label} spent {pause * 100:.0f} % of the last {fmt_duration(span)} in {gaps} pauses, mostly "
                    f"{WHAT[main]} ({', '.join(parts)}); no input wait in them")
            dump = ctx.pause_stacks.get(r.pid)
            if dump is not None and dump.threads and ctx.now - dump.t <= c.pause_window_s:
                text += f"; in one, its training thread was at: {user_call(dump.threads[0])}"
            gpu = self._gpu_of(ctx, r)
            idle = self._util_in_gaps(ctx, gpu, per_t) if gpu is not None else None
            if idle is not None:
                text += f"; GPU {gpu} averaged {idle:.0f} % utilization in them"
            # on its GPU where known: the GPU's idle time is what the pauses cost (GPU-hours)
            kinds = tuple(b for b, v in total.items() if v >= 0.005)
            job = (r.job, r.uid) if r.job is not None else None  # its owner too: a job id is the job's own word
            found.append((gpu_subject(gpu) if gpu is not None else subject, r.label, main, total[main], text, kinds,
                          job))
        yield from self._verdicts_of(found)

    @staticmethod
    def _verdicts_of(found: list[tuple]):
        """One verdict per subject. A rank that waits in collectives waits for another rank's pause:
        that rank is named as the cause (and preferred where both share a GPU). Only a rank of the same
        job can be the cause (several jobs may share the host), so ranks of no known job name none."""
        causes = [(label, main, share, job) for _, label, main, share, _, _, job in found if main != "collective"]
        best: dict[str, tuple] = {}
        for subject, label, main, share, text, kinds, job in found:
            if main == "collective" and causes:
                who = "; ".join(f"{lb} paused for {WHAT[m].split(' (')[0]} ({p * 100:.0f} %)"
                                for lb, m, p, j in causes if lb != label and j is not None and j == job)
                if who:
                    text += f"; meanwhile {who}: the wait is for it"
            rank_key = (main != "collective", share)
            if subject not in best or rank_key > best[subject][0]:
                best[subject] = (rank_key, text, kinds)
        for subject, (_, text, kinds) in best.items():
            # the advice for the kinds of pause it has
            fits = tuple(r for r in Pause.remedies if any(r.startswith(REMEDY_OF[k]) for k in kinds))
            yield Verdict(subject, text, Severity.WARNING, remedies=fits)

    @staticmethod
    def _gpu_of(ctx: RuleContext, r) -> int | None:
        return next((i for i in ctx.gpu_indices() if any(rr.pid == r.pid for _, rr in ctx.feed(i).ranks)), None)

    @staticmethod
    def _util_in_gaps(ctx: RuleContext, gpu: int, per_t: dict[float, float]) -> float | None:
        util = dict(ctx.gpu_pairs(gpu, "util", ctx.config.pause_window_s))
        vals = [util[t] for t, v in per_t.items() if v >= IN_PAUSE and t in util]
        return sum(vals) / len(vals) if vals else None
