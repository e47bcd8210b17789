"""Seeks decode only the window they rebuild, and the cols3 chunk layout (schema v2) reads
back exactly what cols2 files (schema v1) held; old files still open."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sqlite3
import zlib

import pytest

from traintop.record.codec import CODEC, decode, encode
from traintop.collectors.simulated import Simulator
from traintop.errors import RecordingError
from traintop.record.recording import SCHEMA_VERSION, RecordingReader, RecordingWriter
from traintop.store import Store

FIX = pathlib.Path(__file__).parent / "fixtures" / "h200"
V1_COLS2 = FIX / "ddp-stall-10hz.ttrec"  # schema v1, cols2 chunks, a probed job (members, ranks)


def _chunks(path):
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute("SELECT codec, data FROM chunks ORDER BY t0").fetchall()
    finally:
        db.close()


def test_a_schema_v1_cols2_file_still_opens_and_reads_the_same_in_the_new_layout():
    r = RecordingReader(str(V1_COLS2))
    assert r.meta["schema_version"] == "1" and r.skipped_chunks == 0
    for codec, blob in _chunks(V1_COLS2):
        assert codec == "cols2+zlib"
        old = decode(blob, codec)
        assert old and any(f.process and f.process.members for f in old)
        assert decode(encode(old), CODEC) == old  # cols3 holds exactly what cols2 did


def test_new_files_are_schema_v3_in_cols3(tmp_path):
    sim = Simulator("starved", gpus=2, interval=0.5, seed=3)
    path = str(tmp_path / "s.ttrec")
    w = RecordingWriter(path, sim.info(), chunk_frames=50)
    frames = [sim.next_frame() for _ in range(120)]
    for f in frames:
        w.add(f)
    w.close()
    r = RecordingReader(path)
    assert r.meta["schema_version"] == str(SCHEMA_VERSION) == "3"
    assert {c for c, _ in _chunks(path)} == {"cols3+zlib"}
    assert list(r.frames()) == decode(encode(frames))


def _members_frames():
    sim = Simulator("starved", gpus=2, interval=0.5, seed=4)
    return [sim.next_frame() for _ in range(300)]


def test_cols3_stores_each_distinct_member_row_once():
    frames = _members_frames()
    doc = json.loads(zlib.decompress(encode(frames)))
    members = doc["c"]["p.members"]
    rows = sum(len(f.process.members) for f in frames if f.process)
    assert rows and len(members["u"]) < rows
    assert len({json.dumps(m) for m in members["u"]}) == len(members["u"])


@pytest.mark.parametrize("path", [V1_COLS2, FIX / "training-phases-probe-10hz.ttrec"])
def test_a_window_decodes_to_the_same_frames_as_slicing_the_whole_chunk(path):
    for codec, blob in _chunks(path)[:3]:
        whole = decode(blob, codec)
        for lo, hi in ((0, 10), (len(whole) // 3, len(whole) // 2), (len(whole) - 7, len(whole) - 1)):
            assert decode(blob, codec, t_from=whole[lo].t, t_to=whole[hi].t) == whole[lo:hi + 1]
    frames = _members_frames()
    blob = encode(frames)
    whole = decode(blob)
    assert decode(blob, t_from=whole[100].t, t_to=whole[250].t) == whole[100:251]


def _rewrite_members(blob: bytes, change) -> bytes:
    doc = json.loads(zlib.decompress(blob))
    change(doc["c"]["p.members"])
    return zlib.compress(json.dumps(doc).encode())


@pytest.mark.parametrize("change", [
    lambda m: m["i"][5].append(10 ** 6),          # an index past the table
    lambda m: m["i"][5].append("0"),              # not an index
    lambda m: m["u"].append([1, 2, 3]),           # a table row of the wrong width
    lambda m: m.pop("u"),                          # no table
    lambda m: m.__setitem__("i", m["i"][:-1]),    # rows missing
])
def test_a_damaged_members_table_is_one_clear_error(change):
    blob = _rewrite_members(encode(_members_frames()[:40]), change)
    with pytest.raises(RecordingError, match="corrupt"):
        decode(blob)


def test_store_extend_is_add_frame_by_frame():
    frames = list(RecordingReader(str(V1_COLS2)).frames()) + _members_frames()[:50]
    for start, m, cap in ((0, 240, 1200), (300, 300, 400), (5, 50, 60), (0, 100, 30)):
        a, b = Store(cap), Store(cap)
        for f in frames[:start]:
            a.add(f)
            b.add(f)
        part = frames[start:start + m]
        for f in part:
            a.add(f)
        b.extend(part)
        assert a.keys() == b.keys() and a.times() == b.times()
        assert all(a.window(k) == b.window(k) for k in a.keys())
        assert a.latest is b.latest and a.frames_seen == b.frames_seen and len(a) == len(b)


def test_a_single_sample_encodes_to_the_same_bytes_by_the_short_path():
    from traintop.record import codec

    frames = _members_frames()[:30] + list(RecordingReader(str(V1_COLS2)).frames())[:30]
    for f in frames:
        row = codec._row(f)
        assert codec.encode([f]) == codec._encode_rows([row], [f.t])


def _one_second_writer(path, info, **kw):
    clock = [0.0]

    def tick():
        clock[0] += 1.0
        return clock[0]
    return RecordingWriter(path, info, clock=lambda: clock[0], **kw), tick


def test_the_writer_merges_its_one_second_chunks_into_what_encode_makes(tmp_path):
    sim = Simulator("starved", gpus=2, interval=1.0, seed=5)
    frames = [sim.next_frame() for _ in range(130)]
    path = str(tmp_path / "m.ttrec")
    w, tick = _one_second_writer(path, sim.info(), chunk_frames=50)
    for f in frames:
        tick()
        w.add(f)  # a small chunk committed every sample, merged every 50
    w.close()
    rows = sqlite3.connect(path).execute("SELECT n, data FROM chunks ORDER BY t0").fetchall()
    assert [n for n, _ in rows] == [50, 50, 30]
    assert [bytes(d) for _, d in rows] == [encode(frames[0:50]), encode(frames[50:100]), encode(frames[100:])]
    assert list(RecordingReader(path).frames()) == decode(encode(frames))


def test_the_writer_keeps_no_samples_once_committed(tmp_path):
    from traintop.samples import Frame

    sim = Simulator("starved", gpus=2, interval=1.0, seed=6)
    w, tick = _one_second_writer(str(tmp_path / "k.ttrec"), sim.info(), chunk_frames=600)
    for _ in range(40):
        tick()
        w.add(sim.next_frame())
    held = [x for v in vars(w).values() for x in (v if isinstance(v, (list, tuple, dict)) else [v])
            if isinstance(x, Frame)]
    assert held == []  # they live in the file, not in memory, until the chunk is merged
    w.close()


def test_merge_of_chunks_is_encode_of_their_samples():
    from traintop.record.codec import merge

    frames = _members_frames()[:90]
    parts = [frames[0:1], frames[1:30], frames[30:31], frames[31:90]]
    assert merge([encode(p) for p in parts]) == encode(frames)


def test_members_that_seldom_repeat_stay_plain_lists():
    frames = list(RecordingReader(str(FIX / "training-phases-probe-10hz.ttrec")).frames())[::5][:600]
    doc = json.loads(zlib.decompress(encode(frames)))
    assert isinstance(doc["c"]["p.members"], list)  # a table and indices would take more bytes
    assert decode(encode(frames)) == decode(encode(decode(encode(frames))))


def _store_state(store: Store):
    return (store.keys(), store.times(), {k: store.window(k) for k in store.keys()}, store.latest,
            store.frames_seen, len(store))


@pytest.mark.parametrize("path", [V1_COLS2, FIX / "training-phases-probe-10hz.ttrec", FIX / "ddp-2rank.ttrec",
                                  FIX / "fault-10hz.ttrec", FIX / "cluster-node0.ttrec", "simulated"])
def test_a_chunk_decoded_into_series_fills_the_store_as_its_frames_do(path, tmp_path):
    """A seek decodes straight into the store's series: the same keys, in the same order, the same
    values and gaps, the same last sample, ended process and probe time as frames would give."""
    from traintop.record import codec
    from traintop.watch.monitor import Monitor

    if path == "simulated":  # 8 GPUs, a probed rank each, loader workers, a process that ends
        sim = Simulator("starved,healthy,idle", gpus=8, interval=0.5, seed=6)
        frames = [sim.next_frame() for _ in range(700)]
        frames[650:] = [dataclasses.replace(f, process=dataclasses.replace(f.process, alive=False))
                        for f in frames[650:]]
        frames[10:20] = [dataclasses.replace(f, ranks=()) for f in frames[10:20]]
        chunks = [(codec.CODEC, encode(frames[:400])), (codec.CODEC, encode(frames[400:]))]
    else:
        chunks = _chunks(path)[:4]
    assert chunks
    for name, blob in chunks:
        whole = decode(blob, name)
        n = len(whole)
        for lo, hi in ((0, n - 1), (0, 10), (n // 3, n // 2), (n - 7, n - 1), (n // 2, n // 2)):
            t_from, t_to = whole[lo].t, whole[hi].t
            frames = decode(blob, name, t_from=t_from, t_to=t_to)
            window = codec.decode_series(blob, name, t_from=t_from, t_to=t_to)
            assert window.times == [f.t for f in frames]
            for capacity in (1200, 7):  # 7: a chunk longer than the ring, taken in ring-sized pieces
                a = Monitor(None, store=Store(capacity))
                b = Monitor(None, store=Store(capacity))
                warm = whole[:lo]  # what the store held before (a chunk played before this one)
                if warm:
                    for m in (a, b):
                        m.store.extend(warm)
                a.ingest_many(frames)
                b.ingest_series(window)
                assert _store_state(a.store) == _store_state(b.store), capacity
                assert (a.ended_at, a.probe_seen_at) == (b.ended_at, b.probe_seen_at)
