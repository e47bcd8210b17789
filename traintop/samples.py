"""Typed samples: what every source (live, simulated, replayed) produces.

Units are fixed: bytes, watts, degrees Celsius, MHz, percent (0-100), bytes per second.
A field a source cannot read is ``None``, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

# NVML clock-event ("throttle") reason bits.
REASON_GPU_IDLE = 0x1
REASON_APP_CLOCKS = 0x2
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SYNC_BOOST = 0x10
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80
REASON_DISPLAY_CLOCKS = 0x100

THERMAL_REASONS = REASON_SW_THERMAL | REASON_HW_THERMAL | REASON_HW_SLOWDOWN
POWER_BRAKE_REASONS = REASON_HW_POWER_BRAKE

REASON_NAMES = {
    REASON_GPU_IDLE: "idle",
    REASON_APP_CLOCKS: "app clocks",
    REASON_SW_POWER_CAP: "power cap",
    REASON_HW_SLOWDOWN: "HW slowdown",
    REASON_SYNC_BOOST: "sync boost",
    REASON_SW_THERMAL: "SW thermal",
    REASON_HW_THERMAL: "HW thermal",
    REASON_HW_POWER_BRAKE: "power brake",
    REASON_DISPLAY_CLOCKS: "display clocks",
}


def reason_names(mask: int | None) -> list[str]:
    if not mask:
        return []
    return [name for bit, name in REASON_NAMES.items() if mask & bit]


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """Static facts about one GPU, read once."""

    index: int
    name: str
    uuid: str | None = None
    mem_total: int | None = None
    power_limit_w: float | None = None
    temp_slowdown_c: float | None = None
    sm_clock_max: int | None = None
    mem_clock_max: int | None = None
    pcie_gen_max: int | None = None  # the link the GPU and its slot can reach
    pcie_width_max: int | None = None
    pci_bus_id: str | None = None  # e.g. 00000000:18:00.0, as dcgm-exporter labels it
    minor: int | None = None  # /dev/nvidiaN
    # A physical GPU: its MIG mode (True: enabled; None: not known or no MIG) and how many of its
    # NVLinks are active (read once at start; None: no NVLink or not known).
    mig: bool | None = None
    nvlinks: int | None = None
    # A MIG device (collectors/mig.py): the NVML index of the GPU it is part of, its profile
    # ("1g.18gb") and its GPU and compute instance ids. None on a whole GPU.
    parent: int | None = None
    mig_profile: str | None = None
    gi_id: int | None = None
    ci_id: int | None = None

    @property
    def label(self) -> str:
        """"GPU 3", or for a MIG device "GPU 0 MIG 1g.18gb #1" (its GPU instance; ".2": compute instance 2)."""
        if self.parent is None:
            return f"GPU {self.index}"
        ci = f".{self.ci_id}" if self.ci_id else ""
        gi = f" #{self.gi_id}{ci}" if self.gi_id is not None else ""
        return f"GPU {self.parent} MIG {self.mig_profile or '?'}{gi}"


# usable GB/s per lane and direction after line encoding, by PCIe generation
_PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def pcie_bandwidth(gen: int | None, width: int | None) -> float | None:
    if not gen or not width or gen not in _PCIE_LANE_GBPS:
        return None
    return _PCIE_LANE_GBPS[gen] * 1e9 * width


@dataclass(frozen=True, slots=True)
class Owner:
    """One process's owner and the job it belongs to, as far as it can be known from here."""

    pid: int  # as asked (NVML's PIDs are the host's)
    visible: bool = True  # False: no such process here, or another process carries this number
    ns_pids: tuple[int, ...] = ()  # the PID in each nested namespace, outermost first (NSpid)
    uid: int | None = None
    user: str | None = None
    runtime: str | None = None  # docker, containerd, cri-o, podman, kubernetes
    container: str | None = None  # the container's id (64 hex digits)
    pod_uid: str | None = None
    pod: str | None = None
    namespace: str | None = None
    slurm_job: str | None = None  # "1234", or "1234_7" for an array task
    slurm_step: str | None = None
    run_id: str | None = None  # torchrun's rendezvous run id
    job_from: str | None = None  # "cgroup" (set up by root) or "environment" (the process's own word)

    @property
    def inner_pid(self) -> int | None:
        """The PID inside its container, where it differs from the one asked."""
        return self.ns_pids[-1] if len(self.ns_pids) > 1 else None

    @property
    def job(self) -> str | None:
        """One label for the job: the Slurm job, else the pod, else the torchrun run."""
        if self.slurm_job:
            return self.slurm_job
        if self.pod:
            return f"{self.namespace}/{self.pod}" if self.namespace else self.pod
        return self.run_id


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    used_bytes: int | None
    # its share of the GPU over the last window, in % (NVML's per-process samples; None: not read)
    sm_util: float | None = None
    mem_util: float | None = None
    enc_util: float | None = None
    dec_util: float | None = None
    # whose it is (collectors/whose.py), looked up by the live sampler; None: not looked up (the
    # simulator, a recording, an import: chunks do not keep it)
    owner: Owner | None = field(default=None, kw_only=True)


