"""`traintop run -- CMD`: start a training command with the probe injected (no code change)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from importlib import resources

from traintop import __version__
from traintop.errors import TraintopError
from traintop.files import _kind
from traintop.watch.job import Job
from traintop.injob.agent import ensure_private_dir, probe_dir
from traintop.units import fmt_bytes


def private_base() -> tuple[str, str | None]:
    """traintop's private directory for probe sockets, the injected files and logs, and a
    one-line note when the usual one cannot be used.

    Where XDG_RUNTIME_DIR is unset the usual one is /tmp/traintop-<uid>, which another user
    can create first (or make a symlink): then this job gets a fresh private directory of
    its own, which it learns through TRAINTOP_PROBE_DIR."""
    path = probe_dir()
    try:
        return ensure_private_dir(path), None
    except OSError as e:
        why = e.strerror if e.strerror else str(e)
        if os.environ.get("TRAINTOP_PROBE_DIR"):
            raise TraintopError(f"TRAINTOP_PROBE_DIR={path} cannot be used: {why}; "
                                "point it at a directory of yours with mode 0700") from None
        fallback = tempfile.mkdtemp(prefix=f"traintop-{os.getuid()}-")
        return fallback, (f"{path} cannot be used ({why}); this job's probe uses {fallback} instead "
                          f"(to fix: remove {path}, or set XDG_RUNTIME_DIR)")


INJECTED = (("injob/capture.py", "_traintop_probe_capture.py"), ("injob/goodput.py", "_traintop_probe_goodput.py"),
            ("injob/agent.py", "_traintop_probe_agent.py"), ("inject/sitecustomize.py", "sitecustomize.py"))


def injection_dir(base: str) -> str:
    """A private directory holding sitecustomize.py and the standalone probe agent. Named by what
    it holds: two copies of traintop (a checkout and an installed one, same version) started side
    by side each inject their own probe."""
    pkg = resources.files("traintop")
    digest = hashlib.sha256()
    for src, _ in INJECTED:
        digest.update(pkg.joinpath(src).read_bytes())
    d = os.path.join(base, f"inject-{__version__}-{digest.hexdigest()[:12]}")
    os.makedirs(d, mode=0o700, exist_ok=True)
    for src, dst in INJECTED:
        with resources.as_file(pkg.joinpath(src)) as path:
            fd, tmp = tempfile.mkstemp(dir=d, prefix=dst, suffix=".tmp")  # two runs at once: one name each
            os.close(fd)
            shutil.copyfile(path, tmp)
            os.replace(tmp, os.path.join(d, dst))
    return d


def probe_env(base: str, env: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if env is None else env)
    d = injection_dir(base)
    env["PYTHONPATH"] = d + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TRAINTOP_PROBE_DIR"] = base
    return env


def new_log(directory: str) -> tuple[int, str]:
    """A log file of its own (O_EXCL): two runs started in the same second get two files."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    stem = time.strftime("run-%Y%m%d-%H%M%S")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
    for n in range(1, 1000):
        path = os.path.join(directory, f"{stem}{'' if n == 1 else f'-{n}'}.log")
        try:
            return os.open(path, flags, 0o600), path
        except FileExistsError:
            continue
    raise TraintopError(f"cannot make a new log file in {directory}")


