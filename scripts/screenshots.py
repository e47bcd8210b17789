"""Generate the SVG screenshots in screenshots/ with Textual's screenshot API.

    python scripts/screenshots.py                      # from the embedded demo (a real H200 session)
    python scripts/screenshots.py --live 40 --pid N --out DIR   # on a machine with a GPU: the live view
    python scripts/screenshots.py --cluster URL [--job ID] --out DIR   # traintop cluster over a Prometheus

The default set is deterministic: the demo recording replayed to fixed moments.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

os.environ.setdefault("TZ", "UTC")

from traintop.watch import sessions  # noqa: E402
from traintop.app.factory import build_app  # noqa: E402
from traintop.widgets.help_screen import HelpScreen  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SHOTS = os.path.join(os.path.dirname(HERE), "screenshots")


def _demo_at(offset_s: float | None, mode: str = "demo"):
    path = sessions.demo_path()
    if path is None:
        raise SystemExit("screenshots: the demo recording is missing")
    monitor, feed = sessions.replay_session(path, kind=mode)
    feed.playing = False
    if offset_s is not None:
        feed.seek(feed.t_start + offset_s)
    return monitor, feed


async def _shot(monitor, feed, mode: str, size, out: str, help_screen: bool = False) -> None:
    app = build_app(monitor, feed, mode=mode, start_feed=False)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        if help_screen:
            app.push_screen(HelpScreen())
            await pilot.pause()
        app.save_screenshot(os.path.basename(out), path=os.path.dirname(out))
    print("wrote", out)


EIGHT_RANKS = "healthy,starved,underused,thermal,memory_creep,idle,healthy,healthy"


def phase_offsets() -> dict[str, float]:
    """Moments in the demo (seconds from its start) where each phase's finding shows."""
    from traintop.record.recording import RecordingReader

    r = RecordingReader(sessions.demo_path())
    mids = {k: float(v) for k, v in r.info.extra.get("phases", {}).items()}
    bounds = r.info.extra.get("phase_bounds", {})
    if "leak" in bounds:  # memory shows its creep near the end of the leak phase
        mids["leak"] = float(bounds["leak"][1]) - 2.0
    return mids


async def default_set(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    at = phase_offsets()
    jobs = [
        ("dashboard-160x48.svg", at.get("healthy", 40), "demo", (160, 48), False),
        ("dashboard-80x24.svg", at.get("healthy", 40), "demo", (80, 24), False),
        ("alert-starvation-160x48.svg", at.get("starved", 100), "demo", (160, 48), False),
        ("alert-starvation-80x24.svg", at.get("starved", 100), "demo", (80, 24), False),
        ("replay-memory-creep-120x40.svg", at.get("leak", 180), "replay", (120, 40), False),
        ("help-80x24.svg", at.get("healthy", 40), "demo", (80, 24), True),
    ]
    for name, offset, mode, size, help_screen in jobs:
        monitor, feed = _demo_at(offset, mode)
        await _shot(monitor, feed, mode, size, os.path.join(out_dir, name), help_screen)
    # Every GPU on screen: the simulator playing eight ranks with one pathology each.
    for name, gpus, size in (("gpus8-80x24.svg", 8, (80, 24)), ("gpus8-160x48.svg", 8, (160, 48)),
                             ("gpus16-120x36.svg", 16, (120, 36))):
        monitor, feed = sessions.simulated_session(EIGHT_RANKS, gpus=gpus, seed=7, realtime=False, history_s=120)
        await _shot(monitor, feed, "simulated", size, os.path.join(out_dir, name))
    # The attached view: real H200 recordings of probed jobs (attach by PID; two-rank DDP).
    fixtures = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "h200")
    for name, rec, offset, size in (("attached-starved-160x48.svg", "attach-starved-probe.ttrec", 30, (160, 48)),
                                    ("attached-starved-80x24.svg", "attach-starved-probe.ttrec", 30, (80, 24)),
                                    ("attached-ddp-160x48.svg", "ddp-2rank.ttrec", 40, (160, 48))):
        monitor, feed = sessions.replay_session(os.path.join(fixtures, rec))
        feed.playing = False
        feed.seek(feed.t_start + offset)
        await _shot(monitor, feed, "replay", size, os.path.join(out_dir, name))
    # Goodput: two gloo ranks on an H200, rank 0 saving alone while rank 1 waits at a barrier
    # (the corpus run): each rank's time ledger, the pause named, gloo's own copies named.
    corpus = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "corpus")
    for name, size in (("goodput-rank0-saves-160x48.svg", (160, 48)), ("goodput-rank0-saves-80x24.svg", (80, 24))):
        monitor, feed = sessions.replay_session(os.path.join(corpus, "gloo_rank0_saves-probe.ttrec"))
        feed.playing = False
        feed.seek(feed.t_start + 52)
        await _shot(monitor, feed, "replay", size, os.path.join(out_dir, name))


async def live_set(seconds: float, pid: int | None, out_dir: str, interval: float) -> None:
    os.makedirs(out_dir, exist_ok=True)
    monitor, feed = sessions.live_session(interval, pid=pid, require_gpu=False)
    app = build_app(monitor, feed, mode="live", start_feed=True)
    async with app.run_test(size=(160, 48)) as pilot:
        await asyncio.sleep(seconds)
        await pilot.pause()
        app.save_screenshot("live-160x48.svg", path=out_dir)
        await pilot.resize_terminal(80, 24)
        await asyncio.sleep(max(1.0, interval * 2))
        await pilot.pause()
        app.save_screenshot("live-80x24.svg", path=out_dir)
    print("wrote live screenshots to", out_dir)


async def cluster_set(url: str, job: str | None, out_dir: str, prefix: str = "cluster") -> None:
    from traintop.app.cluster import ClusterApp
    from traintop.cluster.snapshot import PrometheusSource

    os.makedirs(out_dir, exist_ok=True)
    source = PrometheusSource(url, job, window=120)
    snap = source()
    try:
        for size in ((160, 48), (80, 24)):
            app = ClusterApp(lambda: snap, url=source.prom.shown, job=job, poll=False)
            async with app.run_test(size=size) as pilot:
                app.show_snapshot(snap)
                await pilot.pause()
                name = f"{prefix}-{size[0]}x{size[1]}.svg"
                app.save_screenshot(name, path=out_dir)
                print("wrote", os.path.join(out_dir, name))
    finally:
        source.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=SHOTS)
    ap.add_argument("--live", type=float, metavar="SECONDS", help="screenshot the live view after SECONDS")
    ap.add_argument("--pid", type=int)
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--cluster", metavar="URL", help="screenshot traintop cluster over this Prometheus")
    ap.add_argument("--job")
    ap.add_argument("--prefix", default="cluster")
    args = ap.parse_args()
    if args.cluster:
        asyncio.run(cluster_set(args.cluster, args.job, args.out, args.prefix))
    elif args.live:
        asyncio.run(live_set(args.live, args.pid, args.out, args.interval))
    else:
        asyncio.run(default_set(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
