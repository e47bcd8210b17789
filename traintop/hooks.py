"""`--on-finding CMD`: run a command with the finding as JSON on stdin when a warning or worse
starts or ends (the dashboard, `traintop run`, `traintop record`, `traintop agent`).

Sampling never waits for it: events go through a bounded queue to one worker thread (a full
queue drops the event and counts it). Each run gets ``TIMEOUT_S``; past it the command and
everything it started (its own process group) are killed, and the worker reaps the child, so
no zombie is left. The command's output goes to a log file, not the screen; failures are
counted and summed up in one line (``problem()``) for the status bar or the end of a run.
The command always runs through ``/bin/sh -c`` (as cron and git hooks run theirs): a builtin
(``exit 3``), a pipe or a variable works as it would typed in a shell.

The event (one JSON object and a newline on the command's stdin):
    {"event": "start" | "end", "host", "rule", "subject", "severity", "title", "evidence",
     "start", "end" (unix seconds; "end" is null in a start event)}
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from typing import Callable, Iterable

from traintop.text import one_line

TIMEOUT_S = 30.0
QUEUE_MAX = 64
LOG_MAX_BYTES = 1 << 20  # the log is started afresh (the old one kept as .1) past this


class FindingEvents:
    """Turns the rules' active alerts, tick after tick, into start and end events (once each)."""

    def __init__(self, host: str) -> None:
        self.host = host
        self._active: dict[tuple[str, str], tuple] = {}

    def update(self, alerts: Iterable[tuple], t: float) -> list[dict]:
        """``alerts``: (rule, severity, subject, title, evidence, start[, explained_by]) of every active alert.

        A finding that a stronger one explains when it starts is not announced: the stronger one
        is (one situation, one page). One announced before it was explained ends as usual, saying
        what explains it."""
        from traintop.rules import Severity

        now = {}
        for rule, sev, subj, title, ev, start, *by in alerts:
            explained = by[0] if by else None
            if sev >= Severity.WARNING and (explained is None or (rule, subj) in self._active):
                now[(rule, subj)] = (sev, title, ev, start, explained)
        events = []
        for key, (sev, title, ev, start, explained) in now.items():
            if key not in self._active:
                events.append(self._event("start", key, sev.label, title, ev, start, None, explained))
        for key, (sev, title, ev, start, explained) in self._active.items():
            if key not in now:
                events.append(self._event("end", key, sev.label, title, ev, start, t, explained))
        self._active = now
        return events

    def _event(self, kind, key, severity, title, evidence, start, end, explained_by=None) -> dict:
        return {"event": kind, "host": self.host, "rule": key[0], "subject": key[1], "severity": severity,
                "title": title, "evidence": one_line(evidence, 4000), "start": start, "end": end,
                "explained_by": explained_by}


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
        self._thread = threading.Thread(target=self._work, name="traintop-on-finding", daemon=True)
        self._thread.start()

    def submit(self, event: dict) -> None:
        """Never blocks."""
        try:
            self._q.put_nowait(event)
        except queue.Full:
            self.dropped += 1

    def close(self, wait: float = 5.0) -> None:
        """Let the queued events run for up to ``wait`` seconds, then stop."""
        try:
            self._q.put(None, timeout=wait)
        except queue.Full:
            return
        self._thread.join(timeout=wait)

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
        try:
            argv, shell = self._argv()
            try:
                p = subprocess.Popen(argv, shell=shell, stdin=subprocess.PIPE, stdout=log or subprocess.DEVNULL,
                                     stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
                                     start_new_session=True, close_fds=True)
            except (OSError, ValueError) as e:
                self._failed(f"cannot start it: {one_line(getattr(e, 'strerror', None) or str(e), 100)}")
                return
            try:
                p.stdin.write(data)
                p.stdin.close()
            except OSError:
                pass  # it did not read its input: its business
            try:
                rc = p.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # the command and whatever it started
                except OSError:
                    p.kill()
                p.wait()
                self._failed(f"timed out after {self.timeout:g} s, killed")
                return
            if rc != 0:  # the shell's own codes for a command it could not run
                why = {127: " (command not found)", 126: " (not executable)"}.get(rc, "")
                self._failed(f"exit status {rc}{why}" if rc > 0 else f"killed by signal {-rc}")
        finally:
            if log is not None:
                log.close()

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


def default_log_path() -> str | None:
    """on-finding.log in traintop's private directory (0700), or None where it cannot be made."""
    from traintop.probe_agent import ensure_private_dir, probe_dir

    try:
        return os.path.join(ensure_private_dir(probe_dir()), "on-finding.log")
    except OSError:
        return None


def finding_hook(command: str | None, say: Callable[[str], None] | None = None) -> FindingHook | None:
    """The --on-finding hook (None without a command), its output logged to traintop's private
    directory; ``say`` tells of the first failure where a line can be printed (not under the UI)."""
    return FindingHook(command, log_path=default_log_path(), on_first_failure=say) if command else None
