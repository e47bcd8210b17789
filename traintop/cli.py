"""The one entry point: live (default) and one subcommand per way of using traintop.

Adding a command: write ``cmd_NAME(args)`` and ``add_NAME(sub)`` (which registers its parser,
its own options through the option groups below, and ``handler=cmd_NAME``), list
``add_NAME`` in ``COMMANDS`` and its one-line help in ``SUMMARIES``. A command gets only the
options it registers; an option it does not have is refused with one line.
"""

from __future__ import annotations

import argparse
import difflib
import os
import shlex
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, cast

from traintop import __version__
from traintop.errors import NoGpuError, TraintopError
from traintop.text import plain
from traintop.options import (BEFORE, DEFAULTS, SUMMARIES, add_display, add_finding_hook, add_live_options,  # noqa: F401
                              add_output, add_sampling, add_thresholds, docs_epilog, help_text as _help,
                              positive_int as _positive_int, seconds as _seconds, speed as _speed)

if TYPE_CHECKING:
    from traintop.watch.feeds import ReplayFeed, SourceFeed


def echo(message: str) -> None:
    """One line to stderr. Messages quote file names, commands and file content: control
    characters in them are shown, never sent to the terminal as such."""
    print(f"traintop: {plain(message)}", file=sys.stderr)


# Options whose value may start with "-" ("--since -5m"): argparse takes such a value for an
# option and says "expected one argument"; joined to its option, the value's own check speaks.
NEGATIVE_OK = ("--since", "--until", "--speed", "--interval", "--fps", "--grace", "--duration", "--step")


def _join_dashed_values(argv: list[str]) -> list[str]:
    out: list[str] = []
    k, run = 0, False
    while k < len(argv):
        a = argv[k]
        if a == "--" or (run and not a.startswith("-")):  # the job's own command line: as it is
            return out + argv[k:]
        run = run or a == "run"
        nxt = argv[k + 1] if k + 1 < len(argv) else None
        if a in NEGATIVE_OK and nxt is not None and len(nxt) > 1 and nxt[0] == "-" and (nxt[1].isdigit() or nxt[1] == "."):
            out.append(f"{a}={nxt}")
            k += 2
            continue
        out.append(a)
        k += 1
    return out


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, like every other error
        self.exit(2, f"traintop: {plain(message)} (see {self.prog} --help)\n")


def _on_finding(args, session, headless: bool) -> None:
    """--on-finding: the hook runs on its own thread; under the dashboard its failures show in the
    status bar, headless the first one is said at once."""
    session.on_finding(getattr(args, "on_finding", None), echo if headless else None)


def _hook_summary(session) -> None:
    if problem := session.hook_problem():
        echo(problem)


NO_TERMINAL = ("no terminal here: the dashboard needs one; to record headless use `traintop record FILE`, "
               "for a report `traintop analyze FILE`, on a node `traintop agent`")


def not_terminals() -> list[str]:
    """Which of stdin, stdout and stderr are no terminal: the dashboard reads keys on stdin and draws
    on stderr (Textual's choice); started from a script, cron or with output to a file it would draw
    escape codes into the file and never end."""
    out = []
    for name, f in (("stdin", sys.stdin), ("stdout", sys.stdout), ("stderr", sys.stderr)):
        try:
            if f is None or not f.isatty():
                out.append(name)
        except (ValueError, OSError):  # closed
            out.append(name)
    return out


def has_terminal() -> bool:
    return not not_terminals()


def require_terminal(session=None) -> None:
    """One line and exit 2 where the dashboard cannot draw; a session already built is closed."""
    if not has_terminal():
        if session is not None:
            session.close()
        missing = not_terminals()
        where = "" if len(missing) == 3 else f" ({' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not one: " \
            "the dashboard reads keys on stdin and draws on stderr, so neither may be redirected)"
        raise TraintopError(NO_TERMINAL.replace("the dashboard needs one", "the dashboard needs one" + where, 1))


def _run_app(args, session, banner: str | None = None, prepare=None) -> int:
    from traintop.app.factory import build_app

    require_terminal(session)
    app = build_app(session, banner=banner, max_fps=args.fps, grace=getattr(args, "grace", 10.0))
    if prepare is not None:
        prepare(app)
    app.run()
    _hook_summary(session)
    monitor = session.monitor
    if monitor.recording_error:
        echo(monitor.recording_error)
    if monitor.recorder is not None and not monitor.recording_error:
        echo(f"recording saved to {monitor.recorder.path}")
    return app.return_code or 0  # 1 after an uncaught exception (Textual printed it)


