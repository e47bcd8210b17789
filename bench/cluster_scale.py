"""Scale: simulated hosts × 8 GPUs with probed ranks, through one real Prometheus.

    python bench/cluster_scale.py [--hosts 128] [--gpus 8] [--scrape 5] [--run 150] [--json FILE]

One agent process poses as every host (consecutive loopback ports), a real Prometheus
(the `prometheus` binary on PATH) scrapes them all, and after ``--run`` seconds this
measures: the scrape size per host (bytes, series), Prometheus's head series, samples
appended per second, its resident memory and scrape durations; the cluster view's
refresh (one 5-minute snapshot); and `analyze --prometheus` over the whole run read at
a step that gives each series 720 points — what a 2-hour range at a 10 s step reads.
"""

from __future__ import annotations

import argparse
import json
import os
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=128)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--scrape", type=float, default=5.0)
    ap.add_argument("--interval", type=float, default=5.0, help="the agents' sampling interval")
    ap.add_argument("--run", type=float, default=150.0)
    ap.add_argument("--json")
    a = ap.parse_args()
    prom_bin = shutil.which("prometheus")
    if not prom_bin:
        print("needs the prometheus binary on PATH", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="traintop-scale-")
    procs = []
    out: dict = {"hosts": a.hosts, "gpus_per_host": a.gpus, "scrape_s": a.scrape, "agent_interval_s": a.interval}
    try:
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
        prom = subprocess.Popen([prom_bin, f"--config.file={cfg}", f"--storage.tsdb.path={tmp}/data",
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
        t_start = time.time()
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

        from traintop.cluster.snapshot import PrometheusSource

        src = PrometheusSource(url, window=300)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            snap = src()
            times.append(time.perf_counter() - t0)
        out["cluster_refresh_s"] = [round(t, 3) for t in times]
        out["cluster_snapshot"] = {"hosts": len(snap.hosts), "gpus": len(snap.gpus), "ranks": len(snap.ranks),
                                   "findings": len(snap.findings), "queries": src.prom.calls,
                                   "bytes_read": src.prom.bytes_read}
        src.close()
        span = time.time() - t_start
        step = span / 720
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "traintop", "analyze", "--prometheus", url, "--since",
                            f"{span:.0f}s", "--step", f"{step:.3f}", "--json"], capture_output=True, text=True)
        out["analyze_s"] = round(time.perf_counter() - t0, 2)
        if r.returncode not in (0, 1):
            out["analyze_error"] = r.stderr.strip()
        else:
            rep = json.loads(r.stdout)
            out["analyze"] = {"points_per_series": 720, "queries": rep["queries"], "bytes_read": rep["bytes_read"],
                              "findings": len(rep["findings"]), "seconds_inside": rep["seconds"],
                              "rules": sorted({f["rule"] for f in rep["findings"]})}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    text = json.dumps(out, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
