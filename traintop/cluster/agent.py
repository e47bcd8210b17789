"""`traintop agent`: one per node — sampler, rules and probe reader, serving Prometheus.

Each host (a real one, or a simulated one: one process may pose as several for scale
tests) has its own Session (monitor and feed thread). After every tick the feed publishes an
immutable ``HostState`` to its collector; ``/metrics`` (prometheus-client's HTTP server,
one thread per scrape) and the textfile writer read that state and nothing else.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, cast

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from traintop.cluster.addresses import is_loopback
from traintop.cluster import series as S
from traintop.cluster.exporter import HostCollector, HostState, RankLabels
from traintop.cluster.metrics_server import MetricsServer
from traintop.cluster.owners import GpuOwners
from traintop.errors import TraintopError
from traintop.watch.hooks import finding_hook
from traintop.reports import waste
from traintop.findings import Severity
from traintop.metrics import rank_gpu, rank_id, step_seconds_per_step
from traintop.mfu import MFU_SPAN_S, mfu, peak_flops
from traintop.samples import LEDGER_BUCKETS
from traintop.rules.across import RANK_CLAIMED, RANK_OWNERS
from traintop.samples import SessionKind
from traintop.watch.session import Session
from traintop.text import one_line

if TYPE_CHECKING:
    from traintop.watch.feeds import SourceFeed

# Prometheus's wiki of default ports hands out 9100-9999 to exporters, and that range is
# full; 19401 lies outside it (dcgm-exporter's 9400 + 10000, + 1), below Linux's
# ephemeral ports, and on no list of exporter ports we found. DESIGN-NOTES.md says more.
DEFAULT_PORT = 19401
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"


def job_from_env(env=os.environ) -> str | None:
    for name in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        if env.get(name):
            return one_line(env[name], limit=64)
    return None


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    host = host.strip("[]") or "127.0.0.1"  # a bare port is this host only: 0.0.0.0 must be asked for
    try:
        p = int(port)
    except ValueError:
        raise TraintopError(f"--listen expects HOST:PORT, got {text!r}") from None
    if not 0 <= p <= 65535:
        raise TraintopError(f"--listen: port {p} is out of range")
    return host, p


class SimulatedRanks:
    """Wraps the simulator: its ranks become ranks of one job spread over several nodes
    (global rank = node rank × GPUs + local rank), one of them possibly a straggler, the
    whole job possibly stalling after a while."""

    def __init__(self, sim, node_rank: int, nodes: int, job: str, straggler: int | None = None,
                 stall_after: float | None = None) -> None:
        self.sim = sim
        self.node_rank, self.nodes, self.job = node_rank, nodes, job
        self.straggler = straggler
        self.stall_at = time.time() + stall_after if stall_after is not None else None
        self._frozen: dict[int, int] = {}

    def next_frame(self):
        f = self.sim.next_frame()
        n = len(f.gpus)
        stalled = self.stall_at is not None and f.t >= self.stall_at
        ranks = []
        for r in f.ranks:
            local = r.rank or 0
            kw = dict(rank=self.node_rank * n + local, local_rank=local, world_size=self.nodes * n, job=self.job)
            if local == self.straggler:
                kw.update(step_time=(r.step_time or 0.08) * 1.7, input_wait=0.38,
                          steps_per_s=(r.steps_per_s or 12.0) / 1.7, steps=int((r.steps or 0) / 1.7))
            if stalled:
                kw.update(steps=self._frozen.setdefault(local, r.steps or 0), step_time=None, steps_per_s=0.0,
                          input_wait=0.0)
            ranks.append(dataclasses.replace(r, **kw))
        return dataclasses.replace(f, ranks=tuple(ranks))


def rank_series(samples, default_job: str | None) -> tuple[list, tuple]:
    """The ranks to export, each with its labels (its owner's uid among them, and that uid again as
    ``job_uid`` where this host vouches for its job), and the findings about who claims which rank:
    a rank of a job claimed by two processes is exported for neither (either may be the impostor)
    unless this host vouches for exactly one of them, and is a finding; a job whose ranks here
    belong to different users is a finding. A probe's job and rank are its own word; its uid is not."""
    labelled = []
    for k, r in enumerate(samples):
        rank = r.rank if r.rank is not None else k
        uid = "" if r.uid is None else str(r.uid)
        vouched = r.job is not None and r.job_uid is not None and r.job_uid == r.uid
        labelled.append((RankLabels(job=r.job or default_job or "unknown", rank=str(rank),
                                    local_rank=str(r.local_rank if r.local_rank is not None else rank),
                                    world_size=str(r.world_size or 1), uid=uid, job_uid=uid if vouched else ""), r))
    by_rank: dict[tuple[str, str], list[RankLabels]] = {}
    owners: dict[str, set[str]] = {}
    for labels, _ in labelled:
        by_rank.setdefault((labels.job, labels.rank), []).append(labels)
        if labels.uid:
            owners.setdefault(labels.job, set()).add(labels.uid)
    claims = tuple((RANK_CLAIMED.id, RANK_CLAIMED.severity.label, one_line(f"job {job} rank {rank}", 128))
                   for (job, rank), claimants in sorted(by_rank.items()) if len(claimants) > 1)
    claims += tuple((RANK_OWNERS.id, RANK_OWNERS.severity.label, one_line(f"job {job}", 128))
                    for job, uids in sorted(owners.items()) if len(uids) > 1)

    def exported(labels: RankLabels) -> bool:
        claimants = by_rank[(labels.job, labels.rank)]
        if len(claimants) == 1:
            return True
        vouched = [c for c in claimants if c.job_uid]
        return len(vouched) == 1 and vouched[0] is labels

    return [(labels, r) for labels, r in labelled if exported(labels)], claims


