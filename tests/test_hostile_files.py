"""Hostile files, made here and small, given to the real commands in a subprocess under a memory
limit and a time limit: each must end with one line on stderr, a non-zero exit, no traceback.

The memory limit (RLIMIT_AS, 1.5 GiB of address space) is what proves "bounded memory": before
these fixes the same files took 4 to 16 GB.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import sqlite3
import subprocess
import sys
import zlib

import pytest

from traintop.collectors.simulated import Simulator
from traintop.record.recording import RecordingWriter

MEMORY_LIMIT = 1536 * 1024 * 1024
TIME_LIMIT = 120  # a guard against hangs (the fixed commands take seconds), not a measurement


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_traintop(tmp_path, *args, timeout=TIME_LIMIT):
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "config"), HOME=str(tmp_path), TERM="dumb")
    return subprocess.run([sys.executable, "-m", "traintop", *args], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=_limit_memory, stdin=subprocess.DEVNULL, env=env)


def assert_refused(p, *words):
    """One line on stderr, exit 2, no traceback (and ``words`` in that line)."""
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr[-3000:]
    assert lines[0].startswith("traintop: ")
    assert p.returncode == 2, (p.returncode, p.stderr)
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def recording_with_chunk(path, doc: bytes) -> str:
    """A valid recording whose only chunk holds ``doc`` (compressed, as the writer stores it)."""
    sim = Simulator("healthy", gpus=1, interval=0.5)
    w = RecordingWriter(str(path), sim.info(), chunk_frames=10)
    for f in sim.frames(10):
        w.add(f)
    w.close()
    db = sqlite3.connect(path)
    assert db.execute("SELECT count(*) FROM chunks").fetchone()[0] == 1
    db.execute("UPDATE chunks SET data=?", (zlib.compress(doc, 9),))
    db.commit()
    db.close()
    return str(path)


T0 = 1_790_000_000_000


def _just_under_64_mib(prefix: bytes, item: bytes, suffix: bytes) -> bytes:
    k = (64 * 1024 * 1024 - 64 - len(prefix) - len(suffix)) // len(item)
    return prefix + item * k + suffix


# -- 1. chunks that inflate into gigabytes of objects ---------------------------------------

def huge_n_chunk() -> bytes:
    """``{"n":33554350,"t":[t0,0,0,…],"c":{}}`` just under 64 MiB (issue 14, 9.5 GB before)."""
    body = _just_under_64_mib(b"[%d" % T0, b",0", b"]")
    n = body.count(b",") + 1
    return b'{"n":%d,"t":' % n + body + b',"c":{}}'


def delta_column_chunk() -> bytes:
    """A small n with a delta-coded ``g0.util`` column of millions of entries (15.9 GB before)."""
    col = _just_under_64_mib(b'["d",0', b",1", b"]")
    return b'{"n":3,"t":[%d,500,500],"c":{"g0.util":' % T0 + col + b"}}"


def member_lists_chunk() -> bytes:
    """``{"c":{"p.members":[[[],[],…]]}}``: twenty million empty lists (1.7 GB before)."""
    members = _just_under_64_mib(b"[[[]", b",[]", b"]]")
    return b'{"n":1,"t":[%d],"c":{"p.pid":[1],"p.members":' % T0 + members + b"}}"


@pytest.mark.parametrize("make,why", [(huge_n_chunk, "claims 33554"), (delta_column_chunk, "more than 4000000 values"),
                                      (member_lists_chunk, "a chunk holds more than")])
@pytest.mark.parametrize("command", ["analyze", "replay"])
def test_a_chunk_that_inflates_into_gigabytes_is_refused_in_bounded_memory(tmp_path, make, why, command):
    path = recording_with_chunk(tmp_path / "bomb.ttrec", make())
    assert os.path.getsize(path) < 200_000
    assert_refused(run_traintop(tmp_path, command, path), "none of its 1 chunk(s) could be read", why)


def test_analyze_json_says_how_many_chunks_were_skipped(tmp_path):
    sim = Simulator("healthy", gpus=1, interval=0.5)
    path = str(tmp_path / "half.ttrec")
    w = RecordingWriter(path, sim.info(), chunk_frames=10)
    for f in sim.frames(40):
        w.add(f)
    w.close()
    db = sqlite3.connect(path)
    ids = [r[0] for r in db.execute("SELECT id FROM chunks ORDER BY t0")]
    db.execute("UPDATE chunks SET data=? WHERE id=?", (zlib.compress(huge_n_chunk(), 9), ids[1]))
    db.commit()
    db.close()
    for rerun in ([], ["--rerun"]):
        p = run_traintop(tmp_path, "analyze", path, "--json", *rerun)
        assert p.returncode == 0, p.stderr
        report = json.loads(p.stdout)
        assert report["skipped_chunks"] == 1
        assert report["samples"] == 30
        text = run_traintop(tmp_path, "analyze", path, *rerun).stdout
        assert "1 of 4 chunk(s) could not be read" in text


def test_fail_on_fails_when_every_chunk_is_damaged(tmp_path):
    sim = Simulator("starved", gpus=1, interval=0.5)
    path = str(tmp_path / "all-bad.ttrec")
    w = RecordingWriter(path, sim.info(), chunk_frames=10)
    for f in sim.frames(30):
        w.add(f)
    w.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE chunks SET data=?", (b"not zlib",))
    db.commit()
    db.close()
    for extra in ([], ["--json"], ["--rerun"]):
        line = assert_refused(run_traintop(tmp_path, "analyze", path, "--fail-on", "warning", *extra))
        assert "none of its 3 chunk(s) could be read" in line


# -- 2. SQLite files that are not what they claim --------------------------------------------

RECURSIVE = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) ")


def sqlite_file(path, statements: list[str]) -> str:
    db = sqlite3.connect(path)
    for s in statements:
        db.execute(s)
    db.commit()
    db.close()
    return str(path)


HOSTILE_SCHEMAS = {
    "recursive view as meta": [
        "CREATE VIEW meta(key, value) AS " + RECURSIVE + "SELECT 'k'||x, 'v' FROM c",
        "CREATE TABLE chunks(id INTEGER PRIMARY KEY, t0 REAL, t1 REAL, n INTEGER, codec TEXT, data BLOB)"],
    "recursive view as chunks": [
        "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT)",
        "INSERT INTO meta VALUES ('format', 'traintop-recording'), ('schema_version', '1'), "
        "('session', '{\"kind\": \"live\"}')",
        "CREATE VIEW chunks(id, t0, t1, n, codec, data) AS " + RECURSIVE
        + "SELECT x, x, x, 1, 'cols2+zlib', zeroblob(10) FROM c"],
    "meta without its columns": [
        "CREATE TABLE meta(k TEXT, v TEXT)",
        "CREATE TABLE chunks(id INTEGER PRIMARY KEY, t0 REAL, t1 REAL, n INTEGER, codec TEXT, data BLOB)"],
    "a trigger and a view beside real tables": [
        "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT)",
        "CREATE VIEW chunks AS SELECT 1 AS id, 2 AS t0, 3 AS t1, 4 AS n, 'x' AS codec, x'00' AS data",
        "CREATE TRIGGER t AFTER INSERT ON meta BEGIN DELETE FROM meta; END"],
}


@pytest.mark.parametrize("name", sorted(HOSTILE_SCHEMAS))
@pytest.mark.parametrize("command", ["analyze", "replay"])
def test_views_and_foreign_tables_are_refused(tmp_path, name, command):
    path = sqlite_file(tmp_path / "view.ttrec", HOSTILE_SCHEMAS[name])
    assert os.path.getsize(path) < 16_384
    assert_refused(run_traintop(tmp_path, command, path), "not a traintop recording")


def test_a_virtual_table_is_refused(tmp_path):
    try:
        path = sqlite_file(tmp_path / "fts.ttrec", ["CREATE VIRTUAL TABLE meta USING fts5(key, value)"])
    except sqlite3.OperationalError:
        pytest.skip("no FTS5 in this SQLite")
    assert_refused(run_traintop(tmp_path, "analyze", path), "not a traintop recording")


def test_every_query_has_a_step_budget(tmp_path, monkeypatch):
    """Defence in depth behind the schema check: a query that runs on is interrupted."""
    from traintop.record import recording
    from traintop.errors import RecordingError

    sim = Simulator("healthy", gpus=1, interval=0.5)
    path = str(tmp_path / "ok.ttrec")
    w = RecordingWriter(path, sim.info(), chunk_frames=10)
    for f in sim.frames(10):
        w.add(f)
    w.close()
    monkeypatch.setattr(recording, "QUERY_STEPS", 1)
    monkeypatch.setattr(recording, "_STEP_BATCH", 1)
    with pytest.raises(RecordingError, match="ran past its limit"):
        recording.RecordingReader(path)


# -- 9. things that are not regular files ----------------------------------------------------

def _not_regular(tmp_path, kind):
    import socket

    if kind == "fifo":
        path = str(tmp_path / "pipe.ttrec")
        os.mkfifo(path)
        return path, None
    if kind == "socket":
        path = str(tmp_path / "sock.csv")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(path)
        s.listen(1)
        return path, s
    if kind == "directory":
        return str(tmp_path), None
    return "/dev/zero", None


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "directory", "socket"])
@pytest.mark.parametrize("how", ["analyze", "replay", "--config"])
def test_not_a_regular_file_is_refused_before_reading(tmp_path, kind, how):
    path, keep = _not_regular(tmp_path, kind)
    try:
        if how == "--config":
            args = ["analyze", "--config", path, "nothing.ttrec"]
        else:
            args = [how, path]
        line = assert_refused(run_traintop(tmp_path, *args, timeout=60))
        assert "not a" in line or "is a" in line, line
    finally:
        if keep is not None:
            keep.close()


# -- 7. a config file that breaks every command must not break doctor --------------------------

def test_doctor_reports_a_bad_config_as_one_of_its_lines(tmp_path):
    bad = tmp_path / "config" / "traintop" / "config.toml"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"[thresholds]\nunderuse_power_frac = 0.2 \xff\n")
    assert_refused(run_traintop(tmp_path, "analyze", "x.ttrec"), "not UTF-8")
    p = run_traintop(tmp_path, "doctor", "--python", "/nonexistent/python", timeout=300)
    assert "Traceback" not in p.stderr + p.stdout
    assert p.returncode == 1
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("FAIL  config:")]
    assert len(lines) == 1 and "not UTF-8" in lines[0]


# -- 6. nvidia-smi logs that are too large, or whose numbers are not numbers -----------------

HEADER = ("timestamp, index, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB], power.draw [W], "
          "power.limit [W]\n")


def smi_line(t: str, idx, util="50 %", used="1000 MiB", power="300.00 W") -> str:
    return f"{t}, {idx}, NVIDIA H200, {util}, {used}, 143771 MiB, {power}, 700.00 W\n"


def healthy_lines(n=120, gpus=2):
    import datetime as dt

    start = dt.datetime(2026, 11, 29, 20, 0, 0)
    return [smi_line((start + dt.timedelta(seconds=k)).strftime("%Y/%m/%d %H:%M:%S.000"), g)
            for k in range(n) for g in range(gpus)]


def test_a_log_larger_than_the_limit_is_refused_at_once(tmp_path):
    path = tmp_path / "huge.csv"
    with open(path, "wb") as fh:
        fh.write(HEADER.encode() + "".join(healthy_lines(10)).encode())
        fh.truncate(600 * 1024 * 1024)  # sparse: costs no disk
    assert_refused(run_traintop(tmp_path, "analyze", str(path)), "larger than 512 MiB")


def test_a_small_gz_that_expands_past_the_limit_is_refused(tmp_path):
    path = tmp_path / "bomb.csv.gz"
    block = "".join(healthy_lines(100)).encode()
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
    with open(path, "wb") as fh:
        fh.write(comp.compress(HEADER.encode()))
        for _ in range(520 * 1024 * 1024 // len(block) + 1):
            fh.write(comp.compress(block))
        fh.write(comp.flush())
    assert os.path.getsize(path) < 8_000_000
    assert_refused(run_traintop(tmp_path, "analyze", str(path)), "expands to more than 512 MiB")


def test_ten_thousand_gpus_are_refused_in_bounded_memory(tmp_path):
    path = tmp_path / "many.csv"
    with open(path, "w") as fh:
        fh.write(HEADER)
        for k in range(10):
            fh.write("".join(smi_line(f"2026/11/29 20:00:{k:02d}.000", g) for g in range(10_000)))
    assert_refused(run_traintop(tmp_path, "analyze", str(path)), "GPU index '64' outside 0-63")


def test_dmon_with_ten_thousand_gpus_is_refused(tmp_path):
    path = tmp_path / "many.dmon"
    with open(path, "w") as fh:
        fh.write("# gpu pwr gtemp sm mem\n# Idx W C % %\n")
        for _ in range(5):
            fh.write("".join(f" {g} 300 50 90 40\n" for g in range(10_000)))
    assert_refused(run_traintop(tmp_path, "analyze", str(path)), "outside 0-63")


def test_implausible_values_in_a_log_are_dropped_not_summed(tmp_path):
    """Negative power and memory, 400-digit numbers: the value reads as unknown. "inf %" (not a
    number nvidia-smi writes), a timestamp with e400, years 0001 and 9999, GPU index -10^300: the
    line is skipped and counted."""
    lines = healthy_lines(120, gpus=1)
    lines[5] = smi_line("2026/11/29 20:00:05.000", 0, util="inf %")
    lines[6] = smi_line("2026/11/29 20:00:06.000", 0, power="-300.00 W", used="-5 MiB")
    lines[7] = smi_line("2026/11/29 20:00:07.000", 0, util="9" * 400 + " %", power="1" + "0" * 400 + " W")
    bad = [smi_line("2026/11/29 20:00:08.5e400", 0), smi_line("0001/01/01 00:00:00.000", 0),
           smi_line("9999/12/31 23:59:59.000", 0), smi_line("2026/11/29 20:00:09.000", "-1" + "0" * 300)]
    path = tmp_path / "odd.csv"
    path.write_text(HEADER + "".join(lines + bad))
    p = run_traintop(tmp_path, "analyze", str(path), "--json")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    r = json.loads(p.stdout)
    (g,) = r["gpus"]
    assert g["util_peak"] == 50 and g["power_peak"] == 300 and g["mem_peak_gib"] < 1
    assert r["duration_s"] == 119 and r["gpu_hours"] < 0.04
    assert r["skipped_lines"] == 5
    dmon = tmp_path / "odd.dmon"
    dmon.write_text("#Date Time gpu pwr gtemp sm mem fb\n"
                    + "".join(f" 20261129 20:00:{k:02d} 0 300 50 90 40 1000\n" for k in range(50))
                    + " 20261129 20:00:50 0 " + "9" * 400 + " 50 90 40 1000\n"
                    + " 00010101 00:00:00 0 300 50 90 40 1000\n")
    p = run_traintop(tmp_path, "analyze", str(dmon), "--json")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    r = json.loads(p.stdout)
    assert r["gpus"][0]["power_peak"] == 300 and r["skipped_lines"] == 1 and r["duration_s"] == 50


# -- 8. probe messages that are not what a probe sends ----------------------------------------

class _FakeProcess:
    """The attached process, always alive: only the probe channel is under test here."""

    def __init__(self, pid):
        self.pid = pid

    def sample(self):
        from traintop.samples import ProcessSample

        return ProcessSample(pid=self.pid, alive=True)

    def channel_pids(self):
        return {self.pid}


def _probe_server(tmp_path, monkeypatch, pid):
    import socket

    d = tmp_path / "probes"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("TRAINTOP_PROBE_DIR", str(d))
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(d / f"probe-{pid}.sock"))
    srv.listen(1)
    return srv


GOOD = {"v": 1, "pid": 4321, "rank": 0, "world_size": 1, "cuda": True, "window": 0.33, "steps": 10,
        "step_times": [0.1, 0.1], "input_wait": 0.05,
        "memory": [{"device": 0, "allocated": 1 << 30, "reserved": 2 << 30, "peak": 1 << 30}]}
BAD = [b'{"v":1,"rank":Infinity}', b'{"v":1,"memory":[{"reserved":"x"}]}', b'{"v":1,"steps":NaN}',
       b'{"v":1,"rank":-5}', b'{"v":1,"step_times":[1e400]}', b'{"v":1,"memory":[{"device":0,"reserved":-1}]}',
       b'{"v":1,"world_size":' + b"9" * 400 + b"}", b"[" * 5000 + b"]" * 5000, b'{"v":true}']


def test_a_bad_probe_message_is_dropped_and_sampling_goes_on(tmp_path, monkeypatch):
    import time

    from traintop.collectors.probe_client import ProbeClient
    from traintop.sources.live import LiveSampler

    srv = _probe_server(tmp_path, monkeypatch, 4321)
    client = ProbeClient()
    sampler = LiveSampler(process=_FakeProcess(4321), probes=client)
    sampler.next_frame()
    conn, _ = srv.accept()
    frames = []
    for k, bad in enumerate(BAD):
        conn.sendall(bad + b"\n" + json.dumps(dict(GOOD, steps=k)).encode() + b"\n")
        time.sleep(0.05)
        frames.append(sampler.next_frame())
    assert client.bad_messages == len(BAD)
    assert [f.ranks[0].steps for f in frames] == list(range(len(BAD)))
    assert all(f.ranks[0].rank == 0 and f.ranks[0].reserved == 2 << 30 for f in frames)
    conn.close()
    srv.close()
    sampler.close()


def test_the_count_of_dropped_probe_messages_reaches_the_recording_and_analyze(tmp_path):
    from traintop.reports.analyze import analyze
    from traintop.watch.monitor import Monitor
    from traintop.record.recording import RecordingReader
    from traintop.watch.sessions import _note_probe_errors

    sim = Simulator("healthy", gpus=1, interval=0.5)
    path = str(tmp_path / "probe.ttrec")
    monitor = Monitor(sim.info(), recorder=RecordingWriter(path, sim.info()))
    for f in sim.frames(20):
        monitor.ingest(f)

    class Probes:
        bad_messages = 3

    _note_probe_errors(monitor, Probes())
    monitor.close()
    r = RecordingReader(path)
    assert r.meta["probe_bad_messages"] == "3"
    assert any("3 malformed message(s)" in n for n in analyze(r).notes)


def test_record_keeps_sampling_through_bad_probe_messages(tmp_path):
    """The real `traintop record --pid` against a probe that sends bad lines among good ones:
    every tick is recorded (before: 4 samples of ~12), the ranks keep coming, the count is kept."""
    import socket
    import threading
    import time

    job = subprocess.Popen(["sleep", "60"])
    d = tmp_path / "probes"
    d.mkdir(mode=0o700)
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(d / f"probe-{job.pid}.sock"))
    srv.listen(2)
    srv.settimeout(20)
    stop = threading.Event()

    def serve():
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        k = 0
        while not stop.is_set():
            try:
                conn.sendall(BAD[k % len(BAD)] + b"\n" + json.dumps(dict(GOOD, pid=job.pid, steps=k)).encode() + b"\n")
            except OSError:
                return
            k += 1
            time.sleep(0.1)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    out = tmp_path / "probe.ttrec"
    try:
        env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "config"), TRAINTOP_PROBE_DIR=str(d))
        p = subprocess.run([sys.executable, "-m", "traintop", "record", str(out), "--pid", str(job.pid),
                            "--duration", "3", "--interval", "0.25", "--quiet"], capture_output=True, text=True,
                           timeout=TIME_LIMIT, preexec_fn=_limit_memory, stdin=subprocess.DEVNULL, env=env)
    finally:
        stop.set()
        srv.close()
        job.kill()
        job.wait()
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    from traintop.record.recording import RecordingReader

    r = RecordingReader(str(out))
    frames = list(r.frames())
    assert len(frames) >= 10  # 3 s at 4 Hz
    with_ranks = [f for f in frames if f.ranks]
    assert len(with_ranks) >= len(frames) - 3  # the first ticks may come before the first message
    steps = [f.ranks[0].steps for f in with_ranks]
    assert steps == sorted(steps) and steps[-1] > steps[0]
    assert int(r.meta["probe_bad_messages"]) >= 10


@pytest.mark.parametrize("where", ["session", "rules", "remedies"])
def test_deeply_nested_metadata_is_one_line_or_ignored(tmp_path, where):
    sim = Simulator("starved", gpus=1, interval=0.5)
    path = str(tmp_path / "deep.ttrec")
    from traintop.watch.monitor import Monitor

    monitor = Monitor(sim.info(), recorder=RecordingWriter(path, sim.info(), chunk_frames=100))
    for f in sim.frames(120):
        monitor.ingest(f)
    monitor.close()
    deep = "[" * 200_000 + "]" * 200_000
    db = sqlite3.connect(path)
    if where == "remedies":
        assert db.execute("UPDATE alerts SET remedies=?", (deep,)).rowcount >= 1
    else:
        db.execute("UPDATE meta SET value=? WHERE key=?", (deep, where))
    db.commit()
    db.close()
    p = run_traintop(tmp_path, "analyze", path)
    if where == "session":
        assert_refused(p, "damaged session metadata")
    elif where == "rules":  # the rules' record cannot be read: they run again
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
        assert "Data starvation" in p.stdout and "--rerun re-runs them" not in p.stdout
    else:  # the damaged alert is left out; the rules find it again when re-run
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
        assert "Data starvation" in run_traintop(tmp_path, "analyze", path, "--rerun").stdout


@pytest.mark.parametrize("name", ["run#1.ttrec", "run?mode=rwc.ttrec", "run%231.ttrec"])
def test_a_recording_whose_name_holds_uri_characters_is_read_as_named(tmp_path, name):
    sim = Simulator("healthy", gpus=1, interval=0.5)
    path = tmp_path / name
    w = RecordingWriter(str(path), sim.info(), chunk_frames=10)
    for f in sim.frames(20):
        w.add(f)
    w.close()
    before = sorted(os.listdir(tmp_path))
    p = run_traintop(tmp_path, "analyze", str(path), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["samples"] == 20
    assert sorted(os.listdir(tmp_path)) == before  # nothing created beside it (SQLite once made "run")


def test_a_fifo_named_like_a_uri_is_refused_before_reading(tmp_path):
    os.mkfifo(tmp_path / "pipe#x")
    (tmp_path / "pipe").write_bytes(b"SQLite format 3\x00")  # what an unquoted URI would open instead
    p = run_traintop(tmp_path, "analyze", str(tmp_path / "pipe#x"), timeout=30)
    assert_refused(p)


def test_a_forged_explained_by_in_a_recording_is_one_short_plain_line(tmp_path):
    """explained_by is the file's word: control characters (OSC 52, a clipboard write) are shown, never
    sent, and its length is cut where the file is read (so for the dashboard and analyze alike)."""
    from traintop.record.recording import RecordingReader
    from traintop.findings import Finding, Severity
    from traintop.widgets.alerts_panel import alert_paragraphs

    sim = Simulator("healthy", interval=0.5, seed=2)
    path = str(tmp_path / "forged.ttrec")
    w = RecordingWriter(path, sim.info())
    frames = sim.frames(40)
    for f in frames:
        w.add(f)
    forged = "stall\x1b]52;c;ZXZpbA==\x07 gpu0" + "x" * 5000
    w.alert(Finding("idle_gpu", "GPU idle", "gpu0", Severity.WARNING, frames[5].t, frames[20].t, "idle", ("look",),
                    id=1, explained_by=forged))
    w.close()
    (a,) = RecordingReader(path).alerts()
    assert "\x1b" not in a.explained_by and "\x07" not in a.explained_by and len(a.explained_by) < 260
    up = dataclasses.replace(a, end=None)  # as the dashboard shows it while it is up
    shown = alert_paragraphs([up], [], None, False)
    plain = "".join(line.plain for line, _ in shown)
    assert "\x1b" not in plain and "Explained by" in plain
