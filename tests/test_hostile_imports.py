"""Imports, recordings and Prometheus answers made to break the commands that read them (issue 32,
item 5), given to the real commands under the hostile-file harness's memory and time limits: each
ends with a report or with one line, never a traceback, in bounded memory and time."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import zlib

import pytest

from test_hostile_files import assert_refused, run_traintop
from traintop.collectors.simulated import Simulator
from traintop.record.recording import RecordingWriter
from traintop.samples import StackDump, ThreadStack

PMON_HEADER = b"# gpu        pid  type    sm   mem   enc   dec    fb   command\n"


def _gz(path, head: bytes, blocks) -> str:
    comp = zlib.compressobj(6, zlib.DEFLATED, 31)  # gzip framing
    with open(path, "wb") as fh:
        fh.write(comp.compress(head))
        for block in blocks:
            fh.write(comp.compress(block))
        fh.write(comp.flush())
    return str(path)


def test_a_pmon_log_of_millions_of_processes_on_one_gpu_is_refused_in_bounded_memory(tmp_path):
    """4 million processes on GPU 0 at once, 11 MB of gzip: before, analyze built them all as one
    sample and died of a MemoryError under the 1.5 GiB limit."""
    line = "    0 %7d     C    50    20     -     -  1000   python\n"
    blocks = ("".join(map(line.__mod__, range(k, k + 100_000))).encode() for k in range(1, 3_990_000, 100_000))
    path = _gz(tmp_path / "many.pmon.gz", PMON_HEADER, blocks)
    assert os.path.getsize(path) < 16_000_000
    assert_refused(run_traintop(tmp_path, "analyze", path), "more than 4,096 processes on GPU 0 at once")


def test_analyze_of_a_pmon_log_builds_no_frames_and_runs_no_rules(tmp_path, monkeypatch):
    """600 000 lines of 300 001 rounds (GPU 1, then GPU 0 and 1 over and over), 100 KB of gzip: before,
    each round became a frame
    the rules judged (200 µs each: 379 s for the 4 million rows a pmon log may hold), though a pmon
    log holds nothing they judge. Now analyze reads the columns."""
    pair = b"    1     7     C    50    20     -     -  1000   python\n    0     7     C    50    20     -     -  1000   python\n"
    path = _gz(tmp_path / "rounds.pmon.gz", PMON_HEADER, (pair * 1000 for _ in range(300)))
    assert os.path.getsize(path) < 200_000
    p = run_traintop(tmp_path, "analyze", path, "--json", timeout=60)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    report = json.loads(p.stdout)
    assert report["samples"] == 300_001 and report["findings"] == []
    assert [(g["index"], g["samples"]) for g in report["gpus"]] == [(0, 300_000), (1, 300_000)]

    from traintop.sources import importers
    from traintop.reports.analyze import analyze
    from traintop.sources.import_pmon import PmonLog
    from traintop.watch.monitor import Monitor

    def no(*args, **kwargs):
        raise AssertionError("built a frame or judged one")

    monkeypatch.setattr(PmonLog, "frames", no)
    monkeypatch.setattr(Monitor, "ingest", no)
    small = tmp_path / "small.pmon"
    small.write_bytes(PMON_HEADER + pair * 50)
    assert analyze(importers.load(str(small))).samples == 51


def test_a_log_of_blank_lines_is_refused_before_a_line_is_parsed(tmp_path):
    """500 MiB of newlines in 0.5 MB of gzip (under the 512 MiB limit on text): before, each was a
    line read in Python, minutes of it."""
    path = _gz(tmp_path / "blank.pmon.gz", PMON_HEADER + b"    0     7     C    50    20     -     -  1000   python\n",
               (b"\n" * (1 << 20) for _ in range(500)))
    assert os.path.getsize(path) < 600_000
    assert_refused(run_traintop(tmp_path, "analyze", path, timeout=60), "more than 32,000,000 lines")


def _recording_with_stacks(path, threads_json: list[str]) -> str:
    sim = Simulator("healthy", gpus=1, interval=0.5)
    frames = sim.frames(40)
    dumps = tuple(StackDump(t=frames[10].t + k, pid=4321, rank=0, reason="stalled", since_step=12.0,
                            threads=(ThreadStack("MainThread", True, f'File "train.py", line {k}\n  x = y()'),))
                  for k in range(len(threads_json)))
    w = RecordingWriter(str(path), sim.info(), chunk_frames=20)
    import dataclasses

    for k, f in enumerate(frames):
        w.add(dataclasses.replace(f, stacks=dumps) if k == 10 else f)
    w.close()
    db = sqlite3.connect(path)
    ids = [r[0] for r in db.execute("SELECT id FROM stacks ORDER BY t")]
    for i, doc in zip(ids, threads_json):
        if doc is not None:
            db.execute("UPDATE stacks SET threads=? WHERE id=?", (doc, i))
    db.commit()
    db.close()
    return str(path)


def test_deeply_nested_stack_data_in_a_recording_is_left_out(tmp_path):
    """A 230 KB recording whose stack dump is JSON nested 100 000 deep: before, analyze and replay
    ended in a RecursionError traceback. The dump is left out, the others kept."""
    deep = "[" * 100_000 + "]" * 100_000
    path = _recording_with_stacks(tmp_path / "deep.ttrec", [None, deep])
    assert os.path.getsize(path) < 300_000
    p = run_traintop(tmp_path, "analyze", path, "--json")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    (dump,) = json.loads(p.stdout)["stacks"]
    assert dump["threads"][0]["innermost"] == ['File "train.py", line 0 — x = y()']

    from traintop.watch import sessions

    session = sessions.replay_session(path)  # the replay reads every dump when it starts
    assert [len(d.threads) for d in session.feed._stacks] == [1]


PROM_TIMES = ["1e18", "-1e18", "1e308", "-1e308", "9223372036854775808"]


@pytest.mark.parametrize("absurd", PROM_TIMES)
def test_an_absurd_prometheus_sample_time_is_read_as_unknown(absurd):
    """A host's timestamp() answered as 1e18: before, analyze --prometheus ended in an OverflowError
    (or OSError) traceback out of cluster/gaps.py, formatting it as a clock time."""
    from hostile_prometheus import HostileServer, ok_series

    def answer(query, grid, path):
        if "timestamp(" not in query:
            return ok_series(query, grid)
        out = []
        for host in ("node-a", "node-b"):
            times = [repr(t) for t in grid]
            if host == "node-a":
                times[-3:] = [absurd] * 3
            out.append(({"Hostname": host, "instance": f"{host}:19401"}, [[t, v] for t, v in zip(grid, times)]))
        return out

    server = HostileServer("custom", answer=answer).start()
    try:
        p = subprocess.run([sys.executable, "-m", "traintop", "analyze", "--prometheus", server.url, "--since", "5m"],
                           capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    finally:
        server.stop()
    assert p.returncode == 0 and "Traceback" not in p.stderr and not p.stderr, p.stderr[-3000:]
    assert "2 host(s)" in p.stdout
    assert "outside their plausible range and were read as unknown (sample_time)" in p.stdout


def test_alerts_past_their_text_budget_do_not_stand_for_the_rules(tmp_path, monkeypatch):
    """A recording's alerts are read up to a budget of text (gigabytes of forged alerts would
    otherwise fill the memory); cut there, they are incomplete, so the rules run again."""
    from traintop.record import recording
    from traintop.reports.analyze import analyze
    from traintop.watch.monitor import Monitor

    sim = Simulator("starved", gpus=1, interval=0.5)
    path = str(tmp_path / "alerts.ttrec")
    monitor = Monitor(sim.info(), recorder=RecordingWriter(path, sim.info()))
    for f in sim.frames(240):
        monitor.ingest(f)
    monitor.close()
    assert recording.RecordingReader(path).judged_by()
    monkeypatch.setattr(recording, "ALERT_BUDGET", 10)
    r = recording.RecordingReader(path)
    assert not r.judged_by()
    assert any(f.rule == "starvation" for f in analyze(r).findings)  # found again by the rules


def _recording_of_unchanging_chunks(path, chunks: int, n: int = 10_000) -> str:
    """A recording (the writer's tables) whose chunks each hold ``n`` samples of one GPU that never
    change: ~200 bytes a chunk, as the writer would store them."""
    import shutil

    sim = Simulator("healthy", gpus=1, interval=0.5)
    seed = str(path) + ".seed"
    w = RecordingWriter(seed, sim.info(), chunk_frames=10)
    for f in sim.frames(10):
        w.add(f)
    w.close()
    shutil.copy(seed, path)
    db = sqlite3.connect(path)
    db.execute("DELETE FROM chunks")
    t0 = 1_790_000_000_000  # ms
    for k in range(chunks):
        start = t0 + k * n * 500
        doc = {"n": n, "t": [start] + [500] * (n - 1),
               "c": {"g0.util": ["d", 50] + [0] * (n - 1), "g0.procs": [[]] + [None] * (n - 1)}}
        db.execute("INSERT INTO chunks(t0, t1, n, codec, data) VALUES (?,?,?,?,?)",
                   (start / 1000, (start + (n - 1) * 500) / 1000, n, "cols3+zlib",
                    zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 9)))
    db.commit()
    db.execute("VACUUM")
    db.close()
    return str(path)


def test_a_small_recording_claiming_millions_of_samples_is_refused_at_once(tmp_path):
    """1 001 chunks of 10 000 unchanging samples: 10 million samples in under 400 KB. Before, analyze
    judged every one (100 000 of them took 24 s of CPU here: this one, hours). A recording holds at
    most 10 million samples, as a log does; one claiming more is refused before a chunk is decoded."""
    from traintop.record.recording import MAX_SAMPLES

    path = _recording_of_unchanging_chunks(tmp_path / "claims.ttrec", MAX_SAMPLES // 10_000 + 1)
    assert os.path.getsize(path) < 400_000
    for command in (["analyze", path], ["export", "--csv", path]):
        assert_refused(run_traintop(tmp_path, *command, timeout=120), "10,010,000 samples", "10,000,000")
    ok = _recording_of_unchanging_chunks(tmp_path / "fits.ttrec", 3)
    p = run_traintop(tmp_path, "analyze", "--json", ok)
    assert p.returncode == 0 and json.loads(p.stdout)["samples"] == 30_000, p.stderr[-2000:]
