"""`--on-finding CMD`: run a command with the finding as JSON on stdin when a warning or worse
starts or ends (the dashboard, `traintop run`, `traintop record`, `traintop agent`).

Sampling never waits for it: events go through a bounded queue to one worker thread (a full
queue drops the event and counts it). Each run gets ``TIMEOUT_S``. When the command ends, or
at its timeout, or when traintop stops, everything it started is killed: its process group,
and every process that carries the run's mark in its environment (``TRAINTOP_ON_FINDING_RUN``,
inherited by descendants, so a child that left the group with ``setsid`` is found too). The
worker reaps the child, so no zombie is left. The command's output goes to a log file through
a pipe, at most ``LOG_MAX_BYTES`` a run (the rest is read and dropped, and the log says how
much); failures are counted and summed up in one line (``problem()``) for the status bar or
the end of a run. The command always runs through ``/bin/sh -c`` (as cron and git hooks run
theirs): a builtin (``exit 3``), a pipe or a variable works as it would typed in a shell.

The event (one JSON object and a newline on the command's stdin):
    {"event": "start" | "end", "host", "rule", "subject", "severity", "title", "evidence",
     "start", "end" (unix seconds; "end" is null in a start event)}
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import select
import signal
import subprocess
import threading
import time
from typing import IO, Callable, Iterable

from traintop.findings import Finding, Severity
from traintop.text import one_line

TIMEOUT_S = 30.0
QUEUE_MAX = 64
LOG_MAX_BYTES = 1 << 20  # the log is started afresh (the old one kept as .1) past this
MARK = "TRAINTOP_ON_FINDING_RUN"  # in the environment of a run and everything it starts


class FindingEvents:
    """Turns the rules' active findings, tick after tick, into start and end events (once each)."""

    def __init__(self, host: str) -> None:
        self.host = host
        self._active: dict[tuple[str, str], Finding] = {}

    def update(self, findings: Iterable[Finding], t: float) -> list[dict]:
        """``findings``: every active finding (the engine's records, as they are).

        A finding that a stronger one explains when it starts is not announced: the stronger one
        is (one situation, one page). One announced before it was explained ends as usual, saying
        what explains it."""
        now = {}
        for f in findings:
            if f.severity >= Severity.WARNING and (f.explained_by is None or (f.rule, f.subject) in self._active):
                now[(f.rule, f.subject)] = f
        events = []
        for key, f in now.items():
            if key not in self._active:
                events.append(self._event("start", f, None))
        for key, f in self._active.items():
            if key not in now:
                events.append(self._event("end", f, t))
        self._active = now
        return events

    def _event(self, kind: str, f: Finding, end: float | None) -> dict:
        return {"event": kind, "host": self.host, "rule": f.rule, "subject": f.subject, "severity": f.severity.label,
                "title": f.title, "evidence": one_line(f.evidence, 4000), "start": f.start, "end": end,
                "explained_by": f.explained_by}


