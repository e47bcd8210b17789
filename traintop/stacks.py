"""Thread stacks from the job's probes, as lines of text (for analyze and the dashboard).

A stack is the job's own text: every line passes through ``one_line``.
"""

from __future__ import annotations

from traintop.samples import StackDump, ThreadStack
from traintop.text import one_line
from traintop.units import fmt_duration

# Threads that only ever wait for work (Python's and PyTorch's helpers): listed by name, their
# stacks left out unless nothing else is there.
_HELPERS = ("QueueFeederThread", "pin_memory", "Thread-", "_pin_memory_loop")


def user_call(thread: ThreadStack) -> str:
    """The innermost call in the job's own code (not torch's, the standard library's or the
    probe's), else the innermost call."""
    calls = innermost(thread, 60)
    for line in reversed(calls):
        if not _library(line.split(" — ")[0]):
            return line
    return calls[-1] if calls else "?"


def innermost(thread: ThreadStack, calls: int = 3) -> list[str]:
    """The last ``calls`` calls of a stack: ``file:line in function`` and its source line."""
    lines = [ln for ln in thread.stack.splitlines() if ln.strip()]
    out: list[tuple[str, str]] = []
    for ln in lines:
        if ln.lstrip().startswith("File "):
            out.append((ln.strip(), ""))
        elif out and not out[-1][1]:
            out[-1] = (out[-1][0], ln.strip())
    shown = out[-calls:]
    # a hang deep inside a library (NCCL, DDP, the DataLoader) shows only library frames: add the
    # innermost frame of the job's own code, which says where in the script it waits
    if shown and all(_library(w) for w, _ in shown):
        own = [f for f in out[:-calls] if not _library(f[0])]
        if own:
            shown = [own[-1], ("…", "")] + shown
    return [one_line(f"{where} — {code}" if code else where, 300) for where, code in shown]


_LIBRARY_PATHS = ("site-packages", "dist-packages", "/lib/python3", "<frozen ", "_traintop_probe")


def _library(where: str) -> bool:
    return any(p in where for p in _LIBRARY_PATHS)


def where(thread: ThreadStack) -> str:
    """The innermost source line of a stack (what the thread is doing), for a one-line summary."""
    calls = [ln.strip() for ln in thread.stack.splitlines() if ln.strip()]
    code = [ln for ln in calls if not ln.startswith("File ")]
    return one_line(code[-1] if code else (calls[-1] if calls else "?"), 160)


# The probe takes the stacks on its own once no optimizer step has come for a while: an evaluation
# or a checkpoint does that too, so the dump does not call the job stalled (the rules judge that).
NO_STEP = "no optimizer step for a while (taken by the probe)"
PAUSE = "in a pause: its next step overdue, not waiting for input (taken by the probe)"


def why_taken(reason: str) -> str:
    return {"stalled": NO_STEP, "pause": PAUSE}.get(reason, "on request")


def headline(dump: StackDump) -> str:
    why = why_taken(dump.reason)
    since = f", {fmt_duration(dump.since_step)} after its last step" if dump.since_step is not None else ""
    who = dump.label if dump.rank is None else f"{dump.label} (PID {dump.pid})"  # never "PID 7 (PID 7)"
    return f"{who}, {why}{since}"


def render(dump: StackDump, calls: int = 3) -> list[str]:
    """A dump as indented lines: the main thread (and any busy thread) with its innermost calls."""
    lines = [headline(dump) + ":"]
    helpers = []
    for th in dump.threads:
        name = one_line(th.name, 60)
        if not th.main and name.startswith(_HELPERS):
            helpers.append(name)
            continue
        lines.append(f"  {name}{' (main)' if th.main else ''}:")
        lines.extend("    " + ln for ln in innermost(th, calls))
    if helpers:
        lines.append(f"  and {len(helpers)} helper thread(s) waiting: {', '.join(sorted(set(helpers)))}")
    return lines


def latest_per_process(dumps: list[StackDump], reason: str | None = None) -> list[StackDump]:
    """The newest dump of each process (of ``reason`` if given), ranks in order."""
    latest: dict[int, StackDump] = {}
    for d in dumps:
        if reason is None or d.reason == reason:
            if d.pid not in latest or d.t >= latest[d.pid].t:
                latest[d.pid] = d
    return sorted(latest.values(), key=lambda d: (d.rank if d.rank is not None else 1 << 30, d.pid))
