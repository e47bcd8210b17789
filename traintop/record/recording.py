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
import dataclasses
import json
import os
import sqlite3
import time
import urllib.parse
from dataclasses import asdict
from typing import Iterator

from traintop import __version__
from traintop import plausible
from traintop.record.codec import (CODEC, CODECS, MAX_CHUNK_SAMPLES, columns_of, decode, decode_columns, decode_series, encode,
                            merge)
from traintop.errors import RecordingError, TraintopError
from traintop.record.evidence import Keeper, removed_error
from traintop.files import check_regular, open_regular
from traintop.findings import Finding, Severity
from traintop.text import one_line
from traintop.samples import Capture, Frame, GpuInfo, SessionInfo, StackDump, ThreadStack

FORMAT = "traintop-recording"
SCHEMA_VERSION = 3  # 3: a GPU process may carry its utilization; 2: chunks in cols3+zlib (v1, v2 still read)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS chunks(id INTEGER PRIMARY KEY, t0 REAL NOT NULL, t1 REAL NOT NULL,
                                  n INTEGER NOT NULL, codec TEXT NOT NULL, data BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS chunks_t0 ON chunks(t0);
CREATE TABLE IF NOT EXISTS alerts(id INTEGER PRIMARY KEY, rule TEXT NOT NULL, subject TEXT NOT NULL,
                                  severity TEXT NOT NULL, title TEXT NOT NULL, start REAL NOT NULL,
                                  end REAL, evidence TEXT NOT NULL, remedies TEXT NOT NULL, explained_by TEXT);
