"""Frames <-> compact columnar chunks (JSON of quantised integers, zlib-compressed).

Quantisation (documented in docs/RECORDING.md). Codec ``cols2+zlib`` (written now): times
to the millisecond, memory to the MiB, power to 1 W, percentages and temperatures to 1
(NVML reports whole numbers), PCIe and disk/network rates to the MB/s (kB/s for the
process's I/O), clocks to the MHz. ``cols1+zlib`` (read only) kept 0.1 W, 0.1 % and kB/s.
``decode(encode(frames))`` is what a replay sees; tests compare against that.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import MISSING, dataclass, fields
from functools import partial
from itertools import accumulate
from typing import Any, Callable

from traintop import plausible
from traintop.errors import RecordingError
from traintop.metrics import FIELDS, checked_name, gpu_key, host_key, proc_key, rank_key, rank_subject
from traintop.plausible import MAX_GPUS, MAX_RANKS, T_MAX, T_MIN
from traintop.samples import (LEDGER_BUCKETS, Frame, GpuProcess, GpuSample, HostSample, ProcessSample, ProcInfo,
                              RankSample)
from traintop.units import MiB

CODEC = "cols3+zlib"
CODECS = ("cols1+zlib", "cols2+zlib", "cols3+zlib")
_NUMERIC = {int, type(None)}  # the writer stores every number as a quantised integer
MAX_CHUNK_BYTES = 64 * 1024 * 1024  # refuse to inflate more than this (zip bombs)
# What one chunk can hold, checked before anything is built from it. The writer puts at most
# 2 x chunk_frames - 1 samples in a chunk (chunk_frames <= MAX_CHUNK_SAMPLES // 2; 600 by
# default). A chunk of 1200 samples of 8 GPUs, a 256-core host, a job of 64 processes and 8
# ranks holds about 1.3 million values and 80 000 lists: the limits leave room for 3x that.
MAX_CHUNK_SAMPLES = 10_000
MAX_CHUNK_VALUES = 4_000_000  # JSON values (counted as commas)
MAX_CHUNK_LISTS = 1_000_000  # JSON lists and objects
MAX_LIST = 4096  # entries in one sample's list: cores, processes of the job, a GPU's processes
MAX_TEXT = 65_536  # characters in one stored name or command line
WRITE_TEXT = 4096  # what the writer keeps of a command line or a name

# field -> scale: stored = round(value * scale); bytes fields are stored in MiB.
_BYTES = "mib"
GPU_FIELDS_V1 = {
    "util": 10, "util_min": 10, "util_max": 10, "mem_util": 10,
    "mem_used": _BYTES, "mem_total": _BYTES, "mem_reserved": _BYTES,
    "power_w": 10, "power_limit_w": 10, "temp_c": 10, "temp_slowdown_c": 10,
    "sm_clock": 1, "sm_clock_max": 1, "mem_clock": 1, "mem_clock_max": 1,
    "reasons": 1, "pcie_tx": 1e-3, "pcie_rx": 1e-3, "energy_j": 1,
    "pcie_gen": 1, "pcie_width": 1, "pcie_gen_max": 1, "pcie_width_max": 1,
    "sm_active": 1, "sm_occupancy": 1, "tensor_active": 1, "dram_active": 1,
    "throttle_power": 1, "throttle_thermal": 1,
    "ecc_corrected": 1, "ecc_uncorrected": 1, "remap_pending": 1, "xid": 1,
}
# Written since MIG and NVLink (schema 3 still: a reader that does not know a column skips it,
# and a file without them reads None): NVLink rates to the MB/s, a MIG row's parent GPU.
GPU_FIELDS_NEW = {"nvlink_tx": 1e-6, "nvlink_rx": 1e-6, "parent": 1}
INT_FIELDS = {"sm_clock", "sm_clock_max", "mem_clock", "mem_clock_max", "reasons", "pcie_gen", "pcie_width",
              "pcie_gen_max", "pcie_width_max",
              "ecc_corrected", "ecc_uncorrected", "remap_pending", "xid", "parent"}
HOST_FIELDS_V1 = {
    "cpu_percent": 10, "iowait": 10, "mem_used": _BYTES, "mem_total": _BYTES,
    "swap_used": _BYTES, "swap_total": _BYTES, "disk_read": 1e-3, "disk_write": 1e-3,
    "net_rx": 1e-3, "net_tx": 1e-3,
}
PROC_FIELDS_V1 = {"cpu_percent": 10, "rss": _BYTES, "threads": 1, "read_rate": 1e-3, "write_rate": 1e-3}
RANK_FIELDS_V1 = {
    "pid": 1, "rank": 1, "world_size": 1, "device": 1, "allocated": _BYTES, "reserved": _BYTES, "peak": _BYTES,
    "active": _BYTES, "inactive_split": _BYTES, "alloc_retries": 1, "ooms": 1, "steps": 1,
    "step_time": 1e5, "steps_per_s": 100, "input_wait": 1000, "age": 100,
}
GPU_FIELDS = dict(GPU_FIELDS_V1, util=1, util_min=1, util_max=1, mem_util=1, power_w=1, power_limit_w=1,
                  temp_c=1, temp_slowdown_c=1, pcie_tx=1e-6, pcie_rx=1e-6, **GPU_FIELDS_NEW)
HOST_FIELDS = dict(HOST_FIELDS_V1, cpu_percent=1, iowait=1, disk_read=1e-6, disk_write=1e-6, net_rx=1e-6, net_tx=1e-6)
PROC_FIELDS = dict(PROC_FIELDS_V1, cpu_percent=1)
RANK_FIELDS = dict(RANK_FIELDS_V1, step_time=1e4, steps_per_s=10,
                   **{"time_" + b: 1000 for b in LEDGER_BUCKETS}, matmul=1, step_flops=1e-6, backend=1,
                   skipped_steps=1)
# per codec: GPU, host, process and rank scales; per-core CPU and process-member CPU scales
SCHEMES: dict[str, tuple] = {
    "cols1+zlib": (GPU_FIELDS_V1, HOST_FIELDS_V1, PROC_FIELDS_V1, RANK_FIELDS_V1, 10, 10),
    "cols2+zlib": (GPU_FIELDS, HOST_FIELDS, PROC_FIELDS, RANK_FIELDS, 1, 1),
    "cols3+zlib": (GPU_FIELDS, HOST_FIELDS, PROC_FIELDS, RANK_FIELDS, 1, 1),
}
RANK_INT_FIELDS = {"pid", "rank", "world_size", "device", "alloc_retries", "ooms", "steps", "matmul", "backend",
                   "skipped_steps"}


def gpu_column(index: int, name: str) -> str:
    """A GPU series' column in a chunk (``g0.power_w``): the vocabulary's names (traintop.metrics)."""
    return f"g{index}.{checked_name('gpu', name)}"


def _q(v: Any, scale) -> int | None:
    if v is None:
        return None
    if scale == _BYTES:
        return int(round(v / MiB))
    return int(round(v * scale))


def _dq(v: Any, scale, as_int: bool = False):
    if v is None:
        return None
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise ValueError("bad number")
    if scale == _BYTES:
        return int(v) * MiB
    x = v / scale
    return int(round(x)) if as_int else x


_PROCESS_UTIL = ("sm_util", "mem_util", "enc_util", "dec_util")


def _process_entry(pr: GpuProcess) -> list:
    """[pid, MiB], or with its utilization [pid, MiB, sm %, memory %, encoder %, decoder %] (schema 3)."""
    utils = [getattr(pr, f) for f in _PROCESS_UTIL]
    if all(u is None for u in utils):
        return [pr.pid, _q(pr.used_bytes, _BYTES)]
    return [pr.pid, _q(pr.used_bytes, _BYTES), *(None if u is None else int(round(u)) for u in utils)]


def _util_of(v) -> float | None:
    return float(v) if v is not None and 0 <= v <= 100 else None


def _row(frame: Frame) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for g in frame.gpus:
        p = f"g{g.index}."
        for name, scale in GPU_FIELDS.items():
            row[p + name] = _q(getattr(g, name), scale)
        row[p + "procs"] = [_process_entry(pr) for pr in g.processes[:MAX_LIST]]
    h = frame.host
    if h is not None:
        for name, scale in HOST_FIELDS.items():
            row["h." + name] = _q(getattr(h, name), scale)
        row["h.cores"] = [int(round(c)) for c in h.per_core[:MAX_LIST]]
    pr = frame.process
    if pr is not None:
        row["p.pid"] = pr.pid
        row["p.alive"] = 1 if pr.alive else 0
        row["p.name"] = pr.name[:WRITE_TEXT]
        row["p.cmd"] = pr.cmdline[:WRITE_TEXT]
        for name, scale in PROC_FIELDS.items():
            row["p." + name] = _q(getattr(pr, name), scale)
        row["p.members"] = [
            [m.pid, m.name[:WRITE_TEXT], _q(m.cpu_percent, 1), _q(m.rss, _BYTES), m.threads, 1 if m.is_loader_worker else 0]
            + ([m.ppid] if m.ppid is not None else [])
            for m in pr.members[:MAX_LIST]
        ]
    for j, r in enumerate(frame.ranks[:MAX_RANKS]):
        p = f"r{j}."
        for name, scale in RANK_FIELDS.items():
            row[p + name] = _q(getattr(r, name), scale)
        row[p + "cuda"] = 1 if r.cuda else 0
    return row


def encode(frames: list[Frame]) -> bytes:
    """Encode frames (time-ordered) as one compressed columnar chunk."""
    if len(frames) > MAX_CHUNK_SAMPLES:
        raise ValueError(f"at most {MAX_CHUNK_SAMPLES} samples go in one chunk")
    rows = [_row(f) for f in frames]
    if len(rows) == 1:
        return _encode_one(rows[0], frames[0].t)
    return _encode_rows(rows, [f.t for f in frames])


def _encode_rows(rows: list[dict[str, Any]], ts: list[float]) -> bytes:
    keys: dict[str, None] = {}
    for r in rows:
        keys.update(dict.fromkeys(r))
    return _encode_columns({k: [r.get(k, None) for r in rows] for k in keys}, [int(round(t * 1000)) for t in ts])


def _encode_columns(columns: dict[str, list], times: list[int]) -> bytes:
    """A chunk from its quantised columns (each one value per sample, None where missing)
    and its times in integer milliseconds."""
    deltas = [times[0]] + [b - a for a, b in zip(times, times[1:])] if times else []
    cols: dict[str, Any] = {}
    for k, col in columns.items():
        if all(v is None for v in col):  # a field this source cannot read costs nothing
            continue
        if k.endswith(".procs"):  # a GPU's process list rarely changes: null repeats the previous row
            col = [v if j == 0 or v != col[j - 1] else None for j, v in enumerate(col)]
        elif k == "p.members":  # where members' rows repeat from sample to sample: each stored once
            table = _members_table(col)
            if table is not None:
                cols[k] = table
                continue
        if all(isinstance(v, int) for v in col):  # delta-code numeric columns that change slowly
            cols[k] = ["d", col[0]] + [b - a for a, b in zip(col, col[1:])]
        else:
            cols[k] = col
    doc = {"n": len(times), "t": deltas, "c": cols}
    return zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 6)


def _encode_one(row: dict[str, Any], t: float) -> bytes:
    """``encode`` of a single sample (what the recorder commits every second), without the
    column loop's per-key work: the same bytes."""
    cols = {}
    for k, v in row.items():
        if v is None:
            continue
        if k == "p.members":
            cols[k] = _members_table([v]) or [v]
        else:
            cols[k] = ["d", v] if isinstance(v, int) else [v]
    doc = {"n": 1, "t": [int(round(t * 1000))], "c": cols}
    return zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 6)


