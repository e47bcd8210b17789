"""`traintop run` with real child processes: output, exit status, signals, the job's end, the
probe directory, the injected sitecustomize and the job's log. Every wait has a time limit."""

import fcntl
import os
import pathlib
import pty
import select
import shlex
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest

from traintop.watch import launch
from traintop.record.recording import RecordingReader

PY = sys.executable


@pytest.fixture
def env(tmp_path):
    """traintop's private directory inside the test's own."""
    e = dict(os.environ, TRAINTOP_PROBE_DIR=str(tmp_path / "probes"), TMPDIR=str(tmp_path))
    e.pop("XDG_RUNTIME_DIR", None)
    return e


def run(*args, env, timeout=60, **kw):
    return subprocess.run([PY, "-m", "traintop", "run", *args], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout, env=env, **kw)


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def wait_for(predicate, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def closed_cleanly(rec: pathlib.Path) -> None:
    assert rec.exists()
    assert not (rec.parent / (rec.name + "-wal")).exists() and not (rec.parent / (rec.name + "-shm")).exists()
    frames = list(RecordingReader(str(rec)).frames())
    assert frames and frames[0].process is not None


# -- without a terminal and with --no-ui -------------------------------------------------------

def test_without_a_terminal_the_jobs_output_passes_through(env, tmp_path):
    log = tmp_path / "job.log"
    code = "import sys; print('hi'); print('oops', file=sys.stderr); sys.exit(3)"
    r = run("--log", str(log), "--", PY, "-c", code, env=env)  # stdin /dev/null, stdout a pipe: no terminal
    assert r.returncode == 3
    assert r.stdout == "hi\n"
    assert "oops" in r.stderr and "\x1b" not in r.stderr + r.stdout and "Traceback" not in r.stderr
    assert "hi" in log.read_text() and "oops" in log.read_text()
    assert "job exited with 3" in r.stderr.splitlines()[-1]


def test_the_job_reads_a_piped_stdin(env):
    r = subprocess.run([PY, "-m", "traintop", "run", "--no-ui", "--", PY, "-c", "print(input()[::-1])"],
                       input="olleh\n", capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0 and r.stdout == "hello\n"


def test_the_started_line_quotes_the_command_as_a_shell_would(env):
    r = run("--no-ui", "--", PY, "-c", "print(1)", env=env)
    assert r.returncode == 0 and r.stdout == "1\n"
    started = next(line for line in r.stderr.splitlines() if "started PID" in line)
    assert f"{shlex.quote(PY)} -c 'print(1)';" in started


@pytest.mark.parametrize("cmd,status", [
    (["true"], 0),
    (["bash", "-c", "exit 7"], 7),
    (["bash", "-c", "kill -9 $$"], 137),  # as shells say it, not 247
    (["bash", "-c", "kill -TERM $$"], 143),
])
def test_no_ui_exits_with_the_jobs_status_even_when_it_ends_before_the_first_sample(cmd, status, env, tmp_path):
    rec = tmp_path / "r.ttrec"
    r = run("--no-ui", "--record", str(rec), "--interval", "0.2", "--", *cmd, env=env)
    assert r.returncode == status, r.stderr
    assert "no process with PID" not in r.stderr and "Traceback" not in r.stderr
    closed_cleanly(rec)


def test_a_command_that_does_not_exist_is_one_line(env):
    r = run("--no-ui", "--", "no-such-command-xyz", env=env)
    assert r.returncode == 2 and r.stderr.strip() == "traintop: command not found: no-such-command-xyz"


# -- signals to traintop reach the whole job ------------------------------------------------------

JOB = "echo $$; sleep 300 & sleep 300"  # a shell with two children; background ones ignore SIGINT


def _default_signals():
    # as from a terminal: a test run started under nohup would hand its ignored SIGHUP down
    for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_DFL)


def start_job(env, tmp_path, script=JOB, grace="2", preexec=_default_signals):
    rec = tmp_path / "sig.ttrec"
    p = subprocess.Popen([PY, "-m", "traintop", "run", "--no-ui", "--grace", grace, "--interval", "0.2",
                          "--record", str(rec), "--", "bash", "-c", script],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                         preexec_fn=preexec)
    ready, _, _ = select.select([p.stdout], [], [], 30)
    assert ready, "the job did not start"
    pgid = int(p.stdout.readline())
    members = lambda: [d for d in os.listdir("/proc") if d.isdigit() and _pgid(int(d)) == pgid]  # noqa: E731
    wait_for(lambda: len(members()) >= 3, what="the job's children")
    time.sleep(0.5)  # traintop has sampled the job
    return p, pgid, rec


def _pgid(pid):
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_traintop_stops_the_whole_job_and_closes_the_recording(sig, env, tmp_path):
    p, pgid, rec = start_job(env, tmp_path)
    try:
        p.send_signal(sig)
        rc = p.wait(timeout=30)
        err = p.stderr.read().decode()
    finally:
        if p.poll() is None:
            p.kill()
        if not group_gone(pgid):
            os.killpg(pgid, signal.SIGKILL)
            pytest.fail("the job's group outlived traintop")
    assert rc == 128 + sig, err
    assert group_gone(pgid)
    assert "Traceback" not in err
    closed_cleanly(rec)


def test_under_nohup_a_hangup_leaves_traintop_and_the_job_running(env, tmp_path):
    """`nohup traintop run -- CMD`: SIGHUP stays ignored by traintop and by the job (it used to be
    caught, forwarded to a job that ignores it, and the job SIGKILLed after the grace period)."""
    def nohup():
        _default_signals()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    p, pgid, rec = start_job(env, tmp_path, grace="1", preexec=nohup)
    try:
        p.send_signal(signal.SIGHUP)
        time.sleep(3)  # past the grace period: nothing may have been killed
        assert p.poll() is None and not group_gone(pgid)
        p.send_signal(signal.SIGTERM)  # still forwarded
        rc = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
        if not group_gone(pgid):
            os.killpg(pgid, signal.SIGKILL)
            pytest.fail("the job's group outlived traintop")
    assert rc == 128 + signal.SIGTERM
    closed_cleanly(rec)


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace_period(env, tmp_path):
    p, pgid, rec = start_job(env, tmp_path, script="trap '' TERM; " + JOB, grace="1")
    try:
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
        if not group_gone(pgid):
            os.killpg(pgid, signal.SIGKILL)
            pytest.fail("the job's group outlived traintop")
    assert rc == 137
    # the SIGKILL was traintop's: said so, not left to look like someone else's
    assert "killed by SIGKILL" in (err := p.stderr.read().decode()) and "traintop's, once the grace period" in err
    closed_cleanly(rec)


def test_a_sigkill_from_elsewhere_is_not_called_traintops():
    from traintop.watch.job import JobEnd

    assert "traintop's" not in JobEnd(1, 0.0, -9).describe()
    assert "traintop's" in JobEnd(1, 0.0, -9, forced=True).describe()
    assert "traintop's" not in JobEnd(1, 0.0, -15, forced=True).describe()  # it ended on the forwarded signal


# -- with the dashboard, in a real terminal ---------------------------------------------------------

def in_terminal(args, env, keys_when, timeout=60):
    """Start traintop in a pseudo-terminal; when ``keys_when[0]`` shows on screen, send ``keys_when[1]``
    (a string, or a signal number for traintop). Returns (exit status, everything it drew)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: traintop in a terminal of 160x48 (the full layout)
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 48, 160, 0, 0))
        os.execve(PY, [PY, "-m", "traintop", *args], dict(env, TERM="xterm-256color"))
    out = b""
    deadline = time.monotonic() + timeout
    sent = False
    status = None
    try:
        while time.monotonic() < deadline:
            r, _, _ = select.select([fd], [], [], 0.2)
            if r:
                try:
                    out += os.read(fd, 65536)
                except OSError:  # the terminal closed: traintop ended
                    break
            if not sent and keys_when[0].encode() in out.replace(b"\x1b", b""):
                time.sleep(0.3)
                if isinstance(keys_when[1], int):
                    os.kill(pid, keys_when[1])
                else:
                    os.write(fd, keys_when[1].encode())
                sent = True
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
                break
        while status is None and time.monotonic() < deadline:  # the terminal closed: traintop is ending
            done, st = os.waitpid(pid, os.WNOHANG)
            status = st if done else None
            time.sleep(0.05)
    finally:
        if status is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    assert status is not None, f"traintop did not end: {out[-2000:]!r}"
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


def test_in_the_dashboard_the_jobs_end_shows_at_once_and_q_exits_with_its_status(env):
    code, screen = in_terminal(["run", "--interval", "0.2", "--", "bash", "-c", "sleep 3; exit 5"], env,
                               ("exited with 5", "q"))
    assert code == 5, screen[-2000:]
    assert "traintop: job exited with 5 at" in screen
    assert "No probe message" in screen  # what a job started so without a probe reads
    assert "traintop run -- python train.py" not in screen  # not the hint to start it so
    assert "Traceback" not in screen


def test_in_the_dashboard_sigterm_stops_the_job_and_restores_the_terminal(env, tmp_path):
    marker = tmp_path / "pgid"
    code, screen = in_terminal(["run", "--interval", "0.2", "--grace", "2", "--", "bash", "-c",
                                f"echo $$ > {marker}; sleep 300 & sleep 300"], env,
                               ("No probe message yet", signal.SIGTERM))
    pgid = int(marker.read_text())
    try:
        assert code == 143, screen[-2000:]
        assert group_gone(pgid)
        assert "traintop: job killed by SIGTERM" in screen
        assert "\x1b[?1049l" in screen  # the alternate screen was left
    finally:
        if not group_gone(pgid):
            os.killpg(pgid, signal.SIGKILL)


def _job_in_terminal(tmp_path, env, marker, cols=100, rows=30):
    from terminal import Terminal

    e = {k: v for k, v in env.items() if k in ("TRAINTOP_PROBE_DIR", "TMPDIR")}
    return Terminal(["run", "--interval", "0.2", "--grace", "2", "--", "bash", "-c",
                     f"echo $$ > {marker}; sleep 300 & sleep 300"], cols, rows, home=str(tmp_path), env=e)


@pytest.mark.parametrize("answer", ["s", "l", "c"])
def test_q_in_the_dashboard_asks_whether_to_stop_the_job(answer, env, tmp_path):
    marker = tmp_path / "pgid"
    with _job_in_terminal(tmp_path, env, marker) as term:
        term.wait_text("LIVE", "Job started (PID")
        wait_for(lambda: marker.exists() and marker.read_text().strip(), what="the job's pid")
        pgid = int(marker.read_text())
        try:
            term.press("q")
            # all of the box, drawn (under load it comes in more than one frame)
            term.wait_text("is still running", "stop the job", "leave it running", "cancel", "Its output:")
            if answer == "c":
                term.press("c")
                term.wait_for(lambda s: "is still running" not in s, "the question gone")
                assert term.alive() and not group_gone(pgid)
                term.press("q")
                term.wait_text("is still running")
                term.press("escape")
                term.wait_for(lambda s: "is still running" not in s, "the question gone")
                assert term.alive() and not group_gone(pgid)
                return
            term.press(answer)
            code = term.wait_exit()
            out = term.raw_bytes().decode(errors="replace")
            if answer == "s":  # the path of a SIGTERM to traintop: the whole group, then its status
                assert code == 143, out[-2000:]
                assert group_gone(pgid)
                assert "job killed by SIGTERM" in out
            else:
                assert code == 0, out[-2000:]
                assert not group_gone(pgid)
                assert "goes on; its output:" in out
        finally:
            if not group_gone(pgid):
                os.killpg(pgid, signal.SIGKILL)


def test_ctrl_c_in_the_dashboard_asks_what_q_asks_and_stops_the_job_on_s(env, tmp_path):
    """In a real terminal Ctrl-C is a key (raw mode), not SIGINT: it opens the stop/leave/cancel
    question q opens, never Textual's "Do you want to quit? Press ctrl+q"."""
    marker = tmp_path / "pgid"
    with _job_in_terminal(tmp_path, env, marker) as term:
        term.wait_text("LIVE", "Job started (PID")
        wait_for(lambda: marker.exists() and marker.read_text().strip(), what="the job's pid")
        pgid = int(marker.read_text())
        try:
            term.press("ctrl+c")
            term.wait_text("is still running", "stop the job", "leave it running", "cancel")
            assert "ctrl+q" not in term.text()
            term.press("c")
            term.wait_for(lambda s: "is still running" not in s, "the question gone")
            assert term.alive() and not group_gone(pgid)
            term.press("ctrl+c")
            term.wait_text("is still running")
            term.press("s")
            assert term.wait_exit() == 143
            assert group_gone(pgid)
        finally:
            if not group_gone(pgid):
                os.killpg(pgid, signal.SIGKILL)


def _help_text(screen: str) -> str:
    """The help overlay's text (between its borders on each row), its rows joined without spaces."""
    rows = [line[line.index("█") + 1:line.rindex("█")] for line in screen.splitlines() if line.count("█") >= 2]
    return "".join("".join(row.split()) for row in rows)


def test_the_help_says_where_the_jobs_output_and_recordings_go(env, tmp_path):
    marker = tmp_path / "pgid"
    with _job_in_terminal(tmp_path, env, marker, cols=160, rows=48) as term:
        term.wait_text("No probe message yet")
        wait_for(lambda: marker.exists() and marker.read_text().strip(), what="the job's pid")
        pgid = int(marker.read_text())
        try:
            term.press("?")
            # every line waited for: the help may be caught half drawn; its paths wrap anywhere (the
            # temporary folder's name varies in length), so they are read with the help's lines joined
            want = ("Wherethingsgo", "job'soutput", "run-", os.path.join("traintop", "recordings"))
            term.wait_for(lambda screen: all(w in _help_text(screen) for w in want), what=f"{want} in the help")
        finally:
            os.killpg(pgid, signal.SIGKILL)


def test_the_app_is_told_how_the_job_ended_and_the_job_is_reaped(env, monkeypatch, tmp_path):
    import asyncio

    from traintop.watch import sessions
    from traintop.app.factory import build_app

    monkeypatch.setenv("TRAINTOP_PROBE_DIR", env["TRAINTOP_PROBE_DIR"])
    base, _ = launch.private_base()
    flag = tmp_path / "end"
    # busy until the test has seen it at work (a loaded machine may take its time), then killed
    job = launch.launch(["bash", "-c", f"while [ ! -e {flag} ]; do :; done; kill -9 $$"], base=base)
    monitor, feed = sessions.live_session(0.1, pid=job.pid, require_gpu=False, probe_dir=base, own_child=True)
    job.on_end(monitor.end_job)
    job.watch()

    async def go():
        app = build_app(monitor, feed, max_fps=20)
        async with app.run_test(size=(160, 48)) as pilot:
            for _ in range(300):  # bounded: its CPU on screen first
                await pilot.pause(0.1)
                if "\nCPU  " in str(app.query_one("#process").render()) and len(monitor.store.times(None)) > 5:
                    break
            flag.write_text("")
            for _ in range(300):
                await pilot.pause(0.1)
                if app.last_view and app.last_view.process.job_end:
                    break
            await pilot.pause(0.3)
            text = str(app.query_one("#process").render())
            return app.last_view.process.job_end, text, app._status.notice

    end, text, notice = asyncio.run(go())
    assert end is not None and end.signal == signal.SIGKILL and end.status == 137
    assert "Job killed by SIGKILL at" in text
    assert "\nCPU  " in text and "peak" in text  # what it did up to its end stays on screen
    assert "Job killed by SIGKILL at" in notice  # the status line says it too
    assert not os.path.exists(f"/proc/{job.pid}")  # reaped: no <defunct> left


# -- the probe directory ----------------------------------------------------------------------------

@pytest.fixture
def taken(tmp_path):
    """XDG_RUNTIME_DIR/traintop made unusable, three ways."""
    def make(kind):
        xdg = tmp_path / "xdg"
        xdg.mkdir(mode=0o700)
        d = xdg / "traintop"
        if kind == "symlink":
            target = tmp_path / "theirs"
            target.mkdir(mode=0o700)
            d.symlink_to(target)
        elif kind == "open":
            d.mkdir()
            d.chmod(0o777)
        else:  # another user's
            if os.getuid() != 0:
                pytest.skip("making a directory of another user needs root")
            d.mkdir(mode=0o700)
            os.chown(d, 65534, 65534)
        return xdg, d
    return make


@pytest.mark.parametrize("kind", ["symlink", "open", "foreign"])
def test_a_taken_probe_directory_does_not_break_run(kind, taken, tmp_path):
    xdg, d = taken(kind)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(xdg), TMPDIR=str(tmp_path))
    env.pop("TRAINTOP_PROBE_DIR", None)
    job = ("import os, time\n"
           "d = os.environ['TRAINTOP_PROBE_DIR']\n"
           "time.sleep(0.5)\n"
           "st = os.lstat(d)\n"
           "print(d, oct(st.st_mode & 0o777), st.st_uid == os.getuid(), os.path.exists(f'{d}/probe-{os.getpid()}.sock'))")
    r = run("--no-ui", "--", PY, "-c", job, env=env)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "not executable" not in r.stderr
    where, mode, mine, listening = r.stdout.split()
    assert where != str(d) and pathlib.Path(where).parent == tmp_path  # a fresh private directory
    assert mode == "0o700" and mine == "True" and listening == "True"
    note = [ln for ln in r.stderr.splitlines() if "cannot be used" in ln]
    assert len(note) == 1 and str(d) in note[0] and where in note[0] and "to fix" in note[0]
    assert not any(p.name.startswith("probe-") for p in d.iterdir()) if kind != "foreign" else True


