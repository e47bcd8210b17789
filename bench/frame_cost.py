"""What one frame of the dashboard costs, counted rather than timed.

    python bench/frame_cost.py [--frames 60] [--gpus 2] [--interval 1] [--size 160x48 ...]
                               [--profile N] [--json FILE]

Drives the real app headless (Textual's run_test) from a seeded simulator: each frame is one
new sample through the feed's path (ingest, FrameReady, refresh_view) and one compositor
update, whose output is turned into the bytes a terminal would receive. Per frame it reports
what does not depend on the machine's load, so a before/after comparison holds on a busy
machine: widgets refreshed (``refresh()`` calls), widgets repainted (the compositor asked
them for lines), rows asked (the rows of those widgets the compositor walked, cached or
not), lines composed (border, padding and content, by Textual's styles cache or a panel's
own frame), strips built, rich wraps, terminal bytes; and the CPU time (``process_time``) per
frame, which does depend on the load (the median of the frames, less the median cost of the
harness's own pause without a frame). ``--profile N`` prints the
N functions with the most cumulative time over the frames (cProfile).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import platform
import pstats
import statistics
import sys
import time

# (label, file suffix, function name) of the calls counted per frame, read from cProfile.
COUNTED = [
    ("refresh", "textual/widget.py", "refresh"),
    ("repainted", "textual/widget.py", "render_lines"),
    ("repainted", "widgets/lines.py", "render_lines"),  # a panel's own (a full paint counts twice: it calls Textual's)
    ("lines", "textual/_styles_cache.py", "render_line"),
    ("lines", "widgets/lines.py", "compose_line"),  # a changed line in its frame, composed by the panel
    ("strips", "textual/strip.py", "__init__"),
    ("wraps", "rich/text.py", "wrap"),
    ("divide", "rich/text.py", "divide"),
]


def _session(gpus: int, interval: float, scenario: str):
    from traintop.watch import sessions
    from traintop.app.factory import build_app

    monitor, feed = sessions.simulated_session(scenario, gpus=gpus, seed=0, interval=interval, history_s=300,
                                               realtime=False)
    app = build_app(monitor, feed, mode="simulated", start_feed=False)
    feed._notify = app._notify_from_feed  # feed.step() posts FrameReady, as the feed thread does
    return app, feed


def _count_terminal_bytes(app, counter: list[int]) -> None:
    """Headless apps skip turning an update into terminal output; do it, and count the bytes."""
    from textual._compositor import CompositorUpdate

    def display(screen, renderable) -> None:
        if isinstance(renderable, CompositorUpdate):
            counter[0] += len(renderable.render_segments(app.console).encode())

    app._display = display


def _count_rows_asked(counter: list[int]) -> list:
    """Rows the compositor asks widgets for (cached or not): its walk over the screen's widgets.
    Returns what to restore."""
    from textual.widget import Widget

    from traintop.widgets.lines import TextLines

    widget_lines, panel_lines = Widget.render_lines, TextLines.render_lines

    def counted(self, crop):
        if not isinstance(self, TextLines):  # a panel's own path counts once, below
            counter[0] += crop.height
        return widget_lines(self, crop)

    def counted_panel(self, crop):
        counter[0] += crop.height
        return panel_lines(self, crop)

    Widget.render_lines, TextLines.render_lines = counted, counted_panel
    return [(Widget, "render_lines", widget_lines), (TextLines, "render_lines", panel_lines)]


def run(size: tuple[int, int], frames: int, gpus: int = 2, interval: float = 1.0, scenario: str = "starved",
        warmup: int = 5, profile: cProfile.Profile | None = None) -> dict:
    app, feed = _session(gpus, interval, scenario)
    out_bytes = [0]
    _count_terminal_bytes(app, out_bytes)
    rows_asked = [0]
    restore = _count_rows_asked(rows_asked) if profile is not None else []
    times: list[float] = []
    idle: list[float] = []

    async def go() -> None:
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            for _ in range(warmup):
                feed.step()
                await pilot.pause()
            for _ in range(frames if profile is None else 0):  # what the harness costs without a frame
                t = time.process_time()
                await pilot.pause()
                idle.append(time.process_time() - t)
            out_bytes[0] = rows_asked[0] = 0
            if profile is not None:
                profile.enable()
            for _ in range(frames):
                t = time.process_time()
                feed.step()
                await pilot.pause()
                times.append(time.process_time() - t)
            if profile is not None:
                profile.disable()

    try:
        asyncio.run(go())
    finally:
        for owner, name, fn in restore:
            setattr(owner, name, fn)
    harness = statistics.median(idle) if idle else 0.0
    return {"cpu_us_median": (statistics.median(times) - harness) * 1e6,
            "cpu_us_mean": (statistics.fmean(times) - harness) * 1e6, "bytes": out_bytes[0] / frames,
            "rows_asked": rows_asked[0] / frames}


def _counts(stats: pstats.Stats, frames: int) -> dict:
    found = dict.fromkeys((label for label, _, _ in COUNTED), 0)
    for (path, _, fn), (_, ncalls, *_rest) in stats.stats.items():
        for label, suffix, name in COUNTED:
            if fn == name and path.replace(os.sep, "/").endswith(suffix):
                found[label] += ncalls
    return {k: v / frames for k, v in found.items()}


def measure(size: tuple[int, int], frames: int, gpus: int = 2, interval: float = 1.0, scenario: str = "starved",
            top: int = 0) -> dict:
    """Counts from a profiled run, CPU time from a plain one (cProfile inflates it)."""
    prof = cProfile.Profile()
    counted = run(size, frames, gpus, interval, scenario, profile=prof)
    stats = pstats.Stats(prof)
    res = {"size": f"{size[0]}x{size[1]}", "gpus": gpus, "interval": interval, "frames": frames,
           **_counts(stats, frames), "bytes": counted["bytes"], "rows_asked": counted["rows_asked"]}
    timed = run(size, frames, gpus, interval, scenario)
    res["cpu_us_median"] = timed["cpu_us_median"]
    res["cpu_us_mean"] = timed["cpu_us_mean"]
    if top:
        stats.sort_stats("cumulative").print_stats(top)
    return res


def row(r: dict) -> str:
    return (f"{r['size']:>7} {r['gpus']} GPU {r['interval']:g} s  refresh {r['refresh']:5.1f}  repainted "
            f"{r['repainted']:4.1f}  rows asked {r.get('rows_asked', float('nan')):5.1f}  lines {r['lines']:5.1f}  strips {r['strips']:6.1f}  wraps "
            f"{r['wraps'] + r['divide']:4.1f}  {r['bytes']:6.0f} B  {r['cpu_us_median']:7.0f} µs CPU")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--scenario", default="starved")
    ap.add_argument("--size", action="append", help="COLSxROWS (repeatable; default 160x48 and 80x24)")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="print the top N functions (cumulative)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    sizes = [tuple(int(x) for x in s.lower().split("x")) for s in (args.size or ["160x48", "80x24"])]
    rows = [measure(s, args.frames, args.gpus, args.interval, args.scenario, args.profile) for s in sizes]
    print(f"frame cost per frame — {platform.node()} {os.cpu_count()} cores, Python {platform.python_version()} — "
          f"{time.strftime('%Y-%m-%d')}, {args.frames} frames, scenario {args.scenario}")
    for r in rows:
        print(row(r))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"date": time.strftime("%Y-%m-%d"), "machine": platform.node(), "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
