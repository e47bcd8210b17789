"""Opening a file someone else may have made: only a regular file, never a FIFO or a device.

``open()`` on a FIFO blocks until a writer appears (forever, in a CI job), and ``/dev/zero``
reads without end. A path is checked with ``stat`` first (a socket cannot even be opened),
then opened with ``O_NONBLOCK`` (a FIFO opens at once) and checked again with ``fstat`` on
what was actually opened, so a file swapped in between is caught too.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from traintop.errors import TraintopError


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def check_regular(path: str, what: str = "file", error=TraintopError) -> os.stat_result:
    """The stat of ``path``; one-line TraintopError when it is missing or not a regular file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except OSError as e:
        raise error(f"cannot read {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{path} is {_kind(st.st_mode)}, not a {what}")
    return st


def open_regular(path: str, what: str = "file", error=TraintopError):
    """``path`` opened for binary reading, refusing anything but a regular file (one line)."""
    check_regular(path, what, error)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise error(f"{path} is a socket, not a {what}") from None
        raise error(f"cannot read {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{path} is {_kind(st.st_mode)}, not a {what}")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def create_new(path: str, what: str, error=TraintopError):
    """``path`` created for writing text, never over an existing file (one line when it cannot be).

    ``what`` names the option, for the refusal: ``f"{what} writes a new file, never over one"``.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        if os.path.isdir(path):
            raise error(f"cannot create {path}: Is a directory") from None
        raise error(f"{path} exists: {what} writes a new file, never over one") from None
    except OSError as e:
        raise error(f"cannot create {path}: {e.strerror or e}") from None
    return os.fdopen(fd, "w", encoding="utf-8")
