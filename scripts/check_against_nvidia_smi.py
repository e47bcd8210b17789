"""Compare traintop's NVML collector with nvidia-smi read at the same moment.

    python scripts/check_against_nvidia_smi.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import subprocess
import time

from traintop.collectors.nvml import NvmlCollector
from traintop.units import MiB

FIELDS = "utilization.gpu,memory.used,memory.total,power.draw,power.limit,temperature.gpu,clocks.sm,clocks.mem"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    col = NvmlCollector()
    print(f"{'round':<6}{'gpu':<4}{'field':<14}{'traintop':>12}{'nvidia-smi':>12}")
    for r in range(args.rounds):
        s = col.sample()
        out = subprocess.run(["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=True).stdout.strip().splitlines()
        for g, line in zip(s, out):
            smi = [v.strip() for v in line.split(",")]
            ours = [g.util, g.mem_used / MiB if g.mem_used is not None else None,
                    g.mem_total / MiB if g.mem_total is not None else None, g.power_w, g.power_limit_w,
                    g.temp_c, g.sm_clock, g.mem_clock]
            for name, a, b in zip(FIELDS.split(","), ours, smi):
                a_txt = "None" if a is None else f"{a:.1f}"
                print(f"{r:<6}{g.index:<4}{name:<14}{a_txt:>12}{b:>12}")
        time.sleep(1.0)
    col.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
