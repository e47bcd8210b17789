"""Small statistics the core needs, without the statistics module (its import, with
fractions, decimal and random, costs a recorder about 1 MiB of RSS)."""

from __future__ import annotations

from typing import Iterable


def median(values: Iterable[float]) -> float:
    """The median of a non-empty collection, as statistics.median computes it."""
    data = sorted(values)
    n = len(data)
    if not n:
        raise ValueError("median of no values")
    mid = n // 2
    return data[mid] if n % 2 else (data[mid - 1] + data[mid]) / 2
