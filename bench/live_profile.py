"""Where a live dashboard's CPU goes, second by second: cProfile of a real run in a pty.

    python bench/live_profile.py [--warmup 10] [--seconds 60] [--size 160x48] [--top N] [--save FILE] \
        -- simulate --gpus 2 --interval 1

Runs ``traintop ARGS`` as a user does, on a pseudo-terminal of the given size whose output is
drained (and counted), with cProfile on the UI thread (from the first frame after
``--warmup`` seconds: start-up is not the steady cost) and on the feed's thread (sampling,
store, rules). After ``--seconds`` more it types ``q`` and reports, per profiled second:
event-loop wakeups (asyncio's ``_run_once``), timer callbacks, messages handled, and the CPU
of each stage (cumulative time of its entry point): ingest (store and rules), view building,
widget text and strips, Textual's compositor, terminal output, layout. Times are each
thread's CPU (``time.thread_time``), so waits count nothing; Textual's input and writer
threads are not profiled. cProfile inflates every figure by a similar factor: read the split,
not the totals; the counts are exact.
"""

from __future__ import annotations

import argparse
import cProfile
import fcntl
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


def child(argv: list[str], out: str, warmup: float, sim_nvml: str | None = None) -> int:
    """Run traintop with a profiler on the UI thread and one on the feed's thread, each enabled
    ``warmup`` seconds after start (start-up, imports and the first layout are not the steady cost)."""
    import threading

    if sim_nvml:  # NVML's stand-in (bench/sim_nvml.py) before traintop imports pynvml
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import sim_nvml as sim

        sim.install(sim_nvml.split())

    from traintop import feeds
    from traintop.app.main import TraintopApp
    from traintop.cli import main

    profs = [cProfile.Profile(time.thread_time)]  # CPU of this thread, not waits
    warm = threading.Event()
    threading.Timer(warmup, warm.set).start()
    feed_profiles: dict = {}

    def wrap_tick(cls) -> None:
        tick = cls.__dict__["_tick"]

        def profiled_tick(self) -> None:
            if warm.is_set() and self not in feed_profiles:
                p = feed_profiles[self] = cProfile.Profile(time.thread_time)
                profs.append(p)
                p.enable()
            tick(self)

        cls._tick = profiled_tick

    for cls in (feeds.SourceFeed, feeds.ReplayFeed):
        wrap_tick(cls)
    frame_ready = TraintopApp.on_frame_ready
    enabled = []

    def on_frame_ready(self, message) -> None:
        if warm.is_set() and not enabled:
            enabled.append(time.monotonic())
            profs[0].enable()
        frame_ready(self, message)

    TraintopApp.on_frame_ready = on_frame_ready
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
        with open(out + ".wall", "w") as fh:  # the seconds profiled: from the first frame after the warm-up
            fh.write(str(time.monotonic() - enabled[0] if enabled else 0.0))
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
    ap.add_argument("--sim-nvml", metavar="OPTIONS", help="run against bench/sim_nvml.py with these options "
                    "(one string: \"--gpus 8 --procs 1 --pids ...\"); no GPU needed")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("args", nargs="*")
    a = ap.parse_args()
    if a.child:
        return child(a.args, a.child, a.warmup, a.sim_nvml)
    cols, rows = (int(x) for x in a.size.lower().split("x"))
    out = a.save or tempfile.mktemp(suffix=".prof")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(cols), LINES=str(rows))
    sim = ["--sim-nvml", a.sim_nvml] if a.sim_nvml else []
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", out, "--warmup", str(a.warmup), *sim,
                             "--", *a.args],
                            stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    nbytes = reads = 0
    tail = b""
    start = time.monotonic()
    quit_at = start + a.warmup + a.seconds
    sent = False
    while proc.poll() is None:
        if not sent and time.monotonic() >= quit_at:
            os.write(master, b"q")
            sent = True
            quit_at = time.monotonic()
        elif sent == 1 and time.monotonic() > quit_at + 1:
            os.write(master, b"s")  # `traintop run` asks whether to stop its job: stop it
            sent = 2
        if sent and time.monotonic() > quit_at + 30:
            proc.kill()
        r, _, _ = select.select([master], [], [], 0.2)
        if r:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            tail = (tail + data)[-4000:]
            if time.monotonic() - start >= a.warmup:
                nbytes += len(data)
                reads += 1
    proc.wait()
    if not os.path.exists(out):
        sys.exit("no profile written; the program's last output:\n" + tail.decode(errors="replace")[-2000:])
    with open(out + ".wall") as fh:
        wall = float(fh.read()) or a.seconds
    os.unlink(out + ".wall")
    stats = pstats.Stats(out)
    total = sum(tt for (_cc, _nc, tt, _ct, _c) in stats.stats.values())
    print(f"traintop {' '.join(a.args)} at {a.size}, {wall:.1f} s under cProfile (UI and feed threads) "
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
