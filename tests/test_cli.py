"""The command line: one-line errors, exit codes, headless record, the no-GPU demo fallback."""

import os
import subprocess
import sys

import pytest

from traintop import cli
from traintop.record.recording import RecordingReader


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
    (["--fps", "0"], "expected a number above 0 and below 1000, got '0'"),
    (["simulate", "--fps", "1000"], "above 0 and below 1000"),
    (["--pid", "-3"], "positive"),
    (["--only-gpus", "a,b"], "GPU indices like 0,1"),
    (["--only-gpus", ","], "names no GPU"),
    (["record", "--simulate", "starved", "--only-gpus", "0", "x.ttrec"], "does not go with --simulate"),
    (["agent", "--simulate", "starved", "--only-gpus", "0"], "does not go with --simulate"),
    (["--pid", "4194303999"], "no process with PID"),
    (["replay", "/nonexistent.ttrec"], "no such file"),
    (["replay", "/etc/hostname"], "not a traintop recording"),
    (["frobnicate"], "unknown command 'frobnicate' (commands: demo, simulate,"),
    (["simulate", "--scenario", "nope"], "unknown scenario"),
    (["record", "x.ttrec", "--fast"], "--fast needs"),
    (["replay", "x.ttrec", "--speed", "0"], "expected a speed above 0"),
    (["analyze", "--prometheus", "http://127.0.0.1:1", "--since", "-5m"], "expected a positive duration, got '-5m'"),
    (["analyze", "x.ttrec", "--since", "2m"], "--since picks a time range of --prometheus URL"),
    (["analyze", "x.ttrec", "--job", "7", "--until", "5"], "--until, --job pick a time range"),
    (["--interval", "-1"], "positive number of seconds"),
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


def test_no_gpu_says_so_in_the_app_and_plays_the_demo(monkeypatch, capsys):
    from traintop.errors import NoGpuError
    from traintop.watch import sessions

    def no_gpu(*a, **k):
        raise NoGpuError("NVML could not start (NVML Shared Library Not Found)")

    ran = {}
    monkeypatch.setattr(sessions, "live_session", no_gpu)
    monkeypatch.setattr(cli, "_run_app", lambda args, session, banner=None:
                        ran.update(mode=session.kind, feed=session.feed, banner=banner) or 0)
    assert cli.main([]) == 0
    # A line printed before the UI starts is seen only after quitting: the app shows it.
    assert "NVML Shared Library Not Found" in ran["banner"] and "playing the embedded demo" in ran["banner"]
    assert ran["banner"].startswith("No GPU here: playing the embedded demo")  # the consequence first: 80 columns cut the rest
    assert ran["mode"] == "demo" and ran["feed"].loop


# -- every command's help, and only its own options -------------------------------------------

ALL_COMMANDS = [None, *cli.subparsers(cli.build_parser())]


@pytest.mark.parametrize("command", ALL_COMMANDS)
def test_every_help_works(command):
    r = traintop(*([command] if command else []), "--help")
    assert r.returncode == 0 and "Traceback" not in r.stderr and r.stderr == ""
    assert r.stdout.startswith(f"usage: traintop{' ' + command if command else ''}")


@pytest.mark.parametrize("command", ALL_COMMANDS)
def test_every_option_has_a_help_line(command):
    parser = cli.build_parser()
    p = cli.subparsers(parser)[command] if command else parser
    for action in p._actions:
        if isinstance(action, __import__("argparse")._SubParsersAction):
            assert all(a.help for a in action._choices_actions)
            continue
        assert action.help and action.help != "==SUPPRESS==", (command, action.option_strings or action.dest)


