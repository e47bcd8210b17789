"""One host's latest state as Prometheus metric families (through prometheus-client).

The sampler thread publishes an immutable ``HostState`` after every tick; a scrape turns the
state it finds into families. A scrape never takes the monitor's lock and never waits for
the sampler, and the sampler never waits for a scrape: a slow or stuck scraper costs only
its own HTTP thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from traintop import __version__
from traintop.cluster import series as S
from traintop.samples import Frame, GpuInfo


@dataclass(frozen=True, slots=True)
class RankLabels:
    job: str
    rank: str
    local_rank: str
    world_size: str
    uid: str = ""  # the process owner's uid, from the probe socket's peer credentials
    job_uid: str = ""  # uid again where this host vouches for the job (its Slurm cgroup); "" the probe's word


class OwnerRow(NamedTuple):
    """Whose processes hold one GPU (``S.OWNER_LABELS``), what they hold there and compute."""

    gpu: int
    user: str
    uid: str
    hpc_job: str  # a Slurm job the host vouches for (its cgroup)
    claimed_job: str  # the processes' own word (their environment)
    pod_uid: str
    claimed_pod: str
    claimed_namespace: str
    container: str  # its first 12 digits
    held: int  # bytes
    sm: float | None  # share of the GPU's time, %


@dataclass(frozen=True, slots=True)
class HostState:
    hostname: str
    frame: Frame | None = None
    gpus: tuple[GpuInfo, ...] = ()
    ranks: tuple[tuple[RankLabels, object], ...] = ()  # (labels, RankSample)
    findings: tuple[tuple[str, str, str], ...] = ()  # active (rule, severity, subject)
    lost_s: tuple[tuple[str, float], ...] = ()  # (rule, GPU-seconds lost so far)
    xids: tuple[tuple[int, int, int], ...] = ()  # (gpu, events counted, last code)
    loader_cpu: float | None = None
    loader_workers: int | None = None
    sample_t: float | None = None  # the wall time of the last complete sample: its age is taken at the scrape
    mode: str = "live"
    extra: dict = field(default_factory=dict)
    gpus_unreadable: bool | None = None  # None: not a live agent (simulated): the series is left out
    owners: tuple[OwnerRow, ...] = ()  # whose processes hold each GPU
    ledger: tuple[tuple, ...] = ()  # (RankLabels, bucket, seconds so far): the probes' time ledgers
    mfu: tuple[tuple, ...] = ()  # (RankLabels, FLOPs so far, peak FLOP/s or None, MFU or None)
    probe_refused: tuple[tuple[str, int], ...] = ()  # (reason, count so far): a live agent's refusals of probes


def _gpu_labels(host: str, info: GpuInfo | None, index: int, infos: dict | None = None) -> list[str]:
    """dcgm-exporter's labels of a GPU; of a MIG device, those of the GPU it is part of (its
    ``_mig_labels`` tell it apart, as dcgm-exporter's GPU_I_ID does)."""
    if info is not None and info.parent is not None:
        index = info.parent
        info = (infos or {}).get(info.parent) or GpuInfo(index=info.parent, name="", pci_bus_id=info.pci_bus_id,
                                                       minor=info.minor)
    minor = info.minor if info is not None and info.minor is not None else index
    return [str(index), (info.uuid if info else None) or "", (info.pci_bus_id if info else None) or "",
            f"nvidia{minor}", (info.name if info else None) or "", host]


def _mig_labels(info: GpuInfo | None) -> dict[str, str]:
    if info is None or info.parent is None:
        return {}
    return {"GPU_I_PROFILE": info.mig_profile or "", "GPU_I_ID": "" if info.gi_id is None else str(info.gi_id)}


def _add(fam, labels: list[str], value: float, extra: dict[str, str]) -> None:
    """``fam.add_metric``, with a MIG device's two labels where it is one (a family's other
    series keep dcgm-exporter's GPU labels alone, as dcgm-exporter's do)."""
    fam.add_metric(labels, value)
    if extra:
        sample = fam.samples[-1]
        fam.samples[-1] = sample._replace(labels={**sample.labels, **extra})


def _rank_values(labels: RankLabels, host: str) -> list[str]:
    """A rank's label values, in ``S.RANK_LABELS``'s order."""
    return [labels.job, labels.rank, labels.local_rank, labels.world_size, labels.uid, labels.job_uid, host]


def _family(s: S.Series, labels) -> CounterMetricFamily | GaugeMetricFamily:
    """A metric family named, described and typed by the series table."""
    cls = CounterMetricFamily if s.counter else GaugeMetricFamily
    return cls(S.P + s.name, s.help, labels=list(labels))