def _members_table(col: list) -> dict | None:
    """``cols3``: the distinct member rows once (``u``), each sample a list of their indices
    (``i``); None unless the rows repeat (at most a quarter distinct): zlib already packs a few
    repeats in the plain lists into fewer bytes than a table and its indices."""
    table: list = []
    index: dict[tuple, int] = {}
    rows: list[list[int] | None] = []
    total = 0
    for cell in col:
        if cell is None:
            rows.append(None)
            continue
        row = []
        for m in cell:
            key = tuple(m)
            k = index.get(key)
            if k is None:
                k = index[key] = len(table)
                table.append(m)
            row.append(k)
        rows.append(row)
        total += len(row)
    if 4 * len(table) > total:
        return None
    return {"u": table, "i": rows}


def _members_rows(value, n: int, j0: int, j1: int) -> list:
    """A ``cols3`` members column back as rows of member lists (samples j0..j1-1): the table
    checked whole, the rows of the window checked against it."""
    if not isinstance(value, dict) or not isinstance(value.get("u"), list):
        raise ValueError("bad members")
    table = value["u"]
    for i in range(0, len(table), MAX_LIST):
        _lists([table[i:i + MAX_LIST]], (6, 7), text_at=1)
    rows = _column(value.get("i"), n, numeric=False)[j0:j1]
    _lists(rows, None)
    size = len(table)
    out: list[list | None] = []
    for r in rows:
        if r is None:
            out.append(None)
            continue
        if not all(type(k) is int and 0 <= k < size for k in r):
            raise ValueError("bad member index")
        out.append([table[k] for k in r])
    return out