@pytest.mark.parametrize("args", [
    ["analyze", "x.ttrec", "--fps", "3"], ["analyze", "--pid", "1", "x.ttrec"], ["demo", "--record", "x.ttrec"],
    ["replay", "x.ttrec", "--interval", "1"], ["record", "x.ttrec", "--record", "y.ttrec"],
    ["doctor", "--set", "idle_window_s=3"], ["run", "--pid", "1", "--", "true"],
    ["simulate", "--only-gpus", "0"], ["replay", "x.ttrec", "--only-gpus", "1"],
])
def test_an_option_of_another_command_is_refused(args, tmp_path):
    r = traintop(*args, cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "is not an option of `traintop " in lines[0], r.stderr
    assert not list(tmp_path.iterdir())  # nothing ran


@pytest.mark.parametrize("args,line", [
    (["--recrod", "x.ttrec"], "unknown option --recrod (did you mean --record?)"),
    (["--intervl", "1"], "unknown option --intervl (did you mean --interval?)"),
    (["--intervl=1", "--pid", "1"], "unknown option --intervl (did you mean --interval?)"),
    (["anaylze", "x.ttrec"], "unknown command 'anaylze' (did you mean analyze?)"),
    (["--pid", "1", "snapshto"], "unknown command 'snapshto' (did you mean snapshot?)"),
    (["x.ttrec"], "unknown command 'x.ttrec' (to replay a recording or an nvidia-smi log: traintop replay x.ttrec)"),
    (["analyze", "x.ttrec", "--jsno"], "unknown option --jsno (did you mean --json?)"),
    (["replay", "x.ttrec", "--sped", "2"], "unknown option --sped (did you mean --speed?)"),
    (["analyze", "x.ttrec", "--intervl", "1"],
     "unknown option --intervl (`traintop analyze` has no --interval either: see traintop analyze --help)"),
    (["--json", "analyze", "x.ttrec"],
     "--json is an option of `traintop analyze`: put it after the command (traintop analyze --json ...)"),
    (["--on", "x"], "ambiguous option: --on could match --only-gpus, --on-finding (see traintop --help)"),
])
def test_a_misspelt_option_or_command_is_named_with_what_was_meant(args, line, tmp_path):
    r = traintop(*args, cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == f"traintop: {line}\n"
    assert not list(tmp_path.iterdir())  # nothing ran


def test_options_spelt_as_argparse_takes_them_still_work():
    """An unambiguous start of an option is that option, as argparse reads it; a value may start
    with a dash once joined to its option."""
    args = cli.parse_args(["--rec", "x.ttrec", "--inter", "2", "simulate", "--scen", "idle"])
    assert (args.record, args.interval, args.scenario) == ("x.ttrec", 2.0, "idle")
    assert cli.parse_args(["analyze", "--prometheus", "http://p:9090", "--since=5m"]).since == 300


@pytest.mark.parametrize("args", [["--pid", "1", "analyze", "x.ttrec"], ["--record", "y.ttrec", "demo"],
                                  ["--fps", "3", "analyze", "x.ttrec"], ["--interval", "1", "config"]])
def test_an_option_before_a_command_that_has_no_use_for_it_is_refused(args, tmp_path):
    r = traintop(*args, cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "does not apply to `traintop " in lines[0], r.stderr


def test_shared_options_go_before_or_after_the_command():
    for argv in (["--interval", "2", "simulate"], ["simulate", "--interval", "2"]):
        args = cli.parse_args(argv)
        assert args.interval == 2 and args.fps == 1.0 and args.record is None
    args = cli.parse_args(["--interval", "2", "simulate", "--interval", "3"])
    assert args.interval == 3  # the one nearer the command's own options wins
    args = cli.parse_args(["--set", "idle_window_s=5", "analyze", "f", "--set", "idle_max_util=3"])
    assert args.set == ["idle_window_s=5", "idle_max_util=3"]
    assert not hasattr(cli.parse_args(["analyze", "f"]), "interval")  # a command sees only its own options


def test_run_usage_names_its_options():
    usage = traintop("run", "--help").stdout.split("\n\n")[0]
    for opt in ("--no-ui", "--log FILE", "--record FILE", "--interval", "-- COMMAND ..."):
        assert opt in usage


# -- messages ---------------------------------------------------------------------------------

def test_an_unknown_threshold_name_points_to_the_list():
    r = traintop("analyze", "x.ttrec", "--set", "starvation_windw_s=3")
    assert r.returncode == 2 and "did you mean starvation_window_s" in r.stderr and "traintop config" in r.stderr
    r = traintop("config", "--set", "idle_window_s=7")
    from dataclasses import fields

    from traintop.rules.config import Thresholds

    assert r.returncode == 0
    assert all(f.name in r.stdout for f in fields(Thresholds))
    lines = r.stdout.splitlines()
    assert lines[1].split() == ["name", "in", "effect", "default", "range"]
    assert any(ln.split() == ["idle_window_s", "7", "30", "1-600", "changed"] for ln in lines), r.stdout
    # the others show their default too, and are not marked
    assert any(ln.split()[:3] == ["starvation_window_s", "20", "20"] and not ln.endswith("changed") for ln in lines)


def test_recording_to_a_directory_says_it_is_one(tmp_path):
    r = traintop("record", str(tmp_path), "--simulate", "idle", "--duration", "1", "--fast")
    assert r.returncode == 2 and f"{tmp_path} is a directory" in r.stderr
    assert "already exists" not in r.stderr


def test_record_without_gpus_says_why(tmp_path):
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("a GPU driver is present")
    r = traintop("record", str(tmp_path / "h.ttrec"), "--duration", "0.3", "--interval", "0.1")
    assert r.returncode == 0, r.stderr
    first = r.stderr.splitlines()[0]
    assert "recording no GPU (NVML" in first and "the host only" in first


def test_analyze_of_a_text_file_says_what_it_is_not(tmp_path):
    (tmp_path / "README.md").write_text("# traintop\n\nA terminal dashboard.\n")
    r = traintop("analyze", str(tmp_path / "README.md"))
    assert r.returncode == 2 and "is not a traintop recording" in r.stderr and "dmon" in r.stderr
    assert "gpu column" not in r.stderr


def test_real_nvml_absent_here_is_a_clear_error():
    # On a machine without the NVIDIA driver the real collector fails with one clear line.
    from traintop.collectors.nvml import NvmlCollector
    from traintop.errors import NoGpuError

    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("a GPU driver is present")
    with pytest.raises(NoGpuError) as e:
        NvmlCollector()
    assert "\n" not in str(e.value)


# -- the dashboard needs a terminal -----------------------------------------------------------

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "h200", "ddp-2rank.ttrec")


@pytest.mark.parametrize("args", [
    [],  # live (here: no GPU, the demo fallback)
    ["--only-gpus", "0"],
    ["--pid", str(os.getpid())],
    ["simulate"],
    ["demo"],
    ["replay", FIXTURE],
    ["cluster", "--prometheus", "http://127.0.0.1:1"],  # said before Prometheus (nothing there) is asked
])
def test_without_a_terminal_the_dashboard_refuses_in_one_line(args, tmp_path):
    r = subprocess.run([sys.executable, "-m", "traintop", *args], stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stdout == "" and "\x1b" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("traintop: no terminal here") and "traintop record FILE" in lines[0]


def test_without_a_terminal_no_recording_is_left_behind(tmp_path):
    for args in (["simulate", "--record", "s.ttrec"], ["--record", "l.ttrec"]):
        r = traintop(*args, cwd=tmp_path, stdin=subprocess.DEVNULL)
        assert r.returncode == 2 and "no terminal here" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_stdout_to_a_file_is_no_terminal_either(tmp_path):
    """A terminal on stdin only (`traintop simulate > out`): still refused."""
    master, slave = os.openpty()
    try:
        with open(tmp_path / "out", "w") as out:
            r = subprocess.run([sys.executable, "-m", "traintop", "simulate"], stdin=slave, stdout=out,
                               stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(slave)
        os.close(master)
    assert r.returncode == 2 and "no terminal here" in r.stderr
    assert (tmp_path / "out").read_text() == ""


def test_stderr_to_a_file_says_that_the_dashboard_draws_there(tmp_path):
    """A terminal on stdin and stdout, stderr to a file (`traintop 2>err.log`): refused, and the line
    says which stream is no terminal, not only "no terminal here" beside a terminal the user sees."""
    master, slave = os.openpty()
    try:
        with open(tmp_path / "err", "w") as err:
            r = subprocess.run([sys.executable, "-m", "traintop", "simulate"], stdin=slave, stdout=slave,
                               stderr=err, timeout=60)
    finally:
        os.close(slave)
        os.close(master)
    text = (tmp_path / "err").read_text()
    assert r.returncode == 2 and text.count("\n") == 1, text
    assert "no terminal here" in text and "stderr is not one" in text and "draws on stderr" in text


@pytest.mark.parametrize("env", [{"PYTHONIOENCODING": "ascii"}, {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0"}])
def test_a_standard_output_that_cannot_encode_the_reports_dashes_gets_them_escaped(env):
    """A Latin-1 or ASCII locale: "—" and "→" come out as \\u2014 and \\u2192, never a traceback."""
    r = subprocess.run([sys.executable, "-m", "traintop", "analyze", FIXTURE], capture_output=True,
                       timeout=120, env={**os.environ, **env})
    assert r.returncode in (0, 1) and b"Traceback" not in r.stderr, r.stderr.decode()
    assert r.stdout.isascii() and b"traintop analyze \\u2014 " in r.stdout and b"\\u2192 " in r.stdout


# -- a reader that goes away -------------------------------------------------------------------

@pytest.mark.parametrize("args", [["config"], ["analyze", FIXTURE]])
def test_a_closed_pipe_ends_quietly(args):
    p = subprocess.Popen([sys.executable, "-m", "traintop", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()  # the reader is gone before the first write: every write fails with EPIPE
    err = p.stderr.read().decode()
    assert p.wait(60) == 141
    assert err == ""



def test_cluster_without_a_terminal_refuses_before_asking_prometheus(monkeypatch, capsys):
    from traintop.app.cluster import ClusterApp
    from traintop.cluster import commands

    monkeypatch.setattr(commands, "cluster_source", lambda args: pytest.fail("Prometheus was asked"))
    monkeypatch.setattr(ClusterApp, "run", lambda self: pytest.fail("the dashboard started"))
    assert cli.main(["cluster", "--prometheus", "http://prometheus:9090"]) == 2  # pytest's output: no terminal
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("traintop: no terminal here")


def test_cluster_with_a_terminal_closes_its_source_when_the_dashboard_fails(monkeypatch):
    from traintop.app.cluster import ClusterApp
    from traintop.cluster import commands

    closed = []

    class Source:
        class prom:
            shown = "http://prometheus:9090"

        def close(self):
            closed.append(True)

    def crash(self):
        raise RuntimeError("the dashboard failed")

    monkeypatch.setattr(cli, "has_terminal", lambda: True)
    monkeypatch.setattr(commands, "cluster_source", lambda args: Source())
    monkeypatch.setattr(ClusterApp, "run", crash)
    with pytest.raises(RuntimeError):
        cli.main(["cluster", "--prometheus", "http://prometheus:9090"])
    assert closed


def test_a_jobs_own_arguments_are_never_rewritten():
    assert cli._join_dashed_values(["run", "python", "t.py", "--since", "-5m"]) == \
        ["run", "python", "t.py", "--since", "-5m"]
    assert cli._join_dashed_values(["run", "--grace", "-1", "--", "x", "--since", "-1"]) == \
        ["run", "--grace=-1", "--", "x", "--since", "-1"]


def test_headless_the_end_says_what_was_found_and_where_the_evidence_is():
    """traintop run without a terminal (a batch job's log): the findings and captures of the run
    are said at its end, one line each, their text escaped."""
    from traintop.cli import MAX_SUMMARY_FINDINGS, findings_summary
    from traintop.findings import Finding, Severity
    from traintop.samples import Capture

    pause = Finding("pause", "Training pauses", "gpu0", Severity.WARNING, 1000.0, 1074.0, "…", ())
    info = Finding("power_cap", "Power-capped (normal)", "gpu0", Severity.INFO, 1000.0, None, "…", ())
    explained = Finding("underuse", "GPU underused", "gpu0", Severity.WARNING, 1000.0, None, "…", (),
                        explained_by="pause gpu0")
    odd = Finding("stall", "Stalled\x1b[2J", "rank 1\n", Severity.CRITICAL, 1100.0, None, "…", ())
    cap = Capture(t=1042.0, pid=7, kind="trace", path="/run/x/capture-7-20261202-184505.pt.trace.json",
                  reason="Training pauses")
    lines = findings_summary([pause, info, explained, odd], [cap])
    assert lines[0].startswith("found: [warning] Training pauses (gpu0, from ") and lines[0].endswith("for 1 min 14 s)")
    assert lines[1].startswith("found: [critical] Stalled") and "\x1b" not in lines[1] and "\n" not in lines[1]
    assert lines[1].endswith("until the end)")
    assert lines[2] == "evidence: trace on Training pauses: /run/x/capture-7-20261202-184505.pt.trace.json"
    # no recording kept: the last line says how to keep one, not "on a recording" the user does not have
    assert len(lines) == 4 and lines[3] == "with --record FILE, `traintop analyze FILE` gives the evidence and what to try"
    recorded = findings_summary([pause], [], "/data/runs/my run.ttrec")
    assert recorded[-1] == "`traintop analyze '/data/runs/my run.ttrec'` gives the evidence and what to try"
    many = findings_summary([pause] * (MAX_SUMMARY_FINDINGS + 3))
    assert many[MAX_SUMMARY_FINDINGS] == "found: 3 more"
    assert findings_summary([info, explained]) == []