MAX_LEDGER_SERIES = len(LEDGER_BUCKETS) * 4096  # every bucket of 4096 ranks: a node's history of jobs, bounded


class HostAgent:
    """One host: its session, the state it publishes, its findings' lost GPU-seconds."""

    def __init__(self, hostname: str, session: Session, job: str | None, textfile=None) -> None:
        self.hostname = hostname
        self.session = session
        self.monitor, self.feed = session.monitor, session.feed
        self.mode = session.kind.value
        live = session.kind == SessionKind.LIVE
        source = getattr(self.feed, "source", None)
        # A live agent without GPUs says why once, and serves whether GPUs are here unread
        self.gpu_problem: str | None = getattr(source, "gpu_problem", None) if live else None
        self.gpus_unreadable: bool | None = bool(getattr(source, "gpus_unreadable", False)) if live else None
        self.job = job
        self.textfile = textfile  # a TextfileWriter (textfile.py), or None
        self.collector = HostCollector(HostState(hostname=hostname, gpus=self.monitor.info.gpus, mode=self.mode,
                                                 gpus_unreadable=self.gpus_unreadable))
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self._lost: dict[str, float] = {}
        self._ledger: dict[tuple, float] = {}  # (RankLabels, bucket) -> seconds: the probes' time ledgers
        # FLOPs its steps did so far, its step counter then, its peak: kept once the rank is gone (a counter)
        self._flops: dict[RankLabels, tuple[float, int, float | None]] = {}
        self._xids: dict[int, tuple[int, int]] = {}
        self._holds = waste.Holds.recording(self.feed.interval)
        self._owners = GpuOwners() if live else None  # a simulation's PIDs are made up: nobody's
        self._prev: tuple | None = None  # (frame, the findings up then): it holds until the next tick
        self._last_textfile = 0.0
        self.textfile_error: str | None = None

    def start(self) -> None:
        self.session.start(self.publish)

    def stop(self) -> None:
        self.session.close()
        if self._owners is not None:
            self._owners.close()
        if self.textfile is not None:
            self.textfile.close()

    def publish(self) -> None:
        """Runs on the feed thread after each tick."""
        m = self.monitor
        with m.lock:
            frame = m.store.latest
            active = m.engine.active
        if frame is None:
            return
        self._account(frame, active)
        ranks, claims = rank_series(frame.ranks, self.job)
        p = frame.process
        workers = p.loader_workers if p is not None else ()
        cpus = [w.cpu_percent for w in workers if w.cpu_percent is not None]
        self.collector.publish(HostState(
            hostname=self.hostname, frame=frame, gpus=m.info.gpus, ranks=tuple(ranks),
            findings=tuple((f.rule, f.severity.label, f.subject) for f in active) + claims,
            lost_s=tuple(sorted(self._lost.items())),
            xids=tuple((g, n, code) for g, (n, code) in sorted(self._xids.items())),
            loader_cpu=sum(cpus) / len(cpus) / 100 if cpus else None,
            loader_workers=len(workers) if p is not None else None,
            sample_t=frame.t, mode=self.mode, gpus_unreadable=self.gpus_unreadable,
            probe_refused=self._probe_refused(),
            owners=self._owners.of(frame) if self._owners is not None else (),
            mfu=self._mfu(frame, ranks),
            ledger=tuple((labels, bucket, s) for (labels, bucket), s in sorted(self._ledger.items(),
                                                                              key=lambda kv: (dataclasses.astuple(kv[0][0]),
                                                                                              kv[0][1])))))
        self._write_textfile()

    def _account(self, frame, active) -> None:
        """Each rule's GPU-seconds lost (traintop.waste), a tick at a time: the previous sample holds
        until this one, for the findings that were up then."""
        for g in frame.gpus:
            if g.xid:
                n, _ = self._xids.get(g.index, (0, 0))
                self._xids[g.index] = (n + 1, int(g.xid))
        prev, self._prev = self._prev, (frame, active)
        if prev is None:
            return
        before, up = prev
        held = self._holds.held(before.t, frame.t) if frame.t >= before.t else 0.0
        for labels, r in rank_series(before.ranks, self.job)[0]:
            shares = r.ledger()
            for bucket in LEDGER_BUCKETS if shares else ():  # every bucket once one is known: a fixed count
                share = shares.get(bucket, 0.0)
                key = (labels, bucket)
                if key not in self._ledger and len(self._ledger) >= MAX_LEDGER_SERIES:
                    self._ledger.pop(next(iter(self._ledger)))  # the ranks heard of longest ago first
                self._ledger[key] = self._ledger.pop(key, 0.0) + share * held  # to the end: heard of now
        gpus = {g.index: g for g in before.gpus}
        for f in up:
            if f.severity < Severity.WARNING:
                continue
            cost = waste.sample_cost(f.rule, f.subject, f.explained_by, gpus)
            if cost is not None:
                self._lost[f.rule] = self._lost.get(f.rule, 0.0) + held * cost

    def _mfu(self, frame, ranks) -> tuple:
        """Per rank: FLOPs its steps did so far, the peak of its GPU at its precision, its steps' MFU
        (a rank gone keeps its FLOPs and peak: a counter does not vanish with the process)."""
        names = {g.index: g.name for g in self.monitor.info.gpus}
        position = {id(r): k for k, r in enumerate(frame.ranks)}
        now: dict[RankLabels, float | None] = {}
        for labels, r in ranks:
            done, seen, peak = self._flops.get(labels, (0.0, r.steps or 0, None))
            if r.steps is not None and r.step_flops and r.steps > seen:
                done += r.step_flops * (r.steps - seen)
            if labels not in self._flops and len(self._flops) >= MAX_LEDGER_SERIES // len(LEDGER_BUCKETS):
                self._flops.pop(next(iter(self._flops)))  # ranks long gone first (insertion order)
            gpu = rank_gpu(frame, r.pid)
            peak = peak_flops(names.get(gpu) if gpu is not None else None, r.matmul_mode) or peak
            self._flops[labels] = (done, r.steps if r.steps is not None else seen, peak)
            with self.monitor.lock:
                period = step_seconds_per_step(self.monitor.store, rank_id(r, position.get(id(r), 0)), MFU_SPAN_S)
            now[labels] = mfu(r.step_flops, period, names.get(gpu), r.matmul_mode) if gpu is not None else None
        return tuple((labels, done, peak, now.get(labels)) for labels, (done, _, peak) in self._flops.items())

    def _probe_refused(self) -> tuple[tuple[str, int], ...]:
        """The probe reader's refusals so far (a live agent's), each said once in one line."""
        guard = getattr(getattr(getattr(self.feed, "source", None), "probes", None), "guard", None)
        if guard is None:
            return ()
        for note in guard.take_notes():
            print(one_line(note, 400), file=sys.stderr, flush=True)
        return tuple(guard.refused.items())

    def _write_textfile(self) -> None:
        if self.textfile is None:
            return
        now = time.monotonic()
        if now - self._last_textfile < 1.0:
            return
        self._last_textfile = now
        try:
            self.textfile.write(generate_latest(self.registry))  # a random temporary file renamed over the old one
            self.textfile_error = None
        except (OSError, TraintopError) as e:
            if self.textfile_error is None:
                why = e.strerror or e if isinstance(e, OSError) else e
                print(f"traintop: cannot write {one_line(self.textfile.path, 200)}: {why}", file=sys.stderr)
            self.textfile_error = str(e)