def cmd_live(args) -> int:
    from traintop.watch import sessions

    if args.record is not None:
        require_terminal()  # before the recording is created: nothing left behind to remove
    explicit = args.pid is not None or args.record is not None
    try:
        session = sessions.live_session(args.interval, pid=args.pid, record=args.record,
                                        require_gpu=not explicit, config=args.thresholds,
                                        only_gpus=args.only_gpus, capture=not args.no_capture)
    except NoGpuError as e:
        # Said inside the app: a line printed before it starts is hidden until the user quits.
        return _run_app(args, sessions.demo_session(config=args.thresholds),
                        banner=f"No GPU here: playing the embedded demo (recorded on an H200). {e}")
    require_terminal(session)  # before the notes below: one line, not three
    _on_finding(args, session, headless=False)
    banner = None if session.monitor.info.gpus else "No NVIDIA GPU visible: showing the host and the process only."
    if args.pid is not None and (note := _probe_dir_note()):
        echo(note)
        banner = note
    if args.pid is not None and session.monitor.info.gpus:
        note = _gpu_use_note(session, args.pid)
        if note:
            echo(note)
            banner = note
    return _run_app(args, session, banner=banner)


def _probe_dir_note() -> str | None:
    """One line when the usual probe directory is another user's (or a symlink): probes there are
    not read. Jobs started by `traintop run` say where theirs is, and are still found."""
    from traintop.injob.agent import private_dir_problem, probe_dir
    from traintop.text import one_line

    path = probe_dir()
    problem = private_dir_problem(path) if os.path.lexists(path) else None
    if problem is None:
        return None
    return one_line(f"{problem}: probes there are not read (remove it, or set XDG_RUNTIME_DIR); "
                    "jobs started by traintop run are still found")


def _gpu_use_note(session, pid: int) -> str | None:
    """One line when the attached process holds no GPU memory (it may not have started yet).

    The sample taken to find out is the session's first, not thrown away."""
    try:
        frame = session.feed.source.next_frame()
    except Exception:
        return None
    session.monitor.ingest(frame)
    pids = {m.pid for m in frame.process.members} | {pid} if frame.process else {pid}
    if any(p.pid in pids for g in frame.gpus for p in g.processes):
        return None
    return (f"PID {pid} uses no GPU yet (NVML lists no memory for it or its children); "
            "watching it anyway — a job that stays so is training on the CPU")


DEMO_BANNER = "Demo: a real H200 session, replayed in a loop."


def cmd_demo(args) -> int:
    from traintop.watch import sessions

    return _run_app(args, sessions.demo_session(config=args.thresholds), banner=DEMO_BANNER)


def cmd_simulate(args) -> int:
    from traintop.watch import sessions

    if args.record is not None:
        require_terminal()  # before the recording is created: nothing left behind to remove
    session = sessions.simulated_session(args.scenario, gpus=args.gpus, seed=args.seed,
                                         interval=args.interval, record=args.record, config=args.thresholds)
    _on_finding(args, session, headless=False)
    return _run_app(args, session)


def cmd_run(args) -> int:
    from traintop.watch import sessions
    from traintop.watch.job import forward_signals
    from traintop.watch.launch import launch, private_base
    from traintop.text import one_line

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    ui = not args.no_ui and has_terminal()
    if args.record is not None and os.path.lexists(args.record):  # before the job starts, not after
        raise TraintopError(f"{args.record} already exists; choose another name (recordings are never overwritten)")
    base, note = private_base()
    if note:
        echo(one_line(note))
    job = launch(cmd, args.log, base=base, passthrough=not ui)
    # Signals from now on reach the job (a batch system's SIGTERM must not orphan it).
    restore = forward_signals(job, args.grace, then=None)
    try:
        where = f"its output goes to {job.log_path}" if ui else f"its output is also in {job.log_path}"
        if job.log_appended:
            where += " (after what that file held: an existing log is appended to, never cut)"
        echo(f"started PID {job.pid} with the probe: {one_line(shlex.join(cmd), 200)}; {where}")
        if not ui and not args.no_ui:
            echo("no terminal here: running without the dashboard (as with --no-ui)")
        try:
            session = sessions.live_session(args.interval, pid=job.pid, record=args.record, require_gpu=False,
                                            config=args.thresholds, probe_dir=base, own_child=True,
                                            only_gpus=args.only_gpus, capture=not args.no_capture)
        except BaseException:
            job.forward(signal.SIGTERM, 2.0)  # nothing will watch it: do not leave it running
            job.watch()
            job.finish()
            raise
        session.attach_job(job)
        _on_finding(args, session, headless=not ui)
        job.watch()
        if ui:
            return _run_job_in_app(args, job, session)
        return _run_job_headless(args, job, session)
    finally:
        restore()


