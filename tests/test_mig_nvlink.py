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


# -- what the rows become: a recording, samples for scripts, the agent's series, the dashboard --
def _record_mig(path, n_frames=30, nv=None):
    from traintop.record.recording import RecordingWriter
    from traintop.samples import Frame

    nv = nv or make_mig_nvml(n=2, mig_gpus=(0,))[0]
    c = NvmlCollector(nv)
    w = RecordingWriter(str(path), c.session_info(0.5), flush_every=1e9)
    frames = []
    for k in range(n_frames):
        c.poll_slow()
        c.poll_gpm()
        frames.append(Frame(t=1000.0 + 0.5 * k, gpus=c.sample()))
        w.add(frames[-1])
    w.close()
    c.close()
    return frames


def test_a_recording_keeps_the_mig_rows_their_parent_and_nvlink(tmp_path):
    from traintop.record.recording import RecordingReader

    path = tmp_path / "mig.ttrec"
    written = _record_mig(path)
    r = RecordingReader(str(path))
    infos = {i.index: i for i in r.info.gpus}
    assert infos[2].label == "GPU 0 MIG 3g.40gb #1" and infos[2].uuid.startswith("MIG-")
    assert infos[0].mig is True and infos[1].mig is False and infos[4].gi_id == 13
    last = list(r.frames())[-1]
    assert [g.parent for g in last.gpus] == [None, None, 0, 0, 0]
    assert [g.sm_active for g in last.gpus[2:]] == [g.sm_active for g in written[-1].gpus[2:]]
    assert sorted(p.pid for p in last.gpus[3].processes) == [4202, 4203]
    assert last.gpus[2].power_w is None and last.gpus[0].power_w == 350.0


def test_nvlink_rates_survive_a_recording_and_old_recordings_read_none(tmp_path):
    from traintop.record.codec import decode, encode
    from traintop.record.recording import info_from_json
    from traintop.samples import Frame, GpuSample

    f = Frame(t=5.0, gpus=(GpuSample(index=0, util=50.0, nvlink_tx=2.0e10, nvlink_rx=1.5e10),
                           GpuSample(index=9, mem_used=2 ** 30, parent=0)))
    (back,) = decode(encode([f]))
    assert back.gpus[0].nvlink_tx == 2.0e10 and back.gpus[0].nvlink_rx == 1.5e10
    assert back.gpus[1].parent == 0 and back.gpus[0].parent is None
    old = info_from_json('{"kind": "live", "gpus": [{"index": 0, "name": "NVIDIA H200"}]}')
    assert old.gpus[0].parent is None and old.gpus[0].mig is None and old.gpus[0].nvlinks is None
    bad = info_from_json('{"kind": "live", "gpus": [{"index": 9, "name": "x", "parent": 99, "mig": "yes", '
                         '"mig_profile": "1g.10gb\\u001b[2J", "gi_id": -1, "nvlinks": true}]}')
    g = bad.gpus[0]
    assert g.parent is None and g.mig is None and g.gi_id is None and g.nvlinks is None
    assert "\x1b" not in g.mig_profile


def test_recordings_of_a_gpu_without_mig_read_as_before():
    """A recording made before MIG and NVLink (an H200, tests/fixtures) reads no parent and no NVLink."""
    import pathlib

    from traintop.record.recording import RecordingReader

    path = pathlib.Path(__file__).parent / "fixtures" / "h200" / "fault-10hz.ttrec"
    r = RecordingReader(str(path))
    frame = next(iter(r.frames()))
    assert all(g.parent is None and g.nvlink_tx is None for g in frame.gpus)
    assert all(i.parent is None and i.mig is None for i in r.info.gpus)


def test_snapshot_json_and_csv_carry_mig_and_nvlink():
    from traintop.record.export import CSV_COLUMNS, csv_rows, sample_record
    from traintop.samples import Frame

    nv, _ = make_mig_nvml()
    c = NvmlCollector(nv)
    rows = _windows(c)
    info = c.session_info(0.5)
    rec = sample_record(Frame(t=1.0, gpus=rows), info)
    whole, big = rec["gpus"][0], rec["gpus"][1]
    assert whole["mig"] is None and whole["parent"] is None and "nvlink_tx" in whole
    assert big["mig"] == {"profile": "3g.40gb", "gpu_instance_id": 1, "compute_instance_id": 0}
    assert big["parent"] == 0 and big["power_w"] is None and big["uuid"].startswith("MIG-")
    # the CSV's earlier columns stay where they were; the new ones come after processes
    assert CSV_COLUMNS.index("processes") < CSV_COLUMNS.index("nvlink_tx")
    assert CSV_COLUMNS[-6:] == ["nvlink_tx", "nvlink_rx", "parent", "mig_profile", "gpu_instance_id",
                                "compute_instance_id"]
    lines = csv_rows(Frame(t=1.0, gpus=rows), info).splitlines()
    assert lines[1].endswith(",0,3g.40gb,1,0")