def build_hosts(args) -> list[HostAgent]:
    from traintop.watch import sessions

    hook = finding_hook(args.on_finding, lambda msg: print(f"traintop: {one_line(msg)}", file=sys.stderr, flush=True))
    job = args.job or job_from_env()
    n_hosts = args.hosts
    if args.simulate and args.only_gpus is not None:
        raise TraintopError("--only-gpus picks real GPUs: it does not go with --simulate (use --gpus)")
    if n_hosts > 1 and not args.simulate:
        raise TraintopError("--hosts poses as several hosts only with --simulate")
    if n_hosts > 1 and args.record:
        raise TraintopError("--record keeps one host's recording: not with --hosts")
    textdir = args.textfile
    if textdir is not None:
        from traintop.cluster.textfile import check_path

        problem = check_path(textdir)
        if problem:
            raise TraintopError(f"--textfile: {one_line(textdir, 200)} {problem}")
    base = one_line(args.hostname or socket.gethostname(), limit=64)
    hosts = []
    for i in range(n_hosts):
        name = base if n_hosts == 1 else f"{base}-{i:03d}"
        textfile = None
        if textdir is not None:
            from traintop.cluster.textfile import TextfileWriter

            safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)
            textfile = TextfileWriter(textdir, "traintop.prom" if n_hosts == 1 else f"traintop-{safe}.prom")
        if args.simulate:
            session = sessions.simulated_session(args.simulate, gpus=args.gpus, seed=args.seed + i,
                                                 interval=args.interval, history_s=60.0, record=args.record,
                                                 config=args.thresholds)
            node_rank = args.node_rank + i
            feed = cast("SourceFeed", session.feed)
            feed.source = SimulatedRanks(feed.source, node_rank, max(args.nodes, args.node_rank + n_hosts), job or "sim",
                                         straggler=args.straggler, stall_after=args.stall_after)
        else:
            session = sessions.agent_session(args.interval, record=args.record, config=args.thresholds,
                                             only=args.only_gpus, probes_per_user=args.probes_per_user)
        session.attach_hook(hook, host=name)  # one hook for every host, each event naming its host
        hosts.append(HostAgent(name, session, job, textfile=textfile))
    return hosts


