"""Faults survived: a hanging NVML call, NVML errors mid-run, a vanished process."""

import asyncio
import os
import subprocess
import sys
import threading
import time

import pytest

from traintop.collectors.nvml import NvmlCollector
from traintop.collectors.process import ProcessCollector
from traintop.sources.live import LiveSampler
from traintop.watch.monitor import Monitor
from traintop.reports.view import build_view


def test_a_hanging_nvml_call_marks_the_gpu_stale_and_sampling_goes_on(fake_nvml):
    nv, _ = fake_nvml(n=2)
    release = threading.Event()
    real = nv.nvmlDeviceGetUtilizationRates
    nv.nvmlDeviceGetUtilizationRates = lambda h: (release.wait(), real(h))[1]
    col = NvmlCollector(nv)
    sampler = LiveSampler(gpu=col, gpu_timeout=0.2)
    t = time.monotonic()
    frames = [sampler.next_frame() for _ in range(3)]
    assert time.monotonic() - t < 1.5  # each tick gave up after its time limit
    assert all(f.stale_gpus == (0, 1) for f in frames)
    assert frames[0].gpus[0].util is None and frames[0].gpus[0].index == 0
    assert sampler.timeouts == 3
    mon = Monitor(col.session_info(0.5))
    mon.ingest(frames[-1])
    view = build_view(mon)
    assert "STALE" in view.gpus[0].badges and "did not answer" in view.source_error
    release.set()
    for _ in range(20):  # the hung call returns; fresh readings follow
        f = sampler.next_frame()
        if not f.stale_gpus and f.gpus[0].util is not None:
            break
    assert f.gpus[0].util == 97
    sampler.close()


def test_a_gpu_call_that_never_returns_does_not_hold_the_program_at_its_exit():
    """The GPU read's thread is a daemon: a driver call hung for good cannot stop a quit."""
    code = ("import threading, time; from traintop.sources.live import LiveSampler\n"
            "class Hung:\n"
            "    infos = ()\n"
            "    def sample(self): threading.Event().wait()\n"
            "    def close(self): pass\n"
            "s = LiveSampler(gpu=Hung(), gpu_timeout=0.1)\n"
            "f = s.next_frame(); s.close(); print('left', s.timeouts)\n")
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0 and r.stdout.strip() == "left 1", r.stderr
    assert time.monotonic() - t < 15


def test_a_gpu_call_that_raises_is_counted_and_the_next_tick_calls_again():
    calls = []

    class Flaky:
        infos = ()

        def sample(self):
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("driver hiccup")
            return ()

        def close(self):
            pass

    s = LiveSampler(gpu=Flaky(), gpu_timeout=5)
    s.next_frame()
    assert s.failures == {"GPU": 1} and "driver hiccup" in s.failing["GPU"]
    s.next_frame()
    assert len(calls) == 2 and "GPU" not in s.failing
    s.close()


def test_any_nvml_error_mid_run_leaves_fields_none(fake_nvml, nvml_error):
    nv, _ = fake_nvml(n=1)
    col = NvmlCollector(nv)
    assert col.sample()[0].power_w == 612.5
    for code in (15, 999, 10, 2):  # GPU lost, unknown, timeout, invalid argument
        def boom(*a, code=code):
            raise nvml_error(code)
        nv.nvmlDeviceGetPowerUsage = boom
        nv.nvmlDeviceGetTemperature = boom
        (g,) = col.sample()
        assert g.power_w is None and g.temp_c is None and g.util == 97
    assert col.errors["power"] == 4


def test_attached_process_replaced_by_a_new_pid():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    col = ProcessCollector(p.pid)
    assert col.sample().alive
    p.kill()
    p.wait()
    s = col.sample()
    assert not s.alive and col.ended_at is not None
    assert not col.sample().alive  # stays ended even if the PID number is reused later


def test_a_terminal_resized_to_40x12_and_back(sim_app):

    async def go():
        app, _, feed = sim_app("starved,healthy", gpus=2)
        async with app.run_test(size=(160, 48)) as pilot:
            for size in [(40, 12), (20, 8), (80, 24), (160, 48)]:
                await pilot.resize_terminal(*size)
                feed.step()
                await pilot.pause()
            assert app.is_running
    asyncio.run(go())


