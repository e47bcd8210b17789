"""Reads a time range of a cluster out of Prometheus: GPUs by host, ranks by job, agents' findings.

Everything lands on one time grid (``start + k·step``, the grid ``query_range`` answers
on), so the cross-host rules compare hosts and ranks at the same instants.
"""

from __future__ import annotations

import re
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from traintop.cluster import claims, gaps
from traintop.cluster import series as S
from traintop.cluster.checks import Checked, gpu_index_of, rank_labels_of
from traintop.cluster.promapi import Grid, GridSeries, Prometheus, no_gc
from traintop.errors import NoTraintopSeries, TraintopError
from traintop.samples import LEDGER_BUCKETS

MAX_POINTS = 720  # per series and query: 2 h at a 10 s step
READERS = 2  # queries under way at once: Prometheus prepares one answer while this process decodes another
LOOKBACK_S = 300  # Prometheus's default lookback: how far before an instant its value may come from


def host_of(s: GridSeries) -> str:
    return s.get("Hostname", "hostname", "instance", default="?")


def job_of(s: GridSeries) -> str:
    # Without honor_labels, Prometheus renames the exposed `job` to `exported_job`.
    return s.get("exported_job", "job", default="unknown")


@dataclass
class GpuData:
    host: str
    index: int
    model: str = ""
    util: dict = field(default_factory=dict)  # t -> ratio 0..1
    clock_ratio: dict = field(default_factory=dict)  # t -> SM clock / max
    power: dict = field(default_factory=dict)
    power_limit: float | None = None
    mem_used: dict = field(default_factory=dict)
    mem_total: float | None = None
    temp: dict = field(default_factory=dict)
    reasons: dict = field(default_factory=dict)
    xid_total: dict = field(default_factory=dict)
    last_xid: dict = field(default_factory=dict)
    ecc_uncorrected: dict = field(default_factory=dict)


@dataclass
class RankData:
    job: str
    rank: int
    local_rank: int
    world_size: int
    host: str
    uid: str = ""  # the owner of the rank's process, as its agent saw it (the socket's peer); "" unknown
    claimed: str = ""  # the job id its series carry, where ``job`` names one owner's share of it (claims.py)
    vouched: bool = False  # its host's Slurm cgroup shows its process in that very job
    step: dict = field(default_factory=dict)  # t -> seconds per step
    steps: dict = field(default_factory=dict)  # t -> steps so far
    wait: dict = field(default_factory=dict)  # t -> input wait ratio


@dataclass
class AgentFinding:
    host: str
    rule: str
    severity: str
    subject: str
    times: list  # grid times at which it was active


@dataclass
class ClusterData:
    url: str
    start: float
    end: float
    step: float
    grid: list
    gpus: dict = field(default_factory=dict)  # (host, index) -> GpuData
    ranks: dict = field(default_factory=dict)  # (job, rank) -> RankData
    findings: list = field(default_factory=list)
    loader_cpu: dict = field(default_factory=dict)  # host -> {t: ratio}
    mode: str = "traintop"
    notes: list = field(default_factory=list)
    unreadable: set = field(default_factory=set)  # hosts whose agent says NVML cannot read their GPUs
    conflicts: list = field(default_factory=list)  # claims.Conflict: two sources for one host, one rank
    owners: dict = field(default_factory=dict)  # (host, gpu) -> [(Owner labels, {t: bytes held})]
    ledger: dict = field(default_factory=dict)  # job -> {bucket: rank-seconds over the range} (the probes' ledgers)
    ledger_by_owner: dict = field(default_factory=dict)  # (job id, owner) -> {bucket: rank-seconds}: ``ledger``'s source
    job_owners: claims.JobOwners = field(default_factory=claims.JobOwners)  # who uses each job id (claims.py)
    samples: gaps.Samples = field(default_factory=gaps.Samples)  # each host's real sample times

    @property
    def hosts(self) -> list[str]:
        return sorted({h for h, _ in self.gpus} | {r.host for r in self.ranks.values()} | self.unreadable)

    def jobs(self) -> dict[str, list[RankData]]:
        out: dict[str, list[RankData]] = {}
        for r in self.ranks.values():
            out.setdefault(r.job, []).append(r)
        for rs in out.values():
            rs.sort(key=lambda r: r.rank)
        return out


def choose_step(span: float, scrape_s: float = 1.0) -> float:
    return max(scrape_s, span / MAX_POINTS)


def _int(text: str, default: int = 0) -> int:
    try:
        return int(text)
    except ValueError:
        return default


