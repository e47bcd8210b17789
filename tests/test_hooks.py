"""--on-finding on one host: real child commands get each warning's start and end as JSON on stdin;
a hanging command is killed with what it started, a failing one is counted and shown in one line."""

import json
import os
import subprocess
import sys
import time

from traintop.collectors.simulated import Simulator
from traintop.watch.hooks import FindingHook
from traintop.watch.monitor import Monitor
from traintop.reports.view import build_view

APPEND = "import sys; open(sys.argv[1], 'a').write(sys.stdin.read())"


def append_to(path) -> str:
    return f"{sys.executable} -c \"{APPEND}\" {path}"


def events_in(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def play(monitor, scenario, seconds, t0, interval=0.5):
    sim = Simulator(scenario, gpus=1, seed=1, interval=interval, t0=t0)
    for f in sim.frames(int(seconds / interval)):
        monitor.ingest(f)
    return t0 + seconds


def test_a_warning_starting_and_ending_runs_the_command_with_the_finding(tmp_path):
    out = tmp_path / "events"
    sim = Simulator("starved", gpus=1, seed=1)
    monitor = Monitor(sim.info())
    monitor.attach_finding_hook(FindingHook(append_to(out), log_path=str(tmp_path / "hook.log")), host="box1")
    t = play(monitor, "starved", 60, 1_790_000_000.0)
    t = play(monitor, "healthy", 60, t)
    monitor.close()
    events = events_in(out)
    starv = [e for e in events if e["rule"] == "starvation"]
    assert [e["event"] for e in starv] == ["start", "end"]
    start, end = starv
    assert start["host"] == "box1" and start["subject"] == "gpu0" and start["severity"] == "warning"
    assert start["title"] == "Data starvation" and "GPU 0" in start["evidence"] and start["end"] is None
    assert end["start"] == start["start"] and end["end"] > start["start"]
    assert set(start) == set(end)  # one schema for both events
    # info findings (power cap at full load) never run it
    assert all(e["severity"] in ("warning", "critical") for e in events)
    assert monitor.hook.problem() is None


def test_a_hanging_command_is_killed_with_what_it_started_and_no_zombie_is_left(tmp_path):
    pids = tmp_path / "pids"
    # a shell that starts a long sleep in the background and waits for it
    hook = FindingHook(f"sleep 60 & echo $$ $! > {pids}; wait", timeout=1.0)
    hook.submit({"event": "start", "rule": "starvation", "subject": "gpu0"})
    hook.close(wait=20)
    assert hook.failures == 1 and "timed out after 1 s" in hook.problem()
    shell, sleeper = (int(x) for x in pids.read_text().split())
    assert not os.path.exists(f"/proc/{shell}")  # killed and reaped: no zombie of ours
    # what it started is killed too; orphaned, it is init's to reap (some containers' init never does)
    def status():
        try:
            return dict(line.split(":", 1) for line in open(f"/proc/{sleeper}/status"))
        except OSError:
            return None

    def gone(st):
        return st is None or (st["State"].split()[0] == "Z" and int(st["PPid"]) != os.getpid())

    deadline = time.monotonic() + 10  # SIGKILL is sent; a loaded machine may take a moment to end it
    while not gone(st := status()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(st), st and st["State"]


def test_submit_never_waits_for_the_command(tmp_path):
    hook = FindingHook(f"{sys.executable} -c \"import time; time.sleep(30)\"", timeout=5.0)
    t0 = time.monotonic()
    for i in range(200):  # past the queue's bound: the rest are dropped and counted
        hook.submit({"event": "start", "rule": "x", "subject": f"gpu{i}"})
    assert time.monotonic() - t0 < 2.0
    assert hook.dropped > 0 and "dropped" in hook.problem()


def test_a_failing_command_is_counted_its_output_logged_and_shown_in_the_status_bar(tmp_path):
    log = tmp_path / "hook.log"
    sim = Simulator("starved", gpus=1, seed=1)
    monitor = Monitor(sim.info())
    monitor.attach_finding_hook(FindingHook(f"{sys.executable} -c \"import sys; print('webhook said no'); "
                                            f"sys.exit(3)\"", log_path=str(log)))
    play(monitor, "starved", 60, 1_790_000_000.0)
    monitor.hook.close(wait=20)
    problem = build_view(monitor).hook_error
    assert problem == f"--on-finding: 1 of 1 run(s) failed (last: exit status 3); its output: {log}"
    text = log.read_text()
    assert "start starvation gpu0" in text and "webhook said no" in text
    missing = FindingHook(str(tmp_path / "no-such-command"))
    missing.submit({"event": "start"})
    missing.close(wait=20)
    assert "exit status 127 (command not found)" in missing.problem()


def test_the_command_runs_through_the_shell_even_a_builtin(tmp_path):
    """`exit 3` is no program: given to /bin/sh -c, it fails with 3, said once, one prefix."""
    said = []
    hook = FindingHook("exit 3", on_first_failure=said.append)
    hook.submit({"event": "start"})
    hook.submit({"event": "end"})
    hook.close(wait=20)
    assert hook.failures == 2 and "last: exit status 3" in hook.problem()
    assert said == ["--on-finding command failed: exit status 3"]
    out = tmp_path / "read"
    ok = FindingHook(f"read line; echo \"$line\" > {out}")
    ok.submit({"event": "start", "rule": "x"})
    ok.close(wait=20)
    assert ok.failures == 0 and json.loads(out.read_text())["rule"] == "x"


def test_record_runs_the_hook_headless(tmp_path):
    out = tmp_path / "events"
    r = subprocess.run([sys.executable, "-m", "traintop", "record", str(tmp_path / "r.ttrec"), "--simulate", "starved",
                        "--fast", "--duration", "60", "--on-finding", append_to(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (start,) = [e for e in events_in(out) if e["rule"] == "starvation"]
    assert start["event"] == "start" and start["subject"] == "gpu0"
    r = subprocess.run([sys.executable, "-m", "traintop", "record", str(tmp_path / "r2.ttrec"), "--simulate",
                        "starved", "--fast", "--duration", "60", "--on-finding", "false"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0  # the recording is what was asked; the hook's failure is said, once
    assert r.stderr.count("--on-finding command failed: exit status 1") == 1
    assert "traintop: traintop:" not in r.stderr
    assert "--on-finding: 1 of 1 run(s) failed" in r.stderr


def test_the_dashboard_shows_the_hooks_failures_in_its_status_bar_and_keeps_sampling(sim_app):
    import asyncio

    from traintop.widgets.status_bar import StatusBar

    async def go():
        app, monitor, feed = sim_app("starved")
        hook = FindingHook(f"{sys.executable} -c \"import sys; sys.exit(4)\"")
        monitor.attach_finding_hook(hook)
        async with app.run_test(size=(100, 30)) as pilot:
            for _ in range(120):  # a minute of samples: the starvation warning starts
                feed.step()
            for _ in range(100):
                if hook.failures:
                    break
                await asyncio.sleep(0.05)
            app.refresh_view()
            await pilot.pause()
            assert "--on-finding: 1 of 1 run(s) failed (last: exit status 4)" in app.query_one(StatusBar).problem

    asyncio.run(go())


def _gone(pid: int, limit_s: float = 10.0) -> bool:
    """The process is gone (or a zombie not ours to reap), within a bounded wait."""
    for _ in range(int(limit_s / 0.1)):
        try:
            with open(f"/proc/{pid}/status") as fh:
                status = dict(line.split(":", 1) for line in fh)
        except OSError:
            return True
        if status["State"].split()[0] == "Z":
            return True
        time.sleep(0.1)
    return False


def test_what_a_command_leaves_behind_is_killed_when_it_ends_even_a_new_session(tmp_path):
    pids = tmp_path / "pids"
    # the command returns at once, leaving a background child and one in a session of its own
    hook = FindingHook(f"sleep 100000 & setsid sleep 100001 & echo $! >> {pids}; jobs -p >> {pids}; echo started",
                       timeout=20.0, log_path=str(tmp_path / "hook.log"))
    hook.submit({"event": "start", "rule": "starvation", "subject": "gpu0"})
    hook.close(wait=20)
    assert hook.failures == 0, hook.problem()
    left = {int(x) for x in pids.read_text().split()}
    assert len(left) == 2
    assert all(_gone(pid) for pid in left)
    assert "started" in (tmp_path / "hook.log").read_text()


def test_a_run_still_going_when_traintop_stops_is_killed(tmp_path):
    pids = tmp_path / "pids"
    hook = FindingHook(f"setsid sleep 100002 & echo $! > {pids}; sleep 100003", timeout=600.0)
    hook.submit({"event": "start", "rule": "starvation", "subject": "gpu0"})
    for _ in range(100):
        if pids.exists() and pids.read_text().strip():
            break
        time.sleep(0.1)
    hook.close(wait=0.5)
    assert _gone(int(pids.read_text()))
    assert hook._current is None or _gone(hook._current[0].pid)


def test_a_chatty_command_cannot_grow_the_log_past_its_cap(tmp_path):
    from traintop.watch.hooks import LOG_MAX_BYTES

    log = tmp_path / "hook.log"
    hook = FindingHook(f"{sys.executable} -c \"import sys; [sys.stdout.write('x' * 65536) for _ in range(160)]\"",
                       timeout=60.0, log_path=str(log))
    for _ in range(3):
        hook.submit({"event": "start", "rule": "starvation", "subject": "gpu0"})
    hook.close(wait=60)
    assert hook.failures == 0, hook.problem()
    size = log.stat().st_size + (log.with_suffix(".log.1").stat().st_size if log.with_suffix(".log.1").exists() else 0)
    assert size < 3 * LOG_MAX_BYTES  # 30 MiB written in all
    assert "output cut" in log.read_text()[-300:]


def test_a_finding_explained_when_it_starts_is_not_announced_one_explained_later_ends_as_usual():
    from traintop.findings import Finding, Severity
    from traintop.watch.hooks import FindingEvents

    def up(rule, sev, subject, title, evidence, start, explained_by):
        return Finding(rule, title, subject, sev, start, None, evidence, (), explained_by)

    ev = FindingEvents("h")
    w = Severity.WARNING
    # the stall and the idle GPU it explains start together: only the stall is announced
    got = ev.update([up("stall", Severity.CRITICAL, "gpu0", "Stalled", "nobody steps", 10.0, None),
                     up("idle_gpu", w, "gpu1", "Idle", "idle", 10.0, "stall gpu0")], 10.0)
    assert [(e["event"], e["rule"]) for e in got] == [("start", "stall")]
    # starvation, announced, then explained by a later stall: its end says so
    ev = FindingEvents("h")
    ev.update([up("starvation", w, "gpu0", "Starved", "gaps", 1.0, None)], 1.0)
    ev.update([up("starvation", w, "gpu0", "Starved", "gaps", 1.0, "stall gpu0")], 2.0)
    (end,) = ev.update([], 3.0)
    assert end["event"] == "end" and end["explained_by"] == "stall gpu0"
