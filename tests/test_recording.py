import os
import sqlite3
import stat
import subprocess
import sys
import time

import pytest

from traintop.record.codec import roundtrip
from traintop.collectors.simulated import Simulator
from traintop.errors import RecordingError, TraintopError
from traintop.watch.monitor import Monitor
from traintop.record.recording import SCHEMA_VERSION, RecordingReader, RecordingWriter


def test_round_trip_frames_and_alerts(tmp_rec):
    sim = Simulator("starved,memory_creep", gpus=2, seed=5, interval=0.5)
    frames = sim.frames(400)
    w = RecordingWriter(tmp_rec, sim.info(), chunk_frames=100)
    mon = Monitor(sim.info(), recorder=w)
    for f in frames:
        mon.ingest(f)
    mon.close()
    r = RecordingReader(tmp_rec)
    got = list(r.frames())
    assert got == roundtrip(frames)
    assert r.frame_count == 400
    assert r.info.gpus == sim.info().gpus
    assert r.info.interval == 0.5
    rules = {(a.rule, a.subject) for a in r.alerts()}
    assert ("starvation", "gpu0") in rules and ("memory_creep", "gpu1") in rules
    assert all(a.end is not None for a in r.alerts())  # closed when the session ended


def test_quantisation_is_small(tmp_rec):
    sim = Simulator("healthy", seed=1)
    f = sim.frames(1)[0]
    g, q = f.gpus[0], roundtrip([f])[0].gpus[0]
    assert abs(q.power_w - g.power_w) <= 0.5  # stored to 1 W (cols2)
    assert abs(q.mem_used - g.mem_used) < 1024 * 1024
    assert q.reasons == g.reasons and q.sm_clock == g.sm_clock


def test_seek_reads_only_the_needed_range(tmp_rec):
    sim = Simulator("healthy", seed=2, interval=1.0)
    w = RecordingWriter(tmp_rec, sim.info(), chunk_frames=50)
    for f in sim.frames(500):
        w.add(f)
    w.close()
    r = RecordingReader(tmp_rec)
    t = sim.t0 + 250
    got = list(r.frames(t_from=t, t_to=t + 9))
    assert [f.t for f in got] == [t + k for k in range(10)]


def test_file_is_private_and_never_overwritten(tmp_rec):
    w = RecordingWriter(tmp_rec, Simulator().info())
    w.close()
    assert stat.S_IMODE(os.stat(tmp_rec).st_mode) == 0o600
    with pytest.raises(RecordingError, match="already exists"):
        RecordingWriter(tmp_rec, Simulator().info())


@pytest.mark.parametrize("content,message", [
    (b"", "empty"),
    (b"hello, not a database at all" * 10, "not an SQLite file"),
    (b"SQLite format 3\x00" + b"\x00" * 200, "damaged"),
])
def test_bad_files_get_one_line_errors(tmp_path, content, message):
    p = tmp_path / "bad.ttrec"
    p.write_bytes(content)
    with pytest.raises(RecordingError, match=message):
        RecordingReader(str(p))


def test_other_sqlite_file_is_refused(tmp_path):
    p = str(tmp_path / "other.db")
    db = sqlite3.connect(p)
    db.execute("CREATE TABLE meta(key TEXT, value TEXT)")
    db.commit()
    db.close()
    with pytest.raises(RecordingError, match="not a traintop recording"):
        RecordingReader(p)


def test_newer_version_is_refused(tmp_rec):
    RecordingWriter(tmp_rec, Simulator().info()).close()
    db = sqlite3.connect(tmp_rec)
    db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION + 1),))
    db.commit()
    db.close()
    with pytest.raises(RecordingError, match="newer traintop"):
        RecordingReader(tmp_rec)


def test_damaged_chunk_is_skipped_not_fatal(tmp_rec):
    sim = Simulator("healthy", interval=1.0)
    w = RecordingWriter(tmp_rec, sim.info(), chunk_frames=10)
    for f in sim.frames(30):
        w.add(f)
    w.close()
    db = sqlite3.connect(tmp_rec)
    db.execute("UPDATE chunks SET data=? WHERE id=2", (b"garbage",))
    db.commit()
    db.close()
    r = RecordingReader(tmp_rec)
    assert len(list(r.frames())) == 20
    assert r.skipped_chunks == 1


