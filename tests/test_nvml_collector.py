"""The NVML collector against a fake pynvml: units, NotSupported caching, errors never raised."""

import types

import pytest

from traintop.collectors.nvml import NvmlCollector
from traintop.errors import NoGpuError


def test_units_and_fields(fake_nvml):
    nv, _ = fake_nvml()
    c = NvmlCollector(nv)
    c.poll_util_window()  # the first read only sets the buffer's timestamp
    c.sample()  # a tick: the GPU works
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


def test_not_supported_is_none_and_never_asked_again(fake_nvml):
    nv, calls = fake_nvml(unsupported={"power", "pcie"})
    c = NvmlCollector(nv)
    for _ in range(5):
        c.poll_slow()
        (g,) = c.sample()
    assert g.power_w is None and g.pcie_tx is None
    assert calls["power"] == 1 and calls["pcie"] == 2  # TX and RX: each field asked once
    assert g.util == 97  # the rest still reads


def test_other_errors_leave_the_field_none_and_are_counted(fake_nvml):
    nv, calls = fake_nvml(failing={"temp"})
    c = NvmlCollector(nv)
    for _ in range(3):
        (g,) = c.sample()
    assert g.temp_c is None
    assert c.errors["temp"] == 3 and calls["temp"] == 3  # retried: it may recover


def test_init_failure_is_one_clear_error(fake_nvml):
    nv, _ = fake_nvml(init_error=9)
    with pytest.raises(NoGpuError, match="driver"):
        NvmlCollector(nv)


def test_zero_gpus(fake_nvml):
    nv, _ = fake_nvml(n=0)
    with pytest.raises(NoGpuError, match="no GPU"):
        NvmlCollector(nv)


def test_slow_thread_runs_and_stops(fake_nvml):
    import time

    nv, calls = fake_nvml(n=2)
    c = NvmlCollector(nv, slow_every=0.05)
    c.start_slow()
    time.sleep(0.3)
    c.close()
    assert calls["pcie"] >= 4  # 2 GPUs x TX/RX at least once
    g = c.sample()
    assert len(g) == 2 and g[1].pcie_rx == 2048 * 1024


def test_gpm_metrics_are_windowed_and_replace_the_slow_pcie_call(fake_nvml, with_hopper_extras):
    nv, calls = fake_nvml()
    c = NvmlCollector(with_hopper_extras(nv, calls))
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


def test_without_gpm_or_new_calls_everything_new_reads_none(fake_nvml):
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


def test_gpm_unsupported_device_uses_the_old_pcie_call(fake_nvml, with_hopper_extras):
    nv, calls = fake_nvml()
    c = NvmlCollector(with_hopper_extras(nv, calls, gpm=False))
    c.poll_gpm()
    c.poll_gpm()
    c.poll_slow()
    assert c.sample()[0].sm_active is None and calls["pcie"] == 2 and "gpm_sample" not in calls
    c.close()


def test_xid_event_reaches_exactly_one_tick(fake_nvml, with_hopper_extras):
    import time

    nv, calls = fake_nvml(n=2)
    ev = types.SimpleNamespace(device=1, eventType=0x8, eventData=31)
    c = NvmlCollector(with_hopper_extras(nv, calls, events=[ev]))
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


def test_gpm_error_mid_run_is_counted_not_raised(fake_nvml, nvml_error, with_hopper_extras):
    nv, calls = fake_nvml()
    with_hopper_extras(nv, calls)

    def broken(h, s):
        raise nvml_error(15)  # GPU is lost
    c = NvmlCollector(nv)
    c.poll_gpm()
    nv.nvmlGpmSampleGet = broken
    c.poll_gpm()
    assert c.gpm.errors == 1 and c.sample()[0].sm_active is None
    c.close()


def _idle(nv):
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=0, memory=0)
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: []


def test_an_idle_gpus_utilization_buffer_is_not_read(fake_nvml):
    nv, calls = fake_nvml(n=2)
    c = NvmlCollector(nv)
    _idle(nv)
    c.sample()
    for _ in range(5):  # windows with no process and no utilization on either GPU
        c.poll_util_window()
        c.sample()
    assert calls.get("util_samples", 0) == 2  # the first window, before the idle ticks were seen
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: [types.SimpleNamespace(pid=7, usedGpuMemory=1)] if h == 1 else []
    c.sample()  # GPU 1 gets a process
    c.poll_util_window()  # primes GPU 1's buffer: samples from before it worked are not its window
    assert [g.util_min for g in c.sample()] == [None, None]
    c.poll_util_window()
    assert [(g.util_min, g.util_max) for g in c.sample()] == [(None, None), (40.0, 100.0)]
    assert calls["util_samples"] == 4


