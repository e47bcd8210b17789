"""A local user attacks the root agent through their own probe directory (which it reads): sockets
that exhaust its descriptors, probes that name a new rank in every message or send bare
newlines as fast as they can, plain files named like sockets. The agent refuses the probe past
each bound, counts it (traintop_agent_probe_refused_total) and says it once; it never stops
serving, sampling or telling the truth about its last sample's age."""

import dataclasses
import os
import re
import resource
import subprocess
import sys
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import hostile_probes as H
from traintop.collectors.node import AllProbes

ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the attacker is another user (uid 65534)")


def _agent(directory: str, *args: str, nofile: int | None = None):
    """A real agent as root whose own probe directory is the attacker's; returns (process, URL)."""
    def limit():
        if nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    p = subprocess.Popen([sys.executable, "-m", "traintop", "agent", "--listen", "127.0.0.1:0", *args],
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, preexec_fn=limit,
                         env=dict(os.environ, TRAINTOP_PROBE_DIR=directory))
    while True:
        line = p.stderr.readline()
        if not line:
            raise AssertionError(f"agent exited: {p.wait()}")
        m = re.search(r"(http://\S+/metrics)", line)
        if m:
            return p, m.group(1)


def _scrape(url: str) -> dict:
    """{(name, reason or rank): value} of the series these tests read; raises when /metrics does not answer."""
    out = {}
    for fam in text_string_to_metric_families(httpx.get(url, timeout=5).text):
        for s in fam.samples:
            out[(s.name, s.labels.get("reason") or s.labels.get("job", ""), s.labels.get("rank", ""))] = s.value
    return out


def _refused(seen: dict, reason: str) -> float:
    return seen.get(("traintop_agent_probe_refused_total", reason, ""), 0.0)


def _until(url: str, ok, timeout_s: float = 30.0) -> dict:
    """Scrape until ``ok(seen)``: every scrape must answer; a bounded wait, never a fixed sleep."""
    end = time.monotonic() + timeout_s
    while True:
        seen = _scrape(url)
        if ok(seen):
            return seen
        assert time.monotonic() < end, f"not within {timeout_s} s: {sorted(k for k in seen if 'refused' in k[0])}"
        time.sleep(0.2)


def _stop(p) -> str:
    p.terminate()
    try:
        return p.communicate(timeout=10)[1]
    except subprocess.TimeoutExpired:
        p.kill()
        return p.communicate()[1]


@pytest.fixture
def user_dir():
    base, d = H.user_probe_dir()
    attackers: list[int] = []
    yield d, attackers
    for pid in attackers:
        H.stop(pid)
    H.remove(base)


@ROOT
def test_listening_sockets_past_the_descriptors_fail_probes_never_the_agent(user_dir):
    """150 listening sockets against an agent of 128 descriptors: /metrics answers all along, the
    sockets past its reserve are refused ("descriptors", said once), and once they are gone the
    agent holds no descriptor of theirs."""
    d, attackers = user_dir
    attackers.append(H.attack(d, "listen", n=150))
    p, url = _agent(d, "--interval", "0.2", nofile=128)
    try:
        _until(url, lambda seen: _refused(seen, "descriptors") > 0)
        held = H.open_descriptors(p.pid)
        assert held < 128 - 32  # the reserve (64) stays free, but for a scrape's or a sample's few
        for _ in range(5):
            _scrape(url)  # still answers
        H.stop(attackers.pop())
        H.remove(os.path.dirname(d))
        end = time.monotonic() + 30
        while H.open_descriptors(p.pid) > 16:  # none of the attacker's connections left
            assert time.monotonic() < end, H.open_descriptors(p.pid)
            _scrape(url)
            time.sleep(0.2)
    finally:
        err = _stop(p)
    assert err.count("short of file descriptors") == 1, err


@ROOT
def test_one_users_sockets_past_the_per_user_bound_are_left_unread(user_dir):
    d, attackers = user_dir
    attackers.append(H.attack(d, "listen", n=100))
    p, url = _agent(d, "--interval", "0.2")
    try:
        _until(url, lambda seen: _refused(seen, "per_user_limit") >= 100 - 64)
        assert H.open_descriptors(p.pid) <= 64 + 16
    finally:
        err = _stop(p)
    assert err.count("uid 65534 hold 64 connections") == 1, err


@ROOT
def test_probes_naming_a_new_rank_in_every_message_do_not_grow_the_agent(user_dir):
    """200 probes, each message a rank never named before (unbounded, the agent grew ~40 MB a second):
    the agent's memory stays flat, at most 64 of them are read and the ranks past the bound are
    refused ("rank_limit")."""
    d, attackers = user_dir
    attackers.append(H.attack(d, "new_ranks", n=200))
    p, url = _agent(d, "--interval", "0.5")
    try:
        _until(url, lambda seen: any(k[0] == "traintop_step_seconds" for k in seen))
        end = time.monotonic() + 3
        while time.monotonic() < end:  # the bounds fill (about 2 ticks)
            _scrape(url)
            time.sleep(0.5)
        before = H.rss_bytes(p.pid)
        end = time.monotonic() + 8
        while time.monotonic() < end:  # 16 more ticks of new ranks
            _scrape(url)
            time.sleep(0.5)
        grown = H.rss_bytes(p.pid) - before
        assert grown < 20 << 20, f"grew {grown >> 20} MiB in 8 s"
        seen = _until(url, lambda seen: _refused(seen, "rank_limit") > 0)
    finally:
        err = _stop(p)
    assert sum(1 for k in seen if k[0] == "traintop_step_seconds") <= 64
    assert err.count("named more than 256 ranks") == 1, err


