"""Bounded history of every metric: ring buffers on one time axis.

All series share one time axis (one value per key per frame), so a time window is
found once and read from every series. Missing values are stored as NaN and come
back as ``None``. Keys are the series of ``traintop.metrics``: reading any other name
raises ``UnknownSeries``; a known series this source has not produced (yet) reads empty.
Memory is fixed by ``capacity`` however long traintop runs; what is older lives in the
recording, not in memory. (A downsampled day-long history per series
was dropped: nothing read it, and with 8 GPUs it cost hundreds of MiB after a day.)
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Sequence
from itertools import chain
from typing import Any

from traintop.metrics import check_key, frame_groups, rank_series_keys
from traintop.samples import Frame, RankSample

NAN = float("nan")
# Ranks whose history is kept live: a node runs a few (one a GPU); the ranks are the probes' word,
# and one that names a new rank in every message must not add a column set (25 series) each time.
MAX_RANKS = 128


def _with_nan(col: Sequence) -> tuple[int | None, Sequence]:
    """(the first sample with a value, the column with NaN for None); (None, col) where none has one."""
    if None not in col:
        return 0, col
    first = next((j for j, v in enumerate(col) if v is not None), None)
    return (None, col) if first is None else (first, [NAN if v is None else v for v in col])


class Store:
    """Fixed-capacity history of every series, on one shared time axis."""

    def __init__(self, capacity: int = 7200, max_ranks: int = MAX_RANKS) -> None:
        if capacity < 2:
            raise ValueError("capacity must be at least 2")
        self.capacity = capacity
        self.max_ranks = max_ranks
        self._rank_seen: dict[str, int] = {}  # a rank's subject -> the last sample that had it
        self._times = array("d", bytes(8 * capacity))
        self._values: dict[str, array] = {}
        self._head = 0  # next physical slot to write
        self._n = 0
        self.latest: Frame | None = None
        self.frames_seen = 0
        self._starts: dict[float, int] = {}  # window length -> its first index, until the next sample
        self._memo: dict = {}  # what readers derived from the samples held (Store.memo), until they change

    # -- writing -----------------------------------------------------------
    def add(self, frame: Frame) -> None:
        self._starts.clear()
        self._memo.clear()
        slot = self._head
        self._times[slot] = frame.t
        seen = set()
        values = self._values
        for keys, vals, derived, sample in frame_groups(frame):
            if isinstance(sample, RankSample) and not self._admit_rank(keys[0].partition(".")[0]):
                continue
            for key, value in chain(zip(keys, vals), ((k, fn(sample)) for k, fn in derived)):
                col = values.get(key)
                if value is None:
                    if col is None:
                        continue  # a metric this source has never had costs nothing
                    v = NAN
                else:
                    v = float(value)
                if col is None:
                    col = values[key] = array("d", [NAN]) * self.capacity
                col[slot] = v
                seen.add(key)
        for key, col in self._values.items():
            if key not in seen:
                col[slot] = NAN
        self._head = (slot + 1) % self.capacity
        self._n = min(self._n + 1, self.capacity)
        self.latest = frame
        self.frames_seen += 1

    def _admit_rank(self, subject: str) -> bool:
        """Whether this sample's ``subject`` (rank3) has its series: a new rank past ``max_ranks``
        takes the place of the one heard of longest ago, never of one in this sample."""
        seen = self._rank_seen
        if subject not in seen and len(seen) >= self.max_ranks:
            old = min((s for s, n in seen.items() if n < self.frames_seen), key=seen.__getitem__, default=None)
            if old is None:
                return False
            del seen[old]
            for key in rank_series_keys(old):
                self._values.pop(key, None)
        seen[subject] = self.frames_seen
        return True

    def extend(self, frames: list[Frame]) -> None:
        """``add`` each of ``frames`` in turn, a series at a time (a replay's seek loads 240
        frames of 8 GPUs at once: several times faster than frame by frame)."""
        m = len(frames)
        if not m:
            return
        self._starts.clear()
        self._memo.clear()
        if m > self.capacity:
            for f in frames:
                self.add(f)
            return
        # Group by group (a GPU, the host, ...) across frames, transposed in C: one column per
        # series with its first non-missing sample (new series are created in the order the
        # frame-by-frame path would create them).
        groups: dict[tuple, tuple[list, list, tuple, list]] = {}
        for i, frame in enumerate(frames):
            for keys, vals, derived, sample in frame_groups(frame):
                g = groups.get(keys)
                if g is None:
                    g = groups[keys] = ([], [], derived, [])
                g[0].append(i)
                g[1].append(vals)
                g[3].append(sample)
        values: dict[str, Sequence] = {}
        new: list[tuple[int, int, str]] = []
        order = 0
        for keys, (idx, rows, derived, samples) in groups.items():
            full = len(idx) == m
            cols = list(zip(*rows)) + [[fn(x) for x in samples] for _, fn in derived]
            for key, col in zip(keys + tuple(k for k, _ in derived), cols):
                order += 1
                first, col = _with_nan(col)
                if first is None:
                    continue
                if not full:
                    spread = [NAN] * m
                    for j, v in zip(idx, col):
                        spread[j] = v
                    col = spread
                values[key] = col
                if key not in self._values:
                    new.append((idx[first], order, key))
        self._write([f.t for f in frames], values, [key for _, _, key in sorted(new)], frames[-1])

    def extend_series(self, times: list[float], columns: list[tuple[str, list]], latest: Frame) -> None:
        """What ``extend`` does with frames, from their series already taken apart (a replay's
        seek decodes a chunk straight into them): ``columns`` are (key, a value or None a
        sample) in the order the frames would give them; ``latest`` is the last sample."""
        m = len(times)
        if not m:
            return
        if m > self.capacity:  # in ring-sized pieces, as frame by frame: every sample counted, every series made
            for a in range(0, m, self.capacity):
                self.extend_series(times[a:a + self.capacity],
                                   [(k, col[a:a + self.capacity]) for k, col in columns], latest)
            return
        self._starts.clear()
        self._memo.clear()
        values: dict[str, Sequence] = {}
        new: list[tuple[int, int, str]] = []
        for order, (key, col) in enumerate(columns):
            first, col = _with_nan(col)
            if first is None:
                continue
            values[key] = col
            if key not in self._values:
                new.append((first, order, key))
        self._write(times, values, [key for _, _, key in sorted(new)], latest)

    def _write(self, times: list[float], values: dict[str, Sequence], new_keys: list[str], latest: Frame) -> None:
        """Append ``times`` and a column of each of ``values`` (NaN for missing); every other series
        gets NaN; ``new_keys`` are created first, in their order."""
        m = len(times)
        for key in new_keys:
            self._values[key] = array("d", [NAN]) * self.capacity
        slot = self._head
        first = min(m, self.capacity - slot)  # slots slot.. and then 0.. (the ring wraps)
        nan_run = array("d", [NAN]) * m

        def put(arr: array, run: array) -> None:
            arr[slot:slot + first] = run[:first]
            if first < m:
                arr[:m - first] = run[first:]

        put(self._times, array("d", times))
        for key, col in values.items():
            put(self._values[key], array("d", col))
        for key, arr in self._values.items():
            if key not in values:
                put(arr, nan_run)
        self._head = (slot + m) % self.capacity
        self._n = min(self._n + m, self.capacity)
        self.latest = latest
        self.frames_seen += m

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
        return self._times[self._phys(self._n - 1)] - self._times[self._phys(0)] if self._n > 1 else 0.0

    def times(self, seconds: float | None = None) -> list[float]:
        return self._slice(self._times, self._start_index(seconds))

    def _start_index(self, seconds: float | None) -> int:
        if seconds is None or not self._n:
            return 0
        # The rules ask for the same few windows about ninety times an evaluation: one
        # search each until the next sample (the binary search was a fifth of their cost).
        i = self._starts.get(seconds)
        if i is None:
            t_last = self._times[self._phys(self._n - 1)]
            i = self._starts[seconds] = self._first_index_at_or_after(t_last - seconds)
        return i

    def memo(self, key, compute):
        """``compute()``, kept until the store next changes: what a reader derives from the samples
        (a panel's series, a rank's time ledger) is worked out once a sample, however often it is read."""
        try:
            return self._memo[key]
        except KeyError:
            got = self._memo[key] = compute()
            return got

    def _column(self, key: str) -> array | None:
        col = self._values.get(key)
        if col is None:
            check_key(key)  # a misspelt name must fail, not read as "no data"
        return col

    # A window with no missing value (nearly all of them) is converted in C: the sum of a
    # window is NaN when any value is, and then (or for inf - inf) each value is looked at.
    def window(self, key: str, seconds: float | None = None) -> list[float | None]:
        """Values of ``key`` over the last ``seconds`` (all held values if None)."""
        col = self._column(key)
        if col is None:
            return []
        return _nan_as_none(self._slice(col, self._start_index(seconds)))

    def present(self, key: str, seconds: float | None = None) -> list[float]:
        """The values of ``key`` held over the last ``seconds``, missing ones left out."""
        col = self._column(key)
        if col is None:
            return []
        values = self._slice(col, self._start_index(seconds))
        return values if _all_present(values) else [v for v in values if v == v]

    def window_pairs(self, key: str, seconds: float | None = None) -> list[tuple[float, float]]:
        """(t, value) pairs over the window, missing values left out."""
        col = self._column(key)
        if col is None:
            return []
        start = self._start_index(seconds)
        values = self._slice(col, start)
        if _all_present(values):
            return list(zip(self._slice(self._times, start), values))
        return [(t, v) for t, v in zip(self._slice(self._times, start), values) if v == v]

    def first_time(self, keys: list[str], seconds: float | None = None) -> float | None:
        """When any of ``keys`` first has a value over the last ``seconds`` (None: none has one)."""
        cols = [col for key in keys if (col := self._column(key)) is not None]
        times = self._times
        for i in range(self._start_index(seconds) if cols else self._n, self._n):
            p = self._phys(i)
            for col in cols:
                if col[p] == col[p]:  # NaN is missing
                    return times[p]
        return None

    def last(self, key: str, n: int) -> list[float | None]:
        """The last ``n`` values of ``key`` (fewer if not held), oldest first."""
        col = self._column(key)
        if col is None:
            return []
        n = min(n, self._n)
        return _nan_as_none(self._slice(col, self._n - n))

    def latest_value(self, key: str) -> float | None:
        col = self._column(key)
        if col is None or not self._n:
            return None
        v = col[self._phys(self._n - 1)]
        return None if v != v else v


def _all_present(values: list[float]) -> bool:
    total = sum(values)
    return total == total


def _nan_as_none(values: list[Any]) -> list[float | None]:
    """``values`` (floats, NaN where missing: a fresh slice) with None for NaN; the list itself
    when nothing is missing (no copy: nobody else holds it as a list of floats only)."""
    if _all_present(values):
        return values
    return [None if v != v else v for v in values]


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def linear_fit(pairs: list[tuple[float, float]]) -> tuple[float, float, float] | None:
    """Least-squares slope, intercept (at the first t) and R² of (t, v) pairs; None if degenerate."""
    n = len(pairs)
    if n < 3:
        return None
    t0 = pairs[0][0]
    xs = [t - t0 for t, _ in pairs]
    ys = [v for _, v in pairs]
    sx, sy = sum(xs), sum(ys)
    sxx, sxy, syy = sum(map(operator.mul, xs, xs)), sum(map(operator.mul, xs, ys)), sum(map(operator.mul, ys, ys))
    dx = n * sxx - sx * sx
    if dx <= 0:
        return None
    slope = (n * sxy - sx * sy) / dx
    intercept = (sy - slope * sx) / n
    dy = n * syy - sy * sy
    r2 = 1.0 if dy <= 0 else (n * sxy - sx * sy) ** 2 / (dx * dy)
    return slope, intercept, r2
