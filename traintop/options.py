"""The command line's option groups and value types, shared by every command's parser.

The CLI (traintop/cli.py) and the cluster commands (traintop/cluster/commands.py) both build
their parsers from these; neither imports the other's parsers for them.
"""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {v}")
    return v


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < v < 1000:
        raise argparse.ArgumentTypeError(f"expected a number above 0 and below 1000, got {text!r}")
    return v


def seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return v


def speed(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a speed (1 plays in real time, 2 twice as fast), got {text!r}") \
            from None
    if not 0 < v <= 1000:
        raise argparse.ArgumentTypeError(f"expected a speed above 0 and at most 1000 (1 plays in real time), "
                                         f"got {text!r}")
    return v


def gpu_list(text: str) -> frozenset[int]:
    try:
        out = frozenset(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GPU indices like 0,1, got {text!r}") from None
    if not out:
        raise argparse.ArgumentTypeError("names no GPU")
    if min(out) < 0 or max(out) > 1023:
        raise argparse.ArgumentTypeError(f"expected GPU indices like 0,1, got {text!r}")
    return out


def help_text(text: str) -> str:
    """argparse formats help with %: text from elsewhere ("100 % busy") must not be read as a format."""
    return text.replace("%", "%%")


# -- option groups: each command picks the ones that mean something to it ------------------
# Defaults are applied after parsing (an option may come before the command: see main()).
DEFAULTS = {"interval": 0.5, "fps": 1.0, "pid": None, "only_gpus": None, "record": None, "config": None, "set": None,
            "on_finding": None, "no_capture": False}
BEFORE = "before_"  # dest prefix of the options given before the command


def add_sampling(p, *, pid: bool = True, gpus: bool = True, prefix: str = "") -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--interval", type=seconds, metavar="S", default=argparse.SUPPRESS, dest=prefix + "interval",
                   help="seconds between samples (default 0.5)")
    if gpus:
        g.add_argument("--only-gpus", type=gpu_list, metavar="LIST", default=argparse.SUPPRESS,
                       dest=prefix + "only_gpus",
                       help="watch only these GPUs (NVML indices as nvidia-smi numbers them, e.g. 0,3); "
                            "the others are not read at all")
    if pid:
        g.add_argument("--pid", type=positive_int, metavar="N", default=argparse.SUPPRESS, dest=prefix + "pid",
                       help="attach to this training process (and its workers)")


def add_display(p, *, prefix: str = "") -> None:
    g = p.add_argument_group("display")
    g.add_argument("--fps", type=positive_float, metavar="N", default=argparse.SUPPRESS, dest=prefix + "fps",
                   help="most routine screen redraws a second (default 1; a finding that starts or ends is "
                        "drawn at once); sampling and recording keep --interval")


def add_output(p, *, prefix: str = "") -> None:
    g = p.add_argument_group("output")
    g.add_argument("--record", metavar="FILE", default=argparse.SUPPRESS, dest=prefix + "record",
                   help="also record the session to FILE (a new file; never overwritten)")
    g.add_argument("--no-capture", action="store_true", default=argparse.SUPPRESS, dest=prefix + "no_capture",
                   help="never ask the job's probe for evidence when a finding starts (a profiler trace of a "
                        "few steps, a CUDA memory snapshot; by default once per finding, at most one of each "
                        "kind per 10 min, kept beside the recording)")


def add_thresholds(p, *, prefix: str = "") -> None:
    g = p.add_argument_group("thresholds")
    g.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS, dest=prefix + "config",
                   help="rule thresholds (default: ~/.config/traintop/config.toml if it exists)")
    g.add_argument("--set", metavar="NAME=NUMBER", action="append", default=argparse.SUPPRESS, dest=prefix + "set",
                   help="override one threshold (repeatable; `traintop config` lists the names)")


def add_finding_hook(p, *, prefix: str = "") -> None:
    g = p.add_argument_group("alerting")
    g.add_argument("--on-finding", metavar="CMD", default=argparse.SUPPRESS, dest=prefix + "on_finding",
                   help="run CMD with the finding as JSON on stdin when a warning or worse starts or ends "
                   "(never delays sampling; 30 s limit a run; its output goes to on-finding.log in traintop's "
                   "private directory; see docs/ALERTING.md)")


def add_live_options(p, prefix: str = "") -> None:
    add_sampling(p, prefix=prefix)
    add_display(p, prefix=prefix)
    add_output(p, prefix=prefix)
    add_thresholds(p, prefix=prefix)
    add_finding_hook(p, prefix=prefix)


# Each command's one-line help, for the parser of another command: only the command given is
# built in full, so `traintop record` never imports what analyze, cluster or agent need
# (Prometheus client, HTTP server: 20 MiB; tests/test_cli.py checks these match).
SUMMARIES = {
    "demo": "play the embedded demo (a recorded H200 session)",
    "simulate": "watch a simulated GPU play a pathology",
    "record": "record headless (no UI) until Ctrl-C, SIGTERM or --duration",
    "replay": "replay a recording or an nvidia-smi log in the dashboard",
    "run": "start a training command with the probe and attach to it",
    "analyze": "report the findings of a recording, an nvidia-smi log or a cluster in Prometheus (no UI)",
    "doctor": "preflight: GPU visible, driver vs torch, a step on cuda",
    "config": "list every rule threshold: its name, default and the value in effect",
    "agent": "one per node: sample, judge and serve Prometheus metrics (no UI)",
    "cluster": "the dashboard over many hosts, read from Prometheus",
    "snapshot": "print one sample of every GPU, its processes and the host as JSON or CSV, then exit",
    "export": "write a recording's or a log's samples as JSON lines or CSV",
}

# Where each command is documented (docs/ in traintop's source; the end of its --help names it).
DOCS = {None: "docs/DASHBOARD.md", "demo": "docs/DASHBOARD.md", "simulate": "docs/COMMANDS.md",
        "record": "docs/RECORDING.md", "replay": "docs/RECORDING.md", "run": "docs/RUN.md",
        "analyze": "docs/ANALYZE.md", "doctor": "docs/COMMANDS.md", "config": "docs/RULES.md",
        "agent": "docs/CLUSTER.md", "cluster": "docs/CLUSTER.md", "snapshot": "docs/EXPORT.md",
        "export": "docs/EXPORT.md"}
EVERY_COMMAND_DOC = "docs/COMMANDS.md"


def docs_epilog(command: str | None) -> str:
    page = DOCS[command]
    every = "" if page == EVERY_COMMAND_DOC else f"; every command and option: {EVERY_COMMAND_DOC}"
    return f"Documentation: {page}{every} (in traintop's source)."
