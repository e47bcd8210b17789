"""`traintop snapshot` (one sample of every GPU, process and rank, then exit) and `traintop export`
(a recording or an nvidia-smi log as JSON lines or CSV): samples for scripts, in the shape of
traintop/record/export.py."""

from __future__ import annotations

import json
import sys
import time

from traintop.record import export
from traintop.errors import NoGpuError, TraintopError
from traintop.text import one_line
from traintop.options import SUMMARIES, positive_int, seconds

OWNER_FIELDS = ("user", "uid", "runtime", "container", "pod", "namespace", "job", "slurm_step", "run_id",
                "job_from")


def _owners(frame) -> dict[int, dict]:
    """What /proc says of each GPU process: whose it is, and whether it can be seen from here."""
    from traintop.collectors.whose import in_nested_pid_namespace, whose

    nested = in_nested_pid_namespace()
    out = {}
    for g in frame.gpus:
        for p in g.processes:
            if p.pid not in out:
                o = whose(p.pid, gpu_process=True, nested=nested)
                out[p.pid] = {"visible": o.visible, "inner_pid": o.inner_pid,
                              **{k: getattr(o, k) for k in OWNER_FIELDS}}
    return out


def take_snapshot(pid: int | None, wait_s: float):
    """(SessionInfo, Frame) of one sample; rates (CPU, disk, PCIe) over ``wait_s``."""
    from traintop.collectors.host import HostCollector
    from traintop.collectors.nvml import NvmlCollector
    from traintop.collectors.process import ProcessCollector
    from traintop.sources.live import LiveSampler
    from traintop.watch.sessions import no_gpu_info

    proc = ProcessCollector(pid) if pid is not None else None
    try:
        gpu = NvmlCollector(window_s=max(0.2, wait_s))
    except NoGpuError as e:  # the host (and the job) still have a sample, as `record --jsonl` streams
        gpu, info = None, no_gpu_info(wait_s, str(e))
    probes = None
    if proc is not None:
        from traintop.collectors.probe_client import ProbeClient

        probes = ProbeClient(None)
    sampler = LiveSampler(gpu=gpu, host=HostCollector(), process=proc, probes=probes, gpu_timeout=max(1.0, wait_s))
    try:
        sampler.next_frame()  # the first reading of each rate only sets its start
        if gpu is not None:
            gpu.poll_util_window(every_gpu=True)  # ... and of each window (per-process shares, GPM)
            gpu.poll_gpm()
        time.sleep(wait_s)
        if gpu is not None:
            gpu.poll_util_window(every_gpu=True)
            gpu.poll_gpm()
            gpu.poll_slow()
        frame = sampler.next_frame()
        return (info if gpu is None else gpu.session_info(wait_s)), frame
    finally:
        sampler.close()


def cmd_snapshot(args) -> int:
    if not 0.05 <= args.wait <= 10:
        raise TraintopError("--wait must be between 0.05 and 10 seconds")
    info, frame = take_snapshot(args.pid, args.wait)
    if not info.gpus and "no_gpu" in info.extra:  # as `record --jsonl` says it: the sample goes on
        job = f" and PID {args.pid}" if args.pid is not None else ""
        print(f"traintop: no GPU ({one_line(info.extra['no_gpu'], 300)}): the host{job} only", file=sys.stderr)
    if args.csv:
        sys.stdout.write(export.csv_header() + export.csv_rows(frame, info))
    else:
        record = export.sample_record(frame, info, _owners(frame))
        sys.stdout.write(export.json_line(record) + "\n" if args.compact else
                         json.dumps(record, indent=1, allow_nan=False) + "\n")
    return 0


NOTHING_TO_EXPORT = {"gpus": "no GPU", "host": "no host sample", "process": "no attached process",
                     "ranks": "no rank (no probe reported)"}


