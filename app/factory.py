"""The one App factory, shared by the CLI and the tests."""

from __future__ import annotations

from traintop.app.main import TraintopApp
from traintop.feeds import Feed
from traintop.monitor import Monitor


def build_app(monitor: Monitor, feed: Feed, *, mode: str = "live", start_feed: bool = True,
              banner: str | None = None, record_dir: str | None = None, max_fps: float | None = None,
              job=None, grace: float = 10.0) -> TraintopApp:
    """``job``: the traintop.job.Job that `traintop run` started (q then asks whether to stop it)."""
    return TraintopApp(monitor, feed, mode=mode, start_feed=start_feed, banner=banner, record_dir=record_dir,
                       max_fps=max_fps, job=job, grace=grace)
