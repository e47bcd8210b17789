"""traintop's benchmarks: one command, a table, and JSON.

    python bench/run.py [--quick] [--json FILE]

Measures, on this machine: the collector's own cost per tick (fake NVML whose calls cost
nothing, so what remains is traintop's overhead; real NVML figures come from
bench/nvml_calls.py on a GPU machine), ingest cost (store + rules), recording size and
write cost, the time to draw one frame of the dashboard, what a frame of a 2-GPU simulation
costs in counted work (bench/frame_cost.py: lines rendered, strips, wraps, terminal bytes);
a day of 8 simulated GPUs at 2 Hz through the headless dashboard in compressed time (RSS
at the end), then opening, seeking and analyzing the recording it wrote; and CPU per wall second of the TUI and the recorder
(bench/cpu_compare.py: beside nvitop, gpustat and nvidia-smi where there is a GPU).
The full run takes about 30 minutes on 2 cores (the day is most of it); --quick is a smoke
test (minutes of samples, no CPU comparison).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))


def per_call_us(fn, n: int, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return best


def bench_tick(n_gpus: int, quick: bool) -> dict:
    from fakes import make_fake_nvml as fake_nvml

    from traintop.collectors.nvml import NvmlCollector

    nv, _ = fake_nvml(n=n_gpus)
    col = NvmlCollector(nv)
    handles = col.handles

    def raw():
        for h in handles:  # the same fast calls, straight to the (free) fake
            nv.nvmlDeviceGetUtilizationRates(h)
            nv.nvmlDeviceGetMemoryInfo(h, nv.nvmlMemory_v2)
            nv.nvmlDeviceGetPowerUsage(h)
            nv.nvmlDeviceGetEnforcedPowerLimit(h)
            nv.nvmlDeviceGetTemperature(h, 0)
            nv.nvmlDeviceGetClockInfo(h, 1)
            nv.nvmlDeviceGetClockInfo(h, 2)
            nv.nvmlDeviceGetCurrentClocksEventReasons(h)
            nv.nvmlDeviceGetComputeRunningProcesses(h)

    n = 300 if quick else 3000
    return {"tick_us": per_call_us(col.sample, n), "raw_calls_us": per_call_us(raw, n)}


def bench_ingest(n_gpus: int, quick: bool) -> dict:
    from traintop.collectors.simulated import Simulator
    from traintop.watch.monitor import Monitor

    sim = Simulator("starved,healthy,memory_creep,underused", gpus=n_gpus, interval=0.5, seed=1)
    frames = sim.frames(600 if quick else 3600)
    mon = Monitor(sim.info())
    t = time.perf_counter()
    for f in frames:
        mon.ingest(f)
    dt = time.perf_counter() - t
    return {"ingest_us_per_frame": dt / len(frames) * 1e6, "frames": len(frames)}


def bench_recording(n_gpus: int, quick: bool) -> dict:
    from traintop.collectors.simulated import Simulator
    from traintop.record.recording import RecordingWriter

    minutes = 10 if quick else 60
    sim = Simulator("starved,healthy,memory_creep,underused", gpus=n_gpus, interval=0.5, seed=2)
    frames = sim.frames(minutes * 120)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "b.ttrec")
        clock = [0.0]
        w = RecordingWriter(path, sim.info(), clock=lambda: clock[0])
        t = time.perf_counter()
        for f in frames:
            clock[0] = f.t  # one flush per second of sample time, as live
            w.add(f)
        w.close()
        write_s = time.perf_counter() - t
        size = os.path.getsize(path)
        csv_bytes = sum(len(f"{f.t:.3f}, {g.index}, {g.util:.0f} %, {g.mem_used // 2**20} MiB, "
                            f"{g.mem_total // 2**20} MiB, {g.power_w:.2f} W, {g.power_limit_w:.2f} W, "
                            f"{g.temp_c:.0f}, {g.sm_clock} MHz, {g.mem_clock} MHz, 0x{g.reasons:x}\n")
                        for f in frames for g in f.gpus)
    gpu_samples = len(frames) * n_gpus
    return {
        "minutes": minutes, "bytes": size, "bytes_per_gpu_sample": size / gpu_samples,
        "csv_bytes_per_gpu_sample": csv_bytes / gpu_samples,
        "write_us_per_tick": write_s / len(frames) * 1e6,
    }


def bench_render(n_gpus: int, size: tuple[int, int], quick: bool) -> dict:
    from traintop.watch import sessions
    from traintop.app.factory import build_app

    monitor, feed = sessions.simulated_session("starved,healthy", gpus=n_gpus, history_s=300, realtime=False)
    app = build_app(monitor, feed, mode="simulated", start_feed=False)
    times = []

    n = 10 if quick else 50
    baseline = []

    async def go():
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            for _ in range(n):  # what Pilot itself costs per pause, to subtract
                t = time.process_time()
                await pilot.pause()
                baseline.append(time.process_time() - t)
            for _ in range(n):
                feed.step()
                t = time.process_time()
                app.refresh_view()
                await pilot.pause()
                times.append(time.process_time() - t)

    asyncio.run(go())
    base = statistics.median(baseline)
    return {"frame_cpu_ms_median": (statistics.median(times) - base) * 1e3,
            "frame_cpu_ms_max": (max(times) - base) * 1e3}


def bench_frame_cost(quick: bool) -> list[dict]:
    import frame_cost

    return [frame_cost.measure(size, 10 if quick else 60) for size in ((160, 48), (80, 24))]


def bench_day(quick: bool) -> dict:
    """A day (quick: 6 minutes) of 8 GPUs at 2 Hz through the headless dashboard, then the file."""
    import subprocess

    import day_file

    hours = 0.1 if quick else 24.0
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "day.ttrec")
        out = subprocess.run([sys.executable, os.path.join(HERE, "day_session.py"), "--out", path,
                              "--hours", str(hours), "--gpus", "8"], capture_output=True, text=True, check=True)
        res = json.loads(out.stdout.strip().splitlines()[-1])
        res.update(day_file.measure(path, 5 if quick else 20))
        res["gpu_samples"] = res["samples"] * res["gpus"]
    return res


def bench_cpu(seconds: float) -> dict:
    import shutil

    import cpu_compare

    preset = "h200" if shutil.which("nvidia-smi") else "sim"
    with tempfile.TemporaryDirectory() as tmp:
        rows = cpu_compare.measure(cpu_compare.presets(preset, tmp), seconds, 8.0)
    return {"preset": preset, "seconds": seconds, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small sizes (the smoke test)")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    q = args.quick
    res = {"machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
           "date": time.strftime("%Y-%m-%d")}
    rows = []
    for n in (1, 8):
        r = bench_tick(n, q)
        res[f"tick_{n}gpu"] = r
        rows.append((f"fast tick, {n} GPU (fake NVML)", f"{r['tick_us']:.1f} µs",
                     f"raw calls {r['raw_calls_us']:.1f} µs; overhead {r['tick_us'] - r['raw_calls_us']:.1f} µs"))
    for n in (1, 8):
        r = bench_ingest(n, q)
        res[f"ingest_{n}gpu"] = r
        rows.append((f"ingest (store + rules), {n} GPU", f"{r['ingest_us_per_frame']:.0f} µs/frame",
                     f"{r['frames']} frames at 2 Hz"))
    r = bench_recording(8, q)
    res["recording_8gpu"] = r
    rows.append(("recording, 8 GPUs at 2 Hz", f"{r['bytes_per_gpu_sample']:.1f} B/GPU-sample",
                 f"nvidia-smi CSV: {r['csv_bytes_per_gpu_sample']:.0f} B; {r['minutes']} min = {r['bytes'] / 1024:.0f} KiB"))
    rows.append(("recording write", f"{r['write_us_per_tick']:.0f} µs/tick", "flush every second"))
    r = bench_day(q)
    res["day_8gpu"] = r
    span = f"{r['hours']:g} h × 8 GPUs at 2 Hz"
    rows.append(("dashboard RSS after a day", f"{r['rss_mib']:.0f} MiB",
                 f"{span} in {r['seconds']:.0f} s; peak while running {r['max_rss_mib']:.0f} MiB; by hour "
                 + " ".join(f"{x:.0f}" for x in r["rss_by_hour_mib"][:: max(1, len(r["rss_by_hour_mib"]) // 6)])))
    rows.append(("that day's recording", f"{r['bytes_per_gpu_sample']:.1f} B/GPU-sample",
                 f"{r['file_mib']:.1f} MiB incl. host, process tree and 8 probed ranks"))
    rows.append(("open / seek it (fresh replay)", f"{r['open_ms']:.0f} / {r['seek_ms_median']:.0f} ms",
                 f"seek max {r['seek_ms_max']:.0f} ms (120 s of history rebuilt, recorded alerts taken up)"))
    rows.append(("analyze it", f"{r['analyze_s']:.2f} s", f"{r['analyze_findings']} findings, {r['gpu_samples']} GPU-samples"))
    r = bench_render(8, (120, 40), q)
    res["render_8gpu_120x40"] = r
    rows.append(("draw one frame, 8 GPUs, 120×40", f"{r['frame_cpu_ms_median']:.1f} ms CPU",
                 f"max {r['frame_cpu_ms_max']:.1f} ms (new sample, view, widgets, compositor)"))
    res["frame_cost_2gpu"] = bench_frame_cost(q)
    for r in res["frame_cost_2gpu"]:
        rows.append((f"frame cost, 2 GPUs at 1 s, {r['size']}", f"{r['cpu_us_median'] / 1000:.1f} ms CPU",
                     f"per frame: {r['refresh']:.1f} refreshed, {r['repainted']:.1f} repainted, {r['lines']:.1f} "
                     f"lines, {r['strips']:.0f} strips, {r['wraps'] + r['divide']:.0f} wraps, {r['bytes']:.0f} B out"))
    if not q:
        r = bench_cpu(30.0)
        res["cpu"] = r
        for row in r["rows"]:
            if "error" in row:
                rows.append((f"CPU: {row['command']}", row["error"], ""))
            else:
                rows.append((f"CPU: {row['command']}", f"{row['cpu_per_wall_s']:.4f} s/s",
                             f"from launch {row['from_launch']:.4f} s/s; RSS {row['rss_mib']:.0f} MiB"))
    print(f"traintop benchmarks — {res['machine']} — {res['date']}")
    w = max(len(a) for a, _, _ in rows)
    for a, b, c in rows:
        print(f"{a:<{w}}  {b:>22}  {c}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
