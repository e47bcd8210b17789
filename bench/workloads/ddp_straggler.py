"""Two-rank DDP with a straggler: one rank's DataLoader is slow, so every rank steps at its pace.

    torchrun --nproc_per_node=2 bench/workloads/ddp_straggler.py --seconds 60 --slow-rank 1 --delay 0.03

Synchronous data parallelism: all ranks' step times are equal (each all-reduce waits for the
slowest rank); the straggler shows as the rank that waits for its input while the others
wait in the collective. The loader runs in the main process (num_workers=0) so the probe's
input wait counts the slow __getitem__.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset


class Batches(Dataset):
    def __init__(self, width: int, batch: int, delay: float) -> None:
        self.width, self.batch, self.delay = width, batch, delay

    def __len__(self):
        return 1 << 30

    def __getitem__(self, i):
        if self.delay:
            time.sleep(self.delay)  # a slow input pipeline (decoding, a slow mount)
        return torch.randn(self.batch, self.width)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--slow-rank", type=int, default=1)
    ap.add_argument("--delay", type=float, default=0.03)
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    layers = []
    for _ in range(4):
        layers += [nn.Linear(args.width, args.width), nn.GELU()]
    model = DDP(nn.Sequential(*layers).cuda(), device_ids=[local])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    delay = args.delay if rank == args.slow_rank else 0.0
    loader = DataLoader(Batches(args.width, args.batch, delay), batch_size=None, num_workers=0)
    end = time.time() + args.seconds
    steps = 0
    for x in loader:
        stop = torch.tensor([1.0 if time.time() > end else 0.0], device="cuda")
        dist.all_reduce(stop)
        if stop.item() > 0:
            break
        x = x.cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps += 1
    print(f"rank {rank}: {steps} steps (input delay {delay:g} s a batch)", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
