"""Alerts: what is wrong, the numbers that show it, and what to try."""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll

from traintop.text import one_line
from traintop.units import fmt_clock, fmt_duration
from traintop.findings import Finding
from traintop.reports.view import View
from traintop.widgets.render import SEVERITY_ICON, SEVERITY_STYLE
from traintop.widgets.line import Line
from traintop.widgets.lines import TextLines, join_lines, line_signature
from traintop.widgets.wrap import hang_wrap, keep_units
from traintop.metrics import gpu_index

Paragraph = tuple[Text | Line, int]  # a logical line and the indent of its wrapped continuation lines


_clock = fmt_clock


ENDED_SHOWN = 4  # the latest findings that ended, by name; the others are counted

SUBJECT_NAMES = {"gpus": "all GPUs"}  # the rules' own subjects that are not a GPU, said as a user reads them


def subject_label(subject: str) -> str:
    """"gpu3" -> "GPU 3"; "gpus" -> "all GPUs"; "host", "process" as they are. Alerts come from
    recordings too: every text in them is outside text."""
    if (i := gpu_index(subject)) is not None:
        return f"GPU {i}"
    return SUBJECT_NAMES.get(subject) or one_line(subject, 40)


def concerns(alert: Finding, gpu: int) -> bool:
    """Whether an alert is about ``gpu`` or about no single GPU (the job, the host, all GPUs)."""
    subject = alert.subject
    return gpu_index(subject) in (None, gpu)


def watched(view: View | None) -> str:
    """What "no problems" vouches for: only what is actually watched."""
    if view is None:
        return ""
    parts = []
    if view.gpus:
        samples = [g.sample for g in view.gpus if g.sample is not None]
        read = [name for name, field in (("utilization", "util"), ("power", "power_w"), ("memory", "mem_used"),
                                         ("temperature", "temp_c"))
                if any(getattr(s, field) is not None for s in samples)]
        if read:
            parts.append("GPU " + (read[0] if len(read) == 1 else ", ".join(read[:-1]) + " and " + read[-1]))
        elif samples:
            return "this source holds no reading of the GPUs themselves to judge"
    if view.host.sample is not None:
        parts.append("host CPU, memory and I/O")
    if view.process.sample is not None and view.process.sample.alive:
        parts.append("the job")
    if not parts:
        return ""
    text = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    verb = "looks" if parts == ["the job"] else "look"
    return f"{text} {verb} normal" + ("" if view.gpus else " (no GPU in view)")


def gpus_label(indices: list[int]) -> str:
    """"GPUs 0–7" for a run, "GPUs 0, 2, 5" otherwise."""
    xs = sorted(indices)
    if xs == list(range(xs[0], xs[-1] + 1)) and len(xs) > 2:
        return f"GPUs {xs[0]}–{xs[-1]}"
    return "GPUs " + ", ".join(map(str, xs))


def group_alerts(active) -> list[tuple[Finding, list[int]]]:
    """Active alerts with the same rule and severity on several GPUs (eight starving GPUs of one
    job) as one entry: (the first GPU's alert, every GPU's index); others alone, with []."""
    groups: dict[tuple, list[Finding]] = {}
    order: list[tuple] = []
    for a in active:
        key = (a.rule, int(a.severity)) if gpu_index(a.subject) is not None else ("", a.id, a.subject)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(a)
    out = []
    for key in order:
        alerts = groups[key]
        if len(alerts) == 1:
            out.append((alerts[0], []))
        else:
            alerts.sort(key=lambda a: gpu_index(a.subject))
            out.append((alerts[0], [gpu_index(a.subject) for a in alerts]))
    return out


def alert_paragraphs(active, recent, now: float | None, compact: bool, watching: str = "") -> list[Paragraph]:
    out: list[Paragraph] = []
    if not active:
        line = Line("✔ No problems detected", "bold green")
        if now is not None and watching:
            line.append(f" — {watching}.", "bold green dim")
        out.append((line, 2))
    explained = [a for a in active if a.explained_by]
    active = [a for a in active if not a.explained_by]
    titles = {a.rule: a.title for a in active}
    grouped = group_alerts(active)
    starts = {}
    for a in active:
        key = (a.rule, int(a.severity))
        starts[key] = min(starts.get(key, a.start), a.start)
    for k, (a, gpus) in enumerate(grouped):
        if k:
            out.append((Line(), 0))
        style = SEVERITY_STYLE.get(int(a.severity), "")
        head = Line(f"{SEVERITY_ICON.get(int(a.severity), '•')} {one_line(a.title, 200)}", style)
        start = starts[(a.rule, int(a.severity))] if gpus else a.start
        since = f" · {gpus_label(gpus) if gpus else subject_label(a.subject)} · since {_clock(start)}"
        if now is not None:
            since += f" ({fmt_duration(now - start)})"
        out.append((head.append(keep_units(since), f"{style} dim".strip()), 2))
        out.append((Line("  " + keep_units(one_line(a.evidence, 2000))), 2))
        if gpus:  # one GPU's numbers speak for the group; g shows each GPU's own
            others = [i for i in gpus if i != gpu_index(a.subject)]
            out.append((Line("  " + keep_units(f"The same on {gpus_label(others) if len(others) > 1 else f'GPU {others[0]}'}"
                                               " (g: each GPU's own numbers)."), "dim"), 2))
        for r in (a.remedies if k == 0 else a.remedies[:1]):
            out.append((Line("  → ", "bold cyan").append(keep_units(one_line(r, 2000)), "bold cyan"), 4))
    if explained:
        # one situation, one finding: what a stronger finding explains is listed under it, not as a cause
        said = "; ".join(f"{one_line(a.title, 200)} ({subject_label(a.subject)})" for a in explained[:6])
        by = {a.explained_by.partition(" ")[0] for a in explained}
        cause = ", ".join(titles.get(r) or one_line(r, 80) for r in sorted(by))
        out.append((Line(), 0))
        out.append((Line("Explained by ", "dim bold").append(f"{cause}: ", "dim bold")
                    .append(keep_units(said) + (f" +{len(explained) - 6}" if len(explained) > 6 else ""), "dim"), 2))
    if recent and (not compact or not active):  # compact: where nothing is up, what just ended still shows
        out.append((Line(), 0))
        ended = "; ".join(f"{one_line(a.title, 200)} ({subject_label(a.subject)}) {_clock(a.start)}–{_clock(a.end)}"
                          for a in recent[:ENDED_SHOWN])
        line = Line("Ended: ", "dim bold").append(ended, "dim bold dim")
        if len(recent) > ENDED_SHOWN:  # never cut silently
            line.append(f"; +{len(recent) - ENDED_SHOWN} more", "dim bold")
        out.append((line, 2))
    return out