# the labels each kind of series is read by (``slim``: the others are left in Prometheus)
HOST_BY = ("Hostname", "hostname", "instance")
GPU_BY = HOST_BY + ("gpu",)
RANK_BY = HOST_BY + ("exported_job", "job", "rank", "local_rank", "world_size", "uid", "job_uid")
FINDING_BY = HOST_BY + ("rule", "severity", "subject")
OWNER_BY = GPU_BY + ("user", "uid", "hpc_job", "claimed_job", "pod_uid", "claimed_pod", "claimed_namespace",
                     "container", "exported_container")  # without honor_labels, a target's own container label wins
MAX_RANKS_PER_JOB = 1_000_000  # a job's rank-seconds over a range are at most this many times the range
_UID = re.compile(r"[0-9]{1,10}")
OWNER_MAX_BYTES = 2.0 ** 50  # what one owner can hold on one GPU (a PiB): above, a forged value


@dataclass(frozen=True, slots=True)
class OwnerLabels:
    """Whose processes hold a GPU, as its agent labelled them (collectors/whose.py; "" unknown)."""

    user: str
    job: str
    pod: str  # what the processes claim (claimed_pod, claimed_namespace)
    namespace: str
    container: str
    uid: str = ""
    job_from: str = ""  # "cgroup": the host vouches for the job (hpc_job); "environment": the processes' word
    pod_uid: str = ""

    def claim(self) -> tuple[str, str, bool]:
        """(the job id its processes use, their owner as claims.py compares them, whether the host vouches)."""
        name = self.user.replace("(", "").replace(")", "")  # an owner is told in parentheses (claims.py)
        owner = claims.owner_of(self.uid) or (f"user {name}" if name else "")
        return self.job, owner, self.job_from == "cgroup"

# What is read, as (the series' field in the series table, the attribute it fills here): the
# query names come from the table, so a name it does not hold raises instead of reading nothing.
RANK_READS = (("step_time", "step"), ("steps", "steps"), ("input_wait", "wait"))
GPU_READS = (("power_w", "power"), ("mem_used", "mem_used"), ("temp_c", "temp"), ("reasons", "reasons"))
GPU_ERROR_READS = (("xid_total", "xid_total"), ("last_xid", "last_xid"), ("ecc_uncorrected", "ecc_uncorrected"))
GPU_LIMIT_READS = (("power_limit_w", "power_limit"), ("mem_total", "mem_total"))
# Each host's sample times (gaps.py): of the series every agent serves, its GPUs' and its ranks'
SAMPLE_TIMES = (f"max by ({', '.join(HOST_BY)}) "
                f"(timestamp({{__name__=~\"{S.agent('info')}|{S.gpu('util')}|{S.rank('steps')}\"}}))")


def fetch(prom: Prometheus, start: float, end: float, step: float | None = None, job: str | None = None) -> ClusterData:
    return fetch_grid(prom, Grid.over(start, end, step or choose_step(end - start)), end, job)


def fetch_grid(prom: Prometheus, grid: Grid, end: float, job: str | None = None, slim: bool = False,
               part_of: ClusterData | None = None) -> ClusterData:
    """Every series of the cluster on ``grid``. ``slim``: each series comes with only the
    labels read here (``max by``): for a read of a few instants, where the labels would be
    most of the answer. ``part_of``: the data this read extends (nothing found is then no
    error: the window still holds what was). The queries are independent: ``READERS`` of
    them are under way at once, so Prometheus prepares the next answer while this process
    decodes one."""
    pool = ThreadPoolExecutor(READERS, thread_name_prefix="prometheus")
    try:
        with no_gc():
            return _fetch(prom, grid, end, job, slim, part_of, pool)
    except BaseException:
        if prom.budget is not None:
            prom.budget.cancel()  # the queries under way end now, not at their own deadlines
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if prom.budget is not None:
            prom.budget.cancelled.clear()  # a fallback read (dcgm.py) may follow under the same budget


class _Ask:
    """Submits queries to the pool: over the grid (``slim``: with only the labels ``by``) or at ``end``."""

    def __init__(self, prom: Prometheus, grid: Grid, end: float, slim: bool, pool: ThreadPoolExecutor):
        self.prom, self.grid, self.end, self.slim, self.pool = prom, grid, end, slim, pool

    def __call__(self, promql: str, by: tuple[str, ...] = GPU_BY) -> Future:
        return self.pool.submit(self.prom.query_grid, f"max by ({', '.join(by)}) ({promql})" if self.slim else promql,
                                self.grid)

    def now(self, promql: str) -> Future:
        return self.pool.submit(self.prom.query, promql, self.end)


