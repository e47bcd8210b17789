"""Whose each GPU process is, on the dashboard: fake NVML lists the processes, a fake /proc says
whose they are (collectors/whose.py), the live sampler attaches the owners (cached per PID), and
the GPU panels, the GPU table and the process panel show them, as text."""

import asyncio
import dataclasses
import os
import pwd
import types

import pytest
from fakes import fake_proc

from traintop.collectors.owner_cache import OwnerCache
from traintop.collectors.whose import whose
from traintop.samples import Owner

GiB = 2**30
CID = "3f" * 32
POD = "0d2a6b1e-5c7f-4e9a-9b3d-2f1e0c4d5a6b"
ME = pwd.getpwuid(os.getuid()).pw_name
HOSTILE = "[bold]x[/]\x1b[2J\x1b]52;c;AAAA\x07"
NO_CGROUPFS = "/nonexistent"  # the fake /proc's cgroups are on no hierarchy here: their shape alone counts


def _proc_root(tmp_path):
    fake_proc(tmp_path, 4242, uid=os.getuid(), cgroup="0::/system.slice/slurmstepd.scope/job_81234/step_0/user/task_0\n")
    fake_proc(tmp_path, 5151, uid=os.getuid(),
              cgroup=f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
              env={"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "trainer-0", "POD_NAMESPACE": "ml"})
    return str(tmp_path)  # 6161 is not there: another PID namespace's


def _live_app(fake_nvml, lookup, gpus=1, procs=((4242, 20), (5151, 8), (6161, 4))):
    from traintop.watch import sessions
    from traintop.app.factory import build_app
    from traintop.collectors.nvml import NvmlCollector
    from traintop.watch.feeds import SourceFeed
    from traintop.sources.live import LiveSampler

    nv, _ = fake_nvml(n=gpus)
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=pid + 10000 * h, usedGpuMemory=gib * GiB) for pid, gib in procs]
    asked = []

    def counted(pid, **kw):
        asked.append(pid)
        return lookup(pid, **kw)
    gpu = NvmlCollector(nv)
    sampler = LiveSampler(gpu=gpu, owners=OwnerCache(lookup=counted, nested=False))
    monitor = sessions._monitor(gpu.session_info(0.5), 0.5, None)
    feed = SourceFeed(monitor, sampler, 0.5)
    feed.prefill(5)
    return build_app(monitor, feed, mode="live", start_feed=False), monitor, asked


def _screen(app) -> str:
    return "\n".join("".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips())


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
def test_the_dashboard_says_whose_each_gpu_process_is(fake_nvml, tmp_path, size):
    root = _proc_root(tmp_path)
    app, monitor, asked = _live_app(fake_nvml, lambda pid, **kw: whose(pid, proc=root, cgroupfs=NO_CGROUPFS, **kw))
    assert sorted(asked) == [4242, 5151, 6161]  # five samples, each PID read once

    async def go():
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            return _screen(app)
    screen = asyncio.run(go())
    # the busiest (most memory: no per-process shares here) on the GPU's panel, with the others counted
    assert f"PID 4242 {ME} · slurm 81234.0" in screen, screen
    assert "+2" in screen
    if size == (160, 48):  # the process panel lists them all, with no job attached
        assert "20.0\u00a0GiB" in screen
        assert f"GPU\u00a00 · PID 5151 {ME} · pod ml/trainer-0 · containerd" in screen, screen
        assert "GPU\u00a00 · PID 6161 not visible from here" in screen, screen


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
def test_hostile_owner_strings_are_shown_as_text(fake_nvml, size):
    evil = Owner(4242, uid=1000, user=HOSTILE, slurm_job=HOSTILE, slurm_step="0", pod=HOSTILE, namespace=HOSTILE,
                 run_id=HOSTILE, runtime=HOSTILE, container=HOSTILE)
    app, _, _ = _live_app(fake_nvml, lambda pid, **kw: dataclasses.replace(evil, pid=pid), procs=((4242, 20),))

    async def go():
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            return _screen(app)
    screen = asyncio.run(go())
    assert "PID 4242 [bold]x[/]\\x1b[2J\\x1b]52;c;AAAA\\x07 · slurm [bold]" in screen, screen
    assert "\x1b" not in screen and "\x07" not in screen


def test_owners_on_the_gpu_table_when_panels_do_not_fit(fake_nvml, tmp_path):
    from traintop.widgets.gpu_table import GpuTable

    root = _proc_root(tmp_path)
    fake_proc(tmp_path, 14242, uid=os.getuid(), env={"TORCHELASTIC_RUN_ID": "run-7"})
    app, _, _ = _live_app(fake_nvml, lambda pid, **kw: whose(pid, proc=root, cgroupfs=NO_CGROUPFS, **kw), gpus=8, procs=((4242, 20),))

    async def go():
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            assert app.query_one(GpuTable).display
            return str(app.query_one(GpuTable).render())
    table = asyncio.run(go())
    assert f"PID 4242 {ME} · slurm 81234.0" in table and f"PID 14242 {ME} · torchrun run-7" in table, table
    assert "PID 24242 not visible from here" in table


def test_an_attached_jobs_owner_in_the_process_panel():
    from traintop.samples import GpuProcess, GpuSample, ProcessSample
    from traintop.reports.view import GpuProcView
    from traintop.widgets.owner_text import owner_text, proc_text

    o = Owner(7, uid=1000, user="alice", slurm_job="81234", slurm_step="0", runtime="docker", container=CID)
    assert owner_text(o) == f"alice · slurm 81234.0 · docker {CID[:12]}"
    p = GpuProcView(0, 7, 20 * GiB, 64.0, o)
    assert proc_text(p) == "PID 7 alice · slurm 81234.0 · docker 3f3f3f3f3f3f · 20.0\u00a0GiB · busy\u00a064\u00a0%"
    assert owner_text(Owner(9, visible=False)) == "not visible from here"
    # the view carries the attached tree's owners, one per job
    from traintop.watch.monitor import Monitor
    from traintop.samples import Frame, SessionInfo
    from traintop.reports.view import build_view

    m = Monitor(SessionInfo(kind="live"))
    m.ingest(Frame(t=1.0, gpus=(GpuSample(0, processes=(GpuProcess(7, GiB, owner=o),
                                                          GpuProcess(8, GiB, owner=dataclasses.replace(o, pid=8)))),),
                   process=ProcessSample(7, True, "python")))
    v = build_view(m)
    assert v.process.owners == (o,) and [p.pid for p in v.gpus[0].procs] == [7, 8]


def test_an_owner_lookup_that_fails_costs_only_the_owners(fake_nvml):
    from traintop.collectors.nvml import NvmlCollector
    from traintop.sources.live import LiveSampler

    def broken(pid, **kw):
        raise PermissionError("no /proc here")
    nv, _ = fake_nvml()
    sampler = LiveSampler(gpu=NvmlCollector(nv), owners=OwnerCache(lookup=broken, nested=False))
    frame = sampler.next_frame()
    assert frame.gpus[0].processes[0].pid == 42 and frame.gpus[0].processes[0].owner is None
    assert frame.gpus[0].util == 97 and "no /proc here" in sampler.failing["owners"]
    sampler.close()
