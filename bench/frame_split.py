"""Where one frame's CPU goes, without a profiler's distortion: thread CPU time per stage.

    python bench/frame_split.py [160x48]

Drives the app headless from the seeded 2-GPU simulator as bench/frame_cost.py does (one
sample, one redraw, one compositor update a frame) and wraps the stages' entry points with
``time.thread_time``: ingest (store and rules), refresh_view (view model, each panel's text,
signatures and strips), the compositor update (widgets' lines, terminal output) and what is
left (message handling, idle events, asyncio). Indented lines are parts of the line above.
The totals depend on the machine's load; compare runs made back to back.
"""

from __future__ import annotations

import asyncio
import collections
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import frame_cost  # noqa: E402

ACC: dict[str, float] = collections.defaultdict(float)
ORDER: list[str] = []  # labels in the order they are printed (parts under their stage)


def wrap(owner, name: str, label: str) -> None:
    import inspect

    f = getattr(owner, name, None)
    if f is None:  # an older tree without this stage
        return
    if label not in ORDER:
        ORDER.append(label)

    def timed(*a, **k):
        t = time.thread_time()
        try:
            return f(*a, **k)
        finally:
            ACC[label] += time.thread_time() - t

    static = isinstance(inspect.getattr_static(owner, name), staticmethod)
    setattr(owner, name, staticmethod(timed) if static else timed)


def instrument() -> None:
    from textual.screen import Screen

    import traintop.app.main as main
    from traintop.watch.monitor import Monitor
    from traintop.widgets import alerts_panel, gpu_panel, host_panel, lines, process_panel, status_bar

    wrap(Monitor, "ingest", "ingest (store, rules)")
    wrap(main.TraintopApp, "refresh_view", "refresh_view")
    wrap(main, "build_view", "  build_view")
    wrap(status_bar.StatusBar, "show", "  status")
    wrap(gpu_panel.GpuPanel, "show", "  gpu panels")
    wrap(host_panel.HostPanel, "show", "  host")
    wrap(process_panel.ProcessPanel, "show", "  process")
    wrap(alerts_panel.AlertsPanel, "show", "  alerts")
    for panel in (status_bar.StatusBar, gpu_panel.GpuPanel, host_panel.HostPanel, process_panel.ProcessPanel,
                  alerts_panel.AlertsBody):
        wrap(panel, "text_lines", "    panels' text_lines (all panels)")
    wrap(lines.TextLines, "_strip", "    strips (all panels)")
    wrap(Screen, "_on_timer_update", "compositor update")
    wrap(lines.TextLines, "render_lines", "  widgets' render_lines")
    ORDER.append("  terminal output")


def main() -> int:
    size = tuple(int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "160x48").lower().split("x"))
    instrument()
    app, feed = frame_cost._session(2, 1.0, "starved")
    frame_cost._count_terminal_bytes(app, [0])
    wrap(app, "_display", "  terminal output")  # its label is in ORDER already, under the compositor
    frames = 100
    res: dict = {}

    async def go() -> None:
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            for _ in range(5):
                feed.step()
                await pilot.pause()
            ACC.clear()
            t = time.thread_time()
            for _ in range(frames):
                feed.step()
                await pilot.pause()
            res["frames"], res["stages"] = time.thread_time() - t, dict(ACC)
            t = time.thread_time()
            for _ in range(frames):
                await pilot.pause()
            res["harness"] = time.thread_time() - t

    asyncio.run(go())
    total = (res["frames"] - res["harness"]) / frames * 1e6
    print(f"{size[0]}x{size[1]}: {total:.0f} µs a frame (UI thread CPU, less the harness)")
    top = 0.0
    for label in ORDER:
        seconds = res["stages"].get(label, 0.0)
        print(f"  {label:40s} {seconds / frames * 1e6:6.0f} µs")
        top += 0 if label.startswith(" ") else seconds / frames * 1e6
    print(f"  {'the rest (messages, idle, asyncio)':40s} {total - top:6.0f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