@pytest.mark.parametrize("kind", ["symlink", "open"])
def test_the_reader_never_connects_into_a_directory_that_is_not_private(kind, taken, tmp_path):
    import socket

    from traintop.collectors.probe_client import ProbeClient

    _, d = taken(kind)
    real = d.resolve()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(real / f"probe-{os.getpid()}.sock"))
    srv.listen(1)
    srv.setblocking(False)
    try:
        client = ProbeClient(str(d))
        assert client.sample({os.getpid()}) == ()
        with pytest.raises(BlockingIOError):
            srv.accept()  # no connection was even made
        assert str(d) in client.refused_dirs
    finally:
        srv.close()


def test_a_pid_reader_finds_a_job_whose_probe_lives_in_its_own_directory(tmp_path, monkeypatch):
    from traintop.collectors.probe_client import ProbeClient

    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    job_env = dict(os.environ, TRAINTOP_PROBE_DIR=str(own))
    code = "import traintop.probe, time; time.sleep(30)"
    p = subprocess.Popen([PY, "-c", code], env=job_env)
    try:
        wait_for(lambda: (own / f"probe-{p.pid}.sock").exists(), what="the probe's socket")
        elsewhere = tmp_path / "usual"
        elsewhere.mkdir(mode=0o700)
        client = ProbeClient(str(elsewhere))  # what `traintop --pid` reads by default
        ranks = ()
        deadline = time.monotonic() + 20
        while not ranks and time.monotonic() < deadline:
            ranks = client.sample({p.pid})
            time.sleep(0.2)
        assert ranks and ranks[0].pid == p.pid
        client.close()
    finally:
        p.kill()
        p.wait(timeout=10)


