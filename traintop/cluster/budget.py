"""What one whole read of Prometheus may cost: one report of `analyze --prometheus`, or one
refresh of `traintop cluster`, across all of its queries together.

A per-answer cap alone lets a hostile server send just under it to every query of a read
(fourteen 63 MiB answers: 5 GB of memory and minutes). A read is charged for the bytes of
every answer as they arrive (before any is decoded), and for the series and points each
holds, counted in the raw bytes before decoding (a point kept on the grid costs several
times its JSON in Python objects), and ends in one line when any is spent.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from traintop.errors import TraintopError

MiB = 1 << 20
# analyze: 1 024 GPUs over 2 h read 194 MB in 14 queries (docs/CLUSTER.md); the dashboard's
# first read of its 5-minute window 7.8 MB, each refresh after it 2 MB.
REPORT_BYTES = 256 * MiB
REPORT_SERIES = 250_000
REFRESH_BYTES = 64 * MiB
REFRESH_SERIES = 100_000
# points (a value at an instant): 1 024 GPUs and their ranks over 2 h at 720 points are about
# 7 million; the dashboard's 5-minute window at 61 points about 0.6 million
REPORT_POINTS = 16_000_000
REFRESH_POINTS = 4_000_000


class BudgetSpent(TraintopError):
    pass


@dataclass
class ReadBudget:
    max_bytes: int
    max_series: int
    what: str = "this read"  # "one report", "one refresh"
    max_points: int | None = None
    bytes: int = 0
    series: int = 0
    points: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False)

    def cancel(self) -> None:
        """One query of the read failed: the others end at their next read or chunk."""
        self.cancelled.set()

    def take_bytes(self, n: int, source: str) -> None:
        with self._lock:
            self.bytes += n
            spent = self.bytes > self.max_bytes
        if spent:
            raise BudgetSpent(f"Prometheus at {source} sent more than {self.max_bytes // MiB} MiB for {self.what} "
                              "(all its queries together); narrow --since or give --job")

    def room_for_series(self) -> int:
        with self._lock:
            return self.max_series - self.series

    def take_series(self, n: int, source: str) -> None:
        with self._lock:
            self.series += n
            spent = self.series > self.max_series
        if spent:
            raise BudgetSpent(f"Prometheus at {source} answered with more than {self.max_series} series for "
                              f"{self.what} (all its queries together); narrow the query (--job)")

    def take_points(self, n: int, source: str) -> None:
        if self.max_points is None:
            return
        with self._lock:
            self.points += n
            spent = self.points > self.max_points
        if spent:
            raise BudgetSpent(f"Prometheus at {source} answered with more than {self.max_points:,} points for "
                              f"{self.what} (all its queries together); narrow --since, give a coarser --step "
                              "or --job".replace(",", " "))
