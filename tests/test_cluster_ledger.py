"""Where each job's time went across hosts: the agents' per-rank time-ledger counters, through a real
Prometheus, summed per job in `analyze --prometheus`."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from traintop.cluster.exporter import HostCollector, HostState, RankLabels
from traintop.cluster.metrics_server import MetricsServer
from traintop.samples import Frame, GpuInfo, GpuSample

INFOS = (GpuInfo(0, "NVIDIA H200", uuid="GPU-0"),)


def _state(host: str, elapsed: float, job: str, shares: dict) -> HostState:
    labels = RankLabels(job=job, rank="0", local_rank="0", world_size="1")
    return HostState(host, frame=Frame(t=time.time(), gpus=(GpuSample(0, util=90.0),)), gpus=INFOS,
                     ledger=tuple((labels, b, v * elapsed) for b, v in shares.items()))


def test_the_ledger_counters_carry_job_rank_and_bucket_and_nothing_else():
    coll = HostCollector(_state("node-a", 10.0, "j1", {"train": 0.7, "checkpoint": 0.3}))
    reg = CollectorRegistry(auto_describe=False)
    reg.register(coll)
    text = generate_latest(reg).decode()
    lines = [ln for ln in text.splitlines() if ln.startswith("traintop_rank_time_seconds_total{")]
    assert len(lines) == 2 and all('job="j1"' in ln and 'Hostname="node-a"' in ln for ln in lines)
    assert any('bucket="checkpoint"' in ln and ln.endswith(" 3.0") for ln in lines)


@pytest.mark.system
def test_each_jobs_goodput_through_a_real_prometheus():
    from test_cluster_prometheus import start_prometheus

    shares = {"a": ("ckpt-job", {"train": 0.7, "checkpoint": 0.25, "input": 0.05}),
              "b": ("fed-job", {"train": 0.95, "input": 0.05})}
    colls, servers = {}, []
    for host, (job, sh) in shares.items():
        coll = colls[host] = HostCollector(_state(f"node-{host}", 0.0, job, sh))
        reg = CollectorRegistry(auto_describe=False)
        reg.register(coll)
        server = MetricsServer("127.0.0.1", 0, reg)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    stop = threading.Event()
    t0 = time.monotonic()

    def tick():  # each agent's counters grow with the wall time, split as its job spends it
        while not stop.wait(0.5):
            for host, (job, sh) in shares.items():
                colls[host].publish(_state(f"node-{host}", time.monotonic() - t0, job, sh))
    threading.Thread(target=tick, daemon=True).start()
    tmp = tempfile.mkdtemp(prefix="traintop-ledger-")
    prom, url = start_prometheus({"traintop": [f"127.0.0.1:{s.server_port}" for s in servers]}, os.path.join(tmp, "p"))
    try:
        deadline = time.monotonic() + 90
        rows = []
        while time.monotonic() < deadline:
            time.sleep(2)
            r = subprocess.run([sys.executable, "-m", "traintop", "analyze", "--prometheus", url, "--since", "60s",
                                "--json"], capture_output=True, text=True, timeout=60)
            if r.returncode == 0:
                rows = json.loads(r.stdout).get("ledger", [])
                if len(rows) == 2 and min(row["rank_hours"] for row in rows) > 0.002:
                    break
        by_job = {row["job"]: row for row in rows}
        assert set(by_job) == {"ckpt-job", "fed-job"}
        assert by_job["ckpt-job"]["goodput"] == pytest.approx(0.70, abs=0.02)
        assert by_job["ckpt-job"]["buckets"]["checkpoint"]["share"] == pytest.approx(0.25, abs=0.02)
        assert by_job["fed-job"]["goodput"] == pytest.approx(0.95, abs=0.02)
        text = subprocess.run([sys.executable, "-m", "traintop", "analyze", "--prometheus", url, "--since", "60s"],
                              capture_output=True, text=True, timeout=60).stdout
        assert "Where each job's time went" in text and "job ckpt-job: goodput 70 %" in text
    finally:
        stop.set()
        for s in servers:
            s.shutdown()
        prom.terminate()
        prom.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