def test_pid_says_how_to_fix_a_taken_probe_directory(taken, monkeypatch, capsys):
    from traintop import cli

    xdg, d = taken("open")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    monkeypatch.delenv("TRAINTOP_PROBE_DIR", raising=False)
    note = cli._probe_dir_note()
    assert note and str(d) in note and "XDG_RUNTIME_DIR" in note and "\n" not in note


# -- the injected sitecustomize ---------------------------------------------------------------------

def test_an_error_in_the_users_own_sitecustomize_is_shown_as_python_shows_it(tmp_path, monkeypatch):
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("print('user site ran')\nimport no_such_module_for_traintop\n")
    plain_env = dict(os.environ, PYTHONPATH=str(user))
    want = subprocess.run([PY, "-c", "print('job')"], capture_output=True, text=True, timeout=30, env=plain_env)
    assert "No module named 'no_such_module_for_traintop'" in want.stderr  # how Python says it
    monkeypatch.setenv("TRAINTOP_PROBE_DIR", str(tmp_path / "probes"))
    base, _ = launch.private_base()
    env = launch.probe_env(base, plain_env)
    env["TRAINTOP_PROBE_DISABLE"] = "1"
    got = subprocess.run([PY, "-c", "print('job')"], capture_output=True, text=True, timeout=30, env=env)
    assert got.stdout == want.stdout == "user site ran\njob\n"
    assert got.stderr == want.stderr


