"""Underuse: a GPU in use that draws far less power than it can (tiny batches, tiny model).

Where GPM is available (Hopper and later) it also catches what power and
``utilization.gpu`` hide: "utilization" is the share of time *any* kernel ran, so a
stream of kernels that each occupy a few SMs reads 100 %. SM activity says how much of
the GPU those kernels used.
"""

from __future__ import annotations

from traintop.rules.engine import Finding, RuleContext, Severity
from traintop.store import present
from traintop.units import fmt_bytes


class Underuse:
    id = "underuse"
    title = "GPU underused"
    severity = Severity.WARNING
    raise_after = 15.0
    clear_after = 20.0
    remedies = (
        "Raise the batch size while memory allows (scale the learning rate with it).",
        "Give each step more work: a larger model per GPU, longer sequences, or several jobs on one GPU (MPS/MIG).",
        "If the step is launch-bound (many tiny kernels), try torch.compile or CUDA graphs.",
        "Check that the input pipeline is not the limit (see data starvation).",
    )

    def evaluate(self, ctx: RuleContext):
        c = ctx.config
        w = c.underuse_window_s
        store = ctx.store
        for g in ctx.gpus():
            i = g.index
            if ctx.is_holding("starvation", f"gpu{i}") or ctx.is_holding("pcie", f"gpu{i}"):
                continue  # starvation or a full PCIe link explains the low draw better
            sm = self._sm_finding(ctx, g)
            if sm is not None:
                yield sm
                continue
            power = present(store.window(f"gpu{i}.power", w))
            util = present(store.window(f"gpu{i}.util", w))
            limit = g.power_limit_w
            if not power or not util or not limit or len(power) < 8:
                continue
            span = store.window_pairs(f"gpu{i}.power", w)
            if span[-1][0] - span[0][0] < w * 0.5:
                continue
            p_mean = sum(power) / len(power)
            u_mean = sum(util) / len(util)
            # Something must be running: 0 % with a live job is an idle GPU, not an underused one.
            in_use = u_mean >= 2.0 and (bool(g.processes) or u_mean >= 3.0)
            frac = p_mean / limit
            threshold = c.underuse_power_frac * (1.1 if ctx.is_active(self.id, f"gpu{i}") else 1.0)
            if not in_use or frac >= threshold or u_mean > c.underuse_max_util:
                continue
            text = (f"GPU {i} draws {p_mean:.0f} W of its {limit:.0f} W limit ({frac * 100:.0f} %) "
                    f"over the last {w:.0f} s at {u_mean:.0f} % utilization")
            if g.mem_total and g.mem_used is not None:
                text += f"; {fmt_bytes(g.mem_total - g.mem_used)} of memory is free for larger batches"
            proc = store.latest.process
            if proc is not None and proc.alive and proc.members:
                main = proc.members[0].cpu_percent or 0
                if main >= 85:
                    text += (f"; the training process's main thread is CPU-bound ({main:.0f} % of a core):"
                             " the GPU waits for kernel launches")
            sm_active = present(store.window(f"gpu{i}.sm_active", w))
            if sm_active:
                text += f"; SMs active {sum(sm_active) / len(sm_active):.0f} % of the time (GPM)"
            yield Finding(f"gpu{i}", text)

    def _sm_finding(self, ctx: RuleContext, g) -> Finding | None:
        c, store, i = ctx.config, ctx.store, g.index
        w = c.underuse_window_s
        pairs = store.window_pairs(f"gpu{i}.sm_active", w)
        util = present(store.window(f"gpu{i}.util", w))
        if len(pairs) < 5 or not util or pairs[-1][0] - pairs[0][0] < w * 0.5:
            return None
        sm = sum(v for _, v in pairs) / len(pairs)
        u_mean = sum(util) / len(util)
        limit = c.underuse_max_sm_active * (1.2 if ctx.is_active(self.id, f"gpu{i}") else 1.0)
        if u_mean < c.underuse_min_util_for_sm or sm >= limit:
            return None
        text = (f"GPU {i} reads {u_mean:.0f} % utilization, but its SMs were active only {sm:.0f} % of the last "
                f"{w:.0f} s (GPM): the kernels that run occupy a small part of the GPU")
        tensor = present(store.window(f"gpu{i}.tensor_active", w))
        if tensor:
            text += f"; tensor cores {sum(tensor) / len(tensor):.0f} %"
        power = present(store.window(f"gpu{i}.power", w))
        if power and g.power_limit_w:
            text += f"; {sum(power) / len(power):.0f} W of {g.power_limit_w:.0f} W"
        return Finding(f"gpu{i}", text)