def cmd_export(args) -> int:
    from traintop.watch import sessions

    if args.rows is not None and not args.csv:
        raise TraintopError("--rows picks what a CSV's rows are (with --csv); a JSON line holds all of a sample")
    rows = args.rows or "gpus"
    source = sessions.open_source(args.file)
    info = source.info
    from traintop.files import create_new

    # A new file, as `record` and `record --jsonl` write: a sample file is never written over.
    out = create_new(args.output, "export -o") if args.output not in (None, "-") else sys.stdout
    written = rows_written = 0
    failed: OSError | None = None
    try:
        if args.csv:
            out.write(export.csv_header(rows))
        for frame in source.frames():
            if args.csv:
                out.write(export.csv_rows(frame, info, rows))
                rows_written += export.csv_count(frame, rows)
            else:
                out.write(export.json_line(export.sample_record(frame, info)) + "\n")
            written += 1
            if args.limit and written >= args.limit:
                break
        out.flush()
    except OSError as e:
        if out is sys.stdout:
            raise  # said by main, as for every command
        failed = e
    finally:
        if out is not sys.stdout:
            try:
                out.close()
            except OSError as e:
                failed = failed or e
    if failed is not None:
        raise TraintopError(f"writing {args.output} failed: {failed.strerror or failed} "
                            f"({written} sample(s) given to it)")
    if args.csv and written and not rows_written:  # a bare header says nothing: say why, in one line
        why = f" ({one_line(info.extra['no_gpu'], 200)})" if rows == "gpus" and info.extra.get("no_gpu") else ""
        others = ", ".join(r for r in export.CSV_ROWS if r != rows)
        print(f"traintop: {one_line(args.file, 300)} holds {NOTHING_TO_EXPORT[rows]} in its {written} sample(s)"
              f"{why}: the CSV is its header only (--rows {others} export the rest)", file=sys.stderr)
    if args.output not in (None, "-"):
        print(f"traintop: {written} sample(s) written to {args.output}", file=sys.stderr)
    return 0


def add_snapshot(sub) -> None:
    p = sub.add_parser("snapshot", help=SUMMARIES["snapshot"],
                       description="One sample of every GPU (its processes: whose they are, their container and job), "
                       "the host and, with --pid, a job and its ranks; printed as JSON (schema "
                       f"{export.SCHEMA}, docs/EXPORT.md) or CSV, then exit.")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="JSON, indented (the default)")
    fmt.add_argument("--compact", action="store_true", help="JSON on one line")
    fmt.add_argument("--csv", action="store_true", help="CSV: a header, then one row a GPU")
    p.add_argument("--pid", type=positive_int, metavar="PID", help="also sample this job (and its ranks' probes)")
    p.add_argument("--wait", type=seconds, default=0.5, metavar="S",
                   help="seconds between the two readings that rates are measured over (default 0.5)")
    p.set_defaults(handler=cmd_snapshot)


def add_export(sub) -> None:
    p = sub.add_parser("export", help=SUMMARIES["export"],
                       description="Write the samples of a recording or an nvidia-smi log as JSON lines (schema "
                       f"{export.SCHEMA}, docs/EXPORT.md) or CSV (one row a GPU a sample).")
    p.add_argument("file", metavar="FILE", help="a traintop recording (.ttrec) or an nvidia-smi CSV/dmon log")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--jsonl", action="store_true", help="JSON lines, one sample a line (the default)")
    fmt.add_argument("--csv", action="store_true", help="CSV: a header, then one row a GPU a sample (--rows: "
                     "of something else)")
    p.add_argument("--rows", choices=tuple(export.CSV_ROWS), help="with --csv, what a row is: "
                   + "; ".join(f"{k}: {v}" for k, v in export.CSV_ROWS.items()) + " (default gpus)")
    p.add_argument("-o", "--output", metavar="OUT", help="write here instead of standard output")
    p.add_argument("--limit", type=positive_int, metavar="N", help="stop after N samples")
    p.set_defaults(handler=cmd_export)

