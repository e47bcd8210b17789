"""Text from outside is data: one place that makes it safe to show or print.

GPU, process, host and file names, command lines, labels, strings inside recordings,
nvidia-smi logs, probe messages and Prometheus answers are written by someone else. A
process title can carry OSC 52 (a clipboard write) or a screen clear; a GPU name in a CSV
can carry Textual markup. Everything that traintop did not write passes through ``plain``
(or ``one_line``) before it reaches a terminal, and widgets show the result as a rich
``Text`` (never parsed as markup).

Control characters are made visible, not silently removed, so a user can see that a name
was odd: ESC becomes ``\\x1b``. Kept: newline and tab in ``plain``; nothing in ``one_line``.
"""

from __future__ import annotations

import re

# C0 controls except tab and newline, DEL, C1 controls; Unicode bidirectional overrides
# and isolates (they reorder what follows them on screen); line and paragraph separators.
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
_UNSAFE_ONE_LINE = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
_MARKUP_OPEN = re.compile(r"(\\*)(\[)")


def _visible(match: re.Match) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def plain(value: object, limit: int | None = None) -> str:
    """``value`` as text with every control character made visible (tab and newline kept).

    ``limit`` caps the length (an ellipsis marks the cut) so a megabyte-long name cannot
    fill a screen or a log line.
    """
    text = value if isinstance(value, str) else str(value)
    if limit is not None and len(text) > limit:
        text = text[: max(0, limit - 1)] + "…"
    return _UNSAFE.sub(_visible, text)


def one_line(value: object, limit: int | None = None) -> str:
    """Like ``plain`` but for a single line: newlines and tabs are made visible too."""
    text = value if isinstance(value, str) else str(value)
    if limit is not None and len(text) > limit:
        text = text[: max(0, limit - 1)] + "…"
    return _UNSAFE_ONE_LINE.sub(_visible, text)


def escape_markup(value: str) -> str:
    """Escape Textual/Rich markup in an already-safe string, for the rare API that only
    takes markup (prefer passing a rich ``Text``, which is never parsed)."""
    return _MARKUP_OPEN.sub(lambda m: m.group(1) * 2 + "\\[", value)


def is_clean(value: str, allow_newline: bool = True) -> bool:
    """True when ``value`` holds no character that ``plain``/``one_line`` would replace."""
    return not (_UNSAFE if allow_newline else _UNSAFE_ONE_LINE).search(value)