MAX_SUMMARY_FINDINGS = 8


def findings_summary(alerts, captures=(), recorded: str | None = None) -> list[str]:
    """Headless, at the job's end: what was found while it ran (warnings and worse, not the ones a
    stronger finding explains), and where the evidence taken for them is; one line each.
    ``recorded``: the recording of this run, if one was kept (the last line names it)."""
    import shlex

    from traintop.findings import Severity
    from traintop.text import one_line
    from traintop.units import fmt_clock, fmt_duration

    shown = [a for a in alerts if a.severity >= Severity.WARNING and not a.explained_by]
    out = []
    for a in shown[:MAX_SUMMARY_FINDINGS]:
        took = f"for {fmt_duration(a.end - a.start)}" if a.end is not None else "until the end"
        out.append(f"found: [{a.severity.label}] {one_line(a.title, 100)} ({one_line(a.subject, 40)}, from "
                   f"{fmt_clock(a.start)} {took})")
    if len(shown) > MAX_SUMMARY_FINDINGS:
        out.append(f"found: {len(shown) - MAX_SUMMARY_FINDINGS} more")
    for c in list(captures)[-4:]:
        where = one_line(c.error or c.path or "", 300)
        out.append(f"evidence: {c.kind} on {one_line(c.reason or 'a finding', 100)}: {where}")
    if shown and recorded:
        out.append(f"`traintop analyze {one_line(shlex.quote(recorded), 300)}` gives the evidence and what to try")
    elif shown:  # nothing was recorded: say how to keep the next run
        out.append("with --record FILE, `traintop analyze FILE` gives the evidence and what to try")
    return out


def _run_job_headless(args, job, session) -> int:
    monitor = session.monitor
    try:
        session.start()
        job.finish()
        job.drain_output()
        _wait_for_tick(session.feed, timeout=max(2.0, 3 * args.interval))  # a last sample shows the end
    finally:
        session.close()
    _hook_summary(session)
    recorded = args.record if args.record and not monitor.recording_error else None
    for line in findings_summary(monitor.engine.alerts, monitor.captures, recorded):
        echo(line)
    end = job.end
    saved = f"; recorded to {args.record}" if args.record and not monitor.recording_error else ""
    echo(f"{end.describe()}{saved}")
    if monitor.recording_error:
        echo(monitor.recording_error)
    return end.status


def _run_job_in_app(args, job, session) -> int:
    import asyncio

    from traintop.watch.job import forward_signals

    def close_app(app):
        def on_signal(_signum):
            try:
                asyncio.get_running_loop().call_soon_threadsafe(app.exit)
            except RuntimeError:  # the app is not running (yet, or any more)
                pass
        # Replaces the handlers installed by cmd_run (which restores the originals at the end).
        forward_signals(job, args.grace, then=on_signal)

    # Said in turn where the top line is short: the PID, then the log (its path whole), then q.
    banner = f"Job started (PID {job.pid}). Its output goes to: {job.log_path}. " \
             "? says it again; q asks whether to stop the job."
    _run_app(args, session, prepare=close_app, banner=banner)
    if job.end is None and not job.signals_received:
        echo(f"the job (PID {job.pid}) goes on; its output: {job.log_path}")
        return 0
    if job.end is None:
        echo(f"stopping the job (PID {job.pid}): SIGTERM sent, SIGKILL in {args.grace:g} s if any of it is left")
    end = job.finish()
    echo(end.describe())
    return end.status


def _wait_for_tick(feed, timeout: float) -> None:
    ticks, deadline = feed.ticks, time.monotonic() + timeout
    while feed.ticks <= ticks and time.monotonic() < deadline:
        time.sleep(0.02)


def _fields(args) -> list[str] | None:
    return [f.strip() for f in args.fields.split(",") if f.strip()] if getattr(args, "fields", None) else None


def cmd_doctor(args) -> int:
    from traintop.reports import doctor

    from traintop.watch.config import load_thresholds

    try:  # a bad config file stops every other command: doctor runs and says what is wrong with it
        load_thresholds()
        config_error = None
    except TraintopError as e:
        config_error = str(e)
    checks = doctor.run(args.python, config_error=config_error)
    print(doctor.to_json(checks) if args.json else doctor.render(checks))
    return 1 if any(c.status == doctor.FAIL for c in checks) else 0


