"""TraintopApp: draws a Monitor's view; the feed thread posts FrameReady after each ingest."""

from __future__ import annotations

import time

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Footer

from traintop.errors import RecordingError, TraintopError
from traintop.feeds import Feed, ReplayFeed
from traintop.monitor import Monitor
from traintop.recording import new_recording_path
from traintop.text import one_line
from traintop.view import View, build_view
from traintop.widgets.alerts_panel import AlertsPanel
from traintop.widgets.gpu_panel import GpuPanel
from traintop.widgets.help_screen import HelpScreen
from traintop.widgets.host_panel import HostPanel
from traintop.widgets.process_panel import ProcessPanel
from traintop.widgets.replay_bar import ReplayBar
from traintop.widgets.status_bar import StatusBar

COMPACT_WIDTH = 120
COMPACT_HEIGHT = 36


class FrameReady(Message):
    """Posted (from the feed's thread) when the monitor has new data."""


class TraintopApp(App):
    CSS_PATH = "traintop.tcss"
    TITLE = "traintop"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help"),
        Binding("p,space", "pause", "pause"),
        Binding("r", "record", "record", show=False),
        Binding("left", "seek(-10)", "-10s", show=False),
        Binding("right", "seek(10)", "+10s", show=False),
        Binding("comma", "step(-1)", "step back", show=False),
        Binding("full_stop", "step(1)", "step", show=False),
        Binding("left_square_bracket", "speed(-1)", "slower", show=False),
        Binding("right_square_bracket", "speed(1)", "faster", show=False),
        Binding("home", "seek_fraction(0)", "start", show=False),
        Binding("end", "seek_fraction(1)", "end", show=False),
    ] + [Binding(str(d), f"seek_fraction({d / 10})", show=False) for d in range(10)]

    def __init__(self, monitor: Monitor, feed: Feed, *, mode: str = "live", start_feed: bool = True,
                 record_dir: str | None = None, banner: str | None = None, max_fps: float | None = None) -> None:
        super().__init__()
        # Redraws are the UI's main cost; sampling and recording keep the feed's interval.
        self.min_redraw_s = 1.0 / max_fps if max_fps else 0.0
        self._last_redraw = 0.0
        self._redraw_timer = None
        self.monitor = monitor
        self.feed = feed
        self.mode = mode
        self.start_feed = start_feed
        self.record_dir = record_dir
        self.banner = banner
        self.paused = False
        self._pending = False
        self._compact: bool | None = None
        self.last_view: View | None = None
        self._status: StatusBar | None = None  # set on mount
        self._panels: list[GpuPanel] = []

    # -- layout -----------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield StatusBar()
        if isinstance(self.feed, ReplayFeed):
            yield ReplayBar()
        with Horizontal(id="main"):
            yield VerticalScroll(id="gpus")
            with Vertical(id="side"):
                yield HostPanel()
                yield ProcessPanel()
        yield AlertsPanel()
        yield Footer()

    def on_mount(self) -> None:
        # References, not queries: app.query_one searches the active screen, which is the
        # help screen while it is open.
        self._status = self.query_one(StatusBar)
        self._gpus = self.query_one("#gpus", VerticalScroll)
        self._host = self.query_one(HostPanel)
        self._process = self.query_one(ProcessPanel)
        self._alerts = self.query_one(AlertsPanel)
        self._replay_bar = self.query_one(ReplayBar) if isinstance(self.feed, ReplayFeed) else None
        self._apply_size()
        self.refresh_view()
        if self.banner:
            self.say(self.banner, timeout=8)
        if self.start_feed:
            self.feed.start(self._notify_from_feed)

    def on_unmount(self) -> None:
        self.feed.stop()
        self.monitor.close()

    def on_resize(self, event) -> None:
        self._apply_size(event.size)
        self.refresh_view()

    def _apply_size(self, size=None) -> None:
        w, h = size or self.size
        compact = w < COMPACT_WIDTH or h < COMPACT_HEIGHT
        if compact != self._compact:
            self._compact = compact
            self.screen.set_class(compact, "compact")

    @property
    def compact(self) -> bool:
        return bool(self._compact)

    # -- data in ------------------------------------------------------------------
    def _notify_from_feed(self) -> None:
        # Runs on the feed's thread: coalesce, so a slow terminal never builds a queue.
        if not self._pending:
            self._pending = True
            self.post_message(FrameReady())

    def on_frame_ready(self, _: FrameReady) -> None:
        self._pending = False
        if self.paused or not self.is_running or self._redraw_timer is not None:
            return
        wait = self._last_redraw + self.min_redraw_s - time.monotonic()
        if wait > 0:  # draw the newest frame once the redraw budget allows
            self._redraw_timer = self.set_timer(wait, self._deferred_redraw)
        else:
            self.refresh_view()

    def _deferred_redraw(self) -> None:
        self._redraw_timer = None
        if not self.paused and self.is_running:
            self.refresh_view()

    def refresh_view(self) -> None:
        if self._status is None:  # not mounted yet (a resize comes first)
            return
        self._last_redraw = time.monotonic()
        view = build_view(self.monitor)
        self.last_view = view
        compact = self.compact
        with self.batch_update():
            self._show_status(view)
            if [p.index for p in self._panels] != [g.sample.index for g in view.gpus]:
                for p in self._panels:
                    p.remove()
                self._panels = [GpuPanel(g.sample.index) for g in view.gpus]
                self._gpus.mount_all(self._panels)
            for panel, gv in zip(self._panels, view.gpus):
                panel.show(gv, compact)
            self._host.show(view.host, compact)
            self._process.show(view.process, compact)
            self._alerts.show(view.active, view.recent, view.t, compact)
            if self._replay_bar is not None:
                f = self.feed
                self._replay_bar.show(f.t_start, f.t_end, f.position, f.speed, f.playing)

    def _show_status(self, view: View) -> None:
        # Names, driver and label come from the driver or a file: made safe here, once.
        names = {}
        for g in view.gpus:
            name = one_line(g.info.name, 200)
            names[name] = names.get(name, 0) + 1
        gpus = ", ".join(f"{n}× {name}" for name, n in names.items()) or "no GPU"
        bits = [one_line(view.hostname or "", 200), gpus]
        if view.driver:
            bits.append(f"driver {one_line(view.driver, 100)}")
        if self.mode in ("demo", "replay", "simulated") and view.label:
            bits.append(one_line(view.label, 200))
        rec = self.monitor.recorder
        problem = view.recording_error or view.source_error
        problem = one_line(problem, 500) if problem else None
        replay = None
        if isinstance(self.feed, ReplayFeed) and self.feed.at_end:
            replay = "end of recording"
        self._status.show(
            mode=self.mode, text=" · ".join(b for b in bits if b), t=view.t, paused=self.paused,
            recording=one_line(rec.path) if rec is not None and not view.recording_error else None,
            problem=problem, replay=replay)

    def say(self, message: str, **kw) -> None:
        """A toast. Its text may quote a file name or an error: shown as text, never markup."""
        self.notify(one_line(message, 1000), markup=False, **kw)

    # -- actions --------------------------------------------------------------------
    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_pause(self) -> None:
        if isinstance(self.feed, ReplayFeed):
            self.feed.toggle_pause()
        else:
            self.paused = not self.paused
        self.refresh_view()

    def action_seek(self, seconds: float) -> None:
        if isinstance(self.feed, ReplayFeed):
            self.feed.seek_relative(float(seconds))
            self.refresh_view()

    def action_seek_fraction(self, frac: float) -> None:
        if isinstance(self.feed, ReplayFeed):
            self.feed.seek_fraction(float(frac))
            self.refresh_view()

    def action_step(self, direction: int) -> None:
        if isinstance(self.feed, ReplayFeed):
            self.feed.step(int(direction))
            self.refresh_view()

    def action_speed(self, direction: int) -> None:
        if isinstance(self.feed, ReplayFeed):
            (self.feed.faster if int(direction) > 0 else self.feed.slower)()
            self.refresh_view()

    @work(thread=True, exclusive=False)
    def _close_recording(self, rec) -> None:
        # Closing checkpoints and vacuums the file: seconds for a long session, so off the UI loop.
        try:
            rec.close()
            self.call_from_thread(self.say, f"Recording saved: {rec.path}")
        except RecordingError as e:
            self.call_from_thread(self.say, str(e), severity="error")

    def action_record(self) -> None:
        if isinstance(self.feed, ReplayFeed):
            self.say("This is a replay: it is already a recording.", severity="warning")
            return
        rec = self.monitor.stop_recording()
        if rec is not None:
            self._close_recording(rec)
            self.refresh_view()
            return
        try:
            path = self.monitor.start_recording(new_recording_path(self.record_dir))
        except TraintopError as e:
            self.say(f"Cannot record: {e}", severity="error")
            return
        self.say(f"Recording to {path}")
        self.refresh_view()
