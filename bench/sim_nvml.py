"""traintop against a stand-in for NVML posing as many GPUs with processes on them (no GPU needed).

    python bench/sim_nvml.py --gpus 8 --procs 8 --pids 101,102,... [--cost h200] [--calls FILE] \\
        -- record --interval 1 out.ttrec

Runs ``traintop ARGS...`` (the real command: live collectors, owners, rules, recorder, dashboard or
agent) with ``pynvml`` replaced by a fake whose GPU figures come from the simulator (one scenario
per GPU, collectors/simulated.py) and whose per-process answers behave as an H200's did
(2026-12-04, driver 580, measured by this bench's author):

- ``nvmlDeviceGetComputeRunningProcesses``: the PIDs given (``--procs`` of them per GPU, real
  processes here, so /proc reads are real), each holding a share of the GPU's memory;
- the utilization sample buffer (``nvmlDeviceGetSamples``) holds one sample every 200 ms, 72 of
  them, and answers those newer than asked;
- the per-process buffer answers one sample per process, its newest (every 200 ms), if newer than
  asked, else NOT_FOUND; a GPU with one process has samples equal to the GPU's own.

``--cost h200`` makes each call use the CPU time that call took on an H200 under a training job
(spent in C, GIL released, as a real NVML call does), so the CPU figures include what NVML would
cost; without it the calls cost nothing and what is measured is traintop's own work. ``--calls FILE``
writes the number of calls of each kind (JSON, every 2 s and at exit).
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import os
import sys
import threading
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

# CPU µs per call on an H200 (driver 580.159.04) with a bf16 training job on it: process_time over
# 30-40 calls each, in one process (fast fields under load; the buffers 1.9 ms whether one or two
# C calls make the Python call); the rarer calls from bench/results/h200-2026-11-29/nvml-calls-3.txt.
H200_US = {"util": 1, "memory": 6, "power": 1, "power_limit": 1, "temp": 1, "clock": 1, "reasons": 1,
           "processes": 17, "util_samples": 1900, "process_util": 1880, "gpm_sample": 37, "violation": 730,
           "energy": 2800, "ecc": 2, "remapped": 2, "pcie_link": 1}
SAMPLE_PERIOD_US = 200_000  # the driver's utilization sample period on the H200
BUFFER = 72  # samples the driver keeps


class Spin:
    """Spends CPU in C with the GIL released (a SHA-256 of a buffer), as a driver call does."""

    def __init__(self) -> None:
        self.block = b"\0" * 65536
        t = time.thread_time()
        for _ in range(200):
            hashlib.sha256(self.block).digest()
        self.bytes_per_us = max(1.0, 200 * len(self.block) / max(1e-6, (time.thread_time() - t) * 1e6))
        self.views: dict[int, memoryview] = {}

    def __call__(self, us: float) -> None:
        n = int(us * self.bytes_per_us)
        if n < 4096:  # below what hashlib releases the GIL for: the Python call is about that anyway
            return
        while n > 0:
            k = min(n, len(self.block))
            hashlib.sha256(memoryview(self.block)[:k]).digest()
            n -= k


def build(gpus: int, procs: int, pids: list[int], scenario: str, cost: dict | None, seed: int = 0):
    """A pynvml-like module and its call counter."""
    from fakes import NVMLError, add_hopper_extras, make_fake_nvml

    from traintop.collectors.simulated import Simulator

    nv, calls = make_fake_nvml(n=gpus)
    add_hopper_extras(nv, calls)
    sim = Simulator(scenario, gpus=gpus, seed=seed, interval=SAMPLE_PERIOD_US / 1e6, t0=0.0, probe=False)
    spin = Spin() if cost else None
    lock = threading.Lock()
    cache: dict[tuple[int, int], object] = {}

    def now_period() -> int:
        return int(time.time() * 1e6) // SAMPLE_PERIOD_US

    def gpu(h, period=None):
        """GPU ``h``'s simulated sample of a 200-ms period (computed once: the fake's own cost is small)."""
        key = (h, now_period() if period is None else period)
        with lock:
            g = cache.get(key)
            if g is None:
                if len(cache) > 4096:
                    cache.clear()
                g = cache[key] = sim._gpu(h, sim.scenarios[h], key[1] * SAMPLE_PERIOD_US / 1e6)
            return g

    def counted(name, fn):
        def call(*a):
            calls[name] = calls.get(name, 0) + 1
            if spin is not None:
                spin(cost.get(name, 1))
            return fn(*a)
        return call

    def pids_of(h) -> list[int]:
        listed = pids() if callable(pids) else pids
        mine = listed[h * procs:(h + 1) * procs]
        return mine if gpu(h).processes else []

    def util(h):
        g = gpu(h)
        return types.SimpleNamespace(gpu=int(g.util or 0), memory=int(g.mem_util or 0))

    def memory(h, version=None):
        g = gpu(h)
        return types.SimpleNamespace(used=g.mem_used or 0, total=g.mem_total, reserved=g.mem_reserved or 0,
                                     free=(g.mem_total or 0) - (g.mem_used or 0))

    def processes(h):
        mine = pids_of(h)
        used = (gpu(h).mem_used or 0) // max(1, len(mine))
        return [types.SimpleNamespace(pid=p, usedGpuMemory=used) for p in mine]

    def samples(h, kind, since):
        last = now_period()
        periods = [p for p in range(last - BUFFER + 1, last + 1) if p * SAMPLE_PERIOD_US > since]
        if not periods:
            raise NVMLError(6)
        return 1, [types.SimpleNamespace(timeStamp=p * SAMPLE_PERIOD_US,
                                         sampleValue=types.SimpleNamespace(uiVal=int(_busy(gpu(h, p)))))
                   for p in periods]

    def process_util(h, since):
        last = now_period()
        ts = last * SAMPLE_PERIOD_US
        mine = pids_of(h)
        if ts <= since or not mine:
            raise NVMLError(6)
        g = gpu(h, last)
        busy = _busy(g)
        # a sole process's samples are the GPU's; several share it unevenly
        weights = [1.0] if len(mine) == 1 else [1.0 / (k + 1) for k in range(len(mine))]
        scale = busy / sum(weights)
        return [types.SimpleNamespace(timeStamp=ts, pid=p, smUtil=int(round(w * scale)),
                                      memUtil=int(round(w * (g.mem_util or 0) / sum(weights))), encUtil=0,
                                      decUtil=0) for p, w in zip(mine, weights)]

    fns = {"nvmlDeviceGetUtilizationRates": ("util", util),
           "nvmlDeviceGetMemoryInfo": ("memory", memory),
           "nvmlDeviceGetPowerUsage": ("power", lambda h: int((gpu(h).power_w or 0) * 1000)),
           "nvmlDeviceGetTemperature": ("temp", lambda h, kind: int(gpu(h).temp_c or 0)),
           "nvmlDeviceGetClockInfo": ("clock", lambda h, kind: gpu(h).sm_clock if kind == 1 else gpu(h).mem_clock),
           "nvmlDeviceGetCurrentClocksEventReasons": ("reasons", lambda h: gpu(h).reasons or 0),
           "nvmlDeviceGetComputeRunningProcesses": ("processes", processes),
           "nvmlDeviceGetSamples": ("util_samples", samples),
           "nvmlDeviceGetProcessesUtilizationInfo": ("process_util", process_util),
           "nvmlDeviceGetEnforcedPowerLimit": ("power_limit", lambda h: 700_000),
           "nvmlGpmSampleGet": ("gpm_sample", nv.nvmlGpmSampleGet),
           "nvmlDeviceGetViolationStatus": ("violation", nv.nvmlDeviceGetViolationStatus),
           "nvmlDeviceGetTotalEnergyConsumption": ("energy", lambda h: int(time.time() * 500_000)),
           "nvmlDeviceGetTotalEccErrors": ("ecc", lambda h, a, b: 0),
           "nvmlDeviceGetRemappedRows": ("remapped", lambda h: (0, 0, 0, 0)),
           "nvmlDeviceGetCurrPcieLinkGeneration": ("pcie_link", lambda h: 5),
           "nvmlDeviceGetCurrPcieLinkWidth": ("pcie_link", lambda h: 16)}
    for name, (key, fn) in fns.items():
        setattr(nv, name, counted(key, fn))
    nv.nvmlDeviceGetCurrentClocksThrottleReasons = nv.nvmlDeviceGetCurrentClocksEventReasons  # older name
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-sim-{h}"
    nv.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0")
    nv.nvmlDeviceGetMinorNumber = lambda h: h
    return nv, calls


def _children():
    """This process's children, as a call that looks again at most once a second (from its tasks'
    children files: psutil's children() reads every process's stat, a cost of the stand-in, not NVML's)."""
    me = os.getpid()
    seen = {"t": 0.0, "pids": []}

    def now() -> list[int]:
        if time.monotonic() - seen["t"] >= 1.0:
            seen["t"] = time.monotonic()
            kids = set()
            for tid in os.listdir(f"/proc/{me}/task"):
                try:
                    with open(f"/proc/{me}/task/{tid}/children", "rb") as fh:
                        kids.update(int(k) for k in fh.read().split())
                except OSError:
                    pass
            seen["pids"] = sorted(kids)
        return seen["pids"]
    return now


