"""A deterministic, seeded source that plays each pathology on one or several GPUs.

Every value is a pure function of (seed, scenario, GPU, time), so a frame at a given
time is the same however it is reached. Several GPUs play a DDP job: one process per rank
(its GPU's process in NVML, its probe's device), each with its own loader workers; the ranks
step together, at the slowest rank's pace, as synchronous DDP ranks do. The host is sized
for its GPUs (16 cores and 128 GiB per 2 GPUs) and its CPU and memory include the job's.
Shapes follow what an H200 shows (BRIEF.md):
healthy training pins utilization at 100 % with the power cap active; starvation
alternates idle and busy every second or two with loader workers at 100 % CPU;
underuse sits near 5 % utilization and ~120 W.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from traintop.samples import (
    MATMUL_MODES,
    REASON_GPU_IDLE,
    REASON_SW_POWER_CAP,
    REASON_SW_THERMAL,
    Frame,
    GpuInfo,
    GpuProcess,
    GpuSample,
    HostSample,
    ProcessSample,
    ProcInfo,
    RankSample,
    SessionInfo,
    SessionKind,
)
from traintop.units import GiB, MiB

SCENARIOS = ("healthy", "starved", "underused", "thermal", "memory_creep", "idle", "small_kernels", "pcie_bound",
             "slow_loader", "collective_wait")
SCENARIO_HELP = {
    "healthy": "large-batch bf16 training: 100 % busy, power-capped (normal)",
    "starved": "data-starved: utilization spikes between 0 and 100 %, loader workers at 100 % CPU",
    "underused": "tiny batches: ~5 % utilization, ~120 W of 700 W",
    "thermal": "temperature climbs to the slowdown threshold and clocks drop",
    "memory_creep": "memory rising ~0.5 GiB/s (tensors kept in a list)",
    "idle": "no job on the GPU",
    "small_kernels": "utilization reads 100 % but the kernels keep ~12 % of the SMs busy (GPM)",
    "pcie_bound": "host-to-device copies fill the PCIe link; the GPU computes ~35 % of the time",
    "slow_loader": "the straggler of a synchronous DDP job: its loader is slow (input wait ~87 %), its GPU ~7 % busy",
    "collective_wait": "a DDP rank waiting for a straggler on another node: its GPU reads ~55 % busy at ~170 W "
                       "with few SMs active, input wait ~35 % (its own loader's time, hidden by the wait)",
}

H200: dict[str, Any] = dict(name="NVIDIA H200", mem_total=143771 * MiB, power_limit_w=700.0,
            temp_slowdown_c=87.0, sm_clock_max=1980, mem_clock_max=3201)
TRAIN_PID = 4242
N_CORES = 16  # per 2 GPUs (at least 16)
HOST_MEM = 128 * GiB  # per 2 GPUs (at least 128 GiB)
SIM_MFU = 0.42  # the simulated steps compute at this share of the GPU's peak (their wait for input aside)
H200_BF16_FLOPS = 989.5e12
STEP_S = {"healthy": 0.081, "starved": 0.80, "underused": 0.004, "thermal": 0.11, "memory_creep": 0.125,
          "small_kernels": 0.012, "pcie_bound": 0.21, "slow_loader": 0.055, "collective_wait": 0.055}


def _rng(*key) -> random.Random:
    # repr() of ints/strings is stable across runs (hash() of a str is salted).
    return random.Random(repr(key))


class Simulator:
    """Produces frames for ``scenario`` (one name, or a comma list: one per GPU, cycled)."""

    def __init__(self, scenario: str = "healthy", gpus: int = 1, seed: int = 0,
                 interval: float = 0.5, t0: float = 1_790_000_000.0, probe: bool = True) -> None:
        self.probe = probe
        names = [s.strip() for s in scenario.split(",") if s.strip()]
        bad = [s for s in names if s not in SCENARIOS]
        if not names or bad:
            raise ValueError(f"unknown scenario {', '.join(bad) or scenario!r}; choose from {', '.join(SCENARIOS)}")
        if not 1 <= gpus <= 64:
            raise ValueError("gpus must be between 1 and 64")
        self.scenarios = [names[i % len(names)] for i in range(gpus)]
        self.seed = seed
        self.interval = interval
        self.t0 = t0
        self.k = 0
        self._busy_lens: dict[tuple[int, int], float] = {}

    def info(self) -> SessionInfo:
        return SessionInfo(
            kind=SessionKind.SIMULATED,
            gpus=tuple(GpuInfo(index=i, name=H200["name"], uuid=f"GPU-sim-{self.seed}-{i}",
                               mem_total=H200["mem_total"], power_limit_w=H200["power_limit_w"],
                               temp_slowdown_c=H200["temp_slowdown_c"], sm_clock_max=H200["sm_clock_max"],
                               mem_clock_max=H200["mem_clock_max"], pcie_gen_max=5, pcie_width_max=16,
                               pci_bus_id=f"00000000:{0x18 + i:02X}:00.0", minor=i)
                      for i in range(len(self.scenarios))),
            driver="580.159.04 (simulated)",
            cuda_driver="13.0",
            hostname="simulated",
            interval=self.interval,
            label="simulated: " + ",".join(dict.fromkeys(self.scenarios)),
        )

    # -- frames ------------------------------------------------------------
    def next_frame(self) -> Frame:
        f = self.frame_at(self.t0 + self.k * self.interval)
        self.k += 1
        return f

    def frames(self, n: int) -> list[Frame]:
        return [self.next_frame() for _ in range(n)]

    def frame_at(self, t: float) -> Frame:
        gpus = tuple(self._gpu(i, s, t) for i, s in enumerate(self.scenarios))
        process = self._process(t)
        return Frame(t=t, gpus=gpus, host=self._host(t, process), process=process, ranks=self._ranks(t, gpus))

    def _ranks(self, t: float, gpus) -> tuple[RankSample, ...]:
        """What a probe in each rank (one per GPU with a job) would report."""
        if not self.probe:
            return ()
        out = []
        # synchronous DDP: every rank takes the slowest rank's step (the others wait in the all-reduce)
        nominal_step = max((STEP_S[s] for s in self.scenarios if s != "idle"), default=0.1)
        # each step's time jitters; the count of steps taken keeps the mean pace (it never runs backwards)
        job_step = nominal_step * (0.95 + 0.1 * _rng(self.seed, "step", round(t * 1000)).random())
        # a straggler or a rank waiting for one on another node: the job has a rank beyond this host
        world = len(gpus) + any(s in ("slow_loader", "collective_wait") for s in self.scenarios)
        for g, scenario in zip(gpus, self.scenarios):
            if scenario == "idle" or not g.processes:
                continue
            r = _rng(self.seed, "rank", g.index, round(t * 1000))
            nvml = g.processes[0].used_bytes
            reserved = int(nvml - 520 * MiB)
            allocated = int(reserved * (0.62 + 0.05 * r.random()))
            if scenario == "memory_creep":
                allocated = int(reserved - 300 * MiB * r.random())
            step = job_step
            nominal_wait = {"starved": 0.62, "underused": 0.01, "pcie_bound": 0.05, "slow_loader": 0.87,
                            "collective_wait": 0.36}.get(scenario, 0.02)
            wait = nominal_wait * (0.9 + 0.2 * r.random())
            steps = int((t - self.t0) / nominal_step)
            out.append(RankSample(
                pid=TRAIN_PID + g.index, rank=g.index, world_size=world, device=g.index, cuda=True,
                allocated=allocated, reserved=reserved, peak=max(allocated, int(reserved * 0.9)),
                active=allocated, inactive_split=int((reserved - allocated) * 0.1), alloc_retries=0, ooms=0,
                steps=steps, step_time=step, steps_per_s=1 / step, input_wait=min(1.0, wait), age=0.1,
                time_train=1.0 - min(1.0, wait), time_input=min(1.0, wait),
                matmul=MATMUL_MODES.index("bf16"),
                # its steps compute at SIM_MFU of the peak; the wait for their input lowers the MFU
                # of the iteration; a step's FLOPs are the model's, the same every step
                step_flops=SIM_MFU * H200_BF16_FLOPS * nominal_step * (1.0 - nominal_wait),
            ))
        return tuple(out)

    # -- starvation timing: busy for part of each ~1.6 s cycle -----------
    def _busy(self, gpu: int, t: float) -> bool:
        rel = t - self.t0
        period = 1.6
        cycle = math.floor(rel / period)
        key = (gpu, cycle)
        busy_len = self._busy_lens.get(key)
        if busy_len is None:  # a seeded generator costs more than the rest of a sample: one a cycle
            if len(self._busy_lens) > 4096:
                self._busy_lens.clear()
            busy_len = self._busy_lens[key] = 0.35 + 0.25 * _rng(self.seed, "cycle", gpu, cycle).random()
        return (rel - cycle * period) < busy_len * period

    def _busy_share(self, gpu: int, t0: float, t1: float, steps: int = 12) -> tuple[float, float, float]:
        vals = [100.0 if self._busy(gpu, t0 + (t1 - t0) * (j + 0.5) / steps) else 0.0 for j in range(steps)]
        return sum(vals) / steps, min(vals), max(vals)

    def _gpu(self, i: int, scenario: str, t: float) -> GpuSample:
        r = _rng(self.seed, "gpu", i, round(t * 1000))
        rx = 0.4e9 * r.random()
        if scenario == "starved":
            shape = self._starved(i, t, r)
        else:
            shape = _SHAPES[scenario](r, t - self.t0)
        return _gpu_sample(i, scenario, shape, rx if shape.rx is None else shape.rx, r)

    def _starved(self, i: int, t: float, r: random.Random) -> _Shape:
        share, util_min, util_max = self._busy_share(i, t - self.interval, t)
        util = 100.0 if self._busy(i, t) else 0.0
        power = 140 + 380 * share / 100 + 20 * r.random()
        temp = 45 + 6 * share / 100 + 2 * r.random()
        mem = 40 * GiB + int(512 * MiB * r.random())
        return _Shape(util, power, 1980, temp, mem, share * 0.4, util_min=util_min, util_max=util_max)

    def _host(self, t: float, process: ProcessSample | None = None) -> HostSample:
        """The host: the job's CPU (its busiest processes each on a core of their own) over a light
        background, and the job's memory within what the host uses."""
        r = _rng(self.seed, "host", round(t * 1000))
        starved = "starved" in self.scenarios
        size = max(1, math.ceil(len(self.scenarios) / 2))
        n_cores, total_mem = N_CORES * size, HOST_MEM * size
        cores = [4 + 6 * r.random() for _ in range(n_cores)]
        demand = sorted((m.cpu_percent or 0.0 for m in process.members), reverse=True) if process else []
        c = 0
        for d in demand:  # each process on the least loaded core it fits, the rest spread over the others
            while d > 0.05 and c < n_cores:
                take = min(d, 100.0 - cores[c])
                cores[c] += take
                d -= take
                if cores[c] >= 99.95:
                    c += 1
                else:
                    break
        cores = [round(min(v, 100.0), 1) for v in cores]
        others = int(total_mem * (0.08 + 0.01 * r.random()))
        return HostSample(
            cpu_percent=round(sum(cores) / len(cores), 1), per_core=tuple(cores),
            iowait=round(0.5 + r.random(), 1), mem_used=min(total_mem, others + ((process.rss or 0) if process else 0)),
            mem_total=total_mem, swap_used=0, swap_total=0,
            disk_read=(180 if starved else 40) * MiB * (0.8 + 0.4 * r.random()), disk_write=2 * MiB * r.random(),
            net_rx=1 * MiB * r.random(), net_tx=0.5 * MiB * r.random(),
        )

    def _process(self, t: float) -> ProcessSample | None:
        """A DDP job's tree: one process per rank (rank 0 the root, the others its children), each
        with its own loader workers, loaded as that rank's scenario says."""
        if all(s == "idle" for s in self.scenarios):
            return None
        r = _rng(self.seed, "proc", round(t * 1000))
        members = [ProcInfo(TRAIN_PID, "python", 38 + 10 * r.random(), 6 * GiB, 42, ppid=1)]
        members += [ProcInfo(TRAIN_PID + i, "python", 30 + 10 * r.random(), 4 * GiB, 30, ppid=TRAIN_PID)
                    for i in range(1, len(self.scenarios)) if self.scenarios[i] != "idle"]
        for i, scenario in enumerate(self.scenarios):
            if scenario == "idle":
                continue
            starved = scenario == "starved"
            for w in range(2 if starved else 4):
                cpu = (97 + 3 * r.random()) if starved else (25 + 15 * r.random())
                members.append(ProcInfo(TRAIN_PID + 100 + 8 * i + w, "pt_data_worker", round(cpu, 1), 2 * GiB, 4,
                                        True, ppid=TRAIN_PID + i))
        starved = "starved" in self.scenarios
        return ProcessSample(
            pid=TRAIN_PID, alive=True, name="python", cmdline="python train.py --bf16",
            cpu_percent=round(sum(m.cpu_percent or 0.0 for m in members), 1), rss=sum(m.rss or 0 for m in members),
            threads=sum(m.threads or 0 for m in members), read_rate=(150 if starved else 30) * MiB,
            write_rate=1 * MiB, members=tuple(members),
        )