def cmd_analyze(args) -> int:
    from traintop.watch import sessions
    from traintop.reports.analyze import analyze, render_json, render_text
    from traintop.rules import Severity

    if args.prometheus:
        from traintop.cluster.commands import cmd_analyze_prometheus

        return cmd_analyze_prometheus(args)
    if not args.file:
        raise TraintopError("analyze needs a FILE (a recording or an nvidia-smi log), or --prometheus URL")
    ranged = [flag for flag, value in (("--since", args.since), ("--until", args.until), ("--job", args.job),
                                       ("--step", args.step)) if value is not None]
    if ranged:
        verb = "picks" if len(ranged) == 1 else "pick"
        raise TraintopError(f"{', '.join(ranged)} {verb} a time range of --prometheus URL: a FILE is analyzed whole")
    source = sessions.open_source(args.file, _fields(args))
    report = analyze(source, config=args.thresholds, name=os.path.basename(args.file), rerun=args.rerun)
    print(render_json(report) if args.json else render_text(report))
    worst = report.worst()
    if args.fail_on and worst is not None and worst >= Severity.parse(args.fail_on):
        return 1
    return 0


def cmd_replay(args) -> int:
    from traintop.watch import sessions

    from traintop.reports.analyze import damage_summary

    session = sessions.replay_session(args.file, speed=args.speed, fields=_fields(args), config=args.thresholds)
    damage = damage_summary(cast("ReplayFeed", session.feed).reader)
    return _run_app(args, session, banner=f"Replaying {os.path.basename(args.file)}. {damage + ' ' if damage else ''}"
                    "space: pause  ← →: seek  [ ]: speed  ?: help")


def cmd_record(args) -> int:
    from traintop.watch import sessions

    if args.fast and not (args.simulate and args.duration):
        raise TraintopError("--fast needs --simulate and --duration")
    if args.simulate and args.pid is not None:
        raise TraintopError("--pid watches a real process: it does not go with --simulate")
    if args.simulate and args.only_gpus is not None:
        raise TraintopError("--only-gpus picks real GPUs: it does not go with --simulate (use --gpus)")
    if args.file is None and args.jsonl is None:
        raise TraintopError("record needs a FILE to record to, or --jsonl OUT (- for standard output), or both")
    stream_out = _stream_target(args.jsonl) if args.jsonl is not None else None  # refused before anything starts
    try:
        if args.simulate:
            session = sessions.simulated_session(args.simulate, gpus=args.gpus, seed=args.seed,
                                                 interval=args.interval, history_s=0, record=args.file,
                                                 realtime=not args.fast, config=args.thresholds)
        else:
            session = sessions.live_session(args.interval, pid=args.pid, record=args.file, require_gpu=False,
                                            config=args.thresholds, only_gpus=args.only_gpus,
                                            capture=not args.no_capture)
    except BaseException:
        if stream_out is not None and stream_out is not sys.stdout:  # made for this run, still empty
            stream_out.close()
            os.unlink(args.jsonl)
        raise
    _on_finding(args, session, headless=True)
    monitor, feed = session.monitor, cast("SourceFeed", session.feed)  # live or simulated
    stream = session.stream_samples(stream_out) if stream_out is not None else None
    say = (lambda *a: None) if args.quiet else echo
    n_gpus = len(monitor.info.gpus)
    what = f"{n_gpus} GPU{'s' if n_gpus != 1 else ''}"
    if not n_gpus:
        why = monitor.info.extra.get("no_gpu") or "NVML sees no GPU"
        what = f"no GPU ({why}): the host{f' and PID {args.pid}' if args.pid else ''} only,"
    where = " and ".join(w for w in (args.file, args.jsonl and ("standard output as JSON lines" if args.jsonl == "-"
                                                               else f"{args.jsonl} as JSON lines")) if w)
    say(f"recording {what} every {args.interval:g} s to {where}" + ("" if args.duration else "; Ctrl-C stops"))

    def failed() -> bool:
        return monitor.recording_error is not None or (stream is not None and (stream.closed_by_reader
                                                                             or stream.error is not None))
    try:
        if args.fast:
            for _ in range(int(args.duration / args.interval)):
                feed.step()
                if failed():
                    break  # headless recording has nothing left to do
        else:
            _record_until_stopped(feed, args.duration, failed)
    finally:
        session.close()
    _hook_summary(session)
    if monitor.recording_error:
        raise TraintopError(f"{monitor.recording_error} (samples up to the error are kept)")
    if stream is not None and stream.error:
        raise TraintopError(f"writing {args.jsonl} failed: {stream.error} ({stream.written} sample(s) written)")
    alerts = monitor.engine.alerts
    if args.file:
        say(f"saved {monitor.store.frames_seen} samples and {len(alerts)} alert(s) to {args.file}")
    if stream is not None:
        lost = f"; {stream.dropped} dropped while the reader fell behind" if stream.dropped else ""
        ended = "; the reader closed the stream" if stream.closed_by_reader else ""
        say(f"streamed {stream.written} sample(s){lost}{ended}")
        if stream.closed_by_reader:
            return 141  # as every command whose reader went away (`yes | head`)
    return 0


