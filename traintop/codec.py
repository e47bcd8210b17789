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
from dataclasses import fields
from itertools import accumulate
from typing import Any

from traintop.errors import RecordingError
from traintop.metrics import checked_name
from traintop.samples import Frame, GpuProcess, GpuSample, HostSample, ProcessSample, ProcInfo, RankSample
from traintop.units import MiB

CODEC = "cols2+zlib"
CODECS = ("cols1+zlib", "cols2+zlib")
_NUMERIC = {int, float, type(None)}
MAX_CHUNK_BYTES = 64 * 1024 * 1024  # refuse to inflate more than this (zip bombs)

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
INT_FIELDS = {"sm_clock", "sm_clock_max", "mem_clock", "mem_clock_max", "reasons", "pcie_gen", "pcie_width",
              "pcie_gen_max", "pcie_width_max",
              "ecc_corrected", "ecc_uncorrected", "remap_pending", "xid"}
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
                  temp_c=1, temp_slowdown_c=1, pcie_tx=1e-6, pcie_rx=1e-6)
HOST_FIELDS = dict(HOST_FIELDS_V1, cpu_percent=1, iowait=1, disk_read=1e-6, disk_write=1e-6, net_rx=1e-6, net_tx=1e-6)
PROC_FIELDS = dict(PROC_FIELDS_V1, cpu_percent=1)
RANK_FIELDS = dict(RANK_FIELDS_V1, step_time=1e4, steps_per_s=10)
# per codec: GPU, host, process and rank scales; per-core CPU and process-member CPU scales
SCHEMES = {
    "cols1+zlib": (GPU_FIELDS_V1, HOST_FIELDS_V1, PROC_FIELDS_V1, RANK_FIELDS_V1, 10, 10),
    "cols2+zlib": (GPU_FIELDS, HOST_FIELDS, PROC_FIELDS, RANK_FIELDS, 1, 1),
}
RANK_INT_FIELDS = {"pid", "rank", "world_size", "device", "alloc_retries", "ooms", "steps"}


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


def _row(frame: Frame) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for g in frame.gpus:
        p = f"g{g.index}."
        for name, scale in GPU_FIELDS.items():
            row[p + name] = _q(getattr(g, name), scale)
        row[p + "procs"] = [[pr.pid, _q(pr.used_bytes, _BYTES)] for pr in g.processes]
    h = frame.host
    if h is not None:
        for name, scale in HOST_FIELDS.items():
            row["h." + name] = _q(getattr(h, name), scale)
        row["h.cores"] = [int(round(c)) for c in h.per_core]
    pr = frame.process
    if pr is not None:
        row["p.pid"] = pr.pid
        row["p.alive"] = 1 if pr.alive else 0
        row["p.name"] = pr.name
        row["p.cmd"] = pr.cmdline
        for name, scale in PROC_FIELDS.items():
            row["p." + name] = _q(getattr(pr, name), scale)
        row["p.members"] = [
            [m.pid, m.name, _q(m.cpu_percent, 1), _q(m.rss, _BYTES), m.threads, 1 if m.is_loader_worker else 0]
            + ([m.ppid] if m.ppid is not None else [])
            for m in pr.members
        ]
    for j, r in enumerate(frame.ranks):
        p = f"r{j}."
        for name, scale in RANK_FIELDS.items():
            row[p + name] = _q(getattr(r, name), scale)
        row[p + "cuda"] = 1 if r.cuda else 0
    return row


def encode(frames: list[Frame]) -> bytes:
    """Encode frames (time-ordered) as one compressed columnar chunk."""
    rows = [_row(f) for f in frames]
    keys: dict[str, None] = {}
    for r in rows:
        keys.update(dict.fromkeys(r))
    times = [int(round(f.t * 1000)) for f in frames]
    deltas = [times[0]] + [b - a for a, b in zip(times, times[1:])] if times else []
    cols = {}
    for k in keys:
        col = [r.get(k, None) for r in rows]
        if all(v is None for v in col):  # a field this source cannot read costs nothing
            continue
        if k.endswith(".procs"):  # a GPU's process list rarely changes: null repeats the previous row
            col = [v if j == 0 or v != col[j - 1] else None for j, v in enumerate(col)]
        if all(isinstance(v, int) for v in col):  # delta-code numeric columns that change slowly
            cols[k] = ["d", col[0]] + [b - a for a, b in zip(col, col[1:])]
        else:
            cols[k] = col
    doc = {"n": len(frames), "t": deltas, "c": cols}
    return zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 6)


