"""The top line: what is being watched (LIVE, DEMO, REPLAY, SIMULATED), where, and when."""

from __future__ import annotations

import time

from rich.text import Text
from traintop.reports.status_text import fit_session
from traintop.widgets.line import Line
from traintop.widgets.lines import TextLines, join_lines

MODE_STYLE = {"live": "bold black on green", "demo": "bold black on magenta", "replay": "bold black on cyan",
              "simulated": "bold black on yellow"}


CLOCK = "%H:%M:%S"  # 8 characters, as wide as what it prints: "15:10:31"
NOTICE_STYLE = {"information": "bold cyan", "warning": "bold yellow", "error": "bold red"}


class StatusBar(TextLines):
    def __init__(self, **kw) -> None:
        super().__init__(id="status", **kw)
        self.mode = "live"
        self.text: list[tuple[str, str]] = []  # the session's own part: (what, text) (status_text.session_parts)
        self.t: float | None = None
        self.paused = False
        self.recording: str | None = None
        self.problem: str | None = None
        self.replay: str | None = None
        self.notice: str | None = None
        self.notice_severity = "information"

    def show(self, *, mode: str, text: list[tuple[str, str]], t: float | None, paused: bool, recording: str | None,
             problem: str | None, replay: str | None = None) -> None:
        self.mode, self.text, self.t, self.paused = mode, text, t, paused
        self.recording, self.problem, self.replay = recording, problem, replay
        self.redraw()

    def show_notice(self, message: str | None, severity: str = "information") -> None:
        """A message for a few seconds (the app clears it), where it covers nothing."""
        self.notice, self.notice_severity = message, severity
        self.redraw()

    def _head(self) -> Line:
        """What comes before a notice: mode, clock, replay state, pause, a problem."""
        out = Line(f" {self.mode.upper()} ", MODE_STYLE.get(self.mode, "reverse"))
        if self.t is not None:
            out.append(" " + time.strftime(CLOCK, time.localtime(self.t)), "bold")
        if self.replay:
            out.append("  " + self.replay, "bold cyan")
        if self.paused:
            out.append("  ‖ PAUSED", "bold yellow")
        if self.problem:
            out.append("  ⚠ " + self.problem, "bold red")
        return out

    def notice_room(self, width: int) -> int:
        """Cells a notice has on a top line ``width`` wide before it is cut; the clock counted
        before its first sample too (a banner said at start is cut in parts that still fit once
        the clock shows)."""
        return width - self._head().cell_len - 2 - (1 + len(CLOCK) if self.t is None else 0)

    def text_lines(self, width: int) -> list[Line]:
        # Most important first: a narrow pane truncates from the right.
        out = self._head()
        if self.notice:
            out.append("  " + self.notice, NOTICE_STYLE.get(self.notice_severity, "bold"))
        if self.recording:
            out.append("  ● REC ", "bold red")
            if not (self.notice and self.recording in self.notice):  # the notice names it already
                out.append(self.recording, "dim")
        session = fit_session(self.text, width - out.cell_len - 2)
        if session:
            out.append("  " + session, "dim")
        return [out.truncate(max(1, width))]

    def render(self) -> Text:
        """The line as a Text (tests and tools)."""
        return join_lines(self.text_lines(self._content()[0]))
