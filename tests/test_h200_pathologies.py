"""Pathologies provoked on an H200 (bench/workloads/pathologies.py), recorded by traintop at 10 Hz
with nvidia-smi --query-gpu -lms 100 and dmon logging beside it (scripts/h200_pathologies.sh).

Each recording yields its finding at 10 Hz and downsampled to 1 Hz; the nvidia-smi logs of the same
runs yield no warning (they lack the fields that show these problems: GPM, processes, probe, XIDs).
"""

import dataclasses
import json
import pathlib

import pytest

from test_h200_recordings import alerts_for as alerts

from traintop.sources.importers import load as import_log
from traintop.record.recording import RecordingReader
from traintop.rules import Severity

FIX = pathlib.Path(__file__).parent / "fixtures" / "h200"

# recording -> (rule, severity, words the evidence must contain)
EXPECTED = {
    "small_kernels": ("underuse", Severity.WARNING, "SMs were active only 2 %"),
    "pcie": ("pcie", Severity.WARNING, "copies count as busy"),
    "fragmentation": ("fragmentation", Severity.INFO, "in split blocks"),
    "other": ("other_process", Severity.WARNING, "beside the job"),
    "fault": ("gpu_errors", Severity.WARNING, "XID 31"),
}


def frames_of(name):
    r = RecordingReader(str(FIX / f"{name}-10hz.ttrec"))
    return r.info, list(r.frames())


def at_1hz(frames):
    """One frame a second, as a 1-Hz recorder would have seen it: point samples of the fast fields,
    no utilization window, and any XID of the second reported on its tick."""
    out, xid = [], None
    for k, f in enumerate(frames):
        xid = next((g.xid for g in f.gpus if g.xid is not None), xid)
        if k % 10 == 0:
            out.append(dataclasses.replace(f, gpus=tuple(dataclasses.replace(
                g, util_min=None, util_max=None, xid=xid if g.index == 0 else g.xid) for g in f.gpus)))
            xid = None
    return out


@pytest.mark.parametrize("rate", ["10Hz", "1Hz"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_recording_yields_its_finding(name, rate):
    info, frames = frames_of(name)
    if rate == "1Hz":
        frames = at_1hz(frames)
    rule, severity, words = EXPECTED[name]
    found = alerts(info, frames)
    hit = [a for a in found if a.rule == rule]
    assert hit, f"{rule} not raised from {name} at {rate}: {[(a.rule, a.evidence) for a in found]}"
    assert hit[0].severity == severity and words in hit[0].evidence
    # and nothing else at warning level: one problem, one explanation
    others = {a.rule for a in found if a.severity >= Severity.WARNING and a.rule != rule}
    assert others == set(), others


def test_gpm_separates_busy_from_useful_on_the_h200():
    _, frames = frames_of("small_kernels")
    util = [g.util for f in frames for g in f.gpus if g.util is not None]
    sm = [g.sm_active for f in frames for g in f.gpus if g.sm_active is not None]
    assert sum(util) / len(util) > 85 and max(sm) <= 5  # "busy", yet 2 % of the SMs at work
    _, frames = frames_of("other")  # a real bf16 matmul loop beside it
    sm = [g.sm_active for f in frames[-300:] for g in f.gpus if g.sm_active is not None]
    assert sum(sm) / len(sm) > 80


def test_pcie_traffic_measured_by_gpm_matches_the_job():
    job = json.loads((FIX / "pcie.jsonl").read_text().splitlines()[-1])  # what the copies achieved
    _, frames = frames_of("pcie")
    rx = sorted(g.pcie_rx for f in frames for g in f.gpus if g.pcie_rx)
    steady = rx[len(rx) // 2]  # median over the run
    assert abs(steady / 1e9 - job["gbps"]) / job["gbps"] < 0.1


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_nvidia_smi_logs_of_the_same_runs_raise_no_warning(name):
    for log in (f"{name}-smi-100ms.csv.gz", f"{name}-dmon.txt"):
        imported = import_log(str(FIX / log))
        found = alerts(imported.info, list(imported.frames()))
        assert not [a for a in found if a.severity >= Severity.WARNING], (log, [a.evidence for a in found])
