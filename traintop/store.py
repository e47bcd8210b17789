"""Bounded history of every metric: ring buffers on one time axis.

All series share one time axis (one value per key per frame), so a time window is
found once and read from every series. Missing values are stored as NaN and come
back as ``None``. Memory is fixed by ``capacity`` however long traintop runs; what is
older lives in the recording, not in memory. (A downsampled day-long history per series
was dropped: nothing read it, and with 8 GPUs it cost hundreds of MiB after a day.)
"""

from __future__ import annotations

from array import array
from typing import Iterator

from traintop.samples import Frame

NAN = float("nan")


def frame_metrics(frame: Frame) -> Iterator[tuple[str, float | None]]:
    """Flatten a frame into (series key, value) pairs."""
    for g in frame.gpus:
        p = f"gpu{g.index}."
        yield p + "util", g.util
        yield p + "util_min", g.util_min
        yield p + "util_max", g.util_max
        yield p + "mem_util", g.mem_util
        yield p + "mem_used", g.mem_used
        yield p + "mem_total", g.mem_total
        yield p + "power", g.power_w
        yield p + "power_limit", g.power_limit_w
        yield p + "temp", g.temp_c
        yield p + "temp_slowdown", g.temp_slowdown_c
        yield p + "sm_clock", g.sm_clock
        yield p + "sm_clock_max", g.sm_clock_max
        yield p + "mem_clock", g.mem_clock
        yield p + "reasons", g.reasons
        yield p + "pcie_tx", g.pcie_tx
        yield p + "pcie_rx", g.pcie_rx
        yield p + "sm_active", g.sm_active
        yield p + "tensor_active", g.tensor_active
        yield p + "dram_active", g.dram_active
        yield p + "throttle_power", g.throttle_power
        yield p + "throttle_thermal", g.throttle_thermal
        yield p + "ecc_corrected", g.ecc_corrected
        yield p + "ecc_uncorrected", g.ecc_uncorrected
        yield p + "xid", g.xid
        yield p + "nprocs", len(g.processes)
    h = frame.host
    if h is not None:
        yield "host.cpu", h.cpu_percent
        yield "host.iowait", h.iowait
        yield "host.busy_cores", sum(1 for c in h.per_core if c >= 90.0) if h.per_core else None
        yield "host.mem_used", h.mem_used
        yield "host.mem_total", h.mem_total
        yield "host.swap_used", h.swap_used
        yield "host.disk_read", h.disk_read
        yield "host.disk_write", h.disk_write
        yield "host.net_rx", h.net_rx
        yield "host.net_tx", h.net_tx
    p = frame.process
    if p is not None:
        yield "proc.alive", 1.0 if p.alive else 0.0
        yield "proc.cpu", p.cpu_percent
        yield "proc.rss", p.rss
        workers = p.loader_workers
        yield "proc.workers", len(workers)
        busy = [w.cpu_percent for w in workers if w.cpu_percent is not None]
        yield "proc.worker_cpu_max", max(busy) if busy else None
        yield "proc.worker_cpu_mean", sum(busy) / len(busy) if busy else None
    for k, r in enumerate(frame.ranks):
        p = f"rank{r.rank if r.rank is not None else k}."
        yield p + "allocated", r.allocated
        yield p + "reserved", r.reserved
        yield p + "peak", r.peak
        yield p + "inactive_split", r.inactive_split
        yield p + "alloc_retries", r.alloc_retries
        yield p + "ooms", r.ooms
        yield p + "step_time", r.step_time
        yield p + "steps_per_s", r.steps_per_s
        yield p + "input_wait", r.input_wait


