"""What a capture costs the job: its step rate before and after a profiler trace and a CUDA memory
snapshot, and the one step the probe's FLOP counter slows.

    python bench/capture_cost.py [--json FILE]

Trains a bf16 MLP (4 square matmuls of 8192, batch 8192 on a GPU; tiny on the CPU) with the probe
started in-process; asks it for a trace, then a memory snapshot, between blocks of steps, and
prints the job's own mean step period (synchronising every 10 steps, as training loops do) over
the blocks around each capture, beside what the capture itself measured.
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
    ap.add_argument("--steps", type=int, default=200, help="steps a block")
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    os.environ.setdefault("TRAINTOP_PROBE_DIR", tempfile.mkdtemp(prefix="traintop-bench-"))
    from traintop.collectors.probe_client import ProbeClient
    from traintop.injob.agent import Probe

    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    w = 8192 if cuda else 256
    model = torch.nn.Sequential(*[torch.nn.Linear(w, w) for _ in range(4)]).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    x = torch.randn(w, w, device=dev)
    probe = Probe(interval=0.25)
    assert probe.start()
    client = ProbeClient()  # as traintop asks: over the probe's socket, read every tick
    records: list = []
    stop = threading.Event()

    def read() -> None:
        while not stop.wait(0.25):
            client.sample({os.getpid()})
            records.extend(client.take_captures())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def block(n: int) -> float:
        """The job's own mean step period over n steps (a sync every 10)."""
        t = time.perf_counter()
        for k in range(n):
            with torch.autocast(dev, dtype=torch.bfloat16):
                loss = model(x).float().pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if k % 10 == 9:
                loss.item()
        if cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - t) / n

    block(args.steps)  # warm-up (and the probe's FLOP count at step 20)
    out = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__}
    flops = probe.goodput.flops
    if flops:
        out["flop_count_step_s"] = flops["step_s"]
    for kind in ("trace", "memory") if cuda else ("trace",):
        before = [block(args.steps) for _ in range(3)]
        client.request_capture(kind)
        during = block(30)
        after = [block(args.steps) for _ in range(3)]
        time.sleep(1.0)  # the reader's last tick
        mine = [r for r in records if r.kind == kind]
        rec = next(({"step_s_before": r.step_s_before, "step_s_after": r.step_s_after, "error": r.error,
                     "bytes": r.size} for r in mine if not r.follow_up), {})
        follow = next(({"step_s_after": r.step_s_after} for r in mine if r.follow_up), {})
        b, a = statistics.median(before), statistics.median(after)
        out[kind] = {"job_step_s_before": b, "job_step_s_after": a, "change": a / b - 1, "block_with_capture_s": during,
                     "probe_step_s_before": rec.get("step_s_before"),
                     "probe_step_s_after": rec.get("step_s_after") or follow.get("step_s_after"),
                     "error": rec.get("error"), "bytes": rec.get("bytes")}
        print(f"{kind}: job step {b * 1e3:.2f} ms before, {a * 1e3:.2f} ms after ({(a / b - 1) * 100:+.2f} %); "
              f"the probe measured {((rec.get('step_s_before') or 0) * 1e3):.2f} -> "
              f"{((out[kind]['probe_step_s_after'] or 0) * 1e3):.2f} ms; {rec.get('bytes')} bytes; "
              f"error {rec.get('error')}")
    usual = statistics.median([block(50) for _ in range(3)])
    if "flop_count_step_s" in out:
        print(f"FLOP counting: the counted step took {out['flop_count_step_s'] * 1e3:.1f} ms (a step's period "
              f"{usual * 1e3:.2f} ms; the CPU-side time of one step's launches under the counter)")
    out["usual_step_s"] = usual
    stop.set()
    reader.join()
    client.close()
    probe.stop()
    save_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
