"""The monkey test: every screen survives seeded random keys, clicks and resizes.

The real program runs on a pty (tests/terminal.py): live simulation with 1 and 4 GPUs, the
demo, the replay of a recorded H200 session, the help screen and a live attach to a process
(with no GPU on this machine: the host and the job only), each at 80×24 and 160×48.
Random keys (every bound key, arrows, Tab, Esc, letters, digits, brackets, Enter, space,
control keys), mouse clicks and wheel turns, and resizes down to 20×8 and back must leave it
alive with no traceback, drawing again at its own size, until ``q`` ends it with status 0.

TRAINTOP_MONKEY_KEYS sets the inputs per run (default 250: 3 000 over the 12 runs);
TRAINTOP_MONKEY_SEED picks another seed; TRAINTOP_MONKEY_GPU=1, on a machine with NVIDIA GPUs,
adds the live view of the real GPUs. A failure names the run, its seed and the last
keys sent, so it can be replayed.
"""

from __future__ import annotations

import inspect
import os
import random
import string
import subprocess
import sys
import unicodedata

import pytest


from terminal import KEYS, Terminal, TerminalError  # noqa: E402

from traintop.app import main as app_main  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "h200")
KEYS_PER_RUN = int(os.environ.get("TRAINTOP_MONKEY_KEYS", "250"))
SEED = int(os.environ.get("TRAINTOP_MONKEY_SEED", "20261130"))
SIZES = [(80, 24), (160, 48)]
RESIZES = [(20, 8), (24, 10), (40, 12), (60, 20), (80, 24), (100, 30), (120, 36), (160, 48), (200, 50), (33, 51)]
# Keys that end the program (q, Ctrl-Q) or the terminal's job control (Ctrl-C, Ctrl-Z, Ctrl-\).
NEVER = {"q", "ctrl+q", "ctrl+c", "ctrl+z"}

RUNS = {
    "simulate-1": (["simulate", "--gpus", "1", "--scenario", "starved"], "SIMULATED", False),
    "simulate-4": (["simulate", "--gpus", "4", "--scenario", "starved,healthy,thermal,memory_creep"],
                   "SIMULATED", False),
    "demo": (["demo"], "DEMO", False),
    "replay": (["replay", os.path.join(FIXTURES, "ddp-2rank.ttrec")], "REPLAY", False),
    "help": (["demo"], "DEMO", True),
    "attach": (["--pid", "{job}"], "LIVE", False),  # live, no GPU here: the host and the job only
}
if os.environ.get("TRAINTOP_MONKEY_GPU"):  # on a machine with NVIDIA GPUs: the live view of the real ones
    RUNS["gpu"] = (["--interval", "0.5"], "LIVE", False)
HELP_MARKERS = ("this help", "? close")  # on the help screen (its top line, its border)


def _binding_keys() -> set[str]:
    """Every key bound by the dashboard's own classes (app, screens, widgets)."""
    import traintop.widgets as widgets_pkg

    modules = [app_main]
    for name in sorted(os.listdir(os.path.dirname(widgets_pkg.__file__))):
        if name.endswith(".py") and not name.startswith("_"):
            modules.append(__import__(f"traintop.widgets.{name[:-3]}", fromlist=["_"]))
    keys = set()
    for mod in modules:
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if cls.__module__ != mod.__name__:
                continue
            for b in getattr(cls, "BINDINGS", ()):
                key = b.key if hasattr(b, "key") else b[0]
                keys.update(k.strip() for k in key.split(","))
    return keys


def _key_bytes(name: str) -> str | None:
    if name in KEYS:
        return KEYS[name]
    if len(name) == 1:
        return name
    try:  # Textual names printable keys by their Unicode name: question_mark, full_stop, ...
        return unicodedata.lookup(name.replace("_", " ").upper())
    except KeyError:
        return None


