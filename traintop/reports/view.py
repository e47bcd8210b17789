"""Plain view-models built from the Monitor for the widgets (which never see collectors).

Built under the monitor's lock in one pass, so a redraw shows one consistent moment.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from traintop.attribution import WorkerLoad
from traintop.metrics import gpu_key, host_key, ledger_shares, proc_key, rank_id, rank_key, step_seconds_per_step
from traintop.mfu import MFU_SPAN_S, mfu
from traintop.watch.monitor import Monitor
from traintop.rules.config import DEFAULT, Thresholds
from traintop.findings import Finding
from traintop.samples import (
    LEDGER_BUCKETS,
    POWER_BRAKE_REASONS,
    REASON_SW_POWER_CAP,
    THERMAL_REASONS,
    Frame,
    GpuInfo,
    GpuSample,
    HostSample,
    Owner,
    ProcessSample,
    RankSample,
)

SERIES_POINTS = 240
LEDGER_WINDOW_S = 300.0  # the process panel's time ledger covers this much


@dataclass(frozen=True)
class GpuProcView:
    """A process on a GPU, and whose it is."""

    gpu: int  # the row's index (NVML's, or a MIG device's row)
    pid: int
    used_bytes: int | None
    sm_util: float | None  # its share of the GPU, % (None: not read)
    owner: Owner | None  # None: not looked up (the simulator, a recording, an import)


def busiest_first(p: GpuProcView) -> tuple:
    """By its share of the GPU, then by the memory it holds."""
    return -(p.sm_util or 0.0), -(p.used_bytes or 0), p.gpu, p.pid


def gpu_procs(g: GpuSample) -> tuple[GpuProcView, ...]:
    return tuple(sorted((GpuProcView(g.index, p.pid, p.used_bytes, p.sm_util, p.owner) for p in g.processes),
                        key=busiest_first))


@dataclass(frozen=True)
class GpuView:
    info: GpuInfo
    sample: GpuSample
    util: list
    power: list
    mem: list
    temp: list
    badges: tuple[str, ...]
    alert_level: int  # highest active alert severity on this GPU (0 none)
    alert_title: str | None = None  # the title of that alert
    procs: tuple[GpuProcView, ...] = ()  # its processes, the busiest first


@dataclass(frozen=True)
class HostView:
    sample: HostSample | None
    cpu: list


@dataclass(frozen=True)
class RankView:
    sample: "RankSample"
    gpu: int | None  # NVML index of the GPU holding this rank's memory
    nvml_used: int | None  # what NVML attributes to this rank's process there
    allocated: list
    reserved: list
    nvml: list
    step_time: list
    input_wait_10s: float | None = None  # mean over the last 10 s (one sample is noisy)
    ledger: dict = field(default_factory=dict)  # bucket -> share of wall time over the last LEDGER_WINDOW_S
    ledger_s: float | None = None  # the time the ledger covers: LEDGER_WINDOW_S, or less where the data is younger
    mfu: float | None = None  # model FLOPs utilization (traintop.mfu), where the GPU and precision are known


@dataclass(frozen=True)
class ProcessView:
    sample: ProcessSample | None
    cpu: list
    ended_at: float | None
    gpu_mem: dict  # GPU index -> bytes NVML attributes to this process tree
    ranks: list = field(default_factory=list)  # RankView per probed process
    thresholds: Thresholds = DEFAULT  # what the rules call a saturated worker, a long input wait
    launched: bool = False  # started by `traintop run`: the probe was injected
    job_end: object | None = None  # traintop.watch.job.JobEnd once a launched job has ended
    workers: WorkerLoad | None = None  # the tree's loader workers, by the rules' own definition
    # No probe data in the latest sample although the job had the probe (idle, ended, stopped
    # reporting): for how long. None: it has probe data now, or never had (then: no probe).
    probe_silent_s: float | None = None
    live: bool = True  # watching now (a process can be attached), not a recording or a log played back
    gpu_share: dict = field(default_factory=dict)  # GPU index -> % of its time the tree computed (NVML)
    capture: object | None = None  # the latest evidence captured (traintop.samples.Capture)
    owners: tuple[Owner, ...] = ()  # whose the tree's GPU processes are (distinct; none where not looked up)
    gpu_procs: tuple[GpuProcView, ...] = ()  # every GPU's processes, the busiest first (shown with none attached)
    ranks_last_seen: bool = False  # the job has ended: ``ranks`` are as its probes last reported them
    rss: list = field(default_factory=list)  # the tree's resident memory over time (bytes)


@dataclass(frozen=True)
class View:
    t: float | None
    kind: str
    label: str
    driver: str | None
    cuda_driver: str | None
    hostname: str | None
    interval: float
    gpus: list[GpuView]
    host: HostView
    process: ProcessView
    active: tuple[Finding, ...]  # the engine's records as they stood (frozen: it makes new ones as they change)
    recent: tuple[Finding, ...]
    recording_error: str | None = None
    source_error: str | None = None  # one line for the status bar: why data is missing or stale
    extra: dict = field(default_factory=dict)
    collector_errors: dict = field(default_factory=dict)  # collector -> "collector X failing: why"
    thresholds: Thresholds = DEFAULT
    hook_error: str | None = None  # --on-finding's failures, one line


def badges_for(sample: GpuSample) -> tuple[str, ...]:
    r = sample.reasons or 0
    out = []
    if r & THERMAL_REASONS:
        out.append("THERMAL")
    if r & POWER_BRAKE_REASONS:
        out.append("PWR BRAKE")
    if r & REASON_SW_POWER_CAP:
        out.append("PWR CAP")
    return tuple(out)


def ledger_covers(store, subject: str, span: float, interval: float | None) -> float | None:
    """The seconds the ledger over the last ``span`` seconds covers: ``span`` at most, less where
    its first sample is younger (each sample accounts for the ``interval`` before it)."""
    first = store.first_time([rank_key(subject, "time_" + b) for b in LEDGER_BUCKETS], span)
    if first is None or store.t_last is None:
        return None
    return min(span, store.t_last - first + (interval or 0.0))


@dataclass(frozen=True)
class _RankFigures:
    """What a rank's view reads from the store: the same until the next sample (Store.memo)."""

    allocated: list
    reserved: list
    nvml: list
    step_time: list
    input_wait_10s: float | None
    period: float | None  # its training seconds a step (MFU's denominator)
    ledger: dict
    ledger_s: float | None