@ROOT
def test_a_probe_sending_bare_newlines_freezes_nothing(user_dir):
    """One probe sends newlines as fast as it can beside a well-behaved one of the same user: the
    well-behaved rank's steps keep coming, the flood's excess is dropped and counted ("rate")."""
    d, attackers = user_dir
    attackers.append(H.attack(d, "newlines", n=1))
    attackers.append(H.attack(d, "steps", n=1, first=200_000))
    p, url = _agent(d, "--interval", "0.2")
    try:
        def steps(seen):
            return seen.get(("traintop_steps_total", "legit", "0"))

        first = steps(_until(url, lambda seen: steps(seen) is not None))
        seen = _until(url, lambda seen: (steps(seen) or 0) >= first + 10 and _refused(seen, "rate") > 0)
        assert seen[("traintop_agent_last_sample_age_seconds", "", "")] < 5
    finally:
        err = _stop(p)
    assert err.count("messages a second") <= 1 and err.count("MiB/s") <= 1, err


def test_last_sample_age_is_the_age_of_the_last_complete_sample():
    """A sampler stuck inside a tick publishes nothing: the age read at the scrape grows with it
    (it read 0.006 s while every series froze), and falls back once sampling goes on."""
    from traintop.cluster.agent import HostAgent, serve
    from traintop.watch.sessions import simulated_session

    session = simulated_session("healthy", history_s=0, interval=0.1)
    source = session.feed.source
    go = threading.Event()
    go.set()

    class Stuck:  # the simulator's figures, sampled now (as a live agent's)
        def next_frame(self):
            go.wait(30)
            return dataclasses.replace(source.next_frame(), t=time.time())

    session.feed.source = Stuck()
    h = HostAgent("h", session, None)
    (server,) = serve([h], "127.0.0.1:0", lambda m: None)
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    age = ("traintop_agent_last_sample_age_seconds", "", "")
    try:
        h.start()
        _until(url, lambda seen: age in seen, 10)
        go.clear()
        _until(url, lambda seen: seen[age] >= 1.5, 10)
        go.set()
        _until(url, lambda seen: seen[age] < 1.0, 10)
    finally:
        go.set()
        server.shutdown()
        h.stop()


def _listening(path: str):
    import socket

    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.listen(4)
    return s


def test_plain_files_named_like_sockets_cost_no_connect_and_the_scan_is_bounded(tmp_path, monkeypatch):
    """150 000 plain files named probe-N.sock slowed sampling to one sample every 5.5 s: each was
    tried as a socket, every tick. A plain file is not even looked at twice (its type comes with
    its name); a directory holds more than a scan looks at: the rest is left, counted and said."""
    from traintop.collectors.probe_client import ProbeClient

    d = tmp_path / "probes"
    d.mkdir(mode=0o700)
    for k in range(3000):
        (d / f"probe-{100_000 + k}.sock").touch()
    real = _listening(str(d / f"probe-{os.getpid()}.sock"))
    tried: list[tuple] = []
    connect_to = ProbeClient._connect_to

    def counted(self, *args):
        tried.append(args[:2])
        return connect_to(self, *args)

    monkeypatch.setattr(ProbeClient, "_connect_to", counted)
    probes = AllProbes(lambda: [str(d)])
    try:
        for _ in range(3):
            probes.ranks()
        assert [pid for pid, _ in tried] == [os.getpid()]  # the one socket, once; no plain file
    finally:
        probes.close()
        real.close()
    looked = []
    scandir = os.scandir

    class Counting:
        def __init__(self, path):
            self.it = scandir(path)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.it.close()

        def __iter__(self):
            for e in self.it:
                looked.append(e.name)
                yield e

    from traintop.collectors.probe_limits import ProbeLimits

    monkeypatch.setattr(os, "scandir", Counting)
    probes = AllProbes(lambda: [str(d)], limits=ProbeLimits(scan_entries=500))
    probes.ranks()
    probes.ranks()
    assert len(looked) <= 2 * 501 and probes.guard.refused["scan_limit"] == 2
    assert len(probes.guard.take_notes()) == 1  # said once
    probes.close()


def test_a_directory_that_goes_takes_its_connections_with_it(tmp_path):
    """The attacker's sockets gone with their directory: the agent kept every connection to them open
    for ever (it no longer read the directory, so it never closed them)."""
    import shutil

    d = tmp_path / "probes"
    d.mkdir(mode=0o700)
    servers = [_listening(str(d / f"probe-{100_000 + k}.sock")) for k in range(20)]
    before = H.open_descriptors(os.getpid())
    probes = AllProbes(lambda: [str(d)])
    try:
        probes.ranks()
        assert H.open_descriptors(os.getpid()) >= before + 20
        shutil.rmtree(d)
        probes.ranks()
        assert H.open_descriptors(os.getpid()) <= before
    finally:
        probes.close()
        for s in servers:
            s.close()


