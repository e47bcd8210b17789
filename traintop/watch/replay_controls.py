"""What a user does to a replay (pause, step, seek, speed), queued for the feed that plays it.

A seek rebuilds minutes of history, so commands run in order off the caller's thread: a UI
returns at once and shows the target. A seek still waiting is replaced by a newer one (only
the newest target matters), and until the queue is done ``position`` is that target.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable


class ReplayControls:
    def __init__(self, feed) -> None:
        self.feed = feed  # a ReplayFeed: seek, step, toggle_pause, faster, slower, SPEEDS
        self._queue: deque[tuple[Callable[[], None], float | None]] = deque()
        self._lock = threading.Lock()
        self._running = False
        self._target: float | None = None
        self.last_error: str | None = None
        # Starts ``run_queued`` off the caller's thread; a UI gives its own worker instead.
        self.runner: Callable[[], None] = self._run_on_a_thread

    # -- where the replay is -------------------------------------------------------
    @property
    def t_start(self) -> float | None:
        return self.feed.t_start

    @property
    def t_end(self) -> float | None:
        return self.feed.t_end

    @property
    def speed(self) -> float:
        return self.feed.speed

    @property
    def playing(self) -> bool:
        return self.feed.playing

    @property
    def at_end(self) -> bool:
        return self.feed.at_end

    @property
    def position(self) -> float | None:
        """Where the replay is, or where a seek still to run will take it."""
        with self._lock:
            target = self._target
        return self.feed.position if target is None else target

    @property
    def busy(self) -> bool:
        """Commands are queued or running (the history is being rebuilt: nothing to draw yet)."""
        return self._running

    # -- commands: each returns at once ----------------------------------------------
    def toggle_pause(self) -> None:
        self._submit(self.feed.toggle_pause)

    def step(self, direction: int) -> None:
        self._submit(lambda: self.feed.step(direction))

    def seek_by(self, seconds: float) -> None:
        self.seek_to((self.position or 0.0) + seconds)

    def seek_fraction(self, frac: float) -> None:
        start, end = self.t_start, self.t_end
        if start is not None and end is not None:
            self.seek_to(start + (end - start) * frac)

    def seek_to(self, t: float) -> None:
        start, end = self.t_start, self.t_end
        if start is None or end is None:
            return
        t = min(max(t, start), end)
        self._submit(lambda: self.feed.seek(t), seek_to=t)

    def change_speed(self, direction: int) -> str | None:
        """One speed faster (``direction`` > 0) or slower; at the end of the range, why not."""
        speeds = self.feed.SPEEDS
        faster = direction > 0
        if self.speed == (speeds[-1] if faster else speeds[0]):
            return f"{self.speed:g}× is the {'fastest' if faster else 'slowest'} replay speed."
        self._submit(self.feed.faster if faster else self.feed.slower)
        return None

    # -- the queue ---------------------------------------------------------------------
    def _submit(self, command: Callable[[], None], seek_to: float | None = None) -> None:
        with self._lock:
            if seek_to is not None:
                if self._queue and self._queue[-1][1] is not None:  # a newer target replaces a waiting one
                    self._queue.pop()
                self._target = seek_to
            self._queue.append((command, seek_to))
            start = not self._running
            self._running = True
        if start:
            self.runner()

    def run_queued(self, on_error: Callable[[str], None] | None = None) -> None:
        """Run the commands in order until none is left (a runner's whole job). A command that
        fails (a damaged recording) is said through ``on_error``; the next ones still run."""
        while True:
            with self._lock:
                if not self._queue:
                    self._running = False
                    self._target = None
                    return
                command, _ = self._queue.popleft()
            try:
                command()
            except Exception as e:
                self.last_error = f"replay: {type(e).__name__}: {e}"
                if on_error is not None:
                    on_error(self.last_error)

    def _run_on_a_thread(self) -> None:
        threading.Thread(target=self.run_queued, name="traintop-replay-commands", daemon=True).start()