def _rank_figures(store, subject: str, r: RankSample, gpu: int | None, points: int,
                  interval: float | None) -> _RankFigures:
    # The store keeps the GPU's used memory, not per-process history: the chart says so.
    nvml_series = store.last(gpu_key(gpu, "mem_used"), points) if gpu is not None else []
    waits = [v for v in store.window(rank_key(subject, "input_wait"), 10.0) if v is not None]
    # MFU is the steps' own: their FLOPs over the time the ledger gives them and their input
    # (pauses between steps are the ledger's to show); a probe without a ledger: the step rate's period
    period = step_seconds_per_step(store, subject, MFU_SPAN_S)
    if period is None and not r.ledger():
        rates = sorted(v for v in store.present(rank_key(subject, "steps_per_s"), 30.0) if v > 0)
        period = 1.0 / rates[len(rates) // 2] if rates else None
    return _RankFigures(store.last(rank_key(subject, "allocated"), points), store.last(rank_key(subject, "reserved"), points),
                        nvml_series, store.last(rank_key(subject, "step_time"), points),
                        sum(waits) / len(waits) if waits else None, period,
                        ledger_shares(store, subject, LEDGER_WINDOW_S),
                        ledger_covers(store, subject, LEDGER_WINDOW_S, interval))


def _distinct_owners(owners: dict[Owner, None]) -> tuple[Owner, ...]:
    """One per user and job: a job's ranks differ only in their PIDs."""
    seen: dict[tuple, Owner] = {}
    for o in owners:
        seen.setdefault((o.visible, o.user, o.job, o.slurm_step, o.container, o.pod_uid), o)
    return tuple(seen.values())


def build_view(monitor: Monitor, points: int = SERIES_POINTS) -> View:
    with monitor.lock:
        store = monitor.store
        frame: Frame | None = store.latest
        info = monitor.info
        infos = {g.index: g for g in info.gpus}
        # causes first, most severe first; what a stronger finding explains after them
        active = tuple(sorted(monitor.engine.active, key=lambda a: (a.explained_by is not None, -a.severity, a.start)))
        recent = tuple(a for a in reversed(monitor.engine.alerts) if not a.active)  # all: the panel counts what it cuts
        gpus = _gpu_views(store, frame, infos, active, points)
        host = HostView(frame.host if frame else None, store.last(host_key("cpu_percent"), points))
        proc = frame.process if frame else None
        gpu_mem, gpu_share, owners = _tree_on_gpus(proc, frame)
        seen = frame.ranks if frame else ()
        # the job has ended: its ranks as last seen, with the history the store keeps (the time ledger)
        last_seen = not seen and monitor.ended_at is not None and bool(monitor.last_ranks)
        ranks = _rank_views(store, frame, infos, info.interval, monitor.last_ranks if last_seen else seen, points)
        config = monitor.engine.config
        pview = ProcessView(proc, store.last(proc_key("cpu_percent"), points), monitor.ended_at, gpu_mem, ranks,
                            config, launched=monitor.launched, job_end=monitor.job_end,
                            workers=WorkerLoad(proc.loader_workers, config.starvation_busy_worker_cpu) if proc else None,
                            probe_silent_s=(frame.t - monitor.probe_seen_at) if frame is not None and not seen
                            and monitor.probe_seen_at is not None else None, ranks_last_seen=last_seen,
                            live=info.kind in ("live", "simulated"), gpu_share=gpu_share,
                            capture=monitor.captures[-1] if monitor.captures else None,
                            owners=_distinct_owners(owners), rss=store.last(proc_key("rss"), points),
                            gpu_procs=tuple(sorted((p for gv in gpus for p in gv.procs), key=busiest_first)))
        if frame is not None and frame.stale_gpus and not monitor.source_error:
            stale = f"GPU {', '.join(map(str, frame.stale_gpus))}: the driver did not answer in time (data stale)"
        else:
            stale = None
        failing = {name: f"collector {name} failing: {why}" for name, why in monitor.collector_errors.items()}
        return View(
            t=frame.t if frame else None, kind=info.kind, label=info.label, driver=info.driver,
            cuda_driver=info.cuda_driver, hostname=info.hostname, interval=info.interval,
            gpus=gpus, host=host, process=pview, active=active, recent=recent,
            recording_error=monitor.recording_error,
            source_error=monitor.source_error or "; ".join(failing.values()) or stale,
            collector_errors=failing, thresholds=monitor.engine.config,
            hook_error=monitor.hook.problem() if monitor.hook is not None else None,
        )


def _gpu_views(store, frame: Frame | None, infos: dict, active: tuple, points: int) -> list[GpuView]:
    """Each GPU of the frame with its charts' series and its most severe finding that is a cause."""
    gpus: list[GpuView] = []
    if frame is None:
        return gpus
    for g in frame.gpus:
        i = g.index
        mine = [a for a in active if a.subject == f"gpu{g.index}" and not a.explained_by]  # most severe first
        gpus.append(GpuView(
            info=infos.get(g.index) or GpuInfo(index=g.index, name="GPU"),
            sample=g,
            # a MIG device has no utilization (NVML answers NOT_SUPPORTED): its GPM SM activity
            util=store.last(gpu_key(i, "util" if g.parent is None else "sm_active"), points),
            power=store.last(gpu_key(i, "power_w"), points),
            mem=store.last(gpu_key(i, "mem_used"), points),
            temp=store.last(gpu_key(i, "temp_c"), points),
            badges=("STALE",) + badges_for(g) if g.index in frame.stale_gpus else badges_for(g),
            alert_level=int(mine[0].severity) if mine else 0,
            alert_title=mine[0].title if mine else None,
            procs=gpu_procs(g),
        ))
    return gpus


def _tree_on_gpus(proc, frame: Frame | None) -> tuple[dict[int, int], dict[int, float], dict[Owner, None]]:
    """The attached process tree on each GPU: its memory, the share of the GPU's time it computed
    (NVML, %), and the owners its processes there carry (ordered, distinct)."""
    gpu_mem: dict[int, int] = {}
    gpu_share: dict[int, float] = {}  # GPU index -> % of its time the tree's processes computed (NVML)
    owners: dict[Owner, None] = {}  # ordered, distinct
    if proc is not None and frame is not None:
        pids = {m.pid for m in proc.members} | {proc.pid}
        for g in frame.gpus:
            owners.update((gp.owner, None) for gp in g.processes if gp.pid in pids and gp.owner is not None)
            used = [gp.used_bytes or 0 for gp in g.processes if gp.pid in pids]
            if used:
                gpu_mem[g.index] = sum(used)
            shares = [gp.sm_util for gp in g.processes if gp.pid in pids and gp.sm_util is not None]
            if shares:
                gpu_share[g.index] = min(100.0, sum(shares))
    return gpu_mem, gpu_share, owners


def _rank_views(store, frame: Frame | None, infos: dict, interval: float | None, shown, points: int) -> list[RankView]:
    """The probed ranks ``shown`` (the frame's, or those last seen), each with its GPU and figures."""
    ranks = []
    probed = [(rank_id(r, k), r) for k, r in enumerate(shown)]
    if any(r.cuda for _, r in probed):  # launchers (torchrun) carry a probe too: show the ranks
        probed = [(subject, r) for subject, r in probed if r.cuda or r.steps]
    for subject, r in probed:
        gpu = nvml_used = None
        for g in frame.gpus if frame is not None else ():
            for gp in g.processes:
                if gp.pid == r.pid:
                    gpu, nvml_used = g.index, gp.used_bytes
        # the same sample (the frame's, or the ranks last seen) until the store changes: its id is enough
        fig = store.memo(("rank view", subject, id(r), gpu, points, interval),
                         lambda subject=subject, r=r, gpu=gpu: _rank_figures(store, subject, r, gpu, points, interval))
        gpu_name = infos[gpu].name if gpu is not None and gpu in infos else None
        ranks.append(RankView(r, gpu, nvml_used, fig.allocated, fig.reserved, fig.nvml, fig.step_time,
                              fig.input_wait_10s, ledger=fig.ledger, ledger_s=fig.ledger_s,
                              mfu=mfu(r.step_flops, fig.period, gpu_name, r.matmul_mode)))
    return ranks
