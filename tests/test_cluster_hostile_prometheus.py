"""A hostile Prometheus, and hosts and ranks that lie (issue 23): every read is bounded as a
whole (bytes, series, time, nesting), every number is range-checked, and two sources claiming
one host or one rank are findings, never merged. Hostile servers are tiny HTTP servers on
127.0.0.1 (tests/hostile_prometheus.py); the forged host and rank go through a real Prometheus."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from hostile_prometheus import HostileServer
from traintop.cluster.agent import rank_series
from traintop.cluster.promapi import Grid, Prometheus
from traintop.errors import TraintopError
from traintop.samples import RankSample


def analyze(url, *args, timeout=120):
    return subprocess.run([sys.executable, "-m", "traintop", "analyze", "--prometheus", url, "--since", "5m", *args],
                          capture_output=True, text=True, timeout=timeout)


def one_line_error(r, *words):
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    for w in words:
        assert w in r.stderr, r.stderr


@pytest.fixture
def server():
    started = []

    def start(mode, **kw):
        s = HostileServer(mode, **kw).start()
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def test_deeply_nested_json_is_one_line(server):
    one_line_error(analyze(server("deep").url), "nested too deeply")


def test_series_are_counted_across_every_query_of_a_report(server):
    one_line_error(analyze(server("many", series=199_999).url), "series for one report")


def test_bytes_are_counted_across_every_query_of_a_read(server):
    s = server("big", mib=0.6)
    g = Grid(0.0, 1.0, 60)
    with Prometheus(s.url) as prom:
        assert prom.query_grid("x", g)  # one answer alone is well under every limit
        with prom.read_budget(1 << 20, 10**6, "one refresh"):
            prom.query_grid("x", g)
            with pytest.raises(TraintopError, match="more than 1 MiB for one refresh"):
                prom.query_grid("y", g)
        assert prom.query_grid("z", g)  # the next read has its own budget


def test_points_are_counted_before_decoding(server):
    s = server("big", mib=0.5)  # about 25 000 points on the grid
    g = Grid(0.0, 1.0, 60)
    with Prometheus(s.url) as prom, prom.read_budget(1 << 30, 10**6, "one report", max_points=10_000):
        with pytest.raises(TraintopError, match="more than 10 000 points for one report"):
            prom.query_grid("x", g)


def _ends(call, limit=60.0):
    """Run ``call`` on a thread; the exception it ended with (None: it returned), or a failure when it hangs."""
    out = []

    def run():
        try:
            call()
            out.append(None)
        except Exception as e:  # noqa: BLE001 - what it ended with is the result
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit)
    assert out, "the call did not end"
    return out[0]


@pytest.mark.parametrize("mode", ["slow", "slow_headers"])
def test_a_server_sending_a_byte_at_a_time_meets_the_whole_query_deadline(server, mode):
    s = server(mode, pause=0.25)  # every read returns within httpx's per-read timeout
    prom = Prometheus(s.url, timeout=2.0)
    try:
        e = _ends(lambda: prom.query_grid("x", Grid(0.0, 1.0, 300)))
    finally:
        prom.close()
    assert isinstance(e, TraintopError) and "did not answer in time" in str(e)


def test_absurd_values_are_read_as_unknown(server):
    r = analyze(server("absurd").url, "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    text = analyze(server("absurd").url).stdout
    for out in (r.stdout, text):
        assert not re.search(r"\d{25,}", out), "a 309-digit XID or a 120-digit rank reached the report"
        assert "inf" not in out.lower().replace("info", "")
    assert not [f for f in report["findings"] if f["rule"] == "stalled_job"]
    gpus = [g for h in report["hosts"] for g in h["gpus"]]
    assert sorted(g["index"] for g in gpus) == [0, 1]  # GPU 9999… dropped
    assert all(g["util_mean"] is None and g["temp_peak"] is None for g in gpus)
    assert all("rank 5 of" not in f["evidence"] for f in report["findings"])
    notes = " ".join(report["notes"])
    assert "plausible range" in notes and "rank not below its world size" in notes
    assert "100000 %" not in text


def test_a_prometheus_without_traintop_series_is_told_by_the_option_of_the_command_that_asked(server, monkeypatch,
                                                                                              capsys):
    from traintop import cli

    s = server("empty")
    one_line_error(analyze(s.url), "no traintop series", "try a longer --since")
    monkeypatch.setattr(cli, "has_terminal", lambda: True)  # past the check for a terminal, to Prometheus
    assert cli.main(["cluster", "--prometheus", s.url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no traintop series" in err and "try a longer --window" in err, err
    assert "--since" not in err  # `traintop cluster` has no such option


def test_bad_ranges_and_urls_are_one_line(server):
    url = server("ok").url
    one_line_error(analyze(url, "--step", "nan"), "finite")
    one_line_error(analyze(url, "--until", "inf"), "finite")
    one_line_error(analyze(url, "--since", "1w", "--step", "0.001"), "at most 11000")
    one_line_error(analyze("http://user:pw@[::1"), "not a URL")


def test_two_claims_of_one_rank_on_a_host_are_exported_for_neither_and_are_findings():
    mine = RankSample(pid=10, rank=0, world_size=2, job="1234", uid=1000)
    theirs = RankSample(pid=11, rank=0, world_size=2, job="1234", uid=1001)
    other = RankSample(pid=12, rank=1, world_size=2, job="1234", uid=1000)
    ranks, claims = rank_series((mine, theirs, other), None)
    assert [(labels.rank, labels.uid) for labels, _ in ranks] == [("1", "1000")]
    assert ("rank_claimed_twice", "warning", "job 1234 rank 0") in claims
    assert ("rank_owners_differ", "warning", "job 1234") in claims
    ranks, claims = rank_series((mine, other), None)
    assert [labels.uid for labels, _ in ranks] == ["1000", "1000"] and claims == ()


# -- through a real Prometheus: a second agent posing as node-a, ranks claimed twice -------------
PROMETHEUS = shutil.which("prometheus")


@pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary")
def test_a_host_claimed_by_two_scrape_targets_is_a_finding_never_merged():
    from test_cluster_prometheus import start_agent, start_prometheus

    tmp = tempfile.mkdtemp(prefix="traintop-forge-")
    procs = []
    try:
        common = ["--gpus", "1", "--job", "j1", "--nodes", "2"]
        real = start_agent("--simulate", "starved", "--hostname", "node-a", "--node-rank", "0", *common)
        forger = start_agent("--simulate", "healthy", "--hostname", "node-a", "--node-rank", "0", *common)
        b = start_agent("--simulate", "healthy", "--hostname", "node-b", "--node-rank", "1", *common)
        procs += [real[0], forger[0], b[0]]
        prom, url = start_prometheus({"traintop": [real[1], forger[1], b[1]]}, tmp)
        procs.append(prom)
        time.sleep(8)
        r = analyze(url, "--since", "30s", "--json")
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        hosts = sorted(h["host"] for h in report["hosts"])
        assert hosts == sorted([f"node-a (from {real[1]})", f"node-a (from {forger[1]})", "node-b"])
        claimed = [f for f in report["findings"] if f["rule"] == "host_claimed_twice"]
        assert len(claimed) == 1 and claimed[0]["host"] == "node-a"
        assert real[1] in claimed[0]["evidence"] and forger[1] in claimed[0]["evidence"]
        ranks = [f for f in report["findings"] if f["rule"] == "rank_claimed_twice"]
        assert [f["subject"] for f in ranks] == ["job j1 rank 0"]  # rank 1 is node-b's alone
        assert "node-a (from" in ranks[0]["evidence"]
    finally:
        _stop_all(procs, tmp)


def _stop_all(procs, tmp) -> None:
    """End the agents and Prometheus a test started (killed past 10 s), and remove its folder."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
    shutil.rmtree(tmp, ignore_errors=True)


