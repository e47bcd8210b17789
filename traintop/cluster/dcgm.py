"""Fleets that run only dcgm-exporter: its ``DCGM_FI_*`` series become samples, and the
same local rules run on them here (no agent judged them), plus the cross-host rules that
need no ranks. The report says what cannot be seen without agents.
"""

from __future__ import annotations

from traintop import plausible as P
from traintop.reports import waste
from traintop.reports.analyze import ended
from traintop.cluster import claims
from traintop.cluster import report as R
from traintop.cluster.checks import Checked, gpu_index_of
from traintop.cluster.fetch import ClusterData, GpuData, choose_step
from traintop.cluster.promapi import Grid, Prometheus, Series
from traintop.rules.across import SlowNode
from traintop.rules.config import DEFAULT
from traintop.samples import Frame, GpuInfo, GpuSample, SessionInfo
from traintop.units import MiB

# field -> (DCGM series, scale to traintop's sample unit)
FIELDS = {
    "util": ("DCGM_FI_DEV_GPU_UTIL", 1.0),
    "sm_active": ("DCGM_FI_PROF_SM_ACTIVE", 100.0),
    "tensor_active": ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 100.0),
    "dram_active": ("DCGM_FI_PROF_DRAM_ACTIVE", 100.0),
    "mem_used": ("DCGM_FI_DEV_FB_USED", float(MiB)),
    "mem_free": ("DCGM_FI_DEV_FB_FREE", float(MiB)),
    "power_w": ("DCGM_FI_DEV_POWER_USAGE", 1.0),
    "power_limit_w": ("DCGM_FI_DEV_POWER_MGMT_LIMIT", 1.0),
    "temp_c": ("DCGM_FI_DEV_GPU_TEMP", 1.0),
    "sm_clock": ("DCGM_FI_DEV_SM_CLOCK", 1.0),
    "sm_clock_max": ("DCGM_FI_DEV_MAX_SM_CLOCK", 1.0),
    "reasons": ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 1.0),
    "xid": ("DCGM_FI_DEV_XID_ERRORS", 1.0),
}

# each field's plausible range in traintop's sample units (after the scale above)
BOUNDS = {f: P.GPU.get(f, P.GPU["mem_used"]) for f in FIELDS}  # mem_free: bytes, as mem_used
BOUNDS["xid"] = P.GPU["xid"]

CANNOT_SEE = ("dcgm-exporter only (no traintop agent): no per-rank step times or input wait, no DataLoader "
              "workers or processes, so no straggler rank, stalled job or starving-loader rules; starvation "
              "is judged from utilization alone at the scrape interval")


WITHOUT_RANKS = (SlowNode,)  # the grid rules dcgm-exporter's series alone can feed (and every event)


def host_of(s: Series) -> str:
    return s.get("Hostname", "hostname", "instance", default="?")


def has_dcgm(prom: Prometheus, start: float, end: float) -> bool:
    return bool(prom.query(f"count(last_over_time(DCGM_FI_DEV_GPU_UTIL[{max(1, int(end - start))}s]))", at=end))


def dcgm_report(prom: Prometheus, start: float, end: float, step: float | None, config=None) -> R.ClusterReport:
    data, findings, notes = dcgm_findings(prom, start, end, step, config)
    return R.summarise(data, findings, "dcgm-exporter", None, notes)


def dcgm_findings(prom: Prometheus, start: float, end: float, step: float | None, config=None):
    """The cluster's GPUs from dcgm-exporter's series, and what the local and cross-host rules find."""
    grid = Grid.over(start, end, step or choose_step(end - start))
    data = ClusterData(prom.shown, grid.start, end, grid.step, grid.times, mode="dcgm")
    results = {field: prom.query_grid(name, grid) for field, (name, _) in FIELDS.items()}
    named = claims.host_names(list(results.values()), host_of, data.conflicts)  # two sources: shown apart
    check = Checked()
    cols, models, uuids = _columns(results, named, check)
    findings = []
    missing = sorted({f for c in cols.values() for f in FIELDS} - {f for c in cols.values() for f in c})
    for host in sorted({h for h, _ in cols}):
        findings += _host_findings(data, host, cols, models, uuids, config)
    findings += R.cross_findings(data, config or DEFAULT, WITHOUT_RANKS)
    notes = [CANNOT_SEE] + check.notes()
    if missing:
        notes.append("series not exported here: " + ", ".join(FIELDS[f][0] for f in missing))
    data.notes = notes
    return data, findings, notes


