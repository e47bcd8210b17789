"""What the dashboard's top line says, as plain strings: the session's own line, a message too
long for the line in parts said in turn, a file's name shortened for one line.

Names, drivers and labels come from the driver or a file: each is made one safe line here.
"""

from __future__ import annotations

import os
import re

from traintop.samples import SessionKind
from traintop.text import one_line


# Where the top line is short, the GPUs stay and the other parts come back in this order, each
# where it still fits: the source's label, the host, the driver.
SESSION_KEEP = ("label", "host", "driver")


def session_parts(view, kind: SessionKind) -> list[tuple[str, str]]:
    """(what, text) of the top line's session part, in the order shown: host, GPUs, driver and
    (not live) the source's label, each said once."""
    names: dict[str, int] = {}
    mig = sum(1 for g in view.gpus if g.info.parent is not None)
    for g in view.gpus:
        if g.info.parent is not None:  # a MIG device is part of a GPU counted already
            continue
        name = one_line(g.info.name, 200)
        names[name] = names.get(name, 0) + 1
    gpus = ", ".join(f"{n}× {name}" for name, n in names.items()) or "no GPU"
    if mig:
        gpus += f" ({mig} MIG device{'s' if mig != 1 else ''})"
    bits = [("host", one_line(view.hostname or "", 200)), ("gpus", gpus)]
    if view.driver:
        bits.append(("driver", f"driver {one_line(view.driver, 100)}"))
    if kind != SessionKind.LIVE and view.label:
        bits.append(("label", one_line(view.label, 200)))
    seen: set[str] = set()
    out = []
    for what, text in bits:  # a GPU-less recording's label is "no GPU" too
        if text and text not in seen:
            seen.add(text)
            out.append((what, text))
    return out


def fit_session(parts: list[tuple[str, str]], room: int) -> str:
    """The parts, " · " between them, in at most ``room`` cells: the GPUs, then as many of the
    others as fit (SESSION_KEEP's order), whole and in their places; "" where even the GPUs do
    not fit (never a name cut inside)."""
    def joined(kept: set[str]) -> str:
        return " · ".join(t for what, t in parts if what in kept)

    kept = {"gpus"}
    for what in SESSION_KEEP:
        if len(joined(kept | {what})) <= room:
            kept.add(what)
    line = joined(kept)
    return line if len(line) <= room else ""


def problem_line(view) -> str | None:
    """What fails now (the recording, the source, the --on-finding hook), most urgent first."""
    problem = view.recording_error or view.source_error or view.hook_error
    return one_line(problem, 500) if problem else None


def recording_saved(path: str, room: int) -> list[str]:
    """The message for a recording closed, in parts where one line of ``room`` cells is too short:
    the folder is said next, not cut off."""
    name, folder = os.path.basename(path), os.path.dirname(path)
    saved = f"Recording saved: {name} (in {folder})"
    return [saved] if len(saved) <= room else [f"Recording saved: {name}", f"It is in {folder}"]


def banner_parts(banner: str, room: int) -> list[str]:
    """The banner whole where it fits ``room`` cells, else in parts said in turn: cut at its
    sentences first, then between key hints ("space: pause  ← →: seek"), then after a colon
    outside parentheses ("NVML could not start (...):" / "is the ..."); pieces that fit
    together stay together, so a key is never parted from what it does."""
    if len(banner) <= room:
        return [banner]
    for cut, joint in ((_sentences, " "), (_hints, "  "), (_after_colons, " ")):
        pieces = cut(banner)
        if len(pieces) > 1:
            out: list[str] = []
            for piece in pieces:
                if out and len(out[-1]) + len(joint) + len(piece) <= room:
                    out[-1] = f"{out[-1]}{joint}{piece}"
                else:
                    out.append(piece)
            return [part for piece in out for part in banner_parts(piece, room)]
    return [banner]


def _sentences(text: str) -> list[str]:
    return [p for p in re.split(r"(?<=\.)\s+", text) if p]


def _hints(text: str) -> list[str]:
    return [p for p in re.split(r"\s{2,}", text) if p]


def _after_colons(sentence: str) -> list[str]:
    """The sentence cut after each colon outside parentheses (one inside names a file or an error)."""
    out, depth, start = [], 0, 0
    for k, ch in enumerate(sentence):
        depth += (ch == "(") - (ch == ")")
        if ch == ":" and depth == 0 and sentence[k + 1:k + 2] == " ":
            out.append(sentence[start:k + 1])
            start = k + 2
    return [p for p in out + [sentence[start:]] if p]


def short_path(path: str) -> str:
    """A file name for one status line: the name whole, its directory shortened to where it
    starts and its last folder ("~/…/recordings/NAME"); a narrow pane cuts from the right."""
    home = os.path.expanduser("~")
    if home not in ("", "/") and path.startswith(home + os.sep):
        path = "~" + path[len(home):]
    folder, name = os.path.split(path)
    parts = [p for p in folder.split(os.sep) if p]
    if len(parts) > 2:
        head = "~" if parts[0] == "~" else ("" if folder.startswith(os.sep) else parts[0])
        folder = f"{head}{os.sep}…{os.sep}{parts[-1]}"
    return os.path.join(folder, name) if folder else name
