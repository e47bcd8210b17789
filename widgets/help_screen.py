"""The help screen: keys, and what each panel and alert means."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static
from rich.text import Text

HELP = """\
[b]traintop[/b] watches the GPUs, the host and the training process together,
and says what is wrong and what to try.

[b]Keys[/b]
  q            quit                       ?       this help
  p, space     pause the display (live: sampling and recording go on)
  r            start/stop recording to a file
  [b]Replay[/b]  ← →  seek ∓10 s   , .  step one sample   [ ]  slower/faster
          home end  start/end      0-9  jump to 0 %…90 %

[b]Panels[/b]
  GPU      utilization, power vs its limit, memory, temperature vs the
           slowdown threshold; fixed scales (0–100 %, 0–limit W, 0–total).
           \\[PWR CAP] at full load is normal; \\[THERMAL]: clocks cut.
           "SM n%" (GPM, Hopper+): how much of the GPU was at work;
           "util" only says that some kernel or copy was running.
  Host     CPU per core (a saturated core is often a data-loader worker),
           iowait, RAM, swap, disk and network rates.
  Process  the attached job (--pid N, or traintop run -- CMD): its tree,
           loader workers, NVML's per-process memory (an upper bound) and,
           with the probe, allocated vs reserved, steps/s and input wait.
  Alerts   evidence in numbers, then remedies (→) to try in order.

[b]Patterns[/b]
  Data starvation  utilization swinging between idle and busy, loader CPUs busy
  Underuse         power far below the limit, or util 100 % with few SMs active
  Thermal          clock-event reasons or temperature at the slowdown threshold
  Creeping memory  used memory rising steadily; time until it is full
  PCIe bottleneck  host-to-device copies near the link's limit, the GPU waiting
  GPU errors       XID events, uncorrectable or fast-rising ECC errors

Press any key to close.
"""


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            # rich Text keeps each line's indentation (markup in a Static loses it)
            yield Static(Text.from_markup(HELP), id="help-text")

    def on_key(self, event) -> None:
        event.stop()
        self.dismiss()