@dataclass
class _Asked:
    """The queries under way, as (the attribute each fills, its answer to come) where several are alike."""

    moved: Future
    util: Future
    ranks: list
    gpus: list
    limits: list
    findings: Future
    unreadable: Future
    loader: Future
    owners: Future
    ledger: Future
    times: Future | None


def _ask_all(ask: _Ask, span: int, part_of: ClusterData | None) -> _Asked:
    """Every query of a read, submitted at once (the GPUs' error counters come later, if ``moved``)."""
    # error counters stay flat on a healthy fleet: read them only where one moved (a margin
    # of Prometheus's lookback before the range: the first instant may show a change from there)
    moved = ask.now(" or ".join(f"count(changes({S.gpu(f)}[{span + LOOKBACK_S}s]) > 0)"
                                for f in ("xid_total", "ecc_uncorrected")))
    util = ask(S.gpu("util"), GPU_BY + ("modelName", "model_name"))
    ranks = [(attr, ask(S.rank(f), RANK_BY)) for f, attr in RANK_READS]
    # the clock ratio is taken in Prometheus: one series read instead of two (matched on every label)
    gpus = [("clock_ratio", ask(f"{S.gpu('sm_clock')} / {S.gpu('sm_clock_max')}"))]
    gpus += [(attr, ask(S.gpu(f))) for f, attr in GPU_READS]
    limits = [(attr, ask.now(f"max by ({', '.join(GPU_BY)}) (max_over_time({S.gpu(f)}[{span}s]))"))
              for f, attr in GPU_LIMIT_READS]
    findings = ask(S.agent("findings"), FINDING_BY)
    # GPUs here that the agent cannot read: such a node has no GPU series, and is no CPU node
    unreadable = ask.now(f"max by ({', '.join(HOST_BY)}) "
                         f"(max_over_time({S.agent('gpus_unreadable')}[{max(span, 60)}s])) == 1")
    loader = ask(S.host("loader_cpu"), HOST_BY)
    owners = ask(S.owner("owner_bytes"), OWNER_BY)  # "who holds idle GPUs", the view's grouping by job or user
    # where each job's time went: the ranks' ledgers summed over the range (one instant query)
    ledger = ask.now(f"sum by (job, exported_job, uid, job_uid, bucket) (increase({S.ledger()}[{span}s]))")
    # a refresh (part_of) reads a few instants: too few sample times to tell a gap from a scrape
    times = ask.pool.submit(ask.prom.query_grid, SAMPLE_TIMES, ask.grid) if part_of is None else None
    return _Asked(moved, util, ranks, gpus, limits, findings, unreadable, loader, owners, ledger, times)


@dataclass
class _Answers:
    """The series answered, where each host's name is read from (as (attribute, series) where several are alike)."""

    util: list
    ranks: list
    gpus: list
    limits: list
    findings: list
    loader: list

    def every(self) -> list:
        return [self.util] + [r for _, r in self.ranks] + [r for _, r in self.gpus] + [r for _, r in self.limits] \
            + [self.findings, self.loader]


def _answers(ask: _Ask, asked: _Asked, part_of: ClusterData | None) -> _Answers:
    """The answers of the series that name hosts; NoTraintopSeries where Prometheus holds no agent's."""
    util = asked.util.result()
    if not util and part_of is None and not ask(f"count({S.agent('info')})", ()).result():
        raise NoTraintopSeries(ask.prom.shown)
    ranks = [(f, q.result()) for f, q in asked.ranks]
    gpu_qs = asked.gpus
    if asked.moved.result():
        gpu_qs = gpu_qs + [(attr, ask(S.gpu(f))) for f, attr in GPU_ERROR_READS]
    gpus = [(attr, q.result()) for attr, q in gpu_qs]
    limits = [(attr, q.result()) for attr, q in asked.limits]
    return _Answers(util, ranks, gpus, limits, asked.findings.result(), asked.loader.result())


@dataclass
class _Claims:
    """Whose is each job id: every owner its ranks, ledgers and GPUs name, with the rows that named them."""

    owners: claims.JobOwners = field(default_factory=claims.JobOwners)
    ledger: list = field(default_factory=list)  # (series, job, owner)
    gpu_owners: list = field(default_factory=list)  # (series, OwnerLabels)
    ranks: list = field(default_factory=list)  # (attribute, series, job, host, rank labels)


