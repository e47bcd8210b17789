"""The rules over a long imported log, judged in parts at once, one process a part.

A log of many hours is cut into consecutive parts; each worker (forked: it shares the log
already read) plays its part from ``WARM_S`` before it, so every window a rule reads
(five minutes at most) holds what it would have held in one long run, and keeps the
findings that start in its part. It plays on past its part's end until those have ended
(or the log does). A finding that goes on across a cut is the earlier part's; the later
part's copy of it is dropped. The result is what one run gives (a test compares them on a
day of a real H200 log); it is used only where a log is long enough to gain from it.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

from traintop.findings import Finding
from traintop.watch.monitor import Monitor
from traintop.rules import Thresholds, default_engine

WARM_S = 900.0  # played before a part: the longest rule window (300 s) and its hysteresis, with room
PART_MIN_S = 2 * 3600.0  # data-seconds a worker gets at least: below, the warm-up costs more than it saves
_JOB: tuple | None = None  # (source, config, the findings a part keeps at most) for the forked workers


def workers_for(span_s: float) -> int:
    return max(1, min(os.cpu_count() or 1, 8, int(span_s // PART_MIN_S)))


def judge_in_parts(source, config: Thresholds | None, first: float, last: float,
                   max_findings: int) -> tuple[list[Finding], int] | None:
    """Every finding of the log and how many were let go (over ``max_findings`` in a part), or
    None where it is not worth it here (short, one core, no fork)."""
    global _JOB
    n = workers_for(last - first)
    if n < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return None
    cuts = [first + k * (last - first) / n for k in range(n)] + [last + 1.0]
    _JOB = (source, config, max_findings)
    try:
        with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork")) as pool:
            parts = list(pool.map(_judge_part, cuts[:-1], cuts[1:]))
    except (OSError, RuntimeError):  # no processes here (a sandbox): one run does it
        return None
    finally:
        _JOB = None
    return stitch([p for p, _ in parts], cuts), sum(d for _, d in parts)


def _judge_part(start: float, end: float) -> tuple[list[Finding], int]:
    assert _JOB is not None
    source, config, max_findings = _JOB
    monitor = Monitor(source.info, engine=default_engine(config) if config else None)
    engine = monitor.engine
    engine.max_history = max_findings
    last = None
    for f in source.frames(start - WARM_S, None):
        if f.t >= end and not any(start <= a.start < end for a in engine.active):
            break  # past the part, and every finding it raised has ended
        monitor.ingest(f)
        last = f.t
    else:
        if last is not None:
            engine.close_all(last)
    return [a for a in engine.alerts if start <= a.start < end], engine.dropped


def stitch(parts: list[list[Finding]], cuts: list[float]) -> list[Finding]:
    """The parts' findings as one run's: a later part's finding that the earlier part's goes on
    over (same rule and subject) is that one, seen again after the cut."""
    out: list[Finding] = []
    for k, part in enumerate(parts):
        if k:
            across = [g for g in parts[k - 1] if g.end is None or g.end >= cuts[k]]
            part = [f for f in part if not any(g.rule == f.rule and g.subject == f.subject
                                               and (g.end is None or g.end >= f.start) for g in across)]
        out.extend(part)
    return [dataclasses.replace(f, id=i) for i, f in enumerate(sorted(out, key=lambda f: (f.start, f.rule)), 1)]
