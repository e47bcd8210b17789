"""Every number read from Prometheus checked against what it can plausibly be (plausible.py).

A Prometheus answer is data from many hosts, any of which (or the server itself) may lie. A
value outside its range is read as unknown, as in recordings: no "-inf %" utilization, no
309-digit XID code, no 100 000 % input wait, no "Job stalled" from a step count of 1e300.
A label that names something impossible (GPU 99999, a 120-digit rank, rank 5 of a world
of 4) drops its series. Both are counted, and the report says so in one note each.
"""

from __future__ import annotations

from traintop import plausible as P
from traintop.text import one_line

_PCT_RATIO = (0.0, 1.0)
BOUNDS = {
    "gpu": {
        "util": _PCT_RATIO, "clock_ratio": (0.0, 2.0), "power": P.GPU["power_w"], "power_limit": P.GPU["power_limit_w"],
        "mem_used": P.GPU["mem_used"], "mem_total": P.GPU["mem_total"], "temp": P.GPU["temp_c"],
        "reasons": P.GPU["reasons"], "xid_total": (0, P.MAX_COUNT), "last_xid": P.GPU["xid"],
        "ecc_uncorrected": P.GPU["ecc_uncorrected"],
    },
    "rank": {"step": P.RANK["step_time"], "steps": P.RANK["steps"], "wait": P.RANK["input_wait"]},
    "host": {"loader_cpu": (0.0, 1e4),  # share of one core, mean over the loader workers
             "sample_time": (P.T_MIN, P.T_MAX)},  # timestamp() of a host's samples: unix seconds, 1970-2100
}
MAX_RANK = P.RANK["world_size"][1]


def _digits(text: str, most: int) -> int | None:
    return int(text) if text.isascii() and text.isdigit() and len(text) <= most else None


class Checked:
    """Counts what one read dropped; ``notes()`` says it in one line each."""

    def __init__(self) -> None:
        self.values_dropped: dict[str, int] = {}
        self.series_dropped: dict[str, str] = {}  # why -> an example
        self.series_count = 0

    def values(self, values: dict, kind: str, attr: str) -> dict:
        """``values`` less the points outside ``attr``'s range (the same dict when all are in:
        two C-level passes, no Python work per point)."""
        if not values:
            return values
        lo, hi = BOUNDS[kind][attr]
        vs = values.values()
        if lo <= min(vs) and max(vs) <= hi:
            return values
        out = {t: v for t, v in values.items() if lo <= v <= hi}
        self.values_dropped[attr] = self.values_dropped.get(attr, 0) + len(values) - len(out)
        return out

    def sample_times(self, values: dict) -> dict:
        """``timestamp()`` on a grid: each instant's sample time, less those outside 1970-2100 or
        newer than the instant they answer (no sample is)."""
        values = self.values(values, "host", "sample_time")
        if all(ts <= t for t, ts in values.items()):
            return values
        out = {t: ts for t, ts in values.items() if ts <= t}
        self.values_dropped["sample_time"] = self.values_dropped.get("sample_time", 0) + len(values) - len(out)
        return out

    def value(self, v: float | None, kind: str, attr: str) -> float | None:
        if v is None:
            return None
        lo, hi = BOUNDS[kind][attr]
        if lo <= v <= hi:
            return v
        self.values_dropped[attr] = self.values_dropped.get(attr, 0) + 1
        return None

    def drop_series(self, why: str, example: str) -> None:
        self.series_count += 1
        self.series_dropped.setdefault(why, one_line(example, 24))

    def notes(self) -> list[str]:
        out = []
        if self.values_dropped:
            n = sum(self.values_dropped.values())
            what = ", ".join(sorted(self.values_dropped))
            out.append(f"{n} value(s) read from Prometheus lay outside their plausible range and were read as "
                       f"unknown ({what})")
        if self.series_dropped:
            whys = "; ".join(f"{why} ({ex!r})" for why, ex in sorted(self.series_dropped.items()))
            out.append(f"{self.series_count} series with impossible labels were skipped: {whys}")
        return out


def gpu_index_of(s, check: Checked) -> int | None:
    text = s.get("gpu")
    if not text:
        return 0
    i = _digits(text, 2)
    if i is None or i >= P.MAX_GPUS:
        check.drop_series(f"a GPU index outside 0-{P.MAX_GPUS - 1}", text)
        return None
    return i


def rank_labels_of(s, check: Checked) -> tuple[int, int, int, str, bool] | None:
    """(rank, local rank, world size, uid, whether its host vouches for its job) of a rank's series,
    or None (counted) when they are impossible. A ``job_uid`` that is not its ``uid`` vouches for nothing."""
    rank_t, local_t, world_t, uid_t = s.get("rank"), s.get("local_rank"), s.get("world_size"), s.get("uid")
    rank = _digits(rank_t, 8) if rank_t else 0
    local = _digits(local_t, 4) if local_t else 0
    world = _digits(world_t, 8) if world_t else None
    if rank is None or rank >= MAX_RANK:
        check.drop_series("a rank outside 0-9 999 999", rank_t)
        return None
    if local is None or local >= P.MAX_RANKS:
        check.drop_series(f"a local rank outside 0-{P.MAX_RANKS - 1}", local_t)
        return None
    if world_t and (world is None or not 1 <= world <= MAX_RANK):
        check.drop_series("a world size outside 1-10 000 000", world_t)
        return None
    if world is not None and rank >= world:
        check.drop_series("a rank not below its world size", f"rank {rank} of {world}")
        return None
    if uid_t and _digits(uid_t, 10) is None:
        check.drop_series("an owner that is not a uid", uid_t)
        return None
    return rank, local, world or 1, uid_t, bool(uid_t) and s.get("job_uid") == uid_t