def _stream_target(target: str):
    """``--jsonl OUT``: standard output for -, else a new file (never an existing one)."""
    from traintop.files import create_new

    return sys.stdout if target == "-" else create_new(target, "--jsonl")


def _record_until_stopped(feed, duration: float | None, failed=lambda: False) -> None:
    done = threading.Event()

    def stop(*_):
        done.set()

    old = signal.signal(signal.SIGTERM, stop)
    try:
        # Woken by a signal, by the feed after a tick that failed, or at the deadline: no
        # polling (an idle recorder wakes once per sample, not five times a second more).
        feed.start(notify=lambda: done.set() if failed() else None)
        deadline = time.monotonic() + duration if duration else None
        while not done.is_set() and not failed():
            if deadline is not None and time.monotonic() >= deadline:
                break
            done.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, old)


def cmd_config(args) -> int:
    from traintop.watch.config import default_path, describe_thresholds

    print(describe_thresholds(args.thresholds, args.config or default_path()))
    return 0


# -- commands: one add_NAME (its parser) and one cmd_NAME (what it does) each ------------------

def add_demo(sub) -> None:
    p = sub.add_parser("demo", help=SUMMARIES["demo"],
                       description="Play the embedded demo: a real H200 training run, replayed in a loop.")
    add_display(p)
    add_thresholds(p)
    p.set_defaults(handler=cmd_demo)


def add_simulate(sub) -> None:
    from traintop.collectors.simulated import SCENARIO_HELP

    scen = "; ".join(f"{k}: {v}" for k, v in SCENARIO_HELP.items())
    p = sub.add_parser("simulate", help=SUMMARIES["simulate"],
                       description="Watch a seeded simulator play a pathology in the dashboard.")
    g = p.add_argument_group("simulator")
    g.add_argument("--scenario", default="starved", metavar="NAME",
                   help=_help(f"one name, or one per GPU separated by commas (default starved). {scen}"))
    g.add_argument("--gpus", type=_positive_int, default=1, metavar="N", help="simulated GPUs (default 1)")
    g.add_argument("--seed", type=int, default=0, metavar="N", help="random seed: the same seed plays the same run")
    add_sampling(p, pid=False, gpus=False)
    add_display(p)
    add_output(p)
    add_thresholds(p)
    add_finding_hook(p)
    p.set_defaults(handler=cmd_simulate)


def add_record(sub) -> None:
    p = sub.add_parser("record", help=SUMMARIES["record"],
                       description="Record headless (no UI) until Ctrl-C, SIGTERM or --duration: to a "
                       "recording FILE, as JSON lines (--jsonl), or both.")
    p.add_argument("file", metavar="FILE", nargs="?", help="the recording to create (never overwritten)")
    g = p.add_argument_group("recording")
    g.add_argument("--jsonl", metavar="OUT", help="also (or only) stream each sample as a JSON line to OUT "
                   "(- for standard output; schema: docs/EXPORT.md); a reader that falls behind loses lines")
    g.add_argument("--duration", type=_seconds, metavar="S", help="stop after this many seconds")
    g.add_argument("--quiet", action="store_true", help="print nothing unless something fails")
    g.add_argument("--no-capture", action="store_true", default=argparse.SUPPRESS, dest="no_capture",
                   help="never ask the job's probe for evidence when a finding starts (see traintop --help)")
    g = p.add_argument_group("simulator")
    g.add_argument("--simulate", metavar="SCENARIO", help="record the simulator instead of real GPUs")
    g.add_argument("--gpus", type=_positive_int, default=1, metavar="N", help="simulated GPUs (with --simulate)")
    g.add_argument("--seed", type=int, default=0, metavar="N", help="the simulator's random seed (with --simulate)")
    g.add_argument("--fast", action="store_true", help="with --simulate: generate --duration seconds at once")
    add_sampling(p)
    add_thresholds(p)
    add_finding_hook(p)
    p.set_defaults(handler=cmd_record)


