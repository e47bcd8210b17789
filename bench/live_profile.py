"""Where a live dashboard's CPU goes, second by second, in a real run in a pty.

    python bench/live_profile.py [--warmup 10] [--seconds 60] [--size 160x48] [--top N] [--save FILE] \
        -- simulate --gpus 2 --interval 1

Runs ``traintop ARGS`` as a user does, on a pseudo-terminal of the given size whose output is
drained (and counted). From the first frame after ``--warmup`` seconds (start-up is not the
steady cost) to ``--seconds`` later, when it types ``q``, it measures what follows. A headless
command (``record``, ``agent``) is measured from ``--warmup`` seconds after start and ended with
SIGINT, as Ctrl-C does:

- the stages, exactly: each stage's entry point (event-loop wakeups, timer callbacks, messages
  handled, feed ticks and their rules, refresh_view and its parts, the compositor, terminal
  output, layout) is wrapped to count its calls and the CPU of its thread inside it
  (``time.thread_time``; the outermost call where one nests in another);
- where the CPU goes, by function: a sampler thread looks at every thread's stack every
  ``--period-ms`` and charges it the CPU that thread used since the last look (each thread's own
  CPU clock), so a waiting thread costs nothing; ``--top N`` prints the N functions with the most
  (own time; cumulative beside it), and the CPU of each thread. A thread found waiting (in
  ``select``, a lock's ``wait``...) is charged at the stack it had at the look before, where it
  did the work; what runs for less than a period between two looks is charged approximately.

No cProfile: since Python 3.12 cProfile is one ``sys.monitoring`` tool for the whole interpreter
(a second profiler raises "Another profiling tool is already active", and the one there sees
every thread's calls on one stack), so per-thread profiles are not possible with it. The
sampler's own cost (about 2 % of a core at 1 ms) is not in the figures: its thread is skipped.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections import defaultdict

# (label, module, attribute path): the stages, by their entry points.
STAGES = [
    ("event-loop wakeups", "asyncio.base_events", "BaseEventLoop._run_once"),
    ("timer callbacks", "textual.timer", "Timer._tick"),
    ("messages handled", "textual.message_pump", "MessagePump._dispatch_message"),
    ("feed ticks (ingest)", "traintop.watch.monitor", "Monitor.ingest"),
    ("  rules", "traintop.rules.engine", "RulesEngine.evaluate"),
    ("probe client (parse, merge)", "traintop.collectors.probe_client", "ProbeClient.sample"),
    ("GPU sample (NVML, its thread)", "traintop.collectors.nvml", "NvmlCollector.sample"),
    ("GPM poll (slow thread)", "traintop.collectors.nvml", "NvmlCollector.poll_gpm"),
    ("slow NVML poll (slow thread)", "traintop.collectors.nvml", "NvmlCollector.poll_slow"),
    ("host sample", "traintop.collectors.host", "HostCollector.sample"),
    ("job's process tree sample", "traintop.collectors.process", "ProcessCollector.sample"),
    ("recording writer (encode, commit)", "traintop.record.recording", "RecordingWriter.flush"),
    ("refresh_view", "traintop.app.main", "TraintopApp.refresh_view"),
    ("  build_view", "traintop.app.main", "build_view"),
    ("  panels' redraw (text_lines, diff)", "traintop.widgets.lines", "TextLines.redraw"),
    ("    process panel's text_lines", "traintop.widgets.process_panel", "ProcessPanel.text_lines"),
    ("widgets' render_line", "traintop.widgets.lines", "TextLines.render_line"),
    ("compositor update", "textual.screen", "Screen._on_timer_update"),
    ("  render_lines (all widgets)", "textual.widget", "Widget.render_lines"),
    ("  render_lines (all widgets)", "traintop.widgets.lines", "TextLines.render_lines"),
    ("terminal output (render_segments)", "textual.app", "App._display"),
    ("layout", "textual.screen", "Screen._refresh_layout"),
]


class Stages:
    """Calls and thread CPU of each stage's entry point, counted only while ``on`` is set."""

    def __init__(self, on: threading.Event) -> None:
        self.on = on
        self.calls: dict[str, int] = defaultdict(int)
        self.cpu: dict[str, float] = defaultdict(float)
        self.depth = threading.local()

    def wrap(self, label: str, module: str, path: str) -> None:
        try:
            owner = importlib.import_module(module)
            *outer, name = path.split(".")
            for part in outer:
                owner = getattr(owner, part)
            fn = getattr(owner, name)
        except (ImportError, AttributeError):
            return  # not in this version of Textual: the row reads 0
        if getattr(fn, "__code__", None) is not None and fn.__code__.co_flags & 0x80:  # a coroutine function
            async def timed(*a, **kw):
                # its CPU is that of the steps it runs (awaits between them cost its thread nothing)
                return await self._timed_await(label, fn(*a, **kw))
        else:
            def timed(*a, **kw):
                return self._timed(label, fn, a, kw)
        setattr(owner, name, timed)

    def _timed(self, label, fn, a, kw):
        if not self.on.is_set():
            return fn(*a, **kw)
        depth = getattr(self.depth, label, 0)
        setattr(self.depth, label, depth + 1)
        t = time.thread_time()
        try:
            return fn(*a, **kw)
        finally:
            setattr(self.depth, label, depth)
            self.calls[label] += 1
            if depth == 0:
                self.cpu[label] += time.thread_time() - t

    async def _timed_await(self, label, coro):
        if not self.on.is_set():
            return await coro
        self.calls[label] += 1
        depth = getattr(self.depth, label, 0)
        spent = 0.0
        try:  # drive the coroutine step by step, timing each step on this thread
            value, thrown = None, None
            while True:
                setattr(self.depth, label, depth + 1)
                t = time.thread_time()
                try:
                    future = coro.send(value) if thrown is None else coro.throw(thrown)
                except StopIteration as done:
                    return done.value
                finally:
                    setattr(self.depth, label, depth)
                    spent += time.thread_time() - t
                try:
                    value, thrown = await _Yield(future), None
                except BaseException as e:  # a cancellation: into the coroutine, as its task would
                    value, thrown = None, e
        finally:
            if depth == 0:
                self.cpu[label] += spent


