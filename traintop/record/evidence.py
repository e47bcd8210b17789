"""Evidence captured when a finding starts: which finding asks for what, and the files kept.

When a finding of CAPTURE_ON starts in a live session with the probe, traintop asks the job's
probe (traintop/injob/capture.py) for a profiler trace of a few steps or a CUDA memory snapshot,
once per finding; the probe itself allows one of each kind per 10 minutes. A recording keeps a
copy of each file beside it (``RUN.ttrec.captures/``) and lists it; ``analyze`` names the viewer.

The copy is the ``Keeper``'s, on a thread of its own: a file of hundreds of MB never holds up a
sample. Each copy is bounded (size, time, no sparse file, free space left for the recording) and
the folder is held to a budget, oldest out first; a folder that is not ours is never used.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import queue
import stat
import threading
import time

from traintop.injob.capture import CAPTURE_NAME, budget_bytes, disk_bytes, hold_budget
from traintop.samples import Capture
from traintop.units import fmt_bytes

CAPTURE_ON = {  # rule -> what to capture when its finding starts
    "starvation": "trace", "underuse": "trace", "straggler": "trace", "precision": "trace", "pause": "trace",
    "step_regression": "trace",
    "oom": "memory", "memory_creep": "memory", "fragmentation": "memory",
}
VIEWER = {
    "trace": "open in https://ui.perfetto.dev (or chrome://tracing; or `tensorboard --logdir` on its folder, "
             "with the torch-tb-profiler plugin)",
    "memory": "drop on https://pytorch.org/memory_viz",
}
MAX_BYTES = {"trace": 256 << 20, "memory": 1 << 30}
COPY_S = 60.0  # one copy's time, at most
# free space a copy must leave on the recording's disk: the recording's own samples come first
RESERVE_BYTES = 64 << 20
RESERVE_SHARE = 0.05
WAITING = 16  # captures waiting to be copied; one more is not kept (it stays where the probe wrote it)
REMOVED = "removed to hold"  # how a capture's error starts when the budget pushed it out


def captures_dir(recording: str) -> str:
    return recording + ".captures"


class NotKept(Exception):
    """A capture not copied beside the recording: the message says why (one line)."""


def folder_problem(st: os.stat_result, owner: int) -> str | None:
    """Why a folder of captures is not to be trusted (None when it is): a directory of ``owner`` that
    no one else can write. ``st`` from lstat or fstat: a symbolic link is not a directory."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != owner:
        return "belongs to another user"
    if st.st_mode & 0o022:
        return f"can be written by others (mode {oct(st.st_mode & 0o777)})"
    return None


def _has_holes(fd: int, size: int) -> bool:
    """A file with holes (a sparse file: its size is a claim, not data) — never a capture, which is
    written front to back. Where the file system cannot say, the size and time bounds still hold."""
    if size <= 0:
        return False
    try:
        return os.lseek(fd, 0, os.SEEK_HOLE) < size
    except OSError:
        return False
    finally:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
        except OSError:
            pass