def test_agent_series_label_mig_devices_as_dcgm_exporter_does():
    import pytest
    pytest.importorskip("prometheus_client")
    from traintop.cluster import series as S
    from traintop.cluster.exporter import HostCollector, HostState
    from traintop.samples import Frame

    nv, _ = make_nvlink_nvml(n=1)
    nv2, _ = make_mig_nvml()
    for nvml in (nv, nv2):
        c = NvmlCollector(nvml)
        rows = _windows(c)
        fams = {f.name: f for f in HostCollector(HostState("node1", Frame(t=1.0, gpus=rows), c.infos)).collect()}
        if nvml is nv:
            (s,) = fams[S.gpu("nvlink_rx")].samples
            assert s.value == 20_000.0 * 2 ** 20 and set(s.labels) == set(S.GPU_LABELS)
            continue
        mem = fams[S.gpu("mem_used")].samples
        whole = [s for s in mem if "GPU_I_ID" not in s.labels]
        mig = sorted((s for s in mem if "GPU_I_ID" in s.labels), key=lambda s: int(s.labels["GPU_I_ID"]))
        assert len(whole) == 1 and whole[0].labels["gpu"] == "0"
        assert [(s.labels["gpu"], s.labels["GPU_I_ID"], s.labels["GPU_I_PROFILE"]) for s in mig] == \
            [("0", "1", "3g.40gb"), ("0", "5", "2g.20gb"), ("0", "13", "1g.10gb")]
        assert {s.labels["UUID"] for s in mem} == {c.infos[0].uuid}  # the GPU's UUID, as dcgm-exporter's
        power = fams[S.gpu("power_w")].samples
        assert len(power) == 1 and "GPU_I_ID" not in power[0].labels  # once per physical GPU
        assert not fams[S.gpu("nvlink_rx")].samples or all("GPU_I_ID" not in s.labels
                                                             for s in fams[S.gpu("nvlink_rx")].samples)


def test_doctor_says_mig_mode_devices_and_nvlinks():
    from traintop.reports import doctor

    nv, _ = make_mig_nvml(n=2, mig_gpus=(0,))
    checks, _ = doctor.nvml_checks(nv)
    (c,) = [c for c in checks if c.name == "MIG and NVLink"]
    assert "GPU 0: MIG on, 3 MIG device(s), no NVLink" in c.detail and "GPU 1: MIG off" in c.detail
    assert "not yet run on such a machine" in c.detail
    nv, _ = make_nvlink_nvml(n=2)
    checks, _ = doctor.nvml_checks(nv)
    (c,) = [c for c in checks if c.name == "MIG and NVLink"]
    assert "GPU 1: MIG off, 18 NVLink(s) active" in c.detail


def test_dashboard_shows_mig_rows_at_80x24_and_160x48(tmp_path):
    import asyncio

    from traintop.watch import sessions
    from traintop.app.factory import build_app
    from traintop.widgets.gpu_panel import GpuPanel
    from traintop.widgets.gpu_table import GpuTable

    path = tmp_path / "mig.ttrec"
    _record_mig(path)

    async def go():
        for size in ((80, 24), (160, 48)):
            monitor, feed = sessions.replay_session(str(path))
            feed.playing = False
            feed.seek(feed.t_start + 10)
            app = build_app(monitor, feed, mode="replay", start_feed=False)
            async with app.run_test(size=size) as pilot:
                await pilot.pause()
                texts = [p.render().plain + str(p.border_title) for p in app.query(GpuPanel) if p.display]
                table = app.query_one(GpuTable)
                if table.display:
                    texts.append(table.render().plain)
                shown = "\n".join(texts)
                assert "MIG 3g.40gb #1" in shown, (size, shown)
                if size == (160, 48):
                    assert "MIG 1g.10gb #13" in shown and "on GPU 0" in shown
    asyncio.run(go())


def test_dashboard_shows_nvlink_beside_pcie(tmp_path):
    import asyncio

    from traintop.watch import sessions
    from traintop.app.factory import build_app
    from traintop.widgets.gpu_panel import GpuPanel

    path = tmp_path / "nvlink.ttrec"
    _record_mig(path, nv=make_nvlink_nvml(n=2)[0])

    async def go():
        monitor, feed = sessions.replay_session(str(path))
        feed.playing = False
        feed.seek(feed.t_start + 10)
        app = build_app(monitor, feed, mode="replay", start_feed=False)
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            text = "\n".join(p.render().plain for p in app.query(GpuPanel))
            assert "PCIe ↑" in text and "NVLink ↑" in text, text
    asyncio.run(go())
