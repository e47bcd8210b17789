"""The cluster commands' parsers: `traintop agent`, `traintop cluster`, and the Prometheus
options of `traintop analyze`. Registered by traintop/cli.py (which starts the dashboard:
the core never imports the UI)."""

from __future__ import annotations


def add_agent(sub) -> None:
    from traintop import options
    from traintop.cluster.agent import DEFAULT_LISTEN

    p = sub.add_parser("agent", help=options.SUMMARIES["agent"],
                       description="Sample the GPUs, the host and every probed job here, run the rules, and serve "
                       "the result as Prometheus metrics (or a file for node_exporter). See docs/CLUSTER.md.")
    g = p.add_argument_group("serving")
    g.add_argument("--listen", metavar="HOST:PORT",
                   help=f"where /metrics is served (default {DEFAULT_LISTEN}; a bare PORT is 127.0.0.1:PORT; "
                        "0.0.0.0:PORT serves every interface; port 0: any free port)")
    g.add_argument("--textfile", metavar="DIR",
                   help="write traintop.prom into DIR for node_exporter's textfile collector "
                        "(no port is opened unless --listen is given too)")
    g.add_argument("--job", help="job id for the ranks' series (default: the id the job sees: SLURM_JOB_ID, "
                   "TORCHELASTIC_RUN_ID)")
    g.add_argument("--duration", type=options.seconds, metavar="S", help="stop after this many seconds")
    g.add_argument("--quiet", action="store_true", help="print nothing unless something fails")
    g.add_argument("--probes-per-user", type=options.positive_int, default=64, metavar="N",
                   help="connections to one user's probes at most (default 64; a rank is one, a node runs a few)")
    g = p.add_argument_group("simulator")
    g.add_argument("--simulate", metavar="SCENARIO", help="serve the simulator instead of real GPUs")
    g.add_argument("--gpus", type=options.positive_int, default=1, metavar="N", help="simulated GPUs per host")
    g.add_argument("--hostname", help="the Hostname label (default: this host's name)")
    g.add_argument("--hosts", type=options.positive_int, default=1, metavar="K",
                   help="pose as K hosts, on consecutive ports (scale tests)")
    g.add_argument("--node-rank", type=int, default=0, metavar="N", help="this host's node rank in the job")
    g.add_argument("--nodes", type=options.positive_int, default=1, metavar="N", help="nodes in the job")
    g.add_argument("--straggler", type=int, metavar="LOCAL_RANK",
                   help="this local rank lags (slow steps, waiting for input)")
    g.add_argument("--stall-after", type=float, metavar="S", help="every rank stops stepping after S seconds")
    g.add_argument("--seed", type=int, default=0, metavar="N", help="random seed of the first simulated host")
    options.add_sampling(p, pid=False)
    options.add_output(p)
    options.add_thresholds(p)
    options.add_finding_hook(p)
    p.set_defaults(handler=cmd_agent, interval=1.0)  # Prometheus scrapes once a second at the most


def cmd_agent(args) -> int:
    from traintop.cluster.agent import run_agent

    return run_agent(args)


def _duration(text: str) -> float:
    import argparse

    from traintop.cluster.promapi import parse_duration
    from traintop.errors import TraintopError

    try:
        return parse_duration(text)
    except TraintopError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_analyze_options(p) -> None:
    g = p.add_argument_group("a cluster in Prometheus")
    g.add_argument("--prometheus", metavar="URL", help="analyze what Prometheus holds instead of a FILE")
    g.add_argument("--job", help="only this job's ranks and hosts")
    g.add_argument("--since", type=_duration, help="how far back (90s, 15m, 2h, 1d; default 2h)")
    g.add_argument("--until", type=float, metavar="UNIX_TIME", help="end of the range (default: now)")
    g.add_argument("--step", type=float, metavar="S", help="seconds between points read (default: range / 720, at least 1)")


def cmd_analyze_prometheus(args) -> int:
    from traintop.cluster.promapi import parse_duration
    from traintop.cluster.analysis import analyze_prometheus
    from traintop.cluster.report import render_json, render_text
    from traintop.errors import TraintopError
    from traintop.rules import Severity

    if args.file:
        raise TraintopError("give either a FILE or --prometheus URL, not both")
    since = args.since if args.since is not None else parse_duration("2h")
    report = analyze_prometheus(args.prometheus, since, until=args.until, job=args.job,
                                step=args.step, config=args.thresholds)
    print(render_json(report) if args.json else render_text(report))
    worst = report.worst()
    if args.fail_on and worst is not None and worst >= Severity.parse(args.fail_on):
        return 1
    return 0


def add_cluster(sub, handler) -> None:
    from traintop import options

    p = sub.add_parser("cluster", help=options.SUMMARIES["cluster"],
                       description="Every host's GPUs, every rank's step time and input wait, and the cluster's "
                       "findings, read from Prometheus (traintop agents, or dcgm-exporter alone).")
    p.add_argument("--prometheus", metavar="URL", required=True, help="Prometheus's address (http://host:9090)")
    p.add_argument("--job", help="only this job's hosts and ranks")
    p.add_argument("--refresh", type=float, default=5.0, metavar="S",
                   help="seconds between reads of Prometheus (default 5)")
    p.add_argument("--window", default="5m", help="how far back the sparklines and findings reach (default 5m)")
    options.add_thresholds(p)
    p.set_defaults(handler=handler)


def cluster_source(args):
    """The snapshot source of `traintop cluster`, checked once (one line when Prometheus is
    unreachable or holds nothing of ours)."""
    from traintop.cluster.promapi import parse_duration
    from traintop.cluster.snapshot import PrometheusSource
    from traintop.errors import TraintopError

    if not 1.0 <= args.refresh <= 3600:
        raise TraintopError("--refresh must be between 1 and 3600 seconds")
    source = PrometheusSource(args.prometheus, args.job, window=parse_duration(args.window), config=args.thresholds)
    try:
        source()
    except TraintopError:
        source.close()
        raise
    return source
