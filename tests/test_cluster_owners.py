"""Who holds idle GPUs: the agent's owner series (user, job, pod from /proc), through a real
Prometheus, to `analyze --prometheus`'s report."""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from traintop.cluster.exporter import HostCollector, HostState
from traintop.cluster.fetch import ClusterData, GpuData, OwnerLabels
from traintop.cluster.metrics_server import MetricsServer
from traintop.cluster.owners import GpuOwners
from traintop.cluster.report import idle_held
from traintop.collectors.whose import Owner
from traintop.samples import Frame, GpuInfo, GpuProcess, GpuSample

GiB = 2**30


def _frame(util0=0.0):
    return Frame(t=time.time(), gpus=(
        GpuSample(0, util=util0, mem_used=20 * GiB, processes=(GpuProcess(11, 12 * GiB), GpuProcess(12, 4 * GiB),
                                                               GpuProcess(13, 4 * GiB, 3.0))),
        GpuSample(1, util=95.0, mem_used=30 * GiB, processes=(GpuProcess(21, 30 * GiB, 93.0),))))


OWNERS = {11: Owner(11, uid=1000, user="alice", slurm_job="4242", job_from="cgroup"),
          12: Owner(12, uid=1000, user="alice", slurm_job="4242", job_from="cgroup"),
          13: Owner(13, uid=1001, user="bob", pod="trainer-0", namespace="ml", container="ab" * 32),
          21: Owner(21, visible=False)}


def test_processes_are_grouped_by_owner_and_each_pid_read_once_a_minute():
    asked = []
    now = [0.0]

    def lookup(pid, gpu_process, nested):
        asked.append(pid)
        return OWNERS[pid]
    owners = GpuOwners(lookup=lookup, clock=lambda: now[0], nested=False)
    rows = owners.of(_frame())
    assert rows == ((0, "alice", "4242", "", "", "", 16 * GiB, None),
                    (0, "bob", "", "trainer-0", "ml", "ab" * 6, 4 * GiB, 3.0),
                    (1, "", "", "", "", "", 30 * GiB, 93.0))  # another PID namespace's: held, by someone unseen
    owners.of(_frame())
    assert sorted(asked) == [11, 12, 13, 21]  # looked up once
    now[0] = 61.0
    owners.of(Frame(t=0.0, gpus=(GpuSample(0, processes=(GpuProcess(11, GiB),)),)))
    assert asked.count(11) == 2 and set(owners._known) == {11}  # again after a minute; the gone ones forgotten


def _exposition(state):
    reg = CollectorRegistry(auto_describe=False)
    reg.register(HostCollector(state))
    return generate_latest(reg).decode()


def test_the_owner_series_carry_no_pid():
    infos = (GpuInfo(0, "NVIDIA H200", uuid="GPU-0"), GpuInfo(1, "NVIDIA H200", uuid="GPU-1"))
    rows = GpuOwners(lookup=lambda pid, **_: OWNERS[pid], nested=False).of(_frame())
    text = _exposition(HostState("node-o", frame=_frame(), gpus=infos, owners=rows))
    held = [line for line in text.splitlines() if line.startswith("traintop_gpu_owner_memory_bytes{")]
    assert len(held) == 3 and 'user="alice"' in held[0] and 'hpc_job="4242"' in held[0]
    assert 'pod="trainer-0"' in text and 'namespace="ml"' in text and "pid" not in text.replace("pipe", "")
    assert any(line.startswith("traintop_gpu_owner_sm_ratio{") and line.endswith(" 0.93") for line in text.splitlines())


def test_idle_gpu_hours_are_shared_by_what_each_owner_holds():
    grid = [float(t) for t in range(0, 3600, 10)]
    d = ClusterData("x", 0.0, 3600.0, 10.0, grid)
    idle = GpuData("n1", 0, util={t: 0.0 if t < 1800 else 0.9 for t in grid}, mem_used={t: 20 * GiB for t in grid})
    d.gpus[("n1", 0)] = idle
    alice, bob = OwnerLabels("alice", "4242", "", "", ""), OwnerLabels("bob", "", "trainer-0", "ml", "")
    d.owners[("n1", 0)] = [(alice, {t: 15 * GiB for t in grid}), (bob, {t: 5 * GiB for t in grid})]
    rows = idle_held(d)
    assert [(r["user"], r["job"], r["pod"]) for r in rows] == [("alice", "4242", ""), ("bob", "", "trainer-0")]
    assert rows[0]["gpu_hours"] == pytest.approx(0.375) and rows[1]["gpu_hours"] == pytest.approx(0.125)
    assert rows[0]["gpus"] == ["n1 GPU 0"]


@pytest.mark.skipif(__import__("shutil").which("prometheus") is None, reason="no prometheus binary")
def test_who_holds_idle_gpus_through_a_real_prometheus():
    from test_cluster_prometheus import start_prometheus

    infos = (GpuInfo(0, "NVIDIA H200", uuid="GPU-0"), GpuInfo(1, "NVIDIA H200", uuid="GPU-1"))
    rows = GpuOwners(lookup=lambda pid, **_: OWNERS[pid], nested=False).of(_frame())
    coll = HostCollector(HostState("node-o", frame=_frame(), gpus=infos, owners=rows))
    reg = CollectorRegistry(auto_describe=False)
    reg.register(coll)
    server = MetricsServer("127.0.0.1", 0, reg)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stop = threading.Event()

    def refresh():  # a live agent publishes a new frame every tick
        while not stop.wait(0.5):
            coll.publish(HostState("node-o", frame=_frame(), gpus=infos, owners=rows))
    threading.Thread(target=refresh, daemon=True).start()
    tmp = tempfile.mkdtemp(prefix="traintop-owners-")
    prom, url = start_prometheus({"traintop": [f"127.0.0.1:{server.server_port}"]}, os.path.join(tmp, "p"))
    try:
        deadline = time.monotonic() + 60
        report = {}
        while time.monotonic() < deadline:
            time.sleep(2)
            r = subprocess.run([sys.executable, "-m", "traintop", "analyze", "--prometheus", url, "--since", "60s",
                                "--json"], capture_output=True, text=True, timeout=60)
            if r.returncode == 0:
                report = json.loads(r.stdout)
                if len(report.get("idle_held", [])) == 2 and report["idle_held"][0]["gpu_hours"] > 0.005:
                    break
        held = report["idle_held"]
        assert [(h["user"], h["job"], h["pod"], h["namespace"]) for h in held] == \
            [("alice", "4242", "", ""), ("bob", "", "trainer-0", "ml")]
        assert held[0]["gpu_hours"] == pytest.approx(4 * held[1]["gpu_hours"], rel=0.1)  # 16 GiB to 4 GiB (to 4 decimals)
        assert held[0]["gpus"] == ["node-o GPU 0"]  # GPU 1 is busy: nobody holds it idle
        text = subprocess.run([sys.executable, "-m", "traintop", "analyze", "--prometheus", url, "--since", "60s"],
                              capture_output=True, text=True, timeout=60).stdout
        assert "Who holds idle GPUs" in text and "user alice, job 4242:" in text and "pod ml/trainer-0" in text
    finally:
        stop.set()
        server.shutdown()
        prom.terminate()
        prom.wait(10)
        __import__("shutil").rmtree(tmp, ignore_errors=True)