def _inflate(blob: bytes) -> bytes:
    d = zlib.decompressobj()
    out = d.decompress(blob, MAX_CHUNK_BYTES)
    if d.unconsumed_tail:
        raise RecordingError("a chunk inflates past 64 MiB; refusing it")
    return out


_HEADER = re.compile(rb'\{"n":(\d{1,12}),"t":\[')


def _checked(raw: bytes) -> int:
    """The sample count of an inflated chunk, once its size is known to be one the writer can
    produce: checked on the bytes, before a single object is built from them (64 MiB of
    ``[],`` would otherwise become 20 million lists)."""
    m = _HEADER.match(raw)
    if m is None:
        raise ValueError("bad header")
    n = int(m.group(1))
    if n > MAX_CHUNK_SAMPLES:
        raise RecordingError(f"a chunk claims {n} samples (the writer puts at most {MAX_CHUNK_SAMPLES} "
                             "in one); refusing it")
    if raw.count(b",") >= MAX_CHUNK_VALUES:
        raise RecordingError(f"a chunk holds more than {MAX_CHUNK_VALUES} values; refusing it")
    if raw.count(b"[") + raw.count(b"{") >= MAX_CHUNK_LISTS:
        raise RecordingError(f"a chunk holds more than {MAX_CHUNK_LISTS} lists; refusing it")
    return n


def _times(n, deltas) -> list[float]:
    """Sample times from the header (validated: n samples, integer millisecond deltas, every
    time within plausible.T_MIN..T_MAX)."""
    if type(n) is not int or not isinstance(deltas, list) or len(deltas) != n:
        raise ValueError("bad header")
    if not set(map(type, deltas)) <= {int}:
        raise ValueError("bad time")
    ms = list(accumulate(deltas))
    if ms and (min(ms) < T_MIN * 1000 or max(ms) >= T_MAX * 1000):
        raise ValueError("time out of range")
    return [v / 1000.0 for v in ms]


