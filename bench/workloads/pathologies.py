"""GPU pathologies on demand, for recording real sessions (each runs for --seconds).

  small_kernels  CUDA graphs of tiny matmuls: utilization ~100 %, a few SMs busy
  pcie           pinned 2 GiB host-to-device copies with a little compute: the link is the limit
  fragmentation  thousands of odd-sized tensors, every other one freed, then training-like compute:
                 reserved far above allocated
  holder         allocates --gib of GPU memory and sleeps (the "other process")
  train          a steady bf16 matmul loop (the job beside the holder)
  fault          a kernel that reads an illegal address (the driver reports an XID); exits non-zero

Nothing here changes the GPU's clocks, power limit or modes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def log(out, **kw):
    if out:
        out.write(json.dumps({"t": time.time(), **kw}) + "\n")
        out.flush()


def small_kernels(torch, seconds, out):
    a = torch.randn(64, 64, device="cuda") * 0.01
    x = torch.randn(64, 64, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside the graph, as capture requires
        for _ in range(3):
            torch.tanh(x @ a)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x
        for _ in range(400):
            y = torch.tanh(y @ a)
    end = time.time() + seconds
    n = 0
    while time.time() < end:
        for _ in range(20):
            g.replay()
        torch.cuda.synchronize()
        n += 20
    log(out, phase="small_kernels", replays=n, kernels=n * 800)


def pcie(torch, seconds, out):
    n = 512 * 2**20  # 2 GiB of float32
    host = torch.empty(n, dtype=torch.float32).pin_memory()
    host.uniform_()
    dev = torch.empty(n, dtype=torch.float32, device="cuda")
    w = torch.randn(4096, 4096, device="cuda")
    end = time.time() + seconds
    copies, t0 = 0, time.time()
    while time.time() < end:
        dev.copy_(host, non_blocking=True)
        (dev[: 4096 * 4096].view(4096, 4096) @ w).sum()
        torch.cuda.synchronize()
        copies += 1
    dt = time.time() - t0
    log(out, phase="pcie", copies=copies, gbps=copies * n * 4 / dt / 1e9)


def fragmentation(torch, seconds, out):
    import random
    rnd = random.Random(7)
    # 6000 odd sizes of 1.1-9 MiB, all alive at once; then every other one is freed. The holes
    # stay reserved, and no later allocation (the 128 MiB matrices below) fits in them.
    tensors = [torch.empty(int(rnd.uniform(1.1, 9.0) * 2**20), dtype=torch.uint8, device="cuda")
               for _ in range(6000)]
    freed = sum(t.numel() for t in tensors[::2])
    kept = tensors[1::2]
    del tensors
    torch.cuda.synchronize()
    log(out, phase="fragmentation", allocated=torch.cuda.memory_allocated(),
        reserved=torch.cuda.memory_reserved(), freed=freed)
    _matmuls(torch, seconds, pause=0.01)
    log(out, phase="fragmentation_end", allocated=torch.cuda.memory_allocated(), reserved=torch.cuda.memory_reserved())


def holder(torch, seconds, out, gib):
    t = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
    t.fill_(1)
    torch.cuda.synchronize()
    log(out, phase="holder", bytes=t.numel())
    time.sleep(seconds)


def _matmuls(torch, seconds, pause=0.0):
    """A steady bf16 matmul loop (a stand-in for training compute), for ``seconds``."""
    w = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(20):
            x = torch.tanh(x @ w)
        torch.cuda.synchronize()
        if pause:
            time.sleep(pause)


def train(torch, seconds, out):
    _matmuls(torch, seconds)
    log(out, phase="train_end")


def fault(torch, seconds, out):
    """An out-of-bounds read through a raw pointer: the GPU's MMU faults (an XID in the driver log)."""
    x = torch.zeros(16, device="cuda")
    log(out, phase="fault_start")
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def bad(p, q):
            tl.store(q, tl.load(p + (1 << 40)))

        y = torch.zeros(1, device="cuda")
        bad[(1,)](x, y)
        torch.cuda.synchronize()
        how = "triton"
    except ImportError:
        idx = torch.tensor([1 << 30], device="cuda")
        x[idx].sum().item()  # device-side assert
        how = "index"
    log(out, phase="fault_end", how=how)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["small_kernels", "pcie", "fragmentation", "holder", "train", "fault"])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--gib", type=float, default=10.0)
    ap.add_argument("--log", help="JSON lines of what the workload did")
    args = ap.parse_args()
    import torch
    out = open(args.log, "a") if args.log else None
    fn = globals()[args.mode]
    if args.mode == "holder":
        holder(torch, args.seconds, out, args.gib)
    else:
        fn(torch, args.seconds, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
