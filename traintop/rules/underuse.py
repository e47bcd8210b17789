"""Underuse: a GPU in use that draws far less power than it can (tiny batches, tiny model).

Where GPM is available (Hopper and later) it also catches what power and
``utilization.gpu`` hide: "utilization" is the share of time *any* kernel ran, so a
stream of kernels that each occupy a few SMs reads 100 %. SM activity says how much of
the GPU those kernels used.
"""

from __future__ import annotations

from traintop.metrics import gpu_subject
from traintop.rules.collective import collective_waits, waits_for_another_host
from traintop.rules.declaration import HostRule
from traintop.rules.engine import Verdict, RuleContext, Severity
from traintop.units import fmt_bytes


class Underuse(HostRule):
    id = "underuse"
    title = "GPU underused"
    severity = Severity.WARNING
    defers_to = ("starvation", "pcie", "stall", "straggler", "pause")
    raise_after = 8.0  # the window already asks for 15 s of low draw; and it must hold now
    clear_after = 20.0
    RAISE_BATCH = "Raise the batch size while memory allows (scale the learning rate with it)."
    remedies = (
        RAISE_BATCH,
        "Give each step more work: a larger model per GPU, longer sequences, or several jobs on one GPU (MPS/MIG).",
        "If the step is launch-bound (many tiny kernels), try torch.compile or CUDA graphs.",
        "Check that the input pipeline is not the limit (see data starvation).",
    )

    def evaluate(self, ctx: RuleContext):
        c = ctx.config
        w = c.underuse_window_s
        # over the straggler's window and a shorter one: a job that just began to wait has a window
        # still full of its start
        waits = [x for x in (collective_waits(ctx, c.straggler_window_s),
                             collective_waits(ctx, c.straggler_window_s / 2)) if x is not None]
        for g in ctx.gpus():
            i, subject = g.index, gpu_subject(g.index)
            if any(ctx.is_holding(r, subject) for r in self.defers_to):
                continue  # starvation, the copies, a hang or a slow rank explain the low draw better
            if any(ctx.is_holding("pause", rank) for rank, _ in ctx.feed(i).ranks):
                continue  # its rank pauses (checkpoints, evaluation): the GPU waits, not a small batch
            if any(ctx.is_holding("straggler", rank) for rank, _ in ctx.feed(i).ranks):
                continue  # one of its ranks holds back the others
            if self._ranks_wait(ctx, i):
                continue  # its ranks wait on each other, not on a small batch
            if any(x.involves(i) for x in waits) or waits_for_another_host(ctx, i, c.straggler_window_s):
                continue  # waiting for (or being) the slow rank, here or on another host: a bigger batch would not help
            rx = ctx.gpu_window(i, "pcie_rx", w)
            if rx and sum(rx) / len(rx) >= c.pcie_pageable_min_gbs * 1e9:
                continue  # steady copies to the GPU explain the low draw: the PCIe rule judges them
            recent = ctx.gpu_mean(i, "util", 10.0)
            if (now := ctx.gpu_window(i, "util", 5.0)) and max(now) < 1.0 or (recent is not None and recent < 1.0):
                continue  # nothing runs now: idle (or stalled), not underused
            sm = self._sm_finding(ctx, g)
            if sm is not None:
                yield sm
                continue
            power = [v for _, v in ctx.gpu_pairs(i, "power_w", w, min_n=8, min_span=0.5)]
            util = ctx.gpu_window(i, "util", w)
            limit = g.power_limit_w
            if not limit:
                found = self._util_only(ctx, g)
                if found is not None:
                    yield found
                continue
            if not power or not util:
                continue
            p_mean = sum(power) / len(power)
            u_mean = sum(util) / len(util)
            # Something must be running: 0 % with a live job is an idle GPU, not an underused one.
            in_use = u_mean >= 2.0 and (bool(g.processes) or u_mean >= 3.0)
            frac = p_mean / limit
            threshold = c.underuse_power_frac * (1.1 if ctx.is_active(self.id, subject) else 1.0)
            if not in_use or frac >= threshold or u_mean > c.underuse_max_util:
                continue
            text = (f"GPU {i} draws {p_mean:.0f} W of its {limit:.0f} W limit ({frac * 100:.0f} %) "
                    f"over the last {w:.0f} s at {u_mean:.0f} % utilization")
            memory_risk = self._memory_risk(ctx, g)
            if memory_risk:
                text += f"; {memory_risk}: fix that before raising the batch size"
            elif g.mem_total and g.mem_used is not None:
                text += f"; {fmt_bytes(g.mem_total - g.mem_used)} of memory is free for larger batches"
            main = max((m.cpu_percent or 0 for m in ctx.feed(i).main), default=0)  # this GPU's rank
            if main >= 85:
                text += (f"; the training process's main thread is CPU-bound ({main:.0f} % of a core):"
                         " the GPU waits for kernel launches")
            sm_active = ctx.gpu_mean(i, "sm_active", w)
            if sm_active is not None:
                text += f"; SMs active {sm_active:.0f} % of the time (GPM)"
            yield Verdict(subject, text, remedies=self.remedies[1:] if memory_risk else self._remedies(ctx, g))

    # Growth past this is said as "more than": the estimate is for the next doubling or two, not for
    # a job whose step barely allocates.
    MOST_GROWTH = 16
    STEP_WINDOW_S = 30.0  # allocated bytes over this long: their least is what a rank holds between steps

    def _remedies(self, ctx: RuleContext, g) -> tuple[str, ...]:
        """The advice, the larger batch with this GPU's numbers where they are known: its free memory
        (NVML) and, with the probe, what one step of its one rank allocates above what it holds
        between steps (the part that grows with the batch; weights and optimizer state do not)."""
        if not g.mem_total or g.mem_used is None:
            return self.remedies
        free = max(0, g.mem_total - g.mem_used)
        room = f"GPU {g.index} has {fmt_bytes(free)} free"
        ranks = ctx.feed(g.index).ranks
        if len(ranks) == 1:
            subject, r = ranks[0]
            held = ctx.rank_window(subject, "allocated", self.STEP_WINDOW_S)
            per_step = r.peak - min(held) if r.peak and len(held) >= 3 else 0
            if per_step > 0:
                grow = 1 + 0.9 * free / per_step  # a tenth kept for the allocator's rounding and fragments
                if grow >= self.MOST_GROWTH:
                    room += f": the batch can likely grow more than {self.MOST_GROWTH}x"
                else:
                    room += f": the batch can likely grow ~{grow:.0f}x" if grow >= 2 else f": the batch can grow ~{grow:.1f}x at most"
                room += f" (a step allocates {fmt_bytes(per_step)} above what it holds between steps)"
        return (f"Raise the batch size while memory allows ({room}; scale the learning rate with it).",) + self.remedies[1:]

    @staticmethod
    def _ranks_wait(ctx: RuleContext, i: int) -> bool:
        """Several rank processes on this GPU, one of them asleep most of the time (and, with the
        probe, slow steps that are not input waits): they wait for each other, or for something off
        the GPU. A larger batch would not shorten the wait."""
        feed = ctx.feed(i)
        if len(feed.main) < 2:
            return False
        steps = [(t, r.input_wait) for _, r in feed.ranks if (t := r.step_time)]
        if steps and not all(t >= 0.05 and (wait or 0) < 0.1 for t, wait in steps):
            return False  # quick steps, or input waits: not this
        # launch-bound ranks keep their main threads busy; a rank that sleeps waits for another
        return min(m.cpu_percent or 0 for m in feed.main) <= 50

    MEMORY_RISKS = (("memory_creep", "its memory is creeping"), ("fragmentation", "its memory is fragmented"))

    def _memory_risk(self, ctx: RuleContext, g) -> str:
        """Why a larger batch is not the advice now: memory growing or fragmented on this GPU (those
        rules run before this one), or nearly full."""
        subject = gpu_subject(g.index)
        for rule, why in self.MEMORY_RISKS:
            if ctx.is_holding(rule, subject) or ctx.is_active(rule, subject):
                return why
        if g.mem_total and g.mem_used is not None and g.mem_used >= 0.9 * g.mem_total:
            return "its memory is nearly full"
        return ""

    def _util_only(self, ctx: RuleContext, g) -> Verdict | None:
        """No power limit known (a dmon log): low utilization for a minute, with work going on."""
        c, i = ctx.config, g.index
        w = c.underuse_util_only_window_s
        pairs = ctx.gpu_pairs(i, "util", w, min_n=10, min_span=0.8)
        if not pairs:
            return None
        utils = [v for _, v in pairs]
        u_mean = sum(utils) / len(utils)
        running = sum(1 for v in utils if v > 0) / len(utils)  # something runs most of the time
        limit = c.underuse_util_only_max * (1.2 if ctx.is_active(self.id, gpu_subject(i)) else 1.0)
        if not 2.0 <= u_mean < limit or running < 0.5:
            return None
        text = (f"GPU {i} averages {u_mean:.0f} % utilization over the last {w:.0f} s with work running "
                f"{running * 100:.0f} % of the samples (this source gives no power limit to judge the draw by)")
        sm = ctx.gpu_mean(i, "sm_active", w)
        if sm is not None:
            text += f"; SMs active {sm:.0f} % of the time (GPM)"
        return Verdict(gpu_subject(i), text, remedies=self._remedies(ctx, g))

    def _sm_finding(self, ctx: RuleContext, g) -> Verdict | None:
        c, i = ctx.config, g.index
        w = c.underuse_window_s
        pairs = ctx.gpu_pairs(i, "sm_active", w, min_n=5, min_span=0.5)
        u_mean = ctx.gpu_mean(i, "util", w)
        if not pairs or u_mean is None:
            return None
        sm = sum(v for _, v in pairs) / len(pairs)
        limit = c.underuse_max_sm_active * (1.2 if ctx.is_active(self.id, gpu_subject(i)) else 1.0)
        if u_mean < c.underuse_min_util_for_sm or sm >= limit:
            return None
        text = (f"GPU {i} reads {u_mean:.0f} % utilization, but its SMs were active only {sm:.0f} % of the last "
                f"{w:.0f} s (GPM): the kernels that run occupy a small part of the GPU")
        tensor = ctx.gpu_mean(i, "tensor_active", w)
        if tensor is not None:
            text += f"; tensor cores {tensor:.0f} %"
        power = ctx.gpu_mean(i, "power_w", w)
        if power is not None and g.power_limit_w:
            text += f"; {power:.0f} W of {g.power_limit_w:.0f} W"
        return Verdict(gpu_subject(i), text, remedies=self._remedies(ctx, g))
