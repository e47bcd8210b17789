"""Samples for scripts: one sample as JSON, a stream of them as JSON lines, GPUs as CSV rows.

The shape is versioned (``SCHEMA``) and documented in docs/EXPORT.md; a field is added, never
renamed or given another unit, within one version. Every value is in the unit of its name:
bytes, watts, °C, MHz, % (0-100) for utilizations, shares 0-1 for ``*_active`` and
``input_wait``, bytes a second for rates, seconds since the epoch for ``t``. Missing is
``null`` (JSON) or an empty cell (CSV), never 0.

A JSON string carries control characters escaped; CSV cells from outside (names, command
lines) pass through ``text.one_line`` since a CSV is often printed to a terminal, and ``csv_cell``
since it is often opened in a spreadsheet. No I/O here
but the bounded stream writer, which never blocks the sampler on a slow reader.
"""

from __future__ import annotations

import csv
import io
import json
import queue
import re
import threading
from dataclasses import fields
from typing import IO, Any

from traintop.samples import Frame, GpuInfo, GpuSample, HostSample, ProcessSample, RankSample, SessionInfo
from traintop.text import one_line

SCHEMA = "traintop.sample/1"
# Fields that came after the CSV's layout was set go after its processes column, so every
# column a script reads by position stays where it was.
_LATER = ("nvlink_tx", "nvlink_rx", "parent")
_GPU_FIELDS = [f.name for f in fields(GpuSample) if f.name not in ("index", "processes", *_LATER)] + list(_LATER)
_CSV_FIELDS = _GPU_FIELDS[: -len(_LATER)]
_HOST_FIELDS = [f.name for f in fields(HostSample)]
_PROCESS_FIELDS = [f.name for f in fields(ProcessSample) if f.name != "members"]
_RANK_FIELDS = [f.name for f in fields(RankSample)]
CSV_COLUMNS = ["t", "host", "gpu", "name", "uuid", *_CSV_FIELDS, "processes", *_LATER, "mig_profile",
               "gpu_instance_id", "compute_instance_id"]


def _num(v: Any) -> Any:
    if isinstance(v, float) and v != v:
        return None
    return v


def _plain(obj, names: list[str]) -> dict:
    return {n: _num(getattr(obj, n)) for n in names}


def _rank(r: RankSample) -> dict:
    """A rank's fields, its matmul precision and backend by name (a recording keeps their index)."""
    return {**_plain(r, _RANK_FIELDS), "matmul": r.matmul_mode, "backend": r.backend_name}


def sample_record(frame: Frame, info: SessionInfo, owners: dict[int, dict] | None = None) -> dict:
    """One sample as a JSON-ready dict. ``owners``: PID -> what ``collectors.whose`` says of it
    (live only: user, container, job …), merged into that GPU process's entry."""
    names = {g.index: g for g in info.gpus}
    gpus = []
    for g in frame.gpus:
        gi: GpuInfo | None = names.get(g.index)
        entry = {"index": g.index, "name": gi.name if gi else None, "uuid": gi.uuid if gi else None,
                 **_plain(g, _GPU_FIELDS),
                 "mig": _mig(gi),
                 "stale": g.index in frame.stale_gpus,
                 "processes": [{"pid": p.pid, "used_bytes": p.used_bytes, "sm_util": _num(p.sm_util),
                                "mem_util": _num(p.mem_util), "enc_util": _num(p.enc_util),
                                "dec_util": _num(p.dec_util), **((owners or {}).get(p.pid) or {})}
                               for p in g.processes]}
        gpus.append(entry)
    out: dict[str, Any] = {"schema": SCHEMA, "t": frame.t, "host": info.hostname, "gpus": gpus,
                           "host_stats": _plain(frame.host, _HOST_FIELDS) if frame.host else None,
                           "process": None, "ranks": [_rank(r) for r in frame.ranks]}
    if frame.process is not None:
        p = frame.process
        out["process"] = {**_plain(p, _PROCESS_FIELDS),
                          "members": [{"pid": m.pid, "name": m.name, "cpu_percent": _num(m.cpu_percent),
                                       "rss": m.rss, "loader_worker": m.is_loader_worker} for m in p.members]}
    return out


def _mig(gi: GpuInfo | None) -> dict | None:
    """A MIG device's profile and instance ids (None for a whole GPU)."""
    if gi is None or gi.parent is None:
        return None
    return {"profile": gi.mig_profile, "gpu_instance_id": gi.gi_id, "compute_instance_id": gi.ci_id}


def json_line(record: dict) -> str:
    """One line of JSON (no newline inside: a stream stays one sample a line)."""
    return json.dumps(record, separators=(",", ":"), allow_nan=False)


# The fullwidth forms too: a spreadsheet in a CJK locale may take ＝ for = (as an IME's input does).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def csv_cell(value: Any) -> Any:
    """A cell a spreadsheet will not run: a text starting with =, +, -, @, a tab or a carriage return
    gets a leading ' (OWASP's advice for CSV injection: a GPU or host name from a recording or a log
    is someone else's text), also after leading spaces (an import that trims them would run
    " =1+1") and in their fullwidth forms. Numbers, and texts that are plain numbers (-1.5), stay as
    they are."""
    if isinstance(value, str) and (value.startswith(_FORMULA_START) or value.lstrip().startswith(_FORMULA_START)) \
            and not _NUMBER.fullmatch(value):
        return "'" + value
    return value


