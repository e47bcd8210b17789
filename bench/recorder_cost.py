"""What the headless recorder costs: memory by step, CPU per tick by part, wakeups a second.

    python bench/recorder_cost.py [--gpus 2] [--hours 1] [--seconds 20] [--nvml] [--json OUT]
    python bench/recorder_cost.py --sim-nvml "--gpus 1 --procs 1 --pids job" --seconds 0 --top 25   # no GPU

Part 1, in this process, what `traintop record --interval 1` builds (its parser, its
session), then an hour of ticks in compressed time (the recorder's clock is the samples'
time, so it commits once a sample-second as it does live): VmRSS and tracemalloc after the
imports, after the session is built, after the first 10 samples and after the hour; the
heavy modules the command imported (none should be there); CPU per tick split into
sampling, store, rules, encoding and SQLite, and how many transactions it committed.

Part 2, real time: `traintop record --interval 1` in its own process for ``--seconds``
(after 5 s of warm-up): CPU s per wall s, RSS, threads and wakeups a second (context
switches of all its threads, from /proc), beside `nvidia-smi dmon -d 1` where there is one.

Simulated GPUs by default (deterministic: the same samples every run); ``--nvml`` samples
the real GPUs through NVML (part 1 then times real NVML calls); ``--sim-nvml OPTIONS`` the same
path against bench/sim_nvml.py's stand-in (its options as one string; ``--pids job``: a sleeping
child of the bench on every GPU), the per-process path included. ``--top N`` profiles the rules of part 1
(cProfile, one evaluation a tick) and prints the N functions costing most.
"""

from __future__ import annotations

import argparse
import atexit
import cProfile
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc

from benchio import save_json

HEAVY = ("textual", "rich", "numpy", "zstandard", "prometheus_client", "plotext", "traintop.reports.analyze",
         "traintop.cluster", "traintop.app", "traintop.widgets", "http.server", "email", "ssl", "concurrent.futures.process")


def vmrss_mib(pid: str = "self") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def in_process(args, out: dict) -> None:
    steps = {}
    if args.tracemalloc:
        tracemalloc.start()

    def step(name: str) -> None:
        traced = tracemalloc.get_traced_memory()[0] / 2**20 if tracemalloc.is_tracing() else None
        steps[name] = {"rss_mib": round(vmrss_mib(), 1),
                       "python_mib": None if traced is None else round(traced, 2)}

    step("interpreter")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "r.ttrec")
        from traintop import cli

        argv = ["record", "--interval", "1", path] + ([] if args.nvml else ["--simulate", "starved",
                                                                          "--gpus", str(args.gpus)])
        cli.parse_args(argv)
        from traintop.watch import sessions
        from traintop.record.recording import RecordingWriter

        step("imports of `traintop record`")
        out["heavy_modules_imported"] = sorted({m for m in sys.modules for h in HEAVY
                                                if m == h or m.startswith(h + ".")})
        clock = [0.0]
        if args.nvml or args.sim_nvml:
            from traintop.errors import NoGpuError

            try:
                monitor, feed = sessions.live_session(1.0, require_gpu=True)
            except NoGpuError as e:
                sys.exit(f"--nvml: {e}")
            source = feed.source
        else:
            from traintop.collectors.simulated import Simulator
            from traintop.watch.monitor import Monitor

            source = Simulator("starved", gpus=args.gpus, interval=1.0, seed=1)
            monitor = Monitor(source.info(), store=sessions._store_for(1.0))
        writer = RecordingWriter(path, monitor.info, clock=lambda: clock[0])
        monitor.attach_recorder(writer)
        step("session built")

        import traintop.record.recording as rec

        spent = {"sample": 0.0, "store": 0.0, "rules": 0.0, "encode": 0.0, "write": 0.0}
        encode = rec.encode
        commits = [0]

        def timed_encode(frames):
            t = time.process_time()
            try:
                return encode(frames)
            finally:
                spent["encode"] += time.process_time() - t

        writer._db.set_trace_callback(lambda sql: commits.__setitem__(0, commits[0] + (sql == "COMMIT")))
        n = int(args.hours * 3600)
        prof = cProfile.Profile() if args.top else None
        t_real0 = time.monotonic()
        for k in range(n + 10):
            if k == 10:  # tracing allocations slows Python several times: the timed hour runs without it
                tracemalloc.stop()
                spent = dict.fromkeys(spent, 0.0)
                commits[0] = 0
            t = time.process_time()
            f = source.next_frame()
            if args.nvml or args.sim_nvml:
                import dataclasses

                f = dataclasses.replace(f, t=t_real0 + k)  # compressed time: one sample a second of "time"
            t1 = time.process_time()
            clock[0] = f.t
            with monitor.lock:
                monitor.store.add(f)
                t2 = time.process_time()
                if prof is not None and k >= 10:
                    prof.enable()
                changed = monitor.engine.evaluate(monitor.store, f.t)
                if prof is not None:
                    prof.disable()
            t3 = time.process_time()
            monitor._record(f, changed)
            t4 = time.process_time()
            spent["sample"] += t1 - t
            spent["store"] += t2 - t1
            spent["rules"] += t3 - t2
            spent["write"] += t4 - t3
            if k == 9:
                step("after 10 samples")
                rec.encode = timed_encode
        step(f"after {args.hours:g} h of samples")
        rec.encode = encode
        spent["write"] -= spent["encode"]  # SQLite and the writer's own work
        out["per_tick_us"] = {k: round(v / n * 1e6, 1) for k, v in spent.items()}
        out["per_tick_us"]["total"] = round(sum(spent.values()) / n * 1e6, 1)
        out["ticks"] = n
        out["commits"] = commits[0]
        monitor.close()
        if args.nvml or args.sim_nvml:
            feed.stop()
        if prof is not None:
            import pstats

            print(f"rules, {n} evaluations under cProfile:", file=sys.stderr)
            pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(args.top)
        out["file_kib"] = round(os.path.getsize(path) / 1024, 1)
    out["memory_by_step"] = steps


