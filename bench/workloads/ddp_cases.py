"""Two-rank DDP jobs that go wrong in the ways a multi-GPU node does (one process per GPU).

  balanced   both ranks equal: the healthy reference
  straggler  rank --slow-rank spends --cpu-s of CPU work on its main thread before each step
             (a slow input path); the other rank waits for it in the gradient all-reduce
  stall      --seconds of normal steps, then rank --slow-rank blocks (never reaches the next
             all-reduce) for --stall-s; the other waits in NCCL until its watchdog (--nccl-timeout)
             ends the job
  starved    each rank has its own DataLoader (2 workers); only rank --slow-rank's items cost
             --cpu-s of CPU each (slow transforms), the other rank's are ready at once

    torchrun --nproc_per_node=2 bench/workloads/ddp_cases.py straggler --seconds 50

One JSON line per rank and event goes to --events (start, stall, end, with step counts and times).
Nothing here changes the GPU's clocks, power limit or modes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset


class Log:
    def __init__(self, path: str | None, rank: int) -> None:
        self.fh = open(path, "a") if path else None
        self.rank = rank

    def __call__(self, event: str, **kw) -> None:
        line = json.dumps({"t": time.time(), "rank": self.rank, "event": event, **kw})
        print(line, flush=True)
        if self.fh:
            self.fh.write(line + "\n")
            self.fh.flush()


def cpu_work(seconds: float, x: torch.Tensor) -> torch.Tensor:
    """A stand-in for decoding/augmenting on the CPU."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        x = torch.tanh(x * 1.0001)
    return x


class Items(Dataset):
    """Batches of (batch, width) floats; each costs ``cpu_s`` of CPU (0: ready at once)."""

    def __init__(self, batch: int, width: int, cpu_s: float) -> None:
        self.batch, self.width, self.cpu_s = batch, width, cpu_s

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> torch.Tensor:
        x = torch.randn(self.batch, self.width, generator=torch.Generator().manual_seed(i))
        return cpu_work(self.cpu_s, x) if self.cpu_s else x


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["balanced", "straggler", "stall", "starved"])
    ap.add_argument("--seconds", type=float, default=50.0, help="how long to train (before the stall, for stall)")
    ap.add_argument("--width", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--slow-rank", type=int, default=1)
    ap.add_argument("--cpu-s", type=float, default=0.25)
    ap.add_argument("--stall-s", type=float, default=60.0)
    ap.add_argument("--nccl-timeout", type=float, default=40.0)
    ap.add_argument("--events", help="append JSON lines of what each rank did")
    ap.add_argument("--cpu", action="store_true", help="a dry run on the CPU (gloo), tiny sizes")
    args = ap.parse_args()
    if args.cpu:
        args.width, args.batch = 64, 64
    dist.init_process_group("gloo" if args.cpu else "nccl", timeout=datetime.timedelta(seconds=args.nccl_timeout))
    rank = dist.get_rank()
    local = int(os.environ.get("LOCAL_RANK", rank))
    dev = torch.device("cpu") if args.cpu else torch.device("cuda", local)
    if not args.cpu:
        torch.cuda.set_device(local)
    log = Log(args.events, rank)
    slow = rank == args.slow_rank
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(6):
        layers += [nn.Linear(args.width, args.width), nn.GELU()]
    model = DDP(nn.Sequential(*layers).to(dev), device_ids=None if args.cpu else [local])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.width, device=dev)
    host = torch.randn(256, 1024)
    batches = None
    if args.mode == "starved":
        ds = Items(args.batch // 8, args.width, args.cpu_s if slow else 0.0)
        batches = iter(DataLoader(ds, batch_size=None, num_workers=2, pin_memory=not args.cpu,
                                  persistent_workers=True, prefetch_factor=2))
    log("start", mode=args.mode, slow=slow, pid=os.getpid())
    t0 = time.time()
    end = t0 + args.seconds
    steps = 0
    while True:
        stop = torch.tensor([1.0 if time.time() > end else 0.0], device=dev)
        dist.all_reduce(stop)
        if stop.item() > 0:
            break
        if batches is not None:
            x = next(batches).to(dev, non_blocking=True).repeat(8, 1)
        if args.mode == "straggler" and slow:
            host = cpu_work(args.cpu_s, host)  # the slow input path, on the main thread
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps += 1
    log("trained", steps=steps, seconds=time.time() - t0)
    if args.mode == "stall":
        if slow:
            log("stall", steps=steps, how="blocks before the next all-reduce", seconds=args.stall_s)
            time.sleep(args.stall_s)  # the hang: never reaches the collective the others wait in
            log("stall_end")
            return 1
        log("waiting", steps=steps)
        # the others enter the next step's all-reduce and wait there until the watchdog ends the job
        stop = torch.tensor([0.0], device=dev)
        dist.all_reduce(stop)
        stop.item()
        log("unexpected", note="the all-reduce returned")
    dist.destroy_process_group()
    log("end", steps=steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
