"""`traintop agent`: its /metrics through prometheus-client, labels, units, bounded series,
a textfile for node_exporter, a probe's ranks appearing and going, a stuck scraper."""

import json
import os
import re
import socket
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from traintop.cluster import series as S
from traintop.cluster.agent import HostAgent, is_loopback, parse_listen, serve
from traintop.collectors.node import AgentSampler, AllProbes
from traintop.errors import TraintopError
from traintop.watch.sessions import simulated_session


def start_agent(*args, env=None):
    """A real agent process on a free loopback port; returns (process, [metrics URLs])."""
    p = subprocess.Popen([sys.executable, "-m", "traintop", "agent", "--listen", "127.0.0.1:0", *args],
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                         env=dict(os.environ, **(env or {})))
    urls = []
    hosts = int(args[args.index("--hosts") + 1]) if "--hosts" in args else 1
    while len(urls) < hosts:
        line = p.stderr.readline()
        if not line:
            raise AssertionError(f"agent exited: {p.wait()}")
        m = re.search(r"(http://\S+/metrics)", line)
        if m:
            urls.append(m.group(1))
    return p, urls


def scrape(url):
    text = httpx.get(url, timeout=5).text
    return {f.name: f for f in text_string_to_metric_families(text)}, text


def samples(fams, name):
    base = name[:-6] if name.endswith("_total") else name
    fam = fams.get(base) or fams.get(name)
    return [s for s in fam.samples if s.name == name] if fam else []


def test_agent_serves_base_units_dcgm_labels_and_bounded_series():
    p, (url,) = start_agent("--simulate", "starved", "--gpus", "2", "--hostname", "node-a", "--straggler", "1",
                            env={"SLURM_JOB_ID": "4242"})
    try:
        time.sleep(2.5)
        fams, text = scrape(url)
    finally:
        p.terminate()
        p.wait(5)
    util = samples(fams, "traintop_gpu_utilization_ratio")
    assert len(util) == 2
    assert set(util[0].labels) == set(S.GPU_LABELS)
    assert {s.labels["gpu"] for s in util} == {"0", "1"}
    assert all(s.labels["Hostname"] == "node-a" and s.labels["modelName"] == "NVIDIA H200" for s in util)
    assert all(re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:00\.0", s.labels["pci_bus_id"]) for s in util)
    assert all(0 <= s.value <= 1 for s in util)  # ratios, not percent
    clock = samples(fams, "traintop_gpu_sm_clock_hertz")
    assert all(s.value > 1e8 for s in clock)  # hertz, not MHz
    step = samples(fams, "traintop_step_seconds")
    assert {(s.labels["job"], s.labels["rank"], s.labels["local_rank"], s.labels["world_size"]) for s in step} \
        == {("4242", "0", "0", "2"), ("4242", "1", "1", "2")}
    straggler = {s.labels["rank"]: s.value for s in step}
    assert straggler["1"] > 1.5 * straggler["0"]
    assert samples(fams, "traintop_steps_total")
    # MFU of the steps over their training and input time, against the H200's bf16 peak: the simulated
    # steps compute at SIM_MFU, and rank 0 (starved) waits 62 % of each iteration for its batch
    from traintop.collectors.simulated import SIM_MFU

    assert {s.value for s in samples(fams, "traintop_rank_peak_flops")} == {989.5e12}
    assert all(s.value > 0 for s in samples(fams, "traintop_rank_flops_total"))
    mfu = {s.labels["rank"]: s.value for s in samples(fams, "traintop_rank_mfu_ratio")}
    assert mfu["0"] == pytest.approx(SIM_MFU * (1 - 0.62), rel=0.15)
    assert mfu["1"] < 0.8 * mfu["0"]  # the straggler's steps take longer for the same FLOPs
    # labelled as every rank series (a job_uid of the host's name and no Hostname were seen on an H200)
    ledger_labels = {tuple(sorted((k, v) for k, v in s.labels.items() if k != "bucket"))
                     for s in samples(fams, "traintop_rank_time_seconds_total")}
    for name in ("traintop_rank_mfu_ratio", "traintop_rank_flops_total", "traintop_rank_peak_flops"):
        assert {tuple(sorted(s.labels.items())) for s in samples(fams, name)} <= ledger_labels, name
    active = samples(fams, "traintop_finding_active")
    assert any(s.labels["rule"] == "starvation" and s.labels["subject"] == "gpu0" for s in active)
    assert {"rule", "severity", "subject", "Hostname"} == set(active[0].labels)
    assert "starvation" in {s.labels["rule"] for s in samples(fams, "traintop_gpu_seconds_lost_total")}
    # Bounded cardinality: no PIDs or command lines in any label; the documented count per GPU and rank.
    assert "pid" not in text.lower() and "python" not in text
    per_gpu = sum(1 for f in fams.values() for s in f.samples if s.labels.get("gpu") == "0")
    assert per_gpu <= S.series_per_gpu()
    per_rank = sum(1 for f in fams.values() for s in f.samples if s.labels.get("rank") == "0")
    assert per_rank == S.series_per_rank() - 1  # a bf16 job has no GradScaler: no skipped-steps series
    assert not samples(fams, "traintop_steps_skipped_total")
    for f in fams.values():
        assert f.name.startswith("traintop_")
        if f.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in f.samples)


