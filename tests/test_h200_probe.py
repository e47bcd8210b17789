"""Recorded on H200s: the probe injected by `traintop run`, attach by PID, and two-rank DDP."""

import json
import pathlib
import statistics
import bisect

from traintop.recording import RecordingReader

FIX = pathlib.Path(__file__).parent / "fixtures" / "h200"


def frames(name):
    return list(RecordingReader(str(FIX / name)).frames())


def test_probe_agrees_with_what_the_job_printed():
    fs = [f for f in frames("probe-run.ttrec") if f.ranks]
    times = [f.t for f in fs]
    diffs = []
    for line in (FIX / "probe-run-memory.jsonl").read_text().splitlines():
        row = json.loads(line)
        i = min(max(bisect.bisect_left(times, row["t"]), 0), len(fs) - 1)
        r = fs[i].ranks[0]
        diffs.append(abs(r.reserved - row["reserved"]) / row["reserved"])
    assert len(diffs) > 200
    assert statistics.median(diffs) < 0.01  # the same allocator, read a fraction of a second apart


def test_attach_by_pid_found_the_probe_and_confirmed_starvation():
    fs = frames("attach-starved-probe.ttrec")
    assert any(f.ranks and f.ranks[0].cuda for f in fs)
    alerts = RecordingReader(str(FIX / "attach-starved-probe.ttrec")).alerts()
    starv = [a for a in alerts if a.rule == "starvation"]
    assert starv and "measured in the job" in starv[0].evidence and "loader workers" in starv[0].evidence


def test_ddp_two_ranks_on_two_gpus():
    fs = frames("ddp-2rank.ttrec")
    ranks = {r.rank: r for f in fs for r in f.ranks if r.cuda}
    assert set(ranks) == {0, 1}
    assert {ranks[0].device, ranks[1].device} == {0, 1}
    assert all(r.world_size == 2 for r in ranks.values())
    assert max(r.steps for f in fs for r in f.ranks if r.cuda) > 1000


def test_probe_overhead_was_under_half_a_percent():
    d = json.loads((FIX / "probe-overhead.json").read_text())
    assert d["device"] == "NVIDIA H200" and d["median_ratio"] < 1.005


def test_recording_size_claimed_in_the_readme():
    """README: a 10 Hz H200 session with host, process and probe data takes about 33 bytes a sample."""
    path = FIX / "training-phases-probe-10hz.ttrec"
    n = RecordingReader(str(path)).frame_count
    assert 25 <= path.stat().st_size / n <= 40
