"""Recorded on H200s: the probe injected by `traintop run`, attach by PID, and two-rank DDP."""

import json
import pathlib
import statistics
import bisect

from traintop.record.recording import RecordingReader

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


def test_recording_size_claimed_in_the_docs():
    """docs/RECORDING.md: real H200 sessions take 3-8 bytes per GPU-sample for the GPU data and 10-26 bytes with
    host, process and probe data, with the current codec, as recorded (10 Hz) and at 2 Hz."""
    from traintop.record.codec import encode
    from traintop.samples import Frame

    for name in ("training-phases-probe-10hz.ttrec", "other-10hz.ttrec", "pcie-10hz.ttrec", "ddp-2rank.ttrec"):
        reader = RecordingReader(str(FIX / name))
        frames = list(reader.frames())
        gpus = max(len(f.gpus) for f in frames)
        for rate in ((1, 5) if reader.info.interval <= 0.15 else (1,)):  # 10 Hz, and thinned to 2 Hz
            fs = frames[::rate]
            chunks = [fs[i:i + 600] for i in range(0, len(fs), 600)]
            everything = sum(len(encode(c)) for c in chunks) / len(fs) / gpus
            gpu_only = sum(len(encode([Frame(t=f.t, gpus=f.gpus) for f in c])) for c in chunks) / len(fs) / gpus
            assert 3 <= gpu_only <= 8.5 and 9 <= everything <= 26.5, (name, rate, gpu_only, everything)
