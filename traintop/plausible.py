"""What a sample can plausibly hold: the ranges every reader of outside data checks against.

Recordings, nvidia-smi logs and probe messages can be written by someone else (or be
damaged). A value outside its range is read as unknown (None), never shown or summed: an
"inf %" utilization or a negative power would otherwise reach the screen and the GPU-hours
of ``analyze``. Structure (a GPU index, a time) is checked too: out of range, the line or
chunk that holds it is skipped. The ranges are wide — several times what any GPU, host or
job of today reports — so real data is never touched. docs/SECURITY.md lists them.
"""

from __future__ import annotations

import json
import math

from traintop.samples import LEDGER_BUCKETS

TiB = 1 << 40
MAX_GPUS = 64  # GPU indices 0..63 (NVML reports far fewer on any host today)
MAX_RANKS = 1024  # probes of one job on one host
MAX_GPU_PROCESSES = 4096  # processes on one GPU at one time (what a recording keeps of its list)
MAX_THREADS = 256  # threads in one stack dump
MAX_STACK_CHARS = 64 * 1024  # of one thread's stack (its innermost calls are kept)
MAX_NAME = 200  # characters of a thread's name
# Sample times, seconds since the epoch: a time outside this window is damage (a chunk time of
# 10**20 ms, a log line from year 9999). Recordings written by tests and the simulator may start
# at 0; logs are checked against the years 2000..2100 (LOG_T_MIN).
T_MIN, T_MAX = 0.0, 4_102_444_800.0  # 2100-01-01
LOG_T_MIN = 946_684_800.0  # 2000-01-01
MAX_COUNT = 2 ** 63 - 1

_PCT = (0.0, 100.0)
_BYTES = (0, 64 * TiB)
_RATE = (0.0, 1e13)  # bytes per second: well above NVLink-C2C and 400 G NICs

GPU = {
    "util": _PCT, "util_min": _PCT, "util_max": _PCT, "mem_util": _PCT,
    "mem_used": _BYTES, "mem_total": _BYTES, "mem_reserved": _BYTES,
    "power_w": (0.0, 10_000.0), "power_limit_w": (0.0, 10_000.0),
    "temp_c": (-50.0, 200.0), "temp_slowdown_c": (-50.0, 200.0),
    "sm_clock": (0, 100_000), "sm_clock_max": (0, 100_000), "mem_clock": (0, 100_000), "mem_clock_max": (0, 100_000),
    "reasons": (0, 2 ** 64 - 1), "pcie_tx": _RATE, "pcie_rx": _RATE, "energy_j": (0.0, 1e15),
    "pcie_gen": (0, 32), "pcie_width": (0, 64), "pcie_gen_max": (0, 32), "pcie_width_max": (0, 64),
    "sm_active": _PCT, "sm_occupancy": _PCT, "tensor_active": _PCT, "dram_active": _PCT,
    "throttle_power": _PCT, "throttle_thermal": _PCT,
    "ecc_corrected": (0, MAX_COUNT), "ecc_uncorrected": (0, MAX_COUNT), "remap_pending": (0, MAX_COUNT),
    "xid": (0, 2 ** 31 - 1), "nvlink_tx": _RATE, "nvlink_rx": _RATE, "parent": (0, MAX_GPUS - 1),
}
HOST = {
    "cpu_percent": _PCT, "iowait": _PCT, "mem_used": _BYTES, "mem_total": _BYTES, "swap_used": _BYTES,
    "swap_total": _BYTES, "disk_read": _RATE, "disk_write": _RATE, "net_rx": _RATE, "net_tx": _RATE,
}
CORE = _PCT
PROCESS = {"cpu_percent": (0.0, 1e6), "rss": _BYTES, "threads": (0, 10_000_000),
           "read_rate": _RATE, "write_rate": _RATE}
MEMBER = {"cpu_percent": (0.0, 1e6), "rss": _BYTES, "threads": (0, 10_000_000)}
LEDGER_SETTLE_MAX = 10_000.0
RANK = {
    "pid": (1, 2 ** 31 - 1), "rank": (0, 10_000_000), "world_size": (1, 10_000_000), "device": (0, MAX_GPUS - 1),
    "allocated": _BYTES, "reserved": _BYTES, "peak": _BYTES, "active": _BYTES, "inactive_split": _BYTES,
    "alloc_retries": (0, MAX_COUNT), "ooms": (0, MAX_COUNT), "steps": (0, MAX_COUNT),
    "skipped_steps": (0, MAX_COUNT), "step_time": (0.0, 1e6), "steps_per_s": (0.0, 1e6), "input_wait": (0.0, 1.0), "age": (0.0, 1e9),
    # seconds per second of the sample's interval: above 1 where a pause held back in earlier samples
    # (no step yet, not overdue) is settled, so that a run's buckets add up to its wall time
    **{"time_" + b: (0.0, LEDGER_SETTLE_MAX) for b in LEDGER_BUCKETS},
    "matmul": (0, 3), "step_flops": (0.0, 1e21), "backend": (0, 5),
}
PID = (1, 2 ** 31 - 1)


def number(value, bounds):
    """``value`` if it is a finite number (not a bool) within ``bounds``, else None."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    lo, hi = bounds
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if lo <= value <= hi else None


def time_ok(t, lo: float = T_MIN) -> bool:
    return isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and lo <= t < T_MAX


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number")


def json_doc(text: str | bytes, max_chars: int):
    """JSON from outside, or ValueError: at most ``max_chars`` long, nested no deeper than the
    parser allows (its RecursionError is a ValueError here), no NaN or Infinity. Numbers too
    large for a float (``1e400``) come back infinite and numbers of thousands of digits are
    refused by the parser: the ranges above, checked after, read either as unknown."""
    if len(text) > max_chars:
        raise ValueError(f"longer than {max_chars} characters")
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None
