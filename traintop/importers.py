"""Import what people already have: nvidia-smi --query-gpu CSV logs and nvidia-smi dmon logs.

Both become ordinary frames, so they replay in the dashboard and go through `analyze`
like any recording. Any field order or subset, with or without units (`nounits`),
`-l`/`-lms` timestamps; dmon plain or `--format csv`, with or without `-o DT`. A line
that does not parse is skipped and counted; a file that is mostly unparseable, or a
query CSV without its header line, is refused with one line saying what to do.
"""

from __future__ import annotations

import gzip
import re
import statistics
import time
from dataclasses import dataclass, field

from traintop.errors import TraintopError
from traintop.samples import Frame, GpuInfo, GpuSample, SessionInfo
from traintop.units import MiB

MAX_BYTES = 512 * 1024 * 1024  # refuse to read more than this (a log of months at 10 Hz)


class ImportFailed(TraintopError):
    """A file that is not a usable nvidia-smi log."""


# --query-gpu field -> (GpuSample attribute, converter)
def _num(text: str) -> float | None:
    text = text.strip()
    if not text or text.startswith("[") or text.upper() in ("N/A", "-", "NOT SUPPORTED"):
        return None
    m = re.match(r"^[-+]?\d+(\.\d+)?", text)
    if not m:
        raise ValueError(text)
    return float(m.group(0))


def _mib(text: str) -> int | None:
    v = _num(text)
    return None if v is None else int(v * MiB)


def _hex(text: str) -> int | None:
    text = text.strip()
    if not text or text.startswith("[") or text.upper() == "N/A":
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
TIME_FORMATS = ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S")

# dmon column -> (attribute, scale to our units)
DMON_COLUMNS = {"pwr": ("power_w", 1.0), "gtemp": ("temp_c", 1.0), "sm": ("util", 1.0), "mem": ("mem_util", 1.0),
                "fb": ("mem_used", float(MiB)), "mclk": ("mem_clock", 1.0), "pclk": ("sm_clock", 1.0),
                "rxpci": ("pcie_rx", 1e6), "txpci": ("pcie_tx", 1e6),  # -s t: MB/s
                "pviol": ("throttle_power", 1.0),  # -s v: percent of the interval
                "tviol": ("throttle_thermal", 100.0)}  # -s v: a flag (its unit row says "bool")
INT_ATTRS = {"sm_clock", "mem_clock", "mem_used", "pcie_gen", "pcie_width", "pcie_gen_max", "pcie_width_max"}


@dataclass
class ImportedLog:
    """Frames read from a log, with the same surface a RecordingReader offers to replay."""

    path: str
    kind: str  # "nvidia-smi query" or "nvidia-smi dmon"
    frames_list: list[Frame]
    info: SessionInfo
    skipped_lines: int = 0
    skipped_chunks: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def t_start(self) -> float | None:
        return self.frames_list[0].t if self.frames_list else None

    @property
    def t_end(self) -> float | None:
        return self.frames_list[-1].t if self.frames_list else None

    @property
    def frame_count(self) -> int:
        return len(self.frames_list)

    def frames(self, t_from: float | None = None, t_to: float | None = None):
        for f in self.frames_list:
            if (t_from is None or f.t >= t_from) and (t_to is None or f.t <= t_to):
                yield f

    def alerts(self) -> list:
        return []


