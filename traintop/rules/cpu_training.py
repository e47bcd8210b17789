"""Training on the CPU: a job taking optimizer steps without CUDA, or a busy job with torch holding no
GPU memory.

Only a job with torch can train on the CPU in this sense: a busy Python process that never
imported torch (a preprocessing script, a shell loop) is no finding. The evidence of torch
is the probe's word (optimizer steps, or torch imported) or, without a probe, torch's
libraries mapped into a process of the job (/proc/PID/maps). Recordings keep neither (the
probe's steps excepted), so a replay without a probe raises it only from steps. While the probe
says no step yet the job is starting (imports, data, a framework's set-up: Lightning's takes a busy
core for seconds): judged only once that has lasted STARTUP_GRACE_S. The
finding ends at once when the job has ended: nothing trains any more.
"""

from __future__ import annotations

from traintop import metrics
from traintop.rules.declaration import HostRule
from traintop.rules.engine import REVERSED, Verdict, RuleContext, Severity

STARTUP_GRACE_S = 30.0  # a probed job without a step yet is starting up, for this long at most


class TrainingOnCpu(HostRule):
    id = "cpu_training"
    title = "Training on the CPU?"
    severity = Severity.WARNING
    raise_after = 15.0
    clear_after = 20.0
    remedies = (
        "Check torch.cuda.is_available() in the job's environment (a CPU-only torch build, a driver problem, "
        "or CUDA_VISIBLE_DEVICES hiding the GPUs).",
        "Move the model and every batch to the GPU: model.to('cuda'), x = x.to('cuda', non_blocking=True).",
        "Run `traintop doctor` for the whole preflight.",
    )

    def evaluate(self, ctx: RuleContext):
        c = ctx.config
        frame = ctx.frame
        proc = frame.process if frame is not None else None
        if frame is None or proc is None or not proc.alive:  # the job is gone: a raised alert ends now, not 20 s later
            yield Verdict("process", "the job has ended", state=REVERSED)
            return
        w = c.cpu_training_window_s
        cpu = ctx.proc_window("cpu_percent", w)
        mean_cpu = sum(cpu) / len(cpu) if cpu else None
        if any(r.cuda for r in frame.ranks):
            return
        # The probe's word: optimizer steps taken in the window, and no CUDA in the process.
        # Then the CPU share does not matter (on a busy host the job may get far less than a core).
        stepping = [(r, steps) for subject, r in ctx.ranks()
                    if len(steps := ctx.rank_pairs(subject, "steps", w)) >= 2 and steps[-1][1] > steps[0][1]]
        if stepping:
            r, steps = max(stepping, key=lambda rs: rs[1][-1][1] - rs[1][0][1])
            # over the samples there are: a job watched (or a replay started) a few seconds ago has fewer than w
            span = steps[-1][0] - steps[0][0]
            text = (f"PID {r.pid} took {steps[-1][1] - steps[0][1]:.0f} optimizer steps in the last {span:.0f} s "
                    f"({r.steps} in all), but its probe reports no CUDA use")
            if mean_cpu is not None:
                text += f"; the job uses {mean_cpu:.0f} % CPU"
            yield Verdict("process", text)
            return
        if mean_cpu is None or len(cpu) < 5 or mean_cpu < c.cpu_training_min_cpu:
            return
        if frame.ranks and not any(r.steps for r in frame.ranks) and not _long_startup(ctx):
            return  # the probe says no step yet: the job is starting (imports, data, model), not training
        pids = {m.pid for m in proc.members} | {proc.pid}
        if any(p.pid in pids and (p.used_bytes or 1) > 0 for g in frame.gpus for p in g.processes):
            return
        if not frame.ranks and not frame.gpus:
            return  # no GPU visible and no probe: nothing to compare with
        known = [proc.torch] + [r.torch for r in frame.ranks]
        if not any(known) and any(k is False for k in known):
            # looked for and not found: whatever it does, it is not training on the CPU. (A recording
            # does not keep this evidence: there, unknown, the rule judges as it always did.)
            return
        text = f"PID {proc.pid} ({proc.name}) uses {mean_cpu:.0f} % CPU"
        if frame.ranks:
            text += " but its probe reports no CUDA use"
        else:
            text += f" but holds no memory on any of the {len(frame.gpus)} GPU(s)"
        yield Verdict("process", text)


def _long_startup(ctx: RuleContext) -> bool:
    """Whether a probed rank has said "no step" for STARTUP_GRACE_S already: longer than a start-up.
    (From the store itself: the judgement of now cuts windows to seconds, and this is a duration.)"""
    for subject, _ in ctx.ranks():
        pairs = ctx.store.window_pairs(metrics.rank_key(subject, "steps"), 2 * STARTUP_GRACE_S)
        if pairs and pairs[-1][0] - pairs[0][0] >= STARTUP_GRACE_S and not any(v for _, v in pairs):
            return True
    return False
