"""Import what people already have: nvidia-smi --query-gpu CSV logs and nvidia-smi dmon logs.

Both become ordinary frames, so they replay in the dashboard and go through `analyze`
like any recording. Any field order or subset, with or without units (`nounits`),
`-l`/`-lms` timestamps; dmon plain or `--format csv`, with or without `-o DT`. A line
that does not parse is skipped and counted; a file that is mostly unparseable, or a
query CSV without its header line, is refused with one line saying what to do.

A log may come from anyone: it is read as a stream, line by line, into columns (one array
of numbers per GPU and field), so memory follows the samples kept, not the file; frames are
built only when read. Limits (docs/SECURITY.md): 512 MiB of text (after decompression) in
32 million lines (blank and comment lines too), 64 GPUs (indices 0-63), 10 million lines with
a sample, 64 million values, lines of 64 KiB. The text is scanned once in C before it is
parsed, so a file past a limit is refused before a line of it costs Python work.
A value outside its plausible range (traintop/plausible.py) is read as unknown; a line
whose GPU index or time is implausible is skipped.
"""

from __future__ import annotations

import bisect
import gzip
import io
import math
import re
import statistics
import time
import zlib
from array import array
from dataclasses import dataclass, field, fields
from typing import Any

from traintop import plausible
from traintop.sources.log_source import LogTimeline
from traintop.sources.import_pmon import PmonFailed, PmonLog, is_pmon_header, load_pmon
from traintop.errors import TraintopError
from traintop.files import open_regular
from traintop.samples import Frame, GpuInfo, GpuSample, SessionInfo
from traintop.units import MiB

MAX_BYTES = 512 * 1024 * 1024  # refuse to read more text than this (a log of months at 10 Hz)
MAX_LINE = 64 * 1024  # a longer line is skipped, never held whole
# every line costs Python work, a blank or comment one too: 512 MiB of "\n" is 537 million of them
# (a minute's work for each 100 million), where a real log's lines are 20 bytes or more
MAX_LINES = 32_000_000
MAX_ROWS = 10_000_000  # lines with a sample (a week of 8 GPUs at 2 Hz is 9.7 million)
MAX_VALUES = 64_000_000  # numbers kept (8 bytes each: 512 MB at most, as much as the text a log may hold)
MAX_GPUS = plausible.MAX_GPUS
NAME_CHARS = 256


class ImportFailed(TraintopError):
    """A file that is not a usable nvidia-smi log."""


# --query-gpu field -> (GpuSample attribute, converter)
_NUMBER = re.compile(r"^[-+]?\d{1,30}(\.\d{1,30})?")


def _num(text: str) -> float | None:
    text = text.strip()
    if not text or text.startswith("[") or text.upper() in ("N/A", "-", "NOT SUPPORTED"):
        return None
    m = _NUMBER.match(text)
    if not m:
        raise ValueError(text)
    if m.end() < len(text) and text[m.end()].isdigit():
        return None  # more than 30 digits: no GPU reports such a number
    return float(m.group(0))


def _mib(text: str) -> int | None:
    v = _num(text)
    return None if v is None else int(v * MiB)


def _hex(text: str) -> int | None:
    text = text.strip()
    if not text or text.startswith("[") or text.upper() == "N/A":
        return None
    if len(text) > 20:
        return None
    return int(text, 16) if text.lower().startswith("0x") else int(text)


def _int(text: str) -> int | None:
    v = _num(text)
    return None if v is None else int(v)


QUERY_FIELDS = {
    "utilization.gpu": ("util", _num),
    "utilization.memory": ("mem_util", _num),
    "memory.used": ("mem_used", _mib),
    "memory.total": ("mem_total", _mib),
    "memory.reserved": ("mem_reserved", _mib),
    "power.draw": ("power_w", _num),
    "power.draw.average": ("power_w", _num),
    "power.draw.instant": ("power_w", _num),
    "power.limit": ("power_limit_w", _num),
    "enforced.power.limit": ("power_limit_w", _num),
    "temperature.gpu": ("temp_c", _num),
    "clocks.current.sm": ("sm_clock", _int),
    "clocks.sm": ("sm_clock", _int),
    "clocks.current.memory": ("mem_clock", _int),
    "clocks.mem": ("mem_clock", _int),
    "clocks.max.sm": ("sm_clock_max", _int),
    "clocks.max.memory": ("mem_clock_max", _int),
    "clocks.max.mem": ("mem_clock_max", _int),
    "clocks_event_reasons.active": ("reasons", _hex),
    "clocks_throttle_reasons.active": ("reasons", _hex),
    "clocks.event_reasons.active": ("reasons", _hex),
    "pcie.link.gen.current": ("pcie_gen", _int),
    "pcie.link.gen.gpucurrent": ("pcie_gen", _int),
    "pcie.link.gen.max": ("pcie_gen_max", _int),
    "pcie.link.gen.gpumax": ("pcie_gen_max", _int),
    "pcie.link.width.current": ("pcie_width", _int),
    "pcie.link.width.max": ("pcie_width_max", _int),
}
IGNORED_QUERY_FIELDS = {"pci.bus_id", "uuid", "driver_version", "pstate", "fan.speed", "serial", "persistence_mode"}
NAME_FIELDS = {"name", "gpu_name"}
TIME_FORMATS = ("%Y/%m/%d %H:%M:%S", "%Y-%m-%d %H:%M:%S")  # then an optional .fraction

