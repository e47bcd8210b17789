"""Frames <-> compact columnar chunks (JSON of quantised integers, zlib-compressed).

Quantisation (documented in docs/RECORDING.md). Codec ``cols2+zlib`` (written now): times
to the millisecond, memory to the MiB, power to 1 W, percentages and temperatures to 1
(NVML reports whole numbers), PCIe and disk/network rates to the MB/s (kB/s for the
process's I/O), clocks to the MHz. ``cols1+zlib`` (read only) kept 0.1 W, 0.1 % and kB/s.
``decode(encode(frames))`` is what a replay sees; tests compare against that.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from traintop.errors import RecordingError
from traintop.samples import Frame, GpuProcess, GpuSample, HostSample, ProcessSample, ProcInfo, RankSample
from traintop.units import MiB

CODEC = "cols2+zlib"
CODECS = ("cols1+zlib", "cols2+zlib")
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


def decode(blob: bytes, codec: str = CODEC) -> list[Frame]:
    """Decode a chunk; any damage raises RecordingError with one line of explanation."""
    try:
        doc = json.loads(_inflate(blob))
        n = doc["n"]
        deltas = doc["t"]
        cols = doc["c"]
        if not isinstance(n, int) or not isinstance(deltas, list) or len(deltas) != n or not isinstance(cols, dict):
            raise ValueError("bad header")
        times, acc = [], 0
        for d in deltas:
            if not isinstance(d, int):
                raise ValueError("bad time")
            acc += d
            times.append(acc / 1000.0)
        columns = {}
        for k, col in cols.items():
            if not isinstance(k, str) or not isinstance(col, list):
                raise ValueError("bad column")
            if col and col[0] == "d":
                vals, acc2 = [], 0
                for j, d in enumerate(col[1:]):
                    if not isinstance(d, int):
                        raise ValueError("bad delta")
                    acc2 = d if j == 0 else acc2 + d
                    vals.append(acc2)
                col = vals
            if len(col) != n:
                raise ValueError("column length")
            if k.endswith(".procs") and codec != "cols1+zlib":
                col = _repeat_nulls(col)
            columns[k] = col
        scheme = SCHEMES[codec]
        return [_frame(times[j], {k: c[j] for k, c in columns.items()}, scheme) for j in range(n)]
    except RecordingError:
        raise
    except (ValueError, KeyError, TypeError, IndexError, zlib.error, RecursionError, OverflowError) as e:
        raise RecordingError(f"a data chunk is corrupt ({type(e).__name__})") from None


def _repeat_nulls(col: list) -> list:
    out, last = [], None
    for v in col:
        last = v if v is not None else last
        out.append(last)
    return out


def decode_columns(blob: bytes, wanted) -> tuple[list[float], dict[str, list]]:
    """Times and the raw (quantised) columns whose names ``wanted(name)`` accepts, without
    building frames: what a summary over a day of samples needs. Damage raises RecordingError."""
    from itertools import accumulate

    try:
        doc = json.loads(_inflate(blob))
        n, deltas, cols = doc["n"], doc["t"], doc["c"]
        if not isinstance(n, int) or not isinstance(deltas, list) or len(deltas) != n or not isinstance(cols, dict):
            raise ValueError("bad header")
        if not all(isinstance(d, int) for d in deltas):
            raise ValueError("bad time")
        times = [v / 1000.0 for v in accumulate(deltas)]
        out = {}
        for k, col in cols.items():
            if not isinstance(k, str) or not isinstance(col, list) or not wanted(k):
                continue
            if col and col[0] == "d":
                if not all(isinstance(d, int) for d in col[1:]):
                    raise ValueError("bad delta")
                col = list(accumulate(col[1:]))
            if len(col) != n or not all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
                                        for v in col):
                raise ValueError("column")
            out[k] = col
        return times, out
    except RecordingError:
        raise
    except (ValueError, KeyError, TypeError, IndexError, zlib.error, RecursionError, OverflowError) as e:
        raise RecordingError(f"a data chunk is corrupt ({type(e).__name__})") from None


def _frame(t: float, row: dict[str, Any], scheme=SCHEMES[CODEC]) -> Frame:
    gpu_fields, host_fields, proc_fields, rank_fields, core_scale, member_scale = scheme
    gpu_idx = sorted({int(k[1:k.index(".")]) for k in row if k.startswith("g") and "." in k})
    gpus = []
    for i in gpu_idx:
        p = f"g{i}."
        if all(row.get(p + name) is None for name in gpu_fields) and not row.get(p + "procs"):
            continue
        kw = {name: _dq(row.get(p + name), scale, name in INT_FIELDS) for name, scale in gpu_fields.items()}
        procs = row.get(p + "procs") or []
        kw["processes"] = tuple(GpuProcess(int(pid), _dq(mib, _BYTES)) for pid, mib in procs)
        gpus.append(GpuSample(index=i, **kw))
    host = None
    if any(k.startswith("h.") and row[k] is not None for k in row):
        kw = {name: _dq(row.get("h." + name), scale) for name, scale in host_fields.items()}
        host = HostSample(per_core=tuple(c / core_scale for c in (row.get("h.cores") or [])), **kw)
    proc = None
    if row.get("p.pid") is not None:
        kw = {name: _dq(row.get("p." + name), scale, name == "threads") for name, scale in proc_fields.items()}
        members = tuple(
            ProcInfo(int(m[0]), str(m[1]), _dq(m[2], member_scale), _dq(m[3], _BYTES), _dq(m[4], 1, True), bool(m[5]))
            for m in (row.get("p.members") or [])
        )
        proc = ProcessSample(pid=int(row["p.pid"]), alive=bool(row.get("p.alive")), name=str(row.get("p.name") or ""),
                             cmdline=str(row.get("p.cmd") or ""), members=members, **kw)
    ranks = []
    for j in sorted({int(k[1:k.index(".")]) for k in row if k.startswith("r") and "." in k}):
        p = f"r{j}."
        if row.get(p + "pid") is None:
            continue
        kw = {name: _dq(row.get(p + name), scale, name in RANK_INT_FIELDS) for name, scale in rank_fields.items()}
        ranks.append(RankSample(cuda=bool(row.get(p + "cuda")), **kw))
    return Frame(t=t, gpus=tuple(gpus), host=host, process=proc, ranks=tuple(ranks))


def roundtrip(frames: list[Frame]) -> list[Frame]:
    """What a recording of ``frames`` replays as (their quantised form)."""
    return decode(encode(frames))
