"""Alerts: what is wrong, the numbers that show it, and what to try."""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widget import Widget

from traintop.rules.engine import Alert
from traintop.text import one_line
from traintop.units import fmt_duration
from traintop.widgets.render import SEVERITY_ICON, SEVERITY_STYLE


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _subject(subject: str) -> str:
    # alerts come from recordings too: every text in them is outside text
    return one_line(subject.replace("gpu", "GPU "), 40)


class AlertsBody(Widget):
    """The alert text. Its numbers change every second; the screen is laid out again only
    when the number of lines changes (Static.update() would re-lay out every time)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self._text = Text()
        self._lines = -1
        self._width = -1

    def set_text(self, text: Text) -> None:
        width = self.content_size.width or self.size.width or 80
        lines = len(text.wrap(self.app.console, width)) if text.plain else 0
        relayout = lines != self._lines or width != self._width
        self._text, self._lines, self._width = text, lines, width
        self.refresh(layout=relayout)

    def render(self) -> Text:
        return self._text


class AlertsPanel(VerticalScroll):
    """Scrollable: active alerts (most severe first) with evidence and remedies, then ended ones."""

    def __init__(self, **kw) -> None:
        super().__init__(id="alerts", **kw)
        self.border_title = "Alerts"

    def compose(self) -> ComposeResult:
        yield AlertsBody(id="alerts-body")

    _shown: tuple | None = None

    def show(self, active: list[Alert], recent: list[Alert], now: float | None, compact: bool) -> None:
        text = self.render_alerts(active, recent, now, compact)
        key = (text.plain, compact)
        if key == self._shown:
            return
        self._shown = key
        self.query_one("#alerts-body", AlertsBody).set_text(text)
        n = len(active)
        self.border_title = f"Alerts ({n} active)" if n else "Alerts"
        self.set_class(any(a.severity >= 2 for a in active), "-firing")

    @staticmethod
    def render_alerts(active: list[Alert], recent: list[Alert], now: float | None, compact: bool) -> Text:
        out = Text()
        if not active:
            out.append("✔ No problems detected", style="bold green")
            if now is not None:
                out.append(" — utilization, power, memory and temperature look normal.", style="dim")
        for k, a in enumerate(active):
            if k:
                out.append("\n")
            style = SEVERITY_STYLE.get(int(a.severity), "")
            out.append(f"{SEVERITY_ICON.get(int(a.severity), '•')} {one_line(a.title, 200)}", style=style)
            since = f" · {_subject(a.subject)} · since {_clock(a.start)}"
            if now is not None:
                since += f" ({fmt_duration(now - a.start)})"
            out.append(since + "\n", style="dim")
            out.append(f"  {one_line(a.evidence, 2000)}\n")
            remedies = a.remedies if k == 0 else a.remedies[:1]
            for r in remedies:
                out.append("  → ", style="bold cyan")
                out.append(f"{one_line(r, 2000)}\n")
        if recent and not compact:
            out.append("\nEnded: ", style="dim bold")
            out.append("; ".join(f"{one_line(a.title, 200)} ({one_line(a.subject, 40)}) "
                                 f"{_clock(a.start)}–{_clock(a.end)}" for a in recent[:4]), style="dim")
        out.rstrip()
        return out
