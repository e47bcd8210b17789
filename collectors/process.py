"""The attached training process and its tree (data-loader workers), through psutil."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil

from traintop.errors import TraintopError
from traintop.samples import ProcessSample, ProcInfo

LOADER_NAMES = ("pt_data_worker",)
# Titles torch gives its own processes, and what the user knows them as: torchrun's elastic agent
# names itself "pt_elastic" (torch/distributed/run.py).
TITLES = {"pt_elastic": "torchrun"}
# Programs that start the real job: a shell, a pyenv shim, `conda run`, env and the like. Where
# the job's process is one of them with a single child, that child is what the job is called
# (a pyenv shim execs python in the same process: the name is read again every sample).
WRAPPERS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "fish", "env", "conda", "mamba", "micromamba", "pyenv",
                      "uv", "poetry", "pipenv", "nohup", "timeout", "time", "nice", "ionice", "stdbuf",
                      "setsid", "taskset", "numactl", "chrt", "srun"})
TORCH_CHECK_S = 10.0  # a process not (yet) seen with torch is looked at again this often
TREE_EVERY_S = 5.0  # every thread of the tree looked at for new processes this often (main threads every sample)


def maps_torch(pid: int) -> bool | None:
    """Whether torch's libraries are mapped into ``pid`` (None: cannot tell)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as fh:
            for line in fh:
                if b"/libtorch" in line or b"/libc10" in line:
                    return True
    except OSError:
        return None
    return False


MAX_TREE = 4096  # processes followed under the attached one


def _children_files() -> bool:
    """Whether this kernel lists each task's children (/proc/PID/task/TID/children, CONFIG_PROC_CHILDREN)."""
    import threading

    return os.path.exists(f"/proc/self/task/{threading.get_native_id()}/children")


def descendants(pid: int, proc: str = "/proc", main_threads_only: bool = False) -> list[int]:
    """The processes under ``pid`` (children first), from each of its tasks' children files: a read
    per thread of the tree, where psutil's ``children(recursive=True)`` reads every process's stat.
    ``main_threads_only``: each process's main thread's file alone (a read per process), which
    finds what a process's main thread starts (DataLoader workers, compile workers) but not what
    its other threads start."""
    out: list[int] = []
    seen = {pid}
    todo = [pid]
    while todo and len(out) < MAX_TREE:
        parent = todo.pop(0)
        if main_threads_only:
            tids = [str(parent)]
        else:
            try:
                tids = os.listdir(f"{proc}/{parent}/task")
            except OSError:
                continue
        for tid in tids:
            try:
                with open(f"{proc}/{parent}/task/{tid}/children", "rb") as fh:
                    kids = fh.read().split()
            except OSError:  # the thread or the process ended meanwhile
                continue
            for k in kids:
                child = int(k)
                if child not in seen:
                    seen.add(child)
                    out.append(child)
                    todo.append(child)
    return out


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def read_stat(pid: int, proc: str = "/proc") -> tuple[str, str, int, int, int, int] | None:
    """(comm, state, ppid, CPU ticks (user + system), threads, start time in ticks) from
    /proc/PID/stat; None when the process is gone. One read: psutil's name, ppid, cpu_percent and
    num_threads read stat and status."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as fh:
            data = fh.read()
        right = data.rindex(b")")  # the name may hold spaces and parentheses
        comm = data[data.index(b"(") + 1:right].decode("utf-8", "replace")
        f = data[right + 2:].split()
        return comm, f[0].decode(), int(f[1]), int(f[11]) + int(f[12]), int(f[17]), int(f[19])
    except (OSError, ValueError, IndexError):
        return None


def read_rss(pid: int, proc: str = "/proc") -> int | None:
    try:
        with open(f"{proc}/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def read_io(pid: int, proc: str = "/proc") -> tuple[int, int] | None:
    """(bytes read, bytes written) at the storage layer, as psutil's io_counters; None when not readable."""
    try:
        with open(f"{proc}/{pid}/io", "rb") as fh:
            got = dict(line.split(b":", 1) for line in fh.read().splitlines() if b":" in line)
        return int(got[b"read_bytes"]), int(got[b"write_bytes"])
    except (OSError, ValueError, KeyError):
        return None


