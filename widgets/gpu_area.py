"""The GPUs' part of the dashboard: a full panel each, one table line each (in pages), or one
GPU focused alone, as the terminal's size allows. Not a widget: it fills the ``#gpus`` box."""

from __future__ import annotations

from traintop.reports.view import View
from traintop.widgets.gpu_panel import GpuPanel

COMPACT_WIDTH = 120
COMPACT_HEIGHT = 36
PANEL_ROWS = 7  # a GPU's full panel
COMPACT_PANEL_ROWS = 3
# Below this many rows a focused GPU's full panel (7) would not fit beside the top line, the
# replay bar, one row of alerts, host, process and footer: it keeps its compact rows there.
SHORT_HEIGHT = PANEL_ROWS + 7
ALERTS_MIN_ROWS = 8  # what the GPUs leave to the alerts before they fall back to one line each
COMPACT_ALERTS_MIN_ROWS = 4


def gpu_layout(n: int, width: int, height: int, replay_bar: bool, focused: bool) -> tuple[str, int]:
    """How the GPUs are shown: ("panels"|"table"|"focus"|"none", rows the table may use)."""
    compact = width < COMPACT_WIDTH or height < COMPACT_HEIGHT
    avail = height - 2 - (1 if replay_bar else 0)  # status line and footer
    if n == 0:
        return "none", 0
    if focused:
        return "focus", 0
    if compact:
        room = avail - 2 - COMPACT_ALERTS_MIN_ROWS  # host and process lines
        if n * COMPACT_PANEL_ROWS <= room:
            return "panels", 0
        return "table", max(1, room)
    room = avail - ALERTS_MIN_ROWS
    if n * PANEL_ROWS <= room:
        return "panels", 0
    return "table", max(1, room - 3)  # the table's border and header


class GpuArea:
    def __init__(self) -> None:
        self.focused: int | None = None  # the GPU index whose full panel is shown alone
        self.page = 0
        self.pages = 1
        self.mode = "none"  # as gpu_layout says
        self._panels: list[GpuPanel] = []
        self._box = self._table = None

    def mount(self, box, table) -> None:
        self._box, self._table = box, table

    def show(self, view: View, compact: bool, size: tuple[int, int], replay_bar: bool) -> None:
        indices = [g.sample.index for g in view.gpus]
        if [p.index for p in self._panels] != indices:
            for p in self._panels:
                p.remove()
            self._panels = [GpuPanel(i) for i in indices]
            self._box.mount_all(self._panels)
        if self.focused is not None and self.focused not in indices:
            self.focused = None
        mode, rows = gpu_layout(len(indices), *size, replay_bar, self.focused is not None)
        self.mode = mode
        self._table.display = mode == "table"
        if mode == "table":
            n = len(view.gpus)
            per_page = rows if n <= rows else max(1, rows - 1)
            self.pages = -(-n // per_page)
            self.page %= self.pages
            first = self.page * per_page
            shown = list(view.gpus[first:first + per_page])
            more = n - len(shown)
            self._table.styles.height = len(shown) + (1 if more else 0) + (0 if compact else 3)
            self._table.show(shown, n, more, wide=not compact)
        else:
            self.pages = 1
        for panel, gv in zip(self._panels, view.gpus):
            visible = mode == "panels" or (mode == "focus" and gv.sample.index == self.focused)
            panel.display = visible
            panel.set_class(mode == "focus", "-focused")
            if visible:
                panel.show(gv, compact and mode != "focus")

    def focus_next(self, gpus: list[int], direction: int) -> None:
        """The next GPU alone (the first from all of them); past the last, all of them again."""
        if self.focused is None:
            k = 0 if direction > 0 else len(gpus) - 1
        else:
            k = gpus.index(self.focused) + direction
        self.focused = gpus[k] if 0 <= k < len(gpus) else None

    def next_page(self) -> None:
        self.page = (self.page + 1) % max(1, self.pages)