@dataclass(frozen=True, slots=True)
class GpuSample:
    index: int
    util: float | None = None
    util_min: float | None = None  # windowed: min / max of NVML's utilization sample buffer
    util_max: float | None = None  # since the previous tick (None where unsupported)
    mem_util: float | None = None
    mem_used: int | None = None
    mem_total: int | None = None
    mem_reserved: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    temp_slowdown_c: float | None = None
    sm_clock: int | None = None
    sm_clock_max: int | None = None
    mem_clock: int | None = None
    mem_clock_max: int | None = None
    reasons: int | None = None
    pcie_tx: float | None = None
    pcie_rx: float | None = None
    energy_j: float | None = None
    pcie_gen: int | None = None  # current link; idle GPUs drop to a lower generation to save power
    pcie_width: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    # GPM (Hopper and later): means over the last second of what the SMs did, percent
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    # GPM (Hopper and later): NVLink traffic over all links in the last window, bytes per second
    nvlink_tx: float | None = None
    nvlink_rx: float | None = None
    # share of the last window (percent) the clocks were held down, from NVML's violation counters
    throttle_power: float | None = None
    throttle_thermal: float | None = None
    ecc_corrected: int | None = None  # volatile counts since the driver loaded
    ecc_uncorrected: int | None = None
    remap_pending: int | None = None  # 1: a memory row waits for a GPU reset to be remapped
    xid: int | None = None  # critical XID event code seen since the previous tick
    # A MIG device's row: the index of the GPU it is part of. Power, energy, temperature, clocks,
    # PCIe, NVLink, ECC and XIDs belong to that GPU and are read on its own row, never here (so
    # nothing is counted twice); utilization is GPM's per GPU instance (NVML's answers NOT_SUPPORTED).
    parent: int | None = None
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True, slots=True)
class HostSample:
    cpu_percent: float | None = None
    per_core: tuple[float, ...] = ()
    iowait: float | None = None
    mem_used: int | None = None
    mem_total: int | None = None
    swap_used: int | None = None
    swap_total: int | None = None
    disk_read: float | None = None
    disk_write: float | None = None
    net_rx: float | None = None
    net_tx: float | None = None


@dataclass(frozen=True, slots=True)
class ProcInfo:
    pid: int
    name: str
    cpu_percent: float | None = None
    rss: int | None = None
    threads: int | None = None
    is_loader_worker: bool = False
    ppid: int | None = None  # the parent: a loader worker feeds the rank process it was forked from


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """The attached process and its tree."""

    pid: int
    alive: bool
    name: str = ""
    cmdline: str = ""
    cpu_percent: float | None = None  # the whole tree, in % of one core
    rss: int | None = None  # the whole tree
    threads: int | None = None
    read_rate: float | None = None
    write_rate: float | None = None
    members: tuple[ProcInfo, ...] = ()
    # Live only (recordings do not keep it; None: not known): torch's libraries are mapped into a
    # process of the tree (/proc/PID/maps), the evidence of torch where no probe reports.
    torch: bool | None = None

    @property
    def loader_workers(self) -> tuple[ProcInfo, ...]:
        return tuple(m for m in self.members if m.is_loader_worker)


@dataclass(frozen=True, slots=True)
class Frame:
    """Everything sampled at one tick."""

    t: float
    gpus: tuple[GpuSample, ...] = ()
    host: HostSample | None = None
    process: ProcessSample | None = None
    ranks: tuple["RankSample", ...] = ()  # from probes inside the attached job
    stacks: tuple["StackDump", ...] = ()  # thread stacks a probe sent since the previous tick (not in chunks)
    captures: tuple["Capture", ...] = ()  # evidence a probe captured since the previous tick (not in chunks)
    stale_gpus: tuple[int, ...] = ()  # GPUs whose driver did not answer in time (their fields are None)


