"""A panel row drawn as a Line shows what the same rich Text shows: text, cut, wrap and styles."""

import random

import pytest
from rich.console import Console
from rich.style import Style
from rich.text import Text

from traintop.widgets.line import Line, cells, from_text, line_strip
from traintop.widgets.line import fit_lines

PIECES = ["abc ", "▁▂▃█", "GPU 0 ", "x", "–", " 12 %", "", "…", "averyveryverylongwordthatdoesnotfit", "  ",
          "a b c d ", "loader workers (4): ", "12\u00a0GiB"]
WIDE = ["日本", "😀"]
STYLES = ["", "bold", "dim", "green", "bold yellow", "dim cyan"]


def _pair(rng, pieces):
    line, text = Line(), Text(no_wrap=True, overflow="ellipsis")
    for _ in range(rng.randint(0, 7)):
        piece, style = rng.choice(pieces), rng.choice(STYLES)
        line.append(piece, style)
        text.append(piece, style=style or None)
    return line, text


def _cells(segments):
    return [(ch, seg.style) for seg in segments for ch in seg.text]


def _drawn(line: Line, console, base):
    return _cells(line_strip(line, console, base))


def _drawn_text(text: Text, console, base):
    return [(ch, base + (st or Style())) for ch, st in _cells(s for s in text.render(console) if s.text != "\n")]


def test_a_line_cut_to_a_width_draws_what_rich_draws():
    console, base, rng = Console(), Style(color="white", bgcolor="black"), random.Random(1)
    for _ in range(4000):
        line, text = _pair(rng, PIECES + WIDE)
        assert (line.plain, line.cell_len) == (text.plain, text.cell_len)
        width = rng.randint(1, 30)
        for ellipsis in (True, False):
            cut, expected = Line(), text.copy()
            cut.runs = list(line.runs)
            cut.truncate(width, ellipsis=ellipsis)
            expected.truncate(width, overflow="ellipsis" if ellipsis else "crop")
            assert cut.plain == expected.plain
            if not any(cells(t) != len(t) for t, _ in line.runs):  # rich maps styles by character, not cell
                assert _drawn(cut, console, base) == _drawn_text(expected, console, base)


def test_a_line_wraps_where_rich_wraps_it():
    console, base, rng = Console(), Style(color="white", bgcolor="black"), random.Random(2)
    for _ in range(3000):
        line, text = _pair(rng, PIECES)
        text.no_wrap = False
        width = rng.randint(1, 30)
        rows = line.wrap(width) if line.cell_len > width else [line]
        # A no-break space joins a number to its unit ("12 GiB"): never a break, where rich breaks
        # at it. Rich is asked with a letter in its place (as wide, no whitespace).
        nb = "\u00a0"
        asked = text.copy()
        asked.plain = text.plain.replace(nb, "_")  # same length: its styles stay where they were
        expected = fit_lines(asked, width, console)
        assert [r.plain.replace(nb, "_") for r in rows] == [t.plain for t in expected]
        for row, want in zip(rows, expected):
            if nb not in row.plain:
                assert _drawn(row, console, base) == _drawn_text(want, console, base)


def test_a_line_slices_and_converts_like_text():
    console, base, rng = Console(), Style(color="white", bgcolor="black"), random.Random(3)
    for _ in range(2000):
        line, text = _pair(rng, PIECES)
        a = rng.randint(0, len(text.plain))
        b = rng.randint(a, len(text.plain))
        assert line.slice(a, b).plain == text.plain[a:b]
        assert _drawn(line.slice(a, b), console, base) == _drawn_text(text[a:b], console, base)
        back = from_text(line.to_text())
        assert back.plain == line.plain and _drawn(back, console, base) == _drawn(line, console, base)


@pytest.mark.parametrize("hostile", ["\x1b]52;c;aGVsbG8=\x07", "name\x1b[2J", "a\x9bb", "tab\there"])
def test_a_control_character_in_a_line_reaches_the_screen_only_as_visible_text(hostile):
    strip = line_strip(Line("GPU ").append(hostile, "bold"), Console(), Style())
    drawn = "".join(seg.text for seg in strip)
    assert not any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f for c in drawn)
    assert "\\x" in drawn


def test_hanging_rows_fit_their_width_and_lose_only_the_spaces_they_break_at():
    from rich.cells import cell_len

    from traintop.widgets.wrap import hang_rows, hang_wrap

    rng = random.Random(4)
    words = ["GPU\u00a00", "idle", "34\u00a0%", "of", "the", "last", "20\u00a0s", "日本語", "averyveryverylongword",
             "→", "loader", "workers"]
    for _ in range(3000):
        plain = "  " * rng.randint(0, 1) + " ".join(rng.choice(words) for _ in range(rng.randint(1, 14)))
        width, hang = rng.randint(4, 40), rng.choice([0, 2, 4])
        rows = hang_rows(plain, width, hang)
        kept = []
        for a, b, prefix in rows:
            assert cell_len(plain[a:b]) + prefix <= max(width, 2)
            kept.append(plain[a:b])
        assert "".join(kept).replace(" ", "") == plain.replace(" ", "")
        line = Line(plain, "bold")
        assert [r.plain for r in hang_wrap(line, width, hang)] == [t.plain for t in hang_wrap(Text(plain), width, hang)]


def test_word_breaks_measured_by_length_are_rich_s_for_one_cell_text():
    from rich._wrap import divide_line

    from traintop.widgets.line import narrow_breaks

    rng = random.Random(5)
    words = ["a", "bb", "ccc", "loader", "workers", "averyveryverylongword", "·", "12\u00a0%", " ", "  ", "▁▂▃"]
    for _ in range(20000):
        plain = "".join(rng.choice(words) + rng.choice(["", " ", "  "]) for _ in range(rng.randint(0, 15)))
        width = rng.randint(1, 30)
        # a no-break space is no break (rich's would be): rich is asked with a letter in its place
        assert narrow_breaks(plain, width) == divide_line(plain.replace("\u00a0", "_"), width, fold=False)
