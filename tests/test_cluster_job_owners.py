"""One job id, several owners (issue 32): another user's processes claiming job 4242 — as probes on
a second host, through SLURM_JOB_ID in their environment, or from a cgroup they named job_4242
themselves — never join the victim's job. Each owner's ranks, time and GPUs are a job of their own;
the one a host's Slurm cgroup vouches for keeps the id; and it is a finding. Through the agents'
real exporters and a real Prometheus, as the cluster reads them."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import pytest
from prometheus_client import CollectorRegistry

from traintop.cluster import claims
from traintop.cluster.agent import rank_series
from traintop.cluster.exporter import HostCollector, HostState, RankLabels
from traintop.cluster.metrics_server import MetricsServer
from traintop.samples import Frame, GpuInfo, GpuProcess, GpuSample, Owner, RankSample

GiB = 2**30
needs_prometheus = pytest.mark.skipif(shutil.which("prometheus") is None, reason="no prometheus binary")
VICTIM = {"train": 0.95, "input": 0.05}  # where the victim's ranks' time goes
IMPOSTOR = {"train": 0.10, "other": 0.90}


def test_a_job_id_of_several_owners_is_one_job_per_owner():
    o = claims.JobOwners()
    o.see("4242", "uid 1000", host="a", rank=0)
    assert o.name("4242", "uid 1000") == "4242"  # one owner: the id as it is
    o.see("4242", "uid 1001", host="b", rank=2)
    assert (o.name("4242", "uid 1000"), o.name("4242", "uid 1001")) == ("4242 (uid 1000)", "4242 (uid 1001)")
    o.see("4242", "uid 1000", vouched=True)
    assert (o.name("4242", "uid 1000"), o.name("4242", "uid 1001")) == ("4242", "4242 (uid 1001)")
    o.see("4242", "uid 1001", vouched=True)  # two clusters' job 4242 in one Prometheus: neither keeps it
    assert o.name("4242", "uid 1001") == "4242 (uid 1001)" and o.name("4242", "uid 1000") == "4242 (uid 1000)"
    assert o.name("4242", "") == "4242 (owner unknown)" and o.name("77", "uid 5") == "77"
    # a job id shaped like the name one owner's share was given is another job still
    o.see("4242 (uid 1000)", "uid 1001")
    assert o.name("4242 (uid 1000)", "uid 1001") == "4242 (uid 1000) (uid 1001)"
    found: list = []
    o.conflicts(found)
    (c,) = found
    assert (c.rule, c.subject, c.job) == ("rank_owners_differ", "job 4242", "4242")
    assert "uid 1000 (a rank 0" in c.evidence and "uid 1001 (b rank 2" in c.evidence


def test_on_one_host_a_claim_its_host_vouches_for_is_exported_and_the_other_is_not():
    mine = RankSample(pid=10, rank=0, world_size=2, job="4242", uid=1000, job_uid=1000)
    theirs = RankSample(pid=11, rank=0, world_size=2, job="4242", uid=1001)
    ranks, found = rank_series([mine, theirs], None)
    assert [(labels.uid, labels.job_uid) for labels, _ in ranks] == [("1000", "1000")]
    assert {f[0] for f in found} == {"rank_claimed_twice", "rank_owners_differ"}
    forged = RankSample(pid=12, rank=1, world_size=2, job="4242", uid=1001, job_uid=1000)  # not its own uid
    (labels, _), = rank_series([forged], None)[0]
    assert labels.job_uid == ""


# -- through a real Prometheus --------------------------------------------------------------------

class _Host:
    """An agent's exporter for one host, publishing a fresh state every half second."""

    def __init__(self, state) -> None:
        self.state = state  # () -> HostState
        self.coll = HostCollector(state())
        reg = CollectorRegistry(auto_describe=False)
        reg.register(self.coll)
        self.server = MetricsServer("127.0.0.1", 0, reg)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.server_port}"


