"""Reading another process's files: what ``/proc/PID`` holds, and what lies in its file system
(``/proc/PID/root/...``), for an agent that may run as root.

The process chooses what is there. Run in a user namespace with a root of its own, it can put
a symlink to /etc/shadow, a FIFO, a device, a bind mount of a root-only file or a FUSE mount
that never answers where we look. So:

- a path inside its root is resolved here, one component at a time, each opened with
  ``O_PATH | O_NOFOLLOW``: a symlink's text is followed *inside that root* (an absolute target
  starts again at its root, ``..`` never climbs above it), as ``openat2``'s ``RESOLVE_IN_ROOT``
  does, on every kernel; at most 40 symlinks;
- only a regular file is opened for reading (an ``O_PATH`` descriptor is checked first, so a
  device or a FIFO is never opened), non-blocking, and read up to a cap;
- only a file the process itself could read (its fsuid and groups against the file's mode),
  so a bind mount cannot make root read for it what it cannot;
- every read of its memory (``environ``) or of its file system runs on a helper thread with a
  deadline: one that hangs (a FUSE server that never answers, a process whose memory map is
  held) costs that deadline once; while ``MAX_STUCK`` such threads of one kind are still stuck,
  none more of that kind is tried (hung roots do not stop the environment's reads).
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

READ_S = 1.0  # a bounded read's deadline
MAX_STUCK = 4  # readers left hanging past their deadline: with this many, no more is started
SYMLINKS_MAX = 40  # as the kernel's ELOOP
PATH_MAX = 4096

_stuck: dict[str, list[threading.Thread]] = {}  # kind -> its readers left hanging
_stuck_lock = threading.Lock()


def read_file(path: str, limit: int) -> bytes | None:
    """At most ``limit`` bytes of the regular file ``path`` (its last component no symlink); None
    where it is not one, or cannot be read. Never blocks on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return _read_fd(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_fd(fd: int, limit: int) -> bytes:
    chunks, left = [], limit
    while left > 0:
        chunk = os.read(fd, min(left, 65536))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


@dataclass(frozen=True, slots=True)
class Creds:
    """Who a process reads files as (``/proc/PID/status``: its fsuid, fsgid and groups)."""

    fsuid: int
    gids: frozenset[int]


def may_read(st: os.stat_result, creds: Creds) -> bool:
    """Whether the process could read the file itself, by its mode bits (root reads everything)."""
    if creds.fsuid == 0:
        return True
    if st.st_uid == creds.fsuid:
        return bool(st.st_mode & stat.S_IRUSR)
    if st.st_gid in creds.gids:
        return bool(st.st_mode & stat.S_IRGRP)
    return bool(st.st_mode & stat.S_IROTH)


def read_in_root(root: str, path: str, limit: int, creds: Creds) -> bytes | None:
    """At most ``limit`` bytes of the regular file ``path`` inside the directory ``root`` (a
    process's ``/proc/PID/root``), every symlink on the way resolved inside ``root``; None where
    there is none, it is no regular file, or the process could not read it itself."""
    if len(path) > PATH_MAX:
        return None
    try:
        top = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)  # the kernel's link to its root
    except OSError:
        return None
    held = [top]  # the directories from the root down to where the walk is
    try:
        fd = _walk(held, path)
        if fd is None:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not may_read(st, creds):
                return None
            # opened for reading only now, through the checked descriptor: the same file
            rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        finally:
            os.close(fd)
        try:
            return _read_fd(rfd, limit)
        finally:
            os.close(rfd)
    except OSError:
        return None
    finally:
        for d in held:
            os.close(d)


def _walk(held: list[int], path: str) -> int | None:
    """An ``O_PATH`` descriptor of what ``path`` names below ``held[0]``, walked from there (``held``
    grows with the directories entered and is closed by the caller); None where it leads nowhere."""
    todo = [p for p in path.split("/") if p][::-1]  # a stack: the next component last
    links = 0
    while todo:
        name = todo.pop()
        if name == ".":
            continue
        if name == "..":
            if len(held) > 1:  # never above the root
                os.close(held.pop())
            continue
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=held[-1])
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            os.close(fd)
            raise
        if stat.S_ISLNK(mode):
            os.close(fd)
            links += 1
            target = os.readlink(name, dir_fd=held[-1])  # its text: followed here, never by the kernel
            if links > SYMLINKS_MAX or not target or len(target) > PATH_MAX:
                return None
            if target.startswith("/"):
                while len(held) > 1:
                    os.close(held.pop())
            todo.extend([p for p in target.split("/") if p][::-1])
            continue
        if not todo:
            return fd
        if not stat.S_ISDIR(mode):
            os.close(fd)
            return None
        held.append(fd)
    return None  # the path named a directory (or the root itself)


def bounded(kind: str, fn: Callable[..., T], *args) -> T | None:
    """``fn(*args)`` on a helper thread, given ``READ_S``; None when it takes longer (the thread is
    left to finish on its own) or when ``MAX_STUCK`` earlier ones of this ``kind`` are still stuck."""
    with _stuck_lock:
        alive = _stuck[kind] = [t for t in _stuck.get(kind, ()) if t.is_alive()]
        if len(alive) >= MAX_STUCK:
            return None
    out: list[T] = []

    def run() -> None:
        out.append(fn(*args))

    t = threading.Thread(target=run, name="traintop-procread", daemon=True)
    t.start()
    t.join(READ_S)
    if t.is_alive():
        with _stuck_lock:
            _stuck.setdefault(kind, []).append(t)
        return None
    return out[0] if out else None


def stuck() -> int:
    """Readers still hanging past their deadline."""
    with _stuck_lock:
        return sum(t.is_alive() for ts in _stuck.values() for t in ts)
