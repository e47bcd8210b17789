"""TraintopApp: draws a Monitor's view; the feed thread posts FrameReady after each ingest."""

from __future__ import annotations

import gc
import os
import re
import signal
import threading
import time
from collections import deque

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Footer

from traintop.errors import RecordingError, TraintopError
from traintop.feeds import Feed
from traintop.monitor import Monitor
from traintop.app.screen import DashboardScreen
from traintop.recording import default_recording_dir, new_recording_path
from traintop.text import one_line
from traintop.view import View, build_view
from traintop.widgets.alerts_panel import AlertsPanel
from traintop.widgets.gpu_panel import GpuPanel
from traintop.widgets.gpu_table import GpuTable
from traintop.widgets.help_screen import HelpScreen
from traintop.widgets.quit_screen import QuitJobScreen
from traintop.widgets.stacks_screen import StacksScreen
from traintop.widgets.host_panel import HostPanel
from traintop.widgets.process_panel import ProcessPanel
from traintop.widgets.replay_bar import ReplayBar
from traintop.widgets.status_bar import StatusBar

COMPACT_WIDTH = 120
COMPACT_HEIGHT = 36
PANEL_ROWS = 7  # a GPU's full panel
COMPACT_PANEL_ROWS = 3
# Below this many rows a focused GPU's full panel (7) would not fit beside the top line, the
# replay bar, one row of alerts, host, process and footer: it keeps its compact rows there.
SHORT_HEIGHT = PANEL_ROWS + 7
ALERTS_MIN_ROWS = 8  # what the GPUs leave to the alerts before they fall back to one line each
COMPACT_ALERTS_MIN_ROWS = 4
NOTICE_S = 6.0
REDRAW_SLACK = 0.2  # a frame due within this share of the redraw interval is drawn at once
REPLAY_ACTIONS = {"seek", "seek_fraction", "step", "speed"}
BANNER_PART_S = 6.0  # each part of a message too long for the top line, shown in turn
# A frame allocates thousands of short-lived objects (Text, Segments, Strips, messages): at
# Python's default gen-0 threshold (700) the cyclic GC ran ~1.1 times a frame, ~1 ms of a
# 10 ms frame on dev; at 10 000 it runs every ~15 frames, ~0.3 ms a frame. Nearly all of
# those objects are freed by reference counting; the threshold only delays cycles.
GC_THRESHOLD = (10_000, 10, 10)
ALERTS_KEYS = Binding.Group("alerts", compact=True)
SEEK_KEYS = Binding.Group("seek", compact=True)


def banner_parts(banner: str, room: int) -> list[str]:
    """The banner whole where it fits ``room`` cells, else in parts said in turn: cut at its
    sentences first, then between key hints ("space: pause  ← →: seek"), then after a colon
    outside parentheses ("NVML could not start (...):" / "is the ..."); pieces that fit
    together stay together, so a key is never parted from what it does."""
    if len(banner) <= room:
        return [banner]
    for cut, joint in ((_sentences, " "), (_hints, "  "), (_after_colons, " ")):
        pieces = cut(banner)
        if len(pieces) > 1:
            out: list[str] = []
            for piece in pieces:
                if out and len(out[-1]) + len(joint) + len(piece) <= room:
                    out[-1] = f"{out[-1]}{joint}{piece}"
                else:
                    out.append(piece)
            return [part for piece in out for part in banner_parts(piece, room)]
    return [banner]


def _sentences(text: str) -> list[str]:
    return [p for p in re.split(r"(?<=\.)\s+", text) if p]


def _hints(text: str) -> list[str]:
    return [p for p in re.split(r"\s{2,}", text) if p]


def _after_colons(sentence: str) -> list[str]:
    """The sentence cut after each colon outside parentheses (one inside names a file or an error)."""
    out, depth, start = [], 0, 0
    for k, ch in enumerate(sentence):
        depth += (ch == "(") - (ch == ")")
        if ch == ":" and depth == 0 and sentence[k + 1:k + 2] == " ":
            out.append(sentence[start:k + 1])
            start = k + 2
    return [p for p in out + [sentence[start:]] if p]