class Store:
    """Fixed-capacity history of every series, on one shared time axis."""

    def __init__(self, capacity: int = 7200) -> None:
        if capacity < 2:
            raise ValueError("capacity must be at least 2")
        self.capacity = capacity
        self._times = array("d", bytes(8 * capacity))
        self._values: dict[str, array] = {}
        self._head = 0  # next physical slot to write
        self._n = 0
        self.latest: Frame | None = None
        self.frames_seen = 0

    # -- writing -----------------------------------------------------------
    def add(self, frame: Frame) -> None:
        slot = self._head
        self._times[slot] = frame.t
        seen = set()
        for key, value in frame_metrics(frame):
            col = self._values.get(key)
            if value is None:
                if col is None:
                    continue  # a metric this source has never had costs nothing
                v = NAN
            else:
                v = float(value)
            if col is None:
                col = self._values[key] = array("d", [NAN]) * self.capacity
            col[slot] = v
            seen.add(key)
        for key, col in self._values.items():
            if key not in seen:
                col[slot] = NAN
        self._head = (slot + 1) % self.capacity
        self._n = min(self._n + 1, self.capacity)
        self.latest = frame
        self.frames_seen += 1

    # -- reading -----------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    def keys(self) -> list[str]:
        return list(self._values)

    def _phys(self, i: int) -> int:
        return (self._head - self._n + i) % self.capacity

    def _slice(self, arr: array, start: int) -> list[float]:
        """Logical items start..n-1 of a ring array, in order (one or two slices)."""
        a = self._phys(start)
        count = self._n - start
        if count <= 0:
            return []
        end = a + count
        if end <= self.capacity:
            return arr[a:end].tolist()
        return arr[a:].tolist() + arr[: end - self.capacity].tolist()

    def _first_index_at_or_after(self, t0: float) -> int:
        lo, hi = 0, self._n
        times = self._times
        while lo < hi:
            mid = (lo + hi) // 2
            if times[self._phys(mid)] < t0:
                lo = mid + 1
            else:
                hi = mid
        return lo

    @property
    def t_first(self) -> float | None:
        return self._times[self._phys(0)] if self._n else None

    @property
    def t_last(self) -> float | None:
        return self._times[self._phys(self._n - 1)] if self._n else None

    def span(self) -> float:
        return (self.t_last - self.t_first) if self._n > 1 else 0.0

    def times(self, seconds: float | None = None) -> list[float]:
        return self._slice(self._times, self._start_index(seconds))

    def _start_index(self, seconds: float | None) -> int:
        if seconds is None or not self._n:
            return 0
        return self._first_index_at_or_after(self.t_last - seconds)

    def window(self, key: str, seconds: float | None = None) -> list[float | None]:
        """Values of ``key`` over the last ``seconds`` (all held values if None)."""
        col = self._values.get(key)
        if col is None:
            return []
        return [None if v != v else v for v in self._slice(col, self._start_index(seconds))]

    def window_pairs(self, key: str, seconds: float | None = None) -> list[tuple[float, float]]:
        """(t, value) pairs over the window, missing values left out."""
        col = self._values.get(key)
        if col is None:
            return []
        start = self._start_index(seconds)
        return [(t, v) for t, v in zip(self._slice(self._times, start), self._slice(col, start)) if v == v]

    def last(self, key: str, n: int) -> list[float | None]:
        """The last ``n`` values of ``key`` (fewer if not held), oldest first."""
        col = self._values.get(key)
        if col is None:
            return []
        n = min(n, self._n)
        return [None if v != v else v for v in self._slice(col, self._n - n)]

    def latest_value(self, key: str) -> float | None:
        col = self._values.get(key)
        if col is None or not self._n:
            return None
        v = col[self._phys(self._n - 1)]
        return None if v != v else v


def present(values: list[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def linear_fit(pairs: list[tuple[float, float]]) -> tuple[float, float, float] | None:
    """Least-squares slope, intercept (at the first t) and R² of (t, v) pairs; None if degenerate."""
    n = len(pairs)
    if n < 3:
        return None
    t0 = pairs[0][0]
    sx = sy = sxx = sxy = syy = 0.0
    for t, v in pairs:
        x = t - t0
        sx += x
        sy += v
        sxx += x * x
        sxy += x * v
        syy += v * v
    dx = n * sxx - sx * sx
    if dx <= 0:
        return None
    slope = (n * sxy - sx * sy) / dx
    intercept = (sy - slope * sx) / n
    dy = n * syy - sy * sy
    r2 = 1.0 if dy <= 0 else (n * sxy - sx * sy) ** 2 / (dx * dy)
    return slope, intercept, r2