def test_the_ranks_one_user_may_name_are_bounded_and_expire():
    from traintop.collectors.probe_limits import ProbeGuard, ProbeLimits

    t = [0.0]
    guard = ProbeGuard(ProbeLimits(ranks_per_user=3, rank_ttl_s=60), clock=lambda: t[0])
    assert all(guard.admit_rank(1000, ("j", r)) for r in range(3))
    assert not guard.admit_rank(1000, ("j", 3))  # a fourth, while the three are heard of
    assert guard.admit_rank(1001, ("j", 3))  # another user has a bound of their own
    t[0] = 30
    assert guard.admit_rank(1000, ("j", 0))  # heard of again: it stays
    t[0] = 70
    assert guard.admit_rank(1000, ("j", 3))  # ranks 1 and 2 went quiet: their places are free
    assert guard.admit_rank(1000, ("j", 4)) and not guard.admit_rank(1000, ("j", 5))


def test_the_store_keeps_the_history_of_a_bounded_number_of_ranks():
    """A rank the store has not seen takes the place of the one heard of longest ago, never of one
    in the sample: a rank number churning in every message cannot add series for ever."""
    from traintop.samples import Frame, RankSample
    from traintop.store import Store

    store = Store(capacity=10, max_ranks=4)
    for k in range(50):
        store.add(Frame(t=float(k), ranks=(RankSample(pid=1, rank=0, steps=k), RankSample(pid=2, rank=100 + k, steps=k))))
    subjects = {key.split(".")[0] for key in store.keys() if key.startswith("rank")}
    assert len(subjects) <= 4 and "rank0" in subjects and "rank149" in subjects
    assert store.latest_value("rank0.steps") == 49.0
    many = tuple(RankSample(pid=10 + r, rank=1000 + r, steps=1) for r in range(6))
    store.add(Frame(t=60.0, ranks=many))  # more ranks at once than kept: the first ones have series
    assert len({key.split(".")[0] for key in store.keys() if key.startswith("rank")}) == 4


def test_a_probe_past_its_rates_loses_its_excess_and_the_tick_goes_on():
    """Messages past the probe's rate are dropped unparsed and counted; bytes past its byte rate wait
    in its socket (read at the next ticks, never in one); a message split across reads is whole."""
    import json
    import socket

    from traintop.collectors.probe_client import ProbeClient, _Conn
    from traintop.collectors.probe_limits import ProbeGuard, ProbeLimits

    t = [0.0]
    guard = ProbeGuard(ProbeLimits(lines_per_s=10, burst_lines=20, bytes_per_s=4096, burst_bytes=8192))
    client = ProbeClient(directory="/nonexistent", clock=lambda: t[0], guard=guard)
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    client._conns[7] = _Conn(7, a)
    msg = json.dumps({"v": 1, "pid": 7, "rank": 0, "steps": 1}).encode()
    b.sendall(b"\n" * 30 + msg[:10])
    guard.new_tick()
    assert client.sample({7}) == ()  # 20 empty lines taken (bad), 10 dropped, half a message held
    assert guard.refused["rate"] == 10 and client.bad_messages == 20
    t[0] = 1.0
    b.sendall(msg[10:] + b"\n")
    guard.new_tick()
    (r,) = client.sample({7})
    assert r.steps == 1
    b.sendall(b"x" * 60_000)  # no newline: past the byte rate, most of it waits in the socket
    t[0] = 2.0
    guard.new_tick()
    client.sample({7})
    assert len(client._conns[7].buf) <= 8192 and guard.refused["rate"] == 11
    client.close()
    b.close()


@ROOT
def test_in_another_users_directory_the_agent_reads_only_that_users_sockets(user_dir):
    """nobody swaps a probe-N.sock of hers for a link to a root service's socket between the agent's
    scan (a socket) and its connect (which follows links): the agent, as root, took a root peer in
    her directory as a probe, its rank labelled uid 0. A root socket there is what that race gives."""
    import json
    import socket

    d, _ = user_dir
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(os.path.join(d, f"probe-{os.getpid()}.sock"))  # root's, in nobody's directory
    srv.listen(4)
    srv.settimeout(0.1)
    msg = {"v": 1, "pid": os.getpid(), "rank": 0, "local_rank": 0, "world_size": 1, "job": "root-service",
           "steps": 1, "step_times": [0.1], "window": 0.1, "input_wait": 0.0, "t": time.time()}
    probes = AllProbes(lambda: [d])
    conns, ranks = [], ()
    try:
        for _ in range(20):  # bounded: 2 s
            ranks = probes.ranks()
            try:
                conns.append(srv.accept()[0])
                conns[-1].sendall((json.dumps(msg) + "\n").encode())
            except OSError:
                pass
            time.sleep(0.1)
        ranks = probes.ranks()
        assert not ranks, ranks
    finally:
        probes.close()
        for c in conns:
            c.close()
        srv.close()