@dataclass(frozen=True)
class _Shape:
    """What a scenario's GPU shows at one instant, before it becomes a GpuSample (its values drawn in
    a fixed order from the instant's generator: the order is part of the seed's output)."""

    util: float
    power: float
    sm: int
    temp: float
    mem: int
    mem_util: float
    reasons: int = 0
    util_min: float | None = None
    util_max: float | None = None
    sm_share: float | None = None  # GPM SM activity as a share of utilization
    rx: float | None = None  # PCIe receive bytes/s, where the scenario sets its own
    job: bool = True  # a training process uses the GPU


def _healthy(r: random.Random, rel: float) -> _Shape:
    util = 100.0 if r.random() > 0.02 else 97.0
    power = min(H200["power_limit_w"], 600 + 90 * r.random())
    reasons = REASON_SW_POWER_CAP if r.random() < 0.85 else 0
    sm = 1980 - (int(200 * r.random()) if reasons else 0)
    temp = 62 + 4 * r.random()
    mem = 96 * GiB + int(2 * GiB * r.random())
    mem_util = 55 + 10 * r.random()
    return _Shape(util, power, sm, temp, mem, mem_util, reasons, 96.0, 100.0, sm_share=0.82)


def _underused(r: random.Random, rel: float) -> _Shape:
    util = 4 + 3 * r.random()
    power = 112 + 14 * r.random()
    temp = 38 + 2 * r.random()
    mem = 3 * GiB + int(128 * MiB * r.random())
    return _Shape(util, power, 1980, temp, mem, 1 + r.random(), util_min=0.0, util_max=12.0)