def short_path(path: str) -> str:
    """A file name for one status line: the name whole, its directory shortened to where it
    starts and its last folder ("~/…/recordings/NAME"); a narrow pane cuts from the right."""
    home = os.path.expanduser("~")
    if home not in ("", "/") and path.startswith(home + os.sep):
        path = "~" + path[len(home):]
    folder, name = os.path.split(path)
    parts = [p for p in folder.split(os.sep) if p]
    if len(parts) > 2:
        head = "~" if parts[0] == "~" else ("" if folder.startswith(os.sep) else parts[0])
        folder = f"{head}{os.sep}…{os.sep}{parts[-1]}"
    return os.path.join(folder, name) if folder else name


def gpu_layout(n: int, width: int, height: int, replay_bar: bool, focused: bool) -> tuple[str, int]:
    """How the GPUs are shown: ("panels"|"table"|"focus"|"none", rows the table may use)."""
    compact = width < COMPACT_WIDTH or height < COMPACT_HEIGHT
    avail = height - 2 - (1 if replay_bar else 0)  # status line and footer
    if n == 0:
        return "none", 0
    if focused:
        return "focus", 0
    if compact:
        room = avail - 2 - COMPACT_ALERTS_MIN_ROWS  # host and process lines
        if n * COMPACT_PANEL_ROWS <= room:
            return "panels", 0
        return "table", max(1, room)
    room = avail - ALERTS_MIN_ROWS
    if n * PANEL_ROWS <= room:
        return "panels", 0
    return "table", max(1, room - 3)  # the table's border and header


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
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help"),
        Binding("p,space", "pause", "pause"),
        Binding("p,space", "resume", "resume"),
        Binding("left", "seek(-10)", "seek", group=SEEK_KEYS),
        Binding("right", "seek(10)", "seek", group=SEEK_KEYS),
        Binding("left_square_bracket", "speed(-1)", "slower", show=False),
        Binding("right_square_bracket", "speed(1)", "faster", show=False),
        Binding("up", "scroll_alerts(-1)", "alerts", group=ALERTS_KEYS),
        Binding("down", "scroll_alerts(1)", "alerts", group=ALERTS_KEYS),
        Binding("pageup", "scroll_alerts(-10)", show=False),
        Binding("pagedown", "scroll_alerts(10)", show=False),
        Binding("g", "focus_gpu(1)", "one GPU"),
        Binding("G", "focus_gpu(-1)", "previous GPU", show=False),
        Binding("escape", "all_gpus", "all GPUs"),
        Binding("n", "next_page", "more GPUs"),
        Binding("r", "record", "record"),
        Binding("r", "stop_recording", "stop rec"),  # the footer says what r does now
        Binding("s", "stacks", "stacks"),  # in the footer where the job has a probe
        Binding("s", "stacks(True)", show=False),  # elsewhere the popup says where stacks come from
        # the same keys where they cannot act: a line says why, never silence (hidden from the footer)
        Binding("g,G", "unavailable('focus_gpu')", show=False),
        Binding("r", "unavailable('record', 'stop_recording')", show=False),
        Binding("n", "unavailable('next_page')", show=False),
        Binding(",".join(["left", "right", "comma", "full_stop", "home", "end", "left_square_bracket",
                          "right_square_bracket"] + [str(d) for d in range(10)]), "unavailable('seek')", show=False),
        Binding("h,H,j,a", "cluster_key", show=False),  # the cluster view's keys: a line says so
        Binding("comma", "step(-1)", "step back", show=False),
        Binding("full_stop", "step(1)", "step", show=False),
        Binding("home", "seek_fraction(0)", "start", show=False),
        Binding("end", "seek_fraction(1)", "end", show=False),
    ] + [Binding(str(d), f"seek_fraction({d / 10})", show=False) for d in range(10)]

    def __init__(self, monitor: Monitor, feed: Feed, *, mode: str = "live", start_feed: bool = True,
                 record_dir: str | None = None, banner: str | None = None, max_fps: float | None = None,
                 job=None, grace: float = 10.0) -> None:
        super().__init__()
        # `traintop run`: the job it started (a traintop.job.Job), so q can ask whether to stop it.
        self.job = job
        self.grace = grace
        # Redraws are the UI's main cost; sampling and recording keep the feed's interval.
        self.min_redraw_s = 1.0 / max_fps if max_fps else 0.0
        self._last_redraw = 0.0
        self._redraw_timer = None
        self._drawn_alert_changes = 0
        self.monitor = monitor
        self.feed = feed
        self.replay = feed.replay_controls()
        self.mode = mode
        self.start_feed = start_feed
        self.record_dir = record_dir
        self.banner = banner
        self.paused = False
        self._pending = False
        self._compact: bool | None = None
        self._term_size = (80, 24)
        self.last_view: View | None = None
        self._status: StatusBar | None = None  # set on mount
        self._panels: list[GpuPanel] = []
        self.focused_gpu: int | None = None  # the GPU index whose full panel is shown alone
        self.gpu_page = 0
        self.gpu_mode = "none"
        self._pages = 1
        self._bindings_state: tuple | None = None
        self._notice_timer = None
        # Replay commands run in order on a worker thread (a seek rebuilds minutes of history).
        self._jobs: deque = deque()
        self._jobs_lock = threading.Lock()
        self._jobs_running = False
        self._pending_position: float | None = None
        self._told_job_end = False

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
        self._status = self.query_one(StatusBar)
        self._gpus = self.query_one("#gpus", Vertical)
        self._table = self.query_one(GpuTable)
        self._host = self.query_one(HostPanel)
        self._process = self.query_one(ProcessPanel)
        self._alerts = self.query_one(AlertsPanel)
        self._replay_bar = self.query_one(ReplayBar) if self.replay is not None else None
        self._gc_threshold = gc.get_threshold()
        gc.set_threshold(*GC_THRESHOLD)
        self._apply_size()
        self.refresh_view()
        if self.banner:
            self._say_in_turn(banner_parts(self.banner, self._notice_room()))
        if self.start_feed:
            self.feed.start(self._notify_from_feed)

    def on_unmount(self) -> None:
        if getattr(self, "_gc_threshold", None):
            gc.set_threshold(*self._gc_threshold)
        self.feed.stop()
        self.monitor.close()

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

    @property
    def compact(self) -> bool:
        return bool(self._compact)

    # -- messages: one line in the status bar, over nothing ------------------------
    def _notice_room(self) -> int:
        width = self.size.width
        return self._status.notice_room(width) if self._status is not None else width

    def _say_in_turn(self, parts: list[str]) -> None:
        """A message too long for the top line, a part at a time (the reason after the news)."""
        self.say(parts[0], timeout=BANNER_PART_S if len(parts) > 1 else 12)
        if len(parts) > 1:
            shown = self._status.notice if self._status is not None else None

            def next_part() -> None:  # unless another message took the line meanwhile
                if self._status is not None and self._status.notice == shown:
                    self._say_in_turn(parts[1:])

            self.set_timer(BANNER_PART_S - 0.5, next_part)

    def say(self, message: str, severity: str = "information", timeout: float | None = None) -> None:
        """Show ``message`` in the status line for a while (toasts covered the panels). It may
        quote a file name or an error: shown as text, never markup."""
        if self._status is None:
            return
        self._status.show_notice(one_line(message, 1000), severity)
        if self._notice_timer is not None:
            self._notice_timer.stop()
        seconds = timeout or (2 * NOTICE_S if severity == "error" else NOTICE_S)
        self._notice_timer = self.set_timer(seconds, self._clear_notice)

    def _clear_notice(self) -> None:
        self._notice_timer = None
        if self._status is not None:
            self._status.show_notice(None)

    def notify(self, message, *, title: str = "", severity: str = "information", timeout: float | None = None,
               markup: bool = True) -> None:
        # Textual's own messages (ctrl+c: "press q to quit") carry markup; ours call say().
        text = str(message)
        if markup:
            try:
                text = Text.from_markup(text).plain
            except Exception:  # not markup after all: show it as it is
                pass
        self.say(f"{title}: {text}" if title else text, severity, timeout)

    # -- data in ------------------------------------------------------------------
    def _notify_from_feed(self) -> None:
        # Runs on the feed's thread: coalesce, so a slow terminal never builds a queue.
        if not self._pending:
            self._pending = True
            self.post_message(FrameReady())

    def on_frame_ready(self, _: FrameReady) -> None:
        self._pending = False
        if self.paused or not self.is_running or self._jobs_running:
            return
        if self.monitor.alert_changes != self._drawn_alert_changes:  # a finding starts or ends: now, not later
            if self._redraw_timer is not None:
                self._redraw_timer.stop()
                self._redraw_timer = None
            self.refresh_view()
            return
        if self._redraw_timer is not None:
            return
        wait = self._last_redraw + self.min_redraw_s - time.monotonic()
        # A frame that comes a little early (sampling at the redraw rate, give or take the loop's
        # jitter) is drawn now: a timer for a few milliseconds costs more than it saves.
        if wait > REDRAW_SLACK * self.min_redraw_s:  # draw the newest frame once the redraw budget allows
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
        self._drawn_alert_changes = self.monitor.alert_changes
        view = build_view(self.monitor)
        self.last_view = view
        end = view.process.job_end
        if end is not None and not self._told_job_end:  # `traintop run`: say at once how the job ended
            self._told_job_end = True
            if isinstance(self.screen, QuitJobScreen):
                self.screen.dismiss("cancel")  # it asked about a job that is no longer running
            self.say(f"{end.describe(capital=True)}. Its history stays on screen; q quits with its status.",
                     severity="error" if end.status else "information", timeout=15)
        compact = self.compact
        with self.batch_update():
            self._show_status(view)
            self._show_gpus(view, compact)
            self._host.show(view.host, compact)
            self._process.show(view.process, compact)
            self._alerts.show(view, compact, self.focused_gpu if self.gpu_mode == "focus" else None)
            if self._replay_bar is not None:
                self._show_replay_bar()
        self._refresh_bindings_if_changed()

    def _show_gpus(self, view: View, compact: bool) -> None:
        indices = [g.sample.index for g in view.gpus]
        if [p.index for p in self._panels] != indices:
            for p in self._panels:
                p.remove()
            self._panels = [GpuPanel(i) for i in indices]
            self._gpus.mount_all(self._panels)
        if self.focused_gpu is not None and self.focused_gpu not in indices:
            self.focused_gpu = None
        w, h = self._term_size
        mode, rows = gpu_layout(len(indices), w, h, self._replay_bar is not None, self.focused_gpu is not None)
        self.gpu_mode = mode
        self.screen.set_class(mode == "none", "-no-gpu")
        self._table.display = mode == "table"
        if mode == "table":
            n = len(view.gpus)
            per_page = rows if n <= rows else max(1, rows - 1)
            self._pages = -(-n // per_page)
            self.gpu_page %= self._pages
            first = self.gpu_page * per_page
            shown = list(view.gpus[first:first + per_page])
            more = n - len(shown)
            self._table.styles.height = len(shown) + (1 if more else 0) + (0 if compact else 3)
            self._table.show(shown, n, more, wide=not compact)
        else:
            self._pages = 1
        for panel, gv in zip(self._panels, view.gpus):
            visible = mode == "panels" or (mode == "focus" and gv.sample.index == self.focused_gpu)
            panel.display = visible
            panel.set_class(mode == "focus", "-focused")
            if visible:
                panel.show(gv, compact and mode != "focus")

    def _show_status(self, view: View) -> None:
        # Names, driver and label come from the driver or a file: made safe here, once.
        names: dict[str, int] = {}
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
        problem = view.recording_error or view.source_error or view.hook_error
        problem = one_line(problem, 500) if problem else None
        replay = "end of recording" if self.replay is not None and self.replay.at_end else None
        text = " · ".join(dict.fromkeys(b for b in bits if b))  # a GPU-less recording's label is "no GPU" too
        self._status.show(
            mode=self.mode, text=text, t=view.t, paused=self.paused,
            recording=one_line(short_path(rec.path)) if rec is not None and not view.recording_error else None,
            problem=problem, replay=replay)

    def _show_replay_bar(self) -> None:
        rc = self.replay
        with self._jobs_lock:
            pending = self._pending_position
        self._replay_bar.show(rc.t_start, rc.t_end, rc.position if pending is None else pending, rc.speed,
                              rc.playing)

    # -- which keys apply now (the footer shows those) --------------------------------
    def _is_paused(self) -> bool:
        return (not self.replay.playing) if self.replay is not None else self.paused

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action == "unavailable":  # only where none of the key's own actions can run
            return bool(parameters) and not any(self.check_action(a, ()) for a in parameters)
        if action in REPLAY_ACTIONS:
            return self.replay is not None
        if action == "record":
            return self.replay is None and self.monitor.recorder is None
        if action == "stop_recording":
            return self.replay is None and self.monitor.recorder is not None
        if action == "pause":
            return not self._is_paused()
        if action == "resume":
            return self._is_paused()
        if action == "focus_gpu":
            return self.last_view is not None and len(self.last_view.gpus) > 1
        if action == "stacks":
            return bool(parameters) or self._has_probe()
        if action == "all_gpus":
            return self.focused_gpu is not None
        if action == "next_page":
            return self.gpu_mode == "table" and self._pages > 1
        return True

    def _has_probe(self) -> bool:
        """A live job carries the probe (or a recording holds its stacks): s shows thread stacks."""
        live_probe = self.mode == "live" and self.last_view is not None and bool(self.last_view.process.ranks)
        return live_probe or bool(self.monitor.stacks)

    def _refresh_bindings_if_changed(self) -> None:
        state = (self._is_paused(), self.focused_gpu, self.gpu_mode, self._pages,
                 len(self.last_view.gpus) if self.last_view else 0, self._has_probe())
        if state != self._bindings_state:
            self._bindings_state = state
            self.refresh_bindings()

    # -- actions --------------------------------------------------------------------
    def _overlay_open(self) -> bool:
        # Keys typed fast can all reach the dashboard before the first overlay is shown: open
        # one overlay at a time, never a stack of them.
        return isinstance(self.screen, (HelpScreen, StacksScreen, QuitJobScreen))

    def _job_running(self) -> bool:
        return self.job is not None and self.job.end is None and not self.job.signals_received

    async def action_quit(self) -> None:
        """q (and Ctrl-Q): with a job that `traintop run` started still running, ask whether to
        stop it, leave it running or stay; otherwise quit."""
        if not self._job_running():
            self.exit()
            return
        if isinstance(self.screen, QuitJobScreen):
            return
        self.push_screen(QuitJobScreen(self.job.pid, self.grace, self.job.log_path), self._quit_answered)

    def _quit_answered(self, answer: str | None) -> None:
        if answer == "stop":
            self.stop_job()
        elif answer == "leave":
            self.exit()

    def stop_job(self) -> None:
        """The path a SIGTERM to traintop takes: SIGTERM to the job's whole group, SIGKILL after
        the grace period (the CLI waits for that once the dashboard is gone), then quit."""
        if self._job_running():
            self.job.forward(signal.SIGTERM, self.grace)
        self.exit()

    def where_things_go(self) -> list[tuple[str, str]]:
        """Where the files traintop writes go: said in the help."""
        out = []
        if self.replay is None:
            rec = self.monitor.recorder
            out.append(("recording", rec.path) if rec is not None
                       else ("recordings", f"{self.record_dir or default_recording_dir()} (key r)"))
        if self.job is not None:
            out.append(("job's output", self.job.log_path))
        return out

    def action_help(self) -> None:
        if not self._overlay_open():
            self.push_screen(HelpScreen(self.where_things_go()))

    def action_stacks(self, _anyway: bool = False) -> None:
        """Every thread's Python stack in the job (from the probe): where a stalled job hangs."""
        if self._overlay_open():
            return
        if self.replay is not None:
            situation = "recording"
        elif getattr(self.feed, "kind", "live") == "simulated":
            situation = "simulated"
        elif self.monitor.probe_seen_at is None:
            situation = "no probe"
        elif self.monitor.ended_at is not None:
            situation = "ended"
        else:
            situation = "asked"
            self.monitor.request_stacks()
        self.push_screen(StacksScreen(self.monitor, situation))

    def action_pause(self) -> None:
        if self.replay is not None:
            self._replay_job(self.replay.toggle_pause)
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
        if len(gpus) < 2:
            return
        if self.focused_gpu is None:
            k = 0 if int(direction) > 0 else len(gpus) - 1
        else:
            k = gpus.index(self.focused_gpu) + int(direction)
        self.focused_gpu = gpus[k] if 0 <= k < len(gpus) else None  # past the last: all GPUs again
        self.refresh_view()

    def action_unavailable(self, action: str, *alternatives: str) -> None:
        if action == "record":
            self.say("r records live data: this is a recording already.")  # whole at 80 columns
        elif action == "next_page":
            self.say("All the GPUs fit on the screen: no next page.")
        elif action == "seek":
            self.say("Live data: seek, step and speed apply to replays.")
        elif action == "focus_gpu":
            n = len(self.last_view.gpus) if self.last_view else 0
            self.say("One GPU only: nothing to focus." if n == 1
                     else "No GPU in view: nothing to focus.")

    def action_cluster_key(self) -> None:
        self.say("h, j, a are traintop cluster's keys; here g focuses a GPU.")

    def action_all_gpus(self) -> None:
        self.focused_gpu = None
        self.refresh_view()

    def action_next_page(self) -> None:
        self.gpu_page = (self.gpu_page + 1) % max(1, self._pages)
        self.refresh_view()

    # -- replay: commands queued to a worker, seeks coalesced -------------------------
    def _replay_job(self, job, seek_to: float | None = None) -> None:
        with self._jobs_lock:
            if seek_to is not None:
                if self._jobs and self._jobs[-1][1] is not None:  # a newer target replaces a waiting one
                    self._jobs.pop()
                self._pending_position = seek_to
            self._jobs.append((job, seek_to))
            start = not self._jobs_running
            self._jobs_running = True
        if start:
            self._run_replay_jobs()
        if self._replay_bar is not None:
            self._show_replay_bar()

    @work(thread=True, group="replay")
    def _run_replay_jobs(self) -> None:
        while True:
            with self._jobs_lock:
                if not self._jobs:
                    self._jobs_running = False
                    self._pending_position = None
                    break
                job, _ = self._jobs.popleft()
            try:
                job()
            except Exception as e:  # a damaged recording: say so, keep the dashboard
                self.call_from_thread(self.say, f"replay: {type(e).__name__}: {e}", "error")
        if self.is_running:
            self.call_from_thread(self.refresh_view)

    def _target(self) -> float:
        with self._jobs_lock:
            pending = self._pending_position
        return pending if pending is not None else (self.replay.position or 0.0)

    def _seek_to(self, t: float) -> None:
        rc = self.replay
        if rc is None or rc.t_start is None:
            return
        t = min(max(t, rc.t_start), rc.t_end)
        self._replay_job(lambda: rc.seek(t), seek_to=t)

    def action_seek(self, seconds: float) -> None:
        if self.replay is not None:
            self._seek_to(self._target() + float(seconds))

    def action_seek_fraction(self, frac: float) -> None:
        rc = self.replay
        if rc is not None and rc.t_start is not None:
            self._seek_to(rc.t_start + (rc.t_end - rc.t_start) * float(frac))

    def action_step(self, direction: int) -> None:
        if self.replay is not None:
            self._replay_job(lambda: self.replay.step(int(direction)))

    def action_speed(self, direction: int) -> None:
        if self.replay is None:
            return
        speeds = getattr(self.replay, "SPEEDS", ())
        if speeds and self.replay.speed == (speeds[-1] if int(direction) > 0 else speeds[0]):
            self.say(f"{self.replay.speed:g}× is the {'fastest' if int(direction) > 0 else 'slowest'} replay speed.")
            return
        self._replay_job(self.replay.faster if int(direction) > 0 else self.replay.slower)

    # -- recording ----------------------------------------------------------------------
    @work(thread=True, exclusive=False)
    def _close_recording(self, rec) -> None:
        # Closing checkpoints and vacuums the file: seconds for a long session, so off the UI loop.
        try:
            rec.close()
            name, folder = os.path.basename(rec.path), os.path.dirname(rec.path)
            saved = f"Recording saved: {name} (in {folder})"
            if len(saved) > self._notice_room():  # the folder said next, not cut off
                self.call_from_thread(self._say_in_turn, [f"Recording saved: {name}", f"It is in {folder}"])
            else:
                self.call_from_thread(self.say, saved)
        except RecordingError as e:
            self.call_from_thread(self.say, str(e), "error")

    def action_record(self) -> None:
        rec = self.monitor.stop_recording()
        if rec is not None:
            self._close_recording(rec)
            self.refresh_bindings()
            self.refresh_view()
            return
        try:
            path = self.monitor.start_recording(new_recording_path(self.record_dir))
        except TraintopError as e:
            self.say(f"Cannot record: {e}", "error")
            return
        self.say(f"Recording: {short_path(path)}")
        self.refresh_bindings()
        self.refresh_view()

    action_stop_recording = action_record
