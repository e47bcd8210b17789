"""Who holds idle GPUs: the agent's owner series (user, job, pod from /proc), through a real
Prometheus, to `analyze --prometheus`'s report."""

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fakes import fake_proc

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


def test_processes_are_grouped_by_owner_and_each_process_read_once(tmp_path):
    for pid in (11, 12, 13):  # 21 has no /proc entry here: another PID namespace's
        fake_proc(tmp_path, pid, start=pid)
    asked = []
    now = [0.0]

    def lookup(pid, gpu_process, nested):
        asked.append(pid)
        return OWNERS[pid]
    owners = GpuOwners(lookup=lookup, clock=lambda: now[0], nested=False, proc=str(tmp_path))
    rows = owners.of(_frame())
    # (gpu, user, uid, hpc_job, claimed_job, pod_uid, claimed_pod, claimed_namespace, container, bytes, SM %)
    assert rows == ((0, "alice", "1000", "4242", "", "", "", "", "", 16 * GiB, None),
                    (0, "bob", "1001", "", "", "", "trainer-0", "ml", "ab" * 6, 4 * GiB, 3.0),
                    (1, "", "", "", "", "", "", "", "", 30 * GiB, 93.0))  # another PID namespace's: held, by someone unseen
    owners.of(_frame())
    assert sorted(asked) == [11, 12, 13, 21]  # looked up once
    now[0] = 61.0
    owners.of(Frame(t=0.0, gpus=(GpuSample(0, processes=(GpuProcess(11, GiB), GpuProcess(21, GiB))),)))
    assert asked.count(11) == 1 and asked.count(21) == 2  # a live process is kept; one not seen from here rechecked
    assert set(owners._known) == {11, 21}  # the gone ones forgotten
    fake_proc(tmp_path, 11, start=99)  # PID 11 is another process now
    owners.of(Frame(t=0.0, gpus=(GpuSample(0, processes=(GpuProcess(11, GiB),)),)))
    assert asked.count(11) == 2


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
    assert 'claimed_pod="trainer-0"' in text and 'claimed_namespace="ml"' in text and 'uid="1001"' in text
    names = set(__import__("re").findall(r'[{,]([A-Za-z_]+)="', text))
    assert "pod" not in names and "namespace" not in names  # the processes' word is named a claim
    assert "pid" not in text.replace("pipe", "")
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
        assert "Who holds idle GPUs" in text and "user alice, Slurm job 4242:" in text
        assert "pod ml/trainer-0 (its own claim)" in text
        _the_view_groups_what_prometheus_holds(url)
    finally:
        stop.set()
        server.shutdown()
        prom.terminate()
        prom.wait(10)
        __import__("shutil").rmtree(tmp, ignore_errors=True)


def _held_data():
    """n1 GPU 0 idle, held by alice's job 4242 (15 GiB) and bob's pod (5 GiB); n1 GPU 1 busy, job 4242;
    n2 GPU 0 idle and nobody's; an hour at 10 s."""
    grid = [float(t) for t in range(0, 3600, 10)]
    d = ClusterData("x", 0.0, 3590.0, 10.0, grid)
    for h, i, u in (("n1", 0, 0.0), ("n1", 1, 0.9), ("n2", 0, 0.0)):
        d.gpus[(h, i)] = GpuData(h, i, util={t: u for t in grid}, mem_used={t: 20 * GiB for t in grid})
    alice, bob = OwnerLabels("alice", "4242", "", "", ""), OwnerLabels("bob", "", "trainer-0", "ml", "")
    d.owners[("n1", 0)] = [(alice, {t: 15 * GiB for t in grid}), (bob, {t: 5 * GiB for t in grid})]
    d.owners[("n1", 1)] = [(alice, {t: 20 * GiB for t in grid})]
    return d


def test_gpus_grouped_by_job_and_by_user_with_the_reports_idle_gpu_hours():
    from traintop.cluster.groups import group_lines, held_of

    d = _held_data()
    held = held_of(d)
    util = {k: g.util[max(g.util)] for k, g in d.gpus.items()}
    jobs = group_lines(held, util, "job")
    assert [(g.name, g.gpus, g.hosts) for g in jobs] == [("4242", 2, 1), ("ml/trainer-0", 1, 1)]
    assert jobs[0].util == pytest.approx(0.45) and jobs[0].mem_held == 35 * GiB
    # the same GPU-hours as the report's "who holds idle GPUs": one formula
    report = {r["job"] or r["pod"]: r["gpu_hours"] for r in idle_held(d)}
    assert jobs[0].idle_hours == pytest.approx(report["4242"], abs=1e-4) and jobs[0].idle_hours > 0.7
    assert jobs[1].idle_hours == pytest.approx(report["trainer-0"], abs=1e-4)
    users = group_lines(held, util, "user")
    assert [(g.name, g.gpus) for g in users] == [("alice", 2), ("bob", 1)]
    assert group_lines(held, util, "user", hosts={"n2"}) == ()


