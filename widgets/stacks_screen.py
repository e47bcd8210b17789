"""Where the job's threads are: the latest Python stack of every probed process (key s)."""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from traintop.stacks import render


ANSWER_WAIT_S = 5.0  # a probe answers with its next message, twice a second: longer is no answer

# Why there is no stack to show, by situation (the app says which).
NO_STACKS = {
    "recording": "none in this recording. The probe takes them live (traintop run -- CMD): on s, and by "
                 "itself when steps stop for 30 s; a recording made then keeps them.",
    "simulated": "none from the simulator. Live, they come from the probe: traintop run -- CMD, then s.",
    "no probe": "no probe watches a job here, and stacks come from it: start the job with "
                "traintop run -- CMD (or traintop --pid N for one started with it), then press s.",
    "ended": "the job has ended: no probe is left to ask (those taken before it ended show here).",
    "asked": "asked the job's probes; their answer comes within a second…",
    "no answer": f"no answer from the job's probes in {ANSWER_WAIT_S:.0f} s (a process held in C code "
                 "with the GIL cannot answer; py-spy dump --pid N reads it from outside).",
}


# Stacks shown while none can come now: said above them, with when they were taken.
OLD_STACKS = {
    "ended": "The job has ended: these stacks were taken before it did",
    "no answer": f"No answer from the job's probes in {ANSWER_WAIT_S:.0f} s: these stacks are older",
}


def stacks_text(dumps, situation: str) -> Text:
    if not dumps:
        return Text(f"Thread stacks: {NO_STACKS[situation]}\n\nArrows and PgUp/PgDn scroll; any other key closes.")
    lines = ["Thread stacks, innermost calls last (arrows and PgUp/PgDn scroll; any other key closes)", ""]
    if situation in OLD_STACKS:
        taken = time.strftime("%H:%M:%S", time.localtime(max(d.t for d in dumps)))
        lines += [f"{OLD_STACKS[situation]} (the latest at {taken}).", ""]
    for d in dumps:
        shown = render(d)
        # when it was taken: in a replay, or a dump kept from a pause, "now" is not when
        shown[0] = f"{shown[0].removesuffix(':')}, taken at {time.strftime('%H:%M:%S', time.localtime(d.t))}:"
        lines += shown + [""]
    return Text("\n".join(lines))  # plain text: the stacks are the job's, never markup


SCROLL_KEYS = {
    "up": lambda box: box.scroll_y - 1, "down": lambda box: box.scroll_y + 1,
    "pageup": lambda box: box.scroll_y - max(1, box.size.height - 1),
    "pagedown": lambda box: box.scroll_y + max(1, box.size.height - 1),
    "home": lambda box: 0, "end": lambda box: box.max_scroll_y,
}


class StacksScreen(ModalScreen):
    BINDINGS = [Binding("escape,q,s", "close", "close")]

    def __init__(self, monitor, situation: str, clock=time.monotonic) -> None:
        """``situation``: "asked" (live, the probes were asked just now) or why none can come
        (a key of NO_STACKS)."""
        super().__init__()
        self.monitor = monitor
        self.situation = situation
        self._clock = clock
        self._asked_at = clock()
        self._asked_wall = time.time()  # the dumps' own clock: an answer is one taken after the ask

    def _situation(self, dumps=()) -> str:
        if self.situation == "asked" and self._clock() - self._asked_at > ANSWER_WAIT_S \
                and not any(d.t >= self._asked_wall - 1.0 for d in dumps):
            return "no answer"
        return self.situation

    def _dumps(self):
        with self.monitor.lock:
            found = list(self.monitor.stacks.values())
        return sorted(found, key=lambda d: (d.rank if d.rank is not None else 1 << 30, d.pid))

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box", classes="-wide"):
            dumps = self._dumps()
            yield Static(stacks_text(dumps, self._situation(dumps)), id="stacks-text")

    def on_mount(self) -> None:
        self.set_interval(0.5, self._refresh)

    def _refresh(self) -> None:
        dumps = self._dumps()
        self.query_one("#stacks-text", Static).update(stacks_text(dumps, self._situation(dumps)))

    def action_close(self) -> None:
        # Keys typed fast can reach this screen after it was dismissed: close it once.
        if self.app.screen_stack[-1:] == [self]:
            self.dismiss()

    async def on_key(self, event) -> None:
        # Any other key closes it, as it says; stopping the event here also stops the screen's
        # own bindings, so Esc, q and s must close through this path too.
        event.stop()  # a modal screen keeps the dashboard's keys away
        if event.key == "ctrl+c":  # quits, as from the dashboard
            await self.app.run_action("app.quit")
            return
        scroll = SCROLL_KEYS.get(event.key)
        if scroll is not None:  # many threads, or a small terminal: the stacks run past the screen
            box = self.query_one("#help-box", VerticalScroll)
            box.scroll_to(y=scroll(box), animate=False)
            return
        self.action_close()