# dmon column -> (attribute, scale to our units)
DMON_COLUMNS = {"pwr": ("power_w", 1.0), "gtemp": ("temp_c", 1.0), "sm": ("util", 1.0), "mem": ("mem_util", 1.0),
                "fb": ("mem_used", float(MiB)), "mclk": ("mem_clock", 1.0), "pclk": ("sm_clock", 1.0),
                "rxpci": ("pcie_rx", 1e6), "txpci": ("pcie_tx", 1e6),  # -s t: MB/s
                "pviol": ("throttle_power", 1.0),  # -s v: percent of the interval
                "tviol": ("throttle_thermal", 100.0)}  # -s v: a flag (its unit row says "bool")
# GpuSample's integer fields (stored as float64 here: exact below 2**53, which every range is)
INT_ATTRS = {f.name for f in fields(GpuSample) if f.type == "int | None"}
_NAN = float("nan")
_UNREAD = object()
MEMO_SIZE = 4096  # distinct texts remembered per field: bounded whatever a file holds


class _GpuColumns:
    """One GPU's samples: the round each belongs to, and one array per field."""

    __slots__ = ("rounds", "cols", "name")

    def __init__(self, n_attrs: int) -> None:
        self.rounds = array("q")
        self.cols = [array("d") for _ in range(n_attrs)]
        self.name: str | None = None


class _Columns:
    """Lines in, columns out. One round (one frame) ends when a GPU index comes again."""

    def __init__(self, path: str, attrs: list[str]) -> None:
        self.path = path
        self.attrs = attrs
        self.t = array("d")  # the time of each round
        self.gpus: dict[int, _GpuColumns] = {}
        self._current: set[int] = set()
        self.rows = 0

    def add(self, t: float, idx: int, values: list) -> None:
        if self.rows >= MAX_ROWS:
            raise ImportFailed(f"{self.path} holds more than {MAX_ROWS:,} samples; split it first")
        if (self.rows + 1) * max(1, len(self.attrs)) > MAX_VALUES:
            raise ImportFailed(f"{self.path} holds more than {MAX_VALUES:,} values; split it first")
        if idx in self._current:
            self._current = set()
        if not self._current:
            self.t.append(t)
        self._current.add(idx)
        g = self.gpus.get(idx)
        if g is None:
            g = self.gpus[idx] = _GpuColumns(len(self.attrs))
        g.rounds.append(len(self.t) - 1)
        for col, v in zip(g.cols, values):
            col.append(_NAN if v is None else v)
        self.rows += 1

    def sample(self, idx: int, pos: int) -> GpuSample:
        g = self.gpus[idx]
        kw: dict[str, Any] = {}
        for attr, col in zip(self.attrs, g.cols):
            v = col[pos]
            if v == v:
                kw[attr] = int(v) if attr in INT_ATTRS else v
        return GpuSample(index=idx, **kw)

    def last(self, idx: int, attr: str):
        """The last known value of ``attr`` for GPU ``idx`` (limits, totals, maximum clocks)."""
        if attr not in self.attrs:
            return None
        col = self.gpus[idx].cols[self.attrs.index(attr)]
        for k in range(len(col) - 1, -1, -1):
            if col[k] == col[k]:
                return int(col[k]) if attr in INT_ATTRS else col[k]
        return None