def test_a_working_user_sitecustomize_still_runs_after_ours(tmp_path, monkeypatch):
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\n")
    monkeypatch.setenv("TRAINTOP_PROBE_DIR", str(tmp_path / "probes"))
    base, _ = launch.private_base()
    env = launch.probe_env(base, dict(os.environ, PYTHONPATH=str(user)))
    code = "import os, sys; print(os.environ.get('USER_SITE_RAN'), '_traintop_probe_agent' in sys.modules)"
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=30, env=env)
    assert r.stdout.split() == ["1", "True"] and r.stderr == ""


# -- the job's log ----------------------------------------------------------------------------------

def test_two_runs_in_the_same_second_get_their_own_log(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINTOP_PROBE_DIR", str(tmp_path / "probes"))
    monkeypatch.setattr(launch.time, "strftime", lambda fmt, *a: "run-20260101-000000")
    a = launch.launch(["bash", "-c", "echo first"])
    b = launch.launch(["bash", "-c", "echo second"])
    try:
        assert a.log_path != b.log_path
        a.watch(), b.watch()
        a.wait(20), b.wait(20)
        assert pathlib.Path(a.log_path).read_text() == "first\n"
        assert pathlib.Path(b.log_path).read_text() == "second\n"
        assert os.stat(a.log_path).st_mode & 0o777 == 0o600
    finally:
        for j in (a, b):
            j.signal_group(signal.SIGKILL)


def test_a_chatty_jobs_log_stays_under_its_cap_and_keeps_its_start_and_its_end(tmp_path, monkeypatch):
    """The cut keeps the newest output too: a job that prints its traceback and exits just after
    a cut must not lose it (the cut used to go back to the head alone: 'END' was lost under load)."""
    monkeypatch.setenv("TRAINTOP_PROBE_DIR", str(tmp_path / "probes"))
    monkeypatch.setattr(launch, "LOG_MAX_BYTES", 4 << 20)
    monkeypatch.setattr(launch, "LOG_HEAD_BYTES", 512 << 10)
    chatty = ("import sys, time\nprint('START of the job', flush=True)\n"
              "for i in range(40):\n    sys.stdout.write('x' * 1048575 + '\\n'); sys.stdout.flush(); time.sleep(0.05)\n"
              "print('END of the job', flush=True)\n")
    job = launch.launch([sys.executable, "-c", chatty])
    try:
        job.watch()
        assert job.wait(60).returncode == 0
        for _ in range(50):  # the cap's last look after the job's end (bounded)
            if os.path.getsize(job.log_path) <= (4 << 20) + 4096:
                break
            time.sleep(0.1)
        text = pathlib.Path(job.log_path).read_text()
        assert os.path.getsize(job.log_path) <= (4 << 20) + 4096  # 40 MiB written
        assert text.startswith("START of the job") and "MiB of output dropped here" in text
        assert text.rstrip().endswith("END of the job")
    finally:
        job.signal_group(signal.SIGKILL)


def _cut(path, monkeypatch, during=None, every=False):
    """One cut of the log at ``path`` as traintop run does it; ``during(log_fd, bytes moved)`` runs as
    the job would write, after the cut's first write (``every``: after each)."""
    log = os.open(path, os.O_WRONLY | os.O_APPEND)
    edit = launch._editor(log, str(path))
    assert edit is not None
    if during is not None:
        real, done = os.pwrite, []

        def pwrite(fd, data, offset):
            n = real(fd, data, offset)
            if every or not done:
                done.append(during(log, len(data)))
            return n
        monkeypatch.setattr(launch.os, "pwrite", pwrite)
    try:
        launch._cut_log(log, edit, os.fstat(log).st_size)
    finally:
        os.close(log)
        os.close(edit)


def test_a_cut_keeps_the_head_the_line_and_the_last_whole_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "LOG_MAX_BYTES", 2000)
    monkeypatch.setattr(launch, "LOG_HEAD_BYTES", 100)
    monkeypatch.setattr(launch, "LOG_MARK_ROOM", 100)
    path = tmp_path / "log"
    lines = [f"line {i:04d} ".ljust(39, ".") + "\n" for i in range(60)]  # 40 bytes each, 2400 in all
    path.write_text("".join(lines))
    _cut(path, monkeypatch, during=lambda fd, n: os.write(fd, b"END of the job\n"))
    text = path.read_text()
    head, rest = text[:100], text[100:]
    assert head == "".join(lines)[:100]
    marker, tail = rest.split("]\n", 1)
    assert "output dropped here" in marker and "B of output" in marker
    # up to 850 bytes from a line's start: the last 21 whole lines, then what the job wrote meanwhile
    assert tail == "".join(lines[-21:]) + "END of the job\n"
    assert len(text) <= 2000
    # the job's next line goes at the new end
    with open(path, "a") as f:
        f.write("after\n")
    assert path.read_text().endswith("END of the job\nafter\n")


