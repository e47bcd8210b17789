"""A small DDP training job (one process per GPU) for checking traintop on several GPUs.

    torchrun --nproc_per_node=2 bench/workloads/ddp_train.py --seconds 30
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--width", type=int, default=8192)
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    layers = []
    for _ in range(6):
        layers += [nn.Linear(args.width, args.width), nn.GELU()]
    model = DDP(nn.Sequential(*layers).cuda(), device_ids=[local])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(2048, args.width, device="cuda")
    end = time.time() + args.seconds
    steps = 0
    while True:
        stop = torch.tensor([1.0 if time.time() > end else 0.0], device="cuda")
        dist.all_reduce(stop)
        if stop.item() > 0:
            break
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps += 1
    print(f"rank {rank}: {steps} steps, allocated {torch.cuda.memory_allocated()} reserved {torch.cuda.memory_reserved()}",
          flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
