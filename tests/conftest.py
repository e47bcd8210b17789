import os
import time

import pytest

from fakes import NVMLError, make_fake_nvml, add_hopper_extras

# Snapshots and evidence sentences show clock times: render them in one zone everywhere.
os.environ["TZ"] = "UTC"
time.tzset()


@pytest.fixture
def tmp_rec(tmp_path):
    return str(tmp_path / "session.ttrec")


# -- the dashboard, built without threads: demo replay and the simulator --------------------
def _demo_app(offset_s: float, mode: str = "demo", **kw):
    from traintop import sessions
    from traintop.app.factory import build_app

    monitor, feed = sessions.replay_session(sessions.demo_path(), kind=mode)
    feed.playing = False
    feed.seek(feed.t_start + offset_s)
    return build_app(monitor, feed, mode=mode, start_feed=False, **kw), monitor, feed


def _sim_app(scenario="starved", gpus=1, history_s=120.0, start_feed=False, interval=0.5, **kw):
    from traintop import sessions
    from traintop.app.factory import build_app

    monitor, feed = sessions.simulated_session(scenario, gpus=gpus, seed=7, interval=interval,
                                               history_s=history_s, realtime=False)
    return build_app(monitor, feed, mode="simulated", start_feed=start_feed, **kw), monitor, feed


@pytest.fixture
def demo_app():
    """Build the app on the embedded demo, seeked to an offset: ``demo_app(100)``."""
    return _demo_app


@pytest.fixture
def sim_app():
    """Build the app on a seeded simulator with history: ``sim_app("starved", gpus=2)``."""
    return _sim_app


# -- a fake pynvml, to test the NVML collector's logic without a GPU -------------------------
@pytest.fixture
def fake_nvml():
    """``fake_nvml(n=1, unsupported=(), failing=(), init_error=None)`` -> (pynvml-like module, call counts)."""
    return make_fake_nvml


@pytest.fixture
def nvml_error():
    return NVMLError


@pytest.fixture
def with_hopper_extras():
    """Add GPM, violation counters, ECC, link and event calls to a fake NVML."""
    return add_hopper_extras


def _attached_app(name, offset, **kw):
    import pathlib

    from traintop import sessions
    from traintop.app.factory import build_app

    path = pathlib.Path(__file__).parent / "fixtures" / "h200" / name
    monitor, feed = sessions.replay_session(str(path))
    feed.playing = False
    feed.seek(feed.t_start + offset)
    return build_app(monitor, feed, mode="replay", start_feed=False, **kw), monitor, feed


@pytest.fixture
def attached_app():
    """A real H200 recording of a job attached by PID (its probe found), paused at an offset:
    ``attached_app("attach-starved-probe.ttrec", 30)``."""
    return _attached_app


def _footer_text(app) -> str:
    from textual.widgets._footer import FooterKey, FooterLabel

    keys = [f"{k.key_display} {k.description}".strip() for k in app.screen.query(FooterKey)]
    return " · ".join(keys + [str(lbl.render()) for lbl in app.screen.query(FooterLabel)])


@pytest.fixture
def footer_text():
    """What the footer shows now: ``footer_text(app)``."""
    return _footer_text


def _screen_lines(app) -> list[str]:
    return [line.text for line in app.screen._compositor.render_strips()]


@pytest.fixture
def screen_lines():
    """The screen as it is drawn now, one string a row: ``screen_lines(app)``."""
    return _screen_lines