def test_sigkill_mid_write_loses_at_most_about_a_second(tmp_rec):
    # A real recorder process, killed with SIGKILL while it writes.
    code = (
        "import sys, time\n"
        "from traintop.collectors.simulated import Simulator\n"
        "from traintop.record.recording import RecordingWriter\n"
        "sim = Simulator('healthy', interval=0.05, t0=time.time())\n"
        "w = RecordingWriter(sys.argv[1], sim.info(), flush_every=1.0)\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    f = sim.next_frame()\n"
        "    w.add(f)\n"
        "    time.sleep(max(0, f.t - time.time()))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, tmp_rec], stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"ready"
    time.sleep(3.2)
    killed_at = time.time()
    proc.kill()
    proc.wait()
    r = RecordingReader(tmp_rec)
    frames = list(r.frames())
    assert frames, "nothing survived the kill"
    assert killed_at - frames[-1].t <= 1.5
    ts = [f.t for f in frames]
    assert ts == sorted(ts) and len(ts) >= 30


def test_error_messages_are_one_line_whatever_they_quote():
    from traintop.errors import TraintopError

    e = RecordingError('x.ttrec is damaged (malformed database schema - unrecognized token: "[ a,\n   b )")')
    assert "\n" not in str(e) and "unrecognized token" in str(e)
    assert str(TraintopError("a\n\tb")) == "a b"


def test_recordings_of_the_previous_codec_still_replay():
    import pathlib

    from traintop.record.codec import CODEC
    fix = pathlib.Path(__file__).parent / "fixtures" / "h200" / "training-phases-10hz.ttrec"
    r = RecordingReader(str(fix))
    codecs = {c for (c,) in r._db.execute("SELECT DISTINCT codec FROM chunks")}
    assert codecs == {"cols1+zlib"} and CODEC != "cols1+zlib"
    frames = list(r.frames())
    assert len(frames) > 1000 and r.skipped_chunks == 0
    g = frames[500].gpus[0]
    assert g.power_w is not None and g.power_w != round(g.power_w)  # 0.1 W kept by the old codec


def test_one_recording_route_for_record_option_and_r_key(tmp_path, monkeypatch):
    """--record (the session builder) and the dashboard's r key both go through Monitor.start_recording."""
    from traintop.watch import sessions

    routes = []
    real = Monitor.start_recording
    monkeypatch.setattr(Monitor, "start_recording", lambda self, path, **kw: routes.append(path) or real(self, path, **kw))
    a = str(tmp_path / "a.ttrec")
    monitor, feed = sessions.simulated_session("healthy", realtime=False, history_s=0, record=a)
    feed.prefill(3)
    assert routes == [a] and monitor.recorder.path == a
    with pytest.raises(TraintopError):
        monitor.start_recording(str(tmp_path / "b.ttrec"))  # one file at a time
    rec = monitor.stop_recording()
    feed.prefill(2)  # not written: the recorder is detached at once
    rec.close()
    assert len(list(RecordingReader(a).frames())) == 3
    assert monitor.stop_recording() is None
    monitor.start_recording(str(tmp_path / "c.ttrec"))
    feed.prefill(4)
    monitor.close()
    assert len(list(RecordingReader(str(tmp_path / "c.ttrec")).frames())) == 4


def _chunk(doc: dict) -> bytes:
    import json
    import zlib

    return zlib.compress(json.dumps(doc, separators=(",", ":")).encode())


def test_implausible_values_in_a_chunk_read_as_unknown():
    from traintop.record.codec import decode

    t0 = 1_790_000_000_000
    frames = decode(_chunk({"n": 3, "t": [t0, 500, 500], "c": {
        "g0.util": [50, 10 ** 400, -3], "g0.power_w": [-100, 300, 10 ** 300], "g0.mem_used": ["d", -5, 10, 10],
        "g0.temp_c": [40, 41, 42], "h.cpu_percent": [10, 1000, 20], "h.cores": [[10, 20], [10, 900], None],
        "r0.pid": [7, 7, 7], "r0.input_wait": [500, 5000, None], "r0.rank": [0, -1, 0]}}))
    g = [f.gpus[0] for f in frames]
    assert [x.util for x in g] == [50, None, None]
    assert [x.power_w for x in g] == [None, 300, None]
    assert [x.mem_used for x in g] == [None, 5 * 1024 ** 2, 15 * 1024 ** 2]
    assert [x.temp_c for x in g] == [40, 41, 42]
    assert frames[0].host.cpu_percent == 10 and frames[2].host.cpu_percent == 20
    assert frames[0].host.per_core == (10, 20)
    assert frames[1].host is None  # neither its CPU share nor its cores are plausible
    r = [f.ranks[0] for f in frames]
    assert [x.input_wait for x in r] == [0.5, None, None] and [x.rank for x in r] == [0, None, 0]


@pytest.mark.parametrize("doc", [
    {"n": 1, "t": [10 ** 20], "c": {}},  # a chunk time of 10^20 ms (OSError in the replay bar before)
    {"n": 2, "t": [1_790_000_000_000, -1_790_000_000_001], "c": {}},  # before 1970
    {"n": 1, "t": [1_790_000_000_000], "c": {"g64.util": [1]}},  # GPU 64
    {"n": 1, "t": [1_790_000_000_000], "c": {"g0.util": [1.5]}},  # the writer stores integers
    {"n": 1, "t": [1_790_000_000_000], "c": {"g0.util": ["d", 1, 2]}},  # delta column too long
    {"n": 1, "t": [1_790_000_000_000], "c": {"p.pid": [1], "p.members": [[[1, "x", 1]]]}},
    {"n": 1, "t": [1_790_000_000_000], "c": {"h.cores": [list(range(5000))]}},  # more than 4096 entries
    {"t": [1], "n": 1, "c": {}},  # not the writer's layout
])
def test_chunks_no_writer_makes_are_damage(doc):
    from traintop.record.codec import decode, decode_columns

    with pytest.raises(RecordingError):
        decode(_chunk(doc))
    with pytest.raises(RecordingError):
        decode_columns(_chunk(doc), ["g0.util", "g64.util"])


def test_a_bad_chunk_time_is_skipped_in_the_file(tmp_rec):
    sim = Simulator("healthy", seed=2, interval=1.0)
    w = RecordingWriter(tmp_rec, sim.info(), chunk_frames=10)
    for f in sim.frames(30):
        w.add(f)
    w.close()
    db = sqlite3.connect(tmp_rec)
    first = db.execute("SELECT min(id) FROM chunks").fetchone()[0]
    db.execute("UPDATE chunks SET t1=1e20 WHERE id=?", (first,))
    db.commit()
    db.close()
    r = RecordingReader(tmp_rec)
    assert len(list(r.frames())) == 20 and r.skipped_chunks == 1 and r.t_end < 4e9


def test_the_writer_only_makes_chunks_the_reader_accepts(tmp_rec):
    from traintop.record.codec import MAX_CHUNK_SAMPLES, decode, encode

    frames = Simulator("healthy", seed=2, interval=0.05).frames(MAX_CHUNK_SAMPLES)
    assert len(decode(encode(frames))) == MAX_CHUNK_SAMPLES
    with pytest.raises(ValueError):
        encode(frames + frames[:1])
    with pytest.raises(ValueError):
        RecordingWriter(tmp_rec, Simulator().info(), chunk_frames=MAX_CHUNK_SAMPLES // 2 + 1)


def test_a_process_named_d_is_not_a_delta_coded_column():
    import dataclasses

    from traintop.record.codec import decode, encode
    from traintop.samples import ProcessSample

    frames = [dataclasses.replace(f, process=ProcessSample(pid=7, alive=True, name="d", cmdline="d"))
              for f in Simulator("healthy").frames(5)]
    assert [f.process.name for f in decode(encode(frames))] == ["d"] * 5
