"""Recorded on an H200: each phase of a real training run yields its finding, at 10 Hz and at 1 Hz.

The run (bench/workloads/train_phases.py): healthy bf16 training, data-starved (2 loader workers
with slow CPU transforms), tiny batches, a leak (outputs kept in a list), idle. Phase times come
from the job's own log (phases.jsonl).
"""

import dataclasses
import json
import pathlib

import pytest

from traintop.watch.monitor import Monitor
from traintop.record.recording import RecordingReader
from traintop.rules import Severity

FIX = pathlib.Path(__file__).parent / "fixtures" / "h200"

# phase -> rule expected to be active at some point inside the phase (None: no warning expected)
EXPECTED = {"healthy": "power_cap", "starved": "starvation", "underused": "underuse", "leak": "memory_creep",
            "idle": "idle_gpu"}


RUNS = {  # two runs of the same job on an H200: traintop attached by PID; launched with the probe
    "attached": ("training-phases-10hz.ttrec", "phases.jsonl"),
    "probe": ("training-phases-probe-10hz.ttrec", "phases-probe.jsonl"),
}


def load(run="attached"):
    rec, phases = RUNS[run]
    r = RecordingReader(str(FIX / rec))
    frames = list(r.frames())
    marks = [json.loads(x) for x in (FIX / phases).read_text().splitlines() if x.strip()]
    bounds = {}
    for m in marks:
        bounds.setdefault(m["phase"], [None, None])[0 if m["event"] == "start" else 1] = m["t"]
    return r.info, frames, bounds


def point_sampled_1hz(frames):
    return [dataclasses.replace(f, gpus=tuple(dataclasses.replace(g, util_min=None, util_max=None)
                                              for g in f.gpus)) for f in frames[::10]]


def alerts_for(info, frames):
    mon = Monitor(info)
    for f in frames:
        mon.ingest(f)
    mon.engine.close_all(frames[-1].t)
    return mon.engine.alerts


@pytest.mark.parametrize("run", sorted(RUNS))
@pytest.mark.parametrize("rate", ["10Hz", "1Hz"])
def test_each_phase_yields_its_finding(rate, run):
    info, frames, bounds = load(run)
    if rate == "1Hz":
        frames = point_sampled_1hz(frames)
    alerts = alerts_for(info, frames)
    for phase, rule in EXPECTED.items():
        lo, hi = bounds[phase]
        hits = [a for a in alerts if a.rule == rule and a.start <= hi + 2 and (a.end or 1e18) >= lo]
        assert hits, f"{rule} not raised during the {phase} phase at {rate}"


@pytest.mark.parametrize("run", sorted(RUNS))
@pytest.mark.parametrize("rate", ["10Hz", "1Hz"])
def test_healthy_training_raises_no_warning(rate, run):
    info, frames, bounds = load(run)
    lo, hi = bounds["healthy"]
    frames = [f for f in frames if f.t <= hi]
    if rate == "1Hz":
        frames = point_sampled_1hz(frames)
    warnings = [a for a in alerts_for(info, frames) if a.severity >= Severity.WARNING]
    assert warnings == []


def test_collector_agreed_with_nvidia_smi_on_the_h200():
    """What scripts/check_against_nvidia_smi.py printed there, read back and checked."""
    rows = [line.split() for line in (FIX / "compare.txt").read_text().splitlines()[1:] if line.strip()]
    assert rows
    for _, _, field, ours, smi in rows:
        ours, smi = float(ours), float(smi)
        tol = {"utilization.gpu": 2, "memory.used": 1, "memory.total": 1, "power.draw": 5,
               "power.limit": 0.5, "temperature.gpu": 1, "clocks.sm": 150, "clocks.mem": 1}[field]
        assert abs(ours - smi) <= tol, (field, ours, smi)


def test_measured_input_wait_matches_the_idle_gpu():
    """In the starved phase the job's own wait for data mirrors the GPU's idle share."""
    info, frames, bounds = load("probe")
    lo, hi = bounds["starved"]
    seg = [f for f in frames if lo + 5 <= f.t <= hi]
    waits = [r.input_wait for f in seg for r in f.ranks if r.input_wait is not None]
    util = sum(f.gpus[0].util for f in seg) / len(seg)
    wait = sum(waits) / len(waits)
    assert 0.2 < wait < 0.6
    assert abs(wait - (1 - util / 100)) < 0.1
