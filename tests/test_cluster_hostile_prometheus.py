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
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