def _column(col, n: int, numeric: bool = True, end: int | None = None) -> list:
    """A stored column as n values (only the first ``end`` where given): delta-coded integer
    columns are summed back (their length checked first). Only a numeric column can be
    delta-coded: a text column may well start with the name "d"."""
    if not isinstance(col, list):
        raise ValueError("bad column")
    if numeric and col and col[0] == "d":
        if len(col) != n + 1:
            raise ValueError("bad delta")
        deltas = col[1:] if end is None else col[1:end + 1]
        if not set(map(type, deltas)) <= {int}:
            raise ValueError("bad delta")
        col = list(accumulate(deltas))
        return col if end is None else col + [None] * (n - end)  # past end: never read
    if len(col) != n:
        raise ValueError("column length")
    return col


def _key_index(key: str, prefix: str, limit: int) -> int | None:
    """The GPU or rank number of a column name (``g3.util`` -> 3); damage when out of range."""
    if not key.startswith(prefix) or "." not in key:
        return None
    digits = key[1:key.index(".")]
    if not digits.isdigit() or len(digits) > 4:
        return None
    i = int(digits)
    if i >= limit:
        raise ValueError("index out of range")
    return i


def _lists(col: list, width: tuple[int, ...] | None, text_at: int | None = None) -> list:
    """A column of lists (cores, members, a GPU's processes): each None or a list of at most
    MAX_LIST entries; with ``width``, each entry a list of one of those many scalars."""
    for cell in col:
        if cell is None:
            continue
        if type(cell) is not list or len(cell) > MAX_LIST:
            raise ValueError("bad list")
        if width is None:
            if not set(map(type, cell)) <= _NUMERIC:
                raise ValueError("bad list entry")
            continue
        for e in cell:
            if type(e) is not list or len(e) not in width:
                raise ValueError("bad list entry")
            for k, v in enumerate(e):
                if k == text_at:
                    if type(v) is not str or len(v) > MAX_TEXT:
                        raise ValueError("bad text")
                elif v is not None and type(v) is not int:
                    raise ValueError("bad number")
    return col


def _texts(col: list) -> list:
    if not all(v is None or (type(v) is str and len(v) <= MAX_TEXT) for v in col):
        raise ValueError("bad text")
    return col


_NOT_NUMERIC = {"p.name", "p.cmd", "p.members", "h.cores"}


def _parse(blob: bytes, codec: str, t_from: float | None = None,
           t_to: float | None = None) -> tuple[list[float], dict[str, list]]:
    """Inflate, check, parse and validate a chunk: times and its (quantised) columns, only
    the samples in [t_from, t_to] when given (a seek needs 240 of a chunk's 600: only those
    are validated and sliced out, the rest is never looked at past the JSON parser)."""
    import bisect

    raw = _inflate(blob)
    _checked(raw)
    doc = json.loads(raw)
    if not isinstance(doc, dict) or not isinstance(doc.get("c"), dict):
        raise ValueError("bad header")
    times = _times(doc["n"], doc["t"])
    n = len(times)
    j0 = bisect.bisect_left(times, t_from) if t_from is not None else 0
    j1 = bisect.bisect_right(times, t_to) if t_to is not None else n
    j1 = max(j0, j1)
    window = j0 > 0 or j1 < n
    columns = {}
    for k, col in doc["c"].items():
        if _key_index(k, "g", MAX_GPUS) is None and _key_index(k, "r", MAX_RANKS) is None \
                and not k.startswith(("h.", "p.")):
            continue  # a field this version does not know
        if k == "p.members" and codec == "cols3+zlib" and isinstance(col, dict):
            columns[k] = _members_rows(col, n, j0, j1)
            continue
        col = _column(col, n, numeric=k not in _NOT_NUMERIC, end=j1 if window else None)
        if k.endswith(".procs"):
            if codec != "cols1+zlib":
                col = _repeat_nulls_window(col, j0, j1)
            elif window:
                col = col[j0:j1]
            col = _lists(col, (2, 6))
        else:
            if window:
                col = col[j0:j1]
            if k == "h.cores":
                col = _lists(col, None)
            elif k == "p.members":
                col = _lists(col, (6, 7), text_at=1)  # pid, name, cpu, rss, threads, loader[, ppid]
            elif k in ("p.name", "p.cmd"):
                col = _texts(col)
            elif not set(map(type, col)) <= _NUMERIC:
                raise ValueError("bad number")
        columns[k] = col
    return times[j0:j1] if window else times, columns