def _busy(g) -> float:
    return float(g.util or 0)


def write_calls(path: str, calls: dict, started: float) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"seconds": round(time.monotonic() - started, 2), "calls": dict(calls)}, f)
    os.replace(tmp, path)


def install(options: list[str]) -> None:
    """Put the fake in place of ``pynvml`` for this process (``options``: this script's own)."""
    ap = argparse.ArgumentParser(prog="sim_nvml.py")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--procs", type=int, default=8, help="processes on each GPU (0: none)")
    ap.add_argument("--pids", default="", help="comma-separated PIDs to report (gpus x procs of them), or "
                    "'children': this process's children (the job `traintop run` starts)")
    ap.add_argument("--scenario", default="healthy", help="the simulator's scenario(s); idle: no process, no work")
    ap.add_argument("--cost", choices=["none", "h200"], default="none")
    ap.add_argument("--calls", help="write the calls made, by kind, to this JSON file")
    args = ap.parse_args(options)
    if args.pids == "children":  # `traintop run`: the job it starts is what holds the GPUs
        pids = _children()
    else:
        pids = [int(p) for p in args.pids.split(",") if p]
        if args.procs and len(pids) < args.gpus * args.procs:
            sys.exit(f"sim_nvml.py: {args.gpus * args.procs} PIDs needed, {len(pids)} given")
    nv, calls = build(args.gpus, args.procs, pids, args.scenario, H200_US if args.cost == "h200" else None)
    sys.modules["pynvml"] = nv
    if args.calls:
        started = time.monotonic()

        def dump_every() -> None:
            while True:
                time.sleep(2.0)
                write_calls(args.calls, calls, started)
        threading.Thread(target=dump_every, daemon=True).start()
        atexit.register(write_calls, args.calls, calls, started)


def main() -> int:
    argv = sys.argv[1:]
    if "--" not in argv:
        sys.exit("usage: sim_nvml.py [options] -- TRAINTOP ARGS...")
    cut = argv.index("--")
    install(argv[:cut])
    from traintop.cli import main as traintop_main

    return traintop_main(argv[cut + 1:])


if __name__ == "__main__":
    sys.exit(main())
