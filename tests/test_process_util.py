"""Per-process GPU utilization: the newer NVML call first, the older as fallback, each window once."""

import types

import pytest
from fakes import NVMLError

from traintop.record.codec import decode, encode
from traintop.collectors.nvml import NvmlCollector
from traintop.collectors.process_util import LEGACY_CALL, NEW_CALL, ProcessUtil, ProcessUtilReader
from traintop.samples import Frame, GpuProcess, GpuSample


def _s(ts, pid, sm, mem=0, enc=0, dec=0):
    return types.SimpleNamespace(timeStamp=ts, pid=pid, smUtil=sm, memUtil=mem, encUtil=enc, decUtil=dec)


class Buffer:
    """An NVML per-process sample buffer: returns what is newer than asked, as the driver does,
    or answers with an error code."""

    def __init__(self, samples=(), error=None):
        self.samples, self.error, self.asked = list(samples), error, []

    def __call__(self, handle, last_seen):
        self.asked.append(last_seen)
        if self.error is not None:
            raise NVMLError(self.error)
        return [s for s in self.samples if s.timeStamp > last_seen]


def _nv(**calls):
    return types.SimpleNamespace(NVMLError=NVMLError, **calls)


def test_the_newer_call_answers_one_window_at_a_time():
    new = Buffer([_s(10, 7, 30)])
    r = ProcessUtilReader(_nv(**{NEW_CALL: new}), [0])
    assert r.poll(0) is None  # priming: what the buffer held before is not this window
    new.samples += [_s(20, 7, 40, 10), _s(30, 7, 60, 30), _s(30, 8, 5), _s(25, 9, 101), _s(5, 8, 99)]
    assert r.poll(0) == {7: ProcessUtil(50.0, 20.0, 0.0, 0.0), 8: ProcessUtil(5.0, 0.0, 0.0, 0.0),
                         9: ProcessUtil(None, 0.0, 0.0, 0.0)}  # above 100 %: dropped; older than asked: dropped
    new.error = 6  # NOT_FOUND: nothing ran since
    assert r.poll(0) == {}
    assert new.asked == [0, 10, 30] and r.calls == [NEW_CALL]  # each poll asks from the newest seen


@pytest.mark.parametrize("new", [None, Buffer(error=3), Buffer(error=13)])
def test_where_the_newer_call_is_missing_or_unsupported_the_older_one_answers(new):
    legacy = Buffer([_s(10, 7, 30), _s(20, 7, 50)])
    calls = {LEGACY_CALL: legacy} if new is None else {NEW_CALL: new, LEGACY_CALL: legacy}
    r = ProcessUtilReader(_nv(**calls), [0])
    r.poll(0)
    legacy.samples.append(_s(30, 7, 70))
    assert r.poll(0) == {7: ProcessUtil(70.0, 0.0, 0.0, 0.0)} and r.calls == [LEGACY_CALL]
    if new is not None:
        assert len(new.asked) == 1  # unsupported once: never asked again


def test_neither_call_answering_reads_none_and_other_errors_are_counted():
    r = ProcessUtilReader(_nv(**{NEW_CALL: Buffer(error=3), LEGACY_CALL: Buffer(error=3)}), [0])
    assert r.poll(0) is None and not r.supported(0) and r.calls == [None]
    flaky = Buffer(error=999)
    r = ProcessUtilReader(_nv(**{NEW_CALL: flaky}), [0])
    assert r.poll(0) is None and r.errors == 1 and r.supported(0)


def test_the_collector_gives_each_gpu_process_its_share(fake_nvml):
    nv, _ = fake_nvml()
    buf = Buffer([_s(10, 42, 10)])
    setattr(nv, NEW_CALL, buf)
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: [types.SimpleNamespace(pid=42, usedGpuMemory=2**30),
                                                         types.SimpleNamespace(pid=43, usedGpuMemory=2**20)]
    c = NvmlCollector(nv)
    c.sample()
    c.poll_util_window()  # primes
    (g,) = c.sample()
    assert [p.sm_util for p in g.processes] == [None, None]
    buf.samples += [_s(20, 42, 64, 30)]
    c.poll_util_window()
    (g,) = c.sample()
    assert [(p.pid, p.sm_util, p.mem_util) for p in g.processes] == [(42, 64.0, 30.0), (43, 0.0, 0.0)]
    assert c.process_util.calls == [NEW_CALL]


def test_a_process_share_is_recorded_and_read_back_and_old_entries_still_read():
    with_util = GpuSample(0, util=90.0, processes=(GpuProcess(42, 2**30, 64.0, 30.0, 0.0, None),
                                                   GpuProcess(43, 2**20)))
    frames = [Frame(t=1000.0 + k, gpus=(with_util,)) for k in range(3)]
    got = decode(encode(frames))
    assert got[0].gpus[0].processes == (GpuProcess(42, 2**30, 64.0, 30.0, 0.0, None), GpuProcess(43, 2**20))


