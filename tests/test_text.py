"""The one helper for text from outside: control characters never pass, markup is escapable."""

from rich.markup import render

from traintop.text import escape_markup, is_clean, one_line, plain

HOSTILE = "\x1b]0;PWNED\x1b\\\x1b]52;c;cHduZWQ=\x07\x1b[2J [bold red]x[/] [@click=app.quit]q \u202eevil\u0085\x7f"


def test_plain_makes_every_control_visible_and_keeps_newline_and_tab():
    out = plain(HOSTILE + "\n\tend")
    assert is_clean(out)
    assert "\\x1b]0;PWNED" in out and "\\x07" in out and "\\u202e" in out and "\\x85" in out
    assert out.endswith("\n\tend")


def test_one_line_has_no_newline_or_tab():
    out = one_line("a\nb\tc\rd")
    assert out == "a\\x0ab\\x09c\\x0dd"
    assert is_clean(out, allow_newline=False)


def test_plain_limits_length():
    assert plain("x" * 1000, limit=10) == "x" * 9 + "…"
    assert one_line(12345) == "12345"


def test_escaped_markup_renders_as_the_same_text():
    for s in ("[link=https://evil.example/]click[/link]", "[/]evil", "[H100]", "\\[x]", "a\\", HOSTILE):
        safe = one_line(s)
        assert render(escape_markup(safe)).plain == safe
