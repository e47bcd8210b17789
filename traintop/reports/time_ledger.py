"""Where each rank's time went over a whole run: the probe's ledger (traintop/injob/goodput.py)
summed into seconds, GPU-hours and energy per bucket, for ``analyze``; and the MFU of its steps over
its training time."""

from __future__ import annotations

from traintop.metrics import rank_gpu
from traintop.mfu import peak_flops
from traintop.samples import LEDGER_BUCKETS, Frame
from traintop.text import one_line

MAX_GAP_S = 5.0  # a longer gap between samples counts this much (the recorder was away)


class TimeLedger:
    def __init__(self, gpu_names: dict[int, str] | None = None) -> None:
        self._prev: float | None = None
        self.gpu_names = gpu_names or {}
        # label -> {"seconds": {bucket: s}, "energy_j": {bucket: J}, "gpu": i, "flops": FLOPs its steps did,
        # "steps": the step counter last seen, "matmul": its precision}
        self.ranks: dict[str, dict] = {}

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
            gpu = rank_gpu(frame, r.pid)
            acc = self.ranks.setdefault(r.label, {"seconds": dict.fromkeys(LEDGER_BUCKETS, 0.0),
                                                  "energy_j": dict.fromkeys(LEDGER_BUCKETS, 0.0), "gpu": gpu,
                                                  "flops": 0.0, "steps": None, "matmul": None})
            if acc["gpu"] is None:
                acc["gpu"] = gpu
            if r.steps is not None:
                if acc["steps"] is not None and r.steps > acc["steps"] and r.step_flops:
                    acc["flops"] += r.step_flops * (r.steps - acc["steps"])
                acc["steps"] = r.steps
            acc["matmul"] = r.matmul_mode or acc["matmul"]
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
                        "goodput": round(acc["seconds"]["train"] / total, 4), "buckets": buckets,
                        **self._mfu(acc)})
        return out

    def _mfu(self, acc: dict) -> dict:
        """The MFU of its steps over their time (training and waiting for their input, as nanoGPT times
        an iteration; not the pauses between steps), with the peak it is measured against (None: the
        FLOPs, the GPU or the precision is not known)."""
        name = self.gpu_names.get(acc["gpu"]) if acc["gpu"] is not None else None
        peak = peak_flops(name, acc["matmul"])
        train = acc["seconds"]["train"] + acc["seconds"].get("input", 0.0)
        mfu = min(1.0, acc["flops"] / train / peak) if peak and acc["flops"] > 0 and train > 0 else None
        return {"mfu": None if mfu is None else round(mfu, 4), "mfu_peak_tflops": round(peak / 1e12, 1) if peak else None,
                "matmul": acc["matmul"], "gpu_name": name}


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
        if r.get("mfu") is not None:
            out.append(f"    MFU {r['mfu'] * 100:.0f} % over its steps (training and input wait), of the {one_line(r['gpu_name'] or 'GPU')}'s "
                       f"{r['matmul']} peak ({r['mfu_peak_tflops']:g} TFLOP/s dense)")
    return out
