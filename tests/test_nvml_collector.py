"""The NVML collector against a fake pynvml: units, NotSupported caching, errors never raised."""

import types

import pytest

from traintop.collectors.nvml import NvmlCollector
from traintop.errors import NoGpuError


class NVMLError(Exception):
    def __init__(self, value):
        self.value = value


def fake_nvml(n=1, unsupported=(), failing=(), init_error=None):
    calls = {}

    def count(name):
        calls[name] = calls.get(name, 0) + 1
        if name in unsupported:
            raise NVMLError(3)
        if name in failing:
            raise NVMLError(999)

    def f(name, result):
        def fn(*a):
            count(name)
            return result(*a) if callable(result) else result
        return fn

    def init():
        if init_error is not None:
            raise NVMLError(init_error)

    sample = types.SimpleNamespace(timeStamp=5, sampleValue=types.SimpleNamespace(uiVal=40))
    sample2 = types.SimpleNamespace(timeStamp=9, sampleValue=types.SimpleNamespace(uiVal=100))
    nv = types.SimpleNamespace(
        NVMLError=NVMLError, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN=1, NVML_TEMPERATURE_GPU=0,
        NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2, NVML_GPU_UTILIZATION_SAMPLES=1, NVML_PCIE_UTIL_TX_BYTES=0,
        NVML_PCIE_UTIL_RX_BYTES=1, nvmlMemory_v2=0x02000028,
        nvmlInit=init, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: n,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=f("name", b"NVIDIA H200"),
        nvmlDeviceGetUUID=f("uuid", "GPU-1"),
        nvmlSystemGetDriverVersion=f("driver", "580.159.04"),
        nvmlSystemGetCudaDriverVersion=f("cuda", 13000),
        nvmlDeviceGetMemoryInfo=f("memory", lambda h, v=None: types.SimpleNamespace(
            used=10 * 2**30, total=140 * 2**30, reserved=512 * 2**20)),
        nvmlDeviceGetEnforcedPowerLimit=f("power_limit", 700_000),
        nvmlDeviceGetPowerUsage=f("power", 612_500),
        nvmlDeviceGetTemperature=f("temp", 61),
        nvmlDeviceGetTemperatureThreshold=f("temp_slowdown", 87),
        nvmlDeviceGetMaxClockInfo=f("max_clock", 1980),
        nvmlDeviceGetClockInfo=f("clock", 1755),
        nvmlDeviceGetCurrentClocksEventReasons=f("reasons", 0x4),
        nvmlDeviceGetUtilizationRates=f("util", types.SimpleNamespace(gpu=97, memory=40)),
        nvmlDeviceGetSamples=f("util_samples", (1, [sample, sample2])),
        nvmlDeviceGetComputeRunningProcesses=f("processes", [types.SimpleNamespace(pid=42, usedGpuMemory=2**30)]),
        nvmlDeviceGetPcieThroughput=f("pcie", 2048),
        nvmlDeviceGetTotalEnergyConsumption=f("energy", 5_000_000),
    )
    return nv, calls


def test_units_and_fields():
    nv, _ = fake_nvml()
    c = NvmlCollector(nv)
    c.poll_util_window()
    c.poll_slow()
    (g,) = c.sample()
    assert g.util == 97 and g.mem_util == 40
    assert g.mem_used == 10 * 2**30 and g.mem_total == 140 * 2**30 and g.mem_reserved == 512 * 2**20
    assert g.power_w == 612.5 and g.power_limit_w == 700.0
    assert g.temp_c == 61 and g.temp_slowdown_c == 87
    assert g.sm_clock == 1755 and g.sm_clock_max == 1980
    assert g.reasons == 0x4
    assert (g.util_min, g.util_max) == (40.0, 100.0)
    assert g.pcie_tx == 2048 * 1024 and g.energy_j == 5000.0
    assert [(p.pid, p.used_bytes) for p in g.processes] == [(42, 2**30)]
    assert c.infos[0].name == "NVIDIA H200" and c.cuda_driver == "13.0"
    (g2,) = c.sample()
    assert g2.util_min is None  # the windowed reading belongs to one tick only


def test_not_supported_is_none_and_never_asked_again():
    nv, calls = fake_nvml(unsupported={"power", "pcie"})
    c = NvmlCollector(nv)
    for _ in range(5):
        c.poll_slow()
        (g,) = c.sample()
    assert g.power_w is None and g.pcie_tx is None
    assert calls["power"] == 1 and calls["pcie"] == 2  # TX and RX: each field asked once
    assert g.util == 97  # the rest still reads


def test_other_errors_leave_the_field_none_and_are_counted():
    nv, calls = fake_nvml(failing={"temp"})
    c = NvmlCollector(nv)
    for _ in range(3):
        (g,) = c.sample()
    assert g.temp_c is None
    assert c.errors["temp"] == 3 and calls["temp"] == 3  # retried: it may recover


def test_init_failure_is_one_clear_error():
    nv, _ = fake_nvml(init_error=9)
    with pytest.raises(NoGpuError, match="driver"):
        NvmlCollector(nv)


def test_zero_gpus():
    nv, _ = fake_nvml(n=0)
    with pytest.raises(NoGpuError, match="no GPU"):
        NvmlCollector(nv)


def test_slow_thread_runs_and_stops():
    import time

    nv, calls = fake_nvml(n=2)
    c = NvmlCollector(nv, slow_every=0.05)
    c.start_slow()
    time.sleep(0.3)
    c.close()
    assert calls["pcie"] >= 4  # 2 GPUs x TX/RX at least once
    g = c.sample()
    assert len(g) == 2 and g[1].pcie_rx == 2048 * 1024
