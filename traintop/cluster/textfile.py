"""`traintop agent --textfile DIR`: the metrics written into a directory node_exporter reads.

An agent often runs as root; DIR may not be its own. The rule (docs/SECURITY.md):

- DIR must be a directory owned by root or by the agent's user, writable by its owner
  only (no group or other write bit, sticky or not), and so must every directory above it,
  except that a directory above it may be other-writable with the sticky bit (as /tmp).
  Anything else is refused with one line before the agent starts.
- DIR is opened once (``O_DIRECTORY``) and every write goes through that descriptor: its
  owner and mode are checked again before each write, so a directory renamed or re-moded
  under the agent is noticed, and a path swapped for a symlink is never followed.
- Each write goes to a fresh, random name created with ``O_CREAT | O_EXCL | O_NOFOLLOW``
  (a planted file or symlink makes that one write fail, never redirects it), made 0644
  with ``fchmod`` and renamed over ``traintop.prom`` (``rename`` replaces a symlink there,
  it does not write through it).
"""

from __future__ import annotations

import os
import secrets
import stat

from traintop.errors import TraintopError
from traintop.text import one_line

_WRITE_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def dir_problem(st: os.stat_result, uid: int, leaf: bool) -> str | None:
    """Why a directory with status ``st`` is not safe to write into (None: it is)."""
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid not in (0, uid):
        return f"is owned by uid {st.st_uid} (neither root nor this agent's user)"
    if st.st_mode & _WRITE_OTHERS:
        if leaf:
            return "can be written by others (group or other write bit): make it 0755 or stricter"
        if not (st.st_mode & stat.S_ISVTX):
            return "can be written by others without the sticky bit"
    return None


def check_path(path: str, uid: int | None = None) -> str | None:
    """Why ``path`` may not receive the metrics file (None: it may)."""
    uid = os.geteuid() if uid is None else uid
    try:
        real = os.path.realpath(path, strict=True)
        leaf = os.stat(real)
    except OSError as e:
        return f"cannot use it: {e.strerror or e}"
    problem = dir_problem(leaf, uid, leaf=True)
    if problem:
        return problem
    parent = os.path.dirname(real)
    while True:
        try:
            st = os.stat(parent)
        except OSError as e:
            return f"cannot check {parent}: {e.strerror or e}"
        problem = dir_problem(st, uid, leaf=False)
        if problem:
            return f"lies under {one_line(parent, 200)}, which {problem}"
        up = os.path.dirname(parent)
        if up == parent:
            return None
        parent = up


class TextfileWriter:
    """Writes one file, ``name``, into a checked directory, atomically and without following links."""

    def __init__(self, directory: str, name: str = "traintop.prom") -> None:
        self.directory = directory
        self.name = name
        self.uid = os.geteuid()
        problem = check_path(directory, self.uid)
        if problem:
            raise TraintopError(f"--textfile: {one_line(directory, 200)} {problem}")
        try:
            self.fd: int | None = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise TraintopError(f"--textfile: cannot open {one_line(directory, 200)}: {e.strerror or e}") from None
        problem = dir_problem(os.fstat(self.fd), self.uid, leaf=True)
        if problem:
            self.close()
            raise TraintopError(f"--textfile: {one_line(directory, 200)} {problem}")

    @property
    def path(self) -> str:
        return os.path.join(self.directory, self.name)

    def write(self, data: bytes) -> None:
        """One atomic replacement of the file. Raises OSError (or TraintopError when the
        directory stopped being safe); a failed write leaves no temporary file behind."""
        if self.fd is None:
            raise OSError("closed")
        problem = dir_problem(os.fstat(self.fd), self.uid, leaf=True)
        if problem:
            raise TraintopError(f"{one_line(self.directory, 200)} {problem}")
        tmp = f".{self.name}.{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=self.fd)
        try:
            try:
                os.fchmod(fd, 0o644)
                view = memoryview(data)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
            finally:
                os.close(fd)
            os.rename(tmp, self.name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=self.fd)
            except OSError:
                pass
            raise

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