def _thermal(r: random.Random, rel: float) -> _Shape:
    temp = min(88.0, 60 + rel * 0.6) + r.random()
    hot = temp >= 84
    reasons = REASON_SW_THERMAL if hot else REASON_SW_POWER_CAP
    sm = 1410 + int(100 * r.random()) if hot else 1980
    power = (520 if hot else 680) + 20 * r.random()
    return _Shape(100.0, power, sm, temp, 80 * GiB, 60.0, reasons, 98.0, 100.0)


def _memory_creep(r: random.Random, rel: float) -> _Shape:
    util = 92 + 8 * r.random()
    power = 420 + 60 * r.random()
    temp = 55 + 3 * r.random()
    mem = min(int(H200["mem_total"] * 0.985), int(8 * GiB + 0.5 * GiB * rel + 64 * MiB * r.random()))
    return _Shape(util, power, 1980, temp, mem, 40.0, util_min=85.0, util_max=100.0)


def _waiting_rank(waiting: bool):
    """As two H200s showed it: the straggler's GPU mostly idles (``waiting`` False); the waiting one
    reads busy while its NCCL kernel spins, at the same ~170 W and ~5 % of SMs active."""

    def shape(r: random.Random, rel: float) -> _Shape:
        util = 40 + 35 * r.random() if waiting else 4 + 7 * r.random()
        power = 165 + 12 * r.random()
        temp = 36 + 2 * r.random()
        mem = 3 * GiB + int(256 * MiB * r.random())
        return _Shape(util, power, 1980, temp, mem, 1 + r.random(), util_min=0.0,
                      util_max=100.0 if waiting else 30.0, sm_share=0.09 if waiting else 0.7)

    return shape