def _ranks_host(name, ranks, t0, util):
    """A host running ``ranks``: [(RankLabels, seconds a step, the ledger's shares)], one GPU each."""
    def state():
        elapsed = time.monotonic() - t0
        gpus = tuple(GpuSample(int(lb.local_rank), util=util, mem_used=40 * GiB) for lb, _, _ in ranks)
        samples = tuple((lb, RankSample(pid=100 + k, rank=int(lb.rank), world_size=int(lb.world_size), step_time=st,
                                        steps=int(elapsed / st), input_wait=shares.get("input", 0.0)))
                        for k, (lb, st, shares) in enumerate(ranks))
        ledger = tuple((lb, b, share * elapsed) for lb, _, shares in ranks for b, share in shares.items())
        infos = tuple(GpuInfo(int(lb.local_rank), "NVIDIA H200", uuid=f"GPU-{name}-{lb.local_rank}") for lb, _, _ in ranks)
        return HostState(name, frame=Frame(t=time.time(), gpus=gpus), gpus=infos, ranks=samples, ledger=ledger)
    return state


def _serve(hosts, wait_s, *analyze_args):
    """Serve the hosts to a real Prometheus for ``wait_s`` seconds, then `analyze --prometheus --json`."""
    from test_cluster_prometheus import start_prometheus

    stop = threading.Event()
    served = [_Host(h) for h in hosts]

    def tick():
        while not stop.wait(0.5):
            for h in served:
                h.coll.publish(h.state())
    threading.Thread(target=tick, daemon=True).start()
    tmp = tempfile.mkdtemp(prefix="traintop-owners-")
    prom, url = start_prometheus({"traintop": [h.target for h in served]}, os.path.join(tmp, "p"))
    try:
        time.sleep(wait_s)
        r = subprocess.run([sys.executable, "-m", "traintop", "analyze", "--prometheus", url, "--since",
                            f"{wait_s + 5:.0f}s", "--json", *analyze_args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout), url, (stop, served, prom, tmp)
    except BaseException:
        _stop((stop, served, prom, tmp))
        raise


def _stop(handles) -> None:
    stop, served, prom, tmp = handles
    stop.set()
    for h in served:
        h.server.shutdown()
    prom.terminate()
    prom.wait(10)
    shutil.rmtree(tmp, ignore_errors=True)


def _job_rank(job, rank, uid, vouched=False):
    kw = {"job_uid": str(uid)} if vouched else {}
    return RankLabels(job=job, rank=str(rank), local_rank=str(rank % 2), world_size="4", uid=str(uid), **kw)


def _forged_job(vouched: bool):
    t0 = time.monotonic()
    victim = _ranks_host("node-a", [(_job_rank("4242", r, 1000, vouched), 0.1, VICTIM) for r in (0, 1)], t0, 95.0)
    # another user on a second host: ranks 2-3 of job 4242, twice as slow, their time mostly elsewhere
    impostor = _ranks_host("node-b", [(_job_rank("4242", r, 1001), 0.2, IMPOSTOR) for r in (2, 3)], t0, 30.0)
    return victim, impostor


def _judged_apart(report, victim_job: str) -> None:
    rules = [(f["rule"], f["host"], f["subject"]) for f in report["findings"]]
    assert not [r for r in rules if r[0] in ("straggler", "straggler_node")], rules  # nobody lags its own job
    jobs = {h["host"]: h["jobs"] for h in report["hosts"]}
    assert jobs == {"node-a": [victim_job], "node-b": ["4242 (uid 1001)"]}, jobs
    goodput = {row["job"]: row["goodput"] for row in report["ledger"]}
    assert goodput[victim_job] == pytest.approx(0.95, abs=0.02) and goodput["4242 (uid 1001)"] == pytest.approx(0.10, abs=0.02)
    (owners,) = [f for f in report["findings"] if f["rule"] == "rank_owners_differ"]
    assert owners["scope"] == "cluster" and owners["subject"] == "job 4242"
    assert owners["host"] == ("node-b" if victim_job == "4242" else "node-a")  # the one judged apart, else the first
    assert "uid 1000 (node-a ranks 0-1" in owners["evidence"] and "uid 1001 (node-b ranks 2-3" in owners["evidence"]


@needs_prometheus
def test_another_users_ranks_on_a_second_host_are_a_job_of_their_own():
    """Neither user's ranks are vouched for (torchrun, or a host without Slurm's cgroups): each keeps
    its own ranks, time and verdicts, and neither is called the other's straggler."""
    report, _, handles = _serve(_forged_job(vouched=False), 25)
    try:
        _judged_apart(report, "4242 (uid 1000)")
    finally:
        _stop(handles)


@needs_prometheus
def test_the_job_its_host_vouches_for_keeps_its_id():
    report, url, handles = _serve(_forged_job(vouched=True), 25)
    try:
        _judged_apart(report, "4242")
        assert "keeps job 4242" in next(f for f in report["findings"] if f["rule"] == "rank_owners_differ")["evidence"]
        only = subprocess.run([sys.executable, "-m", "traintop", "analyze", "--prometheus", url, "--since", "30s",
                               "--job", "4242", "--json"], capture_output=True, text=True, timeout=120)
        assert only.returncode == 0, only.stderr[-2000:]
        assert {row["job"] for row in json.loads(only.stdout)["ledger"]} == {"4242", "4242 (uid 1001)"}
    finally:
        _stop(handles)


# -- the by-job view: SLURM_JOB_ID in the environment, a cgroup named job_4242 by its user ------------

def _cgroup_dir(*parts):
    base = pathlib.Path("/sys/fs/cgroup/pids")
    d = base.joinpath(*parts)
    try:
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup.procs").stat()
    except OSError:
        return None
    return d


def _as_nobody(script: str, env: dict) -> subprocess.Popen:
    p = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c",
                          script + " && echo ready && exec sleep 120"], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, **env))
    if p.stdout.readline().strip() != "ready":
        p.kill()
        pytest.skip("nobody cannot run here")
    return p