def test_recorder_hitting_a_full_disk_keeps_what_it_wrote(tmp_path):
    """A real recorder process whose file cannot grow (RLIMIT_FSIZE: the kernel refuses writes like a full disk)."""
    from traintop.record.recording import RecordingReader

    out = tmp_path / "full.ttrec"
    code = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))\n"
        "from traintop.cli import main\n"
        "sys.exit(main(['record', sys.argv[1], '--simulate', 'healthy', '--duration', '36000', '--fast',"
        " '--quiet']))\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "samples up to the error are kept" in lines[0] and "Traceback" not in r.stderr
    frames = list(RecordingReader(str(out)).frames())
    assert len(frames) > 100  # everything committed before the disk filled is readable


def test_nothing_listens_on_a_network_port(tmp_path):
    import psutil

    p = subprocess.Popen([sys.executable, "-m", "traintop", "record", str(tmp_path / "n.ttrec"), "--duration", "4",
                          "--interval", "0.2", "--pid", str(os.getpid()), "--quiet"])
    try:
        time.sleep(2.0)
        conns = psutil.Process(p.pid).net_connections(kind="inet")
        assert [c for c in conns if c.status == psutil.CONN_LISTEN] == []
    finally:
        p.wait(timeout=30)


def test_recorder_on_a_filesystem_that_fills_up(tmp_path):
    """A real ENOSPC: a 384 KiB tmpfs in a private mount namespace (skipped where mounting is not allowed)."""
    import shutil

    if shutil.which("unshare") is None:
        pytest.skip("unshare is not available")
    mnt = tmp_path / "small"
    mnt.mkdir()
    script = (
        f"mount -t tmpfs -o size=384k tmpfs {mnt} || exit 77\n"
        f"{sys.executable} -m traintop record {mnt}/r.ttrec --simulate healthy --duration 36000 --fast --quiet\n"
        "echo rc=$?\n"
        f"df -k {mnt} | tail -1\n"
        f"{sys.executable} -c \"import sys; from traintop.record.recording import RecordingReader; "
        f"r = RecordingReader('{mnt}/r.ttrec'); print('frames', len(list(r.frames())), r.skipped_chunks)\"\n"
    )
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=300)
    if r.returncode == 77 or "Operation not permitted" in r.stderr or "unshare failed" in r.stderr:
        pytest.skip("mounting a tmpfs is not permitted here")
    assert "rc=2" in r.stdout, r.stdout + r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("traintop")]
    assert len(errors) == 1 and ("disk is full" in errors[0] or "No space" in errors[0]), r.stderr
    assert "Traceback" not in r.stderr
    frames = int(r.stdout.split("frames ")[1].split()[0])
    assert frames > 100  # what was committed before the disk filled replays


def test_sigkill_of_the_record_command_keeps_all_but_the_last_second(tmp_path):
    from traintop.record.recording import RecordingReader

    out = tmp_path / "killed.ttrec"
    proc = subprocess.Popen([sys.executable, "-m", "traintop", "record", str(out), "--simulate", "healthy",
                             "--interval", "0.05", "--quiet"], stderr=subprocess.PIPE)
    time.sleep(4.0)
    killed_at = time.time()
    proc.kill()
    proc.wait()
    frames = list(RecordingReader(str(out)).frames())
    assert len(frames) >= 30, "the command's committed samples did not survive"
    assert killed_at - frames[-1].t <= 2.0  # samples are committed every second


def test_a_failing_collector_is_counted_and_its_reason_shown():
    from traintop.watch.feeds import SourceFeed
    from traintop.samples import HostSample, SessionInfo

    class Host:
        broken = True

        def sample(self):
            if self.broken:
                raise RuntimeError("psutil: /proc/stat\nunreadable")
            return HostSample(cpu_percent=12.0)

    host = Host()
    sampler = LiveSampler(host=host)
    mon = Monitor(SessionInfo(kind="live"))
    feed = SourceFeed(mon, sampler, 0.5)
    for _ in range(3):
        feed._tick()  # the frame still comes: the host's fields are missing, nothing else
    assert mon.store.frames_seen == 3 and mon.store.latest.host is None
    assert sampler.failures == {"host": 3}
    view = build_view(mon)
    assert view.collector_errors["host"] == "collector host failing: RuntimeError: psutil: /proc/stat\\x0aunreadable"
    assert "collector host failing" in view.source_error
    host.broken = False
    feed._tick()
    view = build_view(mon)
    assert not view.collector_errors and view.source_error is None and sampler.failures == {"host": 3}
