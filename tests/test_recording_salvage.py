"""A recording cut short (a full disk, a copy stopped half way) is read as far as SQLite can still
read it: chunk by chunk, with what was lost said by analyze and the replay."""

import pathlib
import re
import subprocess
import sys

import pytest

from traintop.watch import sessions
from traintop.reports.analyze import analyze, render_text
from traintop.collectors.simulated import Simulator
from traintop.record.recording import RecordingReader, RecordingWriter

H200 = pathlib.Path(__file__).parent / "fixtures" / "h200" / "training-phases-probe-10hz.ttrec"


@pytest.fixture(scope="module")
def long_recording(tmp_path_factory):
    """An hour of a starving job as traintop's writer records it (24 chunks of 300 samples; the
    chunks' b-tree pages lie through the whole file, so each cut keeps some of them)."""
    path = str(tmp_path_factory.mktemp("rec") / "long.ttrec")
    sim = Simulator("starved", seed=5)
    writer = RecordingWriter(path, sim.info())
    for f in sim.frames(7200):
        writer.add(f)
    writer.close()
    return path


def _cut(path, tmp_path, share: float) -> str:
    data = pathlib.Path(path).read_bytes()
    cut = tmp_path / f"cut-{int(share * 100)}.ttrec"
    cut.write_bytes(data[:int(len(data) * share)])
    return str(cut)


@pytest.mark.parametrize("share", [0.25, 0.5, 0.9])
def test_a_cut_recording_gives_what_sqlite_can_still_read_and_says_what_was_lost(long_recording, tmp_path, share):
    """It was refused whole ("database disk image is malformed") though a damaged chunk is meant
    to cost only itself."""
    whole = RecordingReader(long_recording)
    every = {f.t: f for f in whole.frames()}
    cut = _cut(long_recording, tmp_path, share)
    reader = RecordingReader(cut)
    assert reader.salvaged and reader.cut is not None and reader.cut[0] < reader.cut[1]
    frames = list(reader.frames())
    assert 0 < len(frames) < len(every)
    assert all(f.t in every and f.gpus == every[f.t].gpus for f in frames)  # what is read is what was recorded
    read = sorted(f.t for f in frames)
    lost = reader.lost()
    for a, b in zip(read, read[1:]):  # every gap in what was read is a span said lost
        if b - a > 2.5 * whole.info.interval:
            assert any(x <= a + 1e-6 and b - 1e-6 <= y for x, y in lost), (a, b, lost)

    report = analyze(RecordingReader(cut))
    text = render_text(report)
    assert report.samples == len(frames)
    assert "the file is cut short" in text and "is lost with the end of the file" in text
    if lost:
        assert "no samples could be read from" in text
    assert any(f.rule == "starvation" for f in report.findings)  # the rules judged what is left
    from traintop.reports.analyze import damage_summary

    assert "It is cut short: nothing after" in damage_summary(sessions.replay_session(cut).feed.reader)


@pytest.mark.parametrize("share", [0.5, 0.9])
def test_a_real_h200_recording_cut_short_keeps_its_readable_chunks(tmp_path, share):
    cut = _cut(H200, tmp_path, share)
    r = subprocess.run([sys.executable, "-m", "traintop", "analyze", cut], capture_output=True, text=True, timeout=120)
    if share == 0.5:  # every chunk's bytes lie past the cut: nothing to report, said in one line
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "cut short" in r.stderr
        assert "none of its 4 chunk(s) could be read" in r.stderr
        return
    assert r.returncode == 0, r.stderr
    assert "1814 samples" in r.stdout and "1 of 4 chunk(s) could not be read" in r.stdout
    assert "no samples could be read from 2 min 01 s to 3 min 01 s" in r.stdout


def test_a_cut_recording_replays_in_a_terminal_saying_what_was_lost(long_recording, tmp_path):
    from terminal import Terminal

    cut = _cut(long_recording, tmp_path, 0.5)
    with Terminal(["replay", cut], 160, 48, home=str(tmp_path)) as term:
        top = term.wait_for(lambda s: "It is cut short: nothing after 25 min 00 s." in s, "the banner saying what was lost")
        assert "Traceback" not in top
        term.press("q")
        assert term.wait_exit() == 0


@pytest.mark.parametrize("share", [0.31, 0.63])
def test_a_cut_recording_counts_each_chunk_once(tmp_path, share):
    """A real 10-minute H200 recording cut at a third: the rows read past a damaged page are each one
    chunk (they were read again and again: "none of its 33331 chunk(s)" for a file of 21), and a
    file with no readable sample says so in one line."""
    src = pathlib.Path(__file__).parent / "fixtures" / "corpus" / "long_compiled-probe.ttrec"
    whole = RecordingReader(str(src)).chunk_total
    cut = _cut(str(src), tmp_path, share)
    r = RecordingReader(cut)
    ids = [c[0] for c in r._chunks]
    assert len(ids) == len(set(ids)) and r.chunk_total <= whole, (r.chunk_total, whole)
    out = subprocess.run([sys.executable, "-m", "traintop", "analyze", cut], capture_output=True, text=True,
                         timeout=120)
    assert "Traceback" not in out.stderr
    counts = [int(x) for x in re.findall(r"(\d+) chunk\(s\)", out.stdout + out.stderr)]
    assert counts and max(counts) <= whole, out.stdout + out.stderr
