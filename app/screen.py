"""The dashboard's screen: a partial update renders only the rows that changed, widget by widget.

Textual (8.x, ``Compositor.render_partial_update``) crops a partial update to the bounding
box of every dirty region, then asks EVERY widget overlapping that box for all of its lines
(Screen, containers and panels alike), and keeps only the dirty rows. A dashboard frame
dirties the clock on row 0 and a few sparkline rows further down, so the box is nearly the
whole screen and every widget walks all its lines to produce a few dozen. Here a widget is
asked only for the rows where it meets a dirty region; what reaches the terminal is the same
(the same spans, the same chops), built from fewer lines; a widget whose dirty rows are all
covered by widgets in front of it (a container under its panels) is not asked at all. Full
updates are Textual's own. This leans on Compositor internals of Textual 8: should a Textual
differ inside (a missing attribute, another shape), the first failed update falls back to
Textual's own partial update for good, with the same dirty regions, so nothing is lost.
"""

from __future__ import annotations

from textual._compositor import ChopsUpdate, Compositor
from textual.geometry import Region
from textual.screen import Screen


class RowCompositor(Compositor):
    rows_only = True  # False once Textual's internals turned out to differ

    def render_partial_update(self) -> ChopsUpdate | None:
        if not self.rows_only:
            return super().render_partial_update()
        dirty = set(self._dirty_regions)
        try:
            return self._rows_update()
        except (AttributeError, TypeError, ValueError, KeyError, IndexError):
            self.rows_only = False
            self._dirty_regions.update(dirty)
            return super().render_partial_update()

    def _rows_update(self) -> ChopsUpdate | None:
        screen = self.size.region
        regions = [r for r in (d.intersection(screen) for d in self._dirty_regions) if r]
        self._dirty_regions.clear()
        if not regions:
            return None
        spans = list(self._regions_to_spans(regions))
        dirty_rows: dict[int, list[tuple[int, int]]] = {}  # screen row -> dirty column ranges
        for r in regions:
            a, b = r.x, r.x + r.width
            for y in range(r.y, r.y + r.height):
                dirty_rows.setdefault(y, []).append((a, b))
        cuts = self.cuts
        chops = [dict.fromkeys(cut_set[:-1]) for cut_set in cuts]
        for widget, region, visible in self._uncovered():
            x, width = visible.x, visible.width
            right = x + width
            rows: dict[int, list[tuple[int, int]]] = {}  # screen row -> dirty column ranges on this widget
            for y in range(visible.y, visible.y + visible.height):
                at = dirty_rows.get(y)
                if at is not None:
                    hits = [(max(a, x), min(b, right)) for a, b in at if a < right and b > x]
                    if hits:
                        rows[y] = hits
            if not rows:
                continue  # no dirty region touches this widget: none of its lines is needed
            if not any(chops[y].get(a) is None and any(a < x2 and b > x1 for x1, x2 in spans_at)
                       for y, spans_at in rows.items() for a, b in zip(cuts[y], cuts[y][1:]) if x <= a < right):
                continue  # every dirty chop here is drawn by a widget in front (a container under its panels)
            top, bottom = min(rows), max(rows) + 1
            strips = widget.render_lines(Region(x - region.x, top - region.y, width, bottom - top))
            for y, strip in zip(range(top, bottom), strips):
                if y not in rows:
                    continue
                line = chops[y]
                final_cuts = [cut for cut in cuts[y] if right >= cut >= x]
                pieces = (strip,) if len(final_cuts) == 2 and final_cuts[1] - x == strip.cell_length \
                    else strip.divide([cut - x for cut in final_cuts[1:]])
                for cut, piece in zip(final_cuts, pieces):
                    if line.get(cut) is None:  # front to back: the first widget at a cut wins
                        line[cut] = piece
        return ChopsUpdate(chops, spans, [cut_set[1:] for cut_set in cuts])


    _geometry: tuple | None = None  # (the visible_widgets it was worked out from, its widgets)

    def _uncovered(self) -> list:
        """The visible widgets, front to back, less those whose every visible cell lies under
        widgets in front of them (the screen and the containers under the panels): their lines
        would never reach the terminal. Worked out once a layout."""
        visible_widgets = self.visible_widgets
        if self._geometry is not None and self._geometry[0] is visible_widgets:
            return self._geometry[1]
        covered: dict[int, list[tuple[int, int]]] = {}  # row -> merged column ranges of widgets in front
        out = []
        for widget, (region, clip) in visible_widgets.items():
            visible = region.intersection(clip)
            a, b = visible.x, visible.x + visible.width
            rows = range(visible.y, visible.y + visible.height)
            if not all(any(x1 <= a and b <= x2 for x1, x2 in covered.get(y, ())) for y in rows):
                out.append((widget, region, visible))
            for y in rows:
                covered[y] = _merged(covered.get(y, []) + [(a, b)])
        self._geometry = (visible_widgets, out)
        return out


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


class DashboardScreen(Screen):
    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self._compositor = RowCompositor()
