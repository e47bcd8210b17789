"""A real Prometheus on loopback scraping real agents every second; `analyze --prometheus`
reads it back. Three simulated hosts of one job: node-a's loader starves, node-b has a
straggler rank, node-c is healthy. Another Prometheus scrapes two hosts posing as the H200
case (one rank each of a synchronous job; rank 1's loader is slow, rank 0 waits for it). A third scrapes two loopback servers that
speak dcgm-exporter's text format (the dcgm-exporter-only mode). No mock of Prometheus.
"""

import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import pytest

PROMETHEUS = shutil.which("prometheus")
if PROMETHEUS is None:
    pytest.skip("no prometheus binary (scripts/test installs Debian's prometheus package where it runs as root "
                "with apt)", allow_module_level=True)

SCRAPE_S = 1
SETTLE_S = 22  # the cross-host rules hold a verdict 10 s before it is a finding


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_agent(*args):
    p = subprocess.Popen([sys.executable, "-m", "traintop", "agent", "--listen", "127.0.0.1:0", "--interval", "0.5",
                          *args], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    line = p.stderr.readline()
    m = re.search(r"http://(\S+)/metrics", line)
    assert m, f"agent did not start: {line!r}"
    return p, m.group(1)


# docs/CLUSTER.md's scrape config: a target cannot choose its own instance; the agents' job label kept
RELABEL_JOB = """
    metric_relabel_configs:
      - source_labels: [exported_job]
        regex: (.+)
        target_label: job
      - regex: exported_job
        action: labeldrop"""


def start_prometheus(targets: dict, tmp: str, rules: str | None = None, honor_labels: bool = True):
    port = free_port()
    os.makedirs(tmp, exist_ok=True)
    cfg = os.path.join(tmp, "prometheus.yml")
    jobs = "".join(f"""
  - job_name: {name}
    honor_labels: {"true" if honor_labels else "false"}{"" if honor_labels else RELABEL_JOB}
    scrape_interval: {SCRAPE_S}s
    static_configs:
      - targets: [{", ".join(repr(t) for t in addrs)}]
""" for name, addrs in targets.items())
    with open(cfg, "w") as f:
        f.write(f"global:\n  scrape_interval: {SCRAPE_S}s\n  evaluation_interval: {SCRAPE_S}s\n"
                + (f"rule_files: [{rules!r}]\n" if rules else "") + f"scrape_configs:{jobs}")
    p = subprocess.Popen([PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={os.path.join(tmp, 'data')}",
                          f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                         stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "prometheus.log"), "w"))
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            if httpx.get(url + "/-/ready", timeout=1).status_code == 200:
                return p, url
        except httpx.HTTPError:
            pass
        if p.poll() is not None:
            break
        time.sleep(0.1)
    p.kill()
    raise AssertionError("prometheus did not start: " + open(os.path.join(tmp, "prometheus.log")).read()[-500:])


class DcgmExporter(http.server.ThreadingHTTPServer):
    """Serves what dcgm-exporter serves (its released label set), computed at each scrape:
    dcgm-a starves (utilization 0/100 in 1.5 s halves), dcgm-b runs at low power and
    reports XID 79 on GPU 1 from a few seconds in."""

    def __init__(self, host: str):
        self.host = host
        self.t0 = time.time()
        super().__init__(("127.0.0.1", 0), _DcgmHandler)

    def text(self) -> str:
        rel = time.time() - self.t0
        out = []
        fams = {
            "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
            "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
            "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
            "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
            "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("gauge", "Power management limit (in W)."),
            "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
            "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz)."),
            "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
            "DCGM_FI_PROF_SM_ACTIVE": ("gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
        }
        for name, (kind, help_) in fams.items():
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            for gpu in range(2):
                labels = (f'gpu="{gpu}",UUID="GPU-{self.host}-{gpu}",pci_bus_id="00000000:{0x18 + gpu:02X}:00.0",'
                          f'device="nvidia{gpu}",modelName="NVIDIA H200",Hostname="{self.host}",'
                          f'DCGM_FI_DRIVER_VERSION="570.86.15"')
                out.append(f"{name}{{{labels}}} {self.value(name, gpu, rel)}")
        return "\n".join(out) + "\n"

    def value(self, name: str, gpu: int, rel: float):
        starved = self.host == "dcgm-a"
        busy = (rel % 3.0) < 1.5
        util = (100 if busy else 0) if starved else 5
        return {
            "DCGM_FI_DEV_GPU_UTIL": util,
            "DCGM_FI_DEV_FB_USED": 40000 if starved else 3000,
            "DCGM_FI_DEV_FB_FREE": 103771 if starved else 140771,
            "DCGM_FI_DEV_POWER_USAGE": (500.5 if busy else 140.0) if starved else 118.25,
            "DCGM_FI_DEV_POWER_MGMT_LIMIT": 700,
            "DCGM_FI_DEV_GPU_TEMP": 45 if starved else 38,
            "DCGM_FI_DEV_SM_CLOCK": 1980,
            "DCGM_FI_DEV_XID_ERRORS": 79 if (not starved and gpu == 1 and rel > 4) else 0,
            "DCGM_FI_PROF_SM_ACTIVE": round(util / 100 * 0.8, 3),
        }[name]