def _inflate(blob: bytes) -> bytes:
    d = zlib.decompressobj()
    out = d.decompress(blob, MAX_CHUNK_BYTES)
    if d.unconsumed_tail:
        raise RecordingError("a chunk inflates past 64 MiB; refusing it")
    return out


def _times(n, deltas) -> list[float]:
    """Sample times from the header (validated: n samples, integer millisecond deltas)."""
    if type(n) is not int or not isinstance(deltas, list) or len(deltas) != n:
        raise ValueError("bad header")
    if not set(map(type, deltas)) <= {int}:
        raise ValueError("bad time")
    return [v / 1000.0 for v in accumulate(deltas)]


def _column(col, n: int) -> list:
    """A stored column as n values: delta-coded integer columns are summed back."""
    if not isinstance(col, list):
        raise ValueError("bad column")
    if col and col[0] == "d":
        if not set(map(type, col[1:])) <= {int}:
            raise ValueError("bad delta")
        col = list(accumulate(col[1:]))
    if len(col) != n:
        raise ValueError("column length")
    return col


def _parse(blob: bytes, codec: str) -> tuple[list[float], dict[str, list]]:
    """Inflate, parse and validate a chunk: times and its (quantised) columns."""
    doc = json.loads(_inflate(blob))
    if not isinstance(doc["c"], dict):
        raise ValueError("bad header")
    times = _times(doc["n"], doc["t"])
    columns = {}
    for k, col in doc["c"].items():
        col = _column(col, len(times))
        if k.endswith(".procs") and codec != "cols1+zlib":
            col = _repeat_nulls(col)
        columns[k] = col
    return times, columns


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
    import bisect

    scheme = SCHEMES[codec]
    times, columns = _parse(blob, codec)
    n = len(times)
    j0 = bisect.bisect_left(times, t_from) if t_from is not None else 0
    j1 = bisect.bisect_right(times, t_to) if t_to is not None else n
    if j0 >= j1:
        return []
    if j0 or j1 < n:
        times = times[j0:j1]
        columns = {k: c[j0:j1] for k, c in columns.items()}
    return _frames(times, columns, scheme)


_GPU_ORDER = [f.name for f in fields(GpuSample)][1:-1]  # between index and processes


def _dq_col(col: list | None, scale, as_int: bool, n: int) -> list:
    """Dequantise a whole column (None where missing); non-numbers are damage."""
    if col is None:
        return [None] * n
    if not set(map(type, col)) <= _NUMERIC:
        raise ValueError("bad number")
    if scale == _BYTES:
        return [None if v is None else int(v) * MiB for v in col]
    if as_int:
        return [None if v is None else int(round(v / scale)) for v in col]
    return [None if v is None else v / scale for v in col]