def key_pool() -> list[str]:
    bound = sorted(k for k in _binding_keys() if k not in NEVER)
    unknown = [k for k in bound if _key_bytes(k) is None]
    assert not unknown, f"the monkey cannot type these bound keys: {unknown}"
    pool = [_key_bytes(k) for k in bound] * 3  # bound keys are the interesting ones: more often
    pool += [c for c in string.ascii_letters + string.digits + "[](){}<>,./;:'\"!@#$%^&*-_=+\\|`~?" if c != "q"]
    pool += [v for k, v in KEYS.items() if k not in NEVER]
    return pool


def monkey(term: Terminal, rng: random.Random, n_keys: int, size: tuple[int, int], help_screen: bool,
           history: list) -> None:
    pool = key_pool()
    if help_screen:
        pool = [k for k in pool if k not in ("?", "\x1b")]  # keep the help open most of the time
    cols, rows = size
    # The footer's row holds "q quit". The program may still be drawing at an earlier size
    # (it takes a resize a moment later, or misses one: see Terminal.nudge), so a click
    # never lands on the last row of any size this run has had.
    footer_rows = {rows - 1}
    for i in range(n_keys):
        roll = rng.random()
        if roll < 0.03:
            w, h = rng.choice(RESIZES) if rng.random() < 0.7 else (rng.randint(10, 220), rng.randint(4, 70))
            history.append(f"resize {w}x{h}")
            term.resize(w, h)
            cols, rows = w, h
            footer_rows.add(h - 1)
        elif roll < 0.06:
            x, y = rng.randrange(cols), rng.randrange(rows)
            if y not in footer_rows:
                history.append(f"click {x},{y}")
                term.click(x, y)
        elif roll < 0.08:
            x, y = rng.randrange(cols), rng.randrange(rows)
            history.append(f"wheel {x},{y}")
            term.scroll(x, y, down=rng.random() < 0.5)
        else:
            k = rng.choice(pool)
            history.append(repr(k))
            term.write(k.encode())
        if help_screen and i % 25 == 0 and not any(m in term.text() for m in HELP_MARKERS):
            history.append("'?' (reopen help)")
            term.press("?")
        if i % 8 == 7:
            term.check()
            if rng.random() < 0.15:  # let it draw now and then, as a fast typist does
                term.settle(timeout=30)


@pytest.fixture(scope="module")
def job():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    yield p.pid
    p.kill()
    p.wait()


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("run", list(RUNS))
def test_monkey(run, size, tmp_path, job):
    args, mode_label, help_screen = RUNS[run]
    args = [a.format(job=job) for a in args]
    seed = SEED + 1000 * list(RUNS).index(run) + size[0]
    rng = random.Random(seed)
    history: list[str] = []
    with Terminal(args, *size, home=str(tmp_path)) as term:
        try:
            term.wait_text(mode_label)
            if help_screen:
                term.press("?")
                term.wait_for(lambda s: any(m in s for m in HELP_MARKERS), "the help screen")
            monkey(term, rng, KEYS_PER_RUN, size, help_screen, history)
            term.check()
            # Back at its own size it must still answer: drawn whole at that size (status line on
            # top, footer at the bottom), the help opens and closes, then q quits.
            term.resize(*size)
            term.press("escape")
            term.settle()
            term.press("escape")  # (a second Esc: the first may have closed the help or a focused view)
            term.settle()

            def whole(screen: str) -> bool:
                lines = screen.split("\n")
                return mode_label in lines[0] and "quit" in lines[-1] and not any(m in screen for m in HELP_MARKERS)

            term.wait_for(whole, f"the dashboard drawn at {size[0]}x{size[1]}", nudge_every=2.0)
            term.press("?")
            term.wait_for(lambda s: any(m in s for m in HELP_MARKERS), "the help to open")
            term.press("escape")
            term.wait_for(whole, "the help to close")
            history.append("'q'")
            term.press("q")
            rc = term.wait_exit()
        except TerminalError as e:
            raise TerminalError(f"run {run} at {size[0]}x{size[1]}, seed {seed}; last inputs: "
                                f"{' '.join(history[-40:])}\n{e}") from None
        assert term.traceback() is None, term.traceback()
        assert rc == 0, f"q ended traintop {' '.join(args)} with status {rc}; screen:\n{term.text()}"
