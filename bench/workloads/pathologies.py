"""GPU pathologies on demand, for recording real sessions (each runs for --seconds).

  small_kernels  CUDA graphs of tiny matmuls: utilization ~100 %, a few SMs busy
  pcie           pinned 2 GiB host-to-device copies with a little compute: the link is the limit
  fragmentation  thousands of odd-sized tensors, every other one freed, then training-like compute:
                 reserved far above allocated
  holder         allocates --gib of GPU memory and sleeps (the "other process")
  train          a steady bf16 matmul loop (the job beside the holder)
  fault          a kernel that reads an illegal address (the driver reports an XID); exits non-zero
  pageable       256 MiB from ordinary (pageable, not pinned) host memory to the GPU each step,
                 with a little compute: the copies, staged by the CPU, limit the GPU
  loader_hang    training fed by a DataLoader with 2 workers, until one worker hangs in its
                 __getitem__ (after --seconds): the job stops stepping, waiting for that batch,
                 until the loader's own timeout (--hang-s) ends it

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
    _kept = tensors[1::2]  # held to the end: the holes between them stay reserved
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


def pageable(torch, seconds, out):
    n = 64 * 2**20  # 256 MiB of float32, ordinary host memory: every copy is staged by the CPU
    host = torch.empty(n, dtype=torch.float32)
    host.uniform_()
    dev = torch.empty(n, dtype=torch.float32, device="cuda")
    w = torch.randn(2048, 2048, device="cuda")
    end = time.time() + seconds
    copies, t0 = 0, time.time()
    while time.time() < end:
        dev.copy_(host)  # pageable: synchronous, whatever non_blocking says
        (dev[: 2048 * 2048].view(2048, 2048) @ w).sum().item()
        copies += 1
    dt = time.time() - t0
    log(out, phase="pageable", copies=copies, gbps=copies * n * 4 / dt / 1e9, steps_per_s=copies / dt)


class _HangingItems:
    """Batches that cost 20 ms of CPU each; from wall time ``hang_after`` on, worker 0 never
    returns its next item (a worker stuck on a lock, a dead file system, a bad record)."""

    def __init__(self, torch, hang_after, hang_s):
        self.torch, self.hang_after, self.hang_s = torch, hang_after, hang_s

    def __len__(self):
        return 10**9

    def __getitem__(self, i):
        info = self.torch.utils.data.get_worker_info()
        if info is not None and info.id == 0 and time.time() >= self.hang_after:
            time.sleep(self.hang_s)
        x = self.torch.randn(512, 4096)
        end = time.perf_counter() + 0.02
        while time.perf_counter() < end:
            x = self.torch.tanh(x * 1.0001)
        return x


def loader_hang(torch, seconds, out, hang_s):
    import torch.nn as nn
    from torch.utils.data import DataLoader

    model = nn.Sequential(nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 4096)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    hang_after = time.time() + seconds
    loader = DataLoader(_HangingItems(torch, hang_after, hang_s + 30), batch_size=None, num_workers=2,
                        pin_memory=True, timeout=hang_s)
    log(out, phase="loader_hang", hang_after=hang_after)
    steps = 0
    try:
        for xb in loader:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(xb.cuda(non_blocking=True).repeat(8, 1)).float().pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            steps += 1
            if steps % 20 == 0:
                loss.item()
                log(out, phase="loader_hang", steps=steps)
    except RuntimeError as e:
        log(out, phase="loader_hang_end", steps=steps, error=str(e)[:200])
        raise SystemExit(1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["small_kernels", "pcie", "fragmentation", "holder", "train", "fault",
                                     "pageable", "loader_hang"])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--gib", type=float, default=10.0)
    ap.add_argument("--hang-s", type=float, default=45.0, help="loader_hang: how long the job waits")
    ap.add_argument("--log", help="JSON lines of what the workload did")
    args = ap.parse_args()
    import torch
    out = open(args.log, "a") if args.log else None
    fn = globals()[args.mode]
    if args.mode == "holder":
        holder(torch, args.seconds, out, args.gib)
    elif args.mode == "loader_hang":
        loader_hang(torch, args.seconds, out, args.hang_s)
    else:
        fn(torch, args.seconds, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
