"""The one entry point: live (default), demo, simulate, record, replay."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

from traintop import __version__
from traintop.errors import NoGpuError, TraintopError
from traintop.text import plain


def echo(message: str) -> None:
    """One line to stderr. Messages quote file names, commands and file content: control
    characters in them are shown, never sent to the terminal as such."""
    print(f"traintop: {plain(message)}", file=sys.stderr)


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {v}")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < v < 1000:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1000, got {text!r}")
    return v


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return v


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, like every other error
        self.exit(2, f"traintop: {plain(message)} (see traintop --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from traintop.collectors.simulated import SCENARIO_HELP

    # Options shared by every command, accepted before or after it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--interval", type=_seconds, default=argparse.SUPPRESS,
                        help="seconds between samples (default 0.5)")
    common.add_argument("--fps", type=_positive_float, default=argparse.SUPPRESS,
                        help="most screen redraws a second (default 2); sampling and recording keep --interval")
    common.add_argument("--pid", type=_positive_int, default=argparse.SUPPRESS,
                        help="attach to this training process (and its workers)")
    common.add_argument("--record", metavar="FILE", default=argparse.SUPPRESS,
                        help="also record the session to FILE")
    common.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                        help="rule thresholds (default: ~/.config/traintop/config.toml if it exists)")
    common.add_argument("--set", metavar="NAME=NUMBER", action="append", default=argparse.SUPPRESS,
                        help="override one threshold (repeatable)")

    p = _Parser(prog="traintop", parents=[common],
                description="A terminal dashboard for GPU training jobs that explains what it sees. "
                "With no command: watch the GPUs live (the embedded demo where no NVIDIA GPU is visible).")
    p.add_argument("--version", action="version", version=f"traintop {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    sub.add_parser("demo", parents=[common], help="play the embedded demo (a recorded H200 session)")

    scen = "; ".join(f"{k}: {v}" for k, v in SCENARIO_HELP.items())
    s = sub.add_parser("simulate", parents=[common], help="watch a simulated GPU play a pathology")
    s.add_argument("--scenario", default="starved", help=f"one name, or one per GPU separated by commas ({scen})")
    s.add_argument("--gpus", type=_positive_int, default=1)
    s.add_argument("--seed", type=int, default=0)

    r = sub.add_parser("record", parents=[common], help="record headless (no UI) until Ctrl-C or --duration")
    r.add_argument("file")
    r.add_argument("--duration", type=_seconds, help="stop after this many seconds")
    r.add_argument("--simulate", metavar="SCENARIO", help="record the simulator instead of real GPUs")
    r.add_argument("--gpus", type=_positive_int, default=1, help="simulated GPUs (with --simulate)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--fast", action="store_true", help="with --simulate: generate --duration seconds at once")
    r.add_argument("--quiet", action="store_true")

    run = sub.add_parser("run", parents=[common], help="start a training command with the probe and attach to it",
                         usage="traintop run [--record FILE] [--no-ui] [--log FILE] -- COMMAND ...")
    run.add_argument("--no-ui", action="store_true", help="no dashboard: wait for the job (with --record)")
    run.add_argument("--log", metavar="FILE", help="the job's output (default: a file in traintop's private directory)")
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="COMMAND")

    dr = sub.add_parser("doctor", parents=[common], help="preflight: GPU visible, driver vs torch, a step on cuda")
    dr.add_argument("--python", help="the training environment's python (default: this one)")
    dr.add_argument("--json", action="store_true")

    an = sub.add_parser("analyze", parents=[common],
                        help="report the findings of a recording or an nvidia-smi log (no UI)")
    an.add_argument("file")
    an.add_argument("--json", action="store_true", help="JSON instead of text")
    an.add_argument("--fail-on", choices=["info", "warning", "critical"],
                    help="exit 1 if a finding is at least this severe (for CI)")
    an.add_argument("--fields", help="field names, in order, of a header-less nvidia-smi CSV")
    an.add_argument("--rerun", action="store_true",
                    help="re-run the rules even where the recording's own alerts apply (same rules, same thresholds)")

    rp = sub.add_parser("replay", parents=[common], help="replay a recording or an nvidia-smi log in the dashboard")
    rp.add_argument("file")
    rp.add_argument("--fields", help="field names, in order, of a header-less nvidia-smi CSV")
    rp.add_argument("--speed", type=_seconds, default=1.0, help="playback speed (default 1)")
    return p


def _run_app(args, monitor, feed, mode: str, banner: str | None = None) -> int:
    from traintop.app.factory import build_app

    app = build_app(monitor, feed, mode=mode, banner=banner, max_fps=args.fps)
    app.run()
    if monitor.recording_error:
        echo(monitor.recording_error)
    if monitor.recorder is not None and not monitor.recording_error:
        echo(f"recording saved to {monitor.recorder.path}")
    return app.return_code or 0  # 1 after an uncaught exception (Textual printed it)


def cmd_live(args) -> int:
    from traintop import sessions

    explicit = args.pid is not None or args.record is not None
    try:
        monitor, feed = sessions.live_session(args.interval, pid=args.pid, record=args.record,
                                              require_gpu=not explicit, config=args.thresholds)
    except NoGpuError as e:
        echo(f"{e}; playing the embedded demo (a recorded H200 session) instead.")
        monitor, feed = sessions.demo_session()
        return _run_app(args, monitor, feed, "demo", banner="No NVIDIA GPU here: this is a recorded H200 session.")
    banner = None if monitor.info.gpus else "No NVIDIA GPU visible: showing the host and the process only."
    if args.pid is not None and monitor.info.gpus:
        note = _gpu_use_note(monitor, feed, args.pid)
        if note:
            echo(note)
            banner = note
    return _run_app(args, monitor, feed, "live", banner=banner)


def _gpu_use_note(monitor, feed, pid: int) -> str | None:
    """One line when the attached process holds no GPU memory (it may not have started yet).

    The sample taken to find out is the session's first, not thrown away."""
    try:
        frame = feed.source.next_frame()
    except Exception:
        return None
    monitor.ingest(frame)
    pids = {m.pid for m in frame.process.members} | {pid} if frame.process else {pid}
    if any(p.pid in pids for g in frame.gpus for p in g.processes):
        return None
    return (f"PID {pid} uses no GPU yet (NVML lists no memory for it or its children); "
            "watching it anyway — a job that stays so is training on the CPU")