def test_a_job_that_never_stops_writing_cannot_hold_a_cut_forever(tmp_path, monkeypatch):
    """Each round of the cut's catch-up finds more output (a job writing as fast as it is copied):
    it follows a bounded number of rounds of bounded size, then cuts."""
    monkeypatch.setattr(launch, "LOG_MAX_BYTES", 2000)
    monkeypatch.setattr(launch, "LOG_HEAD_BYTES", 100)
    monkeypatch.setattr(launch, "LOG_MARK_ROOM", 100)
    path = tmp_path / "log"
    path.write_text("x" * 39 + "\n" * 1 + ("y" * 39 + "\n") * 59)
    writes = []

    def job(fd, moved):
        writes.append(moved)
        os.write(fd, b"z" * 5000)  # the job: 5000 more bytes for every piece moved
    _cut(path, monkeypatch, during=job, every=True)
    assert len(writes) <= 2 + launch.LOG_CATCH_UP_ROUNDS and max(writes) <= 850
    assert os.path.getsize(path) <= 100 + 100 + 850 * (1 + launch.LOG_CATCH_UP_ROUNDS)


def test_a_log_swapped_between_the_opens_is_never_edited(tmp_path):
    swapped = tmp_path / "log"
    swapped.write_text("x")
    log, created = launch.open_log(str(swapped))
    try:
        assert not created
        swapped.unlink()
        swapped.write_text("another file")  # replaced between the opens: not the job's log
        assert launch._editor(log, str(swapped)) is None
    finally:
        os.close(log)


