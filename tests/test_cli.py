"""The command line: one-line errors, exit codes, headless record, the no-GPU demo fallback."""

import os
import subprocess
import sys

import pytest

from traintop import cli
from traintop.recording import RecordingReader


def traintop(*args, **kw):
    return subprocess.run([sys.executable, "-m", "traintop", *args], capture_output=True, text=True,
                          timeout=120, **kw)


def test_version_and_help():
    r = traintop("--version")
    assert r.returncode == 0 and r.stdout.startswith("traintop ")
    r = traintop("--help")
    assert r.returncode == 0 and "replay" in r.stdout and "--pid" in r.stdout


@pytest.mark.parametrize("args,needle", [
    (["--interval", "0"], "positive number of seconds"),
    (["--interval", "abc"], "expected seconds"),
    (["--interval", "1000"], "between"),
    (["--pid", "-3"], "positive"),
    (["--pid", "4194303999"], "no process with PID"),
    (["replay", "/nonexistent.ttrec"], "no such file"),
    (["replay", "/etc/hostname"], "not a traintop recording"),
    (["frobnicate"], "invalid choice"),
    (["simulate", "--scenario", "nope"], "unknown scenario"),
    (["record", "x.ttrec", "--fast"], "--fast needs"),
])
def test_bad_input_is_one_line_and_nonzero(args, needle, tmp_path):
    r = traintop(*args, cwd=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("traintop: ")
    assert "Traceback" not in r.stderr


def test_headless_record_of_the_simulator(tmp_path):
    out = tmp_path / "s.ttrec"
    r = traintop("record", str(out), "--simulate", "starved", "--duration", "90", "--fast")
    assert r.returncode == 0, r.stderr
    rd = RecordingReader(str(out))
    assert rd.frame_count == 180
    assert any(a.rule == "starvation" for a in rd.alerts())
    r = traintop("record", str(out), "--simulate", "healthy", "--duration", "1", "--fast")
    assert r.returncode == 2 and "already exists" in r.stderr


def test_options_work_before_or_after_the_command(tmp_path):
    for args in (["--interval", "0.25", "record", "a.ttrec"], ["record", "b.ttrec", "--interval", "0.25"]):
        r = traintop(*args, "--simulate", "idle", "--duration", "2", "--fast", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    assert RecordingReader(str(tmp_path / "a.ttrec")).info.interval == 0.25
    assert RecordingReader(str(tmp_path / "b.ttrec")).info.interval == 0.25


def test_live_records_host_and_process_without_a_gpu(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        out = tmp_path / "l.ttrec"
        r = traintop("record", str(out), "--pid", str(sleeper.pid), "--duration", "1.5", "--interval", "0.25")
        assert r.returncode == 0, r.stderr
        frames = list(RecordingReader(str(out)).frames())
        assert len(frames) >= 4
        assert frames[-1].process.pid == sleeper.pid and frames[-1].process.alive
        assert frames[-1].host.per_core
    finally:
        sleeper.kill()


def test_no_gpu_says_so_in_one_line_and_plays_the_demo(monkeypatch, capsys):
    from traintop.errors import NoGpuError
    from traintop import sessions

    def no_gpu(*a, **k):
        raise NoGpuError("NVML could not start (NVML Shared Library Not Found)")

    ran = {}
    monkeypatch.setattr(sessions, "live_session", no_gpu)
    monkeypatch.setattr(cli, "_run_app", lambda args, monitor, feed, mode, banner=None: ran.update(mode=mode, feed=feed) or 0)
    assert cli.main([]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "playing the embedded demo" in err[0]
    assert ran["mode"] == "demo" and ran["feed"].loop


def test_real_nvml_absent_here_is_a_clear_error():
    # On a machine without the NVIDIA driver the real collector fails with one clear line.
    from traintop.collectors.nvml import NvmlCollector
    from traintop.errors import NoGpuError

    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("a GPU driver is present")
    with pytest.raises(NoGpuError) as e:
        NvmlCollector()
    assert "\n" not in str(e.value)