class TraintopText(DcgmExporter):
    """A node speaking traintop's series, with no ranks: node-x, one busy GPU whose XID
    counter moves at its sixth scrape (the agents' simulator raises no XIDs)."""

    scrapes = 0
    moved_at: float | None = None

    def text(self) -> str:
        self.scrapes += 1
        moved = self.scrapes > 5
        if moved and self.moved_at is None:
            self.moved_at = time.time()
        labels = ('gpu="0",UUID="GPU-node-x-0",pci_bus_id="00000000:18:00.0",device="nvidia0",'
                  'modelName="NVIDIA H200",Hostname="node-x"')
        values = {"gpu_utilization_ratio": 1, "gpu_sm_clock_hertz": 1.98e9, "gpu_sm_clock_max_hertz": 1.98e9,
                  "gpu_power_watts": 650, "gpu_xid_errors_total": 1 if moved else 0, "gpu_last_xid": 79 if moved else 0}
        out = [f"traintop_{name}{{{labels}}} {v}" for name, v in values.items()]
        return "\n".join(out + ['traintop_agent_info{Hostname="node-x",mode="test",version="0"} 1']) + "\n"


class _DcgmHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = self.server.text().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def cluster():
    tmp = tempfile.mkdtemp(prefix="traintop-prom-")
    procs = []
    servers = []
    try:
        common = ["--gpus", "2", "--job", "j1", "--nodes", "3"]
        a = start_agent("--simulate", "starved", "--hostname", "node-a", "--node-rank", "0", *common)
        b = start_agent("--simulate", "healthy", "--hostname", "node-b", "--node-rank", "1", "--straggler", "1",
                        *common)
        c = start_agent("--simulate", "healthy", "--hostname", "node-c", "--node-rank", "2", *common)
        procs += [a[0], b[0], c[0]]
        h200 = ["--gpus", "1", "--job", "h200-ddp", "--nodes", "2"]
        h0 = start_agent("--simulate", "collective_wait", "--hostname", "h200-node0", "--node-rank", "0", *h200)
        h1 = start_agent("--simulate", "slow_loader", "--hostname", "h200-node1", "--node-rank", "1", *h200)
        procs += [h0[0], h1[0]]
        for host in ("dcgm-a", "dcgm-b"):
            srv = DcgmExporter(host)
            threading.Thread(target=srv.serve_forever, daemon=True).start()
            servers.append(srv)
        node_x = TraintopText("node-x")
        threading.Thread(target=node_x.serve_forever, daemon=True).start()
        servers.append(node_x)
        rules = os.path.join(os.path.dirname(__file__), "..", "deploy", "prometheus", "traintop-alerts.yml")
        prom, url = start_prometheus({"traintop": [a[1], b[1], c[1], f"127.0.0.1:{node_x.server_port}"]},
                                     os.path.join(tmp, "p1"),
                                     rules=os.path.abspath(rules) if os.path.exists(rules) else None)
        procs.append(prom)
        prom2, url2 = start_prometheus({"dcgm": [f"127.0.0.1:{s.server_port}" for s in servers[:2]]},
                                       os.path.join(tmp, "p2"))
        procs.append(prom2)
        prom3, url3 = start_prometheus({"traintop": [h0[1], h1[1]]}, os.path.join(tmp, "p3"))
        procs.append(prom3)
        t_start = time.time()
        time.sleep(SETTLE_S)
        yield {"url": url, "dcgm_url": url2, "h200_url": url3, "node_x": node_x,
               "agents": {"node-a": a[0], "node-b": b[0], "node-c": c[0]},
               "since": time.time() - t_start + 2, "t_start": t_start}
    finally:
        for s in servers:
            s.shutdown()
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def analyze(url, *args):
    r = subprocess.run([sys.executable, "-m", "traintop", "analyze", "--prometheus", url, *args],
                       capture_output=True, text=True, timeout=60)
    return r


