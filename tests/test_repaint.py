"""The dashboard repaints only what changed, and what it shows equals a full repaint."""

import asyncio

import pytest

from rich.text import Text
from textual.app import App

from traintop.widgets.lines import TextLines


class Lines(TextLines):
    DEFAULT_CSS = "Lines { height: 7; border: round white; padding: 0 1; }"

    def __init__(self) -> None:
        super().__init__()
        self.rows = [f"row {k}" for k in range(5)]

    def render(self) -> Text:
        return Text("\n".join(self.rows), no_wrap=True)


def _count_drawn_lines(widget) -> list[int]:
    """Lines the widget draws from now on (Textual asks for a line only when it repaints it)."""
    drawn: list[int] = []
    inner = widget.render_line

    def render_line(y):
        drawn.append(y)
        return inner(y)

    widget.render_line = render_line
    return drawn


def _screen_text(app) -> list[str]:
    return [line.text for line in app.screen._compositor.render_strips()]


def test_a_changed_line_repaints_that_line_only_and_an_unchanged_text_nothing():
    class One(App):
        def compose(self):
            yield Lines()

    async def go():
        app = One()
        async with app.run_test(size=(40, 10)) as pilot:
            w = app.query_one(Lines)
            await pilot.pause()
            drawn = _count_drawn_lines(w)
            w.redraw()
            await pilot.pause()
            assert drawn == []
            w.rows[2] = "row two, changed"
            w.redraw()
            await pilot.pause()
            assert drawn == [2]
            assert "row two, changed" in "\n".join(_screen_text(app))
            w.rows = ["one line only"]  # fewer lines: all of it again
            w.redraw()
            await pilot.pause()
            assert set(drawn[1:]) >= {0, 1, 2, 3, 4}

    asyncio.run(go())


@pytest.mark.parametrize("size,gpus", [((160, 48), 2), ((80, 24), 2), ((120, 36), 8)],
                         ids=["panels-160x48", "compact-80x24", "table-8gpu"])
def test_frames_repaint_only_changed_lines_and_end_where_a_full_repaint_does(sim_app, size, gpus, line_paths):
    async def go():
        app, _, feed = sim_app("starved,healthy", gpus=gpus, interval=1.0)
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            panels = list(app.query(TextLines))
            counts = {p: _count_drawn_lines(p) for p in panels}
            app.refresh_view()  # no new sample: nothing to repaint
            await pilot.pause()
            assert sum(map(len, counts.values())) == 0
            for _ in range(5):
                feed.step()
                app.refresh_view()
                await pilot.pause()
            drawn = sum(map(len, counts.values()))
            rows = sum(p.content_size.height for p in panels if p.display)
            # The borders, labels and steady text are not repainted. At 120x36 with 8 ranks most of the
            # process panel's lines (each rank's rates, the step sparkline) change with every sample,
            # and the alerts (the same finding on several GPUs drawn as one entry) take few rows: 2/3.
            assert 0 < drawn < 5 * rows * 2 / 3
            partial = _screen_text(app)
            for p in panels:
                p.refresh()
            await pilot.pause()
            assert _screen_text(app) == partial

    asyncio.run(go())


@pytest.fixture(params=["panels' own paths", "Textual's paths"])
def line_paths(request, monkeypatch):
    """Each test twice: with the panels' own frame and repaint paths, and with Textual's (what
    a Textual that differs inside falls back to)."""
    from traintop.widgets import lines

    own = request.param == "panels' own paths"
    monkeypatch.setattr(lines, "FAST_FRAME", [own])
    monkeypatch.setattr(lines, "DIRECT_REPAINT", [own])
    return own


@pytest.mark.parametrize("size,gpus", [((160, 48), 2), ((80, 24), 2), ((120, 36), 8)],
                         ids=["panels-160x48", "compact-80x24", "table-8gpu"])