def open_log(path: str) -> tuple[int, bool]:
    """``--log FILE``: (descriptor, created). A new file is created 0600; an existing one must be a
    plain file of ours with no other name, and is appended to, never cut (its content is the user's:
    traintop cuts only a log it created in this run). Refused in one line, before the job starts: a
    symbolic link (another user's planted link would have the job's output, and the cut, go to its
    target), a FIFO (it would hang), a device, a directory, another user's file, a hard link."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
    refuse = f"--log {path}"
    for _ in range(8):  # a file removed between the two opens: again
        try:
            fd, created = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600), True
        except FileExistsError:
            try:
                fd, created = os.open(path, flags), False
            except FileNotFoundError:
                continue
            except OSError as e:
                raise TraintopError(_log_refusal(refuse, e)) from None
        except OSError as e:
            raise TraintopError(_log_refusal(refuse, e)) from None
        break
    else:
        raise TraintopError(f"{refuse}: the file keeps changing; give another path")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TraintopError(f"{refuse} is {_kind(st.st_mode)}: the job's log must be a regular file")
        if not created and st.st_uid != os.geteuid():
            raise TraintopError(f"{refuse} belongs to another user: give a path of your own")
        if not created and st.st_nlink > 1:
            raise TraintopError(f"{refuse} has other names (hard links): give a path of its own")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        if created:
            os.unlink(path)
        raise
    return fd, created


def _log_refusal(what: str, e: OSError) -> str:
    if e.errno == errno.ELOOP:
        return f"{what} is a symbolic link: give the log's own path (traintop never writes through a link)"
    if e.errno == errno.ENXIO:
        return f"{what} is a FIFO (named pipe) or a socket: the job's log must be a regular file"
    if e.errno == errno.EISDIR:
        return f"{what} is a directory: give a file's path"
    return f"cannot write the job's log {what.removeprefix('--log ')}: {e.strerror or e}"


def _editor(log: int, path: str) -> int | None:
    """A second descriptor of the log, to read and rewrite it in place for a cut (the job's own
    appends): only for a regular file, the same one, and where it may be read; else None."""
    try:
        st = os.fstat(log)
        if not stat.S_ISREG(st.st_mode):
            return None
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    other = os.fstat(fd)
    if (other.st_dev, other.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        return None
    return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


LOG_MAX_BYTES = 64 << 20  # the job's log, while traintop watches the job
LOG_HEAD_BYTES = 4 << 20  # its start, kept when the middle is cut
LOG_TAIL_BYTES = 4 << 20  # its newest output, kept too (at most half of what the head leaves)
LOG_MARK_ROOM = 256  # the line that says what was cut
LOG_CATCH_UP_ROUNDS = 8


def _cut_log(log: int, edit: int | None, size: int) -> None:
    """Cut the log's middle: keep its first LOG_HEAD_BYTES, a line saying how much was dropped, and
    its last bytes (from a line's start), moved down in place through ``edit``. What the job
    appends meanwhile is moved too, up to the truncation (a few system calls later). Without
    ``edit`` (a log we may only write) the head alone is kept."""
    tail_len = max(0, min(LOG_TAIL_BYTES, (LOG_MAX_BYTES - LOG_HEAD_BYTES) // 2 - LOG_MARK_ROOM))
    if edit is None or not tail_len:
        os.ftruncate(log, LOG_HEAD_BYTES)
        _write_all(log, _cut_mark(size - LOG_HEAD_BYTES))
        return
    tail = os.pread(edit, tail_len, size - tail_len)
    newline = tail.find(b"\n")
    if 0 <= newline < len(tail) - 1:
        tail = tail[newline + 1:]
    # each piece moves down, never onto bytes not yet read: the head, the mark and the tail fit
    # below where the tail began (tail_len leaves room for the mark)
    at = LOG_HEAD_BYTES
    for piece in (_cut_mark(size - len(tail) - LOG_HEAD_BYTES), tail):
        os.pwrite(edit, piece, at)
        at += len(piece)
    end = size
    # the job's appends since go after the tail; a job that never stops writing is followed a few
    # rounds of at most tail_len bytes (memory and time bounded), then what it writes is cut
    for _ in range(LOG_CATCH_UP_ROUNDS):
        now = os.fstat(edit).st_size
        if now <= end:
            break
        more = os.pread(edit, min(now - end, tail_len), end)
        if not more:
            break
        os.pwrite(edit, more, at)
        at, end = at + len(more), end + len(more)
    os.ftruncate(edit, at)


def _cut_mark(dropped: int) -> bytes:
    return (f"\n[traintop: {fmt_bytes(dropped)} of output dropped here, to keep this log under "
            f"{fmt_bytes(LOG_MAX_BYTES)}]\n").encode()


def _cap_log(fd: int, edit: int | None, pid: int, lock: threading.Lock | None) -> None:
    """Keep the job's log under LOG_MAX_BYTES while traintop runs (a chatty job wrote 442 MB in
    20 s, and the private directory may be a small tmpfs): past it the log's middle is cut, its
    start (the job's configuration, its first errors) and its newest output (what it printed last,
    a traceback as it exits) kept, with a line that says how much was dropped there. The job
    writes with O_APPEND, so it goes on at the new end; it never waits for this, and never
    writes through a pipe that would break if traintop left. With ``lock`` (the output pumps',
    when traintop itself writes the log) nothing the job prints is lost to a cut."""
    try:
        while True:
            ended = not os.path.exists(f"/proc/{pid}")  # reaped (never by this thread: Job watches it)
            try:
                if os.fstat(fd).st_size > LOG_MAX_BYTES:
                    with lock or contextlib.nullcontext():
                        size = os.fstat(fd).st_size
                        if size > LOG_MAX_BYTES:
                            _cut_log(fd, edit, size)
            except OSError:
                return
            if ended:
                return
            time.sleep(0.5)
    finally:
        os.close(fd)
        if edit is not None:
            os.close(edit)


def _pump(src: int, out: int, log: int, lock: threading.Lock) -> None:
    """Copy the job's output to traintop's own (a terminal, a file, a CI log) and to the log."""
    out_ok = True
    try:
        while True:
            try:
                data = os.read(src, 65536)
            except InterruptedError:
                continue
            except OSError:
                break
            if not data:
                break
            if out_ok:
                try:
                    _write_all(out, data)
                except OSError:  # our reader went away: keep logging, keep the job unblocked
                    out_ok = False
            with lock:
                try:
                    _write_all(log, data)
                except OSError:
                    pass
    finally:
        os.close(src)


def launch(cmd: list[str], log_path: str | None = None, *, base: str | None = None,
           passthrough: bool = False) -> Job:
    """Start ``cmd`` with the probe, in a process group of its own.

    Its output goes to a log file; with ``passthrough`` (no dashboard) also to traintop's
    own stdout and stderr, each to its own, and its stdin is traintop's where that is not
    a terminal."""
    if not cmd:
        raise TraintopError("traintop run needs a command: traintop run -- python train.py")
    if base is None:
        base, _ = private_base()
    if log_path is None:
        log, log_path = new_log(os.path.join(base, "logs"))
        created = True
    else:
        log, created = open_log(log_path)
    group = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
    stdin = subprocess.DEVNULL
    if passthrough and not os.isatty(0):
        stdin = None  # a pipe or a file: the job reads it as it would without traintop
    out = subprocess.PIPE if passthrough else log
    try:
        proc = subprocess.Popen(cmd, env=probe_env(base), stdin=stdin, stdout=out,
                                stderr=subprocess.PIPE if passthrough else subprocess.STDOUT, **group)
    except FileNotFoundError:
        os.close(log)
        raise TraintopError(f"command not found: {cmd[0]}") from None
    except PermissionError:
        os.close(log)
        raise TraintopError(f"not executable: {cmd[0]}") from None
    lock = threading.Lock() if passthrough else None
    if created:  # an existing log is the user's: appended to, never cut
        threading.Thread(target=_cap_log, args=(os.dup(log), _editor(log, log_path), proc.pid, lock),
                         name="traintop-log-cap", daemon=True).start()
    pumps = []
    if passthrough:
        for pipe, fd in ((proc.stdout, 1), (proc.stderr, 2)):
            assert pipe is not None  # both PIPE when passing through
            src = os.dup(pipe.fileno())
            pipe.close()
            t = threading.Thread(target=_pump, args=(src, fd, log, lock), name="traintop-output", daemon=True)
            t.start()
            pumps.append(t)
        # The log stays open for the pumps (a child the job leaves behind may write on); the
        # process's exit closes it.
    else:
        os.close(log)
    return Job(proc, cmd, log_path, pumps, log_appended=not created)
