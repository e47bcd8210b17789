"""A job started by `traintop run`: its process group, its output, its end.

The job runs in a process group of its own, so that a signal to traintop (SIGTERM from a
batch system, SIGHUP from a closed terminal, SIGINT) can be passed on to all of it —
launcher, ranks, loader workers, a shell's children — and so that what is left after a
grace period can be killed together. One thread reaps the job as soon as it ends (no
`<defunct>` left behind) and tells whoever listens how it ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable

DEFAULT_GRACE_S = 10.0
KILL_WAIT_S = 5.0  # after SIGKILL, how long to wait for a group member that does not go


@dataclass(frozen=True)
class JobEnd:
    pid: int
    t: float  # wall-clock time it was reaped
    returncode: int  # as Popen gives it: -N when killed by signal N
    forced: bool = False  # the SIGKILL was traintop's, once the grace period after a forwarded signal ran out

    @property
    def signal(self) -> int | None:
        return -self.returncode if self.returncode < 0 else None

    @property
    def status(self) -> int:
        """The exit status a shell would give: 128 + N for a job killed by signal N."""
        return 128 + self.signal if self.signal else self.returncode

    def describe(self, capital: bool = False) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.t))
        job = "Job" if capital else "job"
        if self.signal:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            forced = " (traintop's, once the grace period ran out)" \
                if self.forced and self.signal == signal.SIGKILL else ""
            return f"{job} killed by {name} at {when}{forced}"
        return f"{job} exited with {self.returncode} at {when}"


class Job:
    def __init__(self, proc: subprocess.Popen, cmd: list[str], log_path: str,
                 pumps: list[threading.Thread] | None = None, log_appended: bool = False) -> None:
        self.proc = proc
        self.log_appended = log_appended  # --log named an existing file: the job's output follows what it held
        self.pid = proc.pid
        self.pgid = proc.pid  # started as the leader of its own process group
        self.cmd = cmd
        self.log_path = log_path
        self.end: JobEnd | None = None
        self.ended = threading.Event()
        self._pumps = pumps or []
        self._listeners: list[Callable[[JobEnd], None]] = []
        self._reaper: threading.Thread | None = None
        self.kill_at: float | None = None  # when the grace period after a forwarded signal ends
        self.signals_received: list[int] = []
        self.killed = False  # traintop sent the group SIGKILL

    # -- the end ----------------------------------------------------------------------
    def on_end(self, listener: Callable[[JobEnd], None]) -> None:
        self._listeners.append(listener)

    def watch(self) -> None:
        """Reap the job from now on (call once whatever watches it by PID has found it)."""
        if self._reaper is None:
            self._reaper = threading.Thread(target=self._reap, name="traintop-job", daemon=True)
            self._reaper.start()

    def _reap(self) -> None:
        rc = self.proc.wait()
        self.end = JobEnd(self.pid, time.time(), rc, forced=self.killed)
        self.ended.set()
        for listener in self._listeners:
            try:
                listener(self.end)
            except Exception:  # a listener's trouble must not lose the job's end
                pass

    def wait(self, timeout: float | None = None) -> JobEnd | None:
        self.ended.wait(timeout)
        return self.end

    def drain_output(self, timeout: float = 2.0) -> None:
        """Let the output pumps reach the end of the job's output. A child the job left behind
        may hold the pipes open: wait a little, not forever."""
        deadline = time.monotonic() + timeout
        for t in self._pumps:
            t.join(max(0.0, deadline - time.monotonic()))

    # -- signals ------------------------------------------------------------------------
    def group_alive(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # a member changed its uid: it is still there
            return True
        return True

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def forward(self, sig: int, grace: float) -> None:
        """Pass ``sig`` on to the whole job; after ``grace`` seconds, `enforce` kills what is left."""
        self.signals_received.append(sig)
        self.signal_group(sig)
        if self.kill_at is None:
            self.kill_at = time.monotonic() + grace

    def enforce(self) -> bool:
        """Once the grace period is over, SIGKILL the job's group. True when nothing is left
        (or, past the grace period and a few seconds more, when the job itself has ended)."""
        now = time.monotonic()
        if self.kill_at is not None and now >= self.kill_at:
            self.killed = True
            self.signal_group(signal.SIGKILL)
        if not self.ended.is_set():
            return False
        if self.kill_at is None or now >= self.kill_at + KILL_WAIT_S:
            return True
        return not self.group_alive()

    def finish(self, poll: float = 0.1) -> JobEnd:
        """Wait until the job has ended and, after a forwarded signal, until its whole group is gone."""
        while not self.enforce():
            if self.ended.is_set():
                time.sleep(poll)
            else:
                self.ended.wait(poll)
        assert self.end is not None  # enforce is True only once `ended` is set, after `end`
        return self.end


FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def forward_signals(job: Job, grace: float, then: Callable[[int], None] | None = None) -> Callable[[], None]:
    """Pass SIGTERM, SIGHUP and SIGINT sent to traintop on to the job's group; returns a function
    that restores the previous handlers. ``then`` runs after forwarding (e.g. to close the UI).

    A signal traintop was started ignoring stays ignored (``nohup traintop run -- CMD``: the job
    inherits the same, and a closed terminal must leave both running, not kill the job after the
    grace period)."""

    def handler(signum, _frame):
        job.forward(signum, grace)
        if then is not None:
            then(signum)

    old = {s: signal.signal(s, handler) for s in FORWARDED if signal.getsignal(s) != signal.SIG_IGN}

    def restore() -> None:
        for s, h in old.items():
            signal.signal(s, h)

    return restore