def test_what_reaches_the_terminal_equals_a_full_repaint_and_few_rows_are_walked(sim_app, size, gpus, line_paths):
    """Partial updates render only the widgets and rows that a dirty region meets (Textual walks
    every widget in their bounding box): the terminal, fed every update, shows a full repaint."""
    import pyte
    from textual._compositor import ChopsUpdate, CompositorUpdate
    from textual.widget import Widget

    async def go():
        app, _, feed = sim_app("starved,healthy", gpus=gpus, interval=1.0)
        term = pyte.Screen(*size)
        stream = pyte.Stream(term)
        partial_rows: list[int] = []
        asked = [0]

        def display(screen, update) -> None:
            if isinstance(update, CompositorUpdate):
                if isinstance(update, ChopsUpdate):
                    partial_rows.append(asked[0])
                asked[0] = 0
                stream.feed(update.render_segments(app.console))

        render_lines, panel_lines = Widget.render_lines, TextLines.render_lines

        def counted(self, crop):
            if not isinstance(self, TextLines):  # counted once, below
                asked[0] += crop.height
            return render_lines(self, crop)

        def counted_panel(self, crop):
            asked[0] += crop.height
            return panel_lines(self, crop)

        app._display = display
        Widget.render_lines, TextLines.render_lines = counted, counted_panel
        try:
            async with app.run_test(size=size) as pilot:
                await pilot.pause()
                for key in (None, None, "g", None, "escape", None, None, None):
                    feed.step()
                    app.refresh_view()
                    if key:
                        await pilot.press(key)
                    await pilot.pause()
                    assert term.display == _screen_text(app)
                partial_rows.clear()
                asked[0] = 0
                for _ in range(3):  # steady frames: one partial update each
                    feed.step()
                    app.refresh_view()
                    await pilot.pause()
                    assert term.display == _screen_text(app)
                    asked[0] = 0  # the full render just above is not the compositor's update
        finally:
            Widget.render_lines, TextLines.render_lines = render_lines, panel_lines
        assert len(partial_rows) >= 3
        # Textual's own compositor walks 3 to 7 times the screen's rows a steady frame, here ~1
        assert max(partial_rows) < 2 * size[1]

    asyncio.run(go())


def test_a_line_becomes_the_strip_rich_would_render():
    """text_strip builds the segments in one pass: the same text and styles as Text.render,
    overlapping spans (a sparkline appended into a row) included."""
    import random

    from rich.console import Console
    from rich.segment import Segment
    from rich.style import Style
    from textual.strip import Strip

    from traintop.widgets.lines import text_strip

    console, base = Console(), Style(color="white", bgcolor="black")
    rng = random.Random(0)
    for _ in range(2000):
        line = Text(style=rng.choice(["", "dim", "bold red"]))
        for _ in range(rng.randint(0, 6)):
            if rng.random() < 0.3:
                inner = Text(rng.choice(["ab", "▁▂█", "   "]), style=rng.choice(["", "dim", "green"]))
                inner.append("xy", style=rng.choice(["", "bold", "yellow on blue"]))
                line.append_text(inner)
            else:
                line.append(rng.choice(["GPU 0 ", "12.5", "·", "°C"]), style=rng.choice(["", "bold", Style(italic=True)]))
        segments = [Segment(line.plain, console.get_style(line.style))] if line.style and not line.spans \
            else list(line.render(console))
        expected = Strip(segments, line.cell_len).apply_style(base)
        got = text_strip(line, console, base)
        assert [(s.text, s.style) for s in got if s.text] == [(s.text, s.style) for s in expected if s.text]
        assert got.cell_length == expected.cell_length


def test_the_dashboard_collects_cycles_every_few_frames_not_every_frame(sim_app):
    """A frame allocates thousands of short-lived objects: at Python's default gen-0 threshold
    the cyclic GC ran about once a frame; the dashboard raises it while it runs, and puts it back."""
    import gc

    async def go():
        app, _, feed = sim_app("starved", gpus=2, interval=1.0)
        counts = [0]

        def count(phase, info):
            if phase == "start" and info["generation"] == 0:
                counts[0] += 1

        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            gc.callbacks.append(count)
            try:
                for _ in range(30):
                    feed.step()
                    app.refresh_view()
                    await pilot.pause()
            finally:
                gc.callbacks.remove(count)
        return counts[0]

    before = gc.get_threshold()
    collections = asyncio.run(go())
    assert collections < 30 / 3  # was ~1.1 a frame
    assert gc.get_threshold() == before


def test_a_textual_that_differs_inside_falls_back_to_its_own_partial_updates(sim_app, monkeypatch):
    """Should Textual's compositor internals change, the dashboard's row-wise updates give way
    to Textual's own for good, with the dirty regions kept: the terminal still shows every frame."""
    import pyte
    from textual._compositor import CompositorUpdate

    from traintop.app.screen import RowCompositor

    def changed_inside(self):
        raise AttributeError("'RowCompositor' object has no attribute 'cuts'")

    monkeypatch.setattr(RowCompositor, "_rows_update", changed_inside)

    async def go():
        app, _, feed = sim_app("starved,healthy", gpus=2, interval=1.0)
        term = pyte.Screen(120, 36)
        stream = pyte.Stream(term)

        def display(screen, update) -> None:
            if isinstance(update, CompositorUpdate):
                stream.feed(update.render_segments(app.console))

        app._display = display
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause()
            for _ in range(4):
                feed.step()
                app.refresh_view()
                await pilot.pause()
                assert term.display == _screen_text(app)
            assert app.screen._compositor.rows_only is False

    asyncio.run(go())
