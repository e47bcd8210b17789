"""The agent's series: names, units, labels — one table, read by the exporter and the readers.

Names are ``traintop_*`` in base units (ratios 0–1, bytes, watts, joules, hertz, seconds);
counters end in ``_total``. GPU series carry dcgm-exporter's labels so PromQL joins them to
DCGM's; per-rank series carry ``job``, ``rank``, ``local_rank``, ``world_size``. Labels are
bounded: no PIDs, command lines, paths or environment. Owner series carry who holds a GPU
(user, uid, job, pod, container), checked ids only, what the processes claim named as claims
(collectors/whose.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from traintop.samples import LEDGER_BUCKETS

# dcgm-exporter's GPU labels (its released versions spell the host label "Hostname"; its
# unreleased main branch renamed it "hostname" — readers accept both).
GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
# A MIG device's series carry these too, as dcgm-exporter's do: its GPU's gpu, UUID, device and
# modelName, its profile ("1g.18gb") and its GPU instance id. A whole GPU's series have neither.
MIG_LABELS = ("GPU_I_PROFILE", "GPU_I_ID")
# uid: the owner of the rank's process, from its probe socket's peer credentials (a number);
# job_uid: that uid again where the host vouches for the job (the process is in that Slurm job's
# cgroup), empty where the job is the probe's word alone (collectors/whose.py)
RANK_LABELS = ("job", "rank", "local_rank", "world_size", "uid", "job_uid", "Hostname")
HOST_LABELS = ("Hostname",)
# Whose processes hold a GPU (collectors/whose.py). What the host vouches for: the user and uid,
# ``hpc_job`` (dcgm-exporter's name; only a Slurm job its root-owned cgroup shows), the pod's uid
# (from the kubelet's cgroup) and the container. What the processes say of themselves, named so:
# ``claimed_job`` (SLURM_JOB_ID or the torchrun run id of their environment), ``claimed_pod`` and
# ``claimed_namespace`` (their environment, their service account's file). Not `job`, which
# Prometheus gives every series (the scrape job); not `pod`/`namespace`, which read as the
# kubelet's word where dcgm-exporter's series carry them. No PIDs.
OWNER_LABELS = ("gpu", "UUID", "Hostname", "user", "uid", "hpc_job", "claimed_job", "pod_uid", "claimed_pod",
                "claimed_namespace", "container")


@dataclass(frozen=True, slots=True)
class Series:
    name: str  # without the traintop_ prefix
    field: str  # the sample field it comes from
    help: str
    scale: float = 1.0  # sample unit -> base unit
    counter: bool = False


P = "traintop_"

# One line per GPU series (kept few: at 10 000 GPUs every series is 10 000 more).
GPU_SERIES = (
    Series("gpu_utilization_ratio", "util", "Share of the last sample period a kernel ran (NVML utilization)", 0.01),
    Series("gpu_sm_active_ratio", "sm_active", "Share of SM cycles with a warp resident (GPM; Hopper and later)", 0.01),
    Series("gpu_tensor_active_ratio", "tensor_active", "Share of cycles the tensor pipes were busy (GPM)", 0.01),
    Series("gpu_memory_used_bytes", "mem_used", "GPU memory in use"),
    Series("gpu_memory_total_bytes", "mem_total", "GPU memory in total"),
    Series("gpu_power_watts", "power_w", "Power draw"),
    Series("gpu_power_limit_watts", "power_limit_w", "Enforced power limit"),
    Series("gpu_energy_joules_total", "energy_j", "Energy used since the driver loaded", counter=True),
    Series("gpu_temperature_celsius", "temp_c", "GPU temperature"),
    Series("gpu_temperature_slowdown_celsius", "temp_slowdown_c", "Temperature at which the GPU slows down"),
    Series("gpu_sm_clock_hertz", "sm_clock", "SM clock", 1e6),
    Series("gpu_sm_clock_max_hertz", "sm_clock_max", "Highest SM clock", 1e6),
    Series("gpu_clock_event_reasons", "reasons", "NVML clock-event (throttle) reason bits"),
    Series("gpu_pcie_rx_bytes_per_second", "pcie_rx", "PCIe traffic to the GPU"),
    Series("gpu_pcie_tx_bytes_per_second", "pcie_tx", "PCIe traffic from the GPU"),
    Series("gpu_nvlink_rx_bytes_per_second", "nvlink_rx", "NVLink traffic to the GPU over all its links (GPM)"),
    Series("gpu_nvlink_tx_bytes_per_second", "nvlink_tx", "NVLink traffic from the GPU over all its links (GPM)"),
    Series("gpu_throttle_thermal_ratio", "throttle_thermal", "Share of the last window clocks were held down by heat", 0.01),
    Series("gpu_throttle_power_ratio", "throttle_power", "Share of the last window clocks were held down by power", 0.01),
    Series("gpu_ecc_uncorrected_errors_total", "ecc_uncorrected", "Uncorrectable ECC errors since the driver loaded", counter=True),
    Series("gpu_ecc_corrected_errors_total", "ecc_corrected", "Corrected ECC errors since the driver loaded", counter=True),
)
# Derived per GPU (no sample field): counted by the agent, keyed here by the names readers use.
GPU_DERIVED = (
    Series("gpu_xid_errors_total", "xid_total", "Critical XID events the agent saw", counter=True),
    Series("gpu_last_xid", "last_xid", "The last XID code the agent saw (0: none)"),
    Series("gpu_stale", "stale", "1 when the GPU's driver did not answer in time"),
)

RANK_SERIES = (
    Series("step_seconds", "step_time", "Median seconds per optimizer step over the last sample"),
    Series("steps_total", "steps", "Optimizer steps since the job started", counter=True),
    Series("steps_skipped_total", "skipped_steps", "Of those, the steps a GradScaler skipped (inf or NaN gradients)",
           counter=True),
    Series("input_wait_ratio", "input_wait", "Share of wall time spent waiting in DataLoader.__next__"),
    Series("torch_allocated_bytes", "allocated", "Bytes allocated by PyTorch's caching allocator"),
    Series("torch_reserved_bytes", "reserved", "Bytes reserved by PyTorch's caching allocator"),
    Series("torch_alloc_retries_total", "alloc_retries", "Allocations retried after freeing the cache", counter=True),
    Series("torch_ooms_total", "ooms", "Out-of-memory errors raised by the allocator", counter=True),
)

# Per rank and ledger bucket (label ``bucket``): the probe's time ledger, summed by the agent.
LEDGER_SERIES = (
    Series("rank_time_seconds_total", "ledger", "Seconds of the rank's wall time in each bucket of the probe's time "
           "ledger (train, input, checkpoint, eval, compile, startup, stalled, other)", counter=True),
)

# Per rank: the FLOPs its steps did and the peak they are measured against, so that PromQL can take the
# MFU over any range (rate(flops) / rate(time_seconds{bucket="train"}) / peak); and the agent's own figure.
MFU_SERIES = (
    Series("rank_flops_total", "flops", "FLOPs the rank's optimizer steps did (one step as the probe counted it, "
           "times the steps)", counter=True),
    Series("rank_peak_flops", "peak_flops", "Dense peak FLOP/s of the rank's GPU at the precision its matmuls run in "
           "(the MFU's denominator)"),
    Series("rank_mfu_ratio", "mfu", "Model FLOPs utilization of the rank's steps over their last 30 s of training "
           "and input wait (pauses excluded: the time ledger shows them)"),
)

HOST_SERIES = (
    Series("host_cpu_ratio", "cpu_percent", "Host CPU in use", 0.01),
    Series("host_iowait_ratio", "iowait", "Host CPU time waiting for I/O", 0.01),
    Series("host_memory_used_bytes", "mem_used", "Host memory in use"),
    Series("host_memory_total_bytes", "mem_total", "Host memory in total"),
)
# Derived per host: the probed jobs' loader workers, and the agent's own series.
HOST_DERIVED = (
    Series("host_loader_worker_cpu_ratio", "loader_cpu", "Mean CPU of the probed jobs' DataLoader workers, of one core"),
    Series("host_loader_workers", "loader_workers", "DataLoader workers of the probed jobs"),
)
# Per GPU and owner (a user, a job, a pod): what that owner's processes hold and do there.
OWNER_SERIES = (
    Series("gpu_owner_memory_bytes", "owner_bytes", "GPU memory held by one owner's processes (user, job, pod)"),
    Series("gpu_owner_sm_ratio", "owner_sm", "Share of the GPU's time one owner's processes computed "
           "(NVML's per-process samples)", 0.01),
)
AGENT_SERIES = (
    Series("finding_active", "findings", "1 while a traintop finding is active (absent otherwise)"),  # {rule, severity, subject}
    Series("gpu_seconds_lost_total", "lost_s", "GPU-seconds left unused while a finding was active, by rule",
           counter=True),  # {rule}
    Series("agent_info", "info", "The traintop agent serving these series"),  # {version, mode}: 1
    Series("agent_last_sample_age_seconds", "sample_age", "Seconds since the agent's last complete sample, at the "
           "scrape (it grows while sampling is stuck)"),
    Series("agent_probe_refused_total", "probe_refused", "Probe connections, ranks, messages or directory entries "
           "the agent refused past its bounds, by reason", counter=True),  # {reason}: probe_limits.REASONS
    Series("gpus_unreadable", "gpus_unreadable", "1 when this node has NVIDIA GPUs that the agent cannot read "
           "through NVML (no GPU series then: not a CPU node)"),
)


class UnknownSeries(LookupError):
    """A series asked for by a name the table does not hold: a typo, which would otherwise read as
    an empty answer (no data), never as an error."""


def _index(*tables: tuple[Series, ...]) -> dict[str, Series]:
    return {s.field: s for table in tables for s in table}


_BY_KIND = {"gpu": _index(GPU_SERIES, GPU_DERIVED), "rank": _index(RANK_SERIES),
            "host": _index(HOST_SERIES, HOST_DERIVED), "agent": _index(AGENT_SERIES), "owner": _index(OWNER_SERIES),
            "ledger": _index(LEDGER_SERIES), "mfu": _index(MFU_SERIES)}


def series(kind: str, field: str) -> Series:
    """The series of a ``kind`` (gpu, rank, host, agent) keyed by its field name; an unknown one raises."""
    try:
        return _BY_KIND[kind][field]
    except KeyError:
        known = ", ".join(sorted(_BY_KIND.get(kind, {})))
        raise UnknownSeries(f"no traintop {kind} series for {field!r} (known: {known})") from None


def name(kind: str, field: str) -> str:
    """The full Prometheus name (``traintop_…``) of a series keyed by its field name; an unknown one raises."""
    return P + series(kind, field).name


def gpu(field: str) -> str:
    return name("gpu", field)


def rank(field: str) -> str:
    return name("rank", field)


def host(field: str) -> str:
    return name("host", field)


def agent(field: str) -> str:
    return name("agent", field)


def owner(field: str) -> str:
    return name("owner", field)


def ledger() -> str:
    return name("ledger", "ledger")


def series_per_gpu() -> int:
    return len(GPU_SERIES) + len(GPU_DERIVED)


def series_per_rank() -> int:
    """A rank's series: its own, one per ledger bucket once its probe keeps the ledger, and its MFU's."""
    return len(RANK_SERIES) + len(LEDGER_BUCKETS) + len(MFU_SERIES)


def all_names() -> set[str]:
    """Every series name the agent exposes (counters with their ``_total``)."""
    return {P + s.name for table in (GPU_SERIES, GPU_DERIVED, RANK_SERIES, HOST_SERIES, HOST_DERIVED, AGENT_SERIES,
                                     OWNER_SERIES, LEDGER_SERIES, MFU_SERIES) for s in table}
