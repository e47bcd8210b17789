"""A fake pynvml, to test the NVML collector's logic without a GPU (tests via conftest's
fixtures; the benchmark's quick run too)."""

import os
import types


class NVMLError(Exception):
    def __init__(self, value):
        self.value = value


def make_fake_nvml(n=1, unsupported=(), failing=(), init_error=None):
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


def add_hopper_extras(nv, calls, *, gpm=True, events=()):
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

    values = {2: 18.0, 3: 30.0, 5: 4.0, 10: 12.0, 20: 100.0, 21: 2048.0, 60: 0.0, 61: 0.0}

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


def fake_proc(root, pid, *, uid=1000, nspid=None, cgroup="0::/\n", env=None, fds=(), start=1000, name="python"):
    """``root``/PID as /proc shows a process: its status (uid, NSpid), stat (its start time, clock ticks
    after boot), cgroup, environ and open files. Called again for a PID: another process took it."""
    import shutil

    d = root / str(pid)
    shutil.rmtree(d, ignore_errors=True)
    (d / "fd").mkdir(parents=True)
    (d / "stat").write_text(f"{pid} ({name}) S 1 {pid} {pid} 0 -1 4194304 " + "0 " * 12 + f"{start} 1 1\n")
    (d / "status").write_text(f"Name:\t{name}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
                              f"NSpid:\t{' '.join(map(str, nspid or (pid,)))}\n")
    (d / "cgroup").write_text(cgroup)
    (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in (env or {}).items()))
    for k, target in enumerate(fds):
        os.symlink(target, d / "fd" / str(k))
    return d
