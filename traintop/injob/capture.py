"""Evidence on request: a torch.profiler trace of a few steps, or a CUDA memory snapshot.

Part of the probe (see probe_agent): standalone on purpose (stdlib and torch only). traintop asks
for a capture when a finding starts; the probe thread calls ``Capturer.request`` and ``poll``, the
training thread only ``on_step`` (from the optimizer step hook), which is a single attribute
check while nothing is asked for.

A capture starts at the first step end after the request and covers ``STEPS`` steps. The
training thread starts and stops the profiler (or the allocator's history) and nothing more: the
trace's export and the snapshot's pickling happen in ``poll``, on the probe thread.

``poll`` reports each capture once, as soon as its file is written (or it failed)::

    {"kind", "path", "t", "steps", "step_s_before", "step_s_during", "step_s_after", "bytes", "error"}

``step_s_after`` (the mean period of the ``AROUND`` steps after the capture ended) is usually not
known yet then: it is None, and one more record ``{"kind", "path", "step_s_after"}`` follows once
it is. A failed capture (``error`` set, ``path`` None) has no follow-up. A record may also carry
``removed``: the names of older captures deleted to hold the folder to its budget.

A trace is written gzipped (``.pt.trace.json.gz``: Perfetto and TensorBoard's profiler plugin open
it as it is; a trace of a few steps is tens of MB of JSON). The captures folder is shared by the
user's jobs and held to a budget (``budget_bytes``, 1 GiB unless TRAINTOP_CAPTURES_BUDGET_MB says
otherwise): after each capture the oldest files go first, this process's own beyond half of it,
then anyone's beyond all of it.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import gzip
import importlib
import inspect
import os
import pickle
import re
import shutil
import stat
import sys
import tempfile
import threading
import time
from typing import Any

KINDS = {"trace": "trace", "memory": "memory snapshot"}
RATE_S = 600.0  # one capture of each kind this often
STEPS = 3  # steps captured
AROUND = 40  # step durations before (mean) and after (mean) a capture
SETTLE = 10  # steps right after a capture not measured: the GPU's queue refills
MEMORY_ENTRIES = 100_000
MAX_BYTES = {"trace": 256 << 20, "memory": 1 << 30}  # a bigger file is deleted and reported as an error
# a trace ends in ".pt.trace.json.gz": TensorBoard's PyTorch profiler plugin reads only "*.pt.trace.json"
# and "*.pt.trace.json.gz"; the memory viewer reads torch's own pickle, kept as it is
_SUFFIX = {"trace": ".pt.trace.json.gz", "memory": "-memory.pickle"}
# every name a capture had (an older probe wrote "-trace.json", then ".pt.trace.json"): group 1 is the PID
CAPTURE_NAME = re.compile(r"capture-(\d{1,10})-\d{8}-\d{6}(?:-\d{1,4})?(?:\.pt\.trace\.json(?:\.gz)?|-trace\.json"
                          r"|-memory\.pickle)")
BUDGET_BYTES = 1 << 30  # a captures folder's total, unless TRAINTOP_CAPTURES_BUDGET_MB says otherwise
BUDGET_ENV = "TRAINTOP_CAPTURES_BUDGET_MB"
MAX_REMOVED_NAMED = 16


def budget_bytes(env=None) -> int:
    """The captures folders' budget: TRAINTOP_CAPTURES_BUDGET_MB (a whole number of MiB, 1 to 10**6),
    else 1 GiB."""
    raw = (os.environ if env is None else env).get(BUDGET_ENV, "")
    if raw.isdigit() and 1 <= int(raw) <= 10**6:
        return int(raw) << 20
    return BUDGET_BYTES


def disk_bytes(st: os.stat_result) -> int:
    """What a file takes on its disk (a budget is about space, not a sparse file's claimed size)."""
    return st.st_blocks * 512 if getattr(st, "st_blocks", 0) else st.st_size


def hold_budget(dir_fd: int, budget: int, keep: str, own_pid: int | None = None) -> list[str]:
    """Delete the oldest captures in the folder open as ``dir_fd`` (ours, plain files with a capture's
    name: nothing else is touched) until it holds at most ``budget`` bytes; with ``own_pid``, first
    that process's own beyond half of it (one job cannot push out every other's). ``keep`` (the newest)
    stays. Returns the names removed, oldest first."""
    files = []
    with os.scandir(dir_fd) as it:
        for e in it:
            m = CAPTURE_NAME.fullmatch(e.name)
            if m is None or e.name == keep:
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                files.append((st.st_mtime, e.name, disk_bytes(st), int(m.group(1))))
    try:
        kept = disk_bytes(os.stat(keep, dir_fd=dir_fd, follow_symlinks=False))
    except OSError:
        kept = 0
    files.sort()
    removed = []

    def drop(limit: int, which) -> None:
        total = kept + sum(f[2] for f in files if which(f))
        for f in [f for f in files if which(f)]:
            if total <= limit:
                return
            try:
                os.unlink(f[1], dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            files.remove(f)
            removed.append(f[1])
            total -= f[2]

    if own_pid is not None:
        drop(budget // 2, lambda f: f[3] == own_pid)
    drop(budget, lambda f: True)
    return removed


# What libkineto (the profiler's C++ side) writes on stderr as a trace starts and stops: "USDT:2026-12-04
# 17:56:41 32295:32295 SyncActivityProfilerHandler.cpp:52] profiler_start", and (some versions) "STAGE:...
# Completed Stage: Warm Up". Its level is read from KINETO_LOG_LEVEL once per process, and silencing
# these lines there would silence its errors too, for the whole job: the lines are dropped instead.
KINETO_CHATTER = re.compile(rb"(?:USDT|STAGE|INFO|VERBOSE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ [^\]\n]*\] ")
_quiet_lock = threading.Lock()


@contextlib.contextmanager
def kineto_quiet():
    """While the profiler starts, stops or exports: the process's stderr (fd 2) goes to a temporary
    file, then everything written meanwhile goes on to stderr but libkineto's own chatter. Whatever
    the job's threads write in that window reaches its stderr, a moment later."""
    if not _quiet_lock.acquire(blocking=False):  # another thread is in one: its window covers this
        yield
        return
    try:
        with contextlib.ExitStack() as stack:
            try:
                saved = os.dup(2)
                stack.callback(os.close, saved)
                held = stack.enter_context(tempfile.TemporaryFile())
                _flush_stderr()
                os.dup2(held.fileno(), 2)
            except OSError:
                yield  # no stderr to take, or no room for the file: the lines stay
                return
            try:
                yield
            finally:
                _flush_stderr()
                os.dup2(saved, 2)
                _pass_on(held)
    finally:
        _quiet_lock.release()


def _flush_stderr() -> None:
    try:
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass


def _pass_on(held) -> None:
    """What was written to stderr in the window, less libkineto's chatter, to stderr."""
    try:
        held.seek(0)
        out = b"".join(line for line in held if not KINETO_CHATTER.match(line))
        while out:
            out = out[os.write(2, out):]
    except OSError:
        pass


def dir_problem(path: str, owner: int | None = None) -> str | None:
    """Why ``path`` is not a private directory of ours (None when it is). A symlink does not count,
    whatever it points to: lstat, never stat. ``owner``: whose it must be instead (a node's agent
    run as root reads every user's own directory)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as e:
        return f"{path} cannot be checked ({e.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != (os.getuid() if owner is None else owner):
        return f"{path} belongs to another user"
    if st.st_mode & 0o077:
        return f"{path} is open to others (mode {oct(st.st_mode & 0o777)})"
    return None


def _mean(xs) -> float | None:
    """The mean step period: a job that synchronises with the GPU every N steps queues N-1 steps in
    microseconds and waits in the Nth (a median would measure its launches, not its pace)."""
    return sum(xs) / len(xs) if xs else None


def _usual(gaps: list[float]) -> list[float]:
    """The step gaps without the pause that started the capture (a checkpoint, an evaluation: no
    step): the longest gap when it is over 4x the next longest. A job that syncs every N steps has
    several long gaps in the window: they are its pace, and stay."""
    if len(gaps) < 5:
        return gaps
    ordered = sorted(gaps)
    if ordered[-1] > 4 * ordered[-2]:
        longest = gaps.index(ordered[-1])
        return gaps[:longest] + gaps[longest + 1:]
    return gaps


class _Refused(Exception):
    """A capture's file not kept: the message says why."""


def _one_line(e: BaseException) -> str:
    if isinstance(e, _Refused):
        return str(e)[:200]
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:200]


def _stamp(t: float) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(t))


def _cuda_at_least(version: str | None, want: tuple[int, int]) -> bool:
    try:
        return tuple(int(p) for p in str(version).split(".")[:2]) >= want
    except ValueError:
        return False


class _Capture:
    """One capture's state. phase: asked -> running (training thread) -> stopped -> written (probe thread)."""

    def __init__(self, kind: str, before: list[float]) -> None:
        self.kind = kind
        self.phase = "asked"
        self.before = before
        self.during: list[float] = []
        self.after: list[float] = []
        self.settling = 0  # steps after the capture not measured yet
        self.last = 0.0  # the clock at the last step end (after our own start/stop work)
        self.held_at = 0.0  # held() then
        self.t = time.time()  # epoch seconds when it started
        self.handle: Any = None  # the profiler, then (memory) the snapshot
        self.record: dict | None = None


class Capturer:
    """Takes a trace or a memory snapshot of a few steps when asked (see the module's docstring)."""

    def __init__(self, directory: str, clock=time.perf_counter) -> None:
        self.directory = directory
        self.clock = clock
        # seconds the training thread has spent in timed calls so far (checkpoints, collectives: the
        # probe's ledger): a step gap that holds one is the job's pause, not its pace
        self.held = lambda: 0.0
        self.pid = os.getpid()
        self.error: str | None = None  # why no capture can be written (the directory)
        self._active: _Capture | None = None  # the one capture in progress (set by the probe thread only)
        self._records: collections.deque = collections.deque()
        self._started_at: dict[str, float] = {}
        self._closed = False
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            self.error = f"{directory} cannot be created ({e.strerror})"
            return
        self.error = dir_problem(directory)

    @property
    def busy(self) -> bool:
        """From the request until the steps after the capture are measured."""
        return self._active is not None

    # -- probe thread --------------------------------------------------------------
    def request(self, kind: str, recent_steps=()) -> str | None:
        """Ask for a capture; None if accepted, else why not (one line). ``recent_steps``: the
        latest step durations the caller has measured (the last ``AROUND`` give step_s_before)."""
        if kind not in KINDS:
            return "unknown capture kind"
        if self._closed:
            return "the probe is closing"
        if self.error:
            return f"no capture directory: {self.error}"
        if self._active is not None:
            return "a capture is already running"
        last = self._started_at.get(kind)
        if last is not None and self.clock() - last < RATE_S:
            return f"one {KINDS[kind]} per {RATE_S / 60:g} min"
        try:
            if sys.modules.get("torch") is None:
                return "no torch in this process"
            if kind == "memory":
                cuda = sys.modules.get("torch.cuda")
                if cuda is None or not cuda.is_initialized():
                    return "no CUDA in this process"  # never initialise CUDA ourselves
            cap = _Capture(kind, _usual([float(x) for x in list(recent_steps)[-AROUND:]]))
        except Exception as e:
            return _one_line(e)
        self._started_at[kind] = self.clock()
        self._active = cap
        return None

    def poll(self) -> list[dict]:
        """The captures finished since the last call, each reported once (then its follow-up)."""
        out = []
        while self._records:
            out.append(self._records.popleft())
        cap = self._active
        if cap is None:
            return out
        if cap.phase == "stopped":
            rec = self._write(cap)
            cap.handle = None
            out.append(rec)
            if rec["error"]:
                self._active = None
                return out
            cap.record = rec
            cap.phase = "written"
        if cap.phase == "written" and len(cap.after) >= AROUND:
            rec = cap.record
            assert rec is not None  # set with phase "written"
            if rec["step_s_after"] is None:
                out.append({"kind": cap.kind, "path": rec["path"], "step_s_after": _mean(_usual(cap.after))})
            self._active = None
        return out

    def close(self) -> None:
        """At exit: stop a capture left running; write one already stopped."""
        self._closed = True
        cap, self._active = self._active, None
        if cap is None:
            return
        try:
            if cap.phase in ("asked", "running"):
                self._abort(cap)
                self._records.append(self._record(cap, error=f"the process ended during the capture "
                                                               f"({len(cap.during)} of {STEPS} steps)"))
            elif cap.phase == "stopped":
                self._records.append(self._write(cap))
        except Exception as e:
            self._records.append(self._record(cap, error=_one_line(e)))

    # -- training thread -----------------------------------------------------------
    def on_step(self) -> None:
        """At the end of every optimizer step."""
        cap = self._active
        if cap is None:
            return
        try:
            self._step(cap)
        except Exception as e:
            self._fail(cap, e)

    def _step(self, cap: _Capture) -> None:
        now, held = self.clock(), self.held()
        if cap.phase == "asked":
            self._start(cap)
            cap.phase = "running"
            cap.last, cap.held_at = self.clock(), held
            return
        took = max(0.0, now - cap.last - (held - cap.held_at))
        cap.held_at = held
        if cap.phase == "running":
            cap.during.append(took)
            if len(cap.during) >= STEPS:
                self._stop(cap)
                cap.phase = "stopped"
            cap.last = self.clock()  # our own start/step/stop work is no step's time
            return
        if cap.settling < SETTLE:
            cap.settling += 1
        elif len(cap.after) < AROUND:
            cap.after.append(took)
        cap.last = now

    def _start(self, cap: _Capture) -> None:
        torch = sys.modules["torch"]
        cap.t = time.time()
        if cap.kind == "memory":
            sys.modules["torch.cuda.memory"]._record_memory_history(max_entries=MEMORY_ENTRIES)
            return
        # torch is imported: it steps an optimizer
        profiler = sys.modules.get("torch.profiler") or importlib.import_module("torch.profiler")
        # pytorch#144455: without CUPTI's teardown, steps stay 10-20 % slower after the profiler
        # stops; CUDA graphs crashed with teardown before CUDA 12.6. The user's own setting wins.
        cuda_version = getattr(torch.version, "cuda", None)
        if "TEARDOWN_CUPTI" not in os.environ and (cuda_version is None or _cuda_at_least(cuda_version, (12, 6))):
            os.environ["TEARDOWN_CUPTI"] = "1"
        activities = [profiler.ProfilerActivity.CPU]
        cuda = sys.modules.get("torch.cuda")
        if cuda is not None and cuda.is_available() and cuda.is_initialized():
            activities.append(profiler.ProfilerActivity.CUDA)
        # No schedule and no ProfilerStep marks: the step hook runs inside the optimizer's own
        # "Optimizer.step#..." range, so a mark there would overlap it, and Perfetto drops slices
        # that do not nest. The optimizer's ranges mark the steps instead.
        extra = {}
        try:  # one cycle: torch warns on the job's stderr that a cycle clears events unless they accumulate
            if "acc_events" in inspect.signature(profiler.profile).parameters:
                extra["acc_events"] = True
        except (TypeError, ValueError):
            pass
        cap.handle = profiler.profile(activities=activities, record_shapes=False, with_stack=False,
                                      profile_memory=False, **extra)
        with kineto_quiet():
            cap.handle.start()

    def _stop(self, cap: _Capture) -> None:
        if cap.kind == "memory":
            memory = sys.modules["torch.cuda.memory"]
            try:
                cap.handle = memory._snapshot()  # pickled in poll, off the training thread
            finally:
                memory._record_memory_history(enabled=None)
        else:
            with kineto_quiet():
                cap.handle.stop()

    def _fail(self, cap: _Capture, e: Exception) -> None:
        if cap.phase in ("asked", "running"):
            self._abort(cap)
        cap.handle = None
        self._records.append(self._record(cap, error=_one_line(e)))
        self._active = None

    def _abort(self, cap: _Capture) -> None:
        """Stop what a capture may have started, keeping nothing."""
        handle, cap.handle = cap.handle, None
        try:
            if cap.kind == "memory":
                memory = sys.modules.get("torch.cuda.memory")
                if memory is not None and cap.phase == "running":
                    memory._record_memory_history(enabled=None)
            elif handle is not None:
                with kineto_quiet():
                    handle.stop()
        except Exception:
            pass

    # -- files (probe thread) ------------------------------------------------------
    def _record(self, cap: _Capture, path: str | None = None, size: int | None = None,
                error: str | None = None) -> dict:
        return {"kind": cap.kind, "path": path, "t": cap.t, "steps": len(cap.during),
                "step_s_before": _mean(cap.before), "step_s_during": list(cap.during),
                "step_s_after": _mean(_usual(cap.after)) if len(cap.after) >= AROUND and not error else None,
                "bytes": size, "error": error}

    def _write(self, cap: _Capture) -> dict:
        try:
            path, size = self._write_file(cap)
        except Exception as e:
            return self._record(cap, error=_one_line(e))
        rec = self._record(cap, path, size)
        try:
            fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                removed = hold_budget(fd, budget_bytes(), os.path.basename(path), own_pid=self.pid)
            finally:
                os.close(fd)
        except OSError:
            removed = []
        if removed:
            rec["removed"] = removed[-MAX_REMOVED_NAMED:]
        return rec

    def _write_file(self, cap: _Capture) -> tuple[str, int]:
        """Into a fresh temp file of the directory, then linked under the final name: never
        overwrites a file, never follows a symlink."""
        problem = dir_problem(self.directory)
        if problem:
            raise _Refused(problem)
        fd, tmp = tempfile.mkstemp(prefix=".capture-", suffix=".tmp", dir=self.directory)  # 0600, O_EXCL
        try:
            if cap.kind == "trace":
                self._write_trace(cap, fd)
            else:
                with os.fdopen(fd, "wb") as f:
                    pickle.dump(cap.handle, f)  # what torch.cuda.memory._dump_snapshot writes
            os.chmod(tmp, 0o600)
            size = os.lstat(tmp).st_size
            if size > MAX_BYTES[cap.kind]:
                raise _Refused(f"the {KINDS[cap.kind]} is {size / 2**20:.0f} MiB, over the "
                              f"{MAX_BYTES[cap.kind] >> 20} MiB bound: deleted")
            base = f"capture-{self.pid}-{_stamp(cap.t)}"
            for n in range(1, 100):
                path = os.path.join(self.directory, f"{base}{_SUFFIX[cap.kind]}" if n == 1
                                    else f"{base}-{n}{_SUFFIX[cap.kind]}")
                try:
                    os.link(tmp, path)  # fails on any existing name, a symlink included
                    return path, size
                except FileExistsError:
                    continue
                except OSError as e:
                    if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV):
                        raise
                    # no hard links here: claim the name exclusively, then move the file onto it
                    try:
                        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
                    except FileExistsError:
                        continue
                    os.rename(tmp, path)
                    return path, size
            raise _Refused(f"{base}-*-{_SUFFIX[cap.kind]}: every name is taken")
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass

    def _write_trace(self, cap: _Capture, fd: int) -> None:
        """The profiler's JSON into a temp file of its own, then gzipped into ``fd`` (zlib lets the
        training thread run meanwhile); the JSON is bounded before it is compressed."""
        raw_fd, raw = tempfile.mkstemp(prefix=".capture-", suffix=".json.tmp", dir=self.directory)
        os.close(raw_fd)
        try:
            with kineto_quiet():
                cap.handle.export_chrome_trace(raw)
            size = os.lstat(raw).st_size
            if size > MAX_BYTES["trace"]:
                raise _Refused(f"the {KINDS['trace']} is {size / 2**20:.0f} MiB, over the "
                               f"{MAX_BYTES['trace'] >> 20} MiB bound: deleted")
            with open(raw, "rb") as src, os.fdopen(fd, "wb") as dst:
                fd = -1
                with gzip.GzipFile(filename="", mode="wb", fileobj=dst, compresslevel=6, mtime=int(cap.t)) as gz:
                    shutil.copyfileobj(src, gz, 1 << 20)
        finally:
            if fd >= 0:
                os.close(fd)
            try:
                os.unlink(raw)
            except FileNotFoundError:
                pass
