"""Feeds drive a Monitor: live collectors, the simulator, or a recording being replayed.

Each runs on its own thread and calls ``notify()`` after every ingest so a UI can
redraw; the UI cannot tell one feed from another. Replay also takes commands
(pause, step, seek, speed), queued by its ``ReplayControls``.
"""

from __future__ import annotations

import bisect
import dataclasses
import sqlite3
import threading
import time
from typing import Callable, Iterator, Protocol

from traintop.errors import RecordingError
from traintop.watch.monitor import Monitor
from traintop.watch.replay_controls import ReplayControls
from traintop.samples import Frame, SessionKind
from traintop.store import Store

Notify = Callable[[], None]


class FrameSource(Protocol):
    def next_frame(self) -> Frame: ...


class Feed:
    """Base: a thread that ticks; subclasses implement ``_tick``."""

    kind = SessionKind.LIVE

    def __init__(self, monitor: Monitor, interval: float) -> None:
        self.monitor = monitor
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._notify: Notify = lambda: None
        self.ticks = 0
        self.late_ticks = 0
        self.closers: list[Callable[[], None]] = []  # run once the thread has stopped

    def start(self, notify: Notify | None = None) -> None:
        if notify is not None:
            self._notify = notify
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"traintop-{self.kind}", daemon=True)
            self._thread.start()

    def replay_controls(self) -> ReplayControls | None:
        """Pause, seek, step and speed, queued, where the feed plays a recording; None for live data."""
        return None

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        closers, self.closers = self.closers, []
        for close in closers:
            try:
                close()
            except Exception:  # shutting down: nothing useful to report
                pass

    def _run(self) -> None:
        start = time.monotonic()
        k = 0
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as e:  # a broken source must not kill the dashboard
                self.monitor.source_error = f"{type(e).__name__}: {e}"
            self.ticks += 1
            self._notify()
            k += 1
            due = start + k * self.interval
            now = time.monotonic()
            if now > due + self.interval:  # fell behind: skip missed ticks, keep the phase
                self.late_ticks += 1
                k = int((now - start) / self.interval) + 1
                due = start + k * self.interval
            self._stop.wait(max(0.0, due - now))

    def _tick(self) -> None:
        raise NotImplementedError


class SourceFeed(Feed):
    """Ticks a frame source (live collectors or the simulator) at a fixed interval."""

    def __init__(self, monitor: Monitor, source: FrameSource, interval: float,
                 kind: SessionKind = SessionKind.LIVE) -> None:
        super().__init__(monitor, interval)
        self.source = source
        self.kind = kind

    def prefill(self, n: int) -> None:
        """Ingest ``n`` frames at once (tests, and a simulator's history at start)."""
        for _ in range(n):
            self.monitor.ingest(self.source.next_frame())

    def step(self) -> None:
        self.monitor.ingest(self.source.next_frame())
        self._notify()

    def _tick(self) -> None:
        if self.monitor.stacks_wanted:
            self.monitor.stacks_wanted = False
            ask = getattr(self.source, "request_stacks", None)
            if ask is not None:
                ask()
        while self.monitor.captures_wanted:
            kind = self.monitor.captures_wanted.pop(0)
            ask = getattr(self.source, "request_capture", None)
            if ask is not None:
                ask(kind)
        self.monitor.ingest(self.source.next_frame())
        failing = getattr(self.source, "failing", None)  # live collectors that raise (LiveSampler)
        if failing is not None:
            self.monitor.collector_errors = dict(failing)