def test_analyze_names_the_starving_node_and_the_straggler_rank(cluster):
    r = analyze(cluster["url"], "--since", f"{cluster['since']:.0f}s", "--job", "j1", "--json", "--fail-on", "warning")
    assert r.returncode == 1, r.stderr  # warnings found: CI fails
    report = json.loads(r.stdout)
    assert report["kind"] == "prometheus" and report["job"] == "j1"
    assert [h["host"] for h in report["hosts"]] == ["node-a", "node-b", "node-c"]
    assert all(len(h["gpus"]) == 2 and h["ranks"] == 2 for h in report["hosts"])
    by_rule = {}
    for f in report["findings"]:
        by_rule.setdefault(f["rule"], []).append(f)
    # node-a's loader starves and makes its ranks lag: one finding names the node and says why
    # (the input wait, its loader workers' CPU, its agent's verdicts), not three
    (node_a,) = by_rule["straggler_node"]
    assert node_a["host"] == "node-a" and "input wait" in node_a["evidence"] and "loader workers" in node_a["evidence"]
    assert "node_starving" not in by_rule  # folded into the straggler finding
    # node-b's rank 3 (local rank 1) lags; the evidence says why from node-b's data
    stragglers = {(f["host"], f["subject"]) for f in by_rule.get("straggler", [])}
    assert stragglers == {("node-b", "job j1 rank 3")}
    ev = next(f["evidence"] for f in by_rule["straggler"] if f["subject"] == "job j1 rank 3")
    assert "input wait" in ev and "node-b" in ev
    # the agents' starvation verdicts on the lagging GPUs are the causes those findings carry
    assert "starvation" not in by_rule
    explained = {(f["host"], f["subject"]) for f in report["explained"]}
    assert {("node-a", "gpu0"), ("node-a", "gpu1")} <= explained
    assert all(f["explained_by"] for f in report["explained"])
    # the healthy node has nothing wrong (being power-capped at full load is information)
    assert not [f for f in report["findings"] if f["host"] == "node-c" and f["severity"] != "info"]
    assert report["gpu_hours_lost"] > 0
    assert all(f["remedies"] for f in report["findings"])