def _small_kernels(r: random.Random, rel: float) -> _Shape:
    util = 100.0 if r.random() > 0.05 else 99.0
    power = 190 + 15 * r.random()
    temp = 44 + 2 * r.random()
    return _Shape(util, power, 1980, temp, 6 * GiB, 8 + 2 * r.random(), util_min=98.0, util_max=100.0,
                  sm_share=0.12)


def _pcie_bound(r: random.Random, rel: float) -> _Shape:
    util = 100.0 if r.random() < 0.35 else 0.0
    power = 230 + 40 * r.random()
    temp = 46 + 2 * r.random()
    mem_util = 10 + 5 * r.random()
    return _Shape(util, power, 1980, temp, 24 * GiB, mem_util, util_min=0.0, util_max=100.0, sm_share=0.7,
                  rx=47e9 + 4e9 * r.random())


def _idle(r: random.Random, rel: float) -> _Shape:
    return _Shape(0.0, 82 + 6 * r.random(), 345, 31 + r.random(), 0, 0.0, REASON_GPU_IDLE, 0.0, 0.0, job=False)


# each scenario's GPU but "starved" (its busy cycles are the Simulator's): (generator, seconds since t0) -> shape
_SHAPES = {"healthy": _healthy, "underused": _underused, "thermal": _thermal, "memory_creep": _memory_creep,
           "slow_loader": _waiting_rank(False), "collective_wait": _waiting_rank(True),
           "small_kernels": _small_kernels, "pcie_bound": _pcie_bound, "idle": _idle}