class ReplayFeed(Feed):
    """Plays a recording (or any time-ordered frames) with pause, step, seek and speed."""

    kind = SessionKind.REPLAY
    SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
    WARM_S = 300.0  # history rebuilt before a seek target, so sparklines and rules have context
    RULES_WARM_S = 150.0  # rules need their longest window (120 s) plus hysteresis before the target
    # With the recording's own alerts (same rules, same thresholds) the rules need not run
    # up to the target: the store needs only what the rules' windows and the sparklines
    # (240 samples) look at.
    TRUSTED_WARM_S = 120.0
    # A recording without alerts these rules made (the demo, an nvidia-smi log, an older file,
    # other thresholds) is judged once in full on its first seek when it is this short (samples
    # times GPUs: the rules cost ~0.5 ms a GPU-sample on 2 slow cores), so an alert seen after a
    # seek has the start and end it has when the file plays from its start.
    JUDGE_ALL_MAX_GPU_SAMPLES = 4000

    def __init__(self, monitor: Monitor, reader, *, loop: bool = False, tick: float = 0.1,
                 kind: SessionKind = SessionKind.REPLAY) -> None:
        super().__init__(monitor, tick)
        self.kind = kind
        self.reader = reader
        self.loop = loop
        self.t_start = reader.t_start
        self.t_end = reader.t_end
        self.position = self.t_start
        self.speed = 1.0
        self.playing = True
        self.at_end = False
        self._lock = threading.RLock()
        self._it: Iterator[Frame] | None = None  # None: nothing to read (no sample in the recording)
        self._peek: Frame | None = None
        self._peek_ready = False
        self._skip_to: float | None = None
        self._wall: float | None = None
        self._recorded_alerts = None
        try:
            if hasattr(reader, "judged_by") and reader.judged_by(monitor.engine.config):
                self._recorded_alerts = reader.alerts()
        except (RecordingError, sqlite3.Error, ValueError):  # an unreadable alerts table costs speed only
            self._recorded_alerts = None
        stacks = getattr(reader, "stacks", None)
        self._stacks = stacks() if stacks is not None else []  # the probes' thread stacks, by time
        self._stack_times = [d.t for d in self._stacks]
        self._emitted_t: float | None = None
        self._judged = self._recorded_alerts is not None
        if self._recorded_alerts is not None:
            # each finding starts and ends where the recording says, played from the start or after a
            # seek (what was up when `r` was pressed mid-session shows from the first sample), as
            # analyze reports it; the rules give the figures of now
            monitor.engine.follow(self._recorded_alerts, session_end=self.t_end)
        self.controls = ReplayControls(self)
        if self.t_start is not None:
            self._open_at(self.t_start)
            self._emit_until(self.t_start)  # something to show before the clock starts

    # -- iteration -----------------------------------------------------------
    def _open_at(self, t: float, after: bool = False) -> None:
        """Read from ``t`` on (after ``t`` with ``after``); the next chunk is decoded only when
        playback reaches it."""
        self._it = iter(self.reader.frames(t_from=t))
        self._skip_to = t if after else None
        self._emitted_t = None  # the first frame read brings every stack recorded before it
        self._peek_ready = False
        self._peek = None

    def _next(self) -> Frame | None:
        it = self._it
        if it is None:
            return None
        f = next(it, None)
        while f is not None and self._skip_to is not None and f.t <= self._skip_to:
            f = next(it, None)
        self._skip_to = None
        return f

    def _ensure_peek(self) -> Frame | None:
        if not self._peek_ready:
            self._peek = self._next()
            self._peek_ready = True
        return self._peek

    def peek(self) -> Frame | None:
        """The next frame playback would show (None: nothing left to read)."""
        with self._lock:
            return self._ensure_peek()

    def _take(self) -> Frame | None:
        f = self._ensure_peek()
        self._peek_ready = False
        if f is not None and self._stacks:
            # the stacks recorded since the previous frame travel with this one, as they did live
            lo = bisect.bisect_right(self._stack_times, self._emitted_t) if self._emitted_t is not None else 0
            hi = bisect.bisect_right(self._stack_times, f.t)
            if hi > lo:
                f = dataclasses.replace(f, stacks=tuple(self._stacks[lo:hi]))
        if f is not None:
            self._emitted_t = f.t
        return f

    def _emit_until(self, t: float, rules_from: float | None = None) -> int:
        n = 0
        while (peek := self._ensure_peek()) is not None and peek.t <= t:
            f = self._take()
            assert f is not None  # the frame just peeked at
            self.monitor.ingest(f, evaluate=rules_from is None or f.t >= rules_from)
            n += 1
        return n

    # -- commands (any thread; a UI queues them through ``controls``) ---------------
    def replay_controls(self) -> ReplayControls:
        return self.controls

    def toggle_pause(self) -> None:
        with self._lock:
            if self.at_end and not self.playing:
                self.seek(self.t_start)
            self.playing = not self.playing
            self._wall = None

    def faster(self) -> None:
        with self._lock:
            i = self.SPEEDS.index(self.speed) if self.speed in self.SPEEDS else 2
            self.speed = self.SPEEDS[min(i + 1, len(self.SPEEDS) - 1)]

    def slower(self) -> None:
        with self._lock:
            i = self.SPEEDS.index(self.speed) if self.speed in self.SPEEDS else 2
            self.speed = self.SPEEDS[max(i - 1, 0)]

    def step(self, direction: int = 1) -> None:
        """One frame forward or back; pauses."""
        with self._lock:
            self.playing = False
            if direction > 0:
                f = self._take()
                if f is not None:
                    self.monitor.ingest(f)
                    self.position = f.t
            else:
                times = self.monitor.store.times(None)
                if len(times) >= 2:
                    self.seek(times[-2])
        self._notify()

    def seek(self, t: float) -> None:
        """Jump to sample time ``t`` (clamped), rebuilding recent history."""
        if self.t_start is None:
            return
        with self._lock:
            t = min(max(t, self.t_start), self.t_end)
            if not self._judged:
                self._judged = True
                self._recorded_alerts = self._judge_all()
                if self._recorded_alerts is not None:  # from now on as played from the start
                    self.monitor.engine.follow(self._recorded_alerts, session_end=self.t_end)
            self.monitor.reset()
            if self._recorded_alerts is not None:
                # exactly the samples the view needs, decoded once (not the chunks around them),
                # straight into the store's series where nothing records them
                t_from = max(self.t_start, t - self.TRUSTED_WARM_S)
                if hasattr(self.reader, "history") and self.monitor.recorder is None:
                    for part in self.reader.history(t_from, t):
                        if isinstance(part, list):
                            self.monitor.ingest_many(part)
                        else:
                            self.monitor.ingest_series(part)
                else:
                    self.monitor.ingest_many(list(self.reader.frames(t_from=t_from, t_to=t)))
                with self.monitor.lock:
                    self.monitor.engine.restore(self._recorded_alerts, t, session_end=self.t_end)
                    self.monitor.engine.evaluate(self.monitor.store, t, force=True)  # evidence as of t
                    # the thread stacks that came with the frames up to t (the frames read here do not carry them)
                    last = self.monitor.store.t_last
                    for dump in self._stacks[:bisect.bisect_right(self._stack_times, last)] if last is not None else ():
                        self.monitor.stacks[dump.pid] = dump
                self._open_at(t, after=True)
                self._emitted_t = self.monitor.store.t_last
            else:
                self._open_at(max(self.t_start, t - self.WARM_S))
                self._emit_until(t, rules_from=t - self.RULES_WARM_S)
            self.position = t
            self.at_end = t >= self.t_end
            self._wall = None
        self._notify()

    def _judge_all(self):
        """Every alert these rules raise over the whole recording (closed at its last sample, as a
        recording's are), or None when it is too long to judge at a seek."""
        most = self.JUDGE_ALL_MAX_GPU_SAMPLES // max(1, len(self.monitor.info.gpus))
        count = getattr(self.reader, "frame_count", None)
        if count is not None and count > most:
            return None
        live = self.monitor.engine
        engine = type(live)(rules=live.rules, config=live.config, eval_every_s=live.eval_every_s,
                            max_history=live.max_history)
        judge = Monitor(self.monitor.info, store=Store(self.monitor.store.capacity), engine=engine)
        last = None
        for n, f in enumerate(self.reader.frames(), 1):
            if n > most:
                return None
            judge.ingest(f)
            last = f.t
        if last is not None:
            engine.close_all(last)
        return list(engine.alerts)

    def seek_relative(self, seconds: float) -> None:
        self.seek((self.position or 0.0) + seconds)

    def seek_fraction(self, frac: float) -> None:
        if self.t_start is not None:
            self.seek(self.t_start + (self.t_end - self.t_start) * frac)

    # -- the clock ------------------------------------------------------------
    def _tick(self) -> None:
        with self._lock:
            now = time.monotonic()
            if not self.playing or self.position is None:
                self._wall = None
                return
            if self._wall is None:
                self._wall = now
                return
            self.position += (now - self._wall) * self.speed
            self._wall = now
            self._emit_until(self.position)
            if self._ensure_peek() is None:
                if self.loop:
                    self.seek(self.t_start)
                    self.playing = True
                else:
                    self.at_end = True
                    self.playing = False
                    self.position = self.t_end