def _claims(asked: _Asked, answers: _Answers, job: str | None, span: tuple[float, float], named,
            check: Checked) -> _Claims:
    """Every owner each job id's ranks and ledgers name over the window, before any rank is laid
    into a job (claims.py)."""
    out = _Claims()
    owners = out.owners
    for s in asked.ledger.result():
        lj, uid = job_of(s)[:128], s.get("uid")
        uid = uid if _UID.fullmatch(uid) else ""
        if job is None or lj == job:
            vouched = bool(uid) and s.get("job_uid") == uid
            owners.see(lj, claims.owner_of(uid), vouched, span=span)
            out.ledger.append((s, lj, claims.owner_of(uid)))
    for s in asked.owners.result():  # the GPUs' owners claim job ids too
        who = owner_labels(s)
        out.gpu_owners.append((s, who))
        j, owner, vouched = who.claim()
        if j and (job is None or j == job):
            owners.see(j, owner, vouched, named(s), span=claims.times(s.values))
    for ranks_field, results in answers.ranks:
        for s in results:
            j = job_of(s)
            if job is not None and j != job:
                continue
            labels = rank_labels_of(s, check)
            if labels is None:
                continue
            host = named(s)
            owners.see(j, claims.owner_of(labels[3]), labels[4], host, labels[0], claims.times(s.values))
            out.ranks.append((ranks_field, s, j, host, labels))
    return out


def _lay_ranks(data: ClusterData, rank_rows: list, owners: claims.JobOwners, check: Checked) -> None:
    """Each rank under its job's name for its owner; a rank claimed twice settled (claims.py)."""
    ranks_seen = claims.RankClaims()
    for ranks_field, s, j, host, (rank, local, world, uid, vouched) in rank_rows:
        name = owners.name(j, claims.owner_of(uid))
        ranks_seen.see(name, rank, host, uid, s.values)
        key = (name, rank, host, uid)
        r = data.ranks.get(key)
        if r is None:
            r = data.ranks[key] = RankData(name, rank, local, world, host, uid, j, vouched)
        _merge(r, ranks_field, check.values(s.values, "rank", ranks_field))
    data.ranks = ranks_seen.settle(data.ranks, data.conflicts)


def _gpu_finder(data: ClusterData, hosts: set | None, named, check: Checked):
    """``gpu(series)``: the GpuData a series belongs to (made on first sight); None for a host out of
    ``hosts`` or a series without a GPU index."""

    def gpu(s: GridSeries) -> GpuData | None:
        h = named(s)
        if hosts is not None and h not in hosts:
            return None
        i = gpu_index_of(s, check)
        if i is None:
            return None
        key = (h, i)
        g = data.gpus.get(key)
        if g is None:
            g = data.gpus[key] = GpuData(h, i, s.get("modelName", "model_name"))
        return g

    return gpu


def _lay_gpus(answers: _Answers, gpu, check: Checked) -> None:
    for s in answers.util:
        if (g := gpu(s)) is not None:
            _merge(g, "util", check.values(s.values, "gpu", "util"))
    for attr, results in answers.gpus:
        for s in results:
            if (g := gpu(s)) is not None:
                _merge(g, attr, check.values(s.values, "gpu", attr))
    for attr, results in answers.limits:
        for s in results:
            if (g := gpu(s)) is not None:
                setattr(g, attr, check.value(s.last, "gpu", attr))


def _lay_findings(data: ClusterData, results: list, hosts: set | None, named) -> None:
    for s in results:
        h = named(s)
        if hosts is not None and h not in hosts:
            continue
        if s.values:
            data.findings.append(AgentFinding(h, s.get("rule"), s.get("severity"), s.get("subject"), sorted(s.values)))


def _lay_gpu_owners(data: ClusterData, rows: list, gpu) -> None:
    for s, who in rows:
        if (g := gpu(s)) is None:
            continue
        held = {t: v for t, v in s.values.items() if 0 <= v <= OWNER_MAX_BYTES}
        if held:
            data.owners.setdefault((g.host, g.index), []).append((who, held))


def _lay_ledger(data: ClusterData, rows: list, span: int, owners: claims.JobOwners) -> None:
    for s, lj, owner in rows:
        bucket, v = s.get("bucket"), s.last
        if bucket in LEDGER_BUCKETS and v is not None and 0 <= v <= span * MAX_RANKS_PER_JOB:
            mine = data.ledger_by_owner.setdefault((lj, owner), {})
            mine[bucket] = mine.get(bucket, 0.0) + v
    data.ledger = job_ledger(data.ledger_by_owner, owners)