class _Yield:
    """Await what a driven coroutine yielded (a future) and hand back its result."""

    def __init__(self, future) -> None:
        self.future = future

    def __await__(self):
        return (yield self.future)


WAITS = {"select", "wait", "_wait_for_tstate_lock", "sleep", "get", "accept", "recv"}  # where a thread waits


class Sampler(threading.Thread):
    """Every ``period`` s: each other thread's CPU since the last look, charged to its stack."""

    def __init__(self, period: float) -> None:
        super().__init__(name="live-profile-sampler", daemon=True)
        self.period = period
        self.stop = threading.Event()
        self.own: dict[tuple, float] = defaultdict(float)
        self.cum: dict[tuple, float] = defaultdict(float)
        self.threads: dict[str, float] = defaultdict(float)
        self.samples = 0

    def run(self) -> None:
        last: dict[int, tuple[int, float]] = {}
        names: dict[int, str] = {}
        stacks: dict[int, list[tuple]] = {}  # each thread's stack at the last look
        while not self.stop.wait(self.period):
            frames = sys._current_frames()
            for ident, frame in frames.items():
                if ident == self.ident:
                    continue
                try:
                    clock = last[ident][0] if ident in last else time.pthread_getcpuclockid(ident)
                    cpu = time.clock_gettime(clock)
                except (OSError, OverflowError):
                    continue
                before = last.get(ident, (clock, cpu))[1]
                last[ident] = (clock, cpu)
                stack = []
                f = frame
                while f is not None:
                    code = f.f_code
                    stack.append((code.co_filename, code.co_firstlineno, code.co_name))
                    f = f.f_back
                earlier, stacks[ident] = stacks.get(ident), stack
                spent = cpu - before
                if spent <= 0:
                    continue
                if ident not in names:
                    names[ident] = next((t.name for t in threading.enumerate() if t.ident == ident), str(ident))
                self.threads[names[ident]] += spent
                # A thread found waiting did its work before it began to wait: charge the stack it had then.
                if stack[0][2] in WAITS and earlier and earlier[0][2] not in WAITS:
                    stack = earlier
                self.own[stack[0]] += spent
                for key in set(stack):
                    self.cum[key] += spent
            self.samples += 1


def headless(argv: list[str]) -> bool:
    """A command that draws no dashboard (its options may come before it)."""
    return any(a in ("record", "agent") for a in argv)