@needs_prometheus
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: processes of nobody, a cgroup subtree delegated to it")
def test_nobodys_claims_of_job_4242_hold_gpus_apart_from_the_victims_job_in_the_by_job_view():
    from traintop.cluster.groups import group_lines
    from traintop.cluster.owners import GpuOwners
    from traintop.cluster.snapshot import PrometheusSource
    from traintop.collectors.whose import whose

    tag = uuid.uuid4().hex[:8]
    parts = ("user.slice", "user-65534.slice", f"user@65534-{tag}.service")
    deleg = _cgroup_dir(*parts)
    if deleg is None:
        pytest.skip("this kernel does not let us make cgroups here")
    os.chown(deleg, 65534, 65534)
    job_dir = deleg / "job_4242"
    procs = []
    handles = None
    try:
        procs.append(_as_nobody("true", {"SLURM_JOB_ID": "4242"}))  # the environment's word
        procs.append(_as_nobody(f"mkdir {job_dir} && echo $$ > {job_dir}/cgroup.procs", {}))  # a cgroup of its own
        env_pid, cgroup_pid = procs[0].pid, procs[1].pid
        alice = Owner(11, uid=1000, user="alice", slurm_job="4242", job_from="cgroup")  # Slurm's own job 4242

        def lookup(pid, **kw):
            return whose(pid, **kw) if pid in (env_pid, cgroup_pid) else alice

        t0 = time.monotonic()

        def node(name, procs_gib, util):
            owners = GpuOwners(lookup=lookup, nested=False)

            def state():
                gpu = GpuSample(0, util=util, mem_used=40 * GiB,
                                processes=tuple(GpuProcess(pid, gib * GiB) for pid, gib in procs_gib))
                frame = Frame(t=time.time(), gpus=(gpu,))
                return HostState(name, frame=frame, gpus=(GpuInfo(0, "NVIDIA H200", uuid=f"GPU-{name}"),),
                                 owners=owners.of(frame), sample_t=time.time() - (time.monotonic() - t0))
            return state

        report, url, handles = _serve([node("node-a", [(11, 30)], 95.0),
                                       node("node-b", [(env_pid, 20), (cgroup_pid, 10)], 0.0)], 15)
        source = PrometheusSource(url, window=60)
        try:
            snap = source()
        finally:
            source.close()
        util = {(g.host, g.index): g.util for g in snap.gpus}
        jobs = {g.name: g for g in group_lines(snap.held, util, "job")}
        assert set(jobs) == {"4242", "4242 (uid 65534)", ""}, set(jobs)
        assert (jobs["4242"].gpus, jobs["4242"].hosts, jobs["4242"].idle_hours) == (1, 1, 0.0)
        assert jobs["4242 (uid 65534)"].idle_hours > 0 and jobs["4242 (uid 65534)"].mem_held == 20 * GiB
        assert jobs[""].mem_held == 10 * GiB  # its own cgroup named job_4242: no job at all
        rows = {(r["user"], r["job"], r["job_from"]) for r in report["idle_held"]}
        assert ("nobody", "4242", "environment") in rows and not any(r[0] == "nobody" and r[2] == "cgroup" for r in rows)
        text = subprocess.run([sys.executable, "-m", "traintop", "analyze", "--prometheus", url, "--since", "20s"],
                              capture_output=True, text=True, timeout=120).stdout
        assert "user nobody, job 4242 (its own claim)" in text, text
    finally:
        if handles is not None:
            _stop(handles)
        for p in procs:
            p.kill()
            p.wait()
        for d in (job_dir, deleg, deleg.parent, deleg.parent.parent):
            try:
                d.rmdir()
            except OSError:
                break