def cmd_demo(args) -> int:
    from traintop import sessions

    monitor, feed = sessions.demo_session()
    return _run_app(args, monitor, feed, "demo", banner="Demo: a recorded H200 session, replayed in a loop.")


def cmd_simulate(args) -> int:
    from traintop import sessions

    monitor, feed = sessions.simulated_session(args.scenario, gpus=args.gpus, seed=args.seed,
                                               interval=args.interval, record=args.record, config=args.thresholds)
    return _run_app(args, monitor, feed, "simulated")


def cmd_run(args) -> int:
    from traintop import sessions
    from traintop.launch import launch

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    proc, log = launch(cmd, args.log)
    echo(f"started PID {proc.pid} with the probe: {' '.join(cmd)}; its output goes to {log}")
    monitor, feed = sessions.live_session(args.interval, pid=proc.pid, record=args.record, require_gpu=False,
                                          config=args.thresholds)
    if args.no_ui:
        try:
            feed.start()
            rc = proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            rc = proc.wait()
        finally:
            time.sleep(args.interval * 2)  # a last sample shows the end
            feed.stop()
            monitor.close()
        echo(f"the job exited with {rc}" + (f"; recorded to {args.record}" if args.record else ""))
        return rc
    _run_app(args, monitor, feed, "live")
    if proc.poll() is None:
        echo(f"the job (PID {proc.pid}) goes on; its output: {log}")
    return 0


def _fields(args) -> list[str] | None:
    return [f.strip() for f in args.fields.split(",") if f.strip()] if getattr(args, "fields", None) else None


