"""The dashboard's keys: what each does, and what it says where it cannot act."""

from __future__ import annotations

from textual.binding import Binding

ALERTS_KEYS = Binding.Group("alerts", compact=True)
SEEK_KEYS = Binding.Group("seek", compact=True)
REPLAY_ACTIONS = {"seek", "seek_fraction", "step", "speed"}

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
    Binding("h,H,j,a,u", "cluster_key", show=False),  # the cluster view's keys: a line says so
    Binding("comma", "step(-1)", "step back", show=False),
    Binding("full_stop", "step(1)", "step", show=False),
    Binding("home", "seek_fraction(0)", "start", show=False),
    Binding("end", "seek_fraction(1)", "end", show=False),
] + [Binding(str(d), f"seek_fraction({d / 10})", show=False) for d in range(10)]


def unavailable(action: str, gpus: int) -> str | None:
    """Why a key does nothing here (``gpus``: how many are in view)."""
    if action == "record":
        return "r records live data: this is a recording already."  # whole at 80 columns
    if action == "next_page":
        return "All the GPUs fit on the screen: no next page."
    if action == "seek":
        return "Live data: seek, step and speed apply to replays."
    if action == "focus_gpu":
        return "One GPU only: nothing to focus." if gpus == 1 else "No GPU in view: nothing to focus."
    return None