class FindingHook:
    def __init__(self, command: str, timeout: float = TIMEOUT_S, log_path: str | None = None,
                 on_first_failure: Callable[[str], None] | None = None) -> None:
        self.command = command
        self.timeout = timeout
        self.log_path = log_path
        self.on_first_failure = on_first_failure
        self.runs = 0
        self.failures = 0
        self.dropped = 0
        self.last_failure: str | None = None
        self._q: queue.Queue = queue.Queue(maxsize=QUEUE_MAX)
        self._current: tuple[subprocess.Popen, str] | None = None
        self._stopping = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="traintop-on-finding", daemon=True)
        self._thread.start()

    def submit(self, event: dict) -> None:
        """Never blocks."""
        try:
            self._q.put_nowait(event)
        except queue.Full:
            self.dropped += 1

    def close(self, wait: float = 5.0) -> None:
        """Let the queued events run for up to ``wait`` seconds, then stop: a run still going is
        killed with everything it started, and nothing of it outlives traintop. Closing again does
        nothing (the agent's hosts share one hook, and each host's session closes it)."""
        if self._closed:
            return
        self._closed = True
        end = time.monotonic() + wait
        try:
            self._q.put(None, timeout=wait)
        except queue.Full:
            pass
        self._thread.join(timeout=max(0.0, end - time.monotonic()))
        if self._thread.is_alive():
            self._stopping.set()  # the run under way ends at its next look (0.2 s)
            self._thread.join(timeout=5.0)
        current = self._current
        if current is not None:
            kill_run(current[0].pid, current[1])

    def problem(self) -> str | None:
        """One line for the status bar, or None while every run succeeded."""
        if not self.failures and not self.dropped:
            return None
        parts = []
        if self.failures:
            parts.append(f"{self.failures} of {self.runs} run(s) failed (last: {self.last_failure})")
        if self.dropped:
            parts.append(f"{self.dropped} event(s) dropped (the command is slower than the findings)")
        where = f"; its output: {self.log_path}" if self.log_path else ""
        return "--on-finding: " + "; ".join(parts) + where

    def _argv(self):
        return ["/bin/sh", "-c", self.command], False

    def _work(self) -> None:
        while True:
            event = self._q.get()
            if event is None:
                return
            try:
                self._run(event)
            except Exception as e:  # the hook must never take anything else down
                self._failed(f"{type(e).__name__}: {one_line(str(e), 100)}")

    def _run(self, event: dict) -> None:
        self.runs += 1
        data = (json.dumps(event) + "\n").encode()
        log = self._open_log(event)
        token = secrets.token_hex(8)
        try:
            argv, shell = self._argv()
            try:
                p = subprocess.Popen(argv, shell=shell, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                     env=dict(os.environ, **{MARK: token}))
            except (OSError, ValueError) as e:
                self._failed(f"cannot start it: {one_line(getattr(e, 'strerror', None) or str(e), 100)}")
                return
            self._current = (p, token)
            stdin, stdout = p.stdin, p.stdout
            assert stdin is not None and stdout is not None  # both PIPE
            try:
                try:
                    stdin.write(data)
                    stdin.close()
                except OSError:
                    pass  # it did not read its input: its business
                rc = self._follow(p, stdout, log)
            finally:
                kill_run(p.pid, token)  # whatever it left behind, in its group or out of it
                p.wait()
                stdout.close()
                self._current = None
            if rc is None:
                self._failed(f"timed out after {self.timeout:g} s, killed")
            elif rc != 0:  # the shell's own codes for a command it could not run
                why = {127: " (command not found)", 126: " (not executable)"}.get(rc, "")
                self._failed(f"exit status {rc}{why}" if rc > 0 else f"killed by signal {-rc}")
        finally:
            if log is not None:
                log.close()

    def _follow(self, p: subprocess.Popen, out: IO[bytes], log) -> int | None:
        """Copy the command's output (``out``) into the log (at most LOG_MAX_BYTES) until it exits or its
        time is up; its exit status, or None past the timeout. A background child that keeps the
        output open does not keep this waiting: the command's own exit ends it."""
        deadline = time.monotonic() + self.timeout
        fd = out.fileno()
        os.set_blocking(fd, False)
        kept = dropped = 0
        open_ = True
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or self._stopping.is_set():
                rc = None
                break
            if open_:
                ready, _, _ = select.select([fd], [], [], min(0.2, left))
                if ready:
                    try:
                        chunk = os.read(fd, 65536)
                    except BlockingIOError:
                        chunk = None
                    if chunk == b"":
                        open_ = False
                    elif chunk:
                        take = chunk[:max(0, LOG_MAX_BYTES - kept)]
                        kept += len(take)
                        dropped += len(chunk) - len(take)
                        if log is not None and take:
                            try:
                                log.write(take)
                            except OSError:
                                pass
            else:
                time.sleep(min(0.1, left))
            rc = p.poll()
            if rc is not None:
                break
        if dropped and log is not None:
            try:
                log.write(f"\n--- output cut: {dropped} more byte(s) not kept (at most {LOG_MAX_BYTES} a run)\n".encode())
            except OSError:
                pass
        if log is not None:
            try:
                log.flush()
            except OSError:
                pass
        return rc

    def _open_log(self, event: dict):
        if not self.log_path:
            return None
        try:
            if os.path.exists(self.log_path) and os.path.getsize(self.log_path) > LOG_MAX_BYTES:
                os.replace(self.log_path, self.log_path + ".1")
            fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            log = os.fdopen(fd, "ab")
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
            log.write(f"--- {stamp} {event.get('event')} {event.get('rule')} {event.get('subject')}\n".encode())
            log.flush()
            return log
        except OSError:
            return None

    def _failed(self, why: str) -> None:
        self.failures += 1
        self.last_failure = why
        if self.failures == 1 and self.on_first_failure is not None:
            try:
                self.on_first_failure(f"--on-finding command failed: {why}")  # the teller adds "traintop: "
            except Exception:
                pass


def kill_run(pid: int, token: str, settle_s: float = 2.0) -> int:
    """SIGKILL a run's process group and every process whose environment carries its mark
    (descendants that started a session of their own), then wait up to ``settle_s`` for them
    to be gone. Returns how many were found."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    from traintop.collectors.procread import bounded, read_file

    mark = f"{MARK}={token}".encode()
    me = os.getpid()
    found = []
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not name.isdigit() or int(name) == me:
            continue
        env = bounded("environ", read_file, f"/proc/{name}/environ", 1 << 20)  # a process may hold its memory up
        if env and mark in env.split(b"\0"):
            found.append(int(name))
            try:
                os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass
    end = time.monotonic() + settle_s
    for p in found:
        while time.monotonic() < end and not _dead(p):
            time.sleep(0.02)
    return len(found)


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def default_log_path() -> str | None:
    """on-finding.log in traintop's private directory (0700), or None where it cannot be made."""
    from traintop.injob.agent import ensure_private_dir, probe_dir

    try:
        return os.path.join(ensure_private_dir(probe_dir()), "on-finding.log")
    except OSError:
        return None


def finding_hook(command: str | None, say: Callable[[str], None] | None = None) -> FindingHook | None:
    """The --on-finding hook (None without a command), its output logged to traintop's private
    directory; ``say`` tells of the first failure where a line can be printed (not under the UI)."""
    return FindingHook(command, log_path=default_log_path(), on_first_failure=say) if command else None