@dataclass
class ImportedLog(LogTimeline):
    """A log read into columns, with the same surface a RecordingReader offers to replay."""

    path: str
    kind: str  # "nvidia-smi query" or "nvidia-smi dmon"
    columns: _Columns
    info: SessionInfo
    skipped_lines: int = 0
    skipped_chunks: int = 0
    notes: list[str] = field(default_factory=list)
    in_memory = True  # read whole into columns: a forked process can play any part of it (analyze_parallel)

    def __post_init__(self) -> None:
        t = self.columns.t
        if all(a <= b for a, b in zip(t, t[1:])):
            self._order = None
            self._times = t
        else:  # lines out of time order (logs appended in another order): play them sorted
            self._order = array("q", sorted(range(len(t)), key=t.__getitem__))
            self._times = array("d", (t[k] for k in self._order))

    def _frame(self, r: int) -> Frame:
        cols = self.columns
        gpus = []
        for idx in sorted(cols.gpus):
            rounds = cols.gpus[idx].rounds
            pos = bisect.bisect_left(rounds, r)
            if pos < len(rounds) and rounds[pos] == r:
                gpus.append(cols.sample(idx, pos))
        return Frame(t=cols.t[r], gpus=tuple(gpus))

    def frames(self, t_from: float | None = None, t_to: float | None = None):
        times = self._times
        k0 = bisect.bisect_left(times, t_from) if t_from is not None else 0
        k1 = bisect.bisect_right(times, t_to) if t_to is not None else len(times)
        for k in range(k0, k1):
            yield self._frame(k if self._order is None else self._order[k])


class _Lines:
    """The text of a plain or gzip-compressed log, line by line, within MAX_BYTES, MAX_LINES and
    MAX_LINE."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.too_long = 0
        self._read = 0
        self._lines = 0
        with open_regular(path, "log") as fh:  # a FIFO, a socket or a device is refused here
            size = _file_size(fh)
            head = fh.read(4096)
        self.gz = head[:2] == b"\x1f\x8b"
        if not self.gz and size > MAX_BYTES:
            raise ImportFailed(f"{path} is larger than {MAX_BYTES // 2**20} MiB; split it first")
        self._scan()
        if self.gz:
            with self._raw() as raw:
                head = raw.read(4096)
        if b"\x00" in head:
            raise ImportFailed(f"{path} is a binary file, not an nvidia-smi log")

    def _raw(self):
        fh = open_regular(self.path, "log")
        return gzip.GzipFile(fileobj=fh, mode="rb") if self.gz else fh

    def _too_large(self) -> ImportFailed:
        verb = "expands to more than" if self.gz else "is larger than"
        return ImportFailed(f"{self.path} {verb} {MAX_BYTES // 2**20} MiB; split it first")

    def _too_many_lines(self) -> ImportFailed:
        return ImportFailed(f"{self.path} holds more than {MAX_LINES:,} lines; split it first")

    def _scan(self) -> None:
        """Read the text once without keeping anything, counting bytes and lines in C: a small
        .gz may expand past the limit, and a file of blank lines costs as much as one of samples."""
        total = lines = 0
        try:
            with self._raw() as raw:
                while block := raw.read(1 << 20):
                    total += len(block)
                    # line ends as the reader counts them (\n, \r\n or a lone \r)
                    lines += block.count(b"\n") + block.count(b"\r") - block.count(b"\r\n")
                    if total > MAX_BYTES:
                        raise self._too_large()
                    if lines > MAX_LINES:
                        raise self._too_many_lines()
        except (OSError, EOFError, zlib.error) as e:
            raise ImportFailed(f"cannot read {self.path}: {e}") from None

    def __iter__(self):
        """Non-empty lines (stripped of their newline)."""
        try:
            with self._raw() as raw:
                text = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline=None)
                while True:
                    line = text.readline(MAX_LINE + 1)
                    if not line:
                        return
                    self._read += len(line)
                    self._lines += 1
                    if self._read > MAX_BYTES:  # a file that grew since it was scanned
                        raise self._too_large()
                    if self._lines > MAX_LINES:
                        raise self._too_many_lines()
                    if len(line) > MAX_LINE and not line.endswith("\n"):
                        self.too_long += 1
                        while line and not line.endswith("\n"):  # drop the rest of it
                            line = text.readline(MAX_LINE)
                            self._read += len(line)
                        continue
                    if line.strip():
                        yield line.rstrip("\r\n")
        except (OSError, EOFError, zlib.error) as e:
            raise ImportFailed(f"cannot read {self.path}: {e}") from None


def _file_size(fh) -> int:
    import os

    return os.fstat(fh.fileno()).st_size


def load(path: str, fields: list[str] | None = None) -> ImportedLog | PmonLog:
    lines = _Lines(path)
    it = iter(lines)
    first = next(it, None)
    if first is None:
        raise ImportFailed(f"{path} is empty")
    first = first.strip()
    if is_pmon_header(first):  # before dmon: pmon's sm and mem are a process's, not the GPU's
        try:
            return load_pmon(path, first, it, _Clock(("%Y%m%d %H:%M:%S",)), _Skips(), lines, _gpu_index)
        except PmonFailed as e:
            raise ImportFailed(str(e)) from None
    if first.startswith("#") and {"gpu", "idx"} & set(first.lstrip("#").replace(",", " ").lower().split()):
        return _load_dmon(path, first, it, lines)
    if fields:
        return _load_query(path, ", ".join(fields), _chain(first, it), lines)
    header = [h.strip() for h in first.split(",")]
    known = [h for h in header if _field_name(h) in QUERY_FIELDS or _field_name(h) in ("timestamp", "index")]
    if not known:
        if re.match(r"^[\d/: .-]+,", first):
            raise ImportFailed(
                f"{path} has no header line: log with --format=csv (not csv,noheader), or name the fields "
                "in order with --fields, e.g. --fields timestamp,index,utilization.gpu,memory.used,power.draw")
        raise ImportFailed(f"{path} is not a traintop recording, an nvidia-smi --query-gpu CSV, a dmon or a pmon log")
    return _load_query(path, first, it, lines)


def _chain(first, it):
    yield first
    yield from it


def _field_name(header: str) -> str:
    return re.sub(r"\s*\[.*\]\s*$", "", header.strip()).strip().lower()


class _Clock:
    """Timestamps to epoch seconds, within the years 2000..2100 (a line from year 1 or 9999
    is damage). strptime is slow: a second's base is parsed once for all its GPUs and lines."""

    def __init__(self, formats) -> None:
        self.formats = formats
        self._base: str | None = None
        self._value = 0.0

    def __call__(self, text: str) -> float:
        base, _, frac = text.strip().partition(".")
        if base != self._base:
            for fmt in self.formats:
                try:
                    value = time.mktime(time.strptime(base, fmt))
                    break
                except (ValueError, OverflowError):
                    continue
            else:
                raise ValueError(f"time {text!r}")
            self._base, self._value = base, value
        t = self._value
        if frac:
            if not frac.isdigit() or len(frac) > 9:
                raise ValueError(f"time {text!r}")
            t += float("0." + frac)
        if not plausible.LOG_T_MIN <= t < plausible.T_MAX:
            raise ValueError("time outside the years 2000-2100")
        return t