def _snapshot_app(snap):
    from traintop.app.cluster import ClusterApp

    class Shown(ClusterApp):
        def on_mount(self) -> None:
            super().on_mount()
            self.show_snapshot(snap)
    return Shown(lambda: snap, url="http://prometheus:9090", poll=False)


async def _groupings(snap, size):
    """The GPU list's text by host, by job, by user, and by host again (u each time), and the status line."""
    from traintop.app.cluster import ClusterStatus
    from traintop.widgets.cluster_panels import HostsBody

    app = _snapshot_app(snap)
    out = []
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        for _ in range(4):
            out.append((str(app.query_one(HostsBody).render()), app.query_one(ClusterStatus).text.plain))
            await pilot.press("u")
            await pilot.pause()
    return out


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
def test_the_cluster_view_groups_by_job_and_by_user_and_shows_names_as_text(size):
    from traintop.cluster.snapshot import snapshot_from

    d = _held_data()
    evil = OwnerLabels("[bold]x[/]\x1b[2J", "[red]9\x07", "", "", "")
    d.owners[("n2", 0)] = [(evil, {t: GiB for t in d.grid})]
    views = asyncio.run(_groupings(snapshot_from(d, []), size))
    (by_host, s0), (by_job, s1), (by_user, s2), (again, _) = views
    assert "n1" in by_host and "by job" not in s0 and "by job" in s1 and "by user" in s2 and again == by_host
    assert "4242" in by_job and "ml/trainer-0" in by_job and "2 GPUs" in by_job and "GPU-h" in by_job
    assert "[red]9\\x07" in by_job, by_job
    assert "alice" in by_user and "bob" in by_user and "[bold]x[/]\\x1b[2J" in by_user, by_user
    assert "\x1b" not in by_job + by_user and "\x07" not in by_job


def _the_view_groups_what_prometheus_holds(url):
    """`traintop cluster`'s reads of the owner series: the rolling window keeps what one full read
    gives, and its snapshot groups the GPUs by job and by user."""
    from traintop.cluster.fetch import fetch_grid
    from traintop.cluster.groups import group_lines
    from traintop.cluster.promapi import Prometheus
    from traintop.cluster.rolling import RollingCluster, window_grid
    from traintop.cluster.snapshot import PrometheusSource

    now = time.time() - 3  # instants whose scrapes are all in
    with Prometheus(url) as prom, Prometheus(url) as prom_full:
        rolling = RollingCluster(prom, None, window=60, step=1.0)
        rolling.read(now - 4)
        kept = rolling.read(now)  # a refresh: only the instants since the last read
        full = fetch_grid(prom_full, window_grid(now, 60, 1.0), now)
    assert rolling.full_reads == 1 and kept.owners == full.owners and len(full.owners[("node-o", 0)]) == 2
    source = PrometheusSource(url, window=60)
    try:
        source()
        snap = source()
    finally:
        source.close()
    util = {(g.host, g.index): g.util for g in snap.gpus}
    jobs = {g.name: g for g in group_lines(snap.held, util, "job")}
    assert set(jobs) == {"4242", "ml/trainer-0", ""}
    assert (jobs["4242"].gpus, jobs["4242"].mem_held) == (1, 16 * GiB) and jobs["4242"].idle_hours > 0
    assert jobs["4242"].idle_hours == pytest.approx(4 * jobs["ml/trainer-0"].idle_hours, rel=0.1)
    assert jobs[""].idle_hours == 0 and jobs[""].util > 0.5  # GPU 1 is busy: held, not idle
    users = {g.name: g.gpus for g in group_lines(snap.held, util, "user")}
    assert users == {"alice": 1, "bob": 1, "": 1}
    for size in ((80, 24), (160, 48)):
        (by_host, _), (by_job, _), (by_user, _), _ = asyncio.run(_groupings(snap, size))
        assert "node-o" in by_host and "4242" in by_job and "(no job)" in by_job and "alice" in by_user


def test_grouped_by_job_each_job_shows_its_ranks_goodput():
    from traintop.cluster.snapshot import snapshot_from

    d = _held_data()
    d.ledger = {"4242": {"train": 700.0, "checkpoint": 250.0, "input": 50.0}}  # the agents' ledgers, summed
    snap = snapshot_from(d, [])
    assert dict(snap.goodput) == {"4242": pytest.approx(0.70)}
    views = asyncio.run(_groupings(snap, (160, 48)))
    by_job = views[1][0]
    line = next(ln for ln in by_job.splitlines() if ln.startswith("4242"))
    assert "goodput 70%" in line
    assert "goodput" not in next(ln for ln in by_job.splitlines() if ln.startswith("ml/trainer-0"))