def _fetch(prom, grid, end, job, slim, part_of, pool) -> ClusterData:
    start, step = grid.start, grid.step
    data = ClusterData(prom.shown, start, end, step, grid.times)
    span = max(1, int(end - start))
    ask = _Ask(prom, grid, end, slim, pool)
    asked = _ask_all(ask, span, part_of)
    answers = _answers(ask, asked, part_of)
    check = Checked()
    # Who claims what: a host's series from two scrape targets, a rank from two hosts or owners.
    # Neither is merged: each source keeps its own name, and each is a finding (claims.py).
    named = claims.host_names(answers.every(), host_of, data.conflicts)
    # Whose is each job id (a refresh's with the window's before it)
    claimed = _claims(asked, answers, job, (start, end), named, check)
    owners = claimed.owners
    if part_of is not None:
        owners = owners.merged(part_of.job_owners, since=part_of.start)
    data.job_owners = owners
    owners.conflicts(data.conflicts)
    _lay_ranks(data, claimed.ranks, owners, check)
    if job is not None and not data.ranks and part_of is None:
        raise TraintopError(f"no ranks of job {job!r} at {prom.shown} between the times asked")
    hosts = {r.host for r in data.ranks.values()} if job is not None else None
    if hosts is not None and part_of is not None:
        hosts |= {r.host for r in part_of.ranks.values()}
    gpu = _gpu_finder(data, hosts, named, check)
    _lay_gpus(answers, gpu, check)
    _lay_findings(data, answers.findings, hosts, named)
    for s in answers.loader:
        _merge(data.loader_cpu, named(s), check.values(s.values, "host", "loader_cpu"), keyed=True)
    _lay_gpu_owners(data, claimed.gpu_owners, gpu)
    _lay_ledger(data, claimed.ledger, span, owners)
    by_host: dict = {}
    for s in asked.times.result() if asked.times is not None else ():
        by_host.setdefault(named(s), []).append(check.sample_times(s.values))
    data.notes.extend(check.notes())
    for s in asked.unreadable.result():
        h = host_of(s)
        if hosts is None or h in hosts:
            data.unreadable.add(h)
    if asked.times is not None:
        data.samples = gaps.read(by_host)
        _drop_stale(data)
    return data


def owner_labels(s: GridSeries) -> OwnerLabels:
    """An owner series' labels: the host's word (user, uid, hpc_job, pod_uid, container) and the
    processes' (claimed_*), each cut to 128 characters; ids checked where they have a shape."""
    get = (lambda *names: s.get(*names, default="")[:128])
    hpc, claimed, uid = get("hpc_job"), get("claimed_job"), get("uid")
    return OwnerLabels(get("user"), hpc or claimed, get("claimed_pod"), get("claimed_namespace"),
                       get("exported_container", "container"), uid if _UID.fullmatch(uid) else "",
                       "cgroup" if hpc else "environment" if claimed else "", get("pod_uid"))


def job_ledger(by_owner: dict, owners: claims.JobOwners) -> dict:
    """The ledgers' rank-seconds per job, each owner's under its own job (``JobOwners.name``)."""
    out: dict = {}
    for (job, owner), buckets in by_owner.items():
        mine = out.setdefault(owners.name(job, owner), {})
        for b, v in buckets.items():
            mine[b] = mine.get(b, 0.0) + v
    return out


def _drop_stale(data: ClusterData) -> None:
    """Drop the values Prometheus carried over instants with no recent sample of their host (its
    lookback over a gap in its data): there, nothing was measured. Notes where no host has any."""
    cur = data.samples.current

    def keep(host: str, d: dict) -> dict:
        return {t: v for t, v in d.items() if cur(host, t)}

    for g in data.gpus.values():
        for attr in ("util", "clock_ratio", "power", "mem_used", "temp", "reasons", "xid_total", "last_xid",
                     "ecc_uncorrected"):
            setattr(g, attr, keep(g.host, getattr(g, attr)))
    for r in data.ranks.values():
        r.step, r.steps, r.wait = keep(r.host, r.step), keep(r.host, r.steps), keep(r.host, r.wait)
    data.loader_cpu = {h: keep(h, d) for h, d in data.loader_cpu.items()}
    for f in data.findings:
        f.times = [t for t in f.times if cur(f.host, t)]
    data.findings = [f for f in data.findings if f.times]
    data.owners = {(h, i): [(who, held) for who, vals in owners if (held := keep(h, vals))]
                   for (h, i), owners in data.owners.items()}
    data.notes.extend(gaps.note(a, b, data.start) for a, b in data.samples.outages()
                      if b >= data.start and a <= data.end)


def _merge(obj, attr, values: dict, keyed: bool = False) -> None:
    """Lay a series' values into a GPU's, rank's or host's dict (most are read once: taken as they are)."""
    if keyed:
        cur = obj.get(attr)
        if cur is None:
            obj[attr] = values
        else:
            cur.update(values)
        return
    cur = getattr(obj, attr)
    if cur:
        cur.update(values)
    else:
        setattr(obj, attr, values)
