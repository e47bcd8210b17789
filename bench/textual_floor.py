"""The yardstick for the dashboard's CPU: a minimal Textual app that repaints the WHOLE screen
with new random characters once a second (every line changes, as no real frame of traintop
does). bench/cpu_compare.py --preset guard runs it beside `traintop simulate`.

    python bench/textual_floor.py [--interval 1]
"""

from __future__ import annotations

import argparse
import random
import string

from rich.text import Text
from textual.app import App, ComposeResult
from textual.widgets import Static

CHARS = string.ascii_letters + string.digits + "▁▂▃▄▅▆▇█"


class Floor(App):
    CSS = "Static { width: 1fr; height: 1fr; }"

    def __init__(self, interval: float) -> None:
        super().__init__()
        self.interval = interval
        self.rng = random.Random(0)

    def compose(self) -> ComposeResult:
        yield Static(id="screen")

    def on_mount(self) -> None:
        self.repaint()
        self.set_interval(self.interval, self.repaint)

    def repaint(self) -> None:
        w, h = self.size
        text = "\n".join("".join(self.rng.choice(CHARS) for _ in range(w)) for _ in range(h))
        self.query_one("#screen", Static).update(Text(text, no_wrap=True))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interval", type=float, default=1.0)
    Floor(ap.parse_args().interval).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
