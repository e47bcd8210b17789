from traintop import sessions
from traintop.feeds import ReplayFeed
from traintop.monitor import Monitor
from traintop.recording import RecordingReader, RecordingWriter
from traintop.collectors.simulated import Simulator


def make_recording(path, n=200, interval=1.0):
    sim = Simulator("healthy", interval=interval, seed=4)
    w = RecordingWriter(path, sim.info(), chunk_frames=64)
    for f in sim.frames(n):
        w.add(f)
    w.close()
    return sim


def test_seek_clamps_and_rebuilds_history(tmp_rec):
    sim = make_recording(tmp_rec)
    mon = Monitor(sim.info())
    feed = ReplayFeed(mon, RecordingReader(tmp_rec))
    feed.seek(sim.t0 + 150)
    assert mon.store.t_last == sim.t0 + 150
    assert len(mon.store) == 151  # everything up to the point (within the warm window)
    feed.seek(sim.t0 - 99)
    assert feed.position == sim.t0 and len(mon.store) == 1
    feed.seek(sim.t0 + 10_000)
    assert feed.position == sim.t0 + 199 and feed.at_end


def test_step_forward_and_back(tmp_rec):
    sim = make_recording(tmp_rec)
    mon = Monitor(sim.info())
    feed = ReplayFeed(mon, RecordingReader(tmp_rec))
    feed.seek(sim.t0 + 20)
    feed.step(1)
    assert mon.store.t_last == sim.t0 + 21 and not feed.playing
    feed.step(-1)
    assert mon.store.t_last == sim.t0 + 20


def test_clock_advances_by_speed(tmp_rec, monkeypatch):
    sim = make_recording(tmp_rec)
    mon = Monitor(sim.info())
    feed = ReplayFeed(mon, RecordingReader(tmp_rec))
    feed.seek(sim.t0)
    now = [100.0]
    monkeypatch.setattr("traintop.feeds.time.monotonic", lambda: now[0])
    feed.speed = 4.0
    feed._tick()
    now[0] += 2.5
    feed._tick()
    assert mon.store.t_last == sim.t0 + 10  # 2.5 s of wall time at 4x
    feed.toggle_pause()
    now[0] += 5
    feed._tick()
    assert mon.store.t_last == sim.t0 + 10


def test_loop_restarts_at_the_end(tmp_rec, monkeypatch):
    sim = make_recording(tmp_rec, n=20)
    mon = Monitor(sim.info())
    feed = ReplayFeed(mon, RecordingReader(tmp_rec), loop=True)
    now = [0.0]
    monkeypatch.setattr("traintop.feeds.time.monotonic", lambda: now[0])
    feed._tick()
    now[0] += 100
    feed._tick()
    assert feed.playing and feed.position == sim.t0


def test_demo_is_embedded_and_real():
    path = sessions.demo_path()
    assert path is not None
    r = RecordingReader(path)
    assert r.info.gpus[0].name == "NVIDIA H200"
    assert r.info.driver.startswith("580.")
    assert set(r.info.extra["phases"]) == {"healthy", "starved", "underused", "leak", "idle"}
    assert r.frame_count > 400


def test_simulate_starts_its_clock_at_launch():
    """`traintop simulate` used to back-fill 2 minutes: 30 s after launch an alert read 'since … (2 min 12 s)'."""
    import time

    from traintop import sessions

    launched = time.time()
    monitor, feed = sessions.simulated_session("starved")
    assert len(monitor.store) == 0
    feed.step()
    assert monitor.store.t_first >= launched - 0.01
