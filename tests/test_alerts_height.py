"""The alerts' body keeps its height while a figure's width moves a word between rows: the screen
is laid out again when the text grows, and when it has been shorter for a while, not every second."""

import types

from traintop.widgets import alerts_panel
from traintop.widgets.alerts_panel import SHRINK_AFTER_S, AlertsBody
from traintop.widgets.line import Line


def _rows(body, words: int, width: int = 20) -> int:
    body._paras, body._cache = [(Line(" ".join(["word"] * words)), 2)], None
    return body.get_content_height(None, None, width)


def test_the_body_grows_at_once_and_shrinks_only_after_a_while(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(alerts_panel, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    body = AlertsBody()
    assert _rows(body, 6) == 2
    assert _rows(body, 9) == 3  # grown: at once
    assert _rows(body, 6) == 3  # one word fewer: the row stays (blank), no new layout
    now[0] = SHRINK_AFTER_S / 2
    assert _rows(body, 6) == 3 and body.text_lines(20)[-1].plain == ""
    assert _rows(body, 9) == 3  # back: nothing moved
    assert _rows(body, 6) == 3
    now[0] += SHRINK_AFTER_S
    assert _rows(body, 6) == 2  # shorter for a while: the row is given back
    assert _rows(body, 6, width=40) == 1  # another width: its own height at once
