"""Every field that comes from outside, fed its extremes where it enters (issue 32: one door for
numbers and structures from outside).

The fields are read from the code that parses them, not copied here: the probe parser's field
tables, the chunks the recording writer makes of a frame that holds every field, the recording's
tables and metadata keys, the nvidia-smi importers' column tables, and every query a Prometheus
report makes. Each gets NaN and infinities, 1e308, ±2**63, 400 digits, a huge string, nesting
100 000 deep, wrong types and nothing. The commands that read them (analyze, its JSON, export) run
as the real CLI under the hostile-file tests' limits (tests/cli_batch.py): each ends with a report
or with one line on stderr (exit 0 or 2), never a traceback, within 1.5 GiB and its time limit.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import re
import shutil
import socket
import time
import sqlite3
import subprocess
import sys
import zlib

import pytest

from test_hostile_files import _FakeProcess

EXTREMES = ("nan", "inf", "-inf", "1e308", "-1e308", "1e400", "1e18", "-1e18", "2**63", "-2**63", "10**400", "huge",
            "deep", "empty", "text", "list", "object", "true", "null", "-1")
DEEP = 100_000
# each extreme as JSON text (probe messages, recording chunks and metadata, Prometheus answers)
JSON = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity", "1e308": "1e308", "-1e308": "-1e308", "1e400": "1e400",
        "1e18": "1e18", "-1e18": "-1e18", "2**63": str(2**63), "-2**63": str(-2**63), "10**400": "1" + "0" * 400, "huge": json.dumps("x" * 200_000),
        "deep": "[" * DEEP + "]" * DEEP, "empty": '""', "text": '"12x"', "list": "[]", "object": "{}",
        "true": "true", "null": "null", "-1": "-1"}
# as a column of a text log (an nvidia-smi CSV, dmon or pmon): what can be written there
TEXT = {"nan": "nan", "inf": "inf", "-inf": "-inf", "1e308": "1e308", "-1e308": "-1e308", "1e400": "1e400",
        "1e18": "1e18", "-1e18": "-1e18", "2**63": str(2**63), "-2**63": str(-2**63), "10**400": "1" + "0" * 400, "huge": "x" * 30_000,
        "deep": "[" * 30_000, "empty": "", "text": "12x", "list": "[]", "object": "{}", "true": "True",
        "null": "N/A", "-1": "-1", "NaN": "NaN", "Infinity": "Infinity", "hex": "0x" + "F" * 40,
        "control": "\x1b]52;c;QUFB\x07"}
# as an SQLite value in a recording's table
SQL = {"nan": float("nan"), "inf": math.inf, "-inf": -math.inf, "1e308": 1e308, "-1e308": -1e308,
       "1e18": 1e18, "-1e18": -1e18, "2**63": 2**63 - 1, "-2**63": -2**63, "10**400": "1" + "0" * 400, "huge": "x" * 1_000_000,
       "deep": "[" * DEEP + "]" * DEEP, "empty": "", "text": "12x", "blob": b"\x00\xff" * 10, "null": None, "-1": -1}


def _check(results: list[dict], cases: list[list[str]]) -> None:
    """Each command: a report or one line (exit 0 or 2), no traceback, in its limits; its output
    never holds a control character from the input."""
    bad = []
    for args, r in zip(cases, results):
        err = r["stderr"].strip()
        why = None
        if "Traceback" in r["stderr"] or r["rc"] not in (0, 2):
            why = f"exit {r['rc']}"
        elif len(err.splitlines()) > 1 or (err and not err.startswith("traintop: ")) or (r["rc"] == 2 and not err):
            why = "not one line"
        elif r["rc"] == 0 and "--json" in args and not r["strict_json"]:
            why = "not strict JSON"
        elif r["control"]:
            why = "a control character reached the output"
        if why is not None:
            bad.append(f"{why}: traintop {' '.join(a[:60] for a in args)}\n{r['stderr'][-1500:]}")
    assert not bad, f"{len(bad)} of {len(cases)}:\n" + "\n\n".join(bad[:5])


def _run_cli(tmp_path, cases: list[list[str]]) -> list[dict]:
    """``cases`` through the real CLI (tests/cli_batch.py), each under the memory and time limits;
    their results, checked."""
    todo, done = tmp_path / "cases.json", tmp_path / "results.json"
    todo.write_text(json.dumps(cases))
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "config"), HOME=str(tmp_path), TERM="dumb")
    p = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "cli_batch.py"), str(todo), str(done)],
                       capture_output=True, text=True, timeout=1500, env=env, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr[-3000:]
    results = json.loads(done.read_text())
    _check(results, cases)
    return results


def _with(doc: str, extreme: str) -> str:
    """A JSON document with its placeholder replaced by an extreme."""
    return doc.replace('"@X@"', JSON[extreme])


def _set(obj, path: tuple, value):
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value


# -- probe messages -------------------------------------------------------------------------------

def _probe_message(pid: int, folder: str, t: float) -> dict:
    """A message with every field a probe sends (collectors/probe_client.py reads each)."""
    from traintop.collectors import probe_client as P
    from traintop.samples import LEDGER_BUCKETS

    msg = {"v": 1, "pid": pid, "rank": 0, "local_rank": 0, "world_size": 2, "cuda": True, "hooks": True,
           "torch": True, "loader": True, "steps": 100, "skipped": 3, "drops": 0, "input_wait": 0.1, "window": 0.5, "t": t,
           "step_times": [0.1, 0.2], "ledger": {b: 0.05 for b in LEDGER_BUCKETS}, "precision": {"matmul": "bf16"},
           "flops": {"flops": 1e12}, "pause_stack": 'File "train.py", line 3\n  step()', "stacks_reason": "stalled",
           "memory": [{k: 1 << 30 for k in P.MEMORY_FIELDS} | {"device": 0, "alloc_retries": 0, "ooms": 0}],
           "stacks": [{"thread": "MainThread", "main": True, "stack": 'File "train.py", line 3\n  step()'}],
           "since_step": 3.0, "job": "4242", "backend": "nccl", "ppid": 1, "capture_refused": [{"kind": "trace"}],
           "captures": [{"kind": "trace", "path": os.path.join(folder, "captures", "capture-7-20261202-101010.pt.trace.json"),
                         "t": t, "bytes": 1000, "steps": 3, "step_s_before": 0.1, "step_s_after": 0.1, "error": None,
                         "removed": ["capture-7-20261202-101009.pt.trace.json"]}]}
    assert set(P.FIELDS) | set(P.STRUCTURED) <= set(msg)
    return msg


def _probe_paths(msg: dict) -> list[tuple]:
    """Every field of a message, nested ones too: (key,), (key, 0, subkey), (key, subkey)."""
    out = []
    for k, v in msg.items():
        out.append((k,))
        if isinstance(v, dict):
            out += [(k, sub) for sub in v]
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            out += [(k, 0, sub) for sub in v[0]]
    return out


def test_the_probe_fields_tested_are_those_its_reader_reads():
    """A field the reader gains is tested without a change here: each name the reader looks up in a
    message is one the message above holds."""
    from traintop.collectors import probe_client as P

    source = inspect.getsource(P)
    read = set(re.findall(r'\b(?:msg|m|d|rec|main|flops|precision|ledger)\.get\("(\w+)"', source))
    read |= set(re.findall(r'\b(?:msg|m|d|rec|flops|precision)\["(\w+)"\]', source))
    tested = {p[-1] for p in _probe_paths(_probe_message(7, "/x", 1.8e9))}
    assert read and read <= tested, read - tested


def _feed_probe(tmp_path, monkeypatch) -> str:
    """Every field of a probe message, at each extreme, through the real reader into samples, the
    rules and a recording; returns the recording."""
    from traintop.collectors.probe_client import ProbeClient
    from traintop.collectors.simulated import Simulator
    from traintop.sources.live import LiveSampler
    from traintop.watch.monitor import Monitor
    from traintop.record.recording import RecordingWriter

    d = tmp_path / "probes"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("TRAINTOP_PROBE_DIR", str(d))
    pid = 4321
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(d / f"probe-{pid}.sock"))
    srv.listen(1)
    from traintop.collectors.probe_limits import ProbeLimits

    # the extremes, not the rate, are under test: a reader held to a probe's byte rate would leave
    # this one thread blocked in sendall (test_hostile_agent_probes.py tests the rate)
    unbounded = ProbeLimits(lines_per_s=1e9, burst_lines=1 << 30, bytes_per_s=float(1 << 40), burst_bytes=1 << 40)
    client = ProbeClient(limits=unbounded)
    sampler = LiveSampler(process=_FakeProcess(pid), probes=client)
    sampler.next_frame()
    conn, _ = srv.accept()
    info = Simulator("healthy", gpus=1).info()
    path = str(tmp_path / "probe.ttrec")
    monitor = Monitor(info, recorder=RecordingWriter(path, info))
    good = _probe_message(pid, str(d), 1.8e9)
    ranks = 0
    try:
        for where in _probe_paths(good):
            for x in EXTREMES:
                msg = json.loads(json.dumps(good))
                _set(msg, where, "@X@")
                msg["t"] = msg["t"] if where == ("t",) else 1.8e9
                for line in (_with(json.dumps(msg), x), json.dumps(good)):
                    for frame in _send_while_sampling(conn, line.encode() + b"\n", sampler):
                        monitor.ingest(frame)
                        _check_frame(frame, where, x)
                        ranks += len(frame.ranks)
    finally:
        conn.close()
        srv.close()
        sampler.close()
        monitor.close()
    assert ranks and client.bad_messages
    return path


def _send_while_sampling(conn, data: bytes, sampler) -> list:
    """Send one message and take frames until it is sent: a message larger than the socket's buffer
    is read while it is written (one thread doing both would wait for itself)."""
    import threading

    error: list = []

    def send():
        try:
            conn.sendall(data)
        except OSError as e:  # the reader hung up: said below
            error.append(e)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    frames = []
    deadline = time.monotonic() + 30
    while sender.is_alive() and time.monotonic() < deadline:
        frames.append(sampler.next_frame())
        sender.join(0.01)
    assert not sender.is_alive() and not error, (f"the reader stopped reading a message of {len(data)} bytes "
                                                 f"within its limits ({error})", data[:200])
    return frames + [sampler.next_frame()]  # what is left of it in the socket's buffer


def _check_frame(frame, where, x) -> None:
    from traintop.record import evidence
    from traintop import plausible, stacks

    for r in frame.ranks:
        for f in dataclasses.fields(r):
            v = getattr(r, f.name)
            if f.name in plausible.RANK and v is not None:
                assert plausible.number(v, plausible.RANK[f.name]) is not None, (where, x, f.name, v)
    for dump in frame.stacks:
        assert plausible.time_ok(dump.t) and len(dump.threads) <= plausible.MAX_THREADS, (where, x)
        "\n".join(stacks.render(dump))
    for cap in frame.captures:
        assert plausible.time_ok(cap.t), (where, x)
        evidence.describe(cap)


# -- recordings -----------------------------------------------------------------------------------

def _full_frames(n: int):
    """Frames in which every recorded field has a value (each the middle of its plausible range)."""
    from traintop import plausible
    from traintop.collectors.simulated import Simulator
    from traintop.samples import GpuProcess

    def filled(sample, ranges):
        values = {}
        for f in dataclasses.fields(sample):
            lo, hi = ranges.get(f.name, (None, None))
            if getattr(sample, f.name) is None and lo is not None:
                mid = (lo + hi) / 2 if hi < 1e12 else lo + 1000
                values[f.name] = int(mid) if isinstance(lo, int) and isinstance(hi, int) else float(mid)
        return dataclasses.replace(sample, **values)

    sim = Simulator("starved", gpus=1, interval=0.5)
    out = []
    for f in sim.frames(n):
        gpus = tuple(dataclasses.replace(filled(g, plausible.GPU), processes=(GpuProcess(77, 1 << 30, 50.0, 10.0, 0.0, 0.0),))
                     for g in f.gpus)
        ranks = tuple(filled(r, plausible.RANK) for r in f.ranks)
        out.append(dataclasses.replace(f, gpus=gpus, host=filled(f.host, plausible.HOST),
                                       process=filled(f.process, plausible.PROCESS), ranks=ranks))
    return out, sim.info()


def _base_recording(path: str, frames, info) -> str:
    from traintop.watch.monitor import Monitor
    from traintop.record.recording import RecordingWriter

    monitor = Monitor(info, recorder=RecordingWriter(path, info, chunk_frames=len(frames)))
    for f in frames:
        monitor.ingest(f)
    monitor.close()
    return path


def _chunk_recording(tmp_path) -> str:
    """One chunk per (column, extreme): the column's first value, or the whole column, replaced.
    The columns are those the writer made of frames holding every field."""
    frames, info = _full_frames(20)
    path = _base_recording(str(tmp_path / "chunks.ttrec"), frames, info)
    db = sqlite3.connect(path)
    (cid, t0, t1, n, codec, blob), = db.execute("SELECT id, t0, t1, n, codec, data FROM chunks").fetchall()
    doc = json.loads(zlib.decompress(blob))
    span = t1 - t0 + 1.0
    k = 0
    rows = []
    for col in ["n", "t"] + sorted(doc["c"]):
        for x in EXTREMES:
            for whole in (False, True):
                d = json.loads(json.dumps(doc))
                k += 1
                d["t"][0] += int(k * span * 1000)  # each chunk its own span, in order
                if col in ("n", "t"):
                    if whole or col == "n":
                        d[col] = "@X@"
                    else:
                        d["t"][1] = "@X@"
                elif whole:
                    d["c"][col] = "@X@"
                else:
                    cell = d["c"][col]
                    cell = cell if isinstance(cell, list) else cell["u"]  # a members table
                    cell[1 if cell[0] == "d" else 0] = "@X@"
                raw = _with(json.dumps(d, separators=(",", ":")), x).encode()
                rows.append((t0 + k * span, t1 + k * span, n, codec, zlib.compress(raw, 6)))
    db.executemany("INSERT INTO chunks(t0, t1, n, codec, data) VALUES (?,?,?,?,?)", rows)
    db.commit()
    db.close()
    return path


def _table_recording(tmp_path) -> str:
    """Alerts, stack dumps and captures: one forged row per (column, extreme), its columns read from
    the file; the others as the writer made them."""
    from traintop.samples import Capture, StackDump, ThreadStack

    frames, info = _full_frames(40)
    dumps = (StackDump(frames[5].t, 77, 0, "stalled", 3.0, (ThreadStack("MainThread", True, 'File "x.py", line 1'),)),)
    caps = (Capture(frames[5].t, 77, "trace", 0, "/nonexistent/capture-77-20261202-101010.pt.trace.json", 10, 3),)
    frames[5] = dataclasses.replace(frames[5], stacks=dumps, captures=caps)
    path = _base_recording(str(tmp_path / "tables.ttrec"), frames, info)

    db = sqlite3.connect(path)
    assert db.execute("SELECT count(*) FROM alerts").fetchone()[0] >= 1  # the rules found the starvation
    for table in ("alerts", "stacks", "captures"):
        names = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
        assert db.execute(f"SELECT count(*) FROM {table}").fetchone()[0] >= 1, table
        template = db.execute(f"SELECT * FROM {table} LIMIT 1").fetchone()
        # the same table without NOT NULL (another writer's file need not have it)
        db.execute(f"CREATE TABLE loose AS SELECT * FROM {table}")
        db.execute(f"DROP TABLE {table}")
        db.execute(f"ALTER TABLE loose RENAME TO {table}")
        next_id = 1000
        for j, col in enumerate(names):
            for v in SQL.values():
                row = list(template)
                next_id += 1
                row[0] = next_id
                row[j] = v
                db.execute(f"INSERT INTO {table} VALUES ({','.join('?' * len(row))})", row)
    db.commit()
    db.close()
    return path


def _meta_recordings(tmp_path) -> list[str]:
    """One file per (metadata field, extreme): every key of the meta table, and every field of the
    session (and of its GPU entry) in it; a damaged session refuses the file, so one each."""
    frames, info = _full_frames(20)
    base = _base_recording(str(tmp_path / "meta-base.ttrec"), frames, info)
    db = sqlite3.connect(base)
    meta = dict(db.execute("SELECT key, value FROM meta"))
    db.close()
    session = json.loads(meta["session"])
    edits = []
    for key in sorted(meta):
        for x in EXTREMES:
            edits.append((key, None, x))
    for where in [(k,) for k in session] + [("gpus", 0, k) for k in session["gpus"][0]]:
        for x in EXTREMES:
            edits.append(("session", where, x))
    paths = []
    for k, (key, where, x) in enumerate(edits):
        if where is None:
            value = JSON[x] if key != "session" else _with('"@X@"', x)
        else:
            s = json.loads(meta["session"])
            _set(s, where, "@X@")
            value = _with(json.dumps(s), x)
        path = str(tmp_path / f"meta-{k}.ttrec")
        shutil.copyfile(base, path)
        db = sqlite3.connect(path)
        db.execute("UPDATE meta SET value=? WHERE key=?", (value, key))
        db.commit()
        db.close()
        paths.append(path)
    return paths


# -- nvidia-smi logs -----------------------------------------------------------------------------

def _log_lines(columns: list[str], good: dict, sep: str, times) -> list[str]:
    """One line per (column, extreme) with the others good, each followed by a good line: every
    line its own sample, a second apart (``times(k)``: the time columns of the k-th)."""
    out = []
    k = 0
    for col in columns:
        for text in TEXT.values():
            if sep == " " and not text:
                text = "-"  # a column of a whitespace-separated log cannot be empty
            for extreme in (True, False):
                k += 1
                row = dict(good, **times(k))
                if extreme:
                    row[col] = text
                out.append(sep.join(row[c] for c in columns))
    return out


def _clock(fmt: str, names: tuple):
    import time

    return lambda k: dict(zip(names, time.strftime(fmt, time.localtime(1.8e9 + k)).split("|")))


def _query_log(tmp_path) -> str:
    from traintop.sources import importers

    columns = ["timestamp", "index", *sorted(importers.NAME_FIELDS), *importers.QUERY_FIELDS,
               *sorted(importers.IGNORED_QUERY_FIELDS)]
    good = {c: "1" for c in columns} | {"name": "NVIDIA H200", "gpu_name": "NVIDIA H200", "index": "0",
                                         "uuid": "GPU-1", "pci.bus_id": "00000000:01:00.0",
                                         "clocks_event_reasons.active": "0x0000000000000001"}
    lines = _log_lines(columns, good, ", ", _clock("%Y/%m/%d %H:%M:%S.000", ("timestamp",)))
    path = tmp_path / "query.csv"
    path.write_text(", ".join(columns) + "\n" + "\n".join(lines) + "\n")
    return str(path)


def _dmon_log(tmp_path) -> str:
    from traintop.sources import importers

    columns = ["date", "time", "gpu", *importers.DMON_COLUMNS]
    good = {c: "1" for c in columns} | {"gpu": "0"}
    lines = _log_lines(columns, good, " ", _clock("%Y%m%d|%H:%M:%S", ("date", "time")))
    path = tmp_path / "log.dmon"
    path.write_text("#" + " ".join(columns) + "\n" + "\n".join(" " + ln for ln in lines) + "\n")
    return str(path)


def _pmon_log(tmp_path) -> str:
    from traintop.sources import import_pmon

    columns = ["date", "time", "gpu", "pid", "type", *import_pmon._PCT, "fb", "command"]
    good = {c: "1" for c in columns} | {"gpu": "0", "pid": "77", "type": "C", "command": "python"}
    lines = _log_lines(columns, good, " ", _clock("%Y%m%d|%H:%M:%S", ("date", "time")))
    path = tmp_path / "log.pmon"
    path.write_text("#" + " ".join(columns) + "\n" + "\n".join(" " + ln for ln in lines) + "\n")
    return str(path)


# -- Prometheus -----------------------------------------------------------------------------------

# a sample value as Prometheus writes it (a string), or a wrong JSON type as it is
VALUE = {**{x: json.dumps(JSON[x]) for x in EXTREMES}, "nan": '"NaN"', "inf": '"+Inf"', "-inf": '"-Inf"',
         **{x: JSON[x] for x in ("huge", "deep", "empty", "text", "list", "object", "true", "null")}}


def _prometheus_answer(query: str, grid: list, path: str) -> bytes:
    """The usual small cluster (tests/hostile_prometheus.py) where, in run ``/runJ``, every answer
    holds the J-th extreme in every place: one series' values (as a string, and as a bare JSON
    value), another's sample times, and a third series' labels (one value, and an added name)."""
    from hostile_prometheus import ok_series

    x = EXTREMES[int(path.split("/")[1][3:])]
    matrix = path.endswith("query_range")
    series = ok_series(query, grid) or [({"Hostname": "node-a", "instance": "node-a:19401", "gpu": "0",
                                          "bucket": "train", "job": "j1", "rank": "0"}, [[t, "1"] for t in grid])]
    labels, points = series[0]
    other = dict(labels, Hostname="node-b", instance="node-b:19401")
    forged = dict(labels, Hostname="node-z", instance="node-z:19401")
    forged[sorted(forged)[zlib.crc32(query.encode()) % len(forged)]] = "@L@"
    forged["@K@"] = "v"
    if matrix:
        values = [[t, "@V@" if i % 4 == 1 else "@R@" if i % 4 == 3 else v] for i, (t, v) in enumerate(points)]
        times = [["@T@" if i % 3 == 1 else t, v] for i, (t, v) in enumerate(points)]
        items = [{"metric": labels, "values": values}, {"metric": other, "values": times},
                 {"metric": forged, "values": points}]
    else:  # an instant query: one point each
        t, v = points[-1]
        items = [{"metric": labels, "value": [t, "@V@"]}, {"metric": dict(labels, gpu="1"), "value": [t, "@R@"]},
                 {"metric": other, "value": ["@T@", v]}, {"metric": forged, "value": [t, v]}]
    key = JSON[x] if JSON[x].startswith('"') else json.dumps(x)
    body = json.dumps({"status": "success", "data": {"resultType": "matrix" if matrix else "vector", "result": items}})
    for mark, text in (("@V@", VALUE[x]), ("@R@", JSON[x]), ("@T@", JSON[x]), ("@L@", JSON[x]), ("@K@", key)):
        body = body.replace(f'"{mark}"', text)
    return body.encode()


# -- the test ------------------------------------------------------------------------------------

ENTRIES = ("probe", "chunks", "tables", "meta", "query", "dmon", "pmon", "prometheus")


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_field_from_outside_survives_its_extremes(tmp_path, monkeypatch, entry):
    """Each entry's fields at their extremes: the commands that read them end as documented, and
    (so that this is no test of refusals alone) those that must read past a bad value do."""
    if entry == "prometheus":
        from hostile_prometheus import HostileServer

        server = HostileServer("custom", answer=_prometheus_answer).start()
        try:
            cases = [["analyze", "--prometheus", f"{server.url}/run{j}", "--since", "5m", *extra]
                     for j in range(len(EXTREMES)) for extra in ([], ["--json"])]
            results = _run_cli(tmp_path, cases)
        finally:
            server.stop()
        for args, r in zip(cases, results):
            x = EXTREMES[int(args[2].rsplit("/run", 1)[1])]
            # nesting ends the read at its first answer; 200 KB strings in every place, past its bytes
            assert r["rc"] == (2 if x in ("deep", "huge") else 0), (args, r)
        return
    if entry == "meta":
        results = _run_cli(tmp_path, [["analyze", p, "--json"] for p in _meta_recordings(tmp_path)])
        assert {r["rc"] for r in results} == {0, 2}  # a damaged session refuses the file; other keys do not
        return
    if entry == "probe":
        path = _feed_probe(tmp_path, monkeypatch)
        cases = [["analyze", path], ["analyze", path, "--json"], ["analyze", path, "--rerun"]]
    elif entry == "chunks":
        path = _chunk_recording(tmp_path)
        cases = [["analyze", path], ["analyze", path, "--json"], ["analyze", path, "--rerun"],
                 ["export", path, "--csv", "-o", str(tmp_path / "out.csv")], ["export", path, "-o", str(tmp_path / "o")]]
    elif entry == "tables":
        path = _table_recording(tmp_path)
        cases = [["analyze", path], ["analyze", path, "--json"]]
    else:
        path = {"query": _query_log, "dmon": _dmon_log, "pmon": _pmon_log}[entry](tmp_path)
        cases = [["analyze", path], ["analyze", path, "--json"], ["export", path, "--csv", "-o", str(tmp_path / "o.csv")],
                 ["export", path, "-o", str(tmp_path / "o.jsonl")]]
    results = _run_cli(tmp_path, cases)
    assert [r["rc"] for r in results] == [0] * len(cases), [r["stderr"] for r in results]
    report = results[1]["summary"]
    assert report["samples"] > 0
    if entry == "chunks":
        assert 0 < report["skipped_chunks"] < sum(1 for _ in EXTREMES) * 2 * 100
    if entry in ("query", "dmon", "pmon"):
        assert report["skipped_lines"] > 0
