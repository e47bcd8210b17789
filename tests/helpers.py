"""Builders shared by the UI tests: deterministic sessions, no threads unless asked."""

from traintop import sessions
from traintop.app.factory import build_app


def demo_app(offset_s: float, mode: str = "demo", **kw):
    monitor, feed = sessions.replay_session(sessions.demo_path(), kind=mode)
    feed.playing = False
    feed.seek(feed.t_start + offset_s)
    return build_app(monitor, feed, mode=mode, start_feed=False, **kw), monitor, feed


def sim_app(scenario="starved", gpus=1, history_s=120.0, start_feed=False, interval=0.5, **kw):
    monitor, feed = sessions.simulated_session(scenario, gpus=gpus, seed=7, interval=interval,
                                               history_s=history_s, realtime=False)
    return build_app(monitor, feed, mode="simulated", start_feed=start_feed, **kw), monitor, feed