class HostCollector(Collector):
    """A prometheus-client collector over whatever ``HostState`` the agent published last."""

    def __init__(self, initial: HostState) -> None:
        self.state = initial  # replaced whole (one reference assignment), never mutated

    def publish(self, state: HostState) -> None:
        self.state = state

    def collect(self):
        st = self.state
        host = st.hostname
        out = []
        info = _family(S.series("agent", "info"), ["version", "mode", "Hostname"])
        info.add_metric([__version__, st.mode, host], 1)
        out.append(info)
        if st.sample_t is not None:
            age = _family(S.series("agent", "sample_age"), S.HOST_LABELS)
            age.add_metric([host], max(0.0, time.time() - st.sample_t))
            out.append(age)
        if st.probe_refused:
            refused = _family(S.series("agent", "probe_refused"), ["reason", "Hostname"])
            for reason, n in st.probe_refused:
                refused.add_metric([reason, host], n)
            out.append(refused)
        if st.gpus_unreadable is not None:
            bad = _family(S.series("agent", "gpus_unreadable"), S.HOST_LABELS)
            bad.add_metric([host], 1 if st.gpus_unreadable else 0)
            out.append(bad)
        frame = st.frame
        infos = {g.index: g for g in st.gpus}
        if frame is not None:
            out += self._gpu_families(host, frame, infos, st)
            out += self._host_families(host, frame, st)
        out += self._rank_families(host, st)
        out += self._owner_families(host, infos, st)
        fa = _family(S.series("agent", "findings"), ["rule", "severity", "subject", "Hostname"])
        for rule, severity, subject in st.findings:
            fa.add_metric([rule, severity, subject, host], 1)
        out.append(fa)
        lost = _family(S.series("agent", "lost_s"), ["rule", "Hostname"])
        for rule, seconds in st.lost_s:
            lost.add_metric([rule, host], seconds)
        out.append(lost)
        return out

    @staticmethod
    def _gpu_families(host, frame: Frame, infos, st: HostState):
        fams = []
        for s in S.GPU_SERIES:
            fam = _family(s, S.GPU_LABELS)
            for g in frame.gpus:
                v = getattr(g, s.field)
                if v is None:
                    continue
                info = infos.get(g.index)
                _add(fam, _gpu_labels(host, info, g.index, infos), float(v) * s.scale, _mig_labels(info))
            fams.append(fam)
        xid_total, last, stale = (_family(S.series("gpu", f), S.GPU_LABELS) for f in ("xid_total", "last_xid", "stale"))
        counts = {gpu: (n, code) for gpu, n, code in st.xids}
        for g in frame.gpus:
            info = infos.get(g.index)
            labels, mig = _gpu_labels(host, info, g.index, infos), _mig_labels(info)
            n, code = counts.get(g.index, (0, 0))
            _add(xid_total, labels, n, mig)
            _add(last, labels, code, mig)
            _add(stale, labels, 1 if g.index in frame.stale_gpus else 0, mig)
        return fams + [xid_total, last, stale]

    @staticmethod
    def _owner_families(host, infos, st: HostState):
        held = _family(S.series("owner", "owner_bytes"), S.OWNER_LABELS)
        busy = _family(S.series("owner", "owner_sm"), S.OWNER_LABELS)
        for row in st.owners:
            gpu, info = row.gpu, infos.get(row.gpu)
            mig = _mig_labels(info)
            if mig:  # a MIG device: its GPU's index and UUID, and its own two labels
                gpu, info = info.parent, infos.get(info.parent)
            labels = [str(gpu), (info.uuid if info else None) or "", host, row.user, row.uid, row.hpc_job,
                      row.claimed_job, row.pod_uid, row.claimed_pod, row.claimed_namespace, row.container]
            _add(held, labels, float(row.held), mig)
            if row.sm is not None:
                _add(busy, labels, row.sm * 0.01, mig)
        return [held, busy]

    @staticmethod
    def _host_families(host, frame: Frame, st: HostState):
        fams = []
        h = frame.host
        for s in S.HOST_SERIES:
            fam = _family(s, S.HOST_LABELS)
            v = getattr(h, s.field) if h is not None else None
            if v is not None:
                fam.add_metric([host], float(v) * s.scale)
            fams.append(fam)
        cpu = _family(S.series("host", "loader_cpu"), S.HOST_LABELS)
        if st.loader_cpu is not None:
            cpu.add_metric([host], st.loader_cpu)
        n = _family(S.series("host", "loader_workers"), S.HOST_LABELS)
        if st.loader_workers is not None:
            n.add_metric([host], st.loader_workers)
        return fams + [cpu, n]

    @staticmethod
    def _rank_families(host, st: HostState):
        ledger = _family(S.series("ledger", "ledger"), S.RANK_LABELS + ("bucket",))
        for labels, bucket, seconds in st.ledger:
            ledger.add_metric([*_rank_values(labels, host), bucket], seconds)
        fams = [ledger]
        flops, peak, mfu = (_family(S.series("mfu", f), S.RANK_LABELS) for f in ("flops", "peak_flops", "mfu"))
        for labels, done, peak_flops, ratio in st.mfu:
            names = _rank_values(labels, host)
            flops.add_metric(names, done)
            if peak_flops is not None:
                peak.add_metric(names, peak_flops)
            if ratio is not None:
                mfu.add_metric(names, ratio)
        fams += [flops, peak, mfu]
        for s in S.RANK_SERIES:
            fam = _family(s, S.RANK_LABELS)
            for labels, r in st.ranks:
                v = getattr(r, s.field)
                if v is None:
                    continue
                fam.add_metric(_rank_values(labels, host), float(v) * s.scale)
            fams.append(fam)
        return fams