def _read_text(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
            fh.seek(0)
            raw = gzip.GzipFile(fileobj=fh).read(MAX_BYTES + 1) if head == b"\x1f\x8b" else fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise ImportFailed(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ImportFailed(f"{path} is a directory") from None
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise ImportFailed(f"cannot read {path}: {e}") from None
    if len(raw) > MAX_BYTES:
        raise ImportFailed(f"{path} is larger than {MAX_BYTES // 2**20} MiB; split it first")
    if b"\x00" in raw[:4096]:
        raise ImportFailed(f"{path} is a binary file, not an nvidia-smi log")
    return raw.decode("utf-8", errors="replace")


def load(path: str, fields: list[str] | None = None) -> ImportedLog:
    text = _read_text(path)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ImportFailed(f"{path} is empty")
    first = lines[0].strip()
    if first.startswith("#") and {"gpu", "idx"} & set(first.lstrip("#").replace(",", " ").lower().split()):
        return _load_dmon(path, lines)
    if fields:
        return _load_query(path, [", ".join(fields)] + lines)
    header = [h.strip() for h in first.split(",")]
    known = [h for h in header if _field_name(h) in QUERY_FIELDS or _field_name(h) in ("timestamp", "index")]
    if not known:
        if re.match(r"^[\d/: .-]+,", first):
            raise ImportFailed(
                f"{path} has no header line: log with --format=csv (not csv,noheader), or name the fields "
                "in order with --fields, e.g. --fields timestamp,index,utilization.gpu,memory.used,power.draw")
        raise ImportFailed(f"{path} is not a traintop recording, an nvidia-smi --query-gpu CSV or a dmon log")
    return _load_query(path, lines)


def _field_name(header: str) -> str:
    return re.sub(r"\s*\[.*\]\s*$", "", header.strip()).strip().lower()


def _parse_time(text: str) -> float:
    text = text.strip()
    for fmt in TIME_FORMATS:
        try:
            base, _, frac = text.partition(".")
            if "%f" in fmt and frac:
                st = time.strptime(base, fmt.replace(".%f", ""))
                return time.mktime(st) + float("0." + frac)
            if "%f" not in fmt:
                return time.mktime(time.strptime(text, fmt))
        except ValueError:
            continue
    raise ValueError(f"time {text!r}")


def _load_query(path: str, lines: list[str]) -> ImportedLog:
    names = [_field_name(h) for h in lines[0].split(",")]
    if "timestamp" not in names:
        raise ImportFailed(f"{path} has no timestamp field: add timestamp to --query-gpu")
    t_col = names.index("timestamp")
    i_col = names.index("index") if "index" in names else None
    name_col = next((names.index(n) for n in NAME_FIELDS if n in names), None)
    cols = [(k, QUERY_FIELDS[n]) for k, n in enumerate(names) if n in QUERY_FIELDS]
    unknown = [n for n in names if n not in QUERY_FIELDS and n not in IGNORED_QUERY_FIELDS
               and n not in NAME_FIELDS and n not in ("timestamp", "index")]
    rows: list[tuple[float, int, dict]] = []
    gpu_names: dict[int, str] = {}
    skipped = 0
    for line in lines[1:]:
        parts = line.split(",")
        if len(parts) != len(names) or _field_name(parts[0]) == "timestamp":
            skipped += 1  # a repeated header (nvidia-smi restarted) or a torn line
            continue
        try:
            t = _parse_time(parts[t_col])
            idx = int(parts[i_col]) if i_col is not None else 0
            values = {}
            for k, (attr, conv) in cols:
                values[attr] = conv(parts[k])
        except (ValueError, IndexError):
            skipped += 1
            continue
        if name_col is not None:
            gpu_names[idx] = parts[name_col].strip()
        rows.append((t, idx, values))
    return _assemble(path, "nvidia-smi query", rows, gpu_names, skipped, len(lines) - 1,
                     [f"ignored fields: {', '.join(unknown)}"] if unknown else [])


def _load_dmon(path: str, lines: list[str]) -> ImportedLog:
    header = lines[0].lstrip("#").replace(",", " ").split()
    header = [h.lower() for h in header]
    has_dt = header[:2] == ["date", "time"]
    gpu_col = header.index("gpu") if "gpu" in header else header.index("idx") if "idx" in header else None
    if gpu_col is None:
        raise ImportFailed(f"{path}: a dmon log needs its gpu column")
    rows = []
    skipped = 0
    clock_t = 0.0
    last_idx = None
    for line in lines[1:]:
        if line.lstrip().startswith("#"):
            continue  # dmon repeats its header
        parts = line.replace(",", " ").split()
        if len(parts) != len(header):
            skipped += 1
            continue
        try:
            idx = int(parts[gpu_col])
            if has_dt:
                t = time.mktime(time.strptime(parts[0] + " " + parts[1], "%Y%m%d %H:%M:%S"))
            else:  # no timestamps: dmon prints once a second, GPU by GPU
                if last_idx is not None and idx <= last_idx:
                    clock_t += 1.0
                t = clock_t
            last_idx = idx
            values = {}
            for k, name in enumerate(header):
                if name in DMON_COLUMNS:
                    attr, scale = DMON_COLUMNS[name]
                    v = _num(parts[k])
                    values[attr] = None if v is None else (int(v * scale) if attr in INT_ATTRS else v * scale)
        except ValueError:
            skipped += 1
            continue
        rows.append((t, idx, values))
    notes = [] if has_dt else ["no timestamps in this dmon log (-o DT): times count from 0 at 1 s a line"]
    return _assemble(path, "nvidia-smi dmon", rows, {}, skipped, len(lines) - 1, notes)


def _assemble(path, kind, rows, gpu_names, skipped, total, notes) -> ImportedLog:
    if not rows:
        raise ImportFailed(f"{path}: no sample could be read ({skipped} unreadable line(s))")
    if skipped > max(10, total // 2):
        raise ImportFailed(f"{path}: {skipped} of {total} lines are unreadable; is it an nvidia-smi log?")
    # One frame per sampling round: a round ends when a GPU index comes again.
    frames: list[Frame] = []
    current: dict[int, GpuSample] = {}
    t_round = None
    for t, idx, values in rows:
        if idx in current:
            frames.append(Frame(t=t_round, gpus=tuple(current[i] for i in sorted(current))))
            current = {}
        if not current:
            t_round = t
        current[idx] = GpuSample(index=idx, **values)
    if current:
        frames.append(Frame(t=t_round, gpus=tuple(current[i] for i in sorted(current))))
    frames.sort(key=lambda f: f.t)
    gaps = [b.t - a.t for a, b in zip(frames, frames[1:]) if b.t > a.t]
    interval = statistics.median(gaps) if gaps else 1.0
    indices = sorted({g.index for f in frames for g in f.gpus})
    last = {g.index: g for f in frames for g in f.gpus}
    infos = tuple(GpuInfo(index=i, name=gpu_names.get(i, "NVIDIA GPU"), mem_total=last[i].mem_total,
                          power_limit_w=last[i].power_limit_w, sm_clock_max=last[i].sm_clock_max,
                          mem_clock_max=last[i].mem_clock_max) for i in indices)
    info = SessionInfo(kind="import", gpus=infos, interval=interval, label=f"{kind} log",
                       hostname=None, extra={"source": kind})
    return ImportedLog(path=path, kind=kind, frames_list=frames, info=info, skipped_lines=skipped, notes=notes)
