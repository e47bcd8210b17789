"""NVML's answers on hardware no machine here has: GPUs in MIG mode, and 8 NVLinked GPUs.

Written from NVML's documentation (nvml.h, the nvidia-ml-py bindings' signatures) and from what
nvidia-smi shows on such machines, not captured on them: an H100 80GB HBM3 (or an A100 80GB,
which has no GPM) in MIG mode with three MIG devices of different profiles in slots 0, 1 and 3
of 7 (the others answer NOT_FOUND), NOT_SUPPORTED for utilization rates on MIG handles and on
the GPU itself, power and energy on the GPU only, GPM per GPU instance; and 8 H100 SXM each with
18 active NVLinks and NVLink traffic in GPM. Built on tests/fakes.py (handles are the NVML
indices there; a MIG device's handle is a ``MigHandle``).
"""

from __future__ import annotations

import types
from dataclasses import dataclass

from fakes import NVMLError, add_hopper_extras, make_fake_nvml

NOT_SUPPORTED, NOT_FOUND, INVALID_ARGUMENT = 3, 6, 2
GiB = 2 ** 30


@dataclass(frozen=True)
class MigHandle:
    parent: int
    slot: int


@dataclass(frozen=True)
class MigSpec:
    slot: int
    profile: str
    gi: int
    ci: int
    total: int
    used: int
    pids: tuple[int, ...]
    sm: float  # GPM SM activity of its GPU instance, %


# nvidia-smi -L on an H100 80GB in MIG mode with 3g.40gb, 2g.20gb and 1g.10gb instances
H100_MIG = (
    MigSpec(0, "3g.40gb", 1, 0, 40 * GiB, 30 * GiB, (4101,), 71.0),
    MigSpec(1, "2g.20gb", 5, 0, 20 * GiB, 6 * GiB, (4202, 4203), 22.0),
    MigSpec(3, "1g.10gb", 13, 0, 10 * GiB, 0, (), 0.0),
)
MAX_MIG = 7


def _raise(code):
    raise NVMLError(code)


