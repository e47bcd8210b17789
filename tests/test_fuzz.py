"""Property-based fuzzing: mutated recordings and nvidia-smi logs never raise anything but a one-line error."""

import gzip
import os
import pathlib
import sqlite3
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traintop import importers
from traintop.codec import decode, encode
from traintop.collectors.simulated import Simulator
from traintop.errors import TraintopError
from traintop.recording import RecordingReader, RecordingWriter

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

    from traintop.recording import info_from_json

    try:
        info = info_from_json(json.dumps(doc))
    except (ValueError, TypeError, KeyError):
        return
    for g in info.gpus:
        assert isinstance(g.name, str) and isinstance(g.index, int)
        assert g.mem_total is None or isinstance(g.mem_total, (int, float))