class SessionKind(str, Enum):
    """How a session is watched: the one spelling for the dashboard's mode, the feed's kind and
    the kind a recording names. A str, so files and tests that say "live" compare equal."""

    LIVE = "live"
    SIMULATED = "simulated"
    REPLAY = "replay"
    DEMO = "demo"

    __str__ = str.__str__  # "live", not "SessionKind.LIVE", in text and files
    __format__ = str.__format__  # type: ignore[assignment]  # str's, as __str__ above: not Enum's

    @property
    def replays(self) -> bool:
        """Plays a recording (pause, seek, step and speed; nothing to record or ask now)."""
        return self in (SessionKind.REPLAY, SessionKind.DEMO)


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """What a source knows about itself; recordings carry it as metadata."""

    # a SessionKind where traintop watches; a reader says what it read ("import", "dcgm-exporter"),
    # and a recording's file says what it likes (shown as text, never trusted as a kind)
    kind: str
    gpus: tuple[GpuInfo, ...] = ()
    driver: str | None = None
    cuda_driver: str | None = None
    hostname: str | None = None
    interval: float = 0.5
    label: str = ""
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RankSample:
    """What the probe inside one training process (one rank) reports."""

    pid: int
    rank: int | None = None
    world_size: int | None = None
    device: int | None = None
    cuda: bool = False
    allocated: int | None = None
    reserved: int | None = None
    peak: int | None = None
    active: int | None = None
    inactive_split: int | None = None
    alloc_retries: int | None = None
    ooms: int | None = None
    steps: int | None = None
    # of those steps, the ones a GradScaler skipped for inf or NaN gradients (None: none seen)
    skipped_steps: int | None = None
    step_time: float | None = None  # median seconds per optimizer step since the last sample
    steps_per_s: float | None = None
    input_wait: float | None = None  # share (0..1) of wall time spent in DataLoader.__next__
    age: float | None = None  # seconds since the probe's last message
    local_rank: int | None = None
    job: str | None = None  # the scheduler's job id (SLURM_JOB_ID, TORCHELASTIC_RUN_ID) seen by the job itself
    # Live only (recordings do not keep them; None: not known). torch: the process has imported
    # torch; loader: a DataLoader iterator has handed it a batch (else input_wait measures nothing).
    torch: bool | None = None
    loader: bool | None = None
    uid: int | None = None  # the owner of the process, from its probe socket's peer credentials (not recorded)
    # ``uid`` again where this host vouches for ``job``: the process sits in that very Slurm job's
    # cgroup (root's, of Slurm's shape); None where the job is the probe's word alone (not recorded)
    job_uid: int | None = None
    # The time ledger: share (0..1) of the wall time since the last sample spent in each bucket
    # (traintop.injob.goodput.BUCKETS; together about 1).
    time_train: float | None = None
    time_input: float | None = None
    time_collective: float | None = None
    time_checkpoint: float | None = None
    time_eval: float | None = None
    time_compile: float | None = None
    time_startup: float | None = None
    time_stalled: float | None = None
    time_other: float | None = None
    matmul: int | None = None  # the precision its matmuls run in: an index of MATMUL_MODES
    backend: int | None = None  # its default process group's backend: an index of DIST_BACKENDS
    step_flops: float | None = None  # FLOPs of one whole optimizer step, as the probe last counted them

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"PID {self.pid}"

    @property
    def backend_name(self) -> str | None:
        b = self.backend
        return DIST_BACKENDS[b] if b is not None and 0 <= b < len(DIST_BACKENDS) else None

    @property
    def matmul_mode(self) -> str | None:
        m = self.matmul
        return MATMUL_MODES[m] if m is not None and 0 <= m < len(MATMUL_MODES) else None

    def ledger(self) -> dict[str, float]:
        """The buckets this sample knows (share of wall time), in LEDGER_BUCKETS' order."""
        out = {}
        for b in LEDGER_BUCKETS:
            v = getattr(self, "time_" + b)
            if v is not None:
                out[b] = v
        return out


LEDGER_BUCKETS = ("train", "input", "collective", "checkpoint", "eval", "compile", "startup", "stalled", "other")
MATMUL_MODES = ("fp32", "tf32", "bf16", "fp16")
# a backend not named here is "other"; a combined one ("cpu:gloo,cuda:nccl") by what its GPU tensors use
DIST_BACKENDS = ("nccl", "gloo", "mpi", "ucc", "xccl", "other")


def backend_index(name: object) -> int | None:
    if not isinstance(name, str) or not name:
        return None
    name = name.lower()
    if ":" in name:  # "cpu:gloo,cuda:nccl": GPU tensors go through the cuda one
        parts = dict(p.split(":", 1) for p in name.split(",") if ":" in p)
        name = parts.get("cuda", next(iter(parts.values()), ""))
    return DIST_BACKENDS.index(name) if name in DIST_BACKENDS else DIST_BACKENDS.index("other")


@dataclass(frozen=True, slots=True)
class Capture:
    """Evidence one process's probe took on request: a profiler trace of a few steps or a CUDA
    memory snapshot. ``path`` is where the file is (the probe's directory, or beside a recording)."""

    t: float
    pid: int
    kind: str  # "trace" or "memory"
    rank: int | None = None
    path: str | None = None
    size: int | None = None
    steps: int | None = None
    step_s_before: float | None = None
    step_s_after: float | None = None
    error: str | None = None
    reason: str = ""  # the finding that asked for it
    follow_up: bool = False  # only step_s_after, for a capture reported before
    removed: tuple[str, ...] = ()  # older captures deleted to hold their folder to its budget (names)


@dataclass(frozen=True, slots=True)
class ThreadStack:
    name: str
    main: bool
    stack: str  # traceback.format_stack text, outermost call first


@dataclass(frozen=True, slots=True)
class StackDump:
    """Every thread's Python stack in one process of the job, as its probe sent it."""

    t: float
    pid: int
    rank: int | None = None
    reason: str = "requested"  # requested (a key, a command) or stalled (no step for a while)
    since_step: float | None = None  # seconds since that process's last optimizer step
    threads: tuple[ThreadStack, ...] = ()

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"PID {self.pid}"
