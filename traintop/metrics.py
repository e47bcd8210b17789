"""The one vocabulary of series names: the sample dataclasses' numeric fields, plus a few derived series.

A series key is ``<group>.<name>``: ``gpu0.power_w``, ``host.cpu_percent``, ``proc.rss``,
``rank1.input_wait``. The names are the fields of ``GpuSample``, ``HostSample``,
``ProcessSample`` and ``RankSample`` as they are (no renaming anywhere: the store, the codec,
``analyze``, the rules and the widgets' view-models all speak these), and the ``DERIVED``
series computed from a frame. ``check_key`` raises ``UnknownSeries`` for any other name, so a
misspelt name fails loudly instead of silently switching a rule off.
"""

from __future__ import annotations

import re
from dataclasses import fields
from functools import lru_cache
from operator import attrgetter
from typing import Callable, Iterator

from traintop.samples import LEDGER_BUCKETS, Frame, GpuSample, HostSample, ProcessSample, RankSample

# What names a sample rather than measuring it: never a series.
IDENTITY = frozenset({"index", "parent", "pid", "rank", "local_rank", "world_size", "device", "alive", "cuda"})


def _numeric_fields(cls) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls)
                 if f.name not in IDENTITY and str(f.type).replace(" ", "") in ("float|None", "int|None"))


# Derived series: name -> value from the sample (None when not known).
DERIVED: dict[str, dict[str, Callable]] = {
    "gpu": {"nprocs": lambda g: len(g.processes)},
    "host": {},
    "proc": {
        "alive": lambda p: 1.0 if p.alive else 0.0,
        "workers": lambda p: len(p.loader_workers),
    },
    "rank": {},
}

FIELDS: dict[str, tuple[str, ...]] = {
    "gpu": _numeric_fields(GpuSample),
    "host": _numeric_fields(HostSample),
    "proc": _numeric_fields(ProcessSample),
    "rank": _numeric_fields(RankSample),
}

VOCABULARY: dict[str, frozenset[str]] = {g: frozenset(FIELDS[g]) | frozenset(DERIVED[g]) for g in FIELDS}

_KEY = re.compile(r"(gpu\d+|host|proc|rank\d+)\.([a-z_0-9]+)\Z")


class UnknownSeries(KeyError):
    """A series name outside the vocabulary: a programming error, never data."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown series"


def group_of(key: str) -> str:
    return key.rstrip("0123456789")


@lru_cache(maxsize=4096)
def check_key(key: str) -> str:
    """``key`` if it names a series of the vocabulary; raises UnknownSeries otherwise."""
    m = _KEY.match(key)
    if not m or m.group(2) not in VOCABULARY[group_of(m.group(1))]:
        raise UnknownSeries(f"unknown series {key!r}: not a field of the samples nor a derived series "
                            "(traintop/metrics.py)")
    return key


def checked_name(group: str, name: str) -> str:
    """``name`` if it is a series of ``group`` (gpu, host, proc, rank); raises UnknownSeries otherwise."""
    if name not in VOCABULARY[group]:
        raise UnknownSeries(f"unknown {group} series {name!r} (traintop/metrics.py)")
    return name


@lru_cache(maxsize=4096)  # the rules ask for some sixty keys an evaluation, the same ones every time
def gpu_key(index: int, name: str) -> str:
    return f"gpu{index}.{checked_name('gpu', name)}"


def host_key(name: str) -> str:
    return f"host.{checked_name('host', name)}"


def proc_key(name: str) -> str:
    return f"proc.{checked_name('proc', name)}"


def rank_id(rank: RankSample, position: int) -> str:
    """The subject and series prefix of a probed rank: its rank number, else its place in the frame."""
    return rank_subject(rank.rank, position)


def rank_subject(number: int | None, position: int) -> str:
    return f"rank{number if number is not None else position}"


@lru_cache(maxsize=4096)
def rank_key(rank_subject: str, name: str) -> str:
    return f"{rank_subject}.{checked_name('rank', name)}"


def gpu_subject(index: int) -> str:
    return f"gpu{index}"


def gpu_index(subject: str) -> int | None:
    """The GPU a finding's subject names ("gpu3" -> 3); None for any other subject."""
    return int(subject[3:]) if subject[:3] == "gpu" and subject[3:].isdigit() else None


def _group(prefix: str, sample, names: tuple[str, ...], derived: dict) -> Iterator[tuple[str, float | None]]:
    for name in names:
        yield prefix + name, getattr(sample, name)
    for name, fn in derived.items():
        yield prefix + name, fn(sample)