def child(argv: list[str], out: str, warmup: float, period: float, sim_nvml: str | None = None) -> int:
    """Run traintop with its stages wrapped and the sampler on, from the first frame ``warmup``
    seconds after start (start-up, imports and the first layout are not the steady cost)."""
    if sim_nvml:  # NVML's stand-in (bench/sim_nvml.py) before traintop imports pynvml
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import sim_nvml as sim

        sim.install(sim_nvml.split())

    from traintop.app.main import TraintopApp
    from traintop.cli import main

    warm, on = threading.Event(), threading.Event()
    threading.Timer(warmup, warm.set).start()
    stages = Stages(on)
    for _label, module, path in STAGES:
        stages.wrap(_label, module, path)
    sampler = Sampler(period)
    frame_ready = TraintopApp.on_frame_ready
    began = []

    def on_frame_ready(self, message) -> None:
        if warm.is_set() and not began:
            began.append(time.monotonic())
            on.set()
            sampler.start()
        frame_ready(self, message)

    TraintopApp.on_frame_ready = on_frame_ready
    if headless(argv):  # no frames: the profile starts on the clock
        def begin() -> None:
            began.append(time.monotonic())
            on.set()
            sampler.start()

        threading.Timer(warmup, begin).start()
    ended = []

    def stop(*_) -> None:  # the parent is about to type q: quitting (a dialog, the job's end) is not steady
        if not ended:
            ended.append(time.monotonic())
            on.clear()
            sampler.stop.set()

    signal.signal(signal.SIGUSR1, stop)
    try:
        rc = main(argv)
    finally:
        stop()
        wall = ended[0] - began[0] if began else 0.0  # from the first frame after the warm-up to the q
        key = lambda k: f"{k[0]}:{k[1]}({k[2]})"  # noqa: E731
        with open(out, "w") as fh:
            json.dump({"wall": wall, "samples": sampler.samples, "period": period,
                       "stages": {k: [stages.calls.get(k, 0), stages.cpu.get(k, 0.0)] for k, _m, _p in STAGES},
                       "threads": dict(sampler.threads),
                       "own": {key(k): v for k, v in sampler.own.items()},
                       "cum": {key(k): v for k, v in sampler.cum.items()}}, fh)
    return rc or 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--size", default="160x48")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds before profiling starts")
    ap.add_argument("--top", type=int, default=0, help="also print the top N functions by internal time")
    ap.add_argument("--save", help="keep the raw figures (JSON) here")
    ap.add_argument("--period-ms", type=float, default=1.0, help="the sampler's period")
    ap.add_argument("--sim-nvml", metavar="OPTIONS", help="run against bench/sim_nvml.py with these options "
                    "(one string: \"--gpus 8 --procs 1 --pids ...\"); no GPU needed")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("args", nargs="*")
    a = ap.parse_args()
    if a.child:
        return child(a.args, a.child, a.warmup, a.period_ms / 1000, a.sim_nvml)
    cols, rows = (int(x) for x in a.size.lower().split("x"))
    out = a.save or tempfile.mktemp(suffix=".json")
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
            os.kill(proc.pid, signal.SIGUSR1)  # the profile ends here
            time.sleep(0.1)
            if headless(a.args):
                os.kill(proc.pid, signal.SIGINT)
            else:
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
    with open(out) as fh:
        got = json.load(fh)
    wall = got["wall"] or a.seconds
    total = sum(got["threads"].values())
    print(f"traintop {' '.join(a.args)} at {a.size}, {wall:.1f} s profiled after {a.warmup:g} s "
          f"({got['samples'] / wall:.0f} looks/s at every thread's stack)")
    print(f"CPU {total / wall * 1000:.1f} ms per wall second (all threads but the sampler); terminal "
          f"{nbytes / wall:.0f} B/s in {reads / wall:.1f} reads/s")
    print(f"{'stage':34s} {'calls/s':>8s} {'ms/s':>8s}")
    for label in dict.fromkeys(label for label, _m, _p in STAGES):
        calls, cpu = got["stages"].get(label, [0, 0.0])
        print(f"{label:34s} {calls / wall:8.2f} {cpu / wall * 1000:8.2f}")
    print("\nthreads (CPU ms/s): " + ", ".join(f"{n} {v / wall * 1000:.2f}" for n, v in
                                            sorted(got["threads"].items(), key=lambda kv: -kv[1])))
    if a.top:
        print(f"\n{'own ms/s':>9s} {'cum ms/s':>9s}  function (sampled)")
        for k, v in sorted(got["own"].items(), key=lambda kv: -kv[1])[: a.top]:
            print(f"{v / wall * 1000:9.3f} {got['cum'].get(k, 0.0) / wall * 1000:9.3f}  {k}")
        print(f"\n{'cum ms/s':>9s}  function (sampled)")
        for k, v in sorted(got["cum"].items(), key=lambda kv: -kv[1])[: a.top]:
            print(f"{v / wall * 1000:9.3f}  {k}")
    if not a.save:
        os.unlink(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