def read_cmdline(pid: int, proc: str = "/proc") -> list[str]:
    """The arguments, as psutil reads them (a process that rewrote its title with spaces in one
    argument is split at the spaces)."""
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as fh:
            data = fh.read().decode("utf-8", "surrogateescape")
    except OSError:
        return []
    if not data:
        return []
    sep = "\0" if "\0" in data else " "
    args = data[:-1].split(sep) if data.endswith(sep) else data.split(sep)
    if sep == "\0" and len(args) == 1 and " " in args[0]:
        args = args[0].split(" ")
    return args


def _name(comm: str, cmd: list[str]) -> str:
    """psutil's name(): the kernel keeps 15 characters of it; the program's file name where that cut it."""
    if len(comm) >= 15 and cmd:
        base = os.path.basename(cmd[0])
        if base.startswith(comm):
            return base
    return comm


def _is_loader_worker(name: str, cmdline: list[str]) -> bool:
    if name in LOADER_NAMES:
        return True
    joined = " ".join(cmdline[:3])
    return "multiprocessing" in joined and ("spawn_main" in joined or "forkserver" in joined)


def ns_pids(pid: int) -> tuple[int, ...]:
    """This PID as seen from nested PID namespaces (NSpid), e.g. inside a container."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("NSpid:"):
                    return tuple(int(x) for x in line.split()[1:])
    except (OSError, ValueError):
        pass
    return (pid,)


def check_attachable(pid: int, ended_ok: bool = False) -> psutil.Process:
    """The process for ``pid``, or a TraintopError that says in one line why not.

    ``ended_ok``: our own child (`traintop run`) may have ended and wait to be reaped; that
    is its end to show, not an error."""
    if pid <= 0:
        raise TraintopError(f"--pid {pid}: a process id is a positive number")
    try:
        proc = psutil.Process(pid)
        proc.cmdline()
    except psutil.ZombieProcess:
        if ended_ok:
            return proc
        raise TraintopError(f"no process with PID {pid} (it has exited)") from None
    except psutil.NoSuchProcess:
        raise TraintopError(f"no process with PID {pid} (it may have exited)") from None
    except psutil.AccessDenied:
        raise TraintopError(f"PID {pid} belongs to another user; run traintop as that user or as root") from None
    try:
        if os.geteuid() != 0 and proc.uids().real != os.getuid():
            raise TraintopError(f"PID {pid} belongs to another user; run traintop as that user or as root")
    except (psutil.AccessDenied, AttributeError):
        pass
    return proc


@dataclass(slots=True)
class _Seen:
    """What is kept of a process of the tree between samples."""

    start: int  # its start time (ticks since boot): a PID taken again by another process has another
    ticks: int  # CPU ticks at the last sample
    at: float  # when
    comm: str  # the kernel's name when ``cmd`` was read: an exec changes it, and the command is read again
    cmd: list[str]


class ProcessCollector:
    def __init__(self, pid: int, clock=time.monotonic, ended_ok: bool = False) -> None:
        self.pid = pid
        self._root = check_attachable(pid, ended_ok)
        self._clock = clock
        self._seen: dict[int, _Seen] = {}
        self._ns: dict[int, tuple[int, ...]] = {}
        self._last_io: tuple[float, int, int] | None = None
        try:
            self.name = TITLES.get(name := self._root.name(), name)
        except psutil.Error:
            self.name = "?"
        try:
            self.cmdline = " ".join(self._root.cmdline())
        except psutil.Error:
            self.cmdline = self.name
        first = read_stat(pid)
        self._start = first[5] if first else None  # the attached process's: another's after its PID is reused
        self.ended_at: float | None = None
        self._torch: dict[int, tuple[bool | None, float]] = {}  # pid -> (torch mapped, when looked)
        self._children_files = _children_files()
        self._tree_pids: list[int] = []
        self._tree_at: float | None = None

    def _has_torch(self, pids: list[int], now: float) -> bool | None:
        """torch's libraries mapped into any of ``pids``; a process seen with them keeps them."""
        answers = []
        for pid in pids:
            seen = self._torch.get(pid)
            if seen is None or (not seen[0] and now - seen[1] >= TORCH_CHECK_S):
                seen = self._torch[pid] = (maps_torch(pid), now)
            answers.append(seen[0])
            if seen[0]:
                return True
        for pid in [p for p in self._torch if p not in pids]:
            del self._torch[pid]
        return False if any(a is False for a in answers) else None

    def _named(self, members: list[ProcInfo], cmds: dict[int, list[str]]) -> None:
        """The job's name and command line: its own process's, now (a shim that execs python
        is python from then on), or, through a wrapper with one child, that child's."""
        by_pid = {m.pid: m for m in members}
        pid = self.pid
        for _ in range(8):
            m = by_pid.get(pid)
            if m is None:
                break
            children = [c for c in members if c.ppid == pid]
            if m.name not in WRAPPERS or len(children) != 1:
                break
            pid = children[0].pid
        m = by_pid.get(pid)
        if m is not None and m.name:
            self.name = m.name
            if cmds.get(pid):
                self.cmdline = " ".join(cmds[pid])

    def _tree(self, now: float) -> list[int]:
        """The attached process and those under it. Every thread's children file is read every
        TREE_EVERY_S (a torch job has dozens of threads); between, each process's main thread's
        only, which is where DataLoader and compile workers are started from."""
        if not self._children_files:
            try:
                return [self.pid] + [p.pid for p in self._root.children(recursive=True)]
            except psutil.Error:
                return [self.pid]
        full = self._tree_at is None or now - self._tree_at >= TREE_EVERY_S
        found = descendants(self.pid, main_threads_only=not full)
        if full:
            self._tree_at = now
            self._tree_pids = found
            return [self.pid] + found
        # the processes a full walk found that are not under a main thread stay until the next one
        found_set = set(found)
        return [self.pid] + found + [p for p in self._tree_pids if p not in found_set]

    def channel_pids(self) -> set[int]:
        """Every PID under which a probe of this job may have named its socket."""
        out = {self.pid}
        for pids in self._ns.values():
            out.update(pids)
        return out

    def _ended(self) -> ProcessSample:
        self.ended_at = self.ended_at or time.time()
        return ProcessSample(pid=self.pid, alive=False, name=self.name, cmdline=self.cmdline)

    def sample(self) -> ProcessSample:
        if self.ended_at is not None:
            return self._ended()
        root = read_stat(self.pid)
        # gone, a zombie (ended, not yet reaped by its parent) or its PID now another's: over
        if root is None or root[1] in ("Z", "X", "x") or (self._start is not None and root[5] != self._start):
            return self._ended()
        now = self._clock()
        wall = time.monotonic()  # the CPU rate's own clock, whatever clock the caller gave
        members = []
        cmds: dict[int, list[str]] = {}
        read = write = 0
        io_ok = True
        alive: set[int] = set()
        for pid in self._tree(now):
            st = root if pid == self.pid else read_stat(pid)
            if st is None or st[1] in ("Z", "X", "x"):
                continue
            comm, _, ppid, ticks, threads, start = st
            seen = self._seen.get(pid)
            if seen is None or seen.start != start:  # new, or its PID taken again
                seen = self._seen[pid] = _Seen(start, ticks, wall, comm, read_cmdline(pid))
                self._ns[pid] = ns_pids(pid)
                cpu = 0.0  # as psutil's first cpu_percent(None)
            else:
                cpu = max(0.0, (ticks - seen.ticks) / _CLOCK_TICKS / max(wall - seen.at, 1e-6) * 100.0)
                seen.ticks, seen.at = ticks, wall
                if comm != seen.comm:  # it exec'd (a shim that became python)
                    seen.comm, seen.cmd = comm, read_cmdline(pid)
            io = read_io(pid)
            if io is None:
                io_ok = False
            else:
                read += io[0]
                write += io[1]
            alive.add(pid)
            name = _name(comm, seen.cmd)
            members.append(ProcInfo(pid, TITLES.get(name, name), cpu, read_rss(pid), threads,
                                    _is_loader_worker(name, seen.cmd), ppid))
            cmds[pid] = seen.cmd
        for pid in [p for p in self._seen if p not in alive]:  # left the tree: forgotten
            del self._seen[pid]
            self._ns.pop(pid, None)
        if not members:
            return self._ended()
        self._named(members, cmds)
        torch = self._has_torch([m.pid for m in members if not m.is_loader_worker], now)
        r_rate = w_rate = None
        if io_ok:
            if self._last_io is not None:
                dt = max(now - self._last_io[0], 1e-6)
                r_rate = max(0.0, (read - self._last_io[1]) / dt)
                w_rate = max(0.0, (write - self._last_io[2]) / dt)
            self._last_io = (now, read, write)
        return ProcessSample(
            pid=self.pid, alive=True, name=self.name, cmdline=self.cmdline,
            cpu_percent=sum(m.cpu_percent or 0 for m in members), rss=sum(m.rss or 0 for m in members),
            threads=sum(m.threads or 0 for m in members), read_rate=r_rate, write_rate=w_rate,
            members=tuple(members), torch=torch,
        )
