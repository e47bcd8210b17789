"""A real PyTorch training job that plays, in turn, the patterns traintop diagnoses.

Phases: healthy large-batch bf16 training; data-starved (slow CPU transforms in 2
loader workers); underused (tiny model, batch 32); leaking (outputs kept in a Python
list); idle (process alive, GPU unused) while another process holds GPU memory.
One JSON line per phase boundary goes to --phases; memory figures go to stdout.

    python bench/workloads/train_phases.py --phases phases.jsonl
    python bench/workloads/train_phases.py --device cpu --small --seconds 2   # dry run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


def mlp(width: int, depth: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers)


class SlowBatches(Dataset):
    """Each item is a whole batch that costs ``cpu_s`` seconds of CPU work (a decode/augment stand-in)."""

    def __init__(self, n: int, batch: int, width: int, cpu_s: float) -> None:
        self.n, self.batch, self.width, self.cpu_s = n, batch, width, cpu_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(i)
        x = torch.randn(self.batch, self.width, generator=g)
        end = time.perf_counter() + self.cpu_s
        while time.perf_counter() < end:
            x = torch.tanh(x * 1.0001)
        return x


class Phases:
    def __init__(self, path: str | None, device: str) -> None:
        self.fh = open(path, "a") if path else None
        self.device = device

    def mark(self, phase: str, event: str, **extra) -> None:
        rec = {"t": time.time(), "phase": phase, "event": event, **extra}
        if self.device == "cuda":
            rec["allocated"] = torch.cuda.memory_allocated()
            rec["reserved"] = torch.cuda.memory_reserved()
        line = json.dumps(rec)
        print(line, flush=True)
        if self.fh:
            self.fh.write(line + "\n")
            self.fh.flush()


def train_steps(model, opt, x, steps: int, dtype) -> float:
    loss = None
    for _ in range(steps):
        with torch.autocast(device_type=x.device.type, dtype=dtype):
            loss = model(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return loss


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phases", help="append phase boundaries (JSON lines) to this file")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="tiny sizes, for a dry run on a CPU")
    ap.add_argument("--seconds", type=float, default=None, help="every phase this long (default: per phase)")
    ap.add_argument("--only", default="healthy,starved,underused,leak,idle")
    ap.add_argument("--log-memory", help="append {t, step, allocated, reserved} JSON lines (to check the probe)")
    ap.add_argument("--probe", action="store_true", help="import traintop.probe (attach by PID finds it)")
    args = ap.parse_args()
    if args.probe:
        import traintop.probe  # noqa: F401
    memlog = open(args.log_memory, "a") if args.log_memory else None

    def log_memory(step: int) -> None:
        if memlog and dev.type == "cuda":
            memlog.write(json.dumps({"t": time.time(), "step": step, "allocated": torch.cuda.memory_allocated(),
                                     "reserved": torch.cuda.memory_reserved()}) + "\n")
            memlog.flush()
    dev = torch.device(args.device)
    dtype = torch.bfloat16
    width, depth, batch = (256, 2, 64) if args.small else (8192, 8, 4096)
    dur = {"healthy": 60, "starved": 60, "underused": 45, "leak": 40, "idle": 25}
    if args.seconds:
        dur = {k: args.seconds for k in dur}
    ph = Phases(args.phases, dev.type)
    torch.manual_seed(0)
    model = mlp(width, depth).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    wanted = args.only.split(",")

    if "healthy" in wanted:
        ph.mark("healthy", "start", width=width, depth=depth, batch=batch)
        x = torch.randn(batch, width, device=dev)
        end, steps = time.time() + dur["healthy"], 0
        while time.time() < end:
            train_steps(model, opt, x, 10, dtype)
            steps += 10
            if dev.type == "cuda":
                torch.cuda.synchronize()
            log_memory(steps)
        ph.mark("healthy", "end", steps=steps)

    if "starved" in wanted:
        # 2 workers, each needing ~1.6 s of CPU per batch; the GPU needs ~0.4 s for it.
        ds = SlowBatches(n=10_000, batch=batch // 8, width=width, cpu_s=0.08 if args.small else 1.6)
        loader = DataLoader(ds, batch_size=None, num_workers=2, pin_memory=dev.type == "cuda",
                            persistent_workers=True, prefetch_factor=2)
        ph.mark("starved", "start", workers=2)
        end, batches = time.time() + dur["starved"], 0
        for xb in loader:
            xb = xb.to(dev, non_blocking=True)
            train_steps(model, opt, xb.repeat(8, 1), 16, dtype)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            batches += 1
            if time.time() >= end:
                break
        ph.mark("starved", "end", batches=batches)
        del loader

    if "underused" in wanted:
        tiny = mlp(256, 2).to(dev)
        topt = torch.optim.SGD(tiny.parameters(), lr=1e-3)
        ph.mark("underused", "start", batch=32)
        end, steps = time.time() + dur["underused"], 0
        while time.time() < end:
            xb = torch.randn(32, 256).to(dev)
            loss = tiny(xb).pow(2).mean()
            topt.zero_grad()
            loss.backward()
            topt.step()
            loss.item()  # the usual per-step logging sync
            steps += 1
        ph.mark("underused", "end", steps=steps)
        del tiny, topt

    if "leak" in wanted:
        kept = []  # the bug: outputs kept across steps
        x = torch.randn(batch, width, device=dev)
        ph.mark("leak", "start")
        end, steps = time.time() + dur["leak"], 0
        with torch.no_grad():
            while time.time() < end:
                t0 = time.time()
                with torch.autocast(device_type=dev.type, dtype=dtype):
                    kept.append(model[0](x))  # bf16 out: 64 MiB per step at full size
                steps += 1
                log_memory(steps)
                time.sleep(max(0.0, 0.125 - (time.time() - t0)))  # ~8 steps/s -> ~0.5 GiB/s
        ph.mark("leak", "end", steps=steps, kept=len(kept))
        del kept
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    if "idle" in wanted:
        holder = None
        if dev.type == "cuda":
            code = ("import torch, time; x = torch.empty(16 * 2**30, dtype=torch.uint8, device='cuda'); "
                    f"time.sleep({dur['idle']})")
            holder = subprocess.Popen([sys.executable, "-c", code])
        ph.mark("idle", "start", other_process=holder.pid if holder else None)
        time.sleep(dur["idle"])
        if holder:
            holder.wait()
        ph.mark("idle", "end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