def _gpu_sample(i: int, scenario: str, s: _Shape, rx: float, r: random.Random) -> GpuSample:
    """The GpuSample of a shape (its last values drawn from ``r``)."""
    # a process's CUDA context and the rest it holds; a GPU no process uses reads 0 (as an H200 does)
    mem_used = s.mem + 560 * MiB if s.job else 0
    procs = (GpuProcess(TRAIN_PID + i, s.mem),) if s.job else ()
    util, reasons = s.util, s.reasons
    return GpuSample(
        index=i, util=round(util), util_min=s.util_min, util_max=s.util_max, mem_util=round(s.mem_util),
        mem_used=mem_used, mem_total=H200["mem_total"], mem_reserved=542 * MiB, power_w=round(s.power, 1),
        power_limit_w=H200["power_limit_w"], temp_c=round(s.temp), temp_slowdown_c=H200["temp_slowdown_c"],
        sm_clock=s.sm, sm_clock_max=H200["sm_clock_max"], mem_clock=3201 if scenario != "idle" else 1593,
        mem_clock_max=H200["mem_clock_max"], reasons=reasons, processes=procs,
        pcie_rx=rx, pcie_tx=0.3 * rx, pcie_gen=5 if util > 0 else 1, pcie_width=16, pcie_gen_max=5,
        pcie_width_max=16,
        sm_active=round(min(100.0, util * (s.sm_share or 0.6) * (0.9 + 0.2 * r.random()))),
        tensor_active=round(util * 0.5 * (s.sm_share or 0.5)), dram_active=round(s.mem_util * 0.8),
        throttle_power=round((60 + 30 * r.random()) if reasons & REASON_SW_POWER_CAP else 0.0),
        throttle_thermal=100.0 if reasons & REASON_SW_THERMAL else 0.0,
        ecc_corrected=0, ecc_uncorrected=0,
    )