def test_a_working_gpu_with_zero_processes_visible_still_gets_its_window(fake_nvml):
    nv, calls = fake_nvml()
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: []  # e.g. another PID namespace
    c = NvmlCollector(nv)
    for _ in range(3):
        c.sample()
        c.poll_util_window()
    (g,) = c.sample()
    assert (g.util_min, g.util_max) == (40.0, 100.0)


def test_energy_is_read_only_when_asked_and_pcie_throughput_only_for_working_gpus(fake_nvml):
    nv, calls = fake_nvml()
    c = NvmlCollector(nv)
    c.poll_slow(energy=False)
    assert "energy" not in calls and calls["pcie"] == 2
    (g,) = c.sample()
    assert g.energy_j is None and g.pcie_tx == 2048 * 1024
    c.poll_util_window()
    c.sample()  # the GPU works in this window
    c.poll_slow(energy=True)
    assert calls["energy"] == 1 and calls["pcie"] == 4
    (g,) = c.sample()
    assert g.energy_j == 5000.0
    _idle(nv)
    c.sample()
    c.poll_util_window()
    c.sample()
    c.poll_util_window()  # a whole window idle
    c.poll_slow()
    assert calls["pcie"] == 4  # ~21 ms a call: not for an idle GPU; its last reading stands
    (g,) = c.sample()
    assert g.pcie_tx == 2048 * 1024


def test_the_slow_thread_reads_energy_less_often_than_the_rest(fake_nvml, with_hopper_extras):
    import time
    nv, calls = fake_nvml()
    with_hopper_extras(nv, calls)
    c = NvmlCollector(nv, slow_every=0.02, window_s=0.02, energy_every=3600)
    c.start_slow()
    deadline = time.time() + 5
    while calls.get("gpm_sample", 0) < 10 and time.time() < deadline:
        time.sleep(0.01)
    c.close()
    assert calls["energy"] == 1 and calls["gpm_sample"] >= 10


def test_only_gpus_reads_just_those_and_keeps_their_nvml_index(fake_nvml):
    nv, calls = fake_nvml(n=3)
    asked = []
    nv.nvmlDeviceGetHandleByIndex = lambda i: asked.append(i) or i
    util = {0: 5, 1: 50, 2: 95}
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=util[h], memory=1)
    c = NvmlCollector(nv, only=frozenset({2, 0}))
    assert asked == [0, 2]
    assert [i.index for i in c.infos] == [0, 2]
    assert [(g.index, g.util) for g in c.sample()] == [(0, 5.0), (2, 95.0)]


def test_only_gpus_naming_a_gpu_that_is_not_there_is_one_clear_error(fake_nvml):
    from traintop.errors import TraintopError

    nv, _ = fake_nvml(n=2)
    with pytest.raises(TraintopError, match=r"--only-gpus: no GPU 2, 7 here \(NVML sees 2: 0-1\)"):
        NvmlCollector(nv, only=frozenset({1, 2, 7}))


def test_a_steadily_busy_gpus_utilization_buffer_is_not_read_until_it_dips(fake_nvml, monkeypatch):
    """Busy at every tick for STEADY_S (here 0: at once), its window can hold no dip a rule reads;
    a tick below STEADY_UTIL brings the reads back (the first one primes, as after idling)."""
    from traintop.collectors import nvml

    monkeypatch.setattr(nvml, "STEADY_S", 0.0)
    nv, calls = fake_nvml()  # ticks read 97 %
    c = NvmlCollector(nv)
    for _ in range(3):
        c.sample()
        c.poll_util_window()
    (g,) = c.sample()
    assert "util_samples" not in calls and g.util_min is None
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=50, memory=40)
    c.sample()  # a dip
    c.poll_util_window()  # primes
    c.sample()
    c.poll_util_window()
    (g,) = c.sample()
    assert calls["util_samples"] == 2 and (g.util_min, g.util_max) == (40.0, 100.0)


def test_a_snapshot_reads_every_buffer(fake_nvml, monkeypatch):
    from traintop.collectors import nvml

    monkeypatch.setattr(nvml, "STEADY_S", 0.0)
    nv, calls = fake_nvml()
    c = NvmlCollector(nv)
    c.sample()
    c.poll_util_window(every_gpu=True)
    assert calls["util_samples"] == 1