class Keeper:
    """Copies captures into a recording's folder of captures, one at a time on its own thread.

    ``submit`` never waits; ``take`` hands back what is done (each capture with its new path, or
    with why it was not kept) and the paths removed to hold the folder to its budget."""

    def __init__(self, recording: str, budget: int | None = None, copy_s: float = COPY_S) -> None:
        self.folder = captures_dir(recording)
        self.budget = budget_bytes() if budget is None else budget
        self.copy_s = copy_s
        self.problem: str | None = None  # why the folder cannot be used (said for every capture)
        self._fd: int | None = None
        self._q: queue.Queue[Capture | None] = queue.Queue(WAITING)
        self._lock = threading.Lock()
        self._done: list[Capture] = []
        self._removed: list[str] = []
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._busy: Capture | None = None

    # -- the recorder's side -------------------------------------------------------
    def submit(self, cap: Capture) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="traintop-captures", daemon=True)
            self._thread.start()
        try:
            self._q.put_nowait(cap)
        except queue.Full:
            self._finish(self._not_kept(cap, f"{WAITING} captures were waiting to be copied"))

    def take(self) -> tuple[list[Capture], list[str]]:
        with self._lock:
            done, self._done = self._done, []
            removed, self._removed = self._removed, []
        return done, removed

    def close(self, timeout: float = 10.0) -> None:
        """Copy what is waiting for at most ``timeout`` seconds; then stop (a copy under way ends at
        its next MiB, what is left says it was not kept)."""
        if self._thread is not None:
            deadline = time.monotonic() + timeout
            try:
                self._q.put(None, timeout=timeout)
            except queue.Full:
                pass
            self._thread.join(max(0.0, deadline - time.monotonic()))
            self._closing.set()
            self._thread.join(1.0)
        self._closing.set()
        alive = self._thread is not None and self._thread.is_alive()
        with self._lock:
            left = [self._busy] if self._busy is not None and alive else []
            self._busy = None
        while True:
            try:
                c = self._q.get_nowait()
            except queue.Empty:
                break
            if c is not None:
                left.append(c)
        for c in left:
            self._finish(self._not_kept(c, "traintop stopped before it was copied"))
        if self._fd is not None and not alive:
            os.close(self._fd)
            self._fd = None

    # -- the copying thread --------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                cap = self._q.get(timeout=0.5)
            except queue.Empty:
                if self._closing.is_set():
                    return
                continue
            if cap is None:
                return
            if self._closing.is_set():
                self._finish(self._not_kept(cap, "traintop stopped before it was copied"))
                continue
            with self._lock:
                self._busy = cap
            try:
                kept = self.copy(cap)
            except NotKept as e:
                kept = self._not_kept(cap, str(e))
            except OSError as e:
                kept = self._not_kept(cap, e.strerror or str(e))
            with self._lock:
                if self._busy is cap:  # not given up by close meanwhile
                    self._busy = None
                    self._done.append(kept)

    def _finish(self, cap: Capture) -> None:
        with self._lock:
            self._done.append(cap)

    @staticmethod
    def _not_kept(cap: Capture, why: str) -> Capture:
        return dataclasses.replace(cap, error=f"not kept beside the recording ({why}); it is at {cap.path}")

    def copy(self, cap: Capture) -> Capture:
        """One capture copied now (the thread's work; tests call it directly). Raises NotKept."""
        if cap.path is None or cap.error:
            return cap
        name = os.path.basename(cap.path)
        if not CAPTURE_NAME.fullmatch(name):
            raise NotKept(f"{name} is not a capture's name")
        folder = self._folder()
        src = self._open_source(cap.path)
        try:
            st = os.fstat(src)
            if not stat.S_ISREG(st.st_mode):
                raise NotKept(f"{cap.path} is not a plain file")
            limit = MAX_BYTES.get(cap.kind, 0)
            if st.st_size > limit:
                raise NotKept(f"{cap.path} is larger than {limit >> 20} MiB")
            if _has_holes(src, st.st_size):
                raise NotKept(f"{cap.path} is sparse ({fmt_bytes(st.st_size)} long, {fmt_bytes(disk_bytes(st))} "
                              "on disk): not a capture")
            if st.st_size > self.budget:
                raise NotKept(f"it is larger than the folder's budget of {fmt_bytes(self.budget)}")
            self._check_room(folder, st.st_size)
            self._copy_file(src, folder, name, limit)
        finally:
            os.close(src)
        try:
            removed = hold_budget(folder, self.budget, name)
        except OSError:
            removed = []
        if removed:
            with self._lock:
                self._removed.extend(os.path.join(self.folder, n) for n in removed)
        return dataclasses.replace(cap, path=os.path.join(self.folder, name))

    def _folder(self) -> int:
        """The folder of captures, open: made 0700 by us, or one of ours that no one else can write.
        Checked again before every copy: the path must still name the folder we hold."""
        if self.problem:
            raise NotKept(self.problem)
        try:
            if self._fd is None:
                try:
                    os.mkdir(self.folder, 0o700)
                except FileExistsError:
                    pass
                problem = folder_problem(os.lstat(self.folder), os.geteuid())
                if problem is None:
                    fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
                    problem = folder_problem(os.fstat(fd), os.geteuid())
                    if problem is None:
                        self._fd = fd
                    else:
                        os.close(fd)
            else:
                held, named = os.fstat(self._fd), os.lstat(self.folder)
                problem = folder_problem(held, os.geteuid())
                if problem is None and (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino):
                    problem = "was replaced"
        except OSError as e:
            problem = f"cannot be used ({e.strerror or e})"
        if problem is not None or self._fd is None:
            self.problem = f"{self.folder} {problem}: no capture is kept there"
            raise NotKept(self.problem)
        return self._fd

    @staticmethod
    def _open_source(path: str) -> int:
        """The probe's file, through its folder: a folder no one else can write, the file a plain one
        of the folder's owner; never a symlink, never a wait (a FIFO)."""
        d = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            dst = os.fstat(d)
            if dst.st_mode & 0o022:
                raise NotKept(f"{os.path.dirname(path)} can be written by others")
            fd = os.open(os.path.basename(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=d)
        finally:
            os.close(d)
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_uid != dst.st_uid:
            os.close(fd)
            raise NotKept(f"{path} belongs to another user than its folder")
        return fd

    def _check_room(self, folder: int, size: int) -> None:
        fs = os.fstatvfs(folder)
        free = fs.f_bavail * fs.f_frsize
        reserve = max(RESERVE_BYTES, int(fs.f_blocks * fs.f_frsize * RESERVE_SHARE))
        if free - size < reserve:
            raise NotKept(f"{fmt_bytes(free)} free on the recording's disk: a copy of {fmt_bytes(size)} would "
                          f"leave less than the {fmt_bytes(reserve)} kept for the recording")

    def _copy_file(self, src: int, folder: int, name: str, limit: int) -> None:
        """Into a temp file of the folder, then linked under the capture's name (never over a file):
        a copy cut short (traintop killed) never looks like a capture."""
        tmp = f".{name}.{os.getpid()}.tmp"
        dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
        deadline = time.monotonic() + self.copy_s
        try:
            try:
                copied = 0
                while chunk := os.read(src, 1 << 20):
                    copied += len(chunk)
                    if copied > limit:
                        raise NotKept(f"it grew past {limit >> 20} MiB")
                    if self._closing.is_set():
                        raise NotKept("traintop stopped during its copy")
                    if time.monotonic() > deadline:
                        raise NotKept(f"its copy took longer than {self.copy_s:g} s")
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(dst, view):]
            finally:
                os.close(dst)
            try:
                os.link(tmp, name, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
            except FileExistsError:
                raise NotKept(f"a file named {name} is there already") from None
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV):
                    raise
                # no hard links here: claim the name exclusively, then move the copy onto it
                os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder))
                os.rename(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
        finally:
            try:
                os.unlink(tmp, dir_fd=folder)
            except FileNotFoundError:
                pass


def removed_error(folder: str, budget: int) -> str:
    return f"{REMOVED} {os.path.basename(folder)} to its budget of {fmt_bytes(budget)} (oldest out first)"


def short(cap: Capture) -> str:
    """A panel's line: 'trace on Data starvation: PATH (step time 25.0 ms before, 25.1 ms after it: +0.4 %)':
    what the capture cost the job's steps (a profiler can leave them slower)."""
    why = f" on {cap.reason}" if cap.reason else ""
    if cap.error and cap.error.startswith(REMOVED):
        return f"{cap.kind}{why}: {cap.error}: {cap.path}"
    if cap.error:
        return f"{cap.kind}{why} failed: {cap.error}"
    out = f"{cap.kind}{why}: {cap.path}"
    if cap.step_s_before and cap.step_s_after:
        out += (f" (step time {cap.step_s_before * 1000:.1f} ms before, {cap.step_s_after * 1000:.1f} ms after it: "
                f"{(cap.step_s_after / cap.step_s_before - 1) * 100:+.1f} %)")
    return out


def describe(cap: Capture) -> str:
    """One line: what was captured, why, where, and how the steps fared."""
    what = {"trace": "profiler trace", "memory": "memory snapshot"}.get(cap.kind, cap.kind)
    why = f" (on {cap.reason})" if cap.reason else ""
    if cap.error and cap.error.startswith(REMOVED):
        return f"{what}{why}: {cap.error}: {cap.path}"
    if cap.error:
        return f"{what}{why} failed: {cap.error}"
    line = f"{what}{why}: {cap.path} — {VIEWER.get(cap.kind, '')}"
    if cap.step_s_before and cap.step_s_after:
        change = (cap.step_s_after / cap.step_s_before - 1) * 100
        line += (f"; steps {cap.step_s_before * 1000:.1f} ms before, {cap.step_s_after * 1000:.1f} ms after "
                 f"({change:+.1f} %)")
    return line
