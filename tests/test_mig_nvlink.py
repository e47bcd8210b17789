"""MIG devices and NVLink through the NVML collector, against NVML's answers on hardware no
machine here has (tests/mig_nvml.py): the rows, what each row reads, nothing counted twice."""

import types

from mig_nvml import H100_MIG, MigHandle, make_mig_nvml, make_nvlink_nvml

from traintop.collectors.gpm import GpmReader
from traintop.collectors.mig import mig_mode, profile_of
from traintop.collectors.nvlink import active_links
from traintop.collectors.nvml import NvmlCollector

GiB = 2 ** 30


def _windows(c, n=2):
    """``n`` GPM windows and slow reads, then a tick."""
    for _ in range(n):
        c.poll_slow()
        c.poll_gpm()
    return c.sample()


def test_mig_gpu_keeps_its_row_and_each_mig_device_gets_one():
    nv, calls = make_mig_nvml(n=2, mig_gpus=(0,))
    c = NvmlCollector(nv)
    infos = c.infos
    assert [i.index for i in infos] == [0, 1, 2, 3, 4]  # MIG rows after every NVML index
    assert infos[0].mig is True and infos[1].mig is False
    mig = infos[2:]
    assert [i.label for i in mig] == ["GPU 0 MIG 3g.40gb #1", "GPU 0 MIG 2g.20gb #5", "GPU 0 MIG 1g.10gb #13"]
    assert [i.parent for i in mig] == [0, 0, 0] and [i.ci_id for i in mig] == [0, 0, 0]
    assert all(i.uuid.startswith("MIG-") for i in mig)
    assert [i.mem_total for i in mig] == [40 * GiB, 20 * GiB, 10 * GiB]
    assert mig[0].name == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert calls["mig_handle"] == 7  # every slot asked once; 4 answered NOT_FOUND and were skipped
    assert c.mig.counts == {0: 3} and not c.errors.get("mig_handle")
    rows = c.sample()
    assert [s.index for s in rows] == [0, 1, 2, 3, 4]
    assert [s.parent for s in rows] == [None, None, 0, 0, 0]


def test_mig_rows_read_their_own_memory_processes_and_instance_gpm():
    nv, _ = make_mig_nvml()
    c = NvmlCollector(nv)
    whole, *rows = _windows(c)
    for s, spec in zip(rows, H100_MIG):
        assert s.mem_used == spec.used and s.mem_total == spec.total
        assert sorted(p.pid for p in s.processes) == sorted(spec.pids)
        assert s.util is None  # NVML's utilization answers NOT_SUPPORTED on a MIG device
        assert s.sm_active == spec.sm and s.tensor_active == spec.sm / 4
        assert s.pcie_tx is None and s.nvlink_tx is None  # the GPU's, not an instance's
    assert rows[2].sm_active == 0.0  # a measured idle instance reads 0, not unknown
    # the GPU's own row: what belongs to the whole GPU, no processes listed twice
    assert whole.processes == () and whole.util is None
    assert whole.power_w == 350.0 and whole.temp_c == 55 and whole.sm_clock == 1755
    assert whole.pcie_tx == 100.0 * 2 ** 20
    assert whole.sm_active is None  # measured per instance in MIG mode


def test_power_and_energy_are_counted_once_per_physical_gpu():
    nv, _ = make_mig_nvml(n=2, mig_gpus=(0,))
    c = NvmlCollector(nv)
    rows = _windows(c)
    assert sum(s.power_w or 0 for s in rows) == 350.0 * 2
    assert sum(s.energy_j or 0 for s in rows) == 9000.0 * 2
    for s in rows:
        if s.parent is not None:
            assert s.power_w is None and s.energy_j is None and s.power_limit_w is None
            assert s.temp_c is None and s.sm_clock is None and s.ecc_uncorrected is None and s.xid is None


def test_mig_instance_without_gpm_reads_unknown_not_zero():
    nv, _ = make_mig_nvml(gpm_unsupported_gi=(5,))
    c = NvmlCollector(nv)
    _, big, small, tiny = _windows(c, 3)
    assert big.sm_active == 71.0
    assert small.sm_active is None and small.tensor_active is None and small.dram_active is None
    assert tiny.sm_active == 0.0
    assert c.mig.gpm.supported == [True, False, True]  # NOT_SUPPORTED is not asked again