def add_run(sub) -> None:
    from traintop.watch.job import DEFAULT_GRACE_S

    p = sub.add_parser("run", help=SUMMARIES["run"],
                       description="Start a training command with the probe injected (no code change) and "
                       "watch it. Options of traintop go before `--`; everything after it is the command.")
    g = p.add_argument_group("job")
    g.add_argument("--no-ui", action="store_true",
                   help="no dashboard: wait for the job (with --record to keep what was seen)")
    g.add_argument("--log", metavar="FILE", help="the job's output (default: a new file in traintop's private "
                   "directory); without the dashboard the output also goes to traintop's stdout and stderr")
    g.add_argument("--grace", type=_seconds, default=DEFAULT_GRACE_S, metavar="S",
                   help="SIGTERM, SIGHUP or SIGINT to traintop is passed on to the whole job, which gets this "
                   f"long to stop before SIGKILL (default {DEFAULT_GRACE_S:g})")
    add_sampling(p, pid=False)
    add_display(p)
    add_output(p)
    add_thresholds(p)
    add_finding_hook(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...", help="the training command")
    # argparse shows a REMAINDER as "...": name it, after the options it generated.
    p.usage = p.format_usage().removeprefix("usage: ").rstrip().removesuffix("...").rstrip() + " -- COMMAND ..."
    p.set_defaults(handler=cmd_run)


def add_doctor(sub) -> None:
    p = sub.add_parser("doctor", help=SUMMARIES["doctor"],
                       description="Preflight checks, each pass/warn/fail with the fix.")
    p.add_argument("--python", metavar="PATH", help="the training environment's python (default: this one)")
    p.add_argument("--json", action="store_true", help="JSON instead of text")
    p.set_defaults(handler=cmd_doctor)


def add_analyze(sub) -> None:
    from traintop.cluster.commands import add_analyze_options

    p = sub.add_parser("analyze", help=SUMMARIES["analyze"],
                       description="Report the findings of a recording, an nvidia-smi log or a time range of a "
                       "cluster in Prometheus (no UI).")
    p.add_argument("file", metavar="FILE", nargs="?",
                   help="a traintop recording (.ttrec) or an nvidia-smi CSV/dmon log")
    add_analyze_options(p)
    g = p.add_argument_group("report")
    g.add_argument("--json", action="store_true", help="JSON instead of text")
    g.add_argument("--fail-on", choices=["info", "warning", "critical"],
                   help="exit 1 if a finding is at least this severe (for CI)")
    g.add_argument("--fields", metavar="F1,F2,...", help="field names, in order, of a header-less nvidia-smi CSV")
    g.add_argument("--rerun", action="store_true",
                   help="re-run the rules even where the recording's own alerts apply (same rules, same thresholds)")
    add_thresholds(p)
    p.set_defaults(handler=cmd_analyze)


def add_replay(sub) -> None:
    p = sub.add_parser("replay", help=SUMMARIES["replay"],
                       description="Replay a recording or an nvidia-smi log in the dashboard.")
    p.add_argument("file", metavar="FILE", help="a traintop recording (.ttrec) or an nvidia-smi CSV/dmon log")
    g = p.add_argument_group("replay")
    g.add_argument("--fields", metavar="F1,F2,...", help="field names, in order, of a header-less nvidia-smi CSV")
    g.add_argument("--speed", type=_speed, default=1.0, metavar="X", help="playback speed (default 1)")
    add_display(p)
    add_thresholds(p)
    p.set_defaults(handler=cmd_replay)


def add_config(sub) -> None:
    p = sub.add_parser("config", help=SUMMARIES["config"],
                       description="List every rule threshold: its name, its default and the value in effect "
                       "(after the config file and --set).")
    add_thresholds(p)
    p.set_defaults(handler=cmd_config)


def cmd_cluster(args) -> int:
    from traintop.app.cluster import ClusterApp
    from traintop.cluster.commands import cluster_source

    require_terminal()  # before Prometheus is asked: without a terminal nothing else matters
    source = cluster_source(args)  # a wrong URL or an empty Prometheus is said before the screen is taken
    try:
        app = ClusterApp(source, url=source.prom.shown, job=args.job, refresh=args.refresh)
        app.run()
    finally:
        source.close()
    if app.failure:
        raise TraintopError(app.failure)
    return app.return_code or 0


def add_agent(sub) -> None:
    from traintop.cluster.commands import add_agent as add

    add(sub)


def add_cluster(sub) -> None:
    from traintop.cluster.commands import add_cluster as add

    add(sub, cmd_cluster)


def _add_snapshot(sub) -> None:
    from traintop.reports.export_commands import add_snapshot

    add_snapshot(sub)


def _add_export(sub) -> None:
    from traintop.reports.export_commands import add_export

    add_export(sub)


COMMANDS = {"demo": add_demo, "simulate": add_simulate, "record": add_record, "replay": add_replay, "run": add_run,
            "analyze": add_analyze, "doctor": add_doctor, "config": add_config, "agent": add_agent,
            "cluster": add_cluster, "snapshot": _add_snapshot, "export": _add_export}
EVERY = "*"


def build_parser(command: str | None = EVERY) -> argparse.ArgumentParser:
    """The parser; with ``command`` (a name, or None for the live view) only that command's
    own parser is built in full, the others as one-line placeholders."""
    p = _Parser(prog="traintop",
                description="A terminal dashboard for GPU training jobs that explains what it sees. "
                "With no command: watch the GPUs live (the embedded demo where no NVIDIA GPU is visible). "
                "A command's options go after it; those it shares with the live view may also come before "
                "it (traintop --interval 1 simulate).")
    p.add_argument("--version", action="version", version=f"traintop {__version__}",
                   help="print the version and exit")
    add_live_options(p, prefix=BEFORE)
    p.set_defaults(handler=cmd_live)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, add in COMMANDS.items():
        if command in (EVERY, name):
            add(sub)
            subparsers(p)[name].epilog = docs_epilog(name)
        else:
            sub.add_parser(name, help=SUMMARIES[name], add_help=False)
    p.epilog = docs_epilog(None)
    return p


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _option_dests(parser: argparse.ArgumentParser) -> set[str]:
    return {a.dest for a in parser._actions if a.option_strings}


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _option(parser: argparse.ArgumentParser, word: str) -> argparse.Action | None:
    """The option ``word`` (``--name`` or ``--name=value``) names, as argparse reads it: the whole
    name or an unambiguous start of one."""
    name = word.split("=", 1)[0]
    known = parser._option_string_actions
    if name in known:
        return known[name]
    starts = {known[o] for o in known if name.startswith("--") and o.startswith(name)}
    return starts.pop() if len(starts) == 1 else None


def _unknown_word(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """What is wrong before the command, said as the user typed it: an option that is none (argparse
    would take its value for the command: "invalid choice: 'x.ttrec'") or a command that is none."""
    k = 0
    while k < len(argv):
        word = argv[k]
        if word == "--":
            return None
        if word.startswith("-") and word != "-":
            action = _option(parser, word)
            if action is None:
                name = word.split("=", 1)[0]
                if any(w in COMMANDS for w in argv[k + 1:]):
                    return None  # perhaps the command's own option, put before it: said below
                if name.startswith("--") and any(o.startswith(name) for o in parser._option_string_actions):
                    return None  # the start of several: argparse names them
                return f"unknown option {name}{_did_you_mean(name, parser._option_string_actions)}"
            k += 1 if "=" in word or action.nargs == 0 else 2
            continue
        if word in COMMANDS:
            return None
        hint = _did_you_mean(word, COMMANDS)
        if not hint and (word.endswith((".ttrec", ".csv", ".log")) or os.path.isfile(word)):
            hint = f" (to replay a recording or an nvidia-smi log: traintop replay {word})"
        return f"unknown command {word!r}{hint or ' (commands: ' + ', '.join(COMMANDS) + ')'}"
    return None


def _extra_argument(parser: argparse.ArgumentParser, cmd_parser: argparse.ArgumentParser, command: str | None,
                    extra: list[str]) -> str:
    """One line for what the command's parser did not take."""
    bad = next((a for a in extra if a.startswith("-")), extra[0])
    name = bad.split("=", 1)[0]
    where = f"traintop {command}" if command else "traintop"
    if not bad.startswith("-"):
        hint = f"--scenario {bad}" if command == "simulate" else f"{where} --help"
        return f"unexpected argument {bad!r} for `{where}` (see {hint})"
    if command and _option(cmd_parser, bad) is not None:  # given before the command
        return f"{name} is an option of `{where}`: put it after the command ({where} {name} ...)"
    if _option(parser, bad) is not None:  # the live view's
        return f"{name} is not an option of `{where}` (see {where} --help)"
    own = list(cmd_parser._option_string_actions)
    close = difflib.get_close_matches(name, own + list(parser._option_string_actions), n=1)
    if close and close[0] in own:
        return f"unknown option {name} (did you mean {close[0]}?)"
    if close:  # it looks like one of the live view's
        return f"unknown option {name} (`{where}` has no {close[0]} either: see {where} --help)"
    return f"unknown option {name} for `{where}` (see {where} --help)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    # Which command: parsed with every command a placeholder (they take anything); then
    # parsed for real with that command's parser.
    argv = _join_dashed_values(list(sys.argv[1:] if argv is None else argv))
    first = build_parser(None)
    if (wrong := _unknown_word(first, argv)) is not None:
        first.exit(2, f"traintop: {plain(wrong)}\n")
    command = first.parse_known_args(argv)[0].command
    parser = build_parser(command)
    args, extra = parser.parse_known_args(argv)
    command = args.command
    cmd_parser = subparsers(parser)[command] if command else parser  # argparse took only a command it has
    if extra:
        cmd_parser.exit(2, f"traintop: {plain(_extra_argument(parser, cmd_parser, command, extra))}\n")
    given = {k[len(BEFORE):]: v for k, v in vars(args).items() if k.startswith(BEFORE)}
    for k in list(vars(args)):
        if k.startswith(BEFORE):
            delattr(args, k)
    accepted = {d for d in _option_dests(cmd_parser) if not d.startswith(BEFORE)} if command else set(given) | set(DEFAULTS)
    for key, value in given.items():
        if key not in accepted:
            flag = "--" + key.replace("_", "-")
            parser.exit(2, f"traintop: {flag} does not apply to `traintop {command}` "
                           f"(see traintop {command} --help)\n")
        if key == "set" and hasattr(args, "set"):
            args.set = value + args.set
        elif not hasattr(args, key):
            setattr(args, key, value)  # after the command wins over before it
    for key, value in DEFAULTS.items():
        if key in accepted and not hasattr(args, key):
            setattr(args, key, value)
    return args


# what the commands over many hosts import (pyproject.toml's `cluster` extra); a dashboard
# install has neither, and the command that needs one says so (raised from parsing too)
CLUSTER_EXTRA = ("prometheus_client", "httpx")


class _Stdout:
    """Standard output, noting a write that fails: ``main`` tells a full or closed standard output
    (one line, or quiet for a reader gone) from any other error."""

    def __init__(self, out) -> None:
        self._out = out
        self.failed: OSError | None = None

    def write(self, text: str) -> int:
        try:
            return self._out.write(text)
        except OSError as e:
            self.failed = e
            raise

    def flush(self) -> None:
        try:
            self._out.flush()
        except OSError as e:
            self.failed = e
            raise

    def __getattr__(self, name: str):
        return getattr(self._out, name)


def main(argv: list[str] | None = None) -> int:
    """Every command ends here: a standard output that is closed (`traintop config | head -2`) ends it
    quietly with 141, as a command killed by SIGPIPE; one that is full or fails (a full disk,
    /dev/full) with one line and exit 2 — never a traceback."""
    real = sys.stdout
    if real is not None and hasattr(real, "reconfigure"):
        # a standard output that cannot encode "—" or "→" (PYTHONIOENCODING=ascii, a Latin-1 locale)
        # shows them as \u2014, as Python's own stderr does: never a traceback, nothing lost
        real.reconfigure(errors="backslashreplace")
    out = _Stdout(real) if real is not None else None
    sys.stdout = out
    try:
        try:
            code = _main(argv)
        except SystemExit as e:  # argparse's --help and --version (its usage errors are said already)
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
        if out is None:
            return code
        seen = out.failed  # a failure the command met itself: record --jsonl says so, and fails
        try:
            out.flush()  # a reader that went away is found here, not in the interpreter's last flush
        except OSError:
            pass
        if out.failed is None:
            return code
        _stdout_to_devnull()
        return code if seen is not None and code != 0 else _stdout_failed(out.failed)
    except ModuleNotFoundError as e:
        missing = (e.name or "").partition(".")[0]
        if missing not in CLUSTER_EXTRA:
            raise
        echo(f"this command needs traintop's cluster extra ({missing} is not installed): "
             "pip install 'traintop[cluster]'")
        return 2
    except OSError as e:
        if out is not None and out.failed is not None:
            _stdout_to_devnull()
            return _stdout_failed(out.failed)
        if isinstance(e, BrokenPipeError):  # a pipe of the command's own (the hook, the job): as before
            _stdout_to_devnull()
            return 141
        raise
    finally:
        sys.stdout = real


def _stdout_failed(e: OSError) -> int:
    if isinstance(e, BrokenPipeError):
        # the reader has what it wanted: no traceback, no line; exit as `yes | head` does (128 + 13)
        return 141
    echo(f"cannot write to standard output: {e.strerror or e}")
    return 2


def _stdout_to_devnull() -> None:
    """What is still buffered for a closed pipe goes nowhere (Python would otherwise say so at exit)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    try:
        if hasattr(args, "config"):
            from traintop.watch.config import load_thresholds

            args.thresholds = load_thresholds(args.config, args.set)
        return args.handler(args)
    except TraintopError as e:
        echo(str(e))
        return 2
    except KeyboardInterrupt:
        return 130
