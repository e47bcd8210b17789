"""Property-based fuzzing: mutated recordings and nvidia-smi logs never raise anything but a one-line error."""

import gzip
import os
import pathlib
import sqlite3
import tempfile

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from traintop.sources import importers
from traintop.record.codec import decode, encode
from traintop.collectors.simulated import Simulator
from traintop.errors import TraintopError
from traintop.record.recording import RecordingReader, RecordingWriter

FIX = pathlib.Path(__file__).parent / "fixtures" / "h200"
# 400 examples a test in CI (3200 files in all); TRAINTOP_FUZZ_EXAMPLES=5000 for a long run
SETTINGS = settings(max_examples=int(os.environ.get("TRAINTOP_FUZZ_EXAMPLES", "400")), deadline=None,
                    suppress_health_check=list(HealthCheck))

_valid = None


def valid_recording() -> bytes:
    global _valid
    if _valid is None:
        d = tempfile.mkdtemp()
        p = os.path.join(d, "v.ttrec")
        sim = Simulator("starved,memory_creep", gpus=2, interval=0.5)
        w = RecordingWriter(p, sim.info(), chunk_frames=40)
        for f in sim.frames(100):
            w.add(f)
        w.close()
        _valid = open(p, "rb").read()
    return _valid


def read_all(path: str) -> None:
    try:
        r = RecordingReader(path)
        list(r.frames())
        r.alerts()
        r.close()
    except TraintopError as e:
        assert "\n" not in str(e)


mutation = st.lists(st.tuples(st.integers(min_value=0), st.integers(min_value=0, max_value=255)),
                    min_size=1, max_size=40)


@SETTINGS
@given(mutation)
def test_mutated_recording_bytes(edits):
    data = bytearray(valid_recording())
    for pos, val in edits:
        data[pos % len(data)] = val
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.ttrec")
        open(p, "wb").write(bytes(data))
        read_all(p)


@SETTINGS
@given(st.integers(min_value=0, max_value=200_000))
def test_truncated_recording(n):
    data = valid_recording()[:n]
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "t.ttrec")
        open(p, "wb").write(data)
        read_all(p)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=5),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
                           max_leaves=20)


@SETTINGS
@given(json_values)
def test_hostile_chunk_contents(doc):
    import json
    import zlib

    blob = zlib.compress(json.dumps(doc).encode())
    try:
        decode(blob)
    except TraintopError:
        pass


@SETTINGS
@given(st.dictionaries(st.sampled_from(["n", "t", "c"]), json_values, max_size=3))
def test_hostile_chunk_headers(doc):
    import json
    import zlib

    try:
        decode(zlib.compress(json.dumps(doc).encode()))
    except TraintopError:
        pass


@SETTINGS
@given(st.text(max_size=30), st.text(max_size=200))
def test_hostile_session_metadata(key, value):
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "h.ttrec")
        open(p, "wb").write(valid_recording())
        db = sqlite3.connect(p)
        db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", ("session" if len(key) % 2 else key, value))
        db.commit()
        db.close()
        read_all(p)


QUERY_LINES = gzip.decompress((FIX / "smi-query-100ms.csv.gz").read_bytes()).decode().splitlines()[:60]
DMON_LINES = (FIX / "dmon-csv-dt.csv").read_text().splitlines()[:60]


@SETTINGS
@given(st.sampled_from(["query", "dmon"]), st.lists(st.tuples(st.integers(min_value=0), st.integers(min_value=0),
                                                              st.text(max_size=8)), max_size=30))
def test_mutated_nvidia_smi_logs(kind, edits):
    lines = list(QUERY_LINES if kind == "query" else DMON_LINES)
    for li, pos, text in edits:
        i = li % len(lines)
        line = lines[i]
        p = pos % (len(line) + 1)
        lines[i] = line[:p] + text + line[p + len(text):]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "log.csv")
        with open(path, "w", encoding="utf-8", errors="surrogatepass") as fh:
            fh.write("\n".join(lines))
        try:
            log = importers.load(path)
            assert log.frames_list
        except TraintopError as e:
            assert "\n" not in str(e)


