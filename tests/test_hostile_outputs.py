"""What traintop writes, as an attacker sees it (docs/SECURITY.md, "The job's log"): `run --log` at
a FIFO, a device, a planted symlink or an existing log. Each test reproduces a break of the landed code."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

from tests.test_hostile_captures import ATTACKER, VICTIM, _as_user, needs_root

PY = sys.executable


def _env(tmp_path) -> dict:
    e = dict(os.environ, TRAINTOP_PROBE_DIR=str(tmp_path / "probes"), TMPDIR=str(tmp_path),
             XDG_CONFIG_HOME=str(tmp_path / "config"))
    e.pop("XDG_RUNTIME_DIR", None)
    return e


def _run(tmp_path, *args, timeout=60):
    return subprocess.run([PY, "-m", "traintop", "run", "--no-ui", *args], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout, env=_env(tmp_path))


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


# -- run --log ---------------------------------------------------------------------------------

def test_a_fifo_as_the_log_is_refused_before_the_job_starts(tmp_path):
    """A FIFO with no reader hung `traintop run` silently, forever."""
    fifo = tmp_path / "log"
    os.mkfifo(fifo)
    marker = tmp_path / "started"
    r = _run(tmp_path, "--log", str(fifo), "--", "touch", str(marker), timeout=20)  # a hang guard
    assert r.returncode == 2 and "FIFO" in _one_line(r.stderr) and not marker.exists()


def test_a_device_as_the_log_is_refused(tmp_path):
    marker = tmp_path / "started"
    r = _run(tmp_path, "--log", "/dev/full", "--", "touch", str(marker))
    assert r.returncode == 2 and "device" in _one_line(r.stderr) and not marker.exists()


def test_an_existing_log_is_appended_to_never_cut(tmp_path):
    """The user's own 141 MB log lost 127 MiB at the start of a run (the cut for a log over 64 MiB)."""
    log = tmp_path / "train.log"
    with open(log, "wb") as f:
        f.write(b"MINE-START\n")
        f.truncate(100 << 20)  # 100 MiB (sparse: cheap) the user already had
        f.seek(0, os.SEEK_END)
        f.write(b"MINE-END\n")
    before = os.path.getsize(log)
    r = _run(tmp_path, "--log", str(log), "--", "echo", "appended")
    assert r.returncode == 0, r.stderr
    assert "appended to, never cut" in r.stderr
    time.sleep(1.5)  # where a cut would come (the log's watcher looks every 0.5 s)
    assert os.path.getsize(log) == before + len("appended\n")
    with open(log, "rb") as f:
        assert f.read(11) == b"MINE-START\n"
        f.seek(before - 9)
        assert f.read() == b"MINE-END\nappended\n"


def test_a_log_of_another_user_or_with_another_name_is_refused(tmp_path):
    theirs = tmp_path / "theirs.log"
    theirs.write_text("theirs\n")
    os.chown(theirs, ATTACKER, ATTACKER) if os.geteuid() == 0 else None
    mine = tmp_path / "mine.log"
    mine.write_text("mine\n")
    os.link(mine, tmp_path / "other-name.log")
    marker = tmp_path / "started"
    if os.geteuid() == 0:
        r = _run(tmp_path, "--log", str(theirs), "--", "touch", str(marker))
        assert r.returncode == 2 and "belongs to another user" in _one_line(r.stderr)
    r = _run(tmp_path, "--log", str(tmp_path / "other-name.log"), "--", "touch", str(marker))
    assert r.returncode == 2 and "hard links" in _one_line(r.stderr)
    assert not marker.exists() and theirs.read_text() == "theirs\n" and mine.read_text() == "mine\n"


def _victim_runs_with_log(shared: str, link: str, target: str) -> dict:
    from traintop import cli

    err = os.path.join(shared, "victim-stderr")
    fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stderr = open(2, "w", closefd=False, buffering=1)  # pytest's capture object is not fd 2
    os.environ.update(TRAINTOP_PROBE_DIR=os.path.join(shared, "victim", "probes"),
                      TMPDIR=os.path.join(shared, "victim"), XDG_CONFIG_HOME=os.path.join(shared, "victim", "cfg"))
    os.environ.pop("XDG_RUNTIME_DIR", None)
    size = os.path.getsize(target)
    marker = os.path.join(shared, "victim", "started")
    code = cli.main(["run", "--no-ui", "--interval", "0.2", "--log", link, "--", "/bin/sh", "-c", f"echo hi; touch {marker}"])
    for _ in range(30):  # where the log's watcher would cut (it looks every 0.5 s)
        if os.path.getsize(target) != size:
            break
        time.sleep(0.1)
    sys.stderr.flush()
    with open(err) as f:
        stderr = f.read()
    return {"code": code, "stderr": stderr, "size_before": size, "size_after": os.path.getsize(target),
            "started": os.path.exists(marker)}


@needs_root
def test_a_log_symlink_planted_by_another_user_is_refused():
    """Another user plants `log` -> the victim's 113 MB file in a shared directory; `traintop run
    --log` followed it and the cut truncated the target to 4 MB."""
    shared = tempfile.mkdtemp(prefix="tt-shared-")
    try:
        os.chmod(shared, 0o1777)
        victim = os.path.join(shared, "victim")
        os.mkdir(victim, 0o700)
        os.chown(victim, VICTIM, VICTIM)
        target = os.path.join(victim, "precious.dat")
        with open(target, "wb") as f:
            f.write(b"HEAD")
            f.truncate(100 << 20)  # over the cut's 64 MiB
        os.chown(target, VICTIM, VICTIM)
        link = os.path.join(shared, "log")
        os.symlink(target, link)
        os.lchown(link, ATTACKER, ATTACKER)
        got = _as_user(VICTIM, _victim_runs_with_log, shared, link, target, timeout=120)
        assert "error" not in got, got
        v = got["value"]
        assert v["code"] == 2 and "symbolic link" in _one_line(v["stderr"]), v
        assert v["size_after"] == v["size_before"] == 100 << 20 and not v["started"]
    finally:
        shutil.rmtree(shared, ignore_errors=True)
