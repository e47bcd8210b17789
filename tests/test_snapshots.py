"""SVG snapshots of the main screens, from the embedded demo (a real H200 session).

Update after an intended change: scripts/test tests/test_snapshots.py --snapshot-update
"""


import pytest


# Moments in the demo: the healthy phase (power cap, info only), data starvation, memory creep.
HEALTHY, STARVED, LEAK = 45.0, 110.0, 217.0


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_dashboard(snap_compare, size, demo_app):
    app, _, _ = demo_app(HEALTHY)
    assert snap_compare(app, terminal_size=size)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_starvation_alert(snap_compare, size, demo_app):
    app, _, _ = demo_app(STARVED)
    assert snap_compare(app, terminal_size=size)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_replay_memory_creep(snap_compare, size, demo_app):
    app, _, _ = demo_app(LEAK, mode="replay")
    assert snap_compare(app, terminal_size=size)


def test_help_screen(snap_compare, demo_app):
    app, _, _ = demo_app(HEALTHY)
    assert snap_compare(app, press=["question_mark"], terminal_size=(80, 24))


def attached_app(name, offset):
    import pathlib

    from traintop.watch import sessions
    from traintop.app.factory import build_app

    path = pathlib.Path(__file__).parent / "fixtures" / "h200" / name
    monitor, feed = sessions.replay_session(str(path))
    feed.playing = False
    feed.seek(feed.t_start + offset)
    return build_app(monitor, feed, mode="replay", start_feed=False)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_attached_job_with_probe(snap_compare, size):
    """A real H200 job attached by PID, its probe found: allocated vs reserved, input wait, workers."""
    assert snap_compare(attached_app("attach-starved-probe.ttrec", 30), terminal_size=size)


def test_attached_ddp_two_ranks(snap_compare):
    assert snap_compare(attached_app("ddp-2rank.ttrec", 40), terminal_size=(160, 48))


# Eight ranks' worth of pathologies, one per GPU (repeated for 16): a busy node as issue 15 saw it.
MIX = "healthy,starved,underused,thermal,memory_creep,idle,healthy,healthy"


@pytest.mark.parametrize("gpus", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("size", [(80, 24), (120, 36), (160, 48)], ids=["80x24", "120x36", "160x48"])
def test_every_gpu_on_screen(snap_compare, sim_app, size, gpus):
    """Full panels where they fit, one line per GPU where they do not: every GPU is on screen."""
    app, _, _ = sim_app(MIX, gpus=gpus)
    assert snap_compare(app, terminal_size=size)