def _proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def _switches(pid: int) -> tuple[int, int]:
    total, threads = 0, 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        total += int(line.split()[1])
            threads += 1
        except OSError:
            pass
    return total, threads


def watch(cmd: list[str], seconds: float, warmup: float = 5.0) -> dict:
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(warmup)
        if p.poll() is not None:
            return {"error": p.stderr.read().decode(errors="replace")[-300:]}
        c0, (s0, _), t0 = _proc_cpu(p.pid), _switches(p.pid), time.monotonic()
        time.sleep(seconds)
        c1, (s1, threads), t1 = _proc_cpu(p.pid), _switches(p.pid), time.monotonic()
        rss = vmrss_mib(str(p.pid))
    finally:
        p.terminate()
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
    wall = t1 - t0
    return {"cpu_s_per_s": round((c1 - c0) / wall, 4), "rss_mib": round(rss, 1), "threads": threads,
            "wakeups_per_s": round((s1 - s0) / wall, 2)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--hours", type=float, default=1.0, help="compressed-time samples at 1 Hz (part 1)")
    ap.add_argument("--seconds", type=float, default=20.0, help="real-time measurement (part 2); 0: skip")
    ap.add_argument("--nvml", action="store_true", help="the real GPUs through NVML")
    ap.add_argument("--sim-nvml", metavar="OPTIONS", help="the NVML path against bench/sim_nvml.py with these "
                    "options (one string: \"--gpus 1 --procs 1 --pids job\"); no GPU needed")
    ap.add_argument("--top", type=int, default=0, help="profile the rules and print the N costliest functions")
    ap.add_argument("--traintop", default=f"{sys.executable} -m traintop",
                    help="how to start traintop for part 2 (another checkout, to compare)")
    ap.add_argument("--tracemalloc", action="store_true",
                    help="also the Python heap by step (tracing inflates the RSS figures)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.sim_nvml:  # NVML's stand-in before traintop imports pynvml
        import sim_nvml

        job = subprocess.Popen(["sleep", "3600"])  # a process on every simulated GPU ("--pids job")
        atexit.register(job.kill)
        sim_nvml.install(args.sim_nvml.replace("--pids job", f"--pids {job.pid}").split())
        if args.seconds > 0:
            sys.exit("recorder_cost.py: --sim-nvml measures part 1 only (give --seconds 0)")
    out: dict = {"gpus": "nvml" if args.nvml else f"sim_nvml {args.sim_nvml}" if args.sim_nvml
                 else f"{args.gpus} simulated"}
    in_process(args, out)
    if args.seconds > 0:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = args.traintop.split() + ["record", "--interval", "1", "--quiet",
                   os.path.join(tmp, "w.ttrec")]
            if not args.nvml:
                cmd += ["--simulate", "starved", "--gpus", str(args.gpus)]
            out["traintop record --interval 1"] = watch(cmd, args.seconds)
            if shutil.which("nvidia-smi"):
                out["nvidia-smi dmon -d 1"] = watch(["nvidia-smi", "dmon", "-d", "1"], args.seconds)
    print(json.dumps(out, indent=1))
    save_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