def test_a100_in_mig_mode_has_no_gpm_and_reads_unknown():
    nv, calls = make_mig_nvml(gpm=False, name=b"NVIDIA A100-SXM4-80GB")
    c = NvmlCollector(nv)
    rows = _windows(c)
    assert all(s.sm_active is None and s.util is None for s in rows)
    assert "gpm_mig_sample" not in calls
    assert [i.label for i in c.infos[1:]][0] == "GPU 0 MIG 3g.40gb #1"


def test_bad_mig_answers_never_raise_into_the_sampler():
    nv, _ = make_mig_nvml()
    c = NvmlCollector(nv)
    memory, processes = nv.nvmlDeviceGetMemoryInfo, nv.nvmlDeviceGetComputeRunningProcesses
    nv.nvmlDeviceGetMemoryInfo = lambda h, v=None: types.SimpleNamespace(used="lots", total=-1) \
        if isinstance(h, MigHandle) else memory(h, v)
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: [types.SimpleNamespace(pid="x"), object()] \
        if isinstance(h, MigHandle) else processes(h)

    def broken(*a):
        raise RuntimeError("driver said something odd")
    nv.nvmlGpmMigSampleGet = broken
    rows = _windows(c)
    assert len(rows) == 4
    assert all(s.mem_used is None and s.processes == () for s in rows[1:])


def test_a_gpu_without_mig_is_unchanged(fake_nvml):
    nv, _ = fake_nvml()
    c = NvmlCollector(nv)
    (info,) = c.infos
    assert info.mig is None and info.parent is None and info.label == "GPU 0" and info.nvlinks is None
    (g,) = c.sample()
    assert g.parent is None and [p.pid for p in g.processes] == [42]
    assert not c.mig.devices


def test_mig_mode_off_or_unknown():
    nv, _ = make_mig_nvml(n=2, mig_gpus=(1,))
    assert mig_mode(nv, 0) is False and mig_mode(nv, 1) is True
    assert mig_mode(types.SimpleNamespace(), 0) is None  # bindings without MIG
    assert mig_mode(nv, MigHandle(1, 0)) is None


def test_profile_from_the_name_or_the_attributes():
    assert profile_of("NVIDIA H200 MIG 1g.18gb") == "1g.18gb"
    assert profile_of("NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb") == "1c.3g.20gb"
    assert profile_of("NVIDIA H100 MIG 1g.10gb+me") == "1g.10gb+me"
    assert profile_of("NVIDIA H100 MIG \x1b[2J") is None
    attrs = types.SimpleNamespace(gpuInstanceSliceCount=2, memorySizeMB=20096)
    assert profile_of("odd", attrs) == "2g.20gb"


def test_eight_nvlinked_gpus_count_links_and_read_traffic():
    nv, calls = make_nvlink_nvml(down={(3, 17)})
    nv.NVML_NVLINK_MAX_LINKS = 36  # newer bindings: links past a GPU's 18 answer INVALID_ARGUMENT
    c = NvmlCollector(nv)
    assert [i.nvlinks for i in c.infos] == [18, 18, 18, 17, 18, 18, 18, 18]
    assert calls["nvlink_state"] == 8 * 19  # the one past the last ends the count
    nv, calls = make_nvlink_nvml(down={(3, 17)})
    c = NvmlCollector(nv)
    assert [i.nvlinks for i in c.infos] == [18, 18, 18, 17, 18, 18, 18, 18]
    assert calls["nvlink_state"] == 8 * 18  # read once at start, link by link up to NVML_NVLINK_MAX_LINKS
    rows = _windows(c)
    assert calls["nvlink_state"] == 8 * 18
    assert len(rows) == 8 and all(s.parent is None for s in rows)
    assert {s.nvlink_rx for s in rows} == {20_000.0 * 2 ** 20}
    assert {s.nvlink_tx for s in rows} == {18_000.0 * 2 ** 20}


def test_no_nvlink_reads_none():
    nv, _ = make_mig_nvml()
    assert active_links(nv, 0) is None
    assert active_links(types.SimpleNamespace(), 0) is None


def test_gpm_rates_from_nvml_are_checked():
    """A NaN or a negative rate from the driver never reaches a sample as a number."""
    nv, _ = make_nvlink_nvml(rx_mib=float("nan"), tx_mib=-5.0)
    r = GpmReader(nv, [0])
    r.poll(0)
    m = r.poll(0)
    assert m["nvlink_rx"] is None and m["nvlink_tx"] == 0.0
