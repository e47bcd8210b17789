"""`q` in `traintop run` while the job runs: stop the job, leave it running, or stay."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Static

from traintop.text import one_line


def quit_job_text(pid: int, grace: float, log_path: str | None) -> Text:
    """What each answer does; the log's path is the job's own (shown as text, never markup)."""
    out = Text()
    out.append(f"The job (PID {pid}) is still running. Quit traintop and:\n\n", style="bold")
    out.append("  s  ", style="bold")
    out.append(f"stop the job: SIGTERM to all of it, SIGKILL after {grace:g} s;\n"
               "     traintop exits with the job's status\n")
    out.append("  l  ", style="bold")
    out.append("leave it running on its own (Ctrl-C no longer reaches it);\n"
               "     traintop exits with 0\n")
    out.append("  c  ", style="bold")
    out.append("cancel: back to the dashboard (Esc too)")
    if log_path:
        out.append("\n\nIts output: ")
        out.append(one_line(log_path, 500))
    return out


class QuitJobScreen(ModalScreen[str]):
    """Dismissed with "stop", "leave" or "cancel"; every other key does nothing."""

    BINDINGS = [Binding("s", "answer('stop')", "stop the job"),
                Binding("l", "answer('leave')", "leave it running"),
                Binding("c,escape", "answer('cancel')", "cancel")]

    def __init__(self, pid: int, grace: float, log_path: str | None) -> None:
        super().__init__()
        self._text = quit_job_text(pid, grace, log_path)

    def compose(self) -> ComposeResult:
        box = Static(self._text, id="quit-box")
        box.border_title = "Quit"
        yield box

    def action_answer(self, answer: str) -> None:
        if self.app.screen_stack[-1:] == [self]:  # keys typed fast: answer once
            self.dismiss(answer)