def test_the_quit_box_goes_when_the_job_ends_under_it(env, tmp_path):
    from terminal import Terminal

    e = {k: v for k, v in env.items() if k in ("TRAINTOP_PROBE_DIR", "TMPDIR")}
    flag = tmp_path / "go"
    # the job ends when the test says so (the flag file), not on a clock
    with Terminal(["run", "--interval", "0.2", "--", "bash", "-c",
                   f"while [ ! -e {flag} ]; do sleep 0.1; done; exit 3"], 100, 30, home=str(tmp_path), env=e) as term:
        term.wait_text("LIVE", "Job started (PID")
        term.press("q")
        term.wait_text("is still running", "stop the job")
        flag.write_text("")
        term.wait_for(lambda s: "is still running" not in s and "exited with 3" in s, "the box gone, the end said")
        term.press("q")
        assert term.wait_exit() == 3


def test_run_refuses_an_existing_recording_before_starting_the_job(tmp_path, env):
    """The file name is checked first: the job is never started only to be killed."""
    rec = tmp_path / "taken.ttrec"
    rec.write_bytes(b"mine")
    marker = tmp_path / "started"
    r = subprocess.run([sys.executable, "-m", "traintop", "run", "--no-ui", "--record", str(rec), "--",
                        "sh", "-c", f"touch {marker}"], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2 and "already exists" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not marker.exists() and rec.read_bytes() == b"mine"


def test_the_injected_probe_lives_in_a_folder_named_by_its_own_contents(tmp_path):
    """A checkout and an installed traintop of one version, started side by side, each inject
    their own probe: the folder is named by what it holds, and its files are the package's."""
    d = launch.injection_dir(str(tmp_path))
    assert launch.injection_dir(str(tmp_path)) == d
    name = os.path.basename(d)
    assert name.startswith(f"inject-{launch.__version__}-") and len(name.rsplit("-", 1)[1]) == 12
    src = pathlib.Path(launch.__file__).parents[1]  # traintop/
    assert (pathlib.Path(d) / "_traintop_probe_goodput.py").read_bytes() == (src / "injob" / "goodput.py").read_bytes()
    assert sorted(os.listdir(d)) == sorted(dst for _, dst in launch.INJECTED)  # no temp file left
    assert oct(os.stat(d).st_mode & 0o777) == "0o700"
