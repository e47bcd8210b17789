"""TraintopApp: draws a Session and turns keys into its commands; the feed thread posts
FrameReady after each ingest. What to do lives in the session, what to say in
``traintop.reports.status_text``, the keys in ``keys.py``, the GPUs' layout in ``widgets/gpu_area.py``."""

from __future__ import annotations

import gc

from textual import work
from textual.app import App, ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Footer

from traintop.app.keys import BINDINGS, REPLAY_ACTIONS, unavailable
from traintop.app.notices import Notices, plain_message
from traintop.app.redraw import RedrawPacer
from traintop.app.screen import DashboardScreen
from traintop.errors import RecordingError, TraintopError
from traintop.watch.session import Session
from traintop.reports.status_text import banner_parts, problem_line, recording_saved, session_parts, short_path
from traintop.text import one_line
from traintop.reports.view import View, build_view
from traintop.widgets.alerts_panel import AlertsPanel
from traintop.widgets.gpu_area import COMPACT_HEIGHT, COMPACT_WIDTH, SHORT_HEIGHT, GpuArea
from traintop.widgets.gpu_table import GpuTable
from traintop.widgets.help_screen import HelpScreen
from traintop.widgets.host_panel import HostPanel
from traintop.widgets.process_panel import ProcessPanel
from traintop.widgets.quit_screen import QuitJobScreen
from traintop.widgets.replay_bar import ReplayBar
from traintop.widgets.stacks_screen import StacksScreen
from traintop.widgets.status_bar import StatusBar

__all__ = ["TraintopApp", "FrameReady", "banner_parts", "short_path"]

BANNER_PART_S = 6.0  # each part of a message too long for the top line, shown in turn
# A frame allocates thousands of short-lived objects (Text, Segments, Strips, messages): at
# Python's default gen-0 threshold (700) the cyclic GC ran ~1.1 times a frame, ~1 ms of a
# 10 ms frame on dev; at 10 000 it runs every ~15 frames, ~0.3 ms a frame. Nearly all of
# those objects are freed by reference counting; the threshold only delays cycles.
GC_THRESHOLD = (10_000, 10, 10)


class FrameReady(Message):
    """Posted (from the feed's thread) when the monitor has new data."""