class _Poser:
    """An exporter posing as node-a, down to the `instance` label of node-a's real target."""

    def __init__(self, instance: str) -> None:
        import http.server

        poser = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                labels = (f'gpu="0",UUID="GPU-fake",pci_bus_id="",device="nvidia0",modelName="H200",'
                          f'Hostname="node-a",instance="{poser.instance}"')
                body = (f"traintop_gpu_utilization_ratio{{{labels}}} 1\n"
                        f'traintop_agent_info{{Hostname="node-a",mode="live",version="0",instance="{poser.instance}"}} 1\n'
                        ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.instance = instance
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.server_port}"


@pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary")
def test_with_the_documented_scrape_config_a_target_cannot_borrow_another_ones_instance():
    from test_cluster_prometheus import start_agent, start_prometheus

    tmp = tempfile.mkdtemp(prefix="traintop-forge-")
    procs = []
    poser = None
    try:
        real = start_agent("--simulate", "healthy", "--hostname", "node-a", "--gpus", "1", "--job", "j7")
        procs.append(real[0])
        poser = _Poser(instance=real[1])
        prom, url = start_prometheus({"traintop": [real[1], poser.target]}, tmp, honor_labels=False)
        procs.append(prom)
        time.sleep(8)
        r = analyze(url, "--since", "30s", "--json")
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        assert sorted(h["host"] for h in report["hosts"]) == sorted(
            [f"node-a (from {real[1]})", f"node-a (from {poser.target})"])
        assert [f["host"] for f in report["findings"] if f["rule"] == "host_claimed_twice"] == ["node-a"]
        jobs = {j for h in report["hosts"] for j in h["jobs"]}
        assert jobs == {"j7"}  # the relabelling kept the agents' job label
    finally:
        if poser is not None:
            poser.server.shutdown()
        _stop_all(procs, tmp)


