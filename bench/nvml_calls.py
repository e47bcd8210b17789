"""What each NVML query costs on this machine, and what a traintop fast tick costs.

    python bench/nvml_calls.py [--json FILE]

Prints a table (median and p90 µs per call) and checks whether a slow query
(PCIe throughput) running on another thread delays the fast ones.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time


CPU: dict = {}  # name -> CPU µs a call (this thread's), beside the wall-clock figures


def timeit(fn, n: int, name: str | None = None) -> tuple[float, float]:
    for _ in range(min(5, n)):
        try:
            fn()
        except Exception:
            return float("nan"), float("nan")
    xs = []
    cpu = time.thread_time()
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        xs.append((time.perf_counter_ns() - t) / 1000)
    if name:
        CPU[name] = (time.thread_time() - cpu) / n * 1e6
    xs.sort()
    return statistics.median(xs), xs[int(0.9 * (len(xs) - 1))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    try:
        import pynvml as nv
        nv.nvmlInit()
    except Exception as e:
        print(f"no NVML here ({e})")
        return 0
    h = nv.nvmlDeviceGetHandleByIndex(0)
    reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", nv.nvmlDeviceGetCurrentClocksThrottleReasons)
    calls = {
        "utilization": (lambda: nv.nvmlDeviceGetUtilizationRates(h), 500),
        "memory_v2": (lambda: nv.nvmlDeviceGetMemoryInfo(h, nv.nvmlMemory_v2), 500),
        "power": (lambda: nv.nvmlDeviceGetPowerUsage(h), 500),
        "power_limit": (lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h), 500),
        "temperature": (lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU), 500),
        "sm_clock": (lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM), 500),
        "clock_reasons": (lambda: reasons(h), 500),
        "processes": (lambda: nv.nvmlDeviceGetComputeRunningProcesses(h), 500),
        "util_samples": (lambda: nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, 0), 200),
        "max_clock": (lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM), 100),
        "energy": (lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h), 50),
        "pcie_tx": (lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES), 10),
        "violation": (lambda: nv.nvmlDeviceGetViolationStatus(h, nv.NVML_PERF_POLICY_POWER), 100),
        "ecc_total": (lambda: nv.nvmlDeviceGetTotalEccErrors(h, 1, 0), 100),
        "remapped_rows": (lambda: nv.nvmlDeviceGetRemappedRows(h), 100),
        "pcie_link": (lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h), 100),
    }
    recent = lambda: int((time.time() - 2) * 1e6)  # noqa: E731 - the samples of the last 2 s, as a window asks
    for name in ("nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization"):
        fn = getattr(nv, name, None)
        if fn is not None:  # NOT_FOUND where nothing ran on the GPU: timed where a job is on it
            calls[name.removeprefix("nvmlDevice")] = (lambda fn=fn: fn(h, recent()), 30)
    calls["util_samples_2s"] = (lambda: nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, recent()), 30)
    try:  # GPM: one sample (the metrics come from two)
        if nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
            gs = nv.nvmlGpmSampleAlloc()
            calls["gpm_sample"] = (lambda: nv.nvmlGpmSampleGet(h, gs), 100)
    except Exception as e:
        print("GPM not available:", e)
    rows = {}
    for name, (fn, n) in calls.items():
        rows[name] = timeit(fn, n, name)

    from traintop.collectors.nvml import NvmlCollector

    col = NvmlCollector(nv)
    tick_med, tick_p90 = timeit(col.sample, 300)
    gpm_poll = timeit(col.poll_gpm, 30)  # one GPM sample plus the metrics of the window, per GPU
    slow_poll = timeit(col.poll_slow, 10)
    # The calls a fast tick makes (the utilization buffer, PCIe and energy are on the slow thread).
    fast_sum = sum(rows[k][0] for k in ("utilization", "memory_v2", "power", "power_limit", "temperature",
                                          "clock_reasons", "processes")) + 2 * rows["sm_clock"][0]
    # Does a slow query on another thread delay the fast ones (a shared driver lock)?
    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES)

    th = threading.Thread(target=hammer, daemon=True)
    th.start()
    time.sleep(0.05)
    contended = timeit(lambda: nv.nvmlDeviceGetUtilizationRates(h), 200)
    tick_contended = timeit(col.sample, 50)
    stop.set()
    th.join()

    print(f"{'query':<34}{'median µs':>12}{'p90 µs':>12}{'CPU µs':>10}")
    for name, (med, p90) in rows.items():
        print(f"{name:<34}{med:>12.1f}{p90:>12.1f}{CPU.get(name, float('nan')):>10.1f}")
    print(f"{'traintop tick':<16}{tick_med:>12.1f}{tick_p90:>12.1f}   (raw fast calls it makes: {fast_sum:.1f} µs)")
    print(f"{'util, PCIe busy':<16}{contended[0]:>12.1f}{contended[1]:>12.1f}   (another thread loops PCIe TX)")
    print(f"{'tick, PCIe busy':<16}{tick_contended[0]:>12.1f}{tick_contended[1]:>12.1f}")
    print(f"{'GPM poll':<16}{gpm_poll[0]:>12.1f}{gpm_poll[1]:>12.1f}   (slow thread, once a window: 1 s, or 2 s at ≤ 1 Hz)")
    print(f"{'slow poll':<16}{slow_poll[0]:>12.1f}{slow_poll[1]:>12.1f}   (slow thread: every 10 s, energy every 30 s)")
    print("GPM supported:", col.gpm.supported, "events:", col.events.registered)
    print("unsupported fields:", sorted(f for (_, f) in col._unsupported) or "none")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"calls": rows, "cpu_us": CPU, "tick": [tick_med, tick_p90], "fast_sum": fast_sum,
                       "util_contended": contended, "tick_contended": tick_contended,
                       "gpm_poll": gpm_poll, "slow_poll": slow_poll,
                       "device": nv.nvmlDeviceGetName(h)}, fh, indent=1, default=str)
    col.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
