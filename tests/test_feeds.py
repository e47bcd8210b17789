from traintop.watch import sessions
from traintop.watch.feeds import ReplayFeed
from traintop.watch.monitor import Monitor
from traintop.record.recording import RecordingReader, RecordingWriter
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
    assert len(mon.store) == 121  # the 120 s the rules' windows look at (judged once in full, then taken up)
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


def test_a_recording_without_samples_plays_nothing(tmp_rec):
    sim = Simulator("healthy", interval=1.0, seed=4)
    RecordingWriter(tmp_rec, sim.info()).close()
    mon = Monitor(sim.info())
    feed = ReplayFeed(mon, RecordingReader(tmp_rec))
    assert feed.peek() is None
    feed.step(1)
    assert feed.position is None and not mon.store


def test_clock_advances_by_speed(tmp_rec, monkeypatch):
    sim = make_recording(tmp_rec)
    mon = Monitor(sim.info())
    feed = ReplayFeed(mon, RecordingReader(tmp_rec))
    feed.seek(sim.t0)
    now = [100.0]
    monkeypatch.setattr("traintop.watch.feeds.time.monotonic", lambda: now[0])
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
    monkeypatch.setattr("traintop.watch.feeds.time.monotonic", lambda: now[0])
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

    from traintop.watch import sessions

    launched = time.time()
    monitor, feed = sessions.simulated_session("starved")
    assert len(monitor.store) == 0
    feed.step()
    assert monitor.store.t_first >= launched - 0.01


def _record_closed(path, scenario="starved", seconds=60):
    """A recording as `traintop record` makes it: the alerts still up are closed at the last sample."""
    sim = Simulator(scenario, interval=0.5, seed=4)
    mon = Monitor(sim.info(), recorder=RecordingWriter(str(path), sim.info()))
    for f in sim.frames(int(seconds / 0.5)):
        mon.ingest(f)
    mon.close()
    return RecordingReader(str(path))


def _shown(mon):
    return [(a.rule, a.subject, a.start, a.end) for a in mon.engine.alerts]


def test_a_seek_to_the_end_keeps_an_alert_the_session_ended_with(tmp_rec):
    reader = _record_closed(tmp_rec)
    (recorded,) = [a for a in reader.alerts() if a.rule == "starvation"]
    assert recorded.end == reader.t_end  # closed because the recording stopped
    # playing to the end shows it active
    played = Monitor(reader.info)
    ReplayFeed(played, RecordingReader(tmp_rec))._emit_until(reader.t_end)
    assert ("starvation", "gpu0", recorded.start, None) in _shown(played)
    for target in (reader.t_end, reader.t_end - 0.5, reader.t_end + 30):  # End, the last sample, past it
        mon = Monitor(reader.info)
        feed = ReplayFeed(mon, RecordingReader(tmp_rec))
        feed.seek(feed.t_start + 5)
        feed.seek(target)
        assert [(a.rule, a.start) for a in mon.engine.active] == [("starvation", recorded.start)], target


def test_a_seek_shows_an_alert_with_the_start_and_end_playing_gives(tmp_rec):
    # the embedded demo carries no alerts of these rules: a seek must not start them at its window
    path = sessions.demo_path()
    played = Monitor(RecordingReader(path).info)
    full = ReplayFeed(played, RecordingReader(path))
    for frac in (0.5, 0.8, 1.0):
        mon = Monitor(RecordingReader(path).info)
        feed = ReplayFeed(mon, RecordingReader(path))
        feed.seek_fraction(frac)
        full._emit_until(feed.position)
        assert _shown(mon) and _shown(mon) == _shown(played), frac


def test_a_long_recording_without_alerts_is_not_judged_in_full_at_a_seek(tmp_rec, monkeypatch):
    make_recording(tmp_rec, n=200)  # no alerts table of these rules: a seek would judge it in full
    monkeypatch.setattr(ReplayFeed, "JUDGE_ALL_MAX_GPU_SAMPLES", 100)
    reader = RecordingReader(tmp_rec)
    mon = Monitor(reader.info)
    feed = ReplayFeed(mon, reader)
    feed.seek(feed.t_start + 150)
    assert feed._recorded_alerts is None  # too long: the rules re-run over the window before the target
    assert mon.store.t_last == feed.t_start + 150


def test_a_recording_begun_while_findings_were_up_replays_them_from_its_first_sample(tmp_path):
    """`r` pressed with a finding up: analyze reports it from before the recording began, and the
    replay shows it from the first frame (it showed "No problems")."""
    from traintop.reports.analyze import analyze, render_text

    sim = Simulator("starved", interval=0.5, seed=4)
    mon = Monitor(sim.info())
    frames = sim.frames(200)
    for f in frames[:160]:
        mon.ingest(f)
    assert [a.rule for a in mon.engine.active] == ["starvation"]
    path = str(tmp_path / "late.ttrec")
    mon.start_recording(path)
    for f in frames[160:]:
        mon.ingest(f)
    mon.close()
    reader = RecordingReader(path)
    text = render_text(analyze(reader, name="late.ttrec"))
    assert "from before the recording began" in text
    played = Monitor(reader.info)
    ReplayFeed(played, RecordingReader(path))
    assert [a.rule for a in played.engine.active] == ["starvation"]


def test_a_replay_begun_mid_creep_never_says_memory_stopped_rising_while_it_rises(tmp_path):
    """`r` pressed while memory creeps: the replay starts with too little history to fit a rate;
    its evidence keeps the measured rate (it said "no longer rising ... over the last 17 s")."""
    sim = Simulator("memory_creep", interval=0.5, seed=4)
    mon = Monitor(sim.info())
    frames = sim.frames(140)
    for f in frames[:80]:  # 40 s: the finding is up
        mon.ingest(f)
    assert [a.rule for a in mon.engine.active] == ["memory_creep"]
    path = str(tmp_path / "creep.ttrec")
    mon.start_recording(path)
    for f in frames[80:130]:  # 25 s recorded
        mon.ingest(f)
    mon.close()
    played = Monitor(RecordingReader(path).info)
    feed = ReplayFeed(played, RecordingReader(path))
    seen = []
    while feed.peek() is not None:
        played.ingest(feed._take())
        creep = [a for a in played.engine.active if a.rule == "memory_creep"]
        assert creep, "the finding stays up while memory rises"
        seen.append(creep[0].evidence)
    used = [g.mem_used for f in frames[80:130] for g in f.gpus]
    assert used[-1] > used[0]  # the memory rose all along
    assert seen and not [e for e in seen if "no longer rising" in e], seen
    assert "rising" in seen[-1] and "GiB/s" in seen[-1]