@lru_cache(maxsize=1024)
def _keys(prefix: str, group: str) -> tuple[tuple[str, ...], tuple[tuple[str, Callable], ...]]:
    return (tuple(prefix + name for name in FIELDS[group]),
            tuple((prefix + name, fn) for name, fn in DERIVED[group].items()))


def rank_series_keys(subject: str) -> tuple[str, ...]:
    """Every series key of one rank (``rank3`` -> rank3.step_time, ...)."""
    keys, derived = _keys(subject + ".", "rank")
    return keys + tuple(k for k, _ in derived)


_GETTERS = {g: (lambda names: attrgetter(*names) if len(names) > 1 else (lambda s: (getattr(s, names[0]),)))(names)
            for g, names in FIELDS.items()}


def frame_groups(frame: Frame) -> Iterator[tuple[tuple[str, ...], tuple, tuple[tuple[str, Callable], ...], object]]:
    """``frame_metrics`` a group at a time: (keys, their values, (key, fn) of the derived series,
    the sample), for bulk loading (one attribute fetch per group, not per series)."""
    for g in frame.gpus:
        keys, derived = _keys(f"gpu{g.index}.", "gpu")
        yield keys, _GETTERS["gpu"](g), derived, g
    if frame.host is not None:
        keys, derived = _keys("host.", "host")
        yield keys, _GETTERS["host"](frame.host), derived, frame.host
    if frame.process is not None:
        keys, derived = _keys("proc.", "proc")
        yield keys, _GETTERS["proc"](frame.process), derived, frame.process
    for k, r in enumerate(frame.ranks):
        keys, derived = _keys(rank_id(r, k) + ".", "rank")
        yield keys, _GETTERS["rank"](r), derived, r


def frame_metrics(frame: Frame) -> Iterator[tuple[str, float | None]]:
    """Flatten a frame into (series key, value) pairs: every series of the vocabulary it has."""
    for g in frame.gpus:
        yield from _group(f"gpu{g.index}.", g, FIELDS["gpu"], DERIVED["gpu"])
    if frame.host is not None:
        yield from _group("host.", frame.host, FIELDS["host"], DERIVED["host"])
    if frame.process is not None:
        yield from _group("proc.", frame.process, FIELDS["proc"], DERIVED["proc"])
    for k, r in enumerate(frame.ranks):
        yield from _group(rank_id(r, k) + ".", r, FIELDS["rank"], DERIVED["rank"])


def step_seconds_per_step(store, subject: str, span: float) -> float | None:
    """Seconds per optimizer step over the last ``span`` spent stepping or waiting for the step's input
    (the ledger's train and input buckets): an iteration as nanoGPT times it for its MFU, without the
    pauses between steps (evaluation, checkpoints, compiles: the ledger shows what they cost). None: no
    ledger, or no step in it. A job that syncs with the GPU every N steps has N-1 short gaps and a long
    one: the mean over the span holds."""
    return step_period(store.window_pairs(rank_key(subject, "steps"), span),
                       store.window_pairs(rank_key(subject, "time_train"), span),
                       store.window_pairs(rank_key(subject, "time_input"), span))


def step_period(steps: list, *shares: list) -> float | None:
    """``step_seconds_per_step`` of (time, cumulative steps) pairs and the (time, share) pairs of the
    buckets that count (each sample's share covers the interval since the sample before it)."""
    if len(steps) < 2 or not any(len(s) >= 2 for s in shares):
        return None
    (t0, s0), (t1, s1) = steps[0], steps[-1]
    made = s1 - s0
    if made <= 0:
        return None
    seconds = sum(v * (t - tp) for pairs in shares for (tp, _), (t, v) in zip(pairs, pairs[1:]) if t0 < t <= t1)
    return seconds / made if seconds > 0 else None


def rank_gpu(frame, pid: int) -> int | None:
    """The GPU a process computes on, as NVML's process lists say (None: on none seen)."""
    for g in frame.gpus:
        for gp in g.processes:
            if gp.pid == pid:
                return g.index
    return None


def ledger_shares(store, subject: str, span: float) -> dict[str, float]:
    """Each ledger bucket's share of the wall time over the last ``span`` seconds (empty: no ledger)."""
    sums: dict[str, float] = {}
    for b in LEDGER_BUCKETS:
        vals = store.present(rank_key(subject, "time_" + b), span)
        if vals:
            sums[b] = sum(vals)
    total = sum(sums.values())
    return {b: v / total for b, v in sums.items()} if total > 0 else {}