CREATE TABLE IF NOT EXISTS stacks(id INTEGER PRIMARY KEY, t REAL NOT NULL, pid INTEGER NOT NULL, rank INTEGER,
                                  reason TEXT NOT NULL, since_step REAL, threads TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS captures(id INTEGER PRIMARY KEY, t REAL NOT NULL, pid INTEGER NOT NULL, rank INTEGER,
                                    kind TEXT NOT NULL, path TEXT, size INTEGER, steps INTEGER,
                                    step_s_before REAL, step_s_after REAL, error TEXT, reason TEXT NOT NULL);
"""


def info_to_json(info: SessionInfo) -> str:
    return json.dumps(asdict(info))


def info_from_json(doc: str) -> SessionInfo:
    d = plausible.json_doc(doc, MAX_META_VALUE)
    if not isinstance(d, dict):
        raise ValueError("session is not an object")
    def num(v, bounds=(0, plausible.MAX_COUNT)):
        return plausible.number(v, bounds)

    def text(v):
        return v[:256] if isinstance(v, str) else None

    gpus = []
    raw_gpus = d.get("gpus") or []
    if not isinstance(raw_gpus, list):
        raise ValueError("bad gpu list")
    for g in raw_gpus:
        if not isinstance(g, dict) or plausible.number(g.get("index"), (0, plausible.MAX_GPUS - 1)) is None \
                or not isinstance(g["index"], int):
            raise ValueError("bad gpu entry")
        r = plausible.GPU
        gpus.append(GpuInfo(index=g["index"], name=text(g.get("name")) or "GPU", uuid=text(g.get("uuid")),
                            mem_total=num(g.get("mem_total"), r["mem_total"]),
                            power_limit_w=num(g.get("power_limit_w"), r["power_limit_w"]),
                            temp_slowdown_c=num(g.get("temp_slowdown_c"), r["temp_slowdown_c"]),
                            sm_clock_max=num(g.get("sm_clock_max"), r["sm_clock_max"]),
                            mem_clock_max=num(g.get("mem_clock_max"), r["mem_clock_max"]),
                            pcie_gen_max=num(g.get("pcie_gen_max"), r["pcie_gen_max"]),
                            pcie_width_max=num(g.get("pcie_width_max"), r["pcie_width_max"]),
                            pci_bus_id=text(g.get("pci_bus_id")),
                            minor=num(g.get("minor"), (0, 1 << 20)) if type(g.get("minor")) is int else None,
                            **_mig_fields(g)))
    if len(gpus) > plausible.MAX_GPUS:
        raise ValueError("too many GPUs")
    interval = d.get("interval", 0.5)
    if not isinstance(interval, (int, float)) or not 0 < interval < 3600:
        raise ValueError("bad interval")
    extra = d.get("extra")
    # what a writer puts there: a few facts (the source of an import, the demo's phases), bounded
    # with the session itself
    extra = {k[:64]: v for k, v in list(extra.items())[:64] if isinstance(k, str)} if isinstance(extra, dict) else {}
    return SessionInfo(kind=text(d.get("kind")) or "replay", gpus=tuple(gpus), driver=text(d.get("driver")),
                       cuda_driver=text(d.get("cuda_driver")), hostname=text(d.get("hostname")),
                       interval=float(interval), label=text(d.get("label")) or "", extra=extra)


def _mig_fields(g: dict) -> dict:
    """MIG and NVLink facts of a GPU entry (absent in files written before them: None)."""
    def small(v, hi):
        return v if type(v) is int and 0 <= v <= hi else None

    def flag(v):
        return v if type(v) is bool else None

    profile = g.get("mig_profile")
    return {"mig": flag(g.get("mig")), "nvlinks": small(g.get("nvlinks"), 1024),
            "parent": small(g.get("parent"), plausible.MAX_GPUS - 1),
            "mig_profile": one_line(profile, 32) if isinstance(profile, str) else None,
            "gi_id": small(g.get("gi_id"), 1 << 16), "ci_id": small(g.get("ci_id"), 1 << 16)}


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


# Samples a merged chunk holds. A seek rebuilds two minutes of history and parses every chunk
# they touch whole (JSON has no partial parse): 300 samples (2.5 min at the default 0.5 s)
# halve the worst case of 600 for 5 % more bytes.
CHUNK_FRAMES = 300
WRITER_CACHE_KIB = 256


class RecordingWriter:
    def __init__(self, path: str, info: SessionInfo, *, chunk_frames: int = CHUNK_FRAMES,
                 flush_every: float = 1.0, overwrite: bool = False, clock=time.monotonic) -> None:
        self.path = path
        if not 1 <= chunk_frames <= MAX_CHUNK_SAMPLES // 2:
            raise ValueError(f"chunk_frames must be 1..{MAX_CHUNK_SAMPLES // 2}")  # what the reader accepts
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
            # The writer appends and reads back only the chunks it merges: SQLite's default page
            # cache (2 MiB) would fill with pages it never reads again, in a recorder's RSS.
            self._db.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")
            self._db.executescript(_SCHEMA)
            with self._tx():
                meta = {"format": FORMAT, "schema_version": str(SCHEMA_VERSION), "app_version": __version__,
                        "created": str(time.time()), "recorded_on": os.uname().nodename,
                        "session": info_to_json(info)}
                self._db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", meta.items())
        except OSError as e:
            raise RecordingError(f"cannot create {path}: {e.strerror or e}") from None
        except sqlite3.Error as e:
            raise RecordingError(f"cannot create {path}: {e}") from None
        self._small_ids: list[int] = []  # committed small chunks not yet merged (merged from their bytes)
        self._small_n = 0  # their samples
        self._small_t0: float | None = None
        self._small_t1: float | None = None
        self._buf: list[Frame] = []  # not yet committed
        self._dirty_alerts: dict[int, Finding] = {}
        self._stacks: list[StackDump] = []  # not yet committed
        self._captures: list[Capture] = []  # not yet committed
        self._keeper: Keeper | None = None  # copies captures beside the recording, made at the first
        self._copying: dict[tuple[int, str], float | None] = {}  # (pid, kind) being copied -> its step time after
        self._removed: list[str] = []  # copies removed for the folder's budget, their rows not yet updated
        self.on_captures = None  # called with the captures kept (or not) and the paths removed, as they are
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
        self._stacks.extend(frame.stacks)
        for c in frame.captures:
            self._take_capture(c)
        if len(self._buf) >= self.chunk_frames or self._clock() - self._last_flush >= self.flush_every:
            self.flush()

    def alert(self, alert: Finding) -> None:
        self._dirty_alerts[alert.id] = alert
        if self._clock() - self._last_flush >= self.flush_every:
            self.flush()

    def _take_capture(self, c: Capture) -> None:
        """A capture's file is copied beside the recording off this thread; its row is written once
        the copy is done (with the new path, or why it was not kept)."""
        key = (c.pid, c.kind)
        if c.follow_up and key in self._copying:
            self._copying[key] = c.step_s_after
        elif not c.follow_up and c.path is not None and not c.error:
            if self._keeper is None:
                self._keeper = Keeper(self.path)
            self._copying[key] = None
            self._keeper.submit(c)
        else:
            self._captures.append(c)

    def _kept_captures(self) -> None:
        if self._keeper is None:
            return
        done, removed = self._keeper.take()
        for c in done:
            after = self._copying.pop((c.pid, c.kind), None)
            self._captures.append(dataclasses.replace(c, step_s_after=after) if after is not None else c)
        self._removed.extend(removed)
        if (done or removed) and self.on_captures is not None:
            self.on_captures(done, removed, self._removed_why())

    def _removed_why(self) -> str:
        return removed_error(self._keeper.folder, self._keeper.budget) if self._keeper is not None else ""

    @staticmethod
    def _row(frames: list[Frame]) -> tuple:
        return (frames[0].t, frames[-1].t, len(frames), CODEC, encode(frames))

    def flush(self, final: bool = False) -> None:
        """Commit new samples and changed alerts. Raises RecordingError (disk full, ...)."""
        if self.closed:
            return
        self._kept_captures()
        pending = self._small_n + len(self._buf)
        merging = pending >= self.chunk_frames or (final and len(self._small_ids) + bool(self._buf) > 1)
        try:
            with self._tx():
                if merging:
                    blobs = [bytes(self._db.execute("SELECT data FROM chunks WHERE id=?", (i,)).fetchone()[0])
                             for i in self._small_ids]
                    if self._buf:
                        blobs.append(encode(self._buf))
                    t0 = self._small_t0 if self._small_ids else self._buf[0].t
                    t1 = self._buf[-1].t if self._buf else self._small_t1
                    self._db.execute("INSERT INTO chunks(t0, t1, n, codec, data) VALUES (?,?,?,?,?)",
                                     (t0, t1, pending, CODEC, merge(blobs)))
                    self._db.executemany("DELETE FROM chunks WHERE id=?", [(i,) for i in self._small_ids])
                elif self._buf:
                    cur = self._db.execute("INSERT INTO chunks(t0, t1, n, codec, data) VALUES (?,?,?,?,?)",
                                           self._row(self._buf))
                    new_id = cur.lastrowid
                    assert new_id is not None  # set by the INSERT that just ran
                for a in self._dirty_alerts.values():
                    self._db.execute(
                        "INSERT OR REPLACE INTO alerts(id, rule, subject, severity, title, start, end, evidence, "
                        "remedies, explained_by) VALUES (?,?,?,?,?,?,?,?,?,?)",
                        (a.id, a.rule, a.subject, a.severity.label, a.title, a.start, a.end, a.evidence,
                         json.dumps(list(a.remedies)), a.explained_by))
                self._db.executemany(
                    "INSERT INTO stacks(t, pid, rank, reason, since_step, threads) VALUES (?,?,?,?,?,?)",
                    [(d.t, d.pid, d.rank, d.reason, d.since_step,
                      json.dumps([[th.name, th.main, th.stack] for th in d.threads])) for d in self._stacks])
                for c in self._captures:
                    if c.follow_up:
                        self._db.execute("UPDATE captures SET step_s_after=? WHERE pid=? AND kind=? AND "
                                         "step_s_after IS NULL", (c.step_s_after, c.pid, c.kind))
                    else:
                        self._db.execute(
                            "INSERT INTO captures(t, pid, rank, kind, path, size, steps, step_s_before, step_s_after, "
                            "error, reason) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                            (c.t, c.pid, c.rank, c.kind, c.path, c.size, c.steps, c.step_s_before, c.step_s_after,
                             c.error, c.reason))
                if self._removed:
                    why = self._removed_why()
                    self._db.executemany("UPDATE captures SET error=? WHERE path=? AND error IS NULL",
                                         [(why, p) for p in self._removed])
        except sqlite3.Error as e:
            raise RecordingError(f"writing {self.path} failed: {e}") from None
        if merging:
            self._small_ids, self._small_n, self._small_t0 = [], 0, None
        elif self._buf:
            if not self._small_ids:
                self._small_t0 = self._buf[0].t
            self._small_ids.append(new_id)
            self._small_n += len(self._buf)
            self._small_t1 = self._buf[-1].t
        self._buf = []
        self._dirty_alerts.clear()
        self._stacks = []
        self._captures = []
        self._removed = []
        self._last_flush = self._clock()

    def close(self) -> None:
        """Write what is left and leave one self-contained file. Raises RecordingError when that fails
        (a full disk): a recording that lost samples is never a success."""
        if self.closed:
            return
        failed: sqlite3.Error | None = None
        try:
            if self._keeper is not None:
                self._keeper.close()
            self.flush(final=True)
            try:
                self._db.executescript("PRAGMA incremental_vacuum;")  # runs to completion (execute frees one page)
                # Leave one self-contained file behind (no -wal/-shm beside it).
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                self._db.execute("PRAGMA journal_mode=DELETE")
            except sqlite3.Error as e:
                failed = e  # said below where samples are left outside the file (a reader holding it is no failure)
        finally:
            self._db.close()
            self.closed = True
        wal = self.path + "-wal"
        if failed is not None and os.path.exists(wal) and os.path.getsize(wal):
            raise RecordingError(f"finishing {self.path} failed ({failed}): its newest samples are still in {wal}; "
                                 "keep that file beside it")


# SQLite limits for a file someone else may have written: the schema of ours is a few short
# statements; nothing else is needed to read it.
_SQLITE_LIMITS = {
    "SQLITE_LIMIT_LENGTH": 64 * 1024 * 1024,  # a string or blob (a chunk is far smaller)
    "SQLITE_LIMIT_SQL_LENGTH": 100_000,
    "SQLITE_LIMIT_COLUMN": 64,
    "SQLITE_LIMIT_EXPR_DEPTH": 64,
    "SQLITE_LIMIT_COMPOUND_SELECT": 4,
    "SQLITE_LIMIT_FUNCTION_ARG": 8,
    "SQLITE_LIMIT_ATTACHED": 0,
    "SQLITE_LIMIT_LIKE_PATTERN_LENGTH": 100,
    "SQLITE_LIMIT_VARIABLE_NUMBER": 16,
    "SQLITE_LIMIT_TRIGGER_DEPTH": 1,
    "SQLITE_LIMIT_WORKER_THREADS": 0,
}
# Every query gets at most this many SQLite VM steps and seconds: listing a week's chunks
# takes well under a million steps.
QUERY_STEPS = 200_000_000
QUERY_SECONDS = 30.0
_STEP_BATCH = 10_000
# The tables read and the columns each must have (a view, a virtual table or a table without
# them is not a traintop recording, whatever it is called).
_TABLES = {
    "meta": ("key", "value"),
    "chunks": ("id", "t0", "t1", "n", "codec", "data"),
    "alerts": ("id", "rule", "subject", "severity", "title", "start", "end", "evidence", "remedies"),
}
MAX_META_ROWS = 1000
# A damaged file's chunk list is read by rowid ranges (``_salvaged_rows``), a batch at a time, a
# row at a time near the damage; at most this many rows and queries (a week of chunks: ~2 500).
SALVAGE_BATCH = 256
MAX_SALVAGED_ROWS = 1_000_000
# What one recording may hold at most (as an nvidia-smi log: importers.MAX_ROWS): each sample read
# costs analyze the rules' time, and a chunk of 10 000 unchanging samples takes ~200 bytes, so a
# 150 KB file claimed 11 million samples (hours of analyze). Chunks: as a damaged file's list.
MAX_SAMPLES = 10_000_000  # 58 days at 2 samples a second
MAX_CHUNK_ROWS = MAX_SALVAGED_ROWS
MAX_SALVAGE_QUERIES = 20_000
MAX_META_VALUE = 1 << 20  # a session's metadata is a few kB
MAX_ALERTS = 100_000
MAX_CAPTURES = 1000
MAX_STACK_DUMPS = 10_000  # the newest are read
# what one row may hold, cut in SQL before a byte of more reaches Python: an alert's texts (the
# writer's are sentences), its remedies as JSON (at most 64 lines), a dump's threads as JSON (what
# one probe message of at most 1 MiB can carry, escaped again)
ALERT_TEXT = 16 * 1024
ALERT_REMEDIES = 64 * 1024
STACK_JSON = 4 << 20
# what all alerts, or all stack dumps, of a file may hold together. Past it the other dumps are
# left out; and the alerts, incomplete, cannot stand for the rules: they are run again.
ALERT_BUDGET = 64 << 20  # about 40 000 alerts as the writer makes them
STACK_BUDGET = 256 << 20


def _cut_short(path: str) -> tuple[int, int] | None:
    """(its bytes, the bytes its SQLite header says) where the file is shorter than that."""
    try:
        with open_regular(path, "recording", RecordingError) as fh:
            head = fh.read(100)
            size = os.fstat(fh.fileno()).st_size
    except (OSError, RecordingError):
        return None
    if len(head) < 100:
        return None
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(head[28:32], "big")
    return (size, page * pages) if 0 < size < page * pages else None


def _ms(t: float) -> float:
    """A time as a chunk stores its samples' times (codec: integer milliseconds)."""
    return round(t * 1000) / 1000.0


def readonly_uri(path: str) -> str:
    """An SQLite URI that opens exactly ``path``, read-only: '#', '?' and '%' in a name are
    quoted (unquoted, ``run#1.ttrec`` opened ``run`` read-write-create, and a FIFO named
    ``pipe#x`` got past the regular-file check made on the whole name)."""
    return "file:" + urllib.parse.quote(os.path.abspath(path), safe="/") + "?mode=ro"


class RecordingReader:
    """Reads a recording written by RecordingWriter (also one cut short by SIGKILL).

    The file is untrusted: only a regular file is opened; only real tables with the expected
    columns are read; SQLite runs with tight limits and every query with a step and time
    budget; every chunk is checked against what the writer can produce before it is decoded."""

    def __init__(self, path: str) -> None:
        self.path = path
        st = check_regular(path, "recording", RecordingError)
        if st.st_size == 0:
            raise RecordingError(f"{path} is empty: not a traintop recording")
        with open_regular(path, "recording", RecordingError) as fh:
            if fh.read(16) != b"SQLite format 3\x00":
                raise RecordingError(f"{path} is not a traintop recording (not an SQLite file)")
        self._deadline = 0.0
        self._steps = 0
        self._interrupted = False
        try:
            self._db = sqlite3.connect(readonly_uri(path), uri=True, check_same_thread=False)
        except sqlite3.Error as e:
            raise RecordingError(f"{path} is damaged or not a traintop recording ({e})") from None
        try:
            self._open()
        except BaseException:
            self._db.close()
            raise

    def _open(self) -> None:
        path = self.path
        self.cut: tuple[int, int] | None = None  # (bytes, bytes its header says) of a file cut short
        self.salvaged = False  # SQLite refused the file whole: what it can still read was read chunk by chunk
        self.lost_rows = False  # ... and the salvage stopped at its limits
        self.damage: str | None = None
        self._damaged_ids: set[int] = set()  # chunks whose samples could not be read
        try:
            self._harden()
            try:
                self._has_alerts = self._check_schema()
            except sqlite3.DatabaseError as e:
                if self._interrupted:
                    raise
                self._salvage_mode(e)
                self._has_alerts = self._check_schema()
            # a value longer than any we read is cut (then refused where it matters: the session)
            rows = self._query(f"SELECT {_cut('key', 256)}, {_cut('value', MAX_META_VALUE + 1)} FROM meta "
                               f"LIMIT {MAX_META_ROWS}")
            meta = {str(k): str(v) for k, v in rows}
        except (sqlite3.Error, ValueError, TypeError) as e:
            raise self._error(e) from None
        if meta.get("format") != FORMAT:
            raise RecordingError(f"{path} is an SQLite file but not a traintop recording")
        text = meta.get("schema_version", "")
        if not (text.isascii() and text.isdigit() and len(text) <= 6):
            raise RecordingError(f"{path} has no valid schema version")
        version = int(text)
        if version > SCHEMA_VERSION:
            raise RecordingError(f"{path} was written by a newer traintop (format v{version}; "
                                 f"this one reads up to v{SCHEMA_VERSION}): upgrade traintop")
        if version < 1:
            raise RecordingError(f"{path} has an unknown format version {version}")
        try:
            if len(meta["session"]) > MAX_META_VALUE:
                raise ValueError("too long")
            self.info = info_from_json(meta["session"])
        except (KeyError, ValueError, TypeError, OverflowError) as e:
            raise RecordingError(f"{path} has damaged session metadata ({type(e).__name__})") from None
        self.meta = meta
        try:
            rows = self._query(f"SELECT id, t0, t1, n, codec FROM chunks ORDER BY t0, id LIMIT {MAX_CHUNK_ROWS + 1}")
        except sqlite3.DatabaseError as e:
            if self._interrupted:
                raise self._error(e) from None
            try:
                self._salvage_mode(e)
                rows = sorted(self._salvaged_rows(), key=lambda r: (r[1], r[0]) if plausible.time_ok(r[1]) else (0, 0))
            except sqlite3.Error as e2:
                raise self._error(e2) from None
        # a chunk's first and last times to the millisecond, as its samples' times are stored: the
        # writer keeps them exact, and a replay opened at the exact first time lost the first sample
        self._chunks = [(r[0], _ms(r[1]), _ms(r[2]), r[3], r[4]) for r in rows
                        if type(r[0]) is int and plausible.time_ok(r[1]) and plausible.time_ok(r[2])
                        and type(r[3]) is int and 0 <= r[3] <= MAX_CHUNK_SAMPLES and r[1] <= r[2]]
        samples = sum(r[3] for r in self._chunks)
        if len(rows) > MAX_CHUNK_ROWS or samples > MAX_SAMPLES:
            held = f"more than {MAX_CHUNK_ROWS:,} chunks" if len(rows) > MAX_CHUNK_ROWS else f"{samples:,} samples"
            self._db.close()
            raise RecordingError(f"{self.path} holds {held}: more than traintop reads from one recording "
                                 f"({MAX_SAMPLES:,} samples in at most {MAX_CHUNK_ROWS:,} chunks)")
        self._t0s = [r[1] for r in self._chunks]
        # rows no writer makes; in a file SQLite refused whole, rows read from damaged pages are no
        # chunks at all (a cut file's garbage reads as thousands of them): only those that look like one count
        self.skipped_chunks = 0 if self.salvaged else len(rows) - len(self._chunks)
        # why the first damaged chunk could not be read (said when nothing could be)
        self.damage = "a chunk's times or sample count are implausible" if self.skipped_chunks else self.damage
        self.chunk_total = len(self._chunks) if self.salvaged else len(rows)
        self._cache: dict[int, list[Frame]] = {}
        self._alerts: list[Finding] | None = None
        self._alerts_whole = True  # every alert row was read (none left out past ALERT_BUDGET)
        if self.salvaged:
            self._find_unreadable_chunks()

    def _find_unreadable_chunks(self) -> None:
        """In a damaged file, the chunks whose bytes SQLite cannot read (their last byte is reached
        through every page of them): counted now, so what is lost is known before anything plays."""
        for cid, *_ in self._chunks:
            try:
                self._query("SELECT substr(data, -1, 1) FROM chunks WHERE id = ?", (cid,))
            except sqlite3.DatabaseError as e:
                if self._interrupted:
                    raise
                self._damaged(e, cid)

    # -- a damaged file: what SQLite can still read ----------------------------
    def _salvage_mode(self, e: Exception) -> None:
        """SQLite refused the file whole (``e``): read it again, part by part. A file shorter than its
        header says (cut short) is refused whole unless the schema is "writable"; this connection stays
        read-only and query-only, and each part read is checked as ever."""
        self.salvaged = True
        self.damage = self.damage or str(e)
        self.cut = _cut_short(self.path)
        self._query("PRAGMA writable_schema=ON")

    def _try(self, sql: str, args: tuple) -> list | None:
        """``sql``'s rows, or None where a page it needs cannot be read."""
        try:
            return self._query(sql, args)
        except sqlite3.DatabaseError:
            if self._interrupted:
                raise
            return None

    def _salvaged_rows(self) -> list:
        """The chunk list of a damaged file, by rowid: every row SQLite can read, past the pages it
        cannot (a few hundred queries at most for each run of them)."""
        first = "SELECT id, t0, t1, n, codec FROM chunks NOT INDEXED WHERE id > ? ORDER BY id LIMIT ?"
        rows: list = []
        after, batch, queries = -(1 << 63), SALVAGE_BATCH, 0
        while len(rows) < MAX_SALVAGED_ROWS and queries < MAX_SALVAGE_QUERIES:
            queries += 1
            got = self._try(first, (after, batch))
            if got is None and batch > 1:
                batch = 1  # near the damage: a row at a time
                continue
            if got is None:
                before = after
                after, skipped = self._past_unreadable(after)
                queries += skipped
                if after is None or after <= before:  # no way past the damage: each row once, never again
                    break
                again = self._try("SELECT id, t0, t1, n, codec FROM chunks NOT INDEXED WHERE id = ?", (after,))
                rows.extend(again or ())
                continue
            if not got:
                break
            rows.extend(got)
            after, batch = got[-1][0], min(SALVAGE_BATCH, batch * 4)
            if type(after) is not int:
                break
        self.lost_rows = queries >= MAX_SALVAGE_QUERIES or len(rows) >= MAX_SALVAGED_ROWS
        once: dict = {}
        for row in rows:  # a row read again past a damaged page is one chunk
            once.setdefault(row[0], row)
        return list(once.values())

    def _past_unreadable(self, after: int) -> tuple[int | None, int]:
        """The smallest rowid past ``after`` from which the table reads again (None: nowhere), and the
        queries that took: doubling steps, then halving back between the last that failed and the first
        that did not."""
        sql = "SELECT id FROM chunks NOT INDEXED WHERE id > ? ORDER BY id LIMIT 1"
        lo, step, queries = after, 1, 0
        while True:
            hi = after + step
            if hi >= (1 << 63) - 1:
                return None, queries
            queries += 1
            if self._try(sql, (hi,)) is not None:
                break
            lo, step = hi, step * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            queries += 1
            if self._try(sql, (mid,)) is None:
                lo = mid
            else:
                hi = mid
        return hi, queries

    def lost(self) -> list[tuple[float, float]]:
        """Spans of time whose samples could not be read: between two chunks read (a chunk lost
        between them) and inside a chunk whose samples are damaged."""
        spans = [(t0, t1) for cid, t0, t1, _, _ in self._chunks if cid in self._damaged_ids]
        gap = 2.5 * self.info.interval
        for (_, _, t1, _, _), (_, t0, _, _, _) in zip(self._chunks, self._chunks[1:]):
            if t0 - t1 > gap:
                spans.append((t1, t0))
        out: list[list[float]] = []
        for a, b in sorted(spans):
            if out and a - out[-1][1] <= gap:  # one span across neighbouring chunks
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
        return [(a, b) for a, b in out]

    # -- SQLite, hardened ------------------------------------------------------
    def _harden(self) -> None:
        db = self._db
        for name, value in _SQLITE_LIMITS.items():
            if hasattr(sqlite3, name) and hasattr(db, "setlimit"):
                db.setlimit(getattr(sqlite3, name), value)
        db.set_progress_handler(self._progress, _STEP_BATCH)
        # Text in a hostile file may not be UTF-8: never let decoding raise.
        db.text_factory = lambda b: b.decode("utf-8", "replace")
        for pragma in ("trusted_schema=OFF", "query_only=ON", "cell_size_check=ON", "mmap_size=0"):
            self._query(f"PRAGMA {pragma}")

    def _progress(self) -> int:
        self._steps += _STEP_BATCH
        if self._steps > QUERY_STEPS or time.monotonic() > self._deadline:
            self._interrupted = True
            return 1
        return 0

    def _query(self, sql: str, args: tuple = ()) -> list:
        return self._cursor(sql, args).fetchall()

    def _cursor(self, sql: str, args: tuple = ()) -> sqlite3.Cursor:
        """A query with its own budget (steps and seconds), its rows read as they are wanted."""
        self._steps, self._interrupted = 0, False
        self._deadline = time.monotonic() + QUERY_SECONDS
        return self._db.execute(sql, args)

    def _error(self, e: Exception) -> RecordingError:
        if self._interrupted:
            return RecordingError(f"{self.path}: a query ran past its limit ({QUERY_STEPS:,} steps or "
                                  f"{QUERY_SECONDS:g} s); not a traintop recording")
        return RecordingError(f"{self.path} is damaged or not a traintop recording ({e})")

    def _check_schema(self) -> bool:
        """Refuse views, virtual tables and tables without our columns; True if alerts can be read."""
        objects = {}
        for kind, name, sql in self._query("SELECT type, name, sql FROM sqlite_master"):
            objects[str(name)] = (str(kind), str(sql or ""))
        for name, columns in _TABLES.items():
            if name not in objects:
                if name == "alerts":
                    return False
                raise RecordingError(f"{self.path} is not a traintop recording (no {name} table)")
            kind, sql = objects[name]
            if kind != "table" or not sql.upper().lstrip().startswith("CREATE TABLE"):
                raise RecordingError(f"{self.path} is not a traintop recording ({name} is a {kind}, not a table)")
            have = {str(r[1]) for r in self._query(f"PRAGMA table_xinfo({name})") if r[6] == 0}
            missing = [c for c in columns if c not in have]
            if missing:
                raise RecordingError(f"{self.path} is not a traintop recording ({name} has no "
                                     f"{', '.join(missing)} column)")
        return True

    @property
    def t_start(self) -> float | None:
        return self._chunks[0][1] if self._chunks else None

    @property
    def t_end(self) -> float | None:
        return max(r[2] for r in self._chunks) if self._chunks else None

    @property
    def frame_count(self) -> int:
        return sum(int(r[3]) for r in self._chunks)

    def _decoded(self, chunk_id: int, codec: str, decoder, t_from: float | None, t_to: float | None):
        """``decoder`` (frames or series) over a chunk's blob; None where the chunk is damaged,
        which is counted: one damaged chunk must not lose the rest of the session."""
        try:
            rows = self._query("SELECT data FROM chunks WHERE id=?", (chunk_id,))
            row = rows[0] if rows else None
            if codec not in CODECS or row is None or not isinstance(row[0], bytes):
                raise RecordingError("unknown codec")
            return decoder(row[0], codec, t_from=t_from, t_to=t_to)
        except (RecordingError, sqlite3.Error, ValueError) as e:
            self._damaged(e, chunk_id)
            return None

    def _load(self, chunk_id: int, codec: str, t_from: float | None = None, t_to: float | None = None) -> list[Frame]:
        """A chunk's frames (cached), or only those in [t_from, t_to] (a seek into the middle
        of a chunk: not cached, and several times cheaper than the whole chunk)."""
        if chunk_id in self._cache:
            return self._cache[chunk_id]
        frames = self._decoded(chunk_id, codec, decode, t_from, t_to) or []
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

    def history(self, t_from: float, t_to: float) -> Iterator:
        """The samples in [t_from, t_to], chunk by chunk: a ``codec.SeriesWindow`` where the chunk
        is read for them, the frames where they are decoded already (a chunk being played)."""
        start = max(0, bisect.bisect_right(self._t0s, t_from) - 1)
        for cid, t0, t1, n, codec in self._chunks[start:]:
            if t0 > t_to:
                break
            if t1 < t_from:
                continue
            if cid in self._cache:
                frames = [f for f in self._cache[cid] if t_from <= f.t <= t_to]
                if frames:
                    yield frames
                continue
            window = self._decoded(cid, codec, decode_series, t_from if t0 < t_from else None,
                                   t_to if t1 > t_to else None)
            if window is not None:
                yield window

    def chunk_ids(self) -> list[int]:
        return [int(r[0]) for r in self._chunks]

    def columns(self, names: list[str], ids: list[int] | None = None) -> Iterator[tuple[str, list[float], dict[str, list]]]:
        """Chunk by chunk (all, or the chunks ``ids`` in time order): its codec, times and the raw
        columns ``names`` (see codec.decode_columns). A chunk the fast path cannot read goes
        through the full decoder; one neither can read is skipped and counted."""
        rows = [(r[0], r[4]) for r in self._chunks]
        if ids is not None:
            wanted = set(ids)
            rows = [r for r in rows if r[0] in wanted]
        for chunk_id, codec in rows:
            if codec not in CODECS:
                self._damaged(RecordingError(f"unknown codec {codec!r}"))
                continue
            try:
                (blob,) = self._query("SELECT data FROM chunks WHERE id = ?", (chunk_id,))[0]
                blob = bytes(blob)
            except (sqlite3.Error, TypeError, IndexError, ValueError) as e:
                self._damaged(e, chunk_id)
                continue
            try:
                got = decode_columns(blob, names, codec)
            except RecordingError:
                try:
                    got = columns_of(decode(blob, codec), names, codec)
                except RecordingError as e:
                    self._damaged(e, chunk_id)
                    continue
            yield codec, *got

    def _damaged(self, e: Exception, chunk_id: int | None = None) -> None:
        if chunk_id is not None:
            if chunk_id in self._damaged_ids:  # counted once, however often it is read
                return
            self._damaged_ids.add(chunk_id)
        self.skipped_chunks += 1
        self.damage = self.damage or str(e)

    def judged_by(self, config=None) -> bool:
        """Were its recorded alerts made by these rules (this version, ``config`` or the default
        thresholds), and can all be read? Then they can stand for re-running the rules; an older file
        says nothing, nor does a damaged one (its alerts may be lost with the rest, or cover what was lost)."""
        from traintop.rules import DEFAULT, RULES_VERSION
        from traintop.rules.config import host_values

        if self.salvaged:
            return False
        try:
            meta = plausible.json_doc(self.meta.get("rules", "null"), MAX_META_VALUE)
        except ValueError:
            return False
        return isinstance(meta, dict) and meta.get("version") == RULES_VERSION \
            and meta.get("thresholds") == host_values(config or DEFAULT) and self._all_alerts_read()

    def _all_alerts_read(self) -> bool:
        self.alerts()
        return self._alerts_whole

    def alerts(self) -> list[Finding]:
        if self._alerts is None:
            self._alerts = self._read_alerts()
        return list(self._alerts)

    def _read_alerts(self) -> list[Finding]:
        out: list[Finding] = []
        try:
            if not self._has_alerts:
                return out
            # explained_by came with version 8 of the rules: older files have no such column
            have = {str(r[1]) for r in self._query("PRAGMA table_xinfo(alerts)")}
            explained = "explained_by" if "explained_by" in have else "NULL"
            cut = ", ".join(_cut(c, ALERT_TEXT) for c in ("rule", "subject", "severity", "title"))
            rows = self._cursor(
                f"SELECT id, {cut}, start, end, {_cut('evidence', ALERT_TEXT)}, "
                f"CASE WHEN {_bytes('remedies')} <= {ALERT_REMEDIES} THEN remedies END, {_cut(explained, 1024)} "
                f"FROM alerts ORDER BY start LIMIT {MAX_ALERTS}")
            budget = ALERT_BUDGET
            for aid, rule, subject, sev, title, start, end, evidence, remedies, by in rows:
                budget -= sum(len(v) for v in (rule, subject, sev, title, evidence, remedies, by) if isinstance(v, str))
                if budget < 0:
                    self._alerts_whole = False
                    break
                alert = _alert(aid, rule, subject, sev, title, start, end, evidence, remedies, by)
                if alert is not None:
                    out.append(alert)
        except sqlite3.Error:
            pass
        return out

    def has_ledger(self) -> bool:
        """Whether a probe with the time ledger reported (judged from the first chunks with probe data)."""
        for f in self.frames():
            for r in f.ranks:
                if r.time_train is not None or r.time_startup is not None:
                    return True
            if f.t - (self.t_start or f.t) > 120:
                return False
        return False

    def captures(self) -> list[Capture]:
        """The evidence captured during the session (none in recordings made before captures existed)."""
        try:
            rows = self._cursor(f"SELECT t, pid, rank, {_cut('kind', 16)}, {_cut('path', 4096)}, size, steps, "
                                f"step_s_before, step_s_after, {_cut('error', 1024)}, {_cut('reason', 1024)} "
                                f"FROM captures ORDER BY t, id LIMIT {MAX_CAPTURES}").fetchall()
        except sqlite3.Error:
            return []
        out = []
        for t, pid, rank, kind, path, size, steps, before, after, error, reason in rows:
            if not plausible.time_ok(t) or _int(pid, plausible.PID) is None or kind not in ("trace", "memory"):
                continue  # a damaged or forged row: left out, the others kept
            out.append(Capture(t=float(t), pid=pid, kind=kind, rank=_int(rank, plausible.RANK["rank"]),
                               path=one_line(path, 4096) if isinstance(path, str) else None,
                               size=_int(size, (0, plausible.TiB)), steps=_int(steps, (0, 1000)),
                               step_s_before=_seconds(before), step_s_after=_seconds(after),
                               error=one_line(error, 200) if isinstance(error, str) else None,
                               reason=one_line(reason, 200) if isinstance(reason, str) else ""))
        return out

    def stacks(self) -> list[StackDump]:
        """The thread stacks the job's probes sent (none in recordings made before they existed)."""
        out: list[StackDump] = []
        try:  # the newest first: within the limits, those are the ones a reader wants
            rows = self._cursor(f"SELECT t, pid, rank, {_cut('reason', 16)}, since_step, "
                                f"CASE WHEN {_bytes('threads')} <= {STACK_JSON} THEN threads END "
                                f"FROM stacks ORDER BY t DESC, id DESC LIMIT {MAX_STACK_DUMPS}")
            budget = STACK_BUDGET
            for t, pid, rank, reason, since, threads in rows:
                budget -= len(threads) if isinstance(threads, str) else 0
                if budget < 0:
                    break
                dump = _stack_dump(t, pid, rank, reason, since, threads)
                if dump is not None:  # one damaged row must not hide the others
                    out.append(dump)
        except sqlite3.Error:
            pass
        out.reverse()
        return out

    def close(self) -> None:
        self._db.close()


def _bytes(column: str) -> str:
    """SQL: a value's length in bytes (SQLite's length() of text stops at a NUL)."""
    return f"length(CAST({column} AS BLOB))"


def _cut(column: str, most: int) -> str:
    """SQL: a text value whole when it is short, else its first ``most`` characters (substr()
    stops at a NUL: a short value, which may hold one, is never passed through it)."""
    return f"CASE WHEN {_bytes(column)} <= {most} THEN {column} ELSE substr({column}, 1, {most}) END"


def _int(v, bounds) -> int | None:
    return v if type(v) is int and bounds[0] <= v <= bounds[1] else None


def _seconds(v) -> float | None:
    return float(v) if plausible.number(v, (0.0, 1e5)) is not None else None


def _alert(aid, rule, subject, sev, title, start, end, evidence, remedies, by) -> Finding | None:
    """An alert row as a Finding, or None where any field is not what the writer stores."""
    if type(aid) is not int or not all(isinstance(v, str) for v in (rule, subject, sev, title, evidence, remedies)):
        return None
    if not plausible.time_ok(start) or not (end is None or plausible.time_ok(end)):
        return None
    try:
        rem = plausible.json_doc(remedies, ALERT_REMEDIES)
        severity = Severity.parse(sev)
    except (ValueError, TraintopError):
        return None
    if not isinstance(rem, list) or len(rem) > 64 or not all(isinstance(r, str) for r in rem):
        return None
    return Finding(rule, title, subject, severity, float(start), None if end is None else float(end), evidence,
                   tuple(rem), id=aid, explained_by=None if by is None else one_line(str(by), 200))


def _stack_dump(t, pid, rank, reason, since, threads) -> StackDump | None:
    """A stacks row as a StackDump (its threads as the probe's reader keeps them), or None where a
    field is not what the writer stores."""
    if not plausible.time_ok(t) or _int(pid, plausible.PID) is None or not isinstance(threads, str):
        return None
    try:
        items = plausible.json_doc(threads, STACK_JSON)
    except ValueError:
        return None
    if not isinstance(items, list) or len(items) > plausible.MAX_THREADS:
        return None
    ths = []
    for item in items:
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) and isinstance(item[2], str)):
            return None
        name, main, stack = item
        ths.append(ThreadStack(name[:plausible.MAX_NAME], main is True, stack[-plausible.MAX_STACK_CHARS:]))
    return StackDump(t=float(t), pid=pid, rank=_int(rank, plausible.RANK["rank"]),
                     reason=reason if reason in ("stalled", "pause") else "requested",
                     since_step=float(since) if plausible.number(since, plausible.RANK["step_time"]) is not None
                     else None, threads=tuple(ths))