# What a CSV's rows are (``export --csv --rows``): GPUs, or the host, the attached job or the
# probes' ranks, each with the sample's time and host first.
CSV_ROWS = {"gpus": "a row a GPU a sample", "host": "a row a sample: the host",
            "process": "a row a sample: the attached job (its tree counted: members, loader workers)",
            "ranks": "a row a rank a sample: what its probe reports"}
_HOST_COLUMNS = ["t", "host", *_HOST_FIELDS]
_PROCESS_COLUMNS = ["t", "host", *_PROCESS_FIELDS, "members", "loader_workers"]
_RANK_COLUMNS = ["t", "host", *_RANK_FIELDS]
_COLUMNS = {"gpus": CSV_COLUMNS, "host": _HOST_COLUMNS, "process": _PROCESS_COLUMNS, "ranks": _RANK_COLUMNS}


def csv_header(rows: str = "gpus") -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(_COLUMNS[rows])
    return buf.getvalue()


def _cell(v: Any) -> Any:
    """A value as a CSV cell: missing is empty; a list is its values, space-separated; text is data."""
    v = _num(v)
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        return " ".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v)
    if isinstance(v, str):
        return csv_cell(one_line(v, 4096))
    return v


def csv_count(frame: Frame, rows: str = "gpus") -> int:
    """How many rows ``csv_rows`` writes for ``frame``."""
    if rows == "gpus":
        return len(frame.gpus)
    if rows == "ranks":
        return len(frame.ranks)
    return int((frame.host if rows == "host" else frame.process) is not None)


def csv_rows(frame: Frame, info: SessionInfo, rows: str = "gpus") -> str:
    """``rows`` of one sample (``CSV_ROWS``). GPUs: the sample's time and host, the GPU's fields,
    its processes as pid:bytes (pid:bytes:SM % where its share is known)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    host = csv_cell(one_line(info.hostname or "", 253))
    head = [f"{frame.t:.3f}", host]
    if rows == "host":
        if frame.host is not None:
            w.writerow(head + [_cell(getattr(frame.host, n)) for n in _HOST_FIELDS])
        return buf.getvalue()
    if rows == "process":
        p = frame.process
        if p is not None:
            w.writerow(head + [_cell(getattr(p, n)) for n in _PROCESS_FIELDS]
                       + [len(p.members), len(p.loader_workers)])
        return buf.getvalue()
    if rows == "ranks":
        for r in frame.ranks:
            w.writerow(head + [_cell(v) for v in _rank(r).values()])
        return buf.getvalue()
    names = {g.index: g for g in info.gpus}
    for g in frame.gpus:
        gi = names.get(g.index)
        procs = " ".join(f"{p.pid}:{'' if p.used_bytes is None else p.used_bytes}"
                         f"{'' if p.sm_util is None else f':{p.sm_util:g}'}" for p in g.processes)
        row = [*head, g.index, one_line(gi.name, 96) if gi else "", one_line(gi.uuid, 96) if gi and gi.uuid else "",
               *("" if (v := _num(getattr(g, n))) is None else v for n in _CSV_FIELDS), procs,
               *("" if (v := _num(getattr(g, n))) is None else v for n in _LATER),
               one_line(gi.mig_profile, 32) if gi and gi.mig_profile else "",
               *("" if gi is None or v is None else v for v in ((gi.gi_id, gi.ci_id) if gi else (None, None)))]
        w.writerow([csv_cell(v) for v in row])
    return buf.getvalue()


class StreamWriter:
    """Lines to a file or a pipe from a thread of its own, through a bounded queue: a reader that
    falls behind loses lines (counted in ``dropped``), the sampler never waits for it. A reader
    that goes away (a closed pipe) ends the stream (``closed_by_reader``)."""

    def __init__(self, out: IO[str], max_lines: int = 1000) -> None:
        self.out = out
        self.dropped = 0
        self.written = 0
        self.closed_by_reader = False
        self.error: str | None = None
        self._q: queue.Queue[str | None] = queue.Queue(max_lines)
        self._thread = threading.Thread(target=self._run, name="traintop-stream", daemon=True)
        self._thread.start()

    def put(self, line: str) -> None:
        if self.closed_by_reader or self.error:
            return
        try:
            self._q.put_nowait(line)
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        while True:
            line = self._q.get()
            if line is None:
                return
            try:
                self.out.write(line)
                if self._q.empty():
                    self.out.flush()
                self.written += 1
            except BrokenPipeError:
                self.closed_by_reader = True
                return
            except (OSError, ValueError) as e:
                self.error = str(e)
                return

    def close(self, timeout: float = 5.0) -> None:
        """Writes what is queued (for at most ``timeout`` seconds), then stops."""
        try:
            self._q.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)
        if not self.closed_by_reader and not self.error:
            try:
                self.out.flush()
            except (BrokenPipeError, OSError, ValueError):
                self.closed_by_reader = True