def _columns(results: dict, named, check: Checked) -> tuple[dict, dict, dict]:
    """Each GPU's fields, (host, index) -> {field: {t: value}} in traintop's units (values out of
    their plausible range dropped and counted in ``check``), with its model and UUID by (host, index)."""
    cols: dict[tuple[str, int], dict[str, dict]] = {}
    models: dict[tuple[str, int], str] = {}
    uuids: dict[tuple[str, int], str] = {}
    for field, (name, scale) in FIELDS.items():
        lo, hi = BOUNDS[field]
        for s in results[field]:
            i = gpu_index_of(s, check)
            if i is None:
                continue
            key = (named(s), i)
            vals = {t: v * scale for t, v in s.values.items()} if scale != 1 else s.values
            kept = {t: v for t, v in vals.items() if lo <= v <= hi}
            if len(kept) != len(vals):
                check.values_dropped[field] = check.values_dropped.get(field, 0) + len(vals) - len(kept)
            cols.setdefault(key, {})[field] = kept
            models[key] = s.get("modelName", "model_name") or models.get(key, "")
            uuids[key] = s.get("UUID", "gpu_uuid") or uuids.get(key, "")
    return cols, models, uuids


def _host_findings(data: ClusterData, host: str, cols: dict, models: dict, uuids: dict, config) -> list:
    """One host's GPUs played through the local rules instant by instant (their GpuData laid into
    ``data`` on the way): the findings, each with the GPU-hours it cost."""
    from traintop.watch.monitor import Monitor
    from traintop.rules import default_engine

    keys = sorted(k for k in cols if k[0] == host)
    infos = tuple(GpuInfo(index=i, name=models[(h, i)] or "GPU", uuid=uuids[(h, i)] or None) for h, i in keys)
    monitor = Monitor(SessionInfo(kind="dcgm-exporter", gpus=infos, hostname=host, interval=data.step),
                      engine=default_engine(config) if config else None)
    last_xid = {k: 0.0 for k in keys}
    for t in data.grid:
        gpus = [g for k in keys if (g := _sample(data, k, models[k], cols[k], t, last_xid)) is not None]
        if gpus:
            monitor.ingest(Frame(t=t, gpus=tuple(gpus)))
    monitor.close()
    series = {i: R.gpu_series(g, data.step) for (h, i), g in data.gpus.items() if h == host}
    findings = []
    for a in monitor.engine.alerts:
        lost, _ = waste.finding_cost(a.rule, a.subject, a.explained_by, a.start, ended(a), series)
        findings.append(R.cluster_finding(a, host, R.HOST, lost))
    return findings


def _sample(data: ClusterData, k: tuple[str, int], model: str, c: dict, t: float, last_xid: dict) -> GpuSample | None:
    """GPU ``k``'s sample at ``t`` (None without its utilization), also laid into its GpuData; a new
    XID code is one that differs from the last the GPU showed (``last_xid``, updated)."""
    v = {f: c[f].get(t) for f in c}
    if v.get("util") is None:
        return None
    total = v["mem_used"] + v["mem_free"] if v.get("mem_used") is not None and v.get("mem_free") is not None \
        else None
    xid = v.get("xid")
    new_xid = int(xid) if xid and xid != last_xid[k] else None
    if xid is not None:
        last_xid[k] = xid
    sample = GpuSample(
        index=k[1], util=v["util"], sm_active=v.get("sm_active"), tensor_active=v.get("tensor_active"),
        dram_active=v.get("dram_active"), mem_used=_i(v.get("mem_used")), mem_total=_i(total),
        power_w=v.get("power_w"), power_limit_w=v.get("power_limit_w"), temp_c=v.get("temp_c"),
        sm_clock=_i(v.get("sm_clock")), sm_clock_max=_i(v.get("sm_clock_max")),
        reasons=_i(v.get("reasons")), xid=new_xid)
    g = data.gpus.get(k)
    if g is None:
        # dcgm-exporter's XID gauge holds the last code since the driver loaded: a code
        # already there when the range starts counts as seen (when is unknown)
        g = data.gpus[k] = GpuData(k[0], k[1], model, xid_total={data.start - data.step: 0})
    g.util[t] = v["util"] / 100
    if v.get("power_w") is not None:
        g.power[t] = v["power_w"]
    if v.get("mem_used") is not None:
        g.mem_used[t] = v["mem_used"]
    if v.get("temp_c") is not None:
        g.temp[t] = v["temp_c"]
    if v.get("sm_clock") and v.get("sm_clock_max"):
        g.clock_ratio[t] = v["sm_clock"] / v["sm_clock_max"]
    if v.get("reasons") is not None:
        g.reasons[t] = v["reasons"]
    g.power_limit = v.get("power_limit_w") or g.power_limit
    g.mem_total = total or g.mem_total
    g.xid_total[t] = max(g.xid_total.values(), default=0) + (1 if new_xid else 0)
    if new_xid:
        g.last_xid[t] = new_xid
    return sample


def _i(v):
    return int(v) if v is not None else None
