"""GPU metrics through NVML (the ``pynvml`` module of nvidia-ml-py).

NVML is initialised once and device handles are cached. A field that raises
NotSupported (or NoPermission) is remembered per device and never asked again; it
reads as ``None``. Fast fields (1-10 µs each on an H200) are read every tick. Slow
queries run on a separate thread so they never delay a tick:

- once a window (1 s; 2 s when sampling once a second or slower): GPM (Hopper and later,
  gpm.py; ~0.09 ms a GPU) and, for a GPU that is working (a compute process, or
  utilization above zero, since the last window), the utilization sample buffer, giving the
  min/max utilization of the window on the next tick, and each process's share of it (its
  own sample buffer, process_util.py). On an H200 (driver 580) each buffer read costs
  ~1.9 ms of CPU under a training job (~2.5 ms idle), whatever it returns; the driver adds
  a sample every 200 ms and keeps 72. So a buffer is read only where it can tell something:
  not for a GPU with no process and no utilization (no bursts to find); not for one busy
  (>= ``STEADY_UTIL``) at every tick for ``STEADY_S`` (its window would hold no dip that a
  rule reads: starvation needs a mean of 90 % or less over such a window); and the
  per-process buffer not for a GPU with one process: its samples are the GPU's own, sample
  for sample (seen on an H200), so its share is the GPU's utilization over the window (the
  buffer's samples where they were read, else the ticks'). A GPU shared by several
  processes has its per-process buffer read once a window: it answers each process's
  newest sample (one 200-ms period) only;
- every ``slow_every`` seconds (10): the throttle-time (violation) counters (~0.75 ms
  each), ECC counts, the current PCIe link, and PCIe throughput where GPM does not measure
  it (~21 ms a call; working GPUs only);
- every ``energy_every`` seconds (30): total energy (~3 ms a GPU). It is a counter, so a
  rarer read loses nothing over a run; power is read every tick.

A GPU in MIG mode keeps its row (power, energy, temperature, clocks, PCIe, NVLink, ECC) and
each of its MIG devices gets a row of its own after every NVML index (mig.py). NVLink's active
links are counted once at start (nvlink.py); its traffic is GPM's, read with the other metrics.

XID and ECC events arrive on a listener thread of their own. Any other NVML error on one
field of one device leaves that field ``None`` for the tick and is counted, never raised.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from traintop.collectors.gpm import GpmReader
from traintop.collectors.mig import MigRows, mig_mode
from traintop.collectors.nvlink import active_links
from traintop.collectors.nvml_events import ECC_DOUBLE_BIT, XID_CRITICAL, EventListener
from traintop.collectors.process_util import ProcessUtil, ProcessUtilReader
from traintop.errors import NoGpuError, TraintopError
from traintop.samples import GpuInfo, GpuProcess, GpuSample, SessionInfo, SessionKind

_UNSUPPORTED_CODES = {3, 4, 13}  # NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND
STEADY_UTIL = 95.0  # a tick at or above this is busy
STEADY_S = 30.0  # busy at every tick this long: the utilization buffer is not read (the starvation rule's window)


def load_pynvml():
    try:
        import pynvml
    except ImportError:
        raise NoGpuError("the NVML Python bindings (nvidia-ml-py) are not installed") from None
    return pynvml


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class NvmlCollector:
    def __init__(self, nvml=None, *, slow_every: float = 10.0, window_s: float = 1.0,
                 energy_every: float = 30.0, only: frozenset[int] | None = None) -> None:
        """``only``: the NVML indices to read (None: all). Internally a GPU is its position in
        ``handles``; samples and infos carry its NVML index."""
        self.nv = nvml or load_pynvml()
        nv = self.nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            raise NoGpuError(f"NVML could not start ({_text(e)}): is the NVIDIA driver installed and loaded?") from None
        except OSError as e:  # libnvidia-ml.so missing on some bindings versions
            raise NoGpuError(f"NVML library not found ({e})") from None
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as e:
            raise NoGpuError(f"NVML sees no GPU ({_text(e)})") from None
        if count == 0:
            raise NoGpuError("NVML sees no GPU")
        if only is not None:
            missing = sorted(i for i in only if not 0 <= i < count)
            if missing:
                raise TraintopError(f"--only-gpus: no GPU {', '.join(map(str, missing))} here "
                                    f"(NVML sees {count}: {0 if count == 1 else f'0-{count - 1}'})")
        self.indices = [i for i in range(count) if only is None or i in only]
        self.nvml_count = count
        count = len(self.indices)
        self.handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in self.indices]
        self._unsupported: set[tuple[int, str]] = set()
        self.errors: dict[str, int] = {}
        self._util_ts = [0] * count
        self._reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) \
            or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        gpu_infos = tuple(self._info(i) for i in range(count))
        self.driver = self._safe(None, "driver", nv.nvmlSystemGetDriverVersion)
        cuda = self._safe(None, "cuda", nv.nvmlSystemGetCudaDriverVersion)
        self.cuda_driver = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None
        self._slow: dict[int, dict[str, Any]] = {i: {} for i in range(count)}
        self._slow_lock = threading.Lock()
        self._window: list[tuple[float, float] | None] = [None] * count
        self.slow_every = slow_every
        self.energy_every = energy_every
        self._working = [True] * count  # since the last window: a process on it or utilization > 0
        self._window_primed = [False] * count  # the buffer's first read after idling only sets the timestamp
        self.window_s = window_s  # the utilization buffer and GPM are read this often
        self._stop = threading.Event()
        self._slow_thread: threading.Thread | None = None
        self._violation: dict[tuple[int, int], tuple[int, int]] = {}
        self.gpm = GpmReader(nv, self.handles)
        self.process_util = ProcessUtilReader(nv, self.handles)
        # (when, {pid: ProcessUtil}, what a process missing there gets: 0.0 where NVML answered, None where
        # the shares are the GPU's own, of the one process it had)
        self._putil: list[tuple[float, dict, float | None] | None] = [None] * count
        self._pids: list[tuple[int, ...]] = [()] * count  # the processes the last tick saw on each GPU
        self._ticks = [[0.0, 0, 0.0, 0] for _ in range(count)]  # since the last window: utilization, memory
        self._busy_since: list[float | None] = [None] * count  # every tick at or above STEADY_UTIL since then
        self.events = EventListener(nv, self.handles)
        # each process's owner where it is already known (the live sampler's cache; read-only here)
        self.owner_of: Callable[[int], Any] | None = None
        # MIG devices of the GPUs in MIG mode: rows of their own, numbered after every NVML index
        self.mig = MigRows(nv, self._safe, [(i, info, self.handles[i]) for i, info in enumerate(gpu_infos) if info.mig],
                           self.nvml_count, self.gpm.supported)
        self.errors.update(self.mig.errors)
        self.infos = gpu_infos + self.mig.infos

    # -- plumbing ----------------------------------------------------------
    def _safe(self, idx: int | None, field: str, fn: Callable, *args):
        key = (idx if idx is not None else -1, field)
        if key in self._unsupported:
            return None
        try:
            return fn(*args)
        except self.nv.NVMLError as e:
            code = getattr(e, "value", None)
            if code in _UNSUPPORTED_CODES:
                self._unsupported.add(key)
            else:
                self.errors[field] = self.errors.get(field, 0) + 1
            return None

    def _info(self, i: int) -> GpuInfo:
        nv, h = self.nv, self.handles[i]
        mem = self._safe(i, "memory_v2", nv.nvmlDeviceGetMemoryInfo, h, nv.nvmlMemory_v2) \
            if hasattr(nv, "nvmlMemory_v2") else None
        if mem is None:  # v1's total includes memory the driver reserves; v2's is what nvidia-smi shows
            mem = self._safe(i, "memory", nv.nvmlDeviceGetMemoryInfo, h)
        limit = self._safe(i, "power_limit", nv.nvmlDeviceGetEnforcedPowerLimit, h)
        slowdown = self._safe(i, "temp_slowdown", nv.nvmlDeviceGetTemperatureThreshold, h,
                              nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        return GpuInfo(
            index=self.indices[i],
            name=_text(self._safe(i, "name", nv.nvmlDeviceGetName, h) or "NVIDIA GPU"),
            uuid=_text(u) if (u := self._safe(i, "uuid", nv.nvmlDeviceGetUUID, h)) else None,
            mem_total=int(mem.total) if mem is not None else None,
            power_limit_w=limit / 1000.0 if limit is not None else None,
            temp_slowdown_c=float(slowdown) if slowdown is not None else None,
            sm_clock_max=self._safe(i, "sm_clock_max", nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM),
            mem_clock_max=self._safe(i, "mem_clock_max", nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_MEM),
            pcie_gen_max=self._optional(i, "pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", h),
            pcie_width_max=self._optional(i, "pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth", h),
            pci_bus_id=_text(pci.busId) if (pci := self._optional(i, "pci", "nvmlDeviceGetPciInfo", h)) is not None
            and getattr(pci, "busId", None) else None,
            minor=self._optional(i, "minor", "nvmlDeviceGetMinorNumber", h),
            mig=mig_mode(nv, h), nvlinks=active_links(nv, h),
        )

    def _optional(self, i: int, field: str, fn_name: str, *args):
        """A call older bindings may lack: missing reads as unsupported."""
        fn = getattr(self.nv, fn_name, None)
        return self._safe(i, field, fn, *args) if fn is not None else None

    def session_info(self, interval: float, kind: str = SessionKind.LIVE) -> SessionInfo:
        import socket
        return SessionInfo(kind=kind, gpus=self.infos, driver=_text(self.driver) if self.driver else None,
                           cuda_driver=self.cuda_driver, hostname=socket.gethostname(), interval=interval,
                           label="live")

    # -- fast fields, every tick ---------------------------------------------
    def sample(self) -> tuple[GpuSample, ...]:
        whole = tuple(self._sample(i) for i in range(len(self.handles)))
        return whole + self.mig.sample() if self.mig.devices else whole

    def _sample(self, i: int) -> GpuSample:
        nv, h, info = self.nv, self.handles[i], self.infos[i]
        util = self._safe(i, "util", nv.nvmlDeviceGetUtilizationRates, h)
        mem = self._safe(i, "memory_v2", nv.nvmlDeviceGetMemoryInfo, h, nv.nvmlMemory_v2) \
            if hasattr(nv, "nvmlMemory_v2") else None
        if mem is None:
            mem = self._safe(i, "memory", nv.nvmlDeviceGetMemoryInfo, h)
        power = self._safe(i, "power", nv.nvmlDeviceGetPowerUsage, h)
        limit = self._safe(i, "power_limit", nv.nvmlDeviceGetEnforcedPowerLimit, h)
        temp = self._safe(i, "temp", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        sm = self._safe(i, "sm_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        memclk = self._safe(i, "mem_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
        reasons = self._safe(i, "reasons", self._reasons_fn, h)
        slow = self._slow[i]  # replaced whole by the slow thread, never changed in place: no copy, no lock
        window = self._window[i]
        util_min = util_max = None
        if window is not None:  # windowed utilization belongs to one tick only, or 10 Hz would repeat it
            with self._slow_lock:
                window, self._window[i] = self._window[i], None
            if window is not None:
                util_min, util_max = window
        xid = None
        for etype, data in (self.events.take(i) if self.events.pending else ()):
            if etype & XID_CRITICAL:
                xid = data
            elif etype & ECC_DOUBLE_BIT and xid is None:
                xid = 48  # what the driver logs as the XID of a double-bit ECC error
        # a GPU in MIG mode lists its processes on its MIG devices' rows, not twice
        procs = self._processes(i) if i not in self.mig.parents else ()
        if procs or util is None or util.gpu > 0:
            self._working[i] = True
        self._count_tick(i, util)
        return GpuSample(
            index=self.indices[i],
            util=float(util.gpu) if util is not None else None,
            util_min=util_min, util_max=util_max,
            mem_util=float(util.memory) if util is not None else None,
            mem_used=int(mem.used) if mem is not None else None,
            mem_total=int(mem.total) if mem is not None else info.mem_total,
            mem_reserved=int(mem.reserved) if mem is not None and hasattr(mem, "reserved") else None,
            power_w=power / 1000.0 if power is not None else None,
            power_limit_w=limit / 1000.0 if limit is not None else info.power_limit_w,
            temp_c=float(temp) if temp is not None else None,
            temp_slowdown_c=info.temp_slowdown_c,
            sm_clock=sm, sm_clock_max=info.sm_clock_max, mem_clock=memclk, mem_clock_max=info.mem_clock_max,
            reasons=int(reasons) if reasons is not None else None,
            pcie_tx=slow.get("pcie_tx"), pcie_rx=slow.get("pcie_rx"), energy_j=slow.get("energy_j"),
            pcie_gen=slow.get("pcie_gen"), pcie_width=slow.get("pcie_width"),
            pcie_gen_max=info.pcie_gen_max, pcie_width_max=info.pcie_width_max,
            sm_active=slow.get("sm_active"), sm_occupancy=slow.get("sm_occupancy"),
            tensor_active=slow.get("tensor_active"), dram_active=slow.get("dram_active"),
            nvlink_tx=slow.get("nvlink_tx"), nvlink_rx=slow.get("nvlink_rx"),
            throttle_power=slow.get("throttle_power"), throttle_thermal=slow.get("throttle_thermal"),
            ecc_corrected=slow.get("ecc_corrected"), ecc_uncorrected=slow.get("ecc_uncorrected"),
            remap_pending=slow.get("remap_pending"), xid=xid,
            processes=procs,
        )

    def _count_tick(self, i: int, util) -> None:
        """This tick's utilization, for the window's shares and for telling a steadily busy GPU."""
        now = time.monotonic()
        if util is None or util.gpu < STEADY_UTIL:
            self._busy_since[i] = None
        elif self._busy_since[i] is None:
            self._busy_since[i] = now
        if util is not None:
            with self._slow_lock:
                acc = self._ticks[i]
                acc[0] += util.gpu
                acc[1] += 1
                if 0 <= util.memory <= 100:
                    acc[2] += util.memory
                    acc[3] += 1

    def _util_window(self, i: int) -> tuple[float | None, float | None, float | None]:
        """Min, max and mean of NVML's internal utilization samples since the last read."""
        nv = self.nv
        got = self._safe(i, "util_samples", nv.nvmlDeviceGetSamples, self.handles[i],
                         nv.NVML_GPU_UTILIZATION_SAMPLES, self._util_ts[i])
        if not got:
            return None, None, None
        _, samples = got
        if not samples:
            return None, None, None
        vals = []
        for s in samples:
            self._util_ts[i] = max(self._util_ts[i], int(s.timeStamp))
            v = s.sampleValue.uiVal
            if 0 <= v <= 100:
                vals.append(float(v))
        return (min(vals), max(vals), sum(vals) / len(vals)) if vals else (None, None, None)

    def _processes(self, i: int) -> tuple[GpuProcess, ...]:
        procs = self._safe(i, "processes", self.nv.nvmlDeviceGetComputeRunningProcesses, self.handles[i]) or []
        util = self._putil[i]
        if util is not None and time.monotonic() - util[0] > 2.5 * self.window_s:
            util = None  # from before the GPU went quiet: not this window's
        owner_of = self.owner_of
        out = {}
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            used = int(used) if isinstance(used, int) else None
            pid = int(p.pid)
            owner = owner_of(pid) if owner_of is not None else None
            u = util[1].get(pid) if util is not None else None
            if u is not None:
                out[pid] = GpuProcess(pid, used, u.sm, u.mem, u.enc, u.dec, owner=owner)
            elif util is not None and util[2] is not None:  # NVML answered: a process without samples ran nothing
                out[pid] = GpuProcess(pid, used, 0.0, 0.0, 0.0, 0.0, owner=owner)
            else:
                out[pid] = GpuProcess(pid, used, owner=owner)
        self._pids[i] = tuple(out)
        return tuple(out.values())

    # -- slow fields, own thread ---------------------------------------------
    def start_slow(self) -> None:
        if self._slow_thread is None:
            self._slow_thread = threading.Thread(target=self._slow_loop, name="traintop-nvml-slow", daemon=True)
            self._slow_thread.start()
            self.events.start()

    def poll_util_window(self, every_gpu: bool = False) -> None:
        """``every_gpu``: read every GPU's buffers (a one-off snapshot has no history of work)."""
        for i in range(len(self.handles)):
            with self._slow_lock:
                ticks, self._ticks[i] = self._ticks[i], [0.0, 0, 0.0, 0]
            if not self._working[i] and not every_gpu:
                self._window_primed[i] = False
                continue
            self._working[i] = False
            busy_since = self._busy_since[i]
            mean = None
            if not every_gpu and busy_since is not None and time.monotonic() - busy_since >= STEADY_S:
                self._window_primed[i] = False  # not read while steadily busy: read again, it primes first
            else:
                lo, hi, mean = self._util_window(i)
                if not self._window_primed[i]:  # after idling the buffer holds samples from before: skip them
                    self._window_primed[i] = True
                    mean = None
                elif lo is not None and hi is not None:  # both or neither
                    with self._slow_lock:
                        self._window[i] = (lo, hi)
            if i not in self.mig.parents:
                self._process_shares(i, ticks, mean, every_gpu)

    def _process_shares(self, i: int, ticks: list, buffer_mean: float | None, every_gpu: bool) -> None:
        """Each process's share of GPU ``i`` over the window: a sole process's is the GPU's utilization,
        the others' are read from NVML's per-process buffer."""
        pids = self._pids[i]
        util_n, mem_n = ticks[1], ticks[3]
        if len(pids) == 1 and util_n and not every_gpu:
            sm = buffer_mean if buffer_mean is not None else ticks[0] / util_n
            mem = ticks[2] / mem_n if mem_n else None
            # encoder and decoder are not read: None, not a guess
            self._putil[i] = (time.monotonic(), {pids[0]: ProcessUtil(sm, mem, None, None)}, None)
            return
        if not pids and not every_gpu:
            return
        per_process = self.process_util.poll(i)
        if per_process is not None:
            self._putil[i] = (time.monotonic(), per_process, 0.0)
        elif (held := self._putil[i]) is not None and held[2] is None:
            self._putil[i] = None  # a sole process's share does not stand for one of several

    def poll_gpm(self) -> None:
        for i in range(len(self.handles)):
            m = self.gpm.poll(i)
            if m is not None:
                self._slow[i] = {**self._slow[i], **m}
        if self.mig.devices:
            self.mig.poll_gpm()

    def poll_slow(self, energy: bool = True) -> None:
        nv = self.nv
        for i, h in enumerate(self.handles):
            got: dict[str, float | None] = {}
            # GPM measures PCIe traffic for free; this call costs ~21 ms, so only for a working GPU
            if not self.gpm.supported[i] and (self._working[i] or "pcie_tx" not in self._slow[i]):
                tx = self._safe(i, "pcie_tx", nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_TX_BYTES)
                rx = self._safe(i, "pcie_rx", nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_RX_BYTES)
                got["pcie_tx"] = tx * 1024.0 if tx is not None else None  # NVML gives KB/s
                got["pcie_rx"] = rx * 1024.0 if rx is not None else None
            if energy:
                e = self._safe(i, "energy", nv.nvmlDeviceGetTotalEnergyConsumption, h)
                got["energy_j"] = e / 1000.0 if e is not None else None  # mJ
            got["throttle_power"] = self._violation_pct(i, 0)    # NVML_PERF_POLICY_POWER
            got["throttle_thermal"] = self._violation_pct(i, 1)  # NVML_PERF_POLICY_THERMAL
            got.update(self._errors_and_link(i, h))
            self._slow[i] = {**self._slow[i], **got}

    def _violation_pct(self, i: int, policy: int) -> float | None:
        """Share of the time since the previous read that the clocks were held down (percent)."""
        fn = getattr(self.nv, "nvmlDeviceGetViolationStatus", None)
        v = self._safe(i, f"violation{policy}", fn, self.handles[i], policy) if fn is not None else None
        if v is None:
            return None
        now, held = int(v.referenceTime), int(v.violationTime)
        prev = self._violation.get((i, policy))
        self._violation[(i, policy)] = (now, held)
        if prev is None or now <= prev[0] or held < prev[1]:
            return None
        return min(100.0, 100.0 * (held - prev[1]) / (now - prev[0]))

    def _errors_and_link(self, i: int, h) -> dict[str, float | None]:
        nv = self.nv
        out: dict[str, float | None] = {}
        ecc = getattr(nv, "nvmlDeviceGetTotalEccErrors", None)
        if ecc is not None:  # 0 / 1: corrected / uncorrected; 0: volatile counter
            out["ecc_corrected"] = self._safe(i, "ecc_corrected", ecc, h, 0, 0)
            out["ecc_uncorrected"] = self._safe(i, "ecc_uncorrected", ecc, h, 1, 0)
        rows = self._optional(i, "remapped_rows", "nvmlDeviceGetRemappedRows", h)
        if rows is not None:
            out["remap_pending"] = 1 if rows[2] else 0
        out["pcie_gen"] = self._optional(i, "pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration", h)
        out["pcie_width"] = self._optional(i, "pcie_width", "nvmlDeviceGetCurrPcieLinkWidth", h)
        return out

    def _slow_loop(self) -> None:
        last_slow = last_energy = -1e9
        while not self._stop.is_set():
            t = time.monotonic()
            # the slow fields first: their PCIe check wants this window's "working" flags
            if t - last_slow >= self.slow_every:
                energy = t - last_energy >= self.energy_every
                self.poll_slow(energy=energy)
                last_slow = t
                if energy:
                    last_energy = t
            self.poll_util_window()
            self.poll_gpm()
            self._stop.wait(max(0.05, self.window_s - (time.monotonic() - t)))

    def close(self) -> None:
        self._stop.set()
        if self._slow_thread is not None:
            self._slow_thread.join(timeout=1.0)
        self.events.close()
        self.gpm.close()
        self.mig.close()
        try:
            self.nv.nvmlShutdown()
        except Exception:  # shutting down: nothing useful to say
            pass
