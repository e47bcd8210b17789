"""Training stalled: nobody steps any more (an NCCL hang, a deadlock, a hung or dead loader worker,
a rank that died while the others wait), yet the job is alive.

From the probe: no rank's optimizer step counter has moved for max(30 s, 3x the usual step time).
From NVML alone (a recording without the probe, an nvidia-smi log): a GPU of a multi-GPU job reads
~100 % utilization at idle power with ~0 % SM activity (an NCCL kernel spinning, waiting for a
peer that never arrives) while the others read 0 %, after it did real work.
"""

from __future__ import annotations

import time

from traintop.metrics import gpu_subject
from traintop.rules.collective import job_gpus, loads
from traintop.rules.declaration import HostRule
from traintop.rules.engine import HOLDS, WEAK, Verdict, RuleContext, Severity
from traintop.units import fmt_duration

LOOKBACK_S = 300.0  # how far back the rule looks for the last step and for earlier work
BUSY_MAX_S = 900.0  # a checkpoint, evaluation or compile with no step for this long is a stall too
SPIN_MIN_UTIL = 95.0
SPIN_MAX_SM = 3.0
IDLE_MAX_UTIL = 2.0
ALLOC_STILL_BYTES = 64 * 2**20  # a hung job's allocator does not move
SPIN_MAX_POWER_DROP = 0.4  # without GPM: power at most this share of what the GPU drew while working


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def last_change(pairs: list[tuple[float, float]]) -> float | None:
    """When the series last changed value; None if it never did in these pairs."""
    for k in range(len(pairs) - 1, 0, -1):  # from the newest: a stepping job changes at once
        if pairs[k][1] != pairs[k - 1][1]:
            return pairs[k][0]
    return None