def _gpu_index(text: str) -> int:
    text = text.strip()
    if not text.isdigit() or len(text) > 4 or int(text) >= MAX_GPUS:
        raise ValueError(f"GPU index {text[:20]!r} outside 0-{MAX_GPUS - 1}")
    return int(text)


def _plausible(attr: str, v):
    return None if v is None else plausible.number(v, plausible.GPU[attr])


class _Skips:
    def __init__(self) -> None:
        self.count = 0
        self.first: str | None = None

    def add(self, line_no: int, why: str) -> None:
        self.count += 1
        if self.first is None:
            self.first = f"line {line_no}: {why}"


def _load_query(path: str, header_line: str, rows, lines: _Lines) -> ImportedLog:
    names = [_field_name(h) for h in header_line.split(",")]
    if "timestamp" not in names:
        raise ImportFailed(f"{path} has no timestamp field: add timestamp to --query-gpu")
    t_col = names.index("timestamp")
    i_col = names.index("index") if "index" in names else None
    name_col = next((names.index(n) for n in NAME_FIELDS if n in names), None)
    cols = [(k, QUERY_FIELDS[n]) for k, n in enumerate(names) if n in QUERY_FIELDS]
    attrs = list(dict.fromkeys(attr for _, (attr, _) in cols))
    slot = {a: j for j, a in enumerate(attrs)}
    unknown = [n for n in names if n not in QUERY_FIELDS and n not in IGNORED_QUERY_FIELDS
               and n not in NAME_FIELDS and n not in ("timestamp", "index")]
    out = _Columns(path, attrs)
    # A field's text repeats from sample to sample (limits, totals, clocks, steady readings):
    # each distinct text is converted and checked once per field
    memos: list[dict] = [{} for _ in cols]
    clock = _Clock(TIME_FORMATS)
    skips = _Skips()
    total = 0
    for line in rows:
        total += 1
        parts = line.split(",")
        if len(parts) != len(names) or _field_name(parts[0]) == "timestamp":
            skips.add(total + 1, "a repeated header or a torn line")
            continue
        try:
            t = clock(parts[t_col])
            idx = _gpu_index(parts[i_col]) if i_col is not None else 0
            values = [None] * len(attrs)
            for (k, (attr, conv)), memo in zip(cols, memos):
                text = parts[k]
                v = memo.get(text, _UNREAD)
                if v is _UNREAD:
                    v = _plausible(attr, conv(text))
                    if len(memo) < MEMO_SIZE:
                        memo[text] = v
                values[slot[attr]] = v
        except (ValueError, IndexError, OverflowError) as e:
            skips.add(total + 1, str(e)[:80])
            continue
        out.add(t, idx, values)
        if name_col is not None:
            out.gpus[idx].name = parts[name_col].strip()[:NAME_CHARS]
    return _assemble(path, "nvidia-smi query", out, skips, total + lines.too_long, lines,
                     [f"ignored fields: {', '.join(unknown)[:200]}"] if unknown else [])


