"""The braille memory chart: what it draws is where the values are."""

from traintop.widgets.memory_chart import chart, memory_chart, rss_chart

GIB = 2**30


def _dots(rows):
    """(x, y) of every dot drawn, y from the top, in the plot area (axis labels cut off)."""
    out = set()
    for r, line in enumerate(rows):
        body = line.split("┤", 1)[-1].split("│", 1)[-1]
        for c, ch in enumerate(body):
            bits = ord(ch) - 0x2800 if "\u2800" <= ch <= "\u28ff" else 0
            for dx, column in enumerate(((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))):
                for dy, bit in enumerate(column):
                    if bits & bit:
                        out.add((2 * c + dx, 4 * r + dy))
    return out


def test_a_rise_is_drawn_rising_to_the_right_edge_and_fits_the_room():
    values = [(1 + k / 10) * GIB for k in range(100)]
    lines = rss_chart(values, 40, 12)
    assert len(lines) <= 12 and all(line.cell_len <= 40 for line in lines)
    dots = _dots([line.plain for line in lines[1:-1]])
    width = max(x for x, _ in dots) + 1
    left = [y for x, y in dots if x == 0]
    right = [y for x, y in dots if x == width - 1]
    assert min(right) == min(y for _, y in dots) and max(left) == max(y for _, y in dots)  # newest at the top right
    assert {x for x, _ in dots} == set(range(width))  # a line, no gaps


def test_a_one_sample_spike_survives_thinning():
    values = [2 * GIB] * 1000
    values[503] = 10 * GIB  # not a sample a column starts at
    dots = _dots([line.plain for line in rss_chart(values, 30, 10)[1:-1]])
    top = min(y for _, y in dots)
    assert top <= 2 and max(y for _, y in dots) - top > 20  # the spike near the top, though 1000 samples share 50 columns


def test_the_axis_is_labelled_in_gib_and_a_flat_line_sits_inside_it():
    lines = [line.plain for line in rss_chart([4 * GIB] * 50, 30, 10)]
    labels = [float(line.split("┤")[0]) for line in lines[1:] if "┤" in line]
    assert labels and min(labels) < 4.0 < max(labels) + 0.1
    assert any("\u2800" < ch <= "\u28ff" for line in lines for ch in line)


def test_the_later_series_takes_the_cell_it_shares_and_styles_name_the_colours():
    same = [3 * GIB] * 20
    lines = chart([("a", same, "red"), ("b", same, "green")], 30, 8, ({},))
    styles = {style for line in lines[1:-1] for text, style in line.runs if text.strip(" ")}
    assert "bold green" in styles and "bold red" not in styles
    assert memory_chart([], [], [], 30, 8)[0].plain == "collecting memory figures…"


def test_the_ticks_of_a_small_range_read_differently():
    values = [(0.15 + k / 1000) * GIB for k in range(150)]  # 0.15 to 0.30 GiB
    labels = [line.plain.split("┤")[0].strip() for line in rss_chart(values, 40, 24)[1:] if "┤" in line.plain]
    assert len(labels) >= 5 and len(set(labels)) == len(labels), labels
