"""The attached training process and its tree (data-loader workers), through psutil."""

from __future__ import annotations

import os
import time

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


def descendants(pid: int, proc: str = "/proc") -> list[int]:
    """The processes under ``pid`` (children first), from each of its tasks' children files: a read
    per thread of the tree, where psutil's ``children(recursive=True)`` reads every process's stat."""
    out: list[int] = []
    seen = {pid}
    todo = [pid]
    while todo and len(out) < MAX_TREE:
        parent = todo.pop(0)
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


class ProcessCollector:
    def __init__(self, pid: int, clock=time.monotonic, ended_ok: bool = False) -> None:
        self.pid = pid
        self._root = check_attachable(pid, ended_ok)
        self._clock = clock
        self._known: dict[int, psutil.Process] = {}
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
        self.ended_at: float | None = None
        self._torch: dict[int, tuple[bool | None, float]] = {}  # pid -> (torch mapped, when looked)
        self._children_files = _children_files()

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

    def _tree(self) -> list[psutil.Process]:
        """The attached process and those under it. A process that leaves the tree is forgotten (a
        PID taken again by another is looked at anew)."""
        alive = {self.pid: self._root}
        if self._children_files:
            for pid in descendants(self.pid):
                p = self._known.get(pid)
                if p is None:
                    try:
                        p = psutil.Process(pid)
                    except psutil.Error:
                        continue
                alive[pid] = p
        else:
            try:
                for p in self._root.children(recursive=True):
                    alive[p.pid] = self._known.get(p.pid, p)
            except psutil.Error:
                pass
        for pid in list(self._known):
            if pid not in alive:
                del self._known[pid]
                self._ns.pop(pid, None)
        self._known.update(alive)
        return list(alive.values())

    def channel_pids(self) -> set[int]:
        """Every PID under which a probe of this job may have named its socket."""
        out = {self.pid}
        for pids in self._ns.values():
            out.update(pids)
        return out

    def _zombie(self) -> bool:
        """Ended but not yet reaped by its parent: over, whatever /proc still lists."""
        try:
            return self._root.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return True

    def sample(self) -> ProcessSample:
        if self.ended_at is not None or not self._root.is_running() or self._zombie():
            self.ended_at = self.ended_at or time.time()
            return ProcessSample(pid=self.pid, alive=False, name=self.name, cmdline=self.cmdline)
        members = []
        cmds: dict[int, list[str]] = {}
        read = write = 0
        io_ok = True
        for p in self._tree():
            try:
                with p.oneshot():
                    name = p.name()
                    cpu = p.cpu_percent(None)  # since the previous call on this object
                    rss = p.memory_info().rss
                    threads = p.num_threads()
                    ppid = p.ppid()
                    try:
                        cmd = p.cmdline()
                    except psutil.Error:
                        cmd = []
                    try:
                        io = p.io_counters()
                        read += io.read_bytes
                        write += io.write_bytes
                    except (psutil.Error, AttributeError):
                        io_ok = False
            except psutil.Error:
                continue
            if p.pid not in self._ns:
                self._ns[p.pid] = ns_pids(p.pid)
            members.append(ProcInfo(p.pid, TITLES.get(name, name), cpu, rss, threads, _is_loader_worker(name, cmd), ppid))
            cmds[p.pid] = cmd
        if not members:
            self.ended_at = time.time()
            return ProcessSample(pid=self.pid, alive=False, name=self.name, cmdline=self.cmdline)
        self._named(members, cmds)
        now = self._clock()
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