def gpu_note(h: HostAgent) -> str | None:
    """One line when a live agent reads no GPU: unreadable ones (a GPU node), or none here."""
    if h.gpu_problem is None:
        return None
    problem = one_line(h.gpu_problem, 300)
    if h.gpus_unreadable:
        return (f"traintop: {h.hostname}: this node has NVIDIA GPUs that NVML cannot read ({problem}); serving "
                f"the host and the probes' series, and {S.agent('gpus_unreadable')} 1")
    return f"traintop: {h.hostname}: no NVIDIA GPU here ({problem}); serving the host and the probes' series"


def serve(hosts: list[HostAgent], listen: str | None, say=print) -> list:
    """Start one HTTP server per host on consecutive ports (port 0: any free port each)."""
    addr, port = parse_listen(listen or DEFAULT_LISTEN)
    if not is_loopback(addr):
        say(f"traintop: warning: serving metrics on {addr}:{port}, reachable beyond this host "
            "(they name hosts, GPUs and job ids; no authentication)")
    servers: list[MetricsServer] = []
    for i, h in enumerate(hosts):
        p = port + i if port else 0
        try:
            server = MetricsServer(addr, p, h.registry).start()
        except OSError as e:
            for s in servers:
                s.shutdown()
            raise TraintopError(f"cannot listen on {addr}:{p}: {e.strerror or e}") from None
        servers.append(server)
        shown = f"[{addr}]" if ":" in addr else addr
        say(f"traintop: {h.hostname}: http://{shown}:{server.server_port}/metrics")
    return servers


def run_agent(args) -> int:
    if args.listen is not None:  # a bad option is its one line, before NVML or a session starts and says anything
        _, port = parse_listen(args.listen)
        if port and port + args.hosts - 1 > 65535:
            raise TraintopError(f"--listen: ports {port} to {port + args.hosts - 1} (--hosts {args.hosts}) "
                                "go past 65535")
    hosts = build_hosts(args)
    say = (lambda *a: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    servers = []
    done = threading.Event()
    import signal

    old = signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        for h in hosts:
            note = gpu_note(h)
            if note:
                print(note, file=sys.stderr, flush=True)  # even with --quiet: a node's GPUs go unseen
        if args.textfile is None or args.listen:
            servers = serve(hosts, args.listen, say)
        for h in hosts:
            h.start()
        if args.textfile:
            say(f"traintop: writing {len(hosts)} file(s) to {args.textfile} for node_exporter's textfile collector")
        deadline = time.monotonic() + args.duration if args.duration else None
        while not done.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                break
            done.wait(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, old)
        for s in servers:
            s.shutdown()
        for h in hosts:  # every host stops sampling before the hook they share is closed
            h.feed.stop()
        for h in hosts:
            h.stop()
    errors = [h.monitor.recording_error for h in hosts if h.monitor.recording_error]
    if errors:
        raise TraintopError(f"{errors[0]} (samples up to the error are kept)")
    return 0