@SETTINGS
@given(st.binary(max_size=2000))
def test_random_bytes_as_a_log(data):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "x.log")
        open(path, "wb").write(data)
        try:
            importers.load(path)
        except TraintopError as e:
            assert "\n" not in str(e)


def test_encode_decode_is_stable_on_real_frames():
    frames = Simulator("healthy,starved", gpus=2).frames(50)
    assert decode(encode(decode(encode(frames)))) == decode(encode(frames))


@SETTINGS
@given(json_values)
def test_hostile_session_json_never_reaches_the_ui_untyped(doc):
    import json

    from traintop.record.recording import info_from_json

    try:
        info = info_from_json(json.dumps(doc))
    except (ValueError, TypeError, KeyError):
        return
    for g in info.gpus:
        assert isinstance(g.name, str) and isinstance(g.index, int)
        assert g.mem_total is None or isinstance(g.mem_total, (int, float))


# -- hostile shapes (issue: small files that eat memory, views, nesting, markup, FIFOs) -------
# Fewer examples than above: each builds a file; TRAINTOP_FUZZ_EXAMPLES raises them all.
SMALL = settings(max_examples=int(os.environ.get("TRAINTOP_FUZZ_EXAMPLES", "60")), deadline=None,
                 suppress_health_check=list(HealthCheck))
CONTROL = st.characters(min_codepoint=0, max_codepoint=0x9f) | st.sampled_from(
    ["\x1b]52;c;cHduZWQ=\x07", "\x1b[2J", "[bold red]", "[/]", "[link=https://evil.example/]x[/link]",
     "[@click=app.quit]", "\u202e", "\u2028", "[H100]"])
hostile_text = st.lists(CONTROL | st.text(max_size=3), max_size=8).map("".join)


def nested(depth: int, leaf="1") -> str:
    return "[" * depth + leaf + "]" * depth


@SMALL
@given(st.integers(min_value=0, max_value=10 ** 15), st.integers(min_value=0, max_value=3000),
       st.sampled_from(["t", "g0.util", "g0.util.d", "p.members", "h.cores", "g0.procs", "p.cmd"]))
def test_chunks_claiming_huge_counts_or_long_columns(n, k, where):
    import zlib

    t0 = 1_790_000_000_000
    cols = {"t": "[%d%s]" % (t0, ",0" * k)}
    body = {
        "g0.util": "[" + ",".join(["1"] * k) + "]",
        "g0.util.d": '["d",0' + ",1" * k + "]",
        "p.members": "[[" + ",".join(["[]"] * k) + "]]",
        "h.cores": "[[" + ",".join(["1"] * k) + "]]",
        "g0.procs": "[[" + ",".join(["[1,2]"] * k) + "]]",
        "p.cmd": '["' + "x" * (k * 40) + '"]',
    }
    c = "" if where == "t" else '"%s":%s' % (where.removesuffix(".d"), body[where])
    if where.startswith("p."):
        c = '"p.pid":[1],' + c
    doc = '{"n":%d,"t":%s,"c":{%s}}' % (n, cols["t"] if where == "t" else "[%d]" % t0, c)
    try:
        frames = decode(zlib.compress(doc.encode()))
    except TraintopError as e:
        assert "\n" not in str(e)
        return
    assert len(frames) == n <= 10_000


@SMALL
@given(st.integers(min_value=1, max_value=200_000), st.sampled_from(["chunk", "session", "rules", "remedies"]))
def test_deep_nesting_anywhere_in_a_recording_is_one_line(depth, where):
    import zlib

    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "deep.ttrec")
        open(p, "wb").write(valid_recording())
        db = sqlite3.connect(p)
        deep = nested(depth)
        if where == "chunk":
            db.execute("UPDATE chunks SET data=?", (zlib.compress(('{"n":1,"t":[1],"c":{"g0.util":%s}}'
                                                                   % deep).encode()),))
        elif where == "remedies":
            db.execute("UPDATE alerts SET remedies=?", (deep,))
        else:
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (where, deep))
        db.commit()
        db.close()
        read_all(p)
        try:
            r = RecordingReader(p)
            r.judged_by()
            r.close()
        except TraintopError as e:
            assert "\n" not in str(e)