def test_one_process_poses_as_several_hosts_of_one_job():
    p, urls = start_agent("--simulate", "healthy", "--gpus", "2", "--hosts", "3", "--hostname", "sim",
                          "--job", "j1", "--interval", "1")
    try:
        time.sleep(1.5)
        seen = [scrape(u)[0] for u in urls]
    finally:
        p.terminate()
        p.wait(5)
    hosts = [{s.labels["Hostname"] for s in samples(f, "traintop_gpu_power_watts")} for f in seen]
    assert hosts == [{"sim-000"}, {"sim-001"}, {"sim-002"}]
    ranks = sorted(int(s.labels["rank"]) for f in seen for s in samples(f, "traintop_step_seconds"))
    assert ranks == list(range(6))
    assert {s.labels["world_size"] for f in seen for s in samples(f, "traintop_step_seconds")} == {"6"}


def test_textfile_is_written_atomically_without_a_port(tmp_path):
    r = subprocess.run([sys.executable, "-m", "traintop", "agent", "--simulate", "healthy", "--textfile",
                        str(tmp_path), "--duration", "2.5", "--interval", "0.5"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "http://" not in r.stderr  # no port opened
    assert os.listdir(tmp_path) == ["traintop.prom"]  # no temporary file left behind
    fams = {f.name: f for f in text_string_to_metric_families((tmp_path / "traintop.prom").read_text())}
    assert samples(fams, "traintop_gpu_power_watts")


@pytest.mark.parametrize("listen, hosts", [("bad:port", "1"), ("65535", "3")])
def test_a_bad_listen_is_its_one_line_before_anything_starts(monkeypatch, capsys, listen, hosts):
    """No NVML line ("no NVIDIA GPU here ... serving the host") before the refusal: the options
    are checked before a session starts."""
    from traintop.cli import main
    from traintop.cluster import agent

    def started(args):
        raise AssertionError("a session started before --listen was checked")

    monkeypatch.setattr(agent, "build_hosts", started)
    assert main(["agent", "--listen", listen, "--simulate", "healthy", "--hosts", hosts]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("traintop: --listen") and "Traceback" not in err[0]


def test_listen_beyond_loopback_warns_once(capsys):
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    assert parse_listen("0.0.0.0:9") == ("0.0.0.0", 9) and parse_listen("[::1]:7") == ("::1", 7)
    with pytest.raises(TraintopError):
        parse_listen("host:port")
    said = []
    session = simulated_session("healthy", history_s=0)
    h = HostAgent("h", session, None)
    servers = serve([h], "0.0.0.0:0", said.append)
    for s in servers:
        s.shutdown()
    assert len([m for m in said if "warning" in m]) == 1
    said.clear()
    servers = serve([h], "127.0.0.1:0", said.append)
    for s in servers:
        s.shutdown()
    assert not [m for m in said if "warning" in m]


def test_a_stuck_scraper_does_not_stop_sampling():
    session = simulated_session("healthy", history_s=0, interval=0.1)
    monitor = session.monitor
    h = HostAgent("h", session, None)
    (server,) = serve([h], "127.0.0.1:0", lambda m: None)
    port = server.server_port
    stuck = socket.create_connection(("127.0.0.1", port))
    stuck.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finishes its request
    try:
        h.start()
        time.sleep(0.3)
        before = monitor.store.frames_seen
        time.sleep(0.6)
        assert monitor.store.frames_seen > before
        assert "traintop_gpu_power_watts" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        stuck.close()
        server.shutdown()
        h.stop()


def test_a_probe_appears_with_its_job_and_its_series_go_when_it_stops(tmp_path, monkeypatch):
    from traintop.injob.agent import Probe

    monkeypatch.setenv("TRAINTOP_PROBE_DIR", str(tmp_path / "probes"))
    monkeypatch.setenv("SLURM_JOB_ID", "987")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "8")
    probe = Probe(interval=0.05)
    assert probe.start()
    # only this test's directory (run as root, the agent would also read every user's)
    probes = AllProbes(lambda: [str(tmp_path / "probes")])

    class NoGpu:
        def next_frame(self):
            from traintop.samples import Frame
            return Frame(t=time.time())

        def close(self):
            pass

    sampler = AgentSampler(NoGpu(), probes)
    try:
        deadline = time.time() + 5
        ranks = ()
        while not ranks and time.time() < deadline:
            time.sleep(0.1)
            ranks = sampler.next_frame().ranks
        assert [(r.rank, r.local_rank, r.world_size, r.job) for r in ranks] == [(3, 1, 8, "987")]
        probe.stop()
        time.sleep(0.1)
        assert sampler.next_frame().ranks == ()
    finally:
        probe.stop()
        sampler.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make directories of other users")
def test_root_reads_every_users_probe_directory_and_never_lists_tmp(monkeypatch, tmp_path):
    """Root reads /run/user/UID/traintop and /tmp/traintop-UID of every user with a process here,
    each owned by that user; /tmp is never listed (anyone can fill it), and a directory named for
    one user but made by another is not that user's."""
    from traintop.collectors import node

    own, proc, run, tmp = (tmp_path / n for n in ("own", "proc", "run", "tmp"))
    for d in (own, proc, run, tmp):
        d.mkdir()
    monkeypatch.setenv("TRAINTOP_PROBE_DIR", str(own))
    monkeypatch.setattr(node.os, "geteuid", lambda: 1000)
    assert node.probe_dirs(str(proc), str(run), str(tmp)) == [str(own)]
    monkeypatch.setattr(node.os, "geteuid", lambda: 0)

    def made(path, uid):
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, uid, uid)

    made(proc / "12", 1000)  # processes of 1000 and 1001; 1002 is logged in (its runtime directory)
    made(proc / "13", 1001)
    (proc / "self").mkdir()
    made(run / "1002" / "traintop", 1002)
    made(tmp / "traintop-1000", 1000)
    made(tmp / "traintop-1001", 1000)  # 1000 took 1001's name: not 1001's directory
    made(tmp / "traintop-1003", 1003)  # nobody of 1003 runs here: no probe of theirs either
    assert node.probe_dirs(str(proc), str(run), str(tmp)) == [str(own), str(tmp / "traintop-1000"),
                                                               str(run / "1002" / "traintop")]


def test_on_finding_runs_the_command_with_json_and_never_blocks(tmp_path):
    from traintop.watch.hooks import FindingHook

    out, go = tmp_path / "events", tmp_path / "go"
    # The command waits until the test says go: were submit() to wait for it, the test would hang.
    hook = FindingHook(f"{sys.executable} -c \"import os,sys,time\n"
                       f"while not os.path.exists(r'{go}'): time.sleep(0.02)\n"
                       f"open(r'{out}','a').write(sys.stdin.read())\"")
    for i in range(3):
        hook.submit({"event": "start", "rule": "starvation", "subject": f"gpu{i}"})
    go.write_text("")
    hook.close(wait=20)
    events = [json.loads(line) for line in out.read_text().splitlines()]
    assert [e["subject"] for e in events] == ["gpu0", "gpu1", "gpu2"]


def test_only_gpus_serves_one_gpu_and_the_ranks_on_it():
    from traintop.samples import Frame, GpuSample, RankSample

    class Two:
        def next_frame(self):
            return Frame(t=1.0, gpus=(GpuSample(0, util=10.0), GpuSample(1, util=90.0)), stale_gpus=(1,))

        def close(self):
            pass

    class Ranks:
        def ranks(self):
            return (RankSample(pid=1, rank=0, device=0), RankSample(pid=2, rank=1, device=1))

        def close(self):
            pass

    f = AgentSampler(Two(), Ranks(), only=frozenset({1})).next_frame()
    assert [g.index for g in f.gpus] == [1] and f.stale_gpus == (1,)
    assert [r.rank for r in f.ranks] == [1]
    assert len(AgentSampler(Two(), Ranks()).next_frame().ranks) == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_root_accepts_another_users_private_probe_directory_as_that_user(tmp_path):
    from traintop.injob.agent import private_dir_problem

    d = tmp_path / "u1000"
    d.mkdir(mode=0o700)
    os.chown(d, 1000, 1000)
    assert "another user" in private_dir_problem(str(d))
    assert private_dir_problem(str(d), owner=1000) is None
    os.chmod(d, 0o755)
    assert "open to others" in private_dir_problem(str(d), owner=1000)


def test_an_agent_that_reads_no_gpu_says_so_once_and_serves_whether_gpus_are_unread():
    """This machine has no NVML: the agent says why in one line, and its series say that no GPU
    went unread (a CPU node); a node with NVIDIA hardware NVML cannot read says 1."""
    from traintop.cluster.agent import gpu_note
    from traintop.cluster.exporter import HostState

    p = subprocess.Popen([sys.executable, "-m", "traintop", "agent", "--listen", "127.0.0.1:0", "--hostname", "cpu-a"],
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        lines = []
        while not any("/metrics" in line for line in lines):
            line = p.stderr.readline()
            assert line, f"agent exited: {p.wait()} {lines}"
            lines.append(line)
        url = re.search(r"(http://\S+/metrics)", lines[-1]).group(1)
        notes = [line for line in lines if "NVIDIA GPU" in line]
        if not notes:
            pytest.skip("NVML reads GPUs on this machine")
        assert len(notes) == 1 and notes[0].startswith("traintop: cpu-a: ")
        fams, _ = scrape(url)
        (s,) = samples(fams, "traintop_gpus_unreadable")
        assert s.value in (0.0, 1.0) and s.labels == {"Hostname": "cpu-a"}
        assert (s.value == 1.0) == ("cannot read" in notes[0])
    finally:
        p.terminate()
        p.wait(10)

    class Unread:
        gpu_problem, gpus_unreadable = "NVML could not start (Insufficient Permissions)", True

    session = simulated_session("healthy", gpus=1, interval=0.5)
    monitor = session.monitor
    session.feed.source = Unread()
    session.kind = "live"  # posing as a live agent's session
    h = HostAgent("gpu-b", session, None)
    note = gpu_note(h)
    assert "NVIDIA GPUs that NVML cannot read (NVML could not start (Insufficient Permissions))" in note
    from traintop.cluster.exporter import HostCollector
    fam = next(f for f in HostCollector(HostState("gpu-b", gpus_unreadable=True)).collect()
               if f.name == "traintop_gpus_unreadable")
    assert [x.value for x in fam.samples] == [1]
    assert not [f for f in HostCollector(HostState("sim")).collect() if f.name == "traintop_gpus_unreadable"]
    monitor.close()


def test_nvidia_hardware_is_seen_without_nvml(tmp_path):
    from traintop.collectors.node import nvidia_hardware_present

    assert not nvidia_hardware_present(str(tmp_path))
    dev = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:17:00.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x10de\n")
    (dev / "class").write_text("0x068000\n")  # an NVSwitch bridge: no GPU
    assert not nvidia_hardware_present(str(tmp_path))
    (dev / "class").write_text("0x030200\n")  # a 3D controller: an H200
    assert nvidia_hardware_present(str(tmp_path))


def test_metrics_only_a_bare_port_is_loopback_and_half_sent_requests_do_not_pile_up():
    from traintop.cluster.metrics_server import MetricsServer

    assert parse_listen("19401") == ("127.0.0.1", 19401) and parse_listen(":7") == ("127.0.0.1", 7)
    session = simulated_session("healthy", history_s=0)
    h = HostAgent("h", session, None)
    srv = MetricsServer("127.0.0.1", 0, h.registry, max_connections=4, connection_s=1.0).start()
    held = []
    try:
        base = f"http://127.0.0.1:{srv.server_port}"
        assert httpx.get(base + "/metrics", timeout=5).status_code == 200
        for path in ("/", "/metrics/../etc", "/favicon.ico", "/debug"):
            assert httpx.get(base + path, timeout=5).status_code == 404
        for _ in range(40):  # slow-loris: requests that never end
            s = socket.create_connection(("127.0.0.1", srv.server_port))
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            held.append(s)
        time.sleep(0.3)
        assert srv.open_connections <= 4  # the others were closed at once
        for _ in range(100):  # bounded: each connection has 1 s in all here
            if srv.open_connections == 0:
                break
            time.sleep(0.1)
        assert srv.open_connections == 0
        assert httpx.get(base + "/metrics", timeout=5).status_code == 200  # served again
    finally:
        for s in held:
            s.close()
        srv.shutdown()
