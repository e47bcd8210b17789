"""The probe's overhead on a real training step: paired runs, median ratio.

    python bench/probe_overhead.py [--pairs 10] [--steps 100] [--json FILE]

Alternates blocks of training steps without and with the probe (started and stopped
in-process, a traintop client reading it the whole time), and reports the median of
the per-pair ratios of median step times. Needs torch (a GPU if there is one).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

from benchio import save_json


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    os.environ.setdefault("TRAINTOP_PROBE_DIR", tempfile.mkdtemp(prefix="traintop-bench-"))
    from traintop.collectors.probe_client import ProbeClient
    from traintop.injob.agent import Probe

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(4)]).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.width, device=dev)

    def block() -> float:
        times = []
        for _ in range(args.steps):
            t = time.perf_counter()
            with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
                loss = model(x).float().pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if dev == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    block()  # warm-up
    ratios, offs, ons = [], [], []
    for k in range(args.pairs):
        order = ("off", "on") if k % 2 == 0 else ("on", "off")
        res = {}
        for mode in order:
            if mode == "on":
                p = Probe(interval=0.25)
                p.start()
                client = ProbeClient()
                stop = threading.Event()

                def read(client=client, stop=stop):  # as traintop does: one read per sampling tick
                    while not stop.wait(0.25):
                        client.sample({os.getpid()})

                reader = threading.Thread(target=read, daemon=True)
                reader.start()
                res[mode] = block()
                stop.set()
                reader.join()
                client.close()
                p.stop()
            else:
                res[mode] = block()
        ratios.append(res["on"] / res["off"])
        offs.append(res["off"])
        ons.append(res["on"])
    out = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__,
           "step_ms_off": statistics.median(offs) * 1e3, "step_ms_on": statistics.median(ons) * 1e3,
           "median_ratio": statistics.median(ratios), "ratios": ratios, "pairs": args.pairs, "steps": args.steps}
    print(f"probe overhead on {out['device']}: step {out['step_ms_off']:.2f} ms without, {out['step_ms_on']:.2f} ms "
          f"with; median paired ratio {out['median_ratio']:.4f} ({(out['median_ratio'] - 1) * 100:+.2f} %)")
    save_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