def test_the_h200_case_names_the_straggler_rank_and_nothing_on_the_node_that_waits(cluster):
    r = analyze(cluster["h200_url"], "--since", f"{cluster['since']:.0f}s", "--job", "h200-ddp", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    warnings = [f for f in report["findings"] if f["severity"] != "info"]
    # one headline: rank 1 on h200-node1 is the straggler, because of its loader
    assert [(f["rule"], f["host"], f["subject"]) for f in warnings] == [("straggler", "h200-node1",
                                                                        "job h200-ddp rank 1")]
    ev = warnings[0]["evidence"]
    assert "every rank steps at its pace" in ev and "the other rank waits for it in collectives" in ev
    assert re.search(r"input wait (8\d|9\d) % \(the other ranks' median (3\d|4\d) %\)", ev), ev
    assert re.search(r"h200-node0 GPU 0 \d+ % busy at 1\d\d W of 700 W", ev), ev
    # h200-node0's agent sees its rank's GPU spinning in the all-reduce (busy, few SMs active) in a job
    # with a rank on another host: not starved, not underused (its own loader takes 35 % of the step,
    # but a faster loader would not make the job faster); the cross-host view names whom it waits for
    assert not [f for f in report["findings"] + report["explained"] if f["host"] == "h200-node0"
                and f["rule"] in ("starvation", "underuse", "idle_gpu", "node_starving")]
    assert [f["rule"] for f in report["explained"] if f["host"] == "h200-node1"] == ["starvation"]
    # the straggler costs what the verdicts it explains cost (rank 0's GPU waiting, rank 1's starving),
    # each counted once; the total never exceeds the GPU time there is
    explained_cost = sum(f["gpu_hours_lost"] for f in report["explained"])
    assert warnings[0]["gpu_hours_lost"] == pytest.approx(explained_cost, abs=3e-4)
    assert 0 < warnings[0]["gpu_hours_lost"] <= report["gpu_hours"]
    assert report["gpu_hours_lost"] == pytest.approx(sum(f["gpu_hours_lost"] for f in report["findings"]), abs=1e-3)
    assert report["gpu_hours_lost"] <= report["gpu_hours"]
    text = analyze(cluster["h200_url"], "--since", f"{cluster['since']:.0f}s", "--job", "h200-ddp").stdout
    assert "[WARNING] Straggler rank — h200-node1 (job h200-ddp rank 1)" in text
    assert text.count("[WARNING]") == 1 and "Explained by the findings above" in text
    print(text)


def test_text_report_and_unknown_job(cluster):
    r = analyze(cluster["url"], "--since", f"{cluster['since']:.0f}s")
    assert r.returncode == 0, r.stderr
    assert "Straggler rank — node-b (job j1 rank 3)" in r.stdout
    assert "node-a" in r.stdout and "→ " in r.stdout
    r = analyze(cluster["url"], "--since", "60s", "--job", "nope")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no ranks of job 'nope'" in r.stderr


def test_dcgm_exporter_only_fleet_runs_the_same_rules_and_says_what_it_cannot_see(cluster):
    # all the data there is by now (the starvation rule needs its 20 s window plus 8 s to raise;
    # the fixture's settle time is only just that on a busy machine)
    # On a loaded machine the scrapes jitter against the 3 s square wave: give the rule a few
    # more seconds of data before judging (it must still find the starvation).
    for attempt in range(4):
        since = time.time() - cluster["t_start"] + 2
        r = analyze(cluster["dcgm_url"], "--since", f"{since:.0f}s", "--json")
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        rules = {(f["rule"], f["host"]) for f in report["findings"]}
        if ("starvation", "dcgm-a") in rules:
            break
        time.sleep(8)
    assert report["kind"] == "dcgm-exporter"
    assert {h["host"] for h in report["hosts"]} == {"dcgm-a", "dcgm-b"}
    assert ("starvation", "dcgm-a") in rules
    assert ("gpu_errors", "dcgm-b") in rules and ("node_gpu_errors", "dcgm-b") in rules
    xid = next(f for f in report["findings"] if f["rule"] == "node_gpu_errors")
    assert "XID 79" in xid["evidence"] and "GPU 1" in xid["evidence"]
    assert any("no per-rank step times" in n for n in report["notes"])
    mem = report["hosts"][0]["gpus"][0]
    assert mem["mem_total_gib"] == pytest.approx(143771 / 1024, abs=0.1)  # used + free, MiB to bytes


class Recording(httpx.HTTPTransport):
    """The real transport, noting each query sent (to count what a read asks Prometheus)."""

    def __init__(self):
        super().__init__()
        self.queries = []

    def handle_request(self, request):
        self.queries.append(request.url.params.get("query"))
        return super().handle_request(request)


def test_error_counters_are_read_only_where_one_moved(cluster):
    from traintop.cluster.fetch import fetch
    from traintop.cluster.promapi import Prometheus
    from traintop.cluster.report import cross_findings

    moved = cluster["node_x"].moved_at
    assert moved is not None
    rec = Recording()
    with Prometheus(cluster["url"], transport=rec) as prom:
        before = fetch(prom, moved - 5, moved - 1, 0.5)  # node-x's counter had not moved yet
    assert not [q for q in rec.queries if q.startswith("traintop_gpu_xid")]
    assert not [f for f in cross_findings(before) if f.rule == "node_gpu_errors"]
    rec.queries.clear()
    with Prometheus(cluster["url"], transport=rec) as prom:
        after = fetch(prom, moved - 5, time.time(), 1.0)
    assert [q for q in rec.queries if q.startswith("traintop_gpu_xid")]
    (f,) = [f for f in cross_findings(after) if f.rule == "node_gpu_errors"]
    assert f.host == "node-x" and "XID 79" in f.evidence and "GPU 0" in f.evidence


def test_the_dashboard_reads_only_what_is_new_and_sees_what_a_full_read_sees(cluster):
    """Refreshes read the instants since the last one (with only the labels used); the window
    they keep is what one full read of it gives, node by node, point by point."""
    from traintop.cluster.fetch import fetch_grid
    from traintop.cluster.promapi import Prometheus
    from traintop.cluster.report import agent_findings, cross_findings
    from traintop.cluster.rolling import RollingCluster, window_grid

    now = time.time() - 2  # instants every scrape has reached
    with Prometheus(cluster["url"]) as prom, Prometheus(cluster["url"]) as prom_full:
        rolling = RollingCluster(prom, "j1", window=20, step=1.0)
        rolling.read(now - 6)
        first = prom.bytes_read
        for dt in (4, 2, 0):
            kept = rolling.read(now - dt)
        refreshes = (prom.bytes_read - first) / 3
        full = fetch_grid(prom_full, window_grid(now, 20, 1.0), now, "j1")
    assert rolling.full_reads == 1 and refreshes < first / 2
    assert kept.grid == full.grid
    assert set(kept.gpus) == set(full.gpus) and set(kept.ranks) == set(full.ranks)
    for k, g in full.gpus.items():
        assert vars(kept.gpus[k]) == vars(g), k
    for k, r in full.ranks.items():
        assert vars(kept.ranks[k]) == vars(r), k
    assert kept.loader_cpu == full.loader_cpu

    def findings(d):
        d.end = now
        return sorted((f.rule, f.host, f.subject, f.start, f.end, f.evidence)
                      for f in agent_findings(d) + cross_findings(d))
    assert findings(kept) == findings(full) and findings(full)


def test_a_node_that_stops_reporting_is_named(cluster):
    cluster["agents"]["node-c"].terminate()
    cluster["agents"]["node-c"].wait(10)
    time.sleep(7)
    r = analyze(cluster["url"], "--since", "40s", "--job", "j1", "--json")
    report = json.loads(r.stdout)
    missing = [f for f in report["findings"] if f["rule"] == "node_missing"]
    assert [f["host"] for f in missing] == ["node-c"]
    assert "job j1" in missing[0]["evidence"]


def test_unreachable_and_not_prometheus_are_one_line_errors(cluster, monkeypatch, capsys):
    from traintop import cli

    r = analyze(f"http://127.0.0.1:{free_port()}", "--since", "1m")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "cannot reach Prometheus" in r.stderr
    # `traintop cluster` says "no terminal" first (tests/test_cli.py); with one, Prometheus is asked
    monkeypatch.setattr(cli, "has_terminal", lambda: True)
    assert cli.main(["cluster", "--prometheus", f"http://127.0.0.1:{free_port()}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot reach Prometheus" in err, err
    r = analyze(cluster["url"] + "/metrics", "--since", "1m")  # a path that answers, but not Prometheus's API
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "did not answer like Prometheus" in r.stderr


class _Hostile(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if "auth" in self.headers.get("Host", "") or self.server.mode == "auth":
            self.send_response(401)
            self.send_header("WWW-Authenticate", "Basic")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        label = "\\u001b]52;c;ZXZpbA==\\u0007" + "x" * 500  # an OSC 52 clipboard write in a label
        head = ('{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"__name__":"x","Hostname":"'
                + label + '"},"values":[')
        self.wfile.write(head.encode())
        try:
            for _ in range(self.server.points):
                self.wfile.write(b'[1,"1"],')
            self.wfile.write(b'[1,"1"]]}]}}')
        except OSError:
            pass

    def log_message(self, *args):
        pass


def hostile_server(mode, points=1):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    srv.mode, srv.points = mode, points
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_auth_needed_and_oversized_answers_are_one_line_errors():
    from traintop.cluster.promapi import Grid, Prometheus
    from traintop.errors import TraintopError

    srv = hostile_server("auth")
    try:
        r = analyze(f"http://127.0.0.1:{srv.server_port}", "--since", "1m")
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "needs authentication" in r.stderr
    finally:
        srv.shutdown()
    srv = hostile_server("big", points=200_000)
    try:
        with Prometheus(f"http://127.0.0.1:{srv.server_port}", max_bytes=1 << 20) as prom:
            with pytest.raises(TraintopError, match="more than 1 MiB"):
                prom.query_range("x", 0, 1, 1)
            with pytest.raises(TraintopError, match="more than 1 MiB"):  # the readers' path too
                prom.query_grid("x", Grid(0.0, 1.0, 2))
        srv.points = 3
        with Prometheus(f"http://127.0.0.1:{srv.server_port}") as prom:
            (s,) = prom.query_range("x", 0, 1, 1)
            (g,) = prom.query_grid("x", Grid(0.0, 1.0, 2))
        for labels in (s.labels, g.labels):
            host = labels["Hostname"]
            assert "\x1b" not in host and "\x07" not in host and host.startswith("\\x1b]52")
            assert len(host) < 150  # capped (an escape shows as four characters)
        assert g.values == {1.0: 1.0}
    finally:
        srv.shutdown()


def test_shipped_alerts_and_dashboard_queries_run_on_the_real_series(cluster):
    with open(os.path.join(os.path.dirname(__file__), "..", "deploy", "grafana", "traintop-dashboard.json")) as f:
        d = json.load(f)
    exprs = [t["expr"] for p in d["panels"] for t in p["targets"]] + [v["definition"] for v in d["templating"]["list"]
                                                                       if "definition" in v]
    url = cluster["url"]
    for expr in exprs:
        q = expr.replace("$host", ".*").replace("$job", ".*")
        if q.startswith("label_values("):
            metric, label = re.match(r"label_values\((\w+), (\w+)\)", q).groups()
            r = httpx.get(f"{url}/api/v1/label/{label}/values", params={"match[]": metric}, timeout=10).json()
        else:
            r = httpx.get(f"{url}/api/v1/query", params={"query": q}, timeout=10).json()
        assert r["status"] == "success", (expr, r)
        assert r["data"] if isinstance(r["data"], list) else r["data"]["result"], f"no data for {expr}"
    groups = httpx.get(f"{url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    assert {g["name"] for g in groups} == {"traintop"}
    assert all(rule["health"] == "ok" for g in groups for rule in g["rules"])
    alerts = httpx.get(f"{url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    starving = [a for a in alerts if a["labels"]["alertname"] == "TraintopFindingWarning"
                and a["labels"]["rule"] == "starvation"]
    assert {a["labels"]["Hostname"] for a in starving} >= {"node-a"}  # pending: warnings wait 5 minutes


def test_cluster_dashboard_reads_the_real_prometheus_and_focuses_a_host(cluster):
    import asyncio

    from traintop.app.cluster import ClusterApp
    from traintop.cluster.snapshot import PrometheusSource
    from traintop.widgets.cluster_panels import HostsBody

    source = PrometheusSource(cluster["url"], window=60)

    async def go():
        app = ClusterApp(source, url=cluster["url"], refresh=1.0)
        async with app.run_test(size=(80, 24)) as pilot:
            for _ in range(100):
                await pilot.pause(0.1)
                if app.snapshot is not None:
                    break
            assert app.snapshot is not None and app.problem is None
            assert {"node-a", "node-b"} <= set(app.snapshot.hosts)
            assert "Straggler rank" in str(app.query_one("#alerts-body").render())
            await pilot.press("h")
            text = app.query_one(HostsBody).render().plain
            assert "node-a" in text and "node-b" not in text

    try:
        asyncio.run(go())
    finally:
        source.close()


def test_the_cluster_view_in_a_real_terminal_at_80x24(cluster, tmp_path):
    """`traintop cluster` on a pty against the real Prometheus: the findings are drawn without a
    resize, the arrows scroll them, a key of the local dashboard says what to use instead."""
    sys.path.insert(0, os.path.dirname(__file__))
    from terminal import Terminal

    with Terminal(["cluster", "--prometheus", cluster["url"], "--refresh", "1"], 80, 24, home=str(tmp_path)) as term:
        screen = term.wait_for(lambda s: "Findings (" in s and ("▲" in s or "✖" in s), "findings drawn", timeout=60)
        body = screen.split("Findings (")[1]
        assert any(ch in body for ch in "▲✖ℹ")  # under the title, not a blank panel
        term.press("g")
        term.wait_text("g focuses a GPU in the local dashboard")
        term.press("down", "down", "pagedown")
        term.press("q")
        assert term.wait_exit() == 0