class TraintopApp(App):
    # Textual's text selection is off: a mouse drag across the panels while they redraw crashed it
    # inside Textual (AttributeError on a selection end), found by the monkey test; the terminal's
    # own selection (Shift+drag in most terminals) still copies text.
    ALLOW_SELECT = False
    CSS_PATH = "traintop.tcss"
    TITLE = "traintop"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = BINDINGS

    def __init__(self, session: Session, *, start_feed: bool = True, banner: str | None = None,
                 max_fps: float | None = None, grace: float = 10.0) -> None:
        super().__init__()
        self.session = session
        self.monitor = session.monitor
        self.replay = session.replay
        if self.replay is not None:  # replay commands run on a worker (a seek rebuilds minutes of history)
            self.replay.runner = self._run_replay_commands
        self.grace = grace  # `traintop run`: the job's time to stop after SIGTERM
        self._pacer = RedrawPacer(self, max_fps)
        self.start_feed = start_feed
        self.banner = banner
        self.paused = False
        self._pending = False
        self._compact: bool | None = None
        self._term_size = (80, 24)
        self.last_view: View | None = None
        self._status: StatusBar | None = None  # set on mount
        self._gpus = GpuArea()
        self._bindings_state: tuple | None = None
        self._notices = Notices(self)
        self._told_job_end = False

    @property
    def focused_gpu(self) -> int | None:
        return self._gpus.focused

    @property
    def gpu_mode(self) -> str:
        return self._gpus.mode

    def get_driver_class(self):
        from traintop.app.driver import quiet_driver_class

        return quiet_driver_class(super().get_driver_class())

    # -- layout -----------------------------------------------------------------
    def get_default_screen(self) -> DashboardScreen:
        return DashboardScreen(id="_default")  # partial updates render only the rows that changed

    def compose(self) -> ComposeResult:
        yield StatusBar()
        if self.replay is not None:
            yield ReplayBar()
        with Horizontal(id="main"):
            with Vertical(id="left"):
                with Vertical(id="gpus"):
                    yield GpuTable()
                yield AlertsPanel()
            with Vertical(id="side"):
                yield HostPanel()
                yield ProcessPanel()
        yield Footer(compact=True)

    def on_mount(self) -> None:
        # References, not queries: app.query_one searches the active screen, which is the
        # help screen while it is open.
        self._status = self._notices.bar = self.query_one(StatusBar)
        self._gpus.mount(self.query_one("#gpus", Vertical), self.query_one(GpuTable))
        self._host = self.query_one(HostPanel)
        self._process = self.query_one(ProcessPanel)
        self._alerts = self.query_one(AlertsPanel)
        self._replay_bar = self.query_one(ReplayBar) if self.replay is not None else None
        self._gc_threshold = gc.get_threshold()
        gc.set_threshold(*GC_THRESHOLD)
        self._apply_size()
        self.refresh_view()
        if self.banner:
            self._say_in_turn(banner_parts(self.banner, self._notices.room()))
        if self.start_feed:
            self.session.start(self._notify_from_feed)

    def on_unmount(self) -> None:
        if getattr(self, "_gc_threshold", None):
            gc.set_threshold(*self._gc_threshold)
        self.session.close()

    def on_resize(self, event) -> None:
        self._apply_size(event.size)
        self.refresh_view()

    def _apply_size(self, size=None) -> None:
        w, h = size or self.size
        self._term_size = (w, h)  # on a resize event, self.size may still be the old one
        compact = w < COMPACT_WIDTH or h < COMPACT_HEIGHT
        if compact != self._compact:
            self._compact = compact
            self.screen.set_class(compact, "compact")
        self.screen.set_class(h < SHORT_HEIGHT, "-short")

    # -- messages: one line in the status bar, over nothing ------------------------
    def say(self, message: str, severity: str = "information", timeout: float | None = None) -> None:
        self._notices.say(message, severity, timeout)

    def _say_in_turn(self, parts: list[str], severity: str = "information", last_s: float = 12) -> None:
        self._notices.say_in_turn(parts, BANNER_PART_S, severity, last_s)

    def notify(self, message, *, title: str = "", severity: str = "information", timeout: float | None = None,
               markup: bool = True) -> None:
        self.say(plain_message(message, title, markup), severity, timeout)  # ours call say()

    # -- data in ------------------------------------------------------------------
    def _notify_from_feed(self) -> None:
        # Runs on the feed's thread: coalesce, so a slow terminal never builds a queue.
        if not self._pending:
            self._pending = True
            self.post_message(FrameReady())

    def on_frame_ready(self, _: FrameReady) -> None:
        self._pending = False
        if self.paused or not self.is_running or (self.replay is not None and self.replay.busy):
            return
        self._pacer.frame_ready()

    def refresh_view(self) -> None:
        if self._status is None:  # not mounted yet (a resize comes first)
            return
        self._pacer.drawn(self.monitor.alert_changes)
        view = build_view(self.monitor)
        self.last_view = view
        end = view.process.job_end
        if end is not None and not self._told_job_end:  # `traintop run`: say at once how the job ended
            self._told_job_end = True
            if isinstance(self.screen, QuitJobScreen):
                self.screen.dismiss("cancel")  # it asked about a job that is no longer running
            # in parts where the top line is short: "q quits with its status" is never cut off
            self._say_in_turn(banner_parts(f"{end.describe(capital=True)}. Its history stays on screen; "
                                           "q quits with its status.", self._notices.room()),
                              severity="error" if end.status else "information", last_s=15)
        compact = bool(self._compact)
        with self.batch_update():
            self._show_status(view)
            self._gpus.show(view, compact, self._term_size, self._replay_bar is not None)
            self.screen.set_class(self._gpus.mode == "none", "-no-gpu")
            self._host.show(view.host, compact)
            self._process.show(view.process, compact)
            self._alerts.show(view, compact, self._gpus.focused if self._gpus.mode == "focus" else None)
            if self._replay_bar is not None:
                self._show_replay_bar()
        self._refresh_bindings_if_changed()

    def _show_status(self, view: View) -> None:
        path = self.session.recording_path
        self._status.show(
            mode=self.session.kind, text=session_parts(view, self.session.kind), t=view.t, paused=self.paused,
            recording=one_line(short_path(path)) if path is not None and not view.recording_error else None,
            problem=problem_line(view),
            replay="end of recording" if self.replay is not None and self.replay.at_end else None)

    def _show_replay_bar(self) -> None:
        rc = self.replay
        self._replay_bar.show(rc.t_start, rc.t_end, rc.position, rc.speed, rc.playing)

    # -- which keys apply now (the footer shows those) --------------------------------
    def _is_paused(self) -> bool:
        return (not self.replay.playing) if self.replay is not None else self.paused

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action == "unavailable":  # only where none of the key's own actions can run
            return bool(parameters) and not any(self.check_action(a, ()) for a in parameters)
        recording = self.monitor.recorder is not None
        return {
            "record": self.replay is None and not recording,
            "stop_recording": self.replay is None and recording,
            "pause": not self._is_paused(),
            "resume": self._is_paused(),
            "focus_gpu": self.last_view is not None and len(self.last_view.gpus) > 1,
            "stacks": bool(parameters) or self.session.has_stacks(self.last_view),
            "all_gpus": self._gpus.focused is not None,
            "next_page": self._gpus.mode == "table" and self._gpus.pages > 1,
        }.get(action, self.replay is not None if action in REPLAY_ACTIONS else True)

    def _refresh_bindings_if_changed(self) -> None:
        state = (self._is_paused(), self._gpus.focused, self._gpus.mode, self._gpus.pages,
                 len(self.last_view.gpus) if self.last_view else 0, self.session.has_stacks(self.last_view))
        if state != self._bindings_state:
            self._bindings_state = state
            self.refresh_bindings()

    # -- actions --------------------------------------------------------------------
    def _overlay_open(self) -> bool:
        # Keys typed fast can all reach the dashboard before the first overlay is shown: open
        # one overlay at a time, never a stack of them.
        return isinstance(self.screen, (HelpScreen, StacksScreen, QuitJobScreen))

    async def action_quit(self) -> None:
        """q (and Ctrl-Q): with a job that `traintop run` started still running, ask whether to
        stop it, leave it running or stay; otherwise quit."""
        if not self.session.job_running():
            self.exit()
        elif not isinstance(self.screen, QuitJobScreen):
            job = self.session.job
            self.push_screen(QuitJobScreen(job.pid, self.grace, job.log_path), self._quit_answered)

    async def action_help_quit(self) -> None:
        """Ctrl-C: what q does. (Textual binds it to a notice "Do you want to quit? Press ctrl+q",
        its App.action_help_quit; a terminal user presses Ctrl-C to stop what runs in it.)"""
        await self.action_quit()

    def _quit_answered(self, answer: str | None) -> None:
        if answer == "stop":
            self.stop_job()
        elif answer == "leave":
            self.exit()

    def stop_job(self) -> None:
        """The path a SIGTERM to traintop takes: SIGTERM to the job's whole group, SIGKILL after
        the grace period, then quit."""
        self.session.stop_job(self.grace)
        self.exit()

    def action_help(self) -> None:
        if not self._overlay_open():
            self.push_screen(HelpScreen(self.session.where_things_go()))

    def action_stacks(self, _anyway: bool = False) -> None:
        """Every thread's Python stack in the job (from the probe): where a stalled job hangs."""
        if not self._overlay_open():
            self.push_screen(StacksScreen(self.monitor, self.session.ask_for_stacks()))

    def action_pause(self) -> None:
        if self.replay is not None:
            self._replay_command("toggle_pause")
            return
        self.paused = not self.paused
        self.refresh_view()

    action_resume = action_pause

    def action_scroll_alerts(self, lines: int) -> None:
        if self._alerts.max_scroll_y == 0:
            self.say("The alerts fit their panel: nothing to scroll.")
            return
        self._alerts.scroll_relative(y=int(lines), animate=False)

    def action_focus_gpu(self, direction: int) -> None:
        gpus = [g.sample.index for g in self.last_view.gpus] if self.last_view else []
        if len(gpus) >= 2:
            self._gpus.focus_next(gpus, int(direction))
            self.refresh_view()

    def action_unavailable(self, action: str, *alternatives: str) -> None:
        if why := unavailable(action, len(self.last_view.gpus) if self.last_view else 0):
            self.say(why)

    def action_cluster_key(self) -> None:
        self.say("h, j, a, u are traintop cluster's keys; here g focuses a GPU.")

    def action_all_gpus(self) -> None:
        self._gpus.focused = None
        self.refresh_view()

    def action_next_page(self) -> None:
        self._gpus.next_page()
        self.refresh_view()

    # -- replay: the session queues the commands; they run on this worker --------------
    @work(thread=True, group="replay")
    def _run_replay_commands(self) -> None:
        self.replay.run_queued(lambda why: self.call_from_thread(self.say, why, "error"))
        if self.is_running:
            self.call_from_thread(self.refresh_view)

    _speed_why: str | None = None  # "0.25× is the slowest replay speed.", while it is on the top line

    def _replay_command(self, name: str, *args) -> None:
        if self.replay is not None:
            if why := getattr(self.replay, name)(*args):  # a speed past the range says why not
                self.say(why)
                self._speed_why = why
            elif name == "change_speed" and self._speed_why is not None:  # the speed changed: no longer true
                self._notices.withdraw(self._speed_why)
                self._speed_why = None
            self._show_replay_bar()

    def action_seek(self, seconds: float) -> None:
        self._replay_command("seek_by", float(seconds))

    def action_seek_fraction(self, frac: float) -> None:
        self._replay_command("seek_fraction", float(frac))

    def action_step(self, direction: int) -> None:
        self._replay_command("step", int(direction))

    def action_speed(self, direction: int) -> None:
        self._replay_command("change_speed", int(direction))

    # -- recording ----------------------------------------------------------------------
    @work(thread=True, exclusive=False)
    def _close_recording(self, rec) -> None:
        # Closing checkpoints and vacuums the file: seconds for a long session, so off the UI loop.
        try:
            rec.close()
            parts = recording_saved(rec.path, self._notices.room())
            if len(parts) > 1:  # the folder said next, not cut off
                self.call_from_thread(self._say_in_turn, parts)
            else:
                self.call_from_thread(self.say, parts[0])
        except RecordingError as e:
            self.call_from_thread(self.say, str(e), "error")

    def action_record(self) -> None:
        rec = self.session.stop_recording()
        if rec is not None:
            self._close_recording(rec)
        else:
            try:
                path = self.session.start_recording()
            except TraintopError as e:
                self.say(f"Cannot record: {e}", "error")
                return
            self.say(f"Recording: {short_path(path)}")
        self.refresh_bindings()
        self.refresh_view()

    action_stop_recording = action_record