class Stall(HostRule):
    id = "stall"
    title = "Training stalled"
    severity = Severity.CRITICAL
    raise_after = 1.0  # the condition already says how long: max(30 s, 3x the usual step)
    clear_after = 5.0
    now_s = None  # the condition counts the seconds since the last step, up to now
    # what a hung job looks like while it holds (its pauses too: steps overdue in a hang are no checkpoint);
    # only what began with the hang or after it (the engine: a cause never begins after its effect)
    explains = ("idle_gpu", "underuse", "starvation", "imbalance", "power_cap", "step_regression", "pcie",
                "straggler", "cpu_training", "pause")
    explains_all_gpus = True  # a stalled job waits on every one of its GPUs
    remedies = (
        "See where every thread is: press s in the dashboard (with the probe: traintop run -- CMD), or "
        "`traintop analyze` on the recording; without the probe, py-spy dump --pid PID.",
        "A rank waiting in an all-reduce that never completes: one rank took another path (an exception, "
        "a different number of batches, a collective only some ranks call), or died; its log says which.",
        "A rank waiting in the DataLoader: a worker hangs (a lock, a dead file system, a bad record) or was "
        "killed (out of memory: dmesg); set DataLoader(timeout=...) to fail instead of hanging.",
        "Set a collective timeout (init_process_group(timeout=...), TORCH_NCCL_ASYNC_ERROR_HANDLING) so a hang "
        "ends the job instead of holding the GPUs.",
    )

    def evaluate(self, ctx: RuleContext):
        proc = ctx.process
        if proc is not None and not proc.alive:
            return
        found = self._from_probe(ctx)
        if found is None:
            found = self._from_gpus(ctx)
        if found is not None:
            yield from found

    @staticmethod
    def _spent(ctx: RuleContext, subject: str, buckets: tuple[str, ...]) -> bool:
        """The rank's ledger says it spent most of the last 10 s in ``buckets``."""
        got = [ctx.rank_window(subject, "time_" + b, 10.0) for b in buckets]
        n = max((len(v) for v in got), default=0)
        return n >= 3 and sum(sum(v) for v in got) / n >= 0.5

    def _busy_otherwise(self, ctx: RuleContext, stopped: dict) -> bool:
        """In every job, some rank is checkpointing, evaluating or compiling (the probe's ledger) and
        each other one is too, or waits for it in a collective (rank 0 saves, the others wait at a
        barrier). Ranks that all wait in collectives are a hang; so is a job that has been "working"
        for BUSY_MAX_S without a step (a save to a dead file system, a deadlock inside a checkpoint's
        own collectives)."""
        jobs: dict = {}
        for s, (r, _) in stopped.items():
            steps = ctx.rank_pairs(s, "steps", BUSY_MAX_S)
            if steps and last_change(steps) is None and ctx.now - steps[0][0] >= 0.95 * BUSY_MAX_S:
                return False
            # a job is its id and its owner (the probe socket's peer, which a job cannot forge): another
            # user's job naming itself alike cannot make this one's hang look like a wait for its save
            jobs.setdefault((r.job, r.uid), []).append(s)
        for subjects in jobs.values():
            working = {s for s in subjects if self._spent(ctx, s, ("checkpoint", "eval", "compile"))}
            if not working or not all(s in working or self._spent(ctx, s, ("collective",)) for s in subjects):
                return False
        return True

    # -- the probe's step counters --------------------------------------------------------------
    def _from_probe(self, ctx: RuleContext):
        c = ctx.config
        for subject, _ in ctx.ranks():  # the usual case, cheaply: a rank stepped within the shortest stall
            changed = last_change(ctx.rank_pairs(subject, "steps", c.stall_min_s))
            if changed is not None and ctx.now - changed < c.stall_min_s:
                return []  # somebody still steps: no stall (and no NVML guess either)
        stopped = {}  # subject -> (rank, last step time)
        usual = []
        training = False
        for subject, r in ctx.ranks():
            steps = ctx.rank_pairs(subject, "steps", LOOKBACK_S)
            if not steps or not any(v for _, v in steps):
                continue  # not a training process (the launcher), or not started yet
            training = True
            usual += ctx.rank_window(subject, "step_time", LOOKBACK_S)
            changed = last_change(steps)
            stopped[subject] = (r, changed if changed is not None else steps[0][0])
        if not training:
            return None
        usual_step = sorted(usual)[len(usual) // 2] if usual else None
        after = max(c.stall_min_s, c.stall_step_factor * (usual_step or 0.0))
        if any(ctx.now - t < after for _, t in stopped.values()):
            return []  # somebody still steps: no stall (and no NVML guess either)
        if self._busy_otherwise(ctx, stopped):
            return []
        order = sorted(stopped.values(), key=lambda rt: rt[1])
        last = max(t for _, t in order)
        since = ctx.now - last
        w = min(since, c.stall_min_s)
        for x in loads(ctx, w, min_n=3).values():
            if x.util > IDLE_MAX_UTIL and not (x.util >= SPIN_MIN_UTIL and self._no_work(ctx, x, frozen=True)):
                return []  # a GPU still works without optimizer steps: an evaluation, inference
        for subject in stopped:
            alloc = ctx.rank_window(subject, "allocated", w)
            if alloc and max(alloc) - min(alloc) > ALLOC_STILL_BYTES:
                return []  # it still allocates: a loop without optimizer steps (inference), not a hang
        text = f"No optimizer step for {fmt_duration(since)}"
        if usual_step:
            text += f" (usually one every {usual_step:.2f} s)"
        text += f"; the last at {_clock(last)}"
        if len(order) > 1:
            first_r, first_t = order[0]
            if last - first_t >= 1.0:
                text += f"; {first_r.label} stopped first, {fmt_duration(last - first_t)} before the others"
            else:
                text += "; " + ("both" if len(order) == 2 else f"all {len(order)}") + " ranks stopped at the same moment"
            text += self._culprits(ctx, [r for r, _ in order], min(since, 30.0))
        waiting = []
        for subject, (r, _) in stopped.items():
            iw = ctx.rank_window(subject, "input_wait", since)  # all the time since the last step
            if iw and sum(iw) / len(iw) >= 0.7:
                waiting.append(r.label)
        if waiting:
            text += (f"; {', '.join(waiting)} {'waits' if len(waiting) == 1 else 'wait'} in the DataLoader all that "
                     "time: a loader worker hangs or died")
        text += self._gpu_states(ctx, min(since, 30.0))
        text += ". Every thread's stack: press s while live (a recording keeps those taken)"
        gpus = job_gpus(ctx) or ([0] if ctx.gpus() else [])
        if not gpus:  # a job on a machine with no GPU (or none visible): the job stalled, not "GPU 0"
            return [Verdict("process", text, since=last)]
        return [Verdict(gpu_subject(i), text, since=last) for i in gpus]

    # -- NVML alone -----------------------------------------------------------------------------
    def _from_gpus(self, ctx: RuleContext):
        w = ctx.config.stall_min_s
        ld = loads(ctx, w, min_n=max(5, int(w / 4)))
        if not ld:
            return None
        # the window must be covered: a spin of 30 s, not a blip at the start of the data
        spinning, idle = [], []
        for i, x in ld.items():
            pairs = ctx.gpu_pairs(i, "util", w, min_span=0.9)
            if not pairs:
                return None
            if x.util >= SPIN_MIN_UTIL and self._no_work(ctx, x):
                spinning.append(x)
            elif x.util <= IDLE_MAX_UTIL:
                idle.append(x)
            else:
                return None  # some GPU still works
        if not spinning or len(ld) < 2:  # a spinning collective needs two GPUs
            return self._asleep(ctx, ld, w) if not spinning else None
        text = (f"For {w:.0f} s no GPU of the job has done any work" + self._gpu_states(ctx, w, ld)
                + "; GPUs spinning at idle power in a collective are waiting for a peer that never arrives "
                "(a hung or dead rank). With the probe (traintop run) traintop also says when the last step was "
                "and shows every thread's stack")
        return [self._nvml_finding(ctx, i, text, ctx.now - w) for i in sorted(ld)]

    def _asleep(self, ctx: RuleContext, ld, w: float):
        """Every GPU of the job idle and its whole process tree asleep, after work: nothing runs, nothing
        computes on the CPU either (an evaluation or a checkpoint would): the job waits on something."""
        proc = ctx.process
        cpu = ctx.proc_window("cpu_percent", w)
        if proc is None or not proc.alive or len(cpu) < 5 or sum(cpu) / len(cpu) > 5.0:
            return None
        worked = [i for i in ld if max(ctx.gpu_window(i, "util", LOOKBACK_S), default=0) >= 2]  # a starved job barely uses it
        if not worked:
            return None  # it never used the GPU: not a stall of training
        workers = proc.loader_workers
        text = (f"For {w:.0f} s no GPU of the job has done any work (" + ", ".join(
            f"GPU {i} {x.util:.0f} %" for i, x in sorted(ld.items())) + f") and its processes sleep "
            f"({sum(cpu) / len(cpu):.0f} % of a core in all)")
        if workers:
            text += f", its {len(workers)} loader workers too: it waits for something that does not come " \
                    "(a hung loader worker, a lock, a peer)"
        text += ". With the probe (traintop run) traintop also says when the last step was and shows every thread's stack"
        return [self._nvml_finding(ctx, i, text, ctx.now - w) for i in sorted(ld)]

    def _nvml_finding(self, ctx: RuleContext, i: int, text: str, since: float) -> Verdict:
        # A guess from NVML never replaces what the probe said (its rank just went away with the job).
        return Verdict(gpu_subject(i), text, state=WEAK if ctx.is_active(self.id, gpu_subject(i)) else HOLDS,
                       since=since)

    def _no_work(self, ctx: RuleContext, x, frozen: bool = False) -> bool:
        """Busy by utilization, yet ~no SM activity or power, after real work on this GPU.

        ``frozen``: every rank's step counter has stopped (the probe's word). A spinning NCCL kernel
        does not always read ~0 % SMs (18 % was seen on an H200, occupancy 5 %); with the steps frozen,
        idle power and no tensor or memory traffic are enough."""
        before = ctx.gpu_window(x.index, "power_w", LOOKBACK_S)
        idle_power = x.power is not None and bool(before) and x.power <= SPIN_MAX_POWER_DROP * max(before)
        if x.sm is not None:
            sm_before = ctx.gpu_window(x.index, "sm_active", LOOKBACK_S)
            worked = bool(sm_before) and max(sm_before) >= 30
            if x.sm <= SPIN_MAX_SM and worked:
                return True
            if frozen and worked and idle_power:
                w = min(LOOKBACK_S, ctx.config.stall_min_s)
                tensor, dram = ctx.gpu_mean(x.index, "tensor_active", w), ctx.gpu_mean(x.index, "dram_active", w)
                return (tensor is None or tensor <= SPIN_MAX_SM) and (dram is None or dram <= SPIN_MAX_SM)
            return False
        return idle_power

    @staticmethod
    def _culprits(ctx: RuleContext, ranks, window_s: float) -> str:
        """Ranks whose GPU spins wait in a collective; those whose GPU idles never reached it."""
        from traintop.rules.straggler import rank_on_gpu

        ld = loads(ctx, max(window_s, 5.0), min_n=3)
        waiting: list[str] = []
        absent: list[str] = []
        for i, x in sorted(ld.items()):
            found = rank_on_gpu(ctx, i)
            if found is None:
                continue
            (waiting if x.util >= SPIN_MIN_UTIL else absent).append(found[1].label)
        if waiting and absent:
            return (f"; {', '.join(waiting)} {'waits' if len(waiting) == 1 else 'wait'} in a collective for "
                    f"{', '.join(absent)}, which never reached it: look at {absent[0]} first")
        return ""

    @staticmethod
    def _gpu_states(ctx: RuleContext, window_s: float, ld=None) -> str:
        ld = ld if ld is not None else loads(ctx, max(window_s, 5.0), min_n=3)
        parts = []
        for i, x in sorted(ld.items()):
            if x.util >= SPIN_MIN_UTIL:
                state = f"GPU {i} reads {x.util:.0f} % utilization"
                if x.power is not None:
                    state += f" at {x.power:.0f} W" + (f" of {x.limit:.0f} W" if x.limit else "")
                if x.sm is not None:
                    state += f" with SMs {x.sm:.0f} % active"
                state += " (spinning, not computing)"
            else:
                state = f"GPU {i} idles at {x.util:.0f} %"
            parts.append(state)
        return "; " + ", ".join(parts) if parts else ""