def _corrupt_is_one_line(fn):
    """Any damage a hostile or broken chunk can cause becomes one RecordingError line."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kw):
        try:
            return fn(*args, **kw)
        except RecordingError:
            raise
        except (ValueError, KeyError, TypeError, IndexError, zlib.error, RecursionError, OverflowError,
                UnicodeDecodeError) as e:
            raise RecordingError(f"a data chunk is corrupt ({type(e).__name__})") from None
    return wrapper


@_corrupt_is_one_line
def decode(blob: bytes, codec: str = CODEC, t_from: float | None = None,
           t_to: float | None = None) -> list[Frame]:
    """Decode a chunk (only its samples in [t_from, t_to] when given); any damage raises
    RecordingError with one line of explanation."""
    times, columns = _parse(blob, codec, t_from, t_to)
    if not times:
        return []
    return _frames(times, columns, SCHEMES[codec])


@_corrupt_is_one_line
def merge(blobs: list[bytes], codec: str = CODEC) -> bytes:
    """One chunk of the samples of ``blobs`` (chunks in time order): the bytes ``encode``
    makes of all their frames, built from their stored columns. The recorder merges its
    one-second chunks this way instead of keeping ten minutes of frames in memory to
    encode again (which cost it 10 MiB of RSS)."""
    times: list[int] = []
    cols: dict[str, list] = {}
    for blob in blobs:
        if codec == CODEC:
            ts, columns = _own_columns(blob)
        else:
            ts, columns = _parse(blob, codec)
            ts = [int(round(t * 1000)) for t in ts]
        total = len(times)
        for k, col in columns.items():
            have = cols.get(k)
            if have is None:
                have = cols[k] = [None] * total
            have.extend(col)
        times.extend(ts)
        for have in cols.values():
            if len(have) < len(times):
                have.extend([None] * (len(times) - len(have)))
    if len(times) > MAX_CHUNK_SAMPLES:
        raise ValueError(f"at most {MAX_CHUNK_SAMPLES} samples go in one chunk")
    return _encode_columns(cols, times)


def _own_columns(blob: bytes) -> tuple[list[int], dict[str, list]]:
    """Times (ms) and columns of a chunk this process has just written (the writer's
    one-second chunks, merged): none of the checks an untrusted file needs, which made a
    merge cost more than encoding the frames again."""
    doc = json.loads(_inflate(blob))
    cols = {}
    for k, col in doc["c"].items():
        if isinstance(col, dict):  # a members table
            u = col["u"]
            col = [None if r is None else [u[i] for i in r] for r in col["i"]]
        elif col and col[0] == "d" and k not in _NOT_NUMERIC:
            col = list(accumulate(col[1:]))
        if k.endswith(".procs"):
            col = _repeat_nulls(col)
        cols[k] = col
    return list(accumulate(doc["t"])), cols


_GPU_ORDER = [f.name for f in fields(GpuSample)][1:-1]  # between index and processes


def _bounds(scale, bounds) -> tuple[float, float]:
    """A plausible range in stored (quantised) units."""
    lo, hi = bounds
    if scale == _BYTES:
        return lo / MiB, hi / MiB
    return lo * scale, hi * scale


def _in_range(col: list, scale, bounds) -> list:
    """``col`` (quantised) with the values outside ``bounds`` read as None. The common case
    (everything in range) costs a min and a max."""
    present = [v for v in col if v is not None] if None in col else col
    if not present:
        return col
    lo, hi = _bounds(scale, bounds)
    if lo <= min(present) and max(present) <= hi:
        return col
    return [v if v is not None and lo <= v <= hi else None for v in col]


def _dq_col(col: list | None, scale, as_int: bool, n: int, bounds=None) -> list:
    """Dequantise a whole column (None where missing or implausible); non-numbers are damage."""
    if col is None:
        return [None] * n
    if not set(map(type, col)) <= _NUMERIC:
        raise ValueError("bad number")
    if bounds is not None:
        col = _in_range(col, scale, bounds)
    if scale == _BYTES:
        return [None if v is None else int(v) * MiB for v in col]
    if as_int:
        if scale == 1:
            return col  # integers already (checked above)
        return [None if v is None else int(round(v / scale)) for v in col]
    return [None if v is None else v / scale for v in col]


def _dq_one(v, scale, bounds, as_int: bool = False):
    if v is None:
        return None
    lo, hi = _bounds(scale, bounds)
    if not lo <= v <= hi:
        return None
    return _dq(v, scale, as_int)


def _dequantiser(scale, bounds, as_int: bool = False):
    """``_dq_one`` for one scale and range, its bounds worked out once (a chunk holds
    hundreds of thousands of list entries)."""
    lo, hi = _bounds(scale, bounds)

    def dq(v):
        if v is None or not lo <= v <= hi:
            return None
        return _dq(v, scale, as_int)
    return dq


def _frames(times: list[float], columns: dict[str, list], scheme) -> list[Frame]:
    """Frames from columns, column by column (a day of 8 GPUs decodes several times faster
    than row by row)."""
    gpu_fields, host_fields, proc_fields, rank_fields, core_scale, member_scale = scheme
    n = len(times)
    mem_of = _dequantiser(_BYTES, plausible.GPU["mem_used"])
    gpus_by_row: list[list[GpuSample]] = [[] for _ in range(n)]
    for i in sorted({g for g in (_key_index(k, "g", MAX_GPUS) for k in columns) if g is not None}):
        p = f"g{i}."
        cols = [_dq_col(columns.get(p + name), gpu_fields[name], name in INT_FIELDS, n, plausible.GPU[name])
                if name in gpu_fields else [None] * n for name in _GPU_ORDER]
        procs_col = columns.get(p + "procs") or [None] * n
        last_cell, last_procs = None, ()
        for j, row in enumerate(zip(*cols)):
            cell = procs_col[j]
            if cell is not None and cell is last_cell:
                procs = last_procs  # a repeated list (stored once): its processes built once
            elif cell:
                procs = tuple(GpuProcess(e[0], mem_of(e[1]), *(_util_of(u) for u in e[2:6]))
                              for e in cell if plausible.number(e[0], plausible.PID) is not None)
                last_cell, last_procs = cell, procs
            else:
                procs = ()
            if not procs and all(v is None for v in row):
                continue  # this GPU was not sampled in this frame
            # row holds exactly the fields between index and processes (_GPU_ORDER)
            gpus_by_row[j].append(GpuSample(i, *row, processes=procs))  # type: ignore[misc]
    host_rows: list[HostSample | None] = [None] * n
    if any(k.startswith("h.") for k in columns):
        hcols = {name: _dq_col(columns.get("h." + name), scale, False, n, plausible.HOST[name])
                 for name, scale in host_fields.items()}
        cores = columns.get("h.cores") or [None] * n
        lo, hi = _bounds(core_scale, plausible.CORE)
        for j in range(n):
            kw = {name: c[j] for name, c in hcols.items()}
            row_cores = cores[j] or ()
            if not all(c is not None and lo <= c <= hi for c in row_cores):
                row_cores = ()  # an implausible core makes the row's per-core figures unknown
            if any(v is not None for v in kw.values()) or row_cores:
                host_rows[j] = HostSample(per_core=tuple(c / core_scale for c in row_cores), **kw)
    proc_rows: list[ProcessSample | None] = [None] * n
    pids = columns.get("p.pid")
    if pids is not None:
        pcols = {name: _dq_col(columns.get("p." + name), scale, name == "threads", n, plausible.PROCESS[name])
                 for name, scale in proc_fields.items()}
        alive, names, cmds = (columns.get(k) or [None] * n for k in ("p.alive", "p.name", "p.cmd"))
        members = columns.get("p.members") or [None] * n
        m_cpu = _dequantiser(member_scale, plausible.MEMBER["cpu_percent"])
        m_rss = _dequantiser(_BYTES, plausible.MEMBER["rss"])
        m_threads = _dequantiser(1, plausible.MEMBER["threads"], True)
        built: dict[tuple, ProcInfo | None] = {}  # one member's row repeats from sample to sample

        def member(m: list) -> ProcInfo | None:
            key = tuple(m)
            info: Any = built.get(key, False)  # False: not built yet (None: built, implausible)
            if info is False:
                info = built[key] = ProcInfo(
                    m[0], m[1], m_cpu(m[2]), m_rss(m[3]), m_threads(m[4]), bool(m[5]),
                    plausible.number(m[6], plausible.PID) if len(m) > 6 else None) \
                    if plausible.number(m[0], plausible.PID) is not None else None
            return info

        for j in range(n):
            if plausible.number(pids[j], plausible.PID) is None:
                continue
            ms = tuple(info for info in map(member, members[j] or ()) if info is not None)
            proc_rows[j] = ProcessSample(pid=pids[j], alive=bool(alive[j]), name=names[j] or "",
                                         cmdline=cmds[j] or "", members=ms,
                                         **{name: c[j] for name, c in pcols.items()})
    ranks_by_row: list[list[RankSample]] = [[] for _ in range(n)]
    for p, rcols in _rank_columns(columns, rank_fields, n):
        cuda = columns.get(p + "cuda") or [None] * n
        names = tuple(rcols)
        for j, values in enumerate(zip(*rcols.values())):
            if values[0] is None:  # no pid: this rank was not in this sample
                continue
            ranks_by_row[j].append(RankSample(cuda=bool(cuda[j]), **dict(zip(names, values))))
    return [Frame(t=times[j], gpus=tuple(gpus_by_row[j]), host=host_rows[j], process=proc_rows[j],
                  ranks=tuple(ranks_by_row[j])) for j in range(n)]


def _rank_columns(columns: dict, rank_fields: dict, n: int):
    """(column prefix, {field: its decoded, checked values}) of each probed rank in a chunk."""
    for r in sorted({g for g in (_key_index(k, "r", MAX_RANKS) for k in columns) if g is not None}):
        p = f"r{r}."
        if columns.get(p + "pid") is None:
            continue
        yield p, {name: _dq_col(columns.get(p + name), scale, name in RANK_INT_FIELDS, n, plausible.RANK[name])
                  for name, scale in rank_fields.items()}


@dataclass
class SeriesWindow:
    """A chunk's samples as the store's series (what ``Store.extend`` makes of their frames),
    with the little a monitor needs beyond them: the last sample as a Frame, when the attached
    process was first seen ended, and when a probe last reported."""

    times: list[float]
    columns: list[tuple[str, list]]  # (series key, a value or None a sample), in the frames' order
    last: Frame
    ended_at: float | None
    probe_at: float | None


@_corrupt_is_one_line
def decode_series(blob: bytes, codec: str = CODEC, t_from: float | None = None,
                  t_to: float | None = None) -> SeriesWindow | None:
    """The samples in [t_from, t_to] as series, without a Frame a sample: a seek rebuilds minutes
    of history, and building 240 frames of 8 GPUs to take them apart again cost more than
    parsing the chunk. The same values, checks and gaps as ``decode`` then ``Store.extend``
    (a test compares the two over whole recordings). Damage raises RecordingError."""
    times, columns = _parse(blob, codec, t_from, t_to)
    if not times:
        return None
    return _series(times, columns, SCHEMES[codec])


_DEFAULTS = {cls: {f.name: f.default for f in fields(cls) if f.default is not MISSING}
             for cls in (GpuSample, HostSample, ProcessSample, RankSample)}


def _series(times: list[float], columns: dict[str, list], scheme) -> SeriesWindow:
    gpu_fields, host_fields, proc_fields, rank_fields, core_scale, _ = scheme
    n = len(times)
    groups: list[tuple[int, int, list[tuple[str, list]]]] = []  # (first sample, place in a frame, its series)
    _gpu_groups(groups, columns, gpu_fields, n)
    if any(k.startswith("h.") for k in columns):
        _host_group(groups, columns, host_fields, core_scale, n)
    ended_at = _process_group(groups, times, columns, proc_fields) if columns.get("p.pid") is not None else None
    rank_present = _rank_groups(groups, columns, rank_fields, n)
    probe_at = next((times[j] for j in range(n - 1, -1, -1) if rank_present[j]), None)
    groups.sort(key=lambda g: (g[0], g[1]))
    ordered = [kv for _, _, out in groups for kv in out]
    last = _frames(times[-1:], {k: col[-1:] for k, col in columns.items()}, scheme)[0]
    return SeriesWindow(times, ordered, last, ended_at, probe_at)


def _group(groups: list, n: int, order: int, present: list[bool], values: dict[str, list], derived: dict[str, list],
           key: Callable[[str], str], names: tuple[str, ...], defaults: dict) -> None:
    """Add to ``groups`` the series of one GPU, the host, the process or one rank (``order``: its
    place in a frame), each None where it was not ``present``; nothing where it never was."""
    first = next((j for j, p in enumerate(present) if p), None)
    if first is None:
        return
    out = []
    for name in names:
        col = values.get(name)
        if col is None:
            v = defaults.get(name)
            col = [v] * n
        out.append((key(name), [v if p else None for v, p in zip(col, present)]))
    for name, col in derived.items():
        out.append((key(name), [v if p else None for v, p in zip(col, present)]))
    groups.append((first, order, out))


def _gpu_groups(groups: list, columns: dict[str, list], gpu_fields: dict, n: int) -> None:
    gpu_names = FIELDS["gpu"]
    for i in sorted({g for g in (_key_index(k, "g", MAX_GPUS) for k in columns) if g is not None}):
        p = f"g{i}."
        values = {name: _dq_col(columns.get(p + name), gpu_fields[name], name in INT_FIELDS, n, plausible.GPU[name])
                  for name in gpu_names if name in gpu_fields}
        for name in gpu_names:
            values.setdefault(name, [None] * n)  # not in this codec: None, as decode passes it
        procs_col = columns.get(p + "procs") or [None] * n
        nprocs = [sum(1 for e in cell if plausible.number(e[0], plausible.PID) is not None) if cell else 0
                  for cell in procs_col]
        cols = [values[name] for name in gpu_names]
        present = [bool(k) or any(v is not None for v in row) for k, row in zip(nprocs, zip(*cols))]
        _group(groups, n, i, present, values, {"nprocs": nprocs}, partial(gpu_key, i), gpu_names, {})


def _host_group(groups: list, columns: dict[str, list], host_fields: dict, core_scale, n: int) -> None:
    values = {name: _dq_col(columns.get("h." + name), scale, False, n, plausible.HOST[name])
              for name, scale in host_fields.items()}
    cores = columns.get("h.cores") or [None] * n
    lo, hi = _bounds(core_scale, plausible.CORE)
    cols = list(values.values())
    present = [bool(c) and all(x is not None and lo <= x <= hi for x in c) or any(v is not None for v in row)
               for c, row in zip(cores, zip(*cols))]
    _group(groups, n, MAX_GPUS, present, values, {}, host_key, FIELDS["host"], _DEFAULTS[HostSample])


def _process_group(groups: list, times: list[float], columns: dict[str, list], proc_fields: dict) -> float | None:
    """The attached process's series; when it was first seen ended (None: never)."""
    n = len(times)
    values = {name: _dq_col(columns.get("p." + name), scale, name == "threads", n, plausible.PROCESS[name])
              for name, scale in proc_fields.items()}
    present = [plausible.number(pid, plausible.PID) is not None for pid in columns["p.pid"]]
    alive = [bool(a) for a in (columns.get("p.alive") or [None] * n)]
    members = columns.get("p.members") or [None] * n
    workers = [sum(1 for m in row or () if m[5] and plausible.number(m[0], plausible.PID) is not None)
               for row in members]
    ended_at = next((t for t, p, a in zip(times, present, alive) if p and not a), None)
    _group(groups, n, MAX_GPUS + 1, present, values, {"alive": [1.0 if a else 0.0 for a in alive], "workers": workers},
           proc_key, FIELDS["proc"], _DEFAULTS[ProcessSample])
    return ended_at