TABLE_KINDS = ["table", "view", "recursive view", "missing", "wrong columns", "virtual"]


def _object(name: str, columns: str, kind: str) -> list[str]:
    cols = [c.split()[0] for c in columns.split(", ")]
    if kind == "table":
        return [f"CREATE TABLE {name}({columns})"]
    if kind == "wrong columns":
        return [f"CREATE TABLE {name}(x, y)"]
    if kind == "view":
        return [f"CREATE VIEW {name}({', '.join(cols)}) AS SELECT {', '.join('1' for _ in cols)}"]
    if kind == "recursive view":
        return [f"CREATE VIEW {name}({', '.join(cols)}) AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL "
                f"SELECT x+1 FROM c) SELECT {', '.join('x' for _ in cols)} FROM c"]
    if kind == "virtual":
        return [f"CREATE VIRTUAL TABLE {name} USING fts5({', '.join(cols)})"]
    return []


@SMALL
@given(st.sampled_from(TABLE_KINDS), st.sampled_from(TABLE_KINDS), st.sampled_from(TABLE_KINDS),
       st.booleans())
def test_views_virtual_tables_and_foreign_schemas_instead_of_tables(meta, chunks, alerts, trigger):
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "schema.ttrec")
        db = sqlite3.connect(p)
        statements = (_object("meta", "key TEXT, value TEXT", meta)
                      + _object("chunks", "id INTEGER PRIMARY KEY, t0 REAL, t1 REAL, n INTEGER, codec TEXT, data BLOB",
                                chunks)
                      + _object("alerts", "id INTEGER, rule TEXT, subject TEXT, severity TEXT, title TEXT, start REAL, "
                                "end REAL, evidence TEXT, remedies TEXT", alerts))
        try:
            for s in statements:
                db.execute(s)
            if meta == "table":
                db.executemany("INSERT INTO meta VALUES (?, ?)", [("format", "traintop-recording"),
                                                                  ("schema_version", "1"), ("session", "{}")])
            if trigger and meta == "table":
                db.execute("CREATE TRIGGER tr AFTER INSERT ON meta BEGIN DELETE FROM meta; END")
            db.commit()
        except sqlite3.OperationalError:  # no FTS5 here
            return
        finally:
            db.close()
        try:
            r = RecordingReader(p)
        except TraintopError as e:
            assert "\n" not in str(e)
            assert not (meta == chunks == "table" and alerts in ("table", "missing"))
            return
        assert meta == chunks == "table" and alerts in ("table", "missing")  # anything else is refused
        list(r.frames())
        r.alerts()
        r.close()


@SMALL
@given(hostile_text, hostile_text, hostile_text, hostile_text, hostile_text)
def test_control_characters_and_markup_in_every_recorded_string(gpu_name, host, label, process, alert):
    """Every string a recording carries reads back as the same data, and the text report shows
    no control character from it (markup stays literal text: analyze prints plain text)."""
    import dataclasses
    import re

    from traintop.reports.analyze import analyze, render_text
    from traintop.findings import Finding, Severity
    from traintop.samples import ProcessSample, ProcInfo

    sim = Simulator("starved", gpus=1, interval=0.5)
    info = sim.info()
    info = dataclasses.replace(info, hostname=host, label=label,
                               gpus=tuple(dataclasses.replace(g, name=gpu_name) for g in info.gpus))
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "text.ttrec")
        w = RecordingWriter(p, info, chunk_frames=10)
        for f in sim.frames(20):
            w.add(dataclasses.replace(f, process=ProcessSample(pid=7, alive=True, name=process, cmdline=process,
                                                               members=(ProcInfo(8, process),))))
        w.alert(Finding("starvation", alert, "gpu0", Severity.WARNING, sim.t0, sim.t0 + 5, alert, (alert,), id=1))
        w.close()
        r = RecordingReader(p)
        assert r.info.gpus[0].name == (gpu_name[:256] or "GPU") and r.info.hostname == host[:256]
        frames = list(r.frames())
        assert frames[0].process.name == process and frames[0].process.members[0].name == process
        (a,) = r.alerts()
        assert a.title == alert and a.remedies == (alert,)
        text = render_text(analyze(r, name="text.ttrec", rerun=False))
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", text)  # plain() keeps tab and newline
        r.close()