SHRINK_AFTER_S = 10.0  # the alerts' text shorter for this long: the body gives the rows back


class AlertsBody(TextLines):
    """The alert text, wrapped here with hanging indents. Its numbers change every second: a
    paragraph is wrapped again only when its text changes, only the lines that changed are
    repainted, and the screen is laid out again only when the number of lines grows, or when it
    has been smaller for ``SHRINK_AFTER_S`` (a figure whose width moves a word from one row to the
    next and back, "9 %" then "12 %", laid the whole screen out again each time: ~25 ms of CPU)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self._paras: list[Paragraph] = []
        self._cache: tuple[int, list[Text]] | None = None
        self._wraps: dict[tuple, list[Text]] = {}  # (paragraph signature, width, hang) -> its lines
        self._rows = (0, 0)  # (width, rows the body holds at that width)
        self._short_since: float | None = None

    def set_paragraphs(self, paras: list[Paragraph]) -> None:
        self._paras, self._cache = paras, None
        self.redraw()

    def _wrapped(self, width: int) -> list[Text]:
        if self._cache is None or self._cache[0] != width:
            lines: list[Text] = []
            wraps: dict[tuple, list[Text]] = {}
            for text, hang in self._paras:
                key = (line_signature(text), width, hang)
                wrapped = wraps.get(key) or self._wraps.get(key)
                if wrapped is None:
                    wrapped = hang_wrap(text, width, hang)
                wraps[key] = wrapped
                lines.extend(wrapped)
            self._wraps = wraps  # only what is on screen now
            self._cache = (width, lines)
        return self._cache[1]

    def _held(self, width: int) -> list[Text]:
        """The wrapped lines, with blank rows below them while the body keeps a taller height."""
        lines = self._wrapped(width)
        held_width, rows = self._rows
        if held_width != width or len(lines) >= rows:
            self._rows, self._short_since = (width, len(lines)), None
            return lines
        now = time.monotonic()
        if self._short_since is None:
            self._short_since = now
        if now - self._short_since >= SHRINK_AFTER_S:
            self._rows, self._short_since = (width, len(lines)), None
            return lines
        return lines + [Text()] * (rows - len(lines))

    def get_content_height(self, container, viewport, width: int) -> int:
        return len(self._held(width))

    def text_lines(self, width: int) -> list[Text]:
        return self._held(max(1, width))

    def render(self) -> Text:
        out = join_lines(self._wrapped(self.content_size.width or self.size.width or 80))
        out.overflow = "crop"
        return out


class AlertsPanel(VerticalScroll, can_focus=False):
    """Scrollable (the app binds the keys): active alerts, most severe first, then ended ones."""

    def __init__(self, **kw) -> None:
        super().__init__(id="alerts", **kw)
        self.border_title = "Alerts"

    def compose(self) -> ComposeResult:
        yield AlertsBody(id="alerts-body")

    def on_resize(self, event) -> None:
        # Given fewer than three rows (a tiny terminal), a frame would lose its bottom edge
        # and leave one row of alerts: the alerts get every row, without the frame.
        self.set_class(self.outer_size.height < 3, "-cramped")

    _shown: tuple | None = None
    _title = "Alerts"

    def show(self, view: View, compact: bool, focus: int | None = None) -> None:
        """``focus``: the GPU shown alone (key g): its alerts and those of the job and host;
        a line counts the others."""
        active, recent = view.active, view.recent
        if focus is not None:
            active = [a for a in active if concerns(a, focus)]
            recent = [a for a in recent if concerns(a, focus)]
        others = len(view.active) - len(active)
        paras = alert_paragraphs(active, recent, view.t, compact, watched(view))
        if others:
            paras = [(Line(f"+{others} on other GPUs (Esc: all GPUs)", "bold yellow"), 2), (Line(), 0)] + paras
        n = len([a for a in active if not a.explained_by])  # causes: what they explain is listed under them
        title = f"Alerts ({n} active)" if n else "Alerts"
        if focus is not None:
            title = f"Alerts: GPU {focus}, job and host ({n} active)"
        if title != self._title:  # setting it, even unchanged, repaints the whole panel
            self._title = self.border_title = title
        self.set_class(any(a.severity >= 2 for a in view.active), "-firing")
        key = (tuple((t.plain, h) for t, h in paras), compact)
        if key == self._shown:
            return
        self._shown = key
        self.query_one("#alerts-body", AlertsBody).set_paragraphs(paras)

    @staticmethod
    def render_alerts(active: list[Finding], recent: list[Finding], now: float | None, compact: bool,
                      watching: str = "") -> Text:
        """The alerts as one unwrapped Text (tests and tools)."""
        return Text("\n").join(t.to_text() for t, _ in alert_paragraphs(active, recent, now, compact, watching))