def _rank_groups(groups: list, columns: dict[str, list], rank_fields: dict, n: int) -> list[int]:
    """Each rank's series, a rank being its number (or, without one, its place in the sample);
    the count of ranks in each sample."""
    rank_present = [0] * n  # ranks in each sample: a rank without a number is named by its place
    by_prefix: dict[str, tuple[int, list[bool], dict]] = {}  # rank prefix -> (its place, present, values)
    for _, rcols in _rank_columns(columns, rank_fields, n):
        first_field = next(iter(rcols.values()))
        numbers = rcols.get("rank") or [None] * n
        for j in range(n):
            if first_field[j] is None:  # no pid: this rank was not in this sample
                continue
            k = rank_present[j]
            rank_present[j] += 1
            prefix = rank_subject(numbers[j], k)
            entry = by_prefix.get(prefix)
            if entry is None:
                entry = by_prefix[prefix] = (k, [False] * n, {name: [None] * n for name in rcols})
            entry[1][j] = True
            for name, col in rcols.items():
                entry[2][name][j] = col[j]
    for prefix, (k, present, values) in by_prefix.items():
        _group(groups, n, MAX_GPUS + 2 + k, present, values, {}, partial(rank_key, prefix), FIELDS["rank"],
               _DEFAULTS[RankSample])
    return rank_present


