"""A day of a simulated 8-GPU job through the dashboard, in compressed time.

The headless app (Textual's test driver) gets every frame of ``--hours`` at 2 Hz through
the same Monitor the live view uses (store, rules every second of sample time, recorder),
and redraws every 300 frames. Prints one JSON line: RSS at the end, peak RSS, frames, and
the recording it wrote (which the benchmark then opens, seeks and analyzes).

``--no-dashboard`` feeds the same frames through the same Monitor (store, rules, recorder)
without the app: the recording is the same (same simulator and seed, same chunking, same
alerts; only the creation time differs), in a fraction of the time. Its RSS figures are
then the core's, not the dashboard's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time

import psutil


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--no-dashboard", action="store_true", help="the recording only (no app: faster)")
    args = ap.parse_args()

    from traintop.collectors.simulated import Simulator
    from traintop.watch.feeds import SourceFeed
    from traintop.watch.monitor import Monitor
    from traintop.record.recording import RecordingWriter
    from traintop.watch.sessions import _store_for

    sim = Simulator("starved,healthy,memory_creep,underused", gpus=args.gpus, interval=0.5, seed=11)
    clock = [0.0]
    writer = RecordingWriter(args.out, sim.info(), clock=lambda: clock[0])
    monitor = Monitor(sim.info(), store=_store_for(0.5), recorder=writer)
    feed = SourceFeed(monitor, sim, 0.5, kind="simulated")
    if not args.no_dashboard:
        from traintop.app.factory import build_app

        app = build_app(monitor, feed, mode="simulated", start_feed=False)
    n = int(args.hours * 7200)
    rss_at_hour = []

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            for k in range(n):
                f = sim.next_frame()
                clock[0] = f.t
                monitor.ingest(f)
                if k % 300 == 0:
                    app.refresh_view()
                    await pilot.pause()
                if k % 7200 == 0:
                    rss_at_hour.append(psutil.Process().memory_info().rss / 2**20)
            app.refresh_view()
            await pilot.pause()
            rss_end.append(psutil.Process().memory_info().rss / 2**20)  # the dashboard still up

    def headless():
        for k in range(n):
            f = sim.next_frame()
            clock[0] = f.t
            monitor.ingest(f)
            if k % 7200 == 0:
                rss_at_hour.append(psutil.Process().memory_info().rss / 2**20)
        rss_end.append(psutil.Process().memory_info().rss / 2**20)

    rss_end: list[float] = []
    t = time.perf_counter()
    headless() if args.no_dashboard else asyncio.run(go())
    elapsed = time.perf_counter() - t
    rss = rss_end[-1]
    max_running = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    monitor.close()
    print(json.dumps({"frames": n, "gpus": args.gpus, "hours": args.hours, "seconds": round(elapsed, 1),
                      "rss_mib": round(rss, 1), "max_rss_mib": round(max_running, 1),
                      "max_rss_incl_close_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                      "rss_by_hour_mib": [round(x, 1) for x in rss_at_hour], "alerts": len(monitor.engine.alerts),
                      "dashboard": not args.no_dashboard}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