@pytest.mark.parametrize("calls, status, says", [
    ({NEW_CALL: Buffer([_s(10, 42, 10)])}, "pass", NEW_CALL),
    ({NEW_CALL: Buffer(error=3), LEGACY_CALL: Buffer([_s(10, 42, 10)])}, "pass", LEGACY_CALL),
    ({}, "info", "neither"),
])
def test_doctor_says_which_call_answers(fake_nvml, calls, status, says):
    from traintop.reports import doctor

    nv, _ = fake_nvml()
    nv.__dict__.update(calls)
    checks, _ = doctor.nvml_checks(nv)
    (check,) = [c for c in checks if c.name == "Per-process utilization"]
    assert check.status == status and says in check.detail


def test_the_process_panel_says_what_share_of_its_gpu_the_job_computes(tmp_path):
    """Recorded with each process's share (schema 3), replayed: the job's line of GPU memory says
    how busy its processes kept the GPU; another process's share is not the job's."""
    import asyncio

    from traintop.watch import sessions
    from traintop.app.factory import build_app
    from traintop.record.recording import RecordingWriter
    from traintop.samples import GpuInfo, ProcessSample, SessionInfo
    from traintop.widgets.process_panel import ProcessPanel

    info = SessionInfo(kind="live", gpus=(GpuInfo(0, "NVIDIA H200", mem_total=140 * 2**30),), interval=1.0)
    path = str(tmp_path / "s.ttrec")
    w = RecordingWriter(path, info)
    for k in range(5):
        g = GpuSample(0, util=99.0, mem_used=30 * 2**30, mem_total=140 * 2**30,
                      processes=(GpuProcess(100, 20 * 2**30, 64.0, 30.0, 0.0, 0.0), GpuProcess(999, 2**30, 30.0)))
        w.add(Frame(t=1_790_000_000.0 + k, gpus=(g,), process=ProcessSample(100, True, "python", "python train.py",
                                                                             cpu_percent=90.0, rss=2**30)))
    w.close()
    session = sessions.replay_session(path)
    session.feed.playing = False
    session.feed.seek(session.feed.t_start + 4)

    async def go():
        app = build_app(session.monitor, session.feed, mode="replay", start_feed=False)
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            text = str(app.query_one(ProcessPanel).render())
            assert "GPU\u00a00\u00a020.0\u00a0GiB\u00a0(busy\u00a064\u00a0%)" in text, text
    asyncio.run(go())


def test_a_sole_process_share_is_its_gpus_utilization_and_its_buffer_is_not_read(fake_nvml, monkeypatch):
    """On an H200 a sole process's per-process samples are the GPU's own, sample for sample: its share
    comes from the GPU's utilization (one buffer read a window saved, ~1.9 ms of CPU there)."""
    from traintop.collectors import nvml

    nv, calls = fake_nvml()  # one process, PID 42; the utilization buffer holds 40 % and 100 %; ticks read 97 %
    buf = Buffer([_s(10, 42, 10)])
    setattr(nv, NEW_CALL, buf)
    c = NvmlCollector(nv)
    c.sample()
    c.poll_util_window()  # the utilization buffer's first read primes it: the ticks' utilization stands
    (g,) = c.sample()
    assert [(p.pid, p.sm_util, p.mem_util, p.enc_util) for p in g.processes] == [(42, 97.0, 40.0, None)]
    c.poll_util_window()  # the buffer read: its samples' mean
    (g,) = c.sample()
    assert [(p.pid, p.sm_util) for p in g.processes] == [(42, 70.0)]
    monkeypatch.setattr(nvml, "STEADY_S", 0.0)  # steadily busy: no buffer read, the ticks' mean
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=96, memory=30)
    c.sample()
    c.poll_util_window()
    (g,) = c.sample()
    # the window's two ticks: the one read above (97 %, memory 40 %) and this one
    assert [(p.pid, p.sm_util, p.mem_util) for p in g.processes] == [(42, 96.5, 35.0)]
    assert buf.asked == [] and calls["util_samples"] == 2


def test_when_a_second_process_comes_the_per_process_buffer_is_read(fake_nvml):
    nv, _ = fake_nvml()
    buf = Buffer([_s(10, 42, 10)])
    setattr(nv, NEW_CALL, buf)
    c = NvmlCollector(nv)
    c.sample()
    c.poll_util_window()
    assert buf.asked == []
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: [types.SimpleNamespace(pid=42, usedGpuMemory=2**30),
                                                         types.SimpleNamespace(pid=43, usedGpuMemory=2**20)]
    c.sample()
    c.poll_util_window()  # primes the per-process buffer: the shares of a sole process do not carry over
    (g,) = c.sample()
    assert [p.sm_util for p in g.processes] == [None, None]
    buf.samples += [_s(20, 43, 55, 5)]
    c.poll_util_window()
    (g,) = c.sample()
    assert [(p.pid, p.sm_util) for p in g.processes] == [(42, 0.0), (43, 55.0)]