def _repeat_nulls_window(col: list, j0: int, j1: int) -> list:
    """``_repeat_nulls(col)[j0:j1]``, looking back before ``j0`` only as far as the last
    stored list. Repeated entries are the same object (the decoder builds them once)."""
    last = None
    for j in range(j0, -1, -1) if j0 < len(col) else ():
        if col[j] is not None:
            last = col[j]
            break
    out = []
    for v in col[j0:j1]:
        last = v if v is not None else last
        out.append(last)
    return out


def _repeat_nulls(col: list) -> list:
    out, last = [], None
    for v in col:
        last = v if v is not None else last
        out.append(last)
    return out


_JSON = json.JSONDecoder()
_KEY = re.compile(r'"(g\d+\.[a-z_]+)":')


@_corrupt_is_one_line
def decode_columns(blob: bytes, names, codec: str = CODEC) -> tuple[list[float], dict[str, list]]:
    """Times and the raw (quantised) GPU columns ``names`` of a chunk, without building frames
    and without parsing the other columns: what a summary over a day of samples needs (parsing
    whole chunks made a day of 8 GPUs take 20 s). Implausible values read as None, like
    ``decode``'s. Damage raises RecordingError."""
    gpu_fields = SCHEMES[codec][0]
    raw = _inflate(blob)
    # The encoder writes the GPU columns first: read up to the host's, the whole text only
    # if a wanted column is not found there (and check only what is read).
    cut = raw.find(b'"h.')
    head = raw[:cut] if cut > 0 else raw
    _checked(head)
    text = head.decode("utf-8", "replace") if cut > 0 else raw.decode("utf-8")
    where = {m.group(1): m.end() for m in _KEY.finditer(text)}
    times = _times(_raw(text, "n"), _raw(text, "t"))
    out = {}
    full = None
    for name in names:
        _key_index(name, "g", MAX_GPUS)
        field = name[name.index(".") + 1:]
        if name in where:
            col, _ = _JSON.raw_decode(text, where[name])
        elif cut > 0:
            if full is None:
                _checked(raw)
                full = raw.decode("utf-8")
            col = _raw(full, name)
        else:
            col = None
        if col is None:
            continue
        col = _column(col, len(times))
        if not set(map(type, col)) <= _NUMERIC:
            raise ValueError("column")
        if field in gpu_fields:
            col = _in_range(col, gpu_fields[field], plausible.GPU[field])
        out[name] = col
    return times, out


