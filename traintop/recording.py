"""One self-describing SQLite file per session: metadata, compressed frame chunks, alerts.

Written incrementally: every ``flush_every`` seconds the new samples are committed as a
small chunk, so a process killed with SIGKILL loses at most about a second. Once the small
chunks hold ``chunk_frames`` samples they are replaced, in one transaction, by a single
large chunk that compresses well. Each sample is encoded at most twice.
Nothing is ever unpickled or evaluated: a recording is untrusted input.
"""

from __future__ import annotations

import bisect
from contextlib import contextmanager
import json
import os
import socket
import sqlite3
import time
from dataclasses import asdict
from typing import Iterator

from traintop import __version__
from traintop.codec import CODEC, CODECS, decode, encode
from traintop.errors import RecordingError
from traintop.rules.engine import Alert, Severity
from traintop.samples import Frame, GpuInfo, SessionInfo

FORMAT = "traintop-recording"
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS chunks(id INTEGER PRIMARY KEY, t0 REAL NOT NULL, t1 REAL NOT NULL,
                                  n INTEGER NOT NULL, codec TEXT NOT NULL, data BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS chunks_t0 ON chunks(t0);
CREATE TABLE IF NOT EXISTS alerts(id INTEGER PRIMARY KEY, rule TEXT NOT NULL, subject TEXT NOT NULL,
                                  severity TEXT NOT NULL, title TEXT NOT NULL, start REAL NOT NULL,
                                  end REAL, evidence TEXT NOT NULL, remedies TEXT NOT NULL);
"""


def info_to_json(info: SessionInfo) -> str:
    return json.dumps(asdict(info))


def info_from_json(text: str) -> SessionInfo:
    d = json.loads(text)
    if not isinstance(d, dict):
        raise ValueError("session is not an object")
    def num(v):
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None

    def text(v):
        return v if isinstance(v, str) else None

    gpus = []
    raw_gpus = d.get("gpus") or []
    if not isinstance(raw_gpus, list):
        raise ValueError("bad gpu list")
    for g in raw_gpus:
        if not isinstance(g, dict) or not isinstance(g.get("index"), int):
            raise ValueError("bad gpu entry")
        gpus.append(GpuInfo(index=g["index"], name=text(g.get("name")) or "GPU", uuid=text(g.get("uuid")),
                            mem_total=num(g.get("mem_total")), power_limit_w=num(g.get("power_limit_w")),
                            temp_slowdown_c=num(g.get("temp_slowdown_c")), sm_clock_max=num(g.get("sm_clock_max")),
                            mem_clock_max=num(g.get("mem_clock_max")), pcie_gen_max=num(g.get("pcie_gen_max")),
                            pcie_width_max=num(g.get("pcie_width_max")), pci_bus_id=text(g.get("pci_bus_id")),
                            minor=g.get("minor") if isinstance(g.get("minor"), int) else None))
    interval = d.get("interval", 0.5)
    if not isinstance(interval, (int, float)) or not 0 < interval < 3600:
        raise ValueError("bad interval")
    extra = d.get("extra") or {}
    return SessionInfo(kind=str(d.get("kind", "replay")), gpus=tuple(gpus), driver=text(d.get("driver")),
                       cuda_driver=text(d.get("cuda_driver")), hostname=text(d.get("hostname")),
                       interval=float(interval), label=str(d.get("label", "")),
                       extra=extra if isinstance(extra, dict) else {})


def default_recording_dir() -> str:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "traintop", "recordings")


def new_recording_path(directory: str | None = None) -> str:
    """A fresh time-stamped file name in ``directory`` (the per-user default if None), created 0700."""
    directory = directory or default_recording_dir()
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as e:
        raise RecordingError(f"cannot create {directory}: {e.strerror or e}") from None
    return os.path.join(directory, time.strftime("traintop-%Y%m%d-%H%M%S.ttrec"))


class RecordingWriter:
    def __init__(self, path: str, info: SessionInfo, *, chunk_frames: int = 600,
                 flush_every: float = 1.0, overwrite: bool = False, clock=time.monotonic) -> None:
        self.path = path
        self.chunk_frames = chunk_frames
        self.flush_every = flush_every
        self._clock = clock
        if os.path.exists(path):
            if not overwrite:
                raise RecordingError(f"{path} already exists; choose another name (recordings are never overwritten)")
            os.unlink(path)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            os.close(fd)
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            # Merged-away small chunks leave free pages; reclaim them on close.
            self._db.execute("PRAGMA auto_vacuum=INCREMENTAL")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            with self._tx():
                meta = {"format": FORMAT, "schema_version": str(SCHEMA_VERSION), "app_version": __version__,
                        "created": str(time.time()), "recorded_on": socket.gethostname(),
                        "session": info_to_json(info)}
                self._db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", meta.items())
        except OSError as e:
            raise RecordingError(f"cannot create {path}: {e.strerror or e}") from None
        except sqlite3.Error as e:
            raise RecordingError(f"cannot create {path}: {e}") from None
        self._small_ids: list[int] = []  # committed small chunks not yet merged
        self._small_frames: list[Frame] = []
        self._buf: list[Frame] = []  # not yet committed
        self._dirty_alerts: dict[int, Alert] = {}
        self._last_flush = clock()
        self.closed = False

    @contextmanager
    def _tx(self):
        self._db.execute("BEGIN")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def set_meta(self, key: str, value: str) -> None:
        try:
            with self._tx():
                self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
        except sqlite3.Error as e:
            raise RecordingError(f"cannot write to {self.path}: {e}") from None

    def add(self, frame: Frame) -> None:
        self._buf.append(frame)
        if len(self._buf) >= self.chunk_frames or self._clock() - self._last_flush >= self.flush_every:
            self.flush()

    def alert(self, alert: Alert) -> None:
        self._dirty_alerts[alert.id] = alert
        if self._clock() - self._last_flush >= self.flush_every:
            self.flush()

    @staticmethod
    def _row(frames: list[Frame]) -> tuple:
        return (frames[0].t, frames[-1].t, len(frames), CODEC, encode(frames))

    def flush(self, final: bool = False) -> None:
        """Commit new samples and changed alerts. Raises RecordingError (disk full, ...)."""
        if self.closed:
            return
        pending = len(self._small_frames) + len(self._buf)
        merge = pending >= self.chunk_frames or (final and len(self._small_ids) + bool(self._buf) > 1)
        try:
            with self._tx():
                if merge:
                    frames = self._small_frames + self._buf
                    self._db.execute("INSERT INTO chunks(t0, t1, n, codec, data) VALUES (?,?,?,?,?)",
                                     self._row(frames))
                    self._db.executemany("DELETE FROM chunks WHERE id=?", [(i,) for i in self._small_ids])
                elif self._buf:
                    cur = self._db.execute("INSERT INTO chunks(t0, t1, n, codec, data) VALUES (?,?,?,?,?)",
                                           self._row(self._buf))
                    new_id = cur.lastrowid
                for a in self._dirty_alerts.values():
                    self._db.execute(
                        "INSERT OR REPLACE INTO alerts VALUES (?,?,?,?,?,?,?,?,?)",
                        (a.id, a.rule, a.subject, a.severity.label, a.title, a.start, a.end, a.evidence,
                         json.dumps(list(a.remedies))))
        except sqlite3.Error as e:
            raise RecordingError(f"writing {self.path} failed: {e}") from None
        if merge:
            self._small_ids, self._small_frames = [], []
        elif self._buf:
            self._small_ids.append(new_id)
            self._small_frames.extend(self._buf)
        self._buf = []
        self._dirty_alerts.clear()
        self._last_flush = self._clock()

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.flush(final=True)
            self._db.executescript("PRAGMA incremental_vacuum;")  # runs to completion (execute frees one page)
            # Leave one self-contained file behind (no -wal/-shm beside it).
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._db.execute("PRAGMA journal_mode=DELETE")
        except sqlite3.Error:
            pass
        finally:
            self._db.close()
            self.closed = True


class RecordingReader:
    """Reads a recording written by RecordingWriter (also one cut short by SIGKILL)."""

    def __init__(self, path: str) -> None:
        self.path = path
        if not os.path.exists(path):
            raise RecordingError(f"{path}: no such file")
        if os.path.isdir(path):
            raise RecordingError(f"{path} is a directory, not a recording")
        if os.path.getsize(path) == 0:
            raise RecordingError(f"{path} is empty: not a traintop recording")
        with open(path, "rb") as fh:
            if fh.read(16) != b"SQLite format 3\x00":
                raise RecordingError(f"{path} is not a traintop recording (not an SQLite file)")
        try:
            self._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
            # Text in a hostile file may not be UTF-8: never let decoding raise.
            self._db.text_factory = lambda b: b.decode("utf-8", "replace")
            self._db.execute("PRAGMA trusted_schema=OFF")
            self._db.execute("PRAGMA query_only=ON")
            meta = {str(k): str(v) for k, v in self._db.execute("SELECT key, value FROM meta").fetchall()}
        except (sqlite3.Error, ValueError, TypeError) as e:
            raise RecordingError(f"{path} is damaged or not a traintop recording ({e})") from None
        if meta.get("format") != FORMAT:
            raise RecordingError(f"{path} is an SQLite file but not a traintop recording")
        try:
            version = int(meta.get("schema_version", ""))
        except ValueError:
            raise RecordingError(f"{path} has no valid schema version") from None
        if version > SCHEMA_VERSION:
            raise RecordingError(f"{path} was written by a newer traintop (format v{version}; "
                                 f"this one reads up to v{SCHEMA_VERSION}): upgrade traintop")
        if version < 1:
            raise RecordingError(f"{path} has an unknown format version {version}")
        try:
            self.info = info_from_json(meta["session"])
        except (KeyError, ValueError, TypeError) as e:
            raise RecordingError(f"{path} has damaged session metadata ({type(e).__name__})") from None
        self.meta = meta
        try:
            rows = self._db.execute("SELECT id, t0, t1, n, codec FROM chunks ORDER BY t0, id").fetchall()
        except sqlite3.Error as e:
            raise RecordingError(f"{path} is damaged ({e})") from None
        self._chunks = [r for r in rows if isinstance(r[0], int) and isinstance(r[1], (int, float))
                        and isinstance(r[2], (int, float)) and isinstance(r[3], int) and r[3] >= 0
                        and r[1] == r[1] and r[2] == r[2]]
        self._t0s = [r[1] for r in self._chunks]
        self.skipped_chunks = 0
        self._cache: dict[int, list[Frame]] = {}

    @property
    def t_start(self) -> float | None:
        return self._chunks[0][1] if self._chunks else None

    @property
    def t_end(self) -> float | None:
        return max(r[2] for r in self._chunks) if self._chunks else None

    @property
    def frame_count(self) -> int:
        return sum(int(r[3]) for r in self._chunks)

    def _load(self, chunk_id: int, codec: str, t_from: float | None = None, t_to: float | None = None) -> list[Frame]:
        """A chunk's frames (cached), or only those in [t_from, t_to] (a seek into the middle
        of a chunk: not cached, and several times cheaper than the whole chunk)."""
        if chunk_id in self._cache:
            return self._cache[chunk_id]
        frames: list[Frame] = []
        try:
            row = self._db.execute("SELECT data FROM chunks WHERE id=?", (chunk_id,)).fetchone()
            if codec not in CODECS or row is None or not isinstance(row[0], bytes):
                raise RecordingError("unknown codec")
            frames = decode(row[0], codec, t_from=t_from, t_to=t_to)
        except (RecordingError, sqlite3.Error, ValueError):
            self.skipped_chunks += 1  # one damaged chunk must not lose the rest of the session
        if t_from is not None or t_to is not None:
            return frames
        if len(self._cache) > 2:
            self._cache.pop(next(iter(self._cache)))
        self._cache[chunk_id] = frames
        return frames

    def frames(self, t_from: float | None = None, t_to: float | None = None) -> Iterator[Frame]:
        start = 0
        if t_from is not None:
            start = max(0, bisect.bisect_right(self._t0s, t_from) - 1)
        for cid, t0, t1, n, codec in self._chunks[start:]:
            if t_to is not None and t0 > t_to:
                break
            if t_from is not None and t1 < t_from:
                continue
            lo = t_from if t_from is not None and t0 < t_from else None
            hi = t_to if t_to is not None and t1 > t_to else None
            for f in self._load(cid, codec, lo, hi):
                if (t_from is None or f.t >= t_from) and (t_to is None or f.t <= t_to):
                    yield f

    def chunk_ids(self) -> list[int]:
        return [int(r[0]) for r in self._chunks]

    def columns(self, names: list[str], ids: list[int] | None = None) -> Iterator[tuple[str, list[float], dict[str, list]]]:
        """Chunk by chunk (all, or the chunks ``ids`` in time order): its codec, times and the raw
        columns ``names`` (see codec.decode_columns). Damaged chunks are skipped and counted."""
        from traintop.codec import decode_columns

        rows = [(r[0], r[4]) for r in self._chunks]
        if ids is not None:
            wanted = set(ids)
            rows = [r for r in rows if r[0] in wanted]
        for chunk_id, codec in rows:
            if codec not in CODECS:
                self.skipped_chunks += 1
                continue
            try:
                (blob,) = self._db.execute("SELECT data FROM chunks WHERE id = ?", (chunk_id,)).fetchone()
                yield codec, *decode_columns(bytes(blob), names)
            except (RecordingError, sqlite3.Error, TypeError):
                self.skipped_chunks += 1

    def judged_by(self, config=None) -> bool:
        """Were its recorded alerts made by these rules (this version, ``config`` or the default
        thresholds)? Then they can stand for re-running the rules; an older file says nothing."""
        from traintop.rules import DEFAULT, RULES_VERSION

        try:
            meta = json.loads(self.meta.get("rules", "null"))
        except ValueError:
            return False
        return isinstance(meta, dict) and meta.get("version") == RULES_VERSION \
            and meta.get("thresholds") == asdict(config or DEFAULT)

    def alerts(self) -> list[Alert]:
        out = []
        try:
            rows = self._db.execute("SELECT id, rule, subject, severity, title, start, end, evidence, remedies "
                                    "FROM alerts ORDER BY start").fetchall()
        except sqlite3.Error:
            return out
        for aid, rule, subject, sev, title, start, end, evidence, remedies in rows:
            try:
                rem = tuple(str(r) for r in json.loads(remedies))
                out.append(Alert(str(rule), str(title), str(subject), Severity.parse(str(sev)), float(start),
                                 str(evidence), rem, None if end is None else float(end), id=int(aid)))
            except (ValueError, TypeError, OverflowError):
                continue
        return out

    def close(self) -> None:
        self._db.close()
