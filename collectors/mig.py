"""MIG devices: each MIG device of a GPU in MIG mode is a row of its own.

Written from NVML's documented calls and tested against recorded answers (tests/mig_nvml.py);
it has not yet run on a MIG-enabled GPU.

- A GPU is in MIG mode when ``nvmlDeviceGetMigMode`` says its current mode is
  ``NVML_DEVICE_MIG_ENABLE``. Its MIG devices are slots 0..``nvmlDeviceGetMaxMigDeviceCount``-1
  of ``nvmlDeviceGetMigDeviceHandleByIndex``; an empty slot answers NOT_FOUND and is skipped.
- A MIG device's row carries what belongs to it: its memory and compute processes (asked of its
  own handle), and its SM, tensor and DRAM activity from GPM per GPU instance
  (``nvmlGpmMigSampleGet(parent, gpuInstanceId, …)``): NVML's utilization rates answer
  NOT_SUPPORTED on a MIG device, so its ``util`` is None. Compute instances of one GPU
  instance share that instance's GPM figures.
- Power, energy, temperature, clocks, PCIe, NVLink, ECC and XIDs belong to the whole GPU, whose
  row stays (with ``mig`` set in its info): a MIG row names it in ``parent`` and leaves those
  fields None, so power and energy are counted once per physical GPU. The parent's row lists no
  processes (NVML would list every instance's again): they are on the MIG rows.
- Rows are numbered after every NVML index (the row index is what the store, recordings and the
  rules key by); ``GpuInfo.label`` names a row as a person does: "GPU 0 MIG 1g.18gb #1".

Names and UUIDs are the driver's text: kept as read, made safe where shown. A bad answer leaves
a field None (or skips a slot); nothing here raises into the sampler.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from traintop.collectors.gpm import GpmReader
from traintop.plausible import MAX_GPUS
from traintop.samples import GpuInfo, GpuProcess, GpuSample

MIG_ENABLE = 1  # NVML_DEVICE_MIG_ENABLE
NOT_FOUND = 6  # NVML_ERROR_NOT_FOUND: an empty slot
MAX_SLOTS = 16  # an A100 or H100 has at most 7 MIG devices; a larger count is a bad answer
# "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "… MIG 1c.3g.40gb", "… MIG 1g.10gb+me"
_PROFILE = re.compile(r"\bMIG\s+([0-9]+[cg](?:\.[0-9]+g)?\.[0-9]+gb(?:\+[a-z0-9]{1,8})*)\s*\Z", re.IGNORECASE)


def _text(v: Any) -> str | None:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v if isinstance(v, str) else None


def mig_mode(nv, handle) -> bool | None:
    """True where the GPU is in MIG mode now, False where not, None where NVML cannot say."""
    fn = getattr(nv, "nvmlDeviceGetMigMode", None)
    if fn is None:
        return None
    try:
        current = fn(handle)[0]  # [current, pending]
    except Exception:  # NOT_SUPPORTED (no MIG on this GPU) or an odd answer
        return None
    if not isinstance(current, int):
        return None
    return current == getattr(nv, "NVML_DEVICE_MIG_ENABLE", MIG_ENABLE)


def mig_handles(nv, handle, errors: dict[str, int]) -> list[tuple[int, Any]]:
    """(slot, handle) of each MIG device of a GPU in MIG mode; empty slots skipped, other
    errors counted in ``errors``."""
    try:
        n = nv.nvmlDeviceGetMaxMigDeviceCount(handle)
    except Exception:
        errors["mig_count"] = errors.get("mig_count", 0) + 1
        return []
    if not isinstance(n, int) or n < 0:
        return []
    out = []
    for slot in range(min(n, MAX_SLOTS)):
        try:
            out.append((slot, nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)))
        except Exception as e:  # NVMLError NOT_FOUND: nothing in this slot
            if getattr(e, "value", None) != NOT_FOUND:
                errors["mig_handle"] = errors.get("mig_handle", 0) + 1
    return out


def profile_of(name: str | None, attrs: Any = None) -> str | None:
    """The MIG profile ("1g.18gb") from the device's name, else from its attributes (slices and
    memory), else None."""
    m = _PROFILE.search(name or "")
    if m:
        return m.group(1)
    slices = getattr(attrs, "gpuInstanceSliceCount", None)
    mem_mb = getattr(attrs, "memorySizeMB", None)
    if isinstance(slices, int) and isinstance(mem_mb, int) and 0 < slices <= 64 and 0 < mem_mb < 1 << 24:
        return f"{slices}g.{round(mem_mb / 1024)}gb"
    return None


@dataclass(frozen=True, slots=True)
class MigDevice:
    info: GpuInfo
    handle: Any
    parent_pos: int  # the parent GPU's position in the collector's handles
    stream: int | None  # its GPU instance's GPM stream (None: no instance id)


class MigRows:
    """The MIG devices under a collector's GPUs: their infos, their samples each tick, and their
    GPU instances' GPM once a window."""

    def __init__(self, nv, safe: Callable, parents: list[tuple[int, GpuInfo, Any]], first_row: int,
                 gpm_supported: list[bool]) -> None:
        """``parents``: (position, info, handle) of each GPU in MIG mode; ``safe``: the collector's
        guarded call ``safe(row, field, fn, *args)``; ``gpm_supported``: GPM per position."""
        self.nv = nv
        self._safe = safe
        self.errors: dict[str, int] = {}
        self.dropped = 0  # MIG devices past the last row a recording can hold
        self.counts: dict[int, int] = {}  # NVML index of a GPU in MIG mode -> its MIG devices
        devices: list[MigDevice] = []
        streams: dict[tuple[int, int], int] = {}
        row = first_row
        for pos, parent, handle in parents:
            found = mig_handles(nv, handle, self.errors)
            self.counts[parent.index] = len(found)
            for _slot, h in found:
                if row >= MAX_GPUS:
                    self.dropped += 1
                    continue
                try:
                    info = self._info(row, parent, h)
                except Exception:  # an answer of a shape no binding gives: this device is left out
                    self.errors["mig_info"] = self.errors.get("mig_info", 0) + 1
                    continue
                stream = None
                if info.gi_id is not None:
                    stream = streams.setdefault((pos, info.gi_id), len(streams))
                devices.append(MigDevice(info, h, pos, stream))
                row += 1
        self.devices = devices
        self.parents = frozenset(d.parent_pos for d in devices)
        handles = {pos: h for pos, _, h in parents}
        order = sorted(streams, key=streams.__getitem__)
        self.gpm = GpmReader.for_instances(nv, [(handles[pos], gi) for pos, gi in order],
                                           [gpm_supported[pos] for pos, _ in order])
        self._gpm: list[dict[str, float | None]] = [{} for _ in order]  # replaced whole, never changed in place

    def _info(self, row: int, parent: GpuInfo, h) -> GpuInfo:
        nv, safe = self.nv, self._safe
        name = _text(safe(row, "name", nv.nvmlDeviceGetName, h))
        attrs = None
        if not _PROFILE.search(name or "") and hasattr(nv, "nvmlDeviceGetAttributes"):
            attrs = safe(row, "mig_attributes", nv.nvmlDeviceGetAttributes, h)
        gi = safe(row, "gi_id", nv.nvmlDeviceGetGpuInstanceId, h) if hasattr(nv, "nvmlDeviceGetGpuInstanceId") else None
        ci = safe(row, "ci_id", nv.nvmlDeviceGetComputeInstanceId, h) \
            if hasattr(nv, "nvmlDeviceGetComputeInstanceId") else None
        mem = self._memory(row, h)
        return GpuInfo(
            index=row, name=(name or f"{parent.name} MIG")[:256], uuid=_text(safe(row, "uuid", nv.nvmlDeviceGetUUID, h)),
            mem_total=_bytes(getattr(mem, "total", None)), pci_bus_id=parent.pci_bus_id, minor=parent.minor,
            parent=parent.index, mig_profile=profile_of(name, attrs),
            gi_id=gi if isinstance(gi, int) and 0 <= gi < 1 << 16 else None,
            ci_id=ci if isinstance(ci, int) and 0 <= ci < 1 << 16 else None,
        )

    def _memory(self, row: int, h):
        nv = self.nv
        mem = self._safe(row, "memory_v2", nv.nvmlDeviceGetMemoryInfo, h, nv.nvmlMemory_v2) \
            if hasattr(nv, "nvmlMemory_v2") else None
        return mem if mem is not None else self._safe(row, "memory", nv.nvmlDeviceGetMemoryInfo, h)

    @property
    def infos(self) -> tuple[GpuInfo, ...]:
        return tuple(d.info for d in self.devices)

    def sample(self) -> tuple[GpuSample, ...]:
        return tuple(self._sample(d) for d in self.devices)

    def _sample(self, d: MigDevice) -> GpuSample:
        row = d.info.index
        try:
            mem = self._memory(row, d.handle)
            gpm = self._gpm[d.stream] if d.stream is not None else {}
            return GpuSample(
                index=row, parent=d.info.parent,
                mem_used=_bytes(getattr(mem, "used", None)),
                mem_total=_bytes(getattr(mem, "total", None)) or d.info.mem_total,
                mem_reserved=_bytes(getattr(mem, "reserved", None)),
                sm_active=gpm.get("sm_active"), sm_occupancy=gpm.get("sm_occupancy"),
                tensor_active=gpm.get("tensor_active"), dram_active=gpm.get("dram_active"),
                processes=self._processes(row, d.handle),
            )
        except Exception:  # an answer of a shape no binding gives: this row reads unknown this tick
            self.errors["mig_sample"] = self.errors.get("mig_sample", 0) + 1
            return GpuSample(index=row, parent=d.info.parent)

    def _processes(self, row: int, h) -> tuple[GpuProcess, ...]:
        procs = self._safe(row, "processes", self.nv.nvmlDeviceGetComputeRunningProcesses, h) or []
        out = {}
        for p in procs:
            pid = getattr(p, "pid", None)
            if not isinstance(pid, int) or not 0 < pid < 1 << 31:
                continue
            used = getattr(p, "usedGpuMemory", None)
            out[pid] = GpuProcess(pid, _bytes(used))
        return tuple(out.values())

    def poll_gpm(self) -> None:
        for k in range(len(self._gpm)):
            m = self.gpm.poll(k)
            if m is not None:
                self._gpm[k] = m
            elif not self.gpm.supported[k]:
                self._gpm[k] = {}  # it stopped answering for good: unknown, not its last figures

    def close(self) -> None:
        self.gpm.close()


def _bytes(v: Any) -> int | None:
    """A byte count NVML gave (an int below 64 TiB), else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 46 else None