def _probe_as(uid: int, directory: str, job: str, rank: int) -> int:
    """A process of user ``uid`` serving a probe's messages on probe-<pid>.sock in ``directory``
    (forked: the user needs no access to this Python). Returns its pid."""
    import socket as sk

    pid = os.fork()
    if pid:
        return pid
    try:  # the child: nothing here may return into pytest
        os.setgid(uid)
        os.setuid(uid)
        srv = sk.socket(sk.AF_UNIX, sk.SOCK_STREAM)
        srv.bind(os.path.join(directory, f"probe-{os.getpid()}.sock"))
        srv.listen(4)
        srv.settimeout(0.1)
        conns = []
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                c, _ = srv.accept()
                conns.append(c)
            except OSError:
                pass
            msg = {"v": 1, "pid": os.getpid(), "rank": rank, "local_rank": rank, "world_size": 2, "job": job,
                   "steps": 10, "step_times": [0.1], "window": 0.1, "input_wait": 0.0, "t": time.time()}
            for c in list(conns):
                try:
                    c.sendall((json.dumps(msg) + "\n").encode())
                except OSError:
                    conns.remove(c)
    finally:
        os._exit(0)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run processes as two other users")
def test_a_rank_claimed_by_another_users_process_is_exported_for_neither_and_is_a_finding():
    from traintop.cluster.agent import HostAgent
    from traintop.collectors.node import AllProbes
    from traintop.cluster.metrics_server import MetricsServer
    from traintop.watch.sessions import simulated_session

    base = tempfile.mkdtemp(prefix="traintop-users-")
    os.chmod(base, 0o711)  # the users may pass through to their own directories
    pids = []
    try:
        dirs = []
        for uid in (65534, 65533):
            d = os.path.join(base, str(uid))
            os.mkdir(d, 0o700)
            os.chown(d, uid, uid)
            dirs.append(d)
        pids = [_probe_as(65534, dirs[0], "1234", 0), _probe_as(65533, dirs[1], "1234", 0)]
        probes = AllProbes(dirs=lambda: dirs)
        ranks = ()
        for _ in range(100):  # bounded: 10 s
            ranks = probes.ranks()
            if len(ranks) == 2:
                break
            time.sleep(0.1)
        probes.close()
        assert sorted(r.uid for r in ranks) == [65533, 65534]  # from SO_PEERCRED, not from the message
        # through the agent's exporter: neither claim of rank 0 is a series, both are a finding
        session = simulated_session("healthy", history_s=0)
        h = HostAgent("node-a", session, None)
        labelled, claims = rank_series(ranks, None)
        assert labelled == [] and ("rank_claimed_twice", "warning", "job 1234 rank 0") in claims
        assert ("rank_owners_differ", "warning", "job 1234") in claims
        srv = MetricsServer("127.0.0.1", 0, h.registry).start()
        try:
            import httpx

            from traintop.cluster.exporter import HostState
            h.collector.publish(HostState(hostname="node-a", findings=claims))
            text = httpx.get(f"http://127.0.0.1:{srv.server_port}/metrics", timeout=5).text
        finally:
            srv.shutdown()
        assert 'rule="rank_claimed_twice"' in text and "traintop_step_seconds{" not in text
    finally:
        for pid in pids:
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except OSError:
                pass
        shutil.rmtree(base, ignore_errors=True)
