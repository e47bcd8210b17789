"""Messages in the dashboard's top line for a while, over nothing (toasts covered the panels).

A message may quote a file name or an error: shown as text, never markup."""

from __future__ import annotations

from rich.text import Text

from traintop.text import one_line

NOTICE_S = 6.0


class Notices:
    def __init__(self, app) -> None:
        self.app = app
        self.bar = None  # the StatusBar, once mounted
        self._timer = None

    def room(self) -> int:
        width = self.app.size.width
        return self.bar.notice_room(width) if self.bar is not None else width

    def say(self, message: str, severity: str = "information", timeout: float | None = None) -> None:
        if self.bar is None:
            return
        self.bar.show_notice(one_line(message, 1000), severity)
        if self._timer is not None:
            self._timer.stop()
        seconds = timeout or (2 * NOTICE_S if severity == "error" else NOTICE_S)
        self._timer = self.app.set_timer(seconds, self._clear)

    def say_in_turn(self, parts: list[str], part_s: float, severity: str = "information",
                    last_s: float = 12) -> None:
        """A message too long for the line, a part at a time (the reason after the news), each
        for ``part_s`` seconds, the last for ``last_s``."""
        self.say(parts[0], severity, timeout=part_s if len(parts) > 1 else last_s)
        if len(parts) > 1:
            shown = self.bar.notice if self.bar is not None else None

            def next_part() -> None:  # unless another message took the line meanwhile
                if self.bar is not None and self.bar.notice == shown:
                    self.say_in_turn(parts[1:], part_s, severity, last_s)

            self.app.set_timer(part_s - 0.5, next_part)

    def withdraw(self, message: str) -> None:
        """Take ``message`` off the line now if it is still there (it no longer holds)."""
        if self.bar is not None and self.bar.notice == one_line(message, 1000):
            if self._timer is not None:
                self._timer.stop()
            self._clear()

    def _clear(self) -> None:
        self._timer = None
        if self.bar is not None:
            self.bar.show_notice(None)


def plain_message(message, title: str = "", markup: bool = True) -> str:
    """A message of Textual's own (ctrl+c: "press q to quit"), which carries markup, as text."""
    text = str(message)
    if markup:
        try:
            text = Text.from_markup(text).plain
        except Exception:  # not markup after all: show it as it is
            pass
    return f"{title}: {text}" if title else text
