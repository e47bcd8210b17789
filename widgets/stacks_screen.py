"""Where the job's threads are: the latest Python stack of every probed process (key s)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from traintop.stacks import render


def stacks_text(dumps, live: bool) -> Text:
    if not dumps:
        wait = "asked the job's probes; their answer comes within a second…" if live else \
            "no thread stacks here (they come from the probe: traintop run -- CMD)"
        return Text(f"Thread stacks: {wait}\n\nPress any key to close.")
    lines = ["Thread stacks, innermost calls last (press any key to close)", ""]
    for d in dumps:
        lines += render(d) + [""]
    return Text("\n".join(lines))  # plain text: the stacks are the job's, never markup


class StacksScreen(ModalScreen):
    BINDINGS = [Binding("escape,q,s", "close", "close")]

    def __init__(self, monitor, live: bool) -> None:
        super().__init__()
        self.monitor = monitor
        self.live = live

    def _dumps(self):
        with self.monitor.lock:
            found = list(self.monitor.stacks.values())
        return sorted(found, key=lambda d: (d.rank if d.rank is not None else 1 << 30, d.pid))

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(stacks_text(self._dumps(), self.live), id="stacks-text")

    def on_mount(self) -> None:
        self.set_interval(0.5, self._refresh)

    def _refresh(self) -> None:
        self.query_one("#stacks-text", Static).update(stacks_text(self._dumps(), self.live))

    def action_close(self) -> None:
        # Keys typed fast can reach this screen after it was dismissed: close it once.
        if self.app.screen_stack[-1:] == [self]:
            self.dismiss()

    def on_key(self, event) -> None:
        # Any key closes it, as it says ("press any key"); stopping the event here also stops
        # the screen's own bindings, so Esc, q and s must close through this path too.
        event.stop()  # a modal screen keeps the dashboard's keys away
        self.action_close()