@SMALL
@given(st.sampled_from(["fifo", "directory", "/dev/zero", "/dev/null", "symlink to fifo"]),
       st.sampled_from(["recording", "log", "config", "source"]))
def test_what_is_not_a_regular_file_is_refused_before_reading(kind, reader):
    import signal

    from traintop.watch.config import load_thresholds
    from traintop.watch.sessions import open_source

    with tempfile.TemporaryDirectory() as d:
        if kind in ("fifo", "symlink to fifo"):
            path = os.path.join(d, "pipe")
            os.mkfifo(path)
            if kind == "symlink to fifo":
                os.symlink(path, os.path.join(d, "link"))
                path = os.path.join(d, "link")
        elif kind == "directory":
            path = d
        else:
            path = kind
        read = {"recording": RecordingReader, "log": importers.load, "config": load_thresholds,
                "source": open_source}[reader]

        def hang(*_):
            raise AssertionError(f"{reader} blocked on a {kind}")

        old = signal.signal(signal.SIGALRM, hang)
        signal.alarm(10)
        try:
            read(path)
            raise AssertionError("accepted")
        except TraintopError as e:
            assert "\n" not in str(e)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)


probe_values = (st.none() | st.booleans() | st.integers(min_value=-2 ** 70, max_value=2 ** 70)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=4)
                | st.lists(st.floats(allow_nan=True) | st.integers(), max_size=5)
                | st.lists(st.dictionaries(st.sampled_from(["device", "allocated", "reserved", "peak", "ooms"]),
                                           st.none() | st.integers(min_value=-2 ** 70, max_value=2 ** 70)
                                           | st.floats(allow_nan=True) | st.text(max_size=2)), max_size=3))
PROBE_FIELDS = ["v", "pid", "rank", "local_rank", "world_size", "cuda", "memory", "steps", "step_times",
                "input_wait", "window", "hooks", "drops", "t"]


@SMALL
@given(st.lists(st.one_of(st.dictionaries(st.sampled_from(PROBE_FIELDS), probe_values, max_size=8).map(
    lambda d: {"v": 1, **d}), json_values), min_size=1, max_size=6), st.binary(max_size=30))
@example(messages=[{"v": 1, "step_times": [0]}], junk=b"")  # JSON's 0 is an int: a step time is a float
def test_probe_protocol(messages, junk):
    """Any sequence of messages (and junk) on a probe channel: the client never raises, keeps
    reading, and every rank it reports holds typed, plausible values."""
    import json
    import math
    import socket

    from traintop.collectors.probe_client import ProbeClient, _Conn

    a, b = socket.socketpair()
    client = ProbeClient(directory=tempfile.gettempdir())
    a.setblocking(False)
    client._conns[99] = _Conn(99, a)
    lines = [json.dumps(m, allow_nan=True).encode() for m in messages] + [junk.replace(b"\n", b" ")]
    lines.append(json.dumps({"v": 1, "rank": 3, "steps": 1}).encode())
    b.sendall(b"\n".join(lines) + b"\n")
    ranks = client.sample({99})
    assert len(ranks) == 1 and ranks[0].rank == 3 and ranks[0].steps == 1  # the last, valid message
    for r in ranks:
        for name in ("rank", "world_size", "device", "allocated", "reserved", "peak", "steps", "ooms"):
            v = getattr(r, name)
            assert v is None or (type(v) is int and v >= 0), (name, v)
        for name in ("step_time", "steps_per_s", "input_wait"):
            v = getattr(r, name)
            assert v is None or (isinstance(v, float) and math.isfinite(v) and v >= 0), (name, v)
    client.close()
    b.close()