def cmd_doctor(args) -> int:
    from traintop import doctor

    checks = doctor.run(args.python)
    print(doctor.to_json(checks) if args.json else doctor.render(checks))
    return 1 if any(c.status == doctor.FAIL for c in checks) else 0


def cmd_analyze(args) -> int:
    from traintop import sessions
    from traintop.analyze import analyze, render_json, render_text
    from traintop.rules import Severity

    source = sessions.open_source(args.file, _fields(args))
    report = analyze(source, config=args.thresholds, name=os.path.basename(args.file), rerun=args.rerun)
    print(render_json(report) if args.json else render_text(report))
    worst = report.worst()
    if args.fail_on and worst is not None and worst >= Severity.parse(args.fail_on):
        return 1
    return 0


def cmd_replay(args) -> int:
    from traintop import sessions

    monitor, feed = sessions.replay_session(args.file, speed=args.speed, fields=_fields(args),
                                            config=args.thresholds)
    note = f" ({feed.reader.skipped_chunks} damaged chunk(s) skipped)" if feed.reader.skipped_chunks else ""
    return _run_app(args, monitor, feed, "replay", banner=f"Replaying {os.path.basename(args.file)}{note}. "
                    "space: pause  ← →: seek  [ ]: speed  ?: help")


def cmd_record(args) -> int:
    from traintop import sessions

    if args.fast and not (args.simulate and args.duration):
        raise TraintopError("--fast needs --simulate and --duration")
    if args.simulate:
        monitor, feed = sessions.simulated_session(args.simulate, gpus=args.gpus, seed=args.seed,
                                                   interval=args.interval, history_s=0, record=args.file,
                                                   realtime=not args.fast, config=args.thresholds)
    else:
        monitor, feed = sessions.live_session(args.interval, pid=args.pid, record=args.file, require_gpu=False,
                                              config=args.thresholds)
    say = (lambda *a: None) if args.quiet else echo
    n_gpus = len(monitor.info.gpus)
    say(f"recording {n_gpus} GPU{'s' if n_gpus != 1 else ''} every {args.interval:g} s to {args.file}"
        + ("" if args.duration else "; Ctrl-C stops"))
    try:
        if args.fast:
            for _ in range(int(args.duration / args.interval)):
                feed.step()
                if monitor.recording_error:
                    break  # headless recording has nothing left to do
        else:
            _record_until_stopped(feed, args.duration, lambda: monitor.recording_error is not None)
    finally:
        feed.stop()
        monitor.close()
    if monitor.recording_error:
        raise TraintopError(f"{monitor.recording_error} (samples up to the error are kept)")
    alerts = monitor.engine.alerts
    say(f"saved {monitor.store.frames_seen} samples and {len(alerts)} alert(s) to {args.file}")
    return 0


def _record_until_stopped(feed, duration: float | None, failed=lambda: False) -> None:
    done = threading.Event()

    def stop(*_):
        done.set()

    old = signal.signal(signal.SIGTERM, stop)
    try:
        feed.start()
        deadline = time.monotonic() + duration if duration else None
        while not done.is_set() and not failed():
            if deadline is not None and time.monotonic() >= deadline:
                break
            done.wait(0.2 if deadline is None else min(0.2, max(0.0, deadline - time.monotonic())))
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, old)


COMMANDS = {None: cmd_live, "demo": cmd_demo, "simulate": cmd_simulate, "record": cmd_record, "replay": cmd_replay,
            "run": cmd_run, "analyze": cmd_analyze, "doctor": cmd_doctor}


COMMON_DEFAULTS = {"interval": 0.5, "fps": 2.0, "pid": None, "record": None, "config": None, "set": None}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # (set_defaults would leak into the shared option objects and override a value given before the command)
    for key, value in COMMON_DEFAULTS.items():
        if not hasattr(args, key):
            setattr(args, key, value)
    try:
        from traintop.config import load_thresholds

        args.thresholds = load_thresholds(args.config, args.set)
        return COMMANDS[args.command](args)
    except TraintopError as e:
        echo(str(e))
        return 2
    except KeyboardInterrupt:
        return 130
