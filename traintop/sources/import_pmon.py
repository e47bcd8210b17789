"""`nvidia-smi pmon` logs: each GPU process's share of its GPU (SM, memory, encoder, decoder %)
and, with ``-s um``, its memory, a line a process a second.

Read as a stream into columns (one row a line, eight numbers), so memory follows the lines kept,
not the file. The command column, the last, is left out (a process name is not needed to
place a share). A line with ``-`` for its PID says the GPU had no process then. pmon logs
hold no reading of the GPU itself, so the rules, which judge GPU readings, are not run on one
(``gpu_readings``); replay, export and the process lists show what it holds. A GPU with more
than ``plausible.MAX_GPU_PROCESSES`` processes in one round is no GPU's: the file is refused.
"""

from __future__ import annotations

import bisect
import math
import statistics
from array import array
from dataclasses import dataclass, field

from traintop import plausible
from traintop.sources.log_source import LogTimeline
from traintop.samples import Frame, GpuInfo, GpuProcess, GpuSample, SessionInfo
from traintop.units import MiB

MAX_PMON_ROWS = 4_000_000  # 8 numbers each: 256 MB at most
_NAN = float("nan")
_PCT = ("sm", "mem", "enc", "dec")


class PmonFailed(ValueError):
    pass


def is_pmon_header(first: str) -> bool:
    names = set(first.lstrip("#").replace(",", " ").lower().split())
    return first.startswith("#") and "pid" in names and ("gpu" in names or "idx" in names)


def _pct(text: str) -> float:
    text = text.strip()
    if text in ("-", "", "N/A"):
        return _NAN
    v = float(text) if len(text) <= 8 else _NAN
    return v if 0.0 <= v <= 100.0 else _NAN


@dataclass
class PmonLog(LogTimeline):
    """A pmon log in columns, with the surface a RecordingReader offers to replay and analyze."""

    path: str
    info: SessionInfo
    t: array  # one time a round
    rows: dict[str, array]  # round, gpu, pid, fb, sm, mem, enc, dec: one entry a line
    kind: str = "nvidia-smi pmon"
    gpu_readings = False  # nothing for the rules to judge (analyze runs none)
    skipped_lines: int = 0
    skipped_chunks: int = 0
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._times = self.t

    def _frame(self, r: int, lo: int) -> tuple[Frame, int]:
        rows = self.rows
        gpus: dict[int, list[GpuProcess]] = {}
        k = lo
        while k < len(rows["round"]) and rows["round"][k] == r:
            g = int(rows["gpu"][k])
            procs = gpus.setdefault(g, [])
            pid = int(rows["pid"][k])
            if pid > 0:
                fb = rows["fb"][k]
                procs.append(GpuProcess(pid, None if fb != fb else int(fb * MiB),
                                        *(None if (v := rows[c][k]) != v else v for c in _PCT)))
            k += 1
        return Frame(t=self.t[r], gpus=tuple(GpuSample(g, processes=tuple(p)) for g, p in sorted(gpus.items()))), k

    def gpu_times(self) -> dict[int, array]:
        """Each GPU's times: those of the rounds it appears in (what analyze sums, without frames)."""
        out: dict[int, array] = {}
        last: dict[int, int] = {}
        t = self.t
        for r, g in zip(self.rows["round"], self.rows["gpu"]):
            if last.get(g) != r:
                last[g] = r
                col = out.get(g)
                if col is None:
                    col = out[g] = array("d")
                col.append(t[r])
        return out

    def frames(self, t_from: float | None = None, t_to: float | None = None):
        r0 = bisect.bisect_left(self.t, t_from) if t_from is not None else 0
        r1 = bisect.bisect_right(self.t, t_to) if t_to is not None else len(self.t)
        k = bisect.bisect_left(self.rows["round"], r0)
        for r in range(r0, r1):
            frame, k = self._frame(r, k)
            yield frame


