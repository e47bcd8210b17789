"""Where a live dashboard's CPU goes, second by second: cProfile of a real run in a pty.

    python bench/live_profile.py [--seconds 60] [--size 160x48] [--top 0] [--save FILE] -- simulate --gpus 2 --interval 1

Runs ``traintop ARGS`` as a user does, on a pseudo-terminal of the given size whose output is
drained (and counted), with cProfile on the UI thread and on the feed's thread (sampling,
store, rules), both enabled after ``--warmup`` seconds. After ``--seconds`` more it types ``q`` and reports, per wall second: event-loop
wakeups (asyncio's ``_run_once``), timer callbacks, frames the screen composed, bytes and
writes to the terminal, and the CPU of each stage (cumulative time of its entry point):
ingest (collectors or simulator, store, rules), view building, widget text and strips,
Textual's compositor, terminal output. Times are each thread's CPU time (``time.thread_time``),
so waits count nothing; Textual's input and writer threads are not profiled. cProfile inflates every figure by a similar factor:
read the split, not the totals; the counts are exact.
"""

from __future__ import annotations

import argparse
import cProfile
import fcntl
import marshal
import os
import pstats
import pty
import select
import struct
import subprocess
import sys
import tempfile
import termios
import time

# (label, file suffix, function): the stages, by the cumulative time of their entry points.
STAGES = [
    ("event-loop wakeups", "asyncio/base_events.py", "_run_once"),
    ("timer callbacks", "textual/timer.py", "_tick"),
    ("messages handled", "textual/message_pump.py", "_dispatch_message"),
    ("feed ticks (ingest)", "monitor.py", "ingest"),
    ("  rules", "rules/engine.py", "evaluate"),
    ("refresh_view", "app/main.py", "refresh_view"),
    ("  build_view", "view.py", "build_view"),
    ("  widgets' render/text_lines", "widgets/lines.py", "text_lines"),
    ("widgets' render_line", "widgets/lines.py", "render_line"),
    ("compositor update", "textual/screen.py", "_on_timer_update"),
    ("  render_lines (all widgets)", "textual/widget.py", "render_lines"),
    ("terminal output (render_segments)", "textual/app.py", "_display"),
    ("layout", "textual/screen.py", "_refresh_layout"),
]


def child(argv: list[str], out: str, warmup: float) -> int:
    """Run traintop with a profiler on the UI thread and one on the feed's thread, each enabled
    ``warmup`` seconds after start (start-up, imports and the first layout are not the steady cost)."""
    import threading

    from traintop import feeds
    from traintop.app.main import TraintopApp
    from traintop.cli import main

    start = time.monotonic()
    profs = [cProfile.Profile(time.thread_time)]  # CPU of this thread, not waits
    tick = feeds.Feed._tick

    def profiled_tick(self) -> None:
        p = getattr(self, "_bench_profile", None)
        if p is None and time.monotonic() - start >= warmup:
            p = self._bench_profile = cProfile.Profile(time.thread_time)
            profs.append(p)
            p.enable()
        tick(self)

    feeds.Feed._tick = profiled_tick
    mount = TraintopApp.on_mount

    def on_mount(self) -> None:
        mount(self)
        self.set_timer(max(0.001, warmup - (time.monotonic() - start)), profs[0].enable)

    TraintopApp.on_mount = on_mount
    try:
        rc = main(argv)
    finally:
        profs[0].disable()
        for t in threading.enumerate():
            if t.name.startswith("traintop-"):
                t.join(2)
        for p in profs[1:]:
            p.disable()  # from another thread: its own thread has stopped
        stats = pstats.Stats(profs[0])
        for p in profs[1:]:
            stats.add(p)
        stats.dump_stats(out)
    return rc or 0


def _count(stats: pstats.Stats, suffix: str, name: str) -> tuple[int, float]:
    calls, cum = 0, 0.0
    for (path, _, fn), (_cc, nc, _tt, ct, _callers) in stats.stats.items():
        if fn == name and path.replace(os.sep, "/").endswith(suffix):
            calls += nc
            cum += ct
    return calls, cum


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--size", default="160x48")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds before profiling starts")
    ap.add_argument("--top", type=int, default=0, help="also print the top N functions by internal time")
    ap.add_argument("--save", help="keep the merged profile here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("args", nargs="*")
    a = ap.parse_args()
    if a.child:
        return child(a.args, a.child, a.warmup)
    cols, rows = (int(x) for x in a.size.lower().split("x"))
    out = a.save or tempfile.mktemp(suffix=".prof")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(cols), LINES=str(rows))
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", out, "--", *a.args],
                            stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    nbytes = reads = 0
    start = time.monotonic()
    quit_at = start + a.warmup + a.seconds
    sent = False
    while proc.poll() is None:
        if not sent and time.monotonic() >= quit_at:
            os.write(master, b"q")
            sent = True
            quit_at = time.monotonic()
        if sent and time.monotonic() > quit_at + 30:
            proc.kill()
        r, _, _ = select.select([master], [], [], 0.2)
        if r:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if time.monotonic() - start >= a.warmup:
                nbytes += len(data)
                reads += 1
    proc.wait()
    wall = a.seconds
    stats = pstats.Stats(out)
    total = sum(tt for (_cc, _nc, tt, _ct, _c) in stats.stats.values())
    print(f"traintop {' '.join(a.args)} at {a.size}, {a.seconds:g} s under cProfile (UI and feed threads) "
          f"after {a.warmup:g} s")
    print(f"profiled CPU {total / wall * 1000:.1f} ms per wall second; terminal {nbytes / wall:.0f} B/s in "
          f"{reads / wall:.1f} reads/s")
    print(f"{'stage':34s} {'calls/s':>8s} {'ms/s':>8s}")
    for label, suffix, name in STAGES:
        calls, cum = _count(stats, suffix, name)
        print(f"{label:34s} {calls / wall:8.2f} {cum / wall * 1000:8.2f}")
    if a.top:
        stats.sort_stats("tottime").print_stats(a.top)
    if not a.save:
        os.unlink(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