# -- the agent vouches for a rank's job by its own process's cgroup -----------------------------------

def _serve_probe(uid, directory, job, rank, name_pid=None, cgroup=None) -> int:
    """A forked process of ``uid`` (moved into ``cgroup`` first) serving a probe's messages on
    probe-<name_pid or its pid>.sock in ``directory``. Returns its pid."""
    import socket as sk

    pid = os.fork()
    if pid:
        return pid
    try:  # the child: nothing here may return into pytest
        if cgroup is not None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))
        os.setgid(uid)
        os.setuid(uid)
        srv = sk.socket(sk.AF_UNIX, sk.SOCK_STREAM)
        srv.bind(os.path.join(directory, f"probe-{name_pid or os.getpid()}.sock"))
        srv.listen(4)
        srv.settimeout(0.1)
        conns = []
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                conns.append(srv.accept()[0])
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


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a Slurm-shaped cgroup, a process of nobody")
def test_the_agent_vouches_for_a_ranks_job_by_its_own_processs_slurm_cgroup():
    """A root process in the cgroup Slurm would make for job 31337 (root's, /slurm_<tag>/uid_0/job_31337)
    and a process of nobody claiming the same job — its socket even named after the first one's PID:
    only the first one's claim is vouched for. The PID that counts is the kernel's (SO_PEERCRED)."""
    import signal

    from traintop.collectors.node import AllProbes

    tag = uuid.uuid4().hex[:8]
    parts = (f"slurm_{tag}", "uid_0", "job_31337")
    job_dir = _cgroup_dir(*parts)
    if job_dir is None:
        pytest.skip("this kernel does not let us make cgroups here")
    base = tempfile.mkdtemp(prefix="traintop-vouch-")
    os.chmod(base, 0o711)
    pids = []
    try:
        mine, theirs = os.path.join(base, "0"), os.path.join(base, "65534")
        os.mkdir(mine, 0o700)
        os.mkdir(theirs, 0o700)
        os.chown(theirs, 65534, 65534)
        pids.append(_serve_probe(0, mine, "31337", 0, cgroup=job_dir))
        pids.append(_serve_probe(65534, theirs, "31337", 1, name_pid=pids[0]))
        probes = AllProbes(dirs=lambda: [mine, theirs])
        ranks = ()
        for _ in range(100):  # bounded: 10 s
            ranks = probes.ranks()
            if len(ranks) == 2:
                break
            time.sleep(0.1)
        probes.close()
        assert sorted((r.rank, r.uid, r.job_uid) for r in ranks) == [(0, 0, 0), (1, 65534, None)]
        labelled, _ = rank_series(ranks, None)
        assert sorted((lb.rank, lb.uid, lb.job_uid) for lb, _ in labelled) == [("0", "0", "0"), ("1", "65534", "")]
    finally:
        for p in pids:
            os.kill(p, signal.SIGKILL)
            os.waitpid(p, 0)
        shutil.rmtree(base, ignore_errors=True)
        d = job_dir
        for _ in parts:
            try:
                d.rmdir()
            except OSError:
                break
            d = d.parent