def _load_dmon(path: str, header_line: str, rows, lines: _Lines) -> ImportedLog:
    header = [h.lower() for h in header_line.lstrip("#").replace(",", " ").split()]
    has_dt = header[:2] == ["date", "time"]
    gpu_col = header.index("gpu") if "gpu" in header else header.index("idx") if "idx" in header else None
    if gpu_col is None:
        raise ImportFailed(f"{path} is not an nvidia-smi log: its first line starts with # but has no gpu "
                           "column (dmon's header)")
    used = [(k, *DMON_COLUMNS[name]) for k, name in enumerate(header) if name in DMON_COLUMNS]
    attrs = list(dict.fromkeys(attr for _, attr, _ in used))
    slot = {a: j for j, a in enumerate(attrs)}
    out = _Columns(path, attrs)
    clock = _Clock(("%Y%m%d %H:%M:%S",))
    skips = _Skips()
    total = 0
    clock_t = 0.0
    last_idx = None
    for line in rows:
        total += 1
        if line.lstrip().startswith("#"):
            continue  # dmon repeats its header
        parts = line.replace(",", " ").split()
        if len(parts) != len(header):
            skips.add(total + 1, "a torn line")
            continue
        try:
            idx = _gpu_index(parts[gpu_col])
            if has_dt:
                t = clock(parts[0] + " " + parts[1])
            else:  # no timestamps: dmon prints once a second, GPU by GPU
                if last_idx is not None and idx <= last_idx:
                    clock_t += 1.0
                t = clock_t
            values = [None] * len(attrs)
            for k, attr, scale in used:
                v = _num(parts[k])
                if v is not None:
                    v = int(v * scale) if attr in INT_ATTRS else v * scale
                values[slot[attr]] = _plausible(attr, v)
        except (ValueError, OverflowError) as e:
            skips.add(total + 1, str(e)[:80])
            continue
        last_idx = idx
        out.add(t, idx, values)
    notes = [] if has_dt else ["no timestamps in this dmon log (-o DT): times count from 0 at 1 s a line"]
    return _assemble(path, "nvidia-smi dmon", out, skips, total + lines.too_long, lines, notes)


def _assemble(path, kind, cols: _Columns, skips: _Skips, total: int, lines: _Lines, notes) -> ImportedLog:
    skipped = skips.count + lines.too_long
    why = f" (first: {skips.first})" if skips.first else ""
    if not cols.rows:
        raise ImportFailed(f"{path}: no sample could be read ({skipped} unreadable line(s){why})")
    if skipped > max(10, total // 2):
        raise ImportFailed(f"{path}: {skipped} of {total} lines are unreadable{why}; is it an nvidia-smi log?")
    log = ImportedLog(path=path, kind=kind, columns=cols, info=SessionInfo(kind="import"), skipped_lines=skipped,
                      notes=list(notes))
    times = log._times
    step = max(1, len(times) // 100_000)  # the median gap of at most 100 000 rounds is as good
    gaps = [b - a for a, b in zip(times[::step], times[step::step]) if b > a]
    gaps = [g / step for g in gaps] if step > 1 else gaps
    interval = statistics.median(gaps) if gaps else 1.0
    if not (math.isfinite(interval) and 0 < interval < 3600):
        interval = 1.0
    infos = tuple(GpuInfo(index=i, name=cols.gpus[i].name or "NVIDIA GPU", mem_total=cols.last(i, "mem_total"),
                          power_limit_w=cols.last(i, "power_limit_w"), sm_clock_max=cols.last(i, "sm_clock_max"),
                          mem_clock_max=cols.last(i, "mem_clock_max")) for i in sorted(cols.gpus))
    log.info = SessionInfo(kind="import", gpus=infos, interval=interval, label=f"{kind} log",
                           hostname=None, extra={"source": kind})
    return log
