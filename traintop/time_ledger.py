"""Where each rank's time went over a whole run: the probe's ledger (traintop/probe_goodput.py)
summed into seconds, GPU-hours and energy per bucket, for ``analyze``."""

from __future__ import annotations

from traintop.samples import LEDGER_BUCKETS, Frame

MAX_GAP_S = 5.0  # a longer gap between samples counts this much (the recorder was away)


class TimeLedger:
    def __init__(self) -> None:
        self._prev: float | None = None
        self.ranks: dict[str, dict] = {}  # label -> {"seconds": {bucket: s}, "energy_j": {bucket: J}, "gpu": i}

    def add(self, frame: Frame) -> None:
        prev, self._prev = self._prev, frame.t
        if prev is None or not frame.ranks:
            return
        dt = min(max(frame.t - prev, 0.0), MAX_GAP_S)
        power = {g.index: g.power_w for g in frame.gpus if g.power_w is not None}
        for r in frame.ranks:
            shares = r.ledger()
            if not shares:
                continue
            gpu = next((g.index for g in frame.gpus for p in g.processes if p.pid == r.pid), None)
            acc = self.ranks.setdefault(r.label, {"seconds": dict.fromkeys(LEDGER_BUCKETS, 0.0),
                                                  "energy_j": dict.fromkeys(LEDGER_BUCKETS, 0.0), "gpu": gpu})
            if acc["gpu"] is None:
                acc["gpu"] = gpu
            watts = power.get(gpu) if gpu is not None else None
            for b, v in shares.items():
                acc["seconds"][b] += v * dt
                if watts is not None:
                    acc["energy_j"][b] += v * dt * watts

    def report(self) -> list[dict]:
        """Per rank: each bucket's seconds, share, GPU-hours (its one GPU's time) and kWh; goodput."""
        out = []
        for label, acc in sorted(self.ranks.items()):
            total = sum(acc["seconds"].values())
            if total <= 0:
                continue
            on_gpu = acc["gpu"] is not None  # a rank on no GPU (a CPU job) holds no GPU-hours, draws no GPU energy
            buckets = {b: {"seconds": round(s, 1), "share": round(s / total, 4),
                           "gpu_hours": round(s / 3600, 5) if on_gpu else None,
                           "kwh": round(acc["energy_j"][b] / 3.6e6, 5) if on_gpu else None}
                       for b, s in acc["seconds"].items() if s > 0}
            out.append({"rank": label, "gpu": acc["gpu"], "seconds": round(total, 1),
                        "goodput": round(acc["seconds"]["train"] / total, 4), "buckets": buckets})
        return out


def render(ledgers: list[dict]) -> list[str]:
    """Text lines: one per rank, the largest buckets first."""
    out = []
    for r in ledgers:
        parts = sorted(r["buckets"].items(), key=lambda kv: -kv[1]["seconds"])
        text = " · ".join(f"{b} {v['share'] * 100:.0f} % " + (f"({v['gpu_hours']:.3f} GPU-h, {v['kwh']:.3f} kWh)"
                                                             if v["gpu_hours"] is not None else f"({v['seconds']:.0f} s)")
                          for b, v in parts if v["share"] >= 0.005)
        where = f" on GPU {r['gpu']}" if r["gpu"] is not None else " (on no GPU)"
        out.append(f"  {r['rank']}{where}: goodput {r['goodput'] * 100:.0f} % — {text}")
    return out
