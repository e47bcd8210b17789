"""Multi-GPU and stall cases recorded on two H200s (scripts/h200_ddp_cases.sh): what the recordings
hold, measured. Each case was recorded at 10 Hz twice at once: by `traintop run` (the probe in
every rank) and by a second traintop attached to the job's PID that saw no probe; nvidia-smi
--query-gpu -lms 100 and dmon -s puct logged beside them.
"""

import gzip
import json
import pathlib
import statistics

import pytest

from traintop.importers import load as import_log
from traintop.recording import RecordingReader

FIX = pathlib.Path(__file__).parent / "fixtures" / "h200"
CASES = ["ddp-straggler", "ddp-balanced", "ddp-stall", "loader-hang", "pageable", "ddp-starved-rank"]


def frames(name, probe=True):
    r = RecordingReader(str(FIX / f"{name}{'' if probe else '-noprobe'}-10hz.ttrec"))
    return list(r.frames())


def median(fs, gpu, field, t_from=None, t_to=None):
    v = [getattr(g, field) for f in fs for g in f.gpus
         if g.index == gpu and getattr(g, field) is not None
         and (t_from is None or f.t >= t_from) and (t_to is None or f.t <= t_to)]
    return statistics.median(v)


def events(name):
    return [json.loads(line) for line in (FIX / f"{name}.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", CASES)
def test_every_case_has_both_recordings_and_both_logs(name):
    with_probe, without = frames(name), frames(name, probe=False)
    assert len(with_probe) > 400 and len(without) > 400
    assert any(f.ranks for f in with_probe) and not any(f.ranks for f in without)
    for log in (f"{name}-smi-100ms.csv.gz", f"{name}-dmon.txt.gz"):
        imported = import_log(str(FIX / log))
        assert len(list(imported.frames())) > 40


def test_straggler_the_waiting_gpu_spins_busy_at_low_power():
    fs = frames("ddp-straggler")
    start = next(e["t"] for e in events("ddp-straggler") if e["event"] == "start") + 5
    # GPU 0 (the fast rank) waits in the all-reduce: "busy", a third of its power, few SMs
    assert median(fs, 0, "util", start) > 90 and median(fs, 0, "power_w", start) < 300
    assert median(fs, 0, "sm_active", start) < 35
    # GPU 1 (the slow rank, 0.25 s of CPU per step) mostly idles
    assert median(fs, 1, "util", start) < 20
    ranks = {r.rank: r for f in fs for r in f.ranks if r.rank is not None and r.step_time}
    assert ranks[0].step_time == pytest.approx(ranks[1].step_time, rel=0.05)  # DDP: the same steps


def test_balanced_ddp_both_gpus_busy_at_full_power():
    fs = frames("ddp-balanced")
    start = next(e["t"] for e in events("ddp-balanced") if e["event"] == "start") + 5
    for gpu in (0, 1):
        assert median(fs, gpu, "util", start) > 90 and median(fs, gpu, "sm_active", start) > 80
        assert median(fs, gpu, "power_w", start) > 600


def test_stall_the_waiting_gpu_reads_full_utilization_at_idle_power():
    fs = frames("ddp-stall")
    stall = next(e["t"] for e in events("ddp-stall") if e["event"] == "stall")
    assert median(fs, 0, "util", stall + 5) == 100 and median(fs, 0, "sm_active", stall + 5) <= 2
    assert median(fs, 0, "power_w", stall + 5) < 150
    assert median(fs, 1, "util", stall + 5) == 0
    steps = {r.steps for f in fs if f.t > stall + 2 for r in f.ranks if r.rank is not None}
    assert len(steps) == 1  # nobody steps once it hangs


def _dumps(name):
    with gzip.open(FIX / f"{name}-probe.jsonl.gz", "rt") as fh:
        return [m for m in map(json.loads, fh) if "stacks" in m]


def test_the_probes_dumped_where_each_rank_hangs():
    dumps = _dumps("ddp-stall")
    by = {(m["rank"], m["stacks_reason"]): m for m in dumps}
    assert {(0, "requested"), (1, "requested"), (0, "stalled"), (1, "stalled")} <= set(by)
    assert by[(0, "stalled")]["since_step"] >= 30  # on its own, after 30 s without a step
    assert "stop.item()" in by[(0, "stalled")]["stacks"][0]["stack"]  # rank 0 waits on the all-reduce
    assert "time.sleep(args.stall_s)" in by[(1, "stalled")]["stacks"][0]["stack"]  # rank 1 hangs


def test_a_hung_loader_worker_leaves_the_job_waiting_in_the_loader():
    dumps = _dumps("loader-hang")
    stalled = [m for m in dumps if m["stacks_reason"] == "stalled"]
    assert stalled and "not_empty.wait" in stalled[0]["stacks"][0]["stack"]
    ev = events("loader-hang")
    hang, end = ev[0]["hang_after"], ev[-1]["t"]
    assert "timed out" in ev[-1]["error"]
    fs = frames("loader-hang")
    waits = [r.input_wait for f in fs if hang + 5 < f.t < end - 1 for r in f.ranks if r.input_wait is not None]
    assert len(waits) > 300 and min(waits) > 0.95  # waiting for the batch the hung worker holds


def test_pageable_copies_run_far_below_the_link():
    fs = frames("pageable")
    job = events("pageable")[-1]
    rx = median(fs, 0, "pcie_rx", fs[0].t + 10, fs[-1].t - 3)
    assert abs(rx / 1e9 - job["gbps"]) / job["gbps"] < 0.15  # GPM saw what the job moved
    assert rx < 0.2 * 63e9  # a fraction of the Gen5 x16 link
    assert median(fs, 0, "sm_active", fs[0].t + 10) <= 2


def test_starved_rank_only_rank_1_waits_for_its_loader():
    fs = frames("ddp-starved-rank")
    late = [r for f in fs[300:] for r in f.ranks if r.rank is not None and r.input_wait is not None]
    wait = {k: statistics.median(r.input_wait for r in late if r.rank == k) for k in (0, 1)}
    assert wait[1] > 0.5 and wait[0] < 0.05
