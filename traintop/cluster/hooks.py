"""`--on-finding CMD`: run a command with the finding as JSON on stdin, off the sampling thread.

Events go through a bounded queue to one worker thread; a full queue drops the event (and
counts it) rather than delay sampling, and a command that runs past its time is killed.
The command is run without a shell when it has no shell syntax.
"""

from __future__ import annotations

import json
import queue
import shlex
import subprocess
import sys
import threading

TIMEOUT_S = 30.0
QUEUE_MAX = 64


class FindingHook:
    def __init__(self, command: str, timeout: float = TIMEOUT_S) -> None:
        self.command = command
        self.timeout = timeout
        self.dropped = 0
        self.failures = 0
        self._q: queue.Queue = queue.Queue(maxsize=QUEUE_MAX)
        self._thread = threading.Thread(target=self._run, name="traintop-on-finding", daemon=True)
        self._thread.start()

    def submit(self, event: dict) -> None:
        try:
            self._q.put_nowait(event)
        except queue.Full:
            self.dropped += 1

    def close(self, wait: float = 5.0) -> None:
        try:
            self._q.put_nowait(None)
        except queue.Full:
            return
        self._thread.join(timeout=wait)

    def _argv(self):
        if any(c in self.command for c in "|&;<>()$`\\\"'*?[]#~=%"):
            return self.command, True
        return shlex.split(self.command), False

    def _run(self) -> None:
        while True:
            event = self._q.get()
            if event is None:
                return
            argv, shell = self._argv()
            try:
                subprocess.run(argv, shell=shell, input=(json.dumps(event) + "\n").encode(), timeout=self.timeout,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
            except (OSError, subprocess.SubprocessError) as e:
                self.failures += 1
                if self.failures == 1:
                    print(f"traintop: --on-finding command failed: {type(e).__name__}", file=sys.stderr)