def load_pmon(path: str, header_line: str, rows, clock, skips, lines, gpu_index) -> PmonLog:
    """``rows``: the lines after the header; ``clock``, ``skips``, ``lines`` and ``gpu_index`` are
    the importer's (one reading of times, of skipped and over-long lines, one check of GPU indices)."""
    header = [h.lower() for h in header_line.lstrip("#").replace(",", " ").split()]
    has_dt = header[:2] == ["date", "time"]
    gpu_col = header.index("gpu") if "gpu" in header else header.index("idx")
    pid_col = header.index("pid")
    cols = {c: header.index(c) for c in (*_PCT, "fb") if c in header}
    width = len(header)
    last = header[-1] == "command"
    out: dict[str, array] = {k: array("q") for k in ("round", "gpu", "pid")} | {k: array("d") for k in ("fb", *_PCT)}
    t = array("d")
    seen: set[tuple[int, int]] = set()
    per_gpu: dict[int, int] = {}  # processes of each GPU in this round
    clock_t, last_idx, last_stamp, total = 0.0, None, None, 0
    for line in rows:
        total += 1
        if line.lstrip().startswith("#"):
            continue  # pmon repeats its header
        parts = line.replace(",", " ").split(None, width - 1) if last else line.replace(",", " ").split()
        if len(parts) < width - (1 if last else 0) or (not last and len(parts) != width):
            skips.add(total + 1, "a torn line")
            continue
        try:
            idx = gpu_index(parts[gpu_col])
            pid_text = parts[pid_col]
            pid = 0 if pid_text == "-" else int(pid_text) if pid_text.isdigit() and len(pid_text) <= 9 else -1
            if pid < 0 or (pid and plausible.number(pid, plausible.PID) is None):
                raise ValueError(f"PID {pid_text[:20]!r}")
            values = {c: _pct(parts[k]) if c != "fb" else _fb(parts[k]) for c, k in cols.items()}
            if has_dt:
                stamp = parts[0] + " " + parts[1]
                new_round = stamp != last_stamp
                when = clock(stamp) if new_round else None
            else:  # no timestamps: a round ends where a GPU or one of its processes comes again
                new_round = last_idx is None or idx < last_idx or (idx, pid) in seen
                when = None
        except (ValueError, OverflowError) as e:
            skips.add(total + 1, str(e)[:80])
            continue
        if new_round:
            if len(t) and not has_dt:
                clock_t += 1.0
            t.append(when if when is not None else clock_t)  # None: no timestamps
            seen = set()
            per_gpu = {}
            if has_dt:
                last_stamp = stamp
        if len(out["round"]) >= MAX_PMON_ROWS:
            raise PmonFailed(f"{path} holds more than {MAX_PMON_ROWS:,} process lines; split it first")
        per_gpu[idx] = n = per_gpu.get(idx, 0) + 1
        if n > plausible.MAX_GPU_PROCESSES:
            raise PmonFailed(f"{path}: line {total + 1} puts more than {plausible.MAX_GPU_PROCESSES:,} processes on "
                             f"GPU {idx} at once; not an nvidia-smi pmon log")
        if not has_dt:
            seen.add((idx, pid))
        last_idx = idx
        out["round"].append(len(t) - 1)
        out["gpu"].append(idx)
        out["pid"].append(pid)
        for c in ("fb", *_PCT):
            out[c].append(values.get(c, _NAN))
    return _pmon_log(path, t, out, has_dt, total, skips.count + lines.too_long, skips.first)


def _pmon_log(path: str, t: array, out: dict[str, array], has_dt: bool, total: int, skipped: int,
              first: str | None) -> PmonLog:
    """The log of the columns read (``total`` lines, ``skipped`` of them unreadable, the ``first``
    said why), or PmonFailed where they hold no log: nothing read, most lines unreadable, times going back."""
    why = f" (first: {first})" if first else ""
    if not t:
        raise PmonFailed(f"{path}: no sample could be read ({skipped} unreadable line(s){why})")
    if skipped > max(10, total // 2):
        raise PmonFailed(f"{path}: {skipped} of {total} lines are unreadable{why}; is it an nvidia-smi pmon log?")
    if any(b < a for a, b in zip(t, t[1:])):
        raise PmonFailed(f"{path}: its times go backwards; sort the log by time first")
    gaps = [b - a for a, b in zip(t, t[1:]) if b > a]
    interval = statistics.median(gaps) if gaps else 1.0
    interval = interval if math.isfinite(interval) and 0 < interval < 3600 else 1.0
    gpus = tuple(GpuInfo(index=i, name="NVIDIA GPU") for i in sorted(set(out["gpu"])))
    notes = ["a pmon log holds each process's share of its GPU, not the GPU's own readings: "
             "the rules need those (a --query-gpu or dmon log)"]
    if not has_dt:
        notes.append("no timestamps in this pmon log (-o DT): times count from 0 at 1 s a round")
    info = SessionInfo(kind="import", gpus=gpus, interval=interval, label="nvidia-smi pmon log",
                       extra={"source": "nvidia-smi pmon"})
    return PmonLog(path, info, t, out, skipped_lines=skipped, notes=notes)


def _fb(text: str) -> float:
    text = text.strip()
    if text in ("-", "", "N/A") or not text.isdigit() or len(text) > 9:
        return _NAN
    return float(text)
