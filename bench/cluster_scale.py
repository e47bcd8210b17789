"""Scale: simulated hosts × 8 GPUs with probed ranks, through one real Prometheus.

    python bench/cluster_scale.py [--hosts 128] [--gpus 8] [--scrape 5] [--run 150] [--json FILE]
                                  [--compare bench/results/cluster_scale_128x8_before.json]

One agent process poses as every host (consecutive loopback ports), a real Prometheus
(the `prometheus` binary on PATH) scrapes them all, and after ``--run`` seconds this
measures: the scrape size per host (bytes, series), Prometheus's head series, samples
appended per second, its resident memory and scrape durations; the cluster view's
refresh (a first full read of the 5-minute window, then the refreshes that follow it);
and `analyze --prometheus` over the whole run read at a step that gives each series 720
points — what a 2-hour range at a 10 s step reads. It prints a table (with a column of an
earlier run's figures given ``--compare``) and the JSON.

``--ranks N`` measures only the judging (``findings_of``: the agents' verdicts and the cross-host
rules) of a synthetic job of N ranks, 8 a host, over 720 instants, in this process, no
Prometheus (with ``--before-code``, the older tree's too): the 10,000-rank case.

``--before-code DIR`` measures the view and analyze a second time with an older traintop
(``git archive main traintop | tar -x -C DIR``) on the same data: a before/after column.
For iterating on the readers: ``--serve`` starts the agents and Prometheus and waits;
``--url URL --span S`` measures against a running one; ``--profile DIR`` writes cProfile
files of one refresh and one in-process analyze there.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def instant(url: str, q: str) -> float | None:
    r = httpx.get(url + "/api/v1/query", params={"query": q}, timeout=30).json()
    res = r["data"]["result"]
    return float(res[0]["value"][1]) if res else None


def prom_self(url: str) -> dict:
    """Prometheus's own metrics, read from its /metrics (it need not scrape itself)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text):
        for smp in fam.samples:
            if smp.name in ("prometheus_tsdb_head_series", "prometheus_tsdb_head_samples_appended_total",
                            "process_resident_memory_bytes", "process_cpu_seconds_total") and not smp.labels:
                out[smp.name] = smp.value
            if smp.name == "prometheus_tsdb_head_samples_appended_total":
                out[smp.name] = out.get(smp.name, 0.0) + smp.value if smp.labels else smp.value
    return out


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_cluster(a, tmp: str, procs: list):
    base = free_port()
    agent = subprocess.Popen([sys.executable, "-m", "traintop", "agent", "--simulate", "healthy,starved,healthy,healthy",
                              "--gpus", str(a.gpus), "--hosts", str(a.hosts), "--hostname", "sim",
                              "--job", "scale", "--straggler", "3", "--interval", str(a.interval),
                              "--listen", f"127.0.0.1:{base}"],
                             stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    procs.append(agent)
    targets = []
    while len(targets) < a.hosts:
        line = agent.stderr.readline()
        if not line:
            raise SystemExit(f"agent exited: {agent.wait()}")
        m = re.search(r"http://(\S+)/metrics", line)
        if m:
            targets.append(m.group(1))
    port = free_port()
    cfg = os.path.join(tmp, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write(f"global:\n  scrape_interval: {a.scrape:g}s\n  evaluation_interval: 15s\nscrape_configs:\n"
                f"  - job_name: traintop\n    honor_labels: true\n    static_configs:\n"
                f"      - targets: [{', '.join(repr(t) for t in targets)}]\n")
    prom = subprocess.Popen([shutil.which("prometheus"), f"--config.file={cfg}", f"--storage.tsdb.path={tmp}/data",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(prom)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            if httpx.get(url + "/-/ready", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    return agent, prom, targets, url


def measure_serving(a, agent, prom, targets, url, t_start, out: dict) -> None:
    time.sleep(max(0.0, a.run - 30))
    s0, c0, ca0, w0 = prom_self(url), cpu_seconds(prom.pid), cpu_seconds(agent.pid), time.time()
    time.sleep(min(30.0, a.run))
    s1, c1, ca1, w1 = prom_self(url), cpu_seconds(prom.pid), cpu_seconds(agent.pid), time.time()
    body = httpx.get(f"http://{targets[0]}/metrics", timeout=30).content
    out["scrape_bytes_per_host"] = len(body)
    out["series_per_host"] = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    out["prometheus_head_series"] = s1.get("prometheus_tsdb_head_series")
    k = "prometheus_tsdb_head_samples_appended_total"
    out["samples_appended_per_s"] = round((s1.get(k, 0) - s0.get(k, 0)) / (w1 - w0), 1)
    out["prometheus_rss_bytes"] = s1.get("process_resident_memory_bytes")
    out["prometheus_cpu_cores"] = round((c1 - c0) / (w1 - w0), 3)
    out["agent_process_cpu_cores"] = round((ca1 - ca0) / (w1 - w0), 3)
    out["scrape_duration_s_mean"] = instant(url, "avg(scrape_duration_seconds)")
    out["scrape_duration_s_max"] = instant(url, "max(scrape_duration_seconds)")
    out["targets_up"] = instant(url, "sum(up)")
    with open(f"/proc/{agent.pid}/status") as f:
        out["agent_process_rss_bytes"] = next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmRSS"))
    out["agent_process_run_s"] = round(time.time() - t_start, 1)


def _profiled(fn, path: str | None):
    if not path:
        return fn()
    prof = cProfile.Profile()
    try:
        return prof.runcall(fn)
    finally:
        prof.dump_stats(path)
        st = pstats.Stats(path, stream=sys.stderr)
        print(f"--- {os.path.basename(path)}: top by cumulative time", file=sys.stderr)
        st.sort_stats("cumulative").print_stats(25)
        print(f"--- {os.path.basename(path)}: top by own time", file=sys.stderr)
        st.sort_stats("tottime").print_stats(20)


def measure_view(url: str, out: dict, profile: str | None, refreshes: int = 4, gap: float = 5.0) -> None:
    """The first read of the window, then refreshes ``gap`` seconds apart (what the view does
    every --refresh 5), each timed with its queries and bytes."""
    from traintop.cluster.snapshot import PrometheusSource

    src = PrometheusSource(url, window=300)
    times, calls, read = [], [], []
    try:
        for k in range(refreshes):
            if k:
                time.sleep(max(0.0, gap - times[-1]))
            c0, b0 = src.prom.calls, src.prom.bytes_read
            t0 = time.perf_counter()
            snap = _profiled(src, os.path.join(profile, f"refresh{k}.prof") if profile and k in (0, refreshes - 1)
                             else None)
            times.append(time.perf_counter() - t0)
            calls.append(src.prom.calls - c0)
            read.append(src.prom.bytes_read - b0)
    finally:
        src.close()
    out["cluster_refresh_s"] = [round(t, 3) for t in times]
    out["cluster_snapshot"] = {"hosts": len(snap.hosts), "gpus": len(snap.gpus), "ranks": len(snap.ranks),
                               "findings": len(snap.findings), "queries": calls, "bytes_read": read}


def measure_view_of(code: str, url: str, out: dict) -> None:
    """The same measure_view, run by the traintop found in the directory ``code`` (an older
    tree: git archive main traintop | tar -x -C DIR) in a process of its own."""
    snippet = ("import json, sys; sys.path.insert(0, %r); sys.path.insert(1, %r); import cluster_scale as b; o = {}; "
               "b.measure_view(%r, o, None, refreshes=2); print(json.dumps(o))" % (code, os.path.dirname(__file__), url))
    r = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, env=_env(code), cwd=code)
    if r.returncode:
        out["cluster_error"] = r.stderr.strip()[-300:]
    else:
        out.update(json.loads(r.stdout.strip().splitlines()[-1]))


def _env(code: str | None) -> dict:
    env = dict(os.environ)
    if code:
        env["PYTHONPATH"] = code + os.pathsep + env.get("PYTHONPATH", "")
    return env


def measure_analyze(url: str, span: float, out: dict, profile: str | None, code: str | None = None) -> None:
    step = span / 720
    if profile:
        from traintop.cluster.analysis import analyze_prometheus

        _profiled(lambda: analyze_prometheus(url, span, step=step), os.path.join(profile, "analyze.prof"))
    t0 = time.perf_counter()
    until = time.time()
    r = subprocess.run([sys.executable, "-m", "traintop", "analyze", "--prometheus", url, "--since",
                        f"{span:.0f}s", "--until", f"{until:.3f}", "--step", f"{step:.3f}", "--json"],
                       capture_output=True, text=True, env=_env(code), cwd=code)  # cwd: -m looks there first
    out["analyze_s"] = round(time.perf_counter() - t0, 2)
    if r.returncode not in (0, 1):
        out["analyze_error"] = r.stderr.strip()
    else:
        rep = json.loads(r.stdout)
        out["analyze"] = {"points_per_series": 720, "queries": rep["queries"], "bytes_read": rep["bytes_read"],
                          "findings": len(rep["findings"]), "seconds_inside": rep["seconds"],
                          "rules": sorted({f["rule"] for f in rep["findings"]})}


def synthetic(n_ranks: int, points: int = 720, per_host: int = 8):
    """A job of ``n_ranks`` ranks on one grid: rank 3 waits for its data (the others wait for it),
    host 5's ranks all step slowly, and rank 1's agent judged its GPU starved."""
    from traintop.cluster.fetch import AgentFinding, ClusterData, GpuData, RankData

    grid = [float(k) for k in range(points)]
    d = ClusterData("synthetic", 0.0, grid[-1], 1.0, grid)
    for rank in range(n_ranks):
        host, local = f"n{rank // per_host}", rank % per_host
        r = d.ranks[("big", rank)] = RankData("big", rank, local, n_ranks, host)
        slow = rank // per_host == 5
        r.step = {t: 0.16 if slow else 0.08 + 0.001 * ((t + rank) % 3) for t in grid}
        r.steps = {t: t * 10 for t in grid}
        r.wait = {t: 0.5 if rank == 3 else 0.02 for t in grid}
        g = d.gpus[(host, local)] = GpuData(host, local, "GPU")
        g.util = {t: 0.95 for t in grid}
        g.clock_ratio = {t: 1.0 for t in grid}
    d.findings.append(AgentFinding("n0", "starvation", "warning", "gpu1", grid[100:400]))
    return d


def measure_judging(n_ranks: int, out: dict, code: str | None = None) -> None:
    """The judging of ``synthetic(n_ranks)`` (building the data not counted), in-process or by the
    traintop in ``code``."""
    if code:
        snippet = ("import json, sys; sys.path.insert(0, %r); sys.path.insert(1, %r); import cluster_scale as b; "
                   "o = {}; b.measure_judging(%d, o); print(json.dumps(o))" % (code, os.path.dirname(__file__), n_ranks))
        r = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, env=_env(code), cwd=code)
        out.update(json.loads(r.stdout.strip().splitlines()[-1]) if not r.returncode else
                   {"judging_error": r.stderr.strip()[-300:]})
        return
    from traintop.cluster.report import findings_of

    d = synthetic(n_ranks)
    t0 = time.perf_counter()
    shown, explained = findings_of(d)
    out["judging_ranks"] = n_ranks
    out["judging_s"] = round(time.perf_counter() - t0, 2)
    out["judging_findings"] = sorted(f"{f.rule} {f.host} {f.subject}" for f in shown)[:8]
    out["judging_explained"] = len(explained)


ROWS = (
    ("scrape per host", lambda o: f"{o['scrape_bytes_per_host'] / 1000:.0f} KB, {o['series_per_host']} series"),
    ("Prometheus head series", lambda o: f"{o['prometheus_head_series']:.0f}"),
    ("samples appended /s", lambda o: f"{o['samples_appended_per_s']:.0f}"),
    ("Prometheus RSS / CPU", lambda o: f"{o['prometheus_rss_bytes'] / 1e6:.0f} MB, {o['prometheus_cpu_cores']} cores"),
    ("agent process CPU / RSS", lambda o: f"{o['agent_process_cpu_cores']} cores, {o['agent_process_rss_bytes'] / 1e6:.0f} MB"),
    ("view: first read", lambda o: f"{o['cluster_refresh_s'][0]:.2f} s"),
    ("view: refresh after it", lambda o: _refresh(o)),
    ("view: queries, bytes a refresh", lambda o: _per_refresh(o)),
    ("view: GPUs, ranks, findings", lambda o: f"{o['cluster_snapshot']['gpus']}, {o['cluster_snapshot']['ranks']}, "
                                              f"{o['cluster_snapshot']['findings']}"),
    ("analyze, 720 points/series", lambda o: f"{o['analyze_s']:.1f} s"),
    ("analyze: queries, bytes", lambda o: f"{o['analyze']['queries']}, {o['analyze']['bytes_read'] / 1e6:.1f} MB"),
    ("analyze: findings", lambda o: f"{o['analyze']['findings']} ({', '.join(o['analyze']['rules'])})"),
    ("judging, synthetic ranks", lambda o: f"{o['judging_s']:.2f} s, {o['judging_ranks']} ranks"),
)


def _refresh(o: dict) -> str:
    ts = o["cluster_refresh_s"][1:] or o["cluster_refresh_s"]
    return f"{min(ts):.2f}–{max(ts):.2f} s"


def _per_refresh(o: dict) -> str:
    s = o["cluster_snapshot"]
    q, b = s["queries"], s["bytes_read"]
    if isinstance(q, list):  # first read, then the last refresh
        return f"{q[0]}, {b[0] / 1e6:.1f} MB first; {q[-1]}, {b[-1] / 1e6:.2f} MB after"
    n = len(o["cluster_refresh_s"])  # older runs: totals over n full reads
    return f"{q // n}, {b / n / 1e6:.1f} MB"


def table(columns: list[tuple[str, dict]]) -> str:
    head = ("figure",) + tuple(name for name, _ in columns)
    rows = []
    for name, fn in ROWS:
        cells = [name]
        for _, o in columns:
            try:
                cells.append(fn(o))
            except (KeyError, TypeError, IndexError, ZeroDivisionError):
                cells.append("–")
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows + [list(head)]) for i in range(len(head))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=128)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--scrape", type=float, default=5.0)
    ap.add_argument("--interval", type=float, default=5.0, help="the agents' sampling interval")
    ap.add_argument("--run", type=float, default=150.0)
    ap.add_argument("--json")
    ap.add_argument("--compare", metavar="FILE", help="an earlier run's JSON: printed as the 'before' column")
    ap.add_argument("--serve", action="store_true", help="start the agents and Prometheus, print the URL, wait")
    ap.add_argument("--url", help="measure the readers against this running Prometheus (no agents started)")
    ap.add_argument("--span", type=float, default=600.0, help="with --url: the range analyze reads")
    ap.add_argument("--profile", metavar="DIR", help="write cProfile files of a refresh and an analyze here")
    ap.add_argument("--before-code", metavar="DIR",
                    help="also measure the view and analyze with the traintop in DIR (an older tree), same data")
    ap.add_argument("--ranks", type=int, help="measure only the judging of a synthetic job of this many ranks")
    a = ap.parse_args()
    if a.ranks:
        out = {}
        measure_judging(a.ranks, out)
        columns = [("now", out)]
        if a.before_code:
            old: dict = {}
            measure_judging(a.ranks, old, a.before_code)
            columns.insert(0, ("older code", old))
            out["before_code"] = old
        print(table(columns))
        print(json.dumps(out, indent=1))
        return 0
    if a.profile:
        os.makedirs(a.profile, exist_ok=True)
    out: dict = {"hosts": a.hosts, "gpus_per_host": a.gpus, "scrape_s": a.scrape, "agent_interval_s": a.interval}
    if a.url:
        out = {"url": a.url}
        measure_view(a.url, out, a.profile)
        measure_analyze(a.url, a.span, out, a.profile)
        if a.before_code:
            old = out["before_code"] = {}
            measure_view_of(a.before_code, a.url, old)
            measure_analyze(a.url, a.span, old, None, code=a.before_code)
    else:
        if not shutil.which("prometheus"):
            print("needs the prometheus binary on PATH", file=sys.stderr)
            return 2
        tmp = tempfile.mkdtemp(prefix="traintop-scale-")
        procs: list = []
        try:
            agent, prom, targets, url = start_cluster(a, tmp, procs)
            t_start = time.time()
            if a.serve:
                print(url, flush=True)
                while agent.poll() is None and prom.poll() is None:
                    time.sleep(1)
                return 1
            measure_serving(a, agent, prom, targets, url, t_start, out)
            measure_view(url, out, a.profile)
            span = time.time() - t_start
            measure_analyze(url, span, out, a.profile)
            if a.before_code:
                old = out["before_code"] = {}
                measure_view_of(a.before_code, url, old)
                measure_analyze(url, span, old, None, code=a.before_code)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
            shutil.rmtree(tmp, ignore_errors=True)
    columns = []
    if a.compare:
        with open(a.compare) as f:
            columns.append((os.path.basename(a.compare), json.load(f)))
    if out.get("before_code"):
        columns.append(("older code, same run", {**out, **out["before_code"]}))
    columns.append(("now", out))
    print(table(columns))
    text = json.dumps(out, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
