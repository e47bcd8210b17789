"""The help screen: keys, and what each panel and alert means."""

from __future__ import annotations

import re

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widget import Widget

from traintop.rules import default_rules
from traintop.text import one_line
from traintop.widgets.render import SEVERITY_ICON
from traintop.widgets.wrap import hang_wrap

# What a few patterns look like before the alert explains them; every rule is listed by its title.
PATTERN_SIGNS = {
    "starvation": "utilization swinging between idle and busy, loader CPUs busy",
    "underuse": "power far below the limit, or util 100 % with few SMs active",
    "thermal": "clock-event reasons or temperature at the slowdown threshold",
    "memory_creep": "used memory rising steadily; time until it is full",
    "pcie": "copies near the link's limit, the GPU waiting for them",
    "gpu_errors": "XID events, uncorrectable or fast-rising ECC errors",
    "pause": "the probe's time ledger: repeated checkpoints, evaluations or other gaps",
    "precision": "SMs busy, tensor cores idle; the probe reads fp32 matmuls",
}

HELP = """\
[b]traintop[/b] watches the GPUs, the host and the training process together,
and says what is wrong and what to try.

[b]Keys[/b] (the footer shows those that apply now)
  q, Ctrl-C    quit (traintop run: asks whether to stop the job)
  ?            this help
  p, space     pause/resume the display (live: sampling and recording go on)
  ↑ ↓ PgUp PgDn  scroll the alerts
  g / G        one GPU's full panel and its alerts: next / previous; Esc: all GPUs again
  n            next page of GPUs (where even one line each does not fit)
  r            start/stop recording to a file (live)
  s            the job's thread stacks (with the probe): where it hangs
  [b]Replay[/b]  ← →  seek ∓10 s   , .  step one sample   [ ]  slower/faster
          home end  start/end      0-9  jump to 0 %…90 %

[b]Panels[/b]
  GPUs     more than fit as panels: one line each (utilization history,
           util and SM %, memory, power, temperature, the worst alert).
  GPU      utilization, power vs its limit, memory, temperature vs the
           slowdown threshold; fixed scales (0–100 %, 0–limit W, 0–total).
           \\[PWR CAP] at full load is normal; \\[THERMAL]: clocks cut.
           "SM n%" (GPM, Hopper+): how much of the GPU was at work;
           "util" only says that some kernel or copy was running.
  Host     CPU per core (a saturated core is often a data-loader worker),
           iowait, RAM, swap, disk and network rates.
  Process  the attached job (--pid N, or traintop run -- CMD): its tree,
           loader workers, NVML's per-process memory (an upper bound) and,
           with the probe, allocated vs reserved, steps/s and input wait,
           the matmul precision and MFU, and "time ▕…▏": where the last
           5 min went (green train = goodput, yellow input, orange
           collective waits, magenta checkpoint, cyan eval, blue compile
           and start-up, red stalled, grey other pauses).
           "captured": the evidence taken when a finding started (a
           profiler trace or a memory snapshot, kept beside a recording).
  Alerts   evidence in numbers, then remedies (→) to try in order.

[b]Patterns[/b] (every rule; the alert says what it saw and what to try)
{patterns}

↑ ↓ PgUp PgDn Home End scroll this help; Esc, q or ? close it.
"""


def patterns() -> str:
    """One line per rule, named by its own title, so the list cannot drift from the rules."""
    lines = []
    for rule in default_rules():
        line = f"  {SEVERITY_ICON.get(int(rule.severity), '•')} {rule.title}"
        if rule.id in PATTERN_SIGNS:
            line += f": {PATTERN_SIGNS[rule.id]}"
        lines.append(line.replace("[", "\\["))
    return "\n".join(lines)


def hang_of(line: str) -> int:
    """Where a help line's wrapped continuation starts: under its description column (the
    text after the first run of two spaces), else under its own indent."""
    m = re.match(r"( *)\S.*?  +(?=\S)", line)
    if m:
        return m.end()
    m = re.match(r"( *)[^ ]*? ?[▲✖ℹ•] ", line)
    return m.end() if m else len(line) - len(line.lstrip(" "))


def _insert_before(text: Text, marker: str, part: Text) -> Text:
    """``part`` inserted before the first ``marker`` in ``text`` (at its end where there is none)."""
    k = text.plain.find(marker)
    if k < 0:
        return Text.assemble(text, part)
    return Text.assemble(text[:k], part, text[k:])


class HelpText(Widget):
    """The help, wrapped to the box with hanging indents (Rich would start each continuation
    line at column 0)."""

    DEFAULT_CSS = "HelpText { height: auto; }"

    def __init__(self, text: Text, **kw) -> None:
        super().__init__(**kw)
        self._text = text
        self._cache: tuple[int, list[Text]] | None = None

    def lines(self, width: int) -> list[Text]:
        width = max(1, width)
        if self._cache is None or self._cache[0] != width:
            out: list[Text] = []
            for line in self._text.split("\n", allow_blank=True):
                out.extend(hang_wrap(line, width, hang_of(line.plain)))
            self._cache = (width, out)
        return self._cache[1]

    def get_content_height(self, container, viewport, width: int) -> int:
        return len(self.lines(width))

    def render(self) -> Text:
        out = Text("\n").join(self.lines(self.content_size.width or self.size.width or 80))
        out.no_wrap, out.overflow = True, "crop"
        return out


class HelpBox(VerticalScroll):
    """Takes the focus, so the arrows, PgUp/PgDn and Home/End scroll the help."""

    BINDINGS = [Binding("j", "scroll_down", show=False), Binding("k", "scroll_up", show=False),
                Binding("space", "page_down", show=False)]


class HelpScreen(ModalScreen):
    """Scrolling keys scroll; Esc, q and ? close; every other key does nothing (a modal screen
    keeps the dashboard's keys away)."""

    BINDINGS = [Binding("escape,q,question_mark", "close", "close"),
                Binding("ctrl+c", "app.quit", show=False)]  # Ctrl-C quits from here too (as q does on the dashboard)

    def __init__(self, where: list[tuple[str, str]] | None = None) -> None:
        """``where``: (what, path) pairs said under "Where things go" (recordings, the job's output)."""
        super().__init__()
        self.where = where or []

    def compose(self) -> ComposeResult:
        box = HelpBox(id="help-box")
        box.border_subtitle = "↑↓ PgUp PgDn scroll · Esc q ? close"
        text = Text.from_markup(HELP.format(patterns=patterns()))
        if self.where:  # paths are the user's: plain text, never markup
            tail = Text.from_markup("\n[b]Where things go[/b]\n")
            for what, path in self.where:
                tail.append(f"  {what:<12} ")
                tail.append(one_line(path, 500))
                tail.append("\n")
            text = _insert_before(text, "\nPanels\n", tail)
        with box:
            # rich Text keeps each line's indentation (markup in a Static loses it)
            yield HelpText(text, id="help-text")

    def on_mount(self) -> None:
        self.query_one(HelpBox).focus()

    def action_close(self) -> None:
        # Keys typed fast can reach this screen after it was dismissed: close it once.
        if self.app.screen_stack[-1:] == [self]:
            self.dismiss()