def columns_of(frames: list[Frame], names, codec: str = CODEC) -> tuple[list[float], dict[str, list]]:
    """What ``decode_columns`` gives, from decoded frames: the fallback for a chunk that the
    fast path cannot read but the full decoder can (its samples must count)."""
    gpu_fields = SCHEMES[codec][0]
    times = [f.t for f in frames]
    out = {}
    for name in names:
        i = _key_index(name, "g", MAX_GPUS)
        field = name[name.index(".") + 1:]
        if i is None or field not in gpu_fields:
            continue
        col = []
        for f in frames:
            g = next((g for g in f.gpus if g.index == i), None)
            col.append(None if g is None else _q(getattr(g, field), gpu_fields[field]))
        if any(v is not None for v in col):
            out[name] = col
    return times, out


def _raw(text: str, key: str):
    """The JSON value of the first ``"key":`` in ``text`` (None if absent). Inside a JSON string
    a quote is always escaped, so the pattern cannot match within a value."""
    pattern = json.dumps(key) + ":"
    i = text.find(pattern)
    if i < 0:
        return None
    value, _ = _JSON.raw_decode(text, i + len(pattern))
    return value


def roundtrip(frames: list[Frame]) -> list[Frame]:
    """What a recording of ``frames`` replays as (their quantised form)."""
    return decode(encode(frames))
