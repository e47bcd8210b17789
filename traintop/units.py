"""Human-readable numbers, shared by rules' evidence, reports and widgets."""

from __future__ import annotations

import time

GiB = 1024**3
MiB = 1024**2


def fmt_bytes(n: float | None, unit: str | None = None) -> str:
    if n is None:
        return "–"
    if unit == "GiB" or (unit is None and abs(n) >= GiB):
        return f"{n / GiB:.1f} GiB"
    if unit == "MiB" or (unit is None and abs(n) >= MiB):
        return f"{n / MiB:.0f} MiB"
    if abs(n) >= 1024:
        return f"{n / 1024:.0f} KiB"
    return f"{n:.0f} B"


def fmt_rate(n: float | None) -> str:
    if n is None:
        return "–"
    return fmt_bytes(n) + "/s"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    h, rem = divmod(s, 3600)
    return f"{h} h {rem // 60:02d} min"


def fmt_clock(t: float) -> str:
    """The local clock time of ``t``: a finding's start reads the same in every report and view."""
    return time.strftime("%H:%M:%S", time.localtime(t))


def fmt_range(lo: float, hi: float, unit: str = "s") -> str:
    if abs(hi - lo) < 0.05:
        return f"{lo:.1f} {unit}"
    return f"{lo:.1f}–{hi:.1f} {unit}"
