"""ClusterApp: the dashboard over many hosts, drawn from snapshots of Prometheus.

A worker thread reads a snapshot every ``refresh`` seconds (never the UI thread; one read
at a time: a slow one delays the next); the widgets draw the last one. Same look and keys as the local dashboard: q quit, ? help,
p/space pause; h / H: focus the next / previous host, j: the next job, a or escape: all; u: the
GPUs by host, job or user.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from traintop.errors import TraintopError
from traintop.text import one_line
from traintop.widgets.alerts_panel import AlertsBody
from traintop.widgets.cluster_panels import NEXT_GROUPING, HostsBody, finding_paragraphs, status_line
from traintop.widgets.lines import TextLines

COMPACT_WIDTH = 120

# The first paragraph is one line: the help box wraps it at its own width (lines broken by hand
# here were broken again in a narrow terminal: "straggler rank or" / "node").
HELP = """\
[b]traintop cluster[/b] reads Prometheus (traintop agents, or dcgm-exporter alone) \
and shows every host's GPUs, every rank's step time and input wait, and the \
cluster's findings: each agent's, and the cross-host ones (straggler rank or node, \
stalled job, one node's loader starving, slow node, GPU errors, a missing node). \
A host that stopped reporting is dimmed ("no data for N s"); "GPUs unreadable": \
its agent cannot read its GPUs.

[b]Keys[/b]
  q            quit                       ?       this help
  p, space     pause (stop reading Prometheus) / resume
  ↑ ↓ PgUp PgDn  scroll the findings     shift+↑ ↓  scroll the hosts
  h / H        focus the next / previous host (of the job in focus)
  j            the next job (of the host in focus)
  a, escape    every host and job again
  u            the GPUs by host, by job, by user: per job or user the GPUs
               its processes hold, their utilization, the memory held and
               the GPU-hours held idle over the last 5 minutes

Press any key to close.
"""


class ClusterHelp(ModalScreen):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(Text.from_markup(HELP), id="help-text")

    def on_key(self, event) -> None:
        event.stop()
        self.dismiss()


class ClusterStatus(TextLines):
    text: Text = Text()

    def render(self) -> Text:
        return self.text


class ClusterApp(App):
    # Textual's text selection is off: a mouse drag across the panels while they redraw crashed it
    # inside Textual (AttributeError on a selection end), found by the monkey test; the terminal's
    # own selection (Shift+drag in most terminals) still copies text.
    ALLOW_SELECT = False
    CSS_PATH = str(Path(__file__).with_name("traintop.tcss"))  # one stylesheet with the local dashboard
    TITLE = "traintop cluster"
    ENABLE_COMMAND_PALETTE = False
    # the rows between the top line and the footer are shared by content (``_share_rows``)
    CSS = "#gpus { height: 1fr; }  #alerts { height: 1fr; min-height: 3; }  #gpus.-stale { text-opacity: 55%; }"
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help"),
        Binding("p,space", "pause", "pause"),
        Binding("p,space", "resume", "resume"),  # the footer says what p does now
        Binding("h", "host(1)", "next host"),
        Binding("H", "host(-1)", "prev host", show=False),
        Binding("j", "job", "next job"),
        Binding("a,escape", "all", "all"),
        Binding("u", "group", "group"),
        Binding("up", "scroll_findings(-1)", "findings", show=False),
        Binding("down", "scroll_findings(1)", "findings", key_display="↑↓"),
        Binding("pageup", "scroll_findings(-10)", show=False),
        Binding("pagedown", "scroll_findings(10)", show=False),
        Binding("shift+up", "scroll_hosts(-1)", show=False),
        Binding("shift+down", "scroll_hosts(1)", show=False),
        # the local dashboard's keys, here: a line says what to use instead, never silence
        Binding("g,G", "elsewhere('g')", show=False),
        Binding("n", "elsewhere('n')", show=False),
        Binding("s", "elsewhere('s')", show=False),
        Binding("r", "elsewhere('r')", show=False),
        Binding(",".join(["left", "right", "comma", "full_stop", "home", "end", "left_square_bracket",
                          "right_square_bracket"] + [str(d) for d in range(10)]), "elsewhere('seek')", show=False),
        Binding("enter", "elsewhere('enter')", show=False),
        Binding("x,b", "elsewhere('other')", show=False),
    ]

    def __init__(self, source, *, url: str = "", job: str | None = None, refresh: float = 5.0,
                 poll: bool = True) -> None:
        super().__init__()
        self.source = source
        self.url = url
        self.job = job
        self.refresh_s = refresh
        self.poll = poll
        self.snapshot = None
        self.problem: str | None = None
        self.paused = False
        self.reading = False
        self.focus_host: str | None = None
        self.focus_job: str | None = job
        self.grouping = "host"  # the GPU list: by host, job or user (u)
        self.read_at: float | None = None  # monotonic time of the last good read
        self.resumed_at: float | None = None  # monotonic time the view was last resumed: its data is as old as the pause
        self.failure: str | None = None  # why the view ended (a read that failed unexpectedly)
        self._was_stale = False
        self._screen_size = (80, 24)

    def get_driver_class(self):
        from traintop.app.driver import quiet_driver_class

        return quiet_driver_class(super().get_driver_class())

    def compose(self) -> ComposeResult:
        yield ClusterStatus(id="status")
        # Neither pane takes the focus: the app's keys scroll them (a focused pane took ↑↓ for
        # itself, and the findings could not be scrolled from the keyboard at all).
        hosts, findings = VerticalScroll(id="gpus"), VerticalScroll(id="alerts")
        hosts.can_focus = findings.can_focus = False
        with hosts:
            yield HostsBody(id="cluster-hosts")
        with findings:
            yield AlertsBody(id="alerts-body")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#alerts").border_title = "Findings"
        self._apply_size()
        self.redraw()
        if self.poll:
            self.read_snapshot()
            self.set_interval(self.refresh_s, self.read_snapshot)
            self.set_interval(1.0, self._check_stale)

    def on_resize(self, event) -> None:
        self._apply_size(event.size)
        self.redraw()

    def _apply_size(self, size=None) -> None:
        size = size or self.size
        self._screen_size = (size.width, size.height)  # on a resize event, self.size may still be the old one
        self.set_class(size.width < COMPACT_WIDTH or size.height < 36, "compact")

    def read_snapshot(self) -> None:
        """Start a read unless one is under way: a read slower than --refresh delays the next
        instead of piling up behind it (reads never overlap)."""
        if self.paused or self.reading:
            return
        self.reading = True
        self._read()

    @work(thread=True, group="prometheus", exit_on_error=False)
    def _read(self) -> None:
        failure = None
        try:
            snap, problem = self.source(), None
        except TraintopError as e:  # said on the status line; the last data stays, marked stale
            snap, problem = None, str(e)
        except Exception as e:  # noqa: BLE001 - never a traceback: the view ends with one line
            snap, problem = None, None
            failure = f"reading Prometheus failed: {type(e).__name__}: {one_line(e, 200)}"
        finally:
            self.call_from_thread(self._read_done)
        if failure is not None:
            self.call_from_thread(self.fail, failure)
        elif problem is not None:
            self.call_from_thread(self.show_problem, problem)
        else:
            self.call_from_thread(self.show_snapshot, snap)

    def fail(self, why: str) -> None:
        self.failure = why
        self.exit(return_code=2)

    def stale_for(self) -> float | None:
        """Seconds since the last good read, once that is more than two refreshes (None: fresh)."""
        if not self.poll or self.paused or self.read_at is None:
            return None
        # after a pause the reads start again at once: their data is due from the resume on
        age = time.monotonic() - max(self.read_at, self.resumed_at or self.read_at)
        return age if age > 2 * self.refresh_s else None

    def _check_stale(self) -> None:
        stale = self.stale_for() is not None
        if stale or stale != self._was_stale:
            self.redraw()

    def _read_done(self) -> None:
        self.reading = False

    def show_problem(self, problem: str) -> None:
        self.problem = problem
        self.redraw()

    def show_snapshot(self, snap) -> None:
        self.snapshot, self.problem = snap, None
        self.read_at = time.monotonic()
        if self.focus_host is not None and self.focus_host not in snap.hosts:
            self.focus_host = None
        self.redraw()

    def redraw(self) -> None:
        status = self.query_one(ClusterStatus)
        stale = self.stale_for()
        self._was_stale = stale is not None
        if self.notice is not None:
            status.text = Text(" " + self.notice, style="bold yellow", no_wrap=True, overflow="ellipsis")
        else:
            status.text = status_line(self.snapshot, self.url, self.focus_job, self.focus_host, self.paused,
                                      self.problem, stale, self.grouping)
        status.refresh()
        self.query_one("#gpus").set_class(stale is not None and self.snapshot is not None, "-stale")
        self.query_one(HostsBody).show(self.snapshot, self.focus_host, self.focus_job, self.grouping)
        hosts = self._shown_hosts()
        paras = finding_paragraphs(self.snapshot, self.focus_host, self.has_class("compact"), hosts)
        self.query_one(AlertsBody).set_paragraphs(paras)
        alerts = self.query_one("#alerts")
        n = len([f for f in (self.snapshot.findings if self.snapshot else ())
                 if self.focus_host in (None, f.host) and (hosts is None or f.host in hosts)])
        alerts.border_title = f"Findings ({n} active)" if n else "Findings"
        alerts.set_class(bool(n), "-firing")
        self._share_rows()

    def _share_rows(self) -> None:
        """The rows between the top line and the footer, shared by what the two panes hold: both
        as tall as their content where that fits (the findings' frame takes what is left); where it
        does not, each gets half, and a pane that needs less gives the rest to the other (a lone
        finding left 30 empty rows under it while the GPUs scrolled)."""
        hosts, findings = self.query_one("#gpus"), self.query_one("#alerts")
        screen_w, screen_h = self._screen_size
        rows = screen_h - 2  # the top line and the footer
        if rows <= 0:
            return
        need_hosts = max(1, self.query_one(HostsBody).styles.height.cells or 1)
        frame = findings.styles.gutter.height  # its border
        width = screen_w - findings.styles.gutter.width  # the panes span the screen
        need_findings = len(self.query_one(AlertsBody).text_lines(max(1, width))) + frame
        if need_hosts + need_findings <= rows:
            shown_hosts = need_hosts
        elif need_findings <= rows // 2:
            shown_hosts = rows - need_findings
        else:
            shown_hosts = min(need_hosts, rows - rows // 2)
        shown_hosts = max(1, min(shown_hosts, rows - frame - 1))
        if hosts.styles.height is None or hosts.styles.height.cells != shown_hosts:
            hosts.styles.height = shown_hosts
        findings.styles.height = "1fr"

    def _job_hosts(self, job: str | None) -> set[str] | None:
        """The hosts that run ranks of ``job`` (None: every host)."""
        if job is None or self.snapshot is None:
            return None
        return {r.host for r in self.snapshot.ranks if r.job == job}

    def _shown_hosts(self) -> set[str] | None:
        """The hosts whose findings show: with a job in focus, those that run it."""
        return self._job_hosts(self.focus_job)

    # -- messages: the top line, for a few seconds -----------------------------------
    notice: str | None = None
    _notice_timer = None

    def say(self, message: str) -> None:
        self.notice = message
        if self._notice_timer is not None:
            self._notice_timer.stop()
        self._notice_timer = self.set_timer(6.0, self._clear_notice)
        self.redraw()

    def _clear_notice(self) -> None:
        self.notice, self._notice_timer = None, None
        self.redraw()

    # -- keys --------------------------------------------------------------------
    async def action_help_quit(self) -> None:
        """Ctrl-C quits, as q does (Textual's own binding only says to press ctrl+q)."""
        await self.action_quit()

    def action_help(self) -> None:
        self.push_screen(ClusterHelp())

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action in ("pause", "resume"):
            return self.paused == (action == "resume")
        return True

    def action_pause(self) -> None:
        self.paused = not self.paused
        if self.notice is not None:  # what an earlier key said would hide "PAUSED" for its six seconds
            self._notice_timer.stop()
            self.notice, self._notice_timer = None, None
        if not self.paused:
            self.resumed_at = time.monotonic()
            if self.poll:
                self.read_snapshot()  # now, not at the next refresh
        self.refresh_bindings()
        self.redraw()

    action_resume = action_pause

    def action_scroll_findings(self, lines: int) -> None:
        alerts = self.query_one("#alerts", VerticalScroll)
        if alerts.max_scroll_y == 0:
            self.say("The findings fit their panel: nothing to scroll.")
            return
        alerts.scroll_relative(y=int(lines), animate=False)

    def action_scroll_hosts(self, lines: int) -> None:
        hosts = self.query_one("#gpus", VerticalScroll)
        if hosts.max_scroll_y == 0:
            self.say("The hosts fit their panel: nothing to scroll.")
            return
        hosts.scroll_relative(y=int(lines), animate=False)

    ELSEWHERE = {
        "g": "g focuses a GPU in the local dashboard; here h/H focus a host, j a job.",
        "n": "n pages GPUs in the local dashboard; here ↑↓ scroll the findings, h a host's GPUs.",
        "s": "s shows a job's stacks in the local dashboard (traintop --pid N on its node).",
        "r": "r records in the local dashboard; Prometheus keeps the cluster's history.",
        "seek": "Seek keys are for replays; the cluster view shows the last 5 minutes.",
        "enter": "Nothing to open: h/H focus a host, j a job, a shows all again.",
        "other": "Not a key of the cluster view: ? lists its keys.",
    }

    def action_elsewhere(self, key: str) -> None:
        self.say(self.ELSEWHERE.get(key, self.ELSEWHERE["other"]))

    def action_host(self, delta: int) -> None:
        hosts = list(self.snapshot.hosts) if self.snapshot else []
        job_hosts = self._job_hosts(self.focus_job)
        if job_hosts is not None:  # with a job in focus, the hosts that run it
            hosts = [h for h in hosts if h in job_hosts]
        if not hosts:
            self.say("No host to focus yet." if self.snapshot is None else "No host runs this job now.")
            return
        if self.focus_host not in hosts:
            self.focus_host = hosts[0 if delta > 0 else -1]
        else:
            self.focus_host = hosts[(hosts.index(self.focus_host) + delta) % len(hosts)]
        self.redraw()

    def action_job(self) -> None:
        jobs = list(self.snapshot.jobs) if self.snapshot else []
        if self.focus_host is not None and self.snapshot is not None:  # the jobs that run on the host in focus
            here = {r.job for r in self.snapshot.ranks if r.host == self.focus_host}
            jobs = [j for j in jobs if j in here]
            if not jobs:
                self.say(f"No job runs on {one_line(self.focus_host, 40)}: a shows every host, then j.")
                return
        if not jobs:
            self.say("No job with probed ranks here: j has nothing to focus.")
            return
        self.focus_job = jobs[(jobs.index(self.focus_job) + 1) % len(jobs)] if self.focus_job in jobs else jobs[0]
        self.redraw()

    def action_group(self) -> None:
        self.grouping = NEXT_GROUPING[self.grouping]
        self.redraw()

    def action_all(self) -> None:
        self.focus_host = None
        self.focus_job = self.job
        self.redraw()
