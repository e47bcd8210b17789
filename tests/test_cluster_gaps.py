"""Gaps in Prometheus's data, through a real Prometheus: two hosts' series backfilled with
promtool (sample times chosen here, no wall-clock waits) as agents scraped every 5 s would
leave them. Prometheus itself down for 30 s (no host has a sample: no stall, no lost node, a
note), nodeB's agent down for 150 s and back (a node that stopped reporting, remembered after
it came back), and a real stall of the job (still found)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from test_cluster_prometheus import start_prometheus

PROMTOOL = shutil.which("promtool")
if shutil.which("prometheus") is None or PROMTOOL is None:
    pytest.skip("no prometheus or promtool (scripts/test installs Debian's prometheus package where it runs as "
                "root with apt)", allow_module_level=True)

SCRAPE_S = 5
SPAN_S = 600
PROM_DOWN = (120, 150)  # no sample from any host
B_DOWN = (200, 350)  # no sample from nodeB
STALL = (420, 500)  # every rank's step counter flat
T0 = (int(time.time()) // 3600 - 2) * 3600  # hours back: within the retention, before Prometheus's head


def _steps(t: int) -> float:
    moving = min(t, STALL[0]) + max(0, t - STALL[1])
    return 10.0 * moving


def _openmetrics() -> str:
    lines = []
    hosts = {"nodeA": 0, "nodeB": 1}

    def family(name: str, labels_of, value_of):
        lines.append(f"# TYPE {name} gauge")
        for host, rank in hosts.items():
            labels = labels_of(host, rank)
            for t in range(0, SPAN_S + 1, SCRAPE_S):
                if PROM_DOWN[0] <= t < PROM_DOWN[1] or (host == "nodeB" and B_DOWN[0] <= t < B_DOWN[1]):
                    continue
                lines.append(f"{name}{{{labels}}} {value_of(t)} {T0 + t + 0.2 * rank}")

    def gpu(host, rank):
        return (f'gpu="0",UUID="GPU-{host}",modelName="NVIDIA H200",Hostname="{host}",'
                f'instance="127.0.0.1:1950{rank + 1}",job="traintop"')

    def rank_(host, rank):
        return (f'job="sim",rank="{rank}",local_rank="0",world_size="2",uid="1000",Hostname="{host}",'
                f'instance="127.0.0.1:1950{rank + 1}"')

    family("traintop_agent_info", lambda h, r: f'Hostname="{h}",mode="simulate",version="0",'
           f'instance="127.0.0.1:1950{r + 1}",job="traintop"', lambda t: 1)
    family("traintop_gpu_utilization_ratio", gpu, lambda t: 0.97)
    family("traintop_gpu_sm_clock_hertz", gpu, lambda t: 1.98e9)
    family("traintop_gpu_sm_clock_max_hertz", gpu, lambda t: 1.98e9)
    family("traintop_steps_total", rank_, _steps)
    family("traintop_step_seconds", rank_, lambda t: 0.1)
    return "\n".join(lines + ["# EOF", ""])


@pytest.fixture(scope="module")
def backfilled():
    tmp = tempfile.mkdtemp(prefix="traintop-gaps-")
    prom = None
    try:
        src = os.path.join(tmp, "series.om")
        with open(src, "w") as f:
            f.write(_openmetrics())
        data = os.path.join(tmp, "p", "data")
        os.makedirs(data)
        subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", src, data], check=True,
                       capture_output=True, timeout=120)
        prom, url = start_prometheus({}, os.path.join(tmp, "p"))
        yield url
    finally:
        if prom is not None:
            prom.terminate()
            try:
                prom.wait(10)
            except subprocess.TimeoutExpired:
                prom.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def analyze(url, until: float, since: float) -> dict:
    r = subprocess.run([sys.executable, "-m", "traintop", "analyze", "--prometheus", url, "--since", f"{since:g}s",
                        "--until", f"{T0 + until}", "--json"], capture_output=True, text=True, timeout=60)
    assert r.stdout, r.stderr
    return json.loads(r.stdout)


def rel(f: dict, key: str) -> float:
    return f[key] - T0


def test_a_prometheus_outage_is_a_gap_in_the_data_not_a_stall_nor_lost_nodes(backfilled):
    report = analyze(backfilled, PROM_DOWN[0] + 70, 180)  # ends 40 s after (as the user's trial), before nodeB's
    rules = [(f["rule"], f["host"]) for f in report["findings"]]
    assert "stalled_job" not in {r for r, _ in rules} and "node_missing" not in {r for r, _ in rules}, rules
    (note,) = [n for n in report["notes"] if "no data from any host" in n]
    # from the last sample before (115 s) to the first after (150 s), told from the range's start (10 s)
    assert "between 1 min 45 s and 2 min 20 s" in note and "35 s" in note, note
    assert report["gpu_hours_lost"] == 0


def test_a_node_outage_stays_in_the_report_after_the_node_came_back(backfilled):
    while_down = analyze(backfilled, 300, 600)
    (f,) = [f for f in while_down["findings"] if f["rule"] == "node_missing"]
    assert f["host"] == "nodeB" and abs(rel(f, "start") - (B_DOWN[0] - SCRAPE_S)) <= SCRAPE_S
    after = analyze(backfilled, 400, 600)  # nodeB reports again since 350 s
    (f,) = [f for f in after["findings"] if f["rule"] == "node_missing"]
    assert f["host"] == "nodeB" and "job sim" in f["evidence"] and "came back" in f["evidence"]
    assert abs(rel(f, "start") - (B_DOWN[0] - SCRAPE_S)) <= SCRAPE_S and abs(rel(f, "end") - B_DOWN[1]) <= SCRAPE_S
    assert "150 s without it" in f["evidence"] or "155 s without it" in f["evidence"], f["evidence"]
    # nodeA ran on: the job did not stall while nodeB was away (its rank 0 stepped)
    assert "stalled_job" not in {f["rule"] for f in after["findings"]}


def test_a_real_stall_is_still_found_and_only_over_its_own_time(backfilled):
    report = analyze(backfilled, SPAN_S, SPAN_S)
    (stall,) = [f for f in report["findings"] if f["rule"] == "stalled_job"]
    assert STALL[0] - SCRAPE_S <= rel(stall, "start") and rel(stall, "end") <= STALL[1] + 2 * SCRAPE_S, stall
    assert stall["gpu_hours_lost"] > 0
    assert [f["host"] for f in report["findings"] if f["rule"] == "node_missing"] == ["nodeB"]
    assert any("no data from any host" in n for n in report["notes"])
