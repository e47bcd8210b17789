"""The one App factory, shared by the CLI and the tests."""

from __future__ import annotations

from traintop.app.main import TraintopApp
from traintop.watch.feeds import Feed
from traintop.watch.monitor import Monitor
from traintop.samples import SessionKind
from traintop.watch.session import Session


def build_app(session: Session | Monitor, feed: Feed | None = None, *, mode: SessionKind | str | None = None,
              start_feed: bool = True, banner: str | None = None, record_dir: str | None = None,
              max_fps: float | None = None, job=None, grace: float = 10.0) -> TraintopApp:
    """The dashboard of ``session`` (or of a monitor and its feed, as tests and benches build
    them; ``mode`` then says which kind of session they make). ``record_dir``: where r records;
    ``job``: the traintop.watch.job.Job that `traintop run` started (q then asks whether to stop it)."""
    if not isinstance(session, Session):
        session = Session(session, feed)
    if mode is not None:
        session.kind = mode
    if record_dir is not None:
        session.record_dir = record_dir
    if job is not None:
        session.job = job
    return TraintopApp(session, start_feed=start_feed, banner=banner, max_fps=max_fps, grace=grace)