def _frames(times: list[float], columns: dict[str, list], scheme) -> list[Frame]:
    """Frames from columns, column by column (a day of 8 GPUs decodes several times faster
    than row by row)."""
    gpu_fields, host_fields, proc_fields, rank_fields, core_scale, member_scale = scheme
    n = len(times)
    gpus_by_row: list[list[GpuSample]] = [[] for _ in range(n)]
    for i in sorted({int(k[1:k.index(".")]) for k in columns if k.startswith("g") and "." in k}):
        p = f"g{i}."
        cols = [_dq_col(columns.get(p + name), gpu_fields[name], name in INT_FIELDS, n) if name in gpu_fields
                else [None] * n for name in _GPU_ORDER]
        procs_col = columns.get(p + "procs") or [None] * n
        for j, row in enumerate(zip(*cols)):
            procs = procs_col[j] or ()
            if procs:
                procs = tuple(GpuProcess(int(pid), _dq(mib, _BYTES)) for pid, mib in procs)
            elif all(v is None for v in row):
                continue  # this GPU was not sampled in this frame
            gpus_by_row[j].append(GpuSample(i, *row, processes=procs))
    host_rows = [None] * n
    if any(k.startswith("h.") for k in columns):
        hcols = {name: _dq_col(columns.get("h." + name), scale, False, n) for name, scale in host_fields.items()}
        cores = columns.get("h.cores") or [None] * n
        for j in range(n):
            kw = {name: c[j] for name, c in hcols.items()}
            if any(v is not None for v in kw.values()) or cores[j]:
                host_rows[j] = HostSample(per_core=tuple(c / core_scale for c in (cores[j] or [])), **kw)
    proc_rows = [None] * n
    pids = columns.get("p.pid")
    if pids is not None:
        pcols = {name: _dq_col(columns.get("p." + name), scale, name == "threads", n)
                 for name, scale in proc_fields.items()}
        alive, names, cmds = (columns.get(k) or [None] * n for k in ("p.alive", "p.name", "p.cmd"))
        members = columns.get("p.members") or [None] * n
        for j in range(n):
            if pids[j] is None:
                continue
            ms = tuple(ProcInfo(int(m[0]), str(m[1]), _dq(m[2], member_scale), _dq(m[3], _BYTES),
                                _dq(m[4], 1, True), bool(m[5]), int(m[6]) if len(m) > 6 else None)
                       for m in (members[j] or []))
            proc_rows[j] = ProcessSample(pid=int(pids[j]), alive=bool(alive[j]), name=str(names[j] or ""),
                                         cmdline=str(cmds[j] or ""), members=ms,
                                         **{name: c[j] for name, c in pcols.items()})
    ranks_by_row: list[list[RankSample]] = [[] for _ in range(n)]
    for r in sorted({int(k[1:k.index(".")]) for k in columns if k.startswith("r") and "." in k}):
        p = f"r{r}."
        if columns.get(p + "pid") is None:
            continue
        rcols = {name: _dq_col(columns.get(p + name), scale, name in RANK_INT_FIELDS, n)
                 for name, scale in rank_fields.items()}
        cuda = columns.get(p + "cuda") or [None] * n
        for j in range(n):
            if rcols["pid"][j] is None:
                continue
            ranks_by_row[j].append(RankSample(cuda=bool(cuda[j]), **{name: c[j] for name, c in rcols.items()}))
    return [Frame(t=times[j], gpus=tuple(gpus_by_row[j]), host=host_rows[j], process=proc_rows[j],
                  ranks=tuple(ranks_by_row[j])) for j in range(n)]


def _repeat_nulls(col: list) -> list:
    out, last = [], None
    for v in col:
        last = v if v is not None else last
        out.append(last)
    return out


_JSON = json.JSONDecoder()
_KEY = re.compile(r'"(g\d+\.[a-z_]+)":')


@_corrupt_is_one_line
def decode_columns(blob: bytes, names) -> tuple[list[float], dict[str, list]]:
    """Times and the raw (quantised) columns ``names`` of a chunk, without building frames and
    without parsing the other columns: what a summary over a day of samples needs (parsing
    whole chunks made a day of 8 GPUs take 20 s). Damage raises RecordingError."""
    raw = _inflate(blob)
    # The encoder writes the GPU columns first: read up to the host's, the whole text only
    # if a wanted column is not found there.
    cut = raw.find(b'"h.')
    text = raw[:cut].decode("utf-8", "replace") if cut > 0 else raw.decode("utf-8")
    where = {m.group(1): m.end() for m in _KEY.finditer(text)}
    times = _times(_raw(text, "n"), _raw(text, "t"))
    out = {}
    full = None
    for name in names:
        if name in where:
            col, _ = _JSON.raw_decode(text, where[name])
        elif cut > 0:
            full = full if full is not None else raw.decode("utf-8")
            col = _raw(full, name)
        else:
            col = None
        if col is None:
            continue
        col = _column(col, len(times))
        if not set(map(type, col)) <= _NUMERIC:
            raise ValueError("column")
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
