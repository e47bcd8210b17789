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


def _with_hopper_extras(nv, calls, *, gpm=True, events=()):
    """Add GPM, violation counters, ECC, link and event calls to a fake NVML."""
    import threading

    state = {}

    class Metric:
        def __init__(self):
            self.metricId, self.nvmlReturn, self.value = 0, 0, 0.0

    class MetricsGet:
        def __init__(self):
            self.version = self.numMetrics = 0
            self.sample1 = self.sample2 = None
            self.metrics = [Metric() for _ in range(8)]

    values = {2: 18.0, 3: 30.0, 5: 4.0, 10: 12.0, 20: 100.0, 21: 2048.0}

    def metrics_get(req):
        calls["gpm_metrics"] = calls.get("gpm_metrics", 0) + 1
        assert req.sample1 is not req.sample2
        for m in req.metrics[: req.numMetrics]:
            m.value = values[m.metricId]
        return req

    def sample_get(h, s):
        calls["gpm_sample"] = calls.get("gpm_sample", 0) + 1
        return s

    def violation(h, policy):
        ref, held = state.get(policy, (0, 0))
        state[policy] = (ref + 1_000_000_000, held + (250_000_000 if policy == 0 else 0))
        return types.SimpleNamespace(referenceTime=state[policy][0], violationTime=state[policy][1])

    pending = list(events)
    lock = threading.Lock()

    def wait(es, ms):
        with lock:
            if pending:
                return pending.pop(0)
        import time
        time.sleep(ms / 1000)
        raise NVMLError(10)

    nv.__dict__.update(
        nvmlGpmQueryDeviceSupport=lambda h: types.SimpleNamespace(isSupportedDevice=1 if gpm else 0),
        nvmlGpmSampleAlloc=lambda: object(), nvmlGpmSampleGet=sample_get, nvmlGpmMetricsGet=metrics_get,
        nvmlGpmSampleFree=lambda s: None, c_nvmlGpmMetricsGet_t=MetricsGet,
        nvmlDeviceGetViolationStatus=violation,
        nvmlDeviceGetTotalEccErrors=lambda h, kind, counter: 7 if kind == 0 else 0,
        nvmlDeviceGetRemappedRows=lambda h: (0, 0, 0, 0),
        nvmlDeviceGetCurrPcieLinkGeneration=lambda h: 5, nvmlDeviceGetCurrPcieLinkWidth=lambda h: 16,
        nvmlDeviceGetMaxPcieLinkGeneration=lambda h: 5, nvmlDeviceGetMaxPcieLinkWidth=lambda h: 16,
        nvmlEventSetCreate=lambda: "set", nvmlDeviceGetSupportedEventTypes=lambda h: 0xB,
        nvmlDeviceRegisterEvents=lambda h, types_, es: None, nvmlEventSetWait=wait, nvmlEventSetFree=lambda es: None,
    )
    return nv


def test_gpm_metrics_are_windowed_and_replace_the_slow_pcie_call():
    nv, calls = fake_nvml()
    c = NvmlCollector(_with_hopper_extras(nv, calls))
    c.poll_gpm()  # the first sample only opens the window
    assert c.sample()[0].sm_active is None
    c.poll_gpm()
    c.poll_slow()
    c.poll_slow()
    g = c.sample()[0]
    assert (g.sm_active, g.sm_occupancy, g.tensor_active, g.dram_active) == (18.0, 30.0, 4.0, 12.0)
    assert g.pcie_rx == 2048 * 2**20 and g.pcie_tx == 100 * 2**20  # MiB/s from GPM
    assert "pcie" not in calls  # the ~21 ms throughput call is skipped where GPM measures it
    assert g.throttle_power == 25.0 and g.throttle_thermal == 0.0  # 0.25 s of each 1 s held down
    assert (g.ecc_corrected, g.ecc_uncorrected, g.remap_pending) == (7, 0, 0)
    assert (g.pcie_gen, g.pcie_width, g.pcie_gen_max, g.pcie_width_max) == (5, 16, 5, 16)
    from traintop.samples import pcie_bandwidth
    assert pcie_bandwidth(c.infos[0].pcie_gen_max, c.infos[0].pcie_width_max) == pytest.approx(63.0e9, rel=0.01)
    c.close()


def test_without_gpm_or_new_calls_everything_new_reads_none():
    nv, calls = fake_nvml()  # bindings without GPM, violation, ECC, link or event calls
    c = NvmlCollector(nv)
    c.poll_gpm()
    c.poll_gpm()
    c.poll_slow()
    g = c.sample()[0]
    assert g.sm_active is None and g.throttle_power is None and g.ecc_corrected is None and g.xid is None
    assert g.pcie_rx == 2048 * 1024 and calls["pcie"] == 2  # the old call still measures PCIe
    assert not c.events.available
    c.close()


def test_gpm_unsupported_device_uses_the_old_pcie_call():
    nv, calls = fake_nvml()
    c = NvmlCollector(_with_hopper_extras(nv, calls, gpm=False))
    c.poll_gpm()
    c.poll_gpm()
    c.poll_slow()
    assert c.sample()[0].sm_active is None and calls["pcie"] == 2 and "gpm_sample" not in calls
    c.close()


def test_xid_event_reaches_exactly_one_tick():
    import time

    nv, calls = fake_nvml(n=2)
    ev = types.SimpleNamespace(device=1, eventType=0x8, eventData=31)
    c = NvmlCollector(_with_hopper_extras(nv, calls, events=[ev]))
    c.events.wait_ms = 20
    assert c.events.available
    c.start_slow()
    deadline = time.monotonic() + 2
    seen = []
    while time.monotonic() < deadline and not seen:
        seen = [g.xid for g in c.sample() if g.xid is not None]
        time.sleep(0.02)
    assert seen == [31]
    assert [g.xid for g in c.sample()] == [None, None]
    c.close()


def test_gpm_error_mid_run_is_counted_not_raised():
    nv, calls = fake_nvml()
    _with_hopper_extras(nv, calls)

    def broken(h, s):
        raise NVMLError(15)  # GPU is lost
    c = NvmlCollector(nv)
    c.poll_gpm()
    nv.nvmlGpmSampleGet = broken
    c.poll_gpm()
    assert c.gpm.errors == 1 and c.sample()[0].sm_active is None
    c.close()
