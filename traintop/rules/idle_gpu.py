"""GPU idle while the job is alive: memory held, nothing running (a hang, a long CPU phase, a barrier)."""

from __future__ import annotations

from traintop.metrics import gpu_subject, ledger_shares
from traintop.rules.declaration import HostRule
from traintop.rules.engine import Verdict, RuleContext, Severity
from traintop.units import MiB, fmt_bytes

LEDGER_WORDS = {"checkpoint": "in checkpoints", "collective": "waiting for other ranks in collectives",
                "eval": "in evaluation", "compile": "compiling", "input": "waiting for input",
                "startup": "starting", "stalled": "stalled", "other": "outside its steps (not input, checkpoint "
                "or evaluation)"}

# Without process lists (an nvidia-smi log), memory in use says a process holds the GPU: a CUDA
# context alone is about 500 MiB on an H200 (a 49-s log of a GPU holding 621 MB at 0 % said nothing).
HELD_BLIND_BYTES = 512 * MiB


class IdleWhileAlive(HostRule):
    id = "idle_gpu"
    title = "GPU idle while the job is alive"
    severity = Severity.WARNING
    raise_after = 3.0  # the window already asks for 30 s of idleness
    clear_after = 10.0
    now_s = None  # 0 % for the whole window, up to now
    remedies = (
        "Check what the job is doing: py-spy dump --pid PID shows where every thread is.",
        "With several ranks, one waiting on a collective (NCCL) for a straggler or a dead peer looks like this.",
        "A long evaluation, checkpoint or data-preparation phase on the CPU holds the GPU idle: overlap it or move it.",
    )

    def evaluate(self, ctx: RuleContext):
        proc = ctx.process
        # nvidia-smi logs (and NVML in some containers) have no process lists: memory in use says a
        # process holds the GPU
        blind = not any(g.processes for g in ctx.gpus())
        for g in ctx.gpus():
            i = g.index
            # the whole window: a job that has just taken its GPU is starting, not idle
            util = [v for _, v in ctx.gpu_pairs(i, "util", ctx.config.idle_window_s, min_span=0.9)]
            held_blind = blind and proc is None and g.mem_used is not None and g.mem_used >= HELD_BLIND_BYTES
            if len(util) < 8 or not (g.processes or held_blind):
                continue
            mean_u, p90 = sum(util) / len(util), sorted(util)[int(0.9 * (len(util) - 1))]
            # a stray reading or two is not work
            if mean_u >= ctx.config.idle_max_util or p90 >= 2.5 * ctx.config.idle_max_util:
                continue
            if proc is not None and not proc.alive:
                continue
            if held_blind:
                yield Verdict(gpu_subject(i), f"GPU {i} averages {mean_u:.1f} % utilization over the last "
                                              f"{ctx.config.idle_window_s:.0f} s while {fmt_bytes(g.mem_used)} of its "
                                              "memory is in use (a process holds it; this source lists no processes)")
                continue
            mine = [p for p in g.processes if proc is None or p.pid in {m.pid for m in proc.members} | {proc.pid}]
            if not mine:
                continue
            held = sum(p.used_bytes or 0 for p in mine)
            who = f"PID {proc.pid}" if proc is not None else f"{len(mine)} process(es)"
            yield Verdict(gpu_subject(i), f"GPU {i} averages {mean_u:.1f} % utilization over the last "
                                     f"{ctx.config.idle_window_s:.0f} s while {who} "
                                     f"holds {fmt_bytes(held)} on it" + self._ledger(ctx, {p.pid for p in mine}))

    @staticmethod
    def _ledger(ctx: RuleContext, pids: set[int]) -> str:
        """What the probe's ledger says the ranks on this GPU did meanwhile, where one thing took most of it."""
        out = []
        for subject, r in ctx.ranks():
            if r.pid not in pids:
                continue
            shares = ledger_shares(ctx.store, subject, ctx.config.idle_window_s)
            top = max(shares, key=lambda b: shares[b], default=None)
            if top is not None and top != "train" and shares[top] >= 0.5:
                out.append(f"{r.label}: {LEDGER_WORDS.get(top, top)} {shares[top] * 100:.0f} % of the time")
        return f"; the probe's ledger meanwhile, {'; '.join(out)}" if out else ""