def make_mig_nvml(n: int = 1, mig_gpus=(0,), *, gpm: bool = True, gpm_unsupported_gi=(), name=b"NVIDIA H100 80GB HBM3",
                  devices=H100_MIG):
    """``n`` GPUs, those in ``mig_gpus`` in MIG mode with ``devices``; ``gpm``: the GPUs have GPM
    (an A100 has not); ``gpm_unsupported_gi``: GPU instances whose GPM sample answers NOT_SUPPORTED."""
    nv, calls = make_fake_nvml(n=n)
    add_hopper_extras(nv, calls, gpm=gpm)
    by_slot = {(g, d.slot): d for g in mig_gpus for d in devices}

    def spec(h) -> MigSpec | None:
        return by_slot.get((h.parent, h.slot)) if isinstance(h, MigHandle) else None

    def count(name_):
        calls[name_] = calls.get(name_, 0) + 1

    def mig_mode(h):
        count("mig_mode")
        if isinstance(h, MigHandle):
            _raise(INVALID_ARGUMENT)
        return [1, 1] if h in mig_gpus else [0, 0]

    def handle_by_index(h, slot):
        count("mig_handle")
        if h not in mig_gpus or not 0 <= slot < MAX_MIG:
            _raise(INVALID_ARGUMENT)
        if (h, slot) not in by_slot:
            _raise(NOT_FOUND)
        return MigHandle(h, slot)

    whole_memory = nv.nvmlDeviceGetMemoryInfo

    def name_of(h):
        s = spec(h)
        return name + b" MIG " + s.profile.encode() if s else name

    def uuid_of(h):
        s = spec(h)
        return f"MIG-{h.parent:02d}{s.gi:02d}a1c0-5f4e-5b7d-9d8e-2c1b0a9f8e7d" if s else f"GPU-{h}f3c2a1-0000-4000-8000-00000000000{h}"

    def memory(h, version=None):
        s = spec(h)
        if s:
            return types.SimpleNamespace(total=s.total, used=s.used, free=s.total - s.used, reserved=0)
        if h in mig_gpus:  # the whole GPU: every instance's memory together
            return types.SimpleNamespace(total=80 * GiB, used=36 * GiB, reserved=512 * 2 ** 20)
        return whole_memory(h, version)

    def processes(h):
        count("processes")
        s = spec(h)
        if s:
            return [types.SimpleNamespace(pid=p, usedGpuMemory=s.used // max(1, len(s.pids))) for p in s.pids]
        if h in mig_gpus:  # the GPU in MIG mode lists every instance's processes again
            return [types.SimpleNamespace(pid=p, usedGpuMemory=GiB) for d in devices for p in d.pids]
        return [types.SimpleNamespace(pid=42, usedGpuMemory=GiB)]

    def whole_gpu_only(name_, value):
        def fn(h, *a):
            count(name_)
            if isinstance(h, MigHandle):
                _raise(NOT_SUPPORTED)
            return value(h) if callable(value) else value
        return fn

    def utilization(h):
        count("util")
        if isinstance(h, MigHandle) or h in mig_gpus:
            _raise(NOT_SUPPORTED)
        return types.SimpleNamespace(gpu=97, memory=40)

    def gi_id(h):
        return spec(h).gi if spec(h) else _raise(INVALID_ARGUMENT)

    def ci_id(h):
        return spec(h).ci if spec(h) else _raise(INVALID_ARGUMENT)

    # GPM: a sample remembers what it was taken of; the metrics come from the newer one
    def sample_get(h, s):
        count("gpm_sample")
        if isinstance(h, MigHandle):
            _raise(INVALID_ARGUMENT)
        s.src = ("gpu", h)
        return s

    def mig_sample_get(h, gi, s):
        count("gpm_mig_sample")
        if h not in mig_gpus or gi not in {d.gi for d in devices}:
            _raise(INVALID_ARGUMENT)
        if gi in gpm_unsupported_gi:
            _raise(NOT_SUPPORTED)
        s.src = ("gi", h, gi)
        return s

    def metrics_get(req):
        count("gpm_metrics")
        assert req.sample1 is not req.sample2
        src = req.sample2.src
        for m in req.metrics[: req.numMetrics]:
            m.nvmlReturn, m.value = 0, 0.0
            if src[0] == "gi":
                d = next(d for d in devices if d.gi == src[2])
                if m.metricId in (20, 21, 60, 61):  # the GPU's, not an instance's
                    m.nvmlReturn = NOT_SUPPORTED
                else:
                    m.value = {2: d.sm, 3: d.sm / 2, 5: d.sm / 4, 10: d.sm / 3}[m.metricId]
            elif src[1] in mig_gpus and m.metricId in (2, 3, 5, 10):
                m.nvmlReturn = NOT_SUPPORTED  # in MIG mode the SMs are measured per instance
            else:
                m.value = {2: 18.0, 3: 30.0, 5: 4.0, 10: 12.0, 20: 100.0, 21: 2048.0, 60: 0.0, 61: 0.0}[m.metricId]
        return req

    class MetricsGet:
        def __init__(self):
            self.version = self.numMetrics = 0
            self.sample1 = self.sample2 = None
            self.metrics = [types.SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(16)]

    def gpm_support(h):
        if isinstance(h, MigHandle):
            _raise(INVALID_ARGUMENT)
        return types.SimpleNamespace(isSupportedDevice=1 if gpm else 0)

    def nvlink_state(h, link):
        count("nvlink_state")
        _raise(NOT_SUPPORTED)  # a PCIe card: no NVLink

    nv.__dict__.update(
        NVML_DEVICE_MIG_ENABLE=1, NVML_NVLINK_MAX_LINKS=18,
        nvmlDeviceGetMigMode=mig_mode, nvmlDeviceGetMaxMigDeviceCount=lambda h: MAX_MIG if h in mig_gpus else 0,
        nvmlDeviceGetMigDeviceHandleByIndex=handle_by_index,
        nvmlDeviceGetGpuInstanceId=gi_id, nvmlDeviceGetComputeInstanceId=ci_id,
        nvmlDeviceGetName=name_of, nvmlDeviceGetUUID=uuid_of, nvmlDeviceGetMemoryInfo=memory,
        nvmlDeviceGetComputeRunningProcesses=processes, nvmlDeviceGetUtilizationRates=utilization,
        nvmlDeviceGetPowerUsage=whole_gpu_only("power", 350_000),
        nvmlDeviceGetTotalEnergyConsumption=whole_gpu_only("energy", 9_000_000),
        nvmlDeviceGetEnforcedPowerLimit=whole_gpu_only("power_limit", 700_000),
        nvmlDeviceGetTemperature=whole_gpu_only("temp", 55),
        nvmlDeviceGetClockInfo=whole_gpu_only("clock", 1755),
        nvmlGpmQueryDeviceSupport=gpm_support, nvmlGpmSampleGet=sample_get, nvmlGpmMigSampleGet=mig_sample_get,
        nvmlGpmMetricsGet=metrics_get, c_nvmlGpmMetricsGet_t=MetricsGet,
        nvmlGpmSampleAlloc=lambda: types.SimpleNamespace(src=None),
        nvmlDeviceGetNvLinkState=nvlink_state,
    )
    return nv, calls


def make_nvlink_nvml(n: int = 8, links: int = 18, down=(), rx_mib: float = 20_000.0, tx_mib: float = 18_000.0):
    """``n`` H100 SXM GPUs (no MIG) with ``links`` NVLinks each (those in ``down``, as
    (gpu, link), inactive), and NVLink traffic in GPM (MiB/s, as NVML gives it)."""
    nv, calls = make_fake_nvml(n=n)
    add_hopper_extras(nv, calls, gpm=True)
    metrics_get = nv.nvmlGpmMetricsGet

    def with_nvlink(req):
        metrics_get(req)
        for m in req.metrics[: req.numMetrics]:
            if m.metricId == 60:
                m.value = rx_mib
            elif m.metricId == 61:
                m.value = tx_mib
        return req

    def nvlink_state(h, link):
        calls["nvlink_state"] = calls.get("nvlink_state", 0) + 1
        if not 0 <= link < links:
            _raise(INVALID_ARGUMENT)
        return 0 if (h, link) in down else 1

    nv.__dict__.update(
        NVML_DEVICE_MIG_ENABLE=1, NVML_NVLINK_MAX_LINKS=18,
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetMigMode=lambda h: [0, 0], nvmlGpmMetricsGet=with_nvlink,
        nvmlDeviceGetNvLinkState=nvlink_state,
    )
    return nv, calls
