"""traintop against its peers under load, in one run: CPU seconds per wall second and RSS.

    python bench/peer_cost.py --preset h200 --load nanogpt --json OUT.json   # on a GPU machine
    python bench/peer_cost.py --preset sim8x8 [--cost h200]                  # no GPU: 8 simulated GPUs
    python bench/peer_cost.py --preset attached                              # no GPU: `traintop run`

Every command of a phase starts together, each in a pseudo-terminal of its own (160x48 unless
said), its output drained; "steady" is the CPU of the command between ``--warmup`` and
``--warmup + --seconds`` over that wall time (bench/cpu_compare.py's method); RSS is read at the end.

``h200``: phases ``idle`` (no job), ``training`` (``--runs`` of them: bench/workloads/nanogpt.py,
GPT-2 small in bf16, started first and stepping before the monitors start) and ``attached``
(`traintop --interval 1 run -- nanogpt` beside the unattached dashboard; its job is the load).
Pairs: `traintop record --interval 1` / `nvidia-smi dmon -d 1`; `traintop agent` / nvitop-exporter,
both scraped every 5 s by this bench; the dashboard / nvitop at `--interval 1` at 160x48 and
80x24, and each at its defaults; the attached dashboard / the unattached one. A traintop command
is measured alone (not `traintop run`'s job); the peers with their children.

``sim8x8`` (no GPU needed): traintop's commands against bench/sim_nvml.py posing as 8 H200s (and
1), idle, with one process a GPU and with 8; the processes are real (sleeping children of this
bench) so every /proc read is real. Peers cannot run there: the table gives each command's cost,
the cost of a busy GPU with its process over an idle one, and of each further process, and the
NVML calls a second of each command. ``--cost h200`` spends in each simulated NVML call the CPU it
took on an H200 under training (bench/sim_nvml.py), so the figures include what NVML would cost.

``attached`` (no GPU needed): one simulated GPU; `traintop run` of a CPU nanogpt beside the
unattached dashboard watching another such job.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import psutil

from cpu_compare import Run, peer, stop_all

PY = sys.executable
HERE = os.path.dirname(os.path.abspath(__file__))
NANOGPT = os.path.join(HERE, "workloads", "nanogpt.py")
SIM = os.path.join(HERE, "sim_nvml.py")
SMALL = (80, 24)
SCRAPE_S = 5.0
# (row, reference, goal as a ratio of the steady CPU)
PAIRS = [("record 1 Hz", "nvidia-smi dmon -d 1", 0.5),
         ("agent (scraped /5 s)", "nvitop-exporter (scraped /5 s)", 0.5),
         ("dashboard 1 Hz", "nvitop 1 Hz", 0.5),
         ("dashboard 1 Hz 80x24", "nvitop 1 Hz 80x24", 0.5),
         ("dashboard defaults", "nvitop defaults", 1.0),
         ("dashboard 1 Hz, attached (traintop run)", "dashboard 1 Hz, unattached", 1.2)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Row:
    """A command to measure: ``tree``: with its children (peers), else the process alone (traintop
    run's job is its child); ``scrape``: a /metrics URL fetched every SCRAPE_S."""

    def __init__(self, label, argv, size=(160, 48), tree=True, scrape=None, calls=None):
        self.label, self.argv, self.size, self.tree, self.scrape, self.calls = label, argv, size, tree, scrape, calls
        self.run: Run | None = None
        self.scrapes = self.scrape_errors = 0

    def start(self) -> None:
        self.run = Run(self.label, self.argv, *self.size)

    def cpu(self) -> float | None:
        r = self.run
        if r is None or r.proc is None or r.proc.poll() is not None:
            return None
        if self.tree:
            return r.cpu()
        try:
            return sum(psutil.Process(r.proc.pid).cpu_times()[:2])
        except psutil.Error:
            return None


def scraper(rows: list[Row], stop: threading.Event) -> None:
    while not stop.wait(SCRAPE_S):
        for r in rows:
            if r.scrape:
                try:
                    with urllib.request.urlopen(r.scrape, timeout=4) as resp:
                        resp.read()
                    r.scrapes += 1
                except OSError:
                    r.scrape_errors += 1


def measure(rows: list[Row], seconds: float, warmup: float) -> list[dict]:
    stop = threading.Event()
    try:
        for r in rows:
            r.start()
        threading.Thread(target=scraper, args=(rows, stop), daemon=True).start()
        time.sleep(warmup)
        c0, t0 = [r.cpu() for r in rows], time.monotonic()
        time.sleep(seconds)
        c1, wall = [r.cpu() for r in rows], time.monotonic() - t0
        out = []
        for r, a, b in zip(rows, c0, c1):
            row = {"command": r.label, "argv": " ".join(r.argv), "size": f"{r.size[0]}x{r.size[1]}"}
            if r.run.error:
                row["error"] = r.run.error
            elif a is None or b is None:
                tail = r.run.tail.decode(errors="replace").strip().splitlines()
                row["error"] = "exited early" + (f": {tail[-1][:160]}" if tail else "")
            else:
                row["cpu_s_per_s"] = round((b - a) / wall, 5)
                row["rss_mib"] = round((r.run.rss() or 0) / 2**20, 1)
            if r.scrape:
                row["scrapes"], row["scrape_errors"] = r.scrapes, r.scrape_errors
            if r.calls and os.path.exists(r.calls):
                with open(r.calls) as f:
                    got = json.load(f)
                row["nvml_calls_per_s"] = {k: round(v / got["seconds"], 2) for k, v in sorted(got["calls"].items())}
            out.append(row)
        return out
    finally:
        stop.set()
        held = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
        try:
            stop_all([r.run for r in rows if r.run is not None])
        finally:
            for s, h in held.items():
                signal.signal(s, h)


# -- the machines' rows ------------------------------------------------------------------------

def traintop_rows(tt: list[str], tmp: str, tag: str, calls=None) -> list[Row]:
    """traintop's commands: ``tt`` starts traintop (``python -m traintop``, or through the NVML stand-in)."""
    port = free_port()
    c = (lambda name: f"{calls}-{tag}-{name}.json") if calls else (lambda name: None)

    def with_calls(name):
        return tt(c(name)) if callable(tt) else tt
    return [
        Row("record 1 Hz", with_calls("record") + ["record", "--interval", "1", "--quiet", f"{tmp}/{tag}.ttrec"],
            calls=c("record")),
        Row("agent (scraped /5 s)", with_calls("agent") + ["agent", "--listen", f"127.0.0.1:{port}", "--quiet"],
            scrape=f"http://127.0.0.1:{port}/metrics", calls=c("agent")),
        Row("dashboard 1 Hz", with_calls("dash") + ["--interval", "1"], calls=c("dash")),
        Row("dashboard 1 Hz 80x24", with_calls("dash_small") + ["--interval", "1"], SMALL, calls=c("dash_small")),
        Row("dashboard defaults", with_calls("dash_defaults"), calls=c("dash_defaults")),
    ]


def peer_rows() -> list[Row]:
    port = free_port()
    return [
        Row("nvidia-smi dmon -d 1", ["nvidia-smi", "dmon", "-d", "1"]),
        Row("nvitop-exporter (scraped /5 s)", peer("nvitop_exporter", "--bind-address", "127.0.0.1", "--port", str(port)),
            scrape=f"http://127.0.0.1:{port}/metrics"),
        Row("nvitop 1 Hz", peer("nvitop", "--interval", "1")),
        Row("nvitop 1 Hz 80x24", peer("nvitop", "--interval", "1"), SMALL),
        Row("nvitop defaults", peer("nvitop")),
    ]


class Job:
    """A training job in the background; ``ready()`` once it has stepped."""

    def __init__(self, argv: list[str], log: str) -> None:
        self.log = log
        self.fh = open(log, "w")
        self.proc = subprocess.Popen(argv, stdout=self.fh, stderr=subprocess.STDOUT, start_new_session=True)

    def ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            with open(self.log) as f:
                if "step " in f.read():
                    return True
            time.sleep(0.5)
        return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.fh.close()


def h200_phases(args, tmp: str):
    tt = args.traintop.split() if args.traintop else [PY, "-m", "traintop"]
    job_s = str(args.warmup + args.seconds + 120)
    nanogpt = [PY, NANOGPT, "--device", args.job_device, "--seconds", job_s]
    yield "idle", None, traintop_rows(tt, tmp, "idle") + peer_rows()
    for k in range(args.runs):
        job = nanogpt if args.load == "nanogpt" else None
        yield f"training {k + 1}", job, traintop_rows(tt, tmp, f"train{k}") + peer_rows()
    if args.load == "nanogpt":
        yield "attached", None, [
            Row("dashboard 1 Hz, attached (traintop run)", tt + ["--interval", "1", "run", "--", *nanogpt], tree=False),
            Row("dashboard 1 Hz, unattached", tt + ["--interval", "1"])]


SIM_CONFIGS = [("idle, 8 GPUs", 8, 0, "idle"), ("1 GPU x 1 process", 1, 1, "healthy"),
               ("8 GPUs x 1 process", 8, 1, "healthy"), ("8 GPUs x 8 processes", 8, 8, "healthy")]


def sim_phases(args, tmp: str, pids: list[int]):
    for name, gpus, procs, scenario in SIM_CONFIGS:
        def tt(calls, gpus=gpus, procs=procs, scenario=scenario):
            return [PY, SIM, "--gpus", str(gpus), "--procs", str(procs), "--scenario", scenario, "--cost", args.cost,
                    "--pids", ",".join(map(str, pids[:gpus * procs])), *(["--calls", calls] if calls else []), "--"]
        yield name, None, traintop_rows(tt, tmp, name.split(",")[0].replace(" ", ""), calls=f"{tmp}/calls")


def attached_phases(args, tmp: str):
    job_s = str(args.warmup + args.seconds + 60)
    job = [PY, NANOGPT, "--device", "cpu", "--seconds", job_s]

    def sim(pids: str) -> list[str]:
        return [PY, SIM, "--gpus", "1", "--procs", "1", "--scenario", "healthy", "--cost", args.cost, "--pids", pids, "--"]
    # the unattached dashboard watches a job of its own: its PID is known once started (see run_phases)
    yield "attached", job, [
        Row("dashboard 1 Hz, attached (traintop run)", sim("children") + ["--interval", "1", "run", "--", *job],
            tree=False),
        Row("dashboard 1 Hz, unattached", sim("{job}") + ["--interval", "1"])]


def run_phases(phases, args, tmp: str) -> list[dict]:
    out = []
    for name, job_argv, rows in phases:
        job = None
        if job_argv is not None:
            job = Job(job_argv, f"{tmp}/job-{len(out)}.log")
            if not job.ready(args.job_wait):
                print(f"{name}: the job did not step within {args.job_wait:g} s (see its log)", file=sys.stderr)
            for r in rows:
                r.argv = [a.replace("{job}", str(job.proc.pid)) for a in r.argv]
        print(f"== {name} ({time.strftime('%H:%M:%S')})", file=sys.stderr, flush=True)
        try:
            got = measure(rows, args.seconds, args.warmup)
        finally:
            if job is not None:
                job.stop()
        out.append({"phase": name, "rows": got})
    return out


def sleepers(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen(["sleep", "3600"], start_new_session=True) for _ in range(n)]


# -- the table -------------------------------------------------------------------------------

def ratios(phase: dict) -> list[dict]:
    by = {r["command"]: r for r in phase["rows"]}
    out = []
    for a, b, goal in PAIRS:
        x, y = by.get(a, {}).get("cpu_s_per_s"), by.get(b, {}).get("cpu_s_per_s")
        if x is not None and y:
            out.append({"command": a, "reference": b, "ratio": round(x / y, 2), "goal": goal, "met": x / y <= goal})
    return out


def derived(phases: list[dict]) -> list[dict]:
    """sim8x8: what a busy GPU with its process adds over an idle one, and each further process."""
    by = {p["phase"]: {r["command"]: r.get("cpu_s_per_s") for r in p["rows"]} for p in phases}
    idle, one, eight = by.get("idle, 8 GPUs", {}), by.get("8 GPUs x 1 process", {}), by.get("8 GPUs x 8 processes", {})
    out = []
    for cmd in one:
        a, b, c = idle.get(cmd), one.get(cmd), eight.get(cmd)
        if None in (a, b, c):
            continue
        out.append({"command": cmd, "per_gpu_idle": round(a / 8, 5), "per_gpu_with_a_process": round(b / 8, 5),
                    "busy_gpu_over_idle": round((b - a) / 8, 5), "per_further_process": round((c - b) / 56, 5)})
    return out


def table(result: dict) -> str:
    lines = [f"peer_cost {result['preset']} — {result['machine']}, {result['cpus']} CPUs, {result['date']}; "
             f"CPU s/s steady over {result['seconds']:g} s after {result['warmup']:g} s"]
    for p in result["phases"]:
        lines.append(f"\n{p['phase']}")
        lines.append(f"  {'command':44s} {'size':>7s} {'CPU s/s':>9s} {'RSS MiB':>8s}  notes")
        for r in p["rows"]:
            if "error" in r:
                lines.append(f"  {r['command']:44s} {r['size']:>7s} {r['error']}")
                continue
            notes = []
            if "scrapes" in r:
                notes.append(f"{r['scrapes']} scrapes, {r['scrape_errors']} failed")
            calls = r.get("nvml_calls_per_s")
            if calls:
                notes.append("NVML/s: " + ", ".join(f"{k} {v:g}" for k, v in calls.items()
                                                     if k in ("util_samples", "process_util", "processes")))
            lines.append(f"  {r['command']:44s} {r['size']:>7s} {r['cpu_s_per_s']:9.4f} {r['rss_mib']:8.1f}  "
                         + "; ".join(notes))
        for q in p.get("ratios", []):
            lines.append(f"  ratio {q['command']} / {q['reference']}: {q['ratio']:.2f} "
                         f"(goal <= {q['goal']:g}: {'met' if q['met'] else 'MISSED'})")
    if result.get("derived"):
        lines.append("\nper GPU and per process (CPU s/s; 8 simulated GPUs)")
        lines.append(f"  {'command':28s} {'per idle GPU':>13s} {'per GPU, 1 proc':>16s} {'busy over idle':>15s} "
                     f"{'per further proc':>17s}")
        for d in result["derived"]:
            lines.append(f"  {d['command']:28s} {d['per_gpu_idle']:13.5f} {d['per_gpu_with_a_process']:16.5f} "
                         f"{d['busy_gpu_over_idle']:15.5f} {d['per_further_process']:17.5f}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=["h200", "sim8x8", "attached"], default="sim8x8")
    ap.add_argument("--load", choices=["nanogpt", "none"], default="nanogpt", help="h200: the training job")
    ap.add_argument("--runs", type=int, default=1, help="h200: training phases")
    ap.add_argument("--job-device", default="cuda", help="h200: where the training job runs (cpu: a dry run)")
    ap.add_argument("--traintop", help="h200: how to start traintop (default: python -m traintop)")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--job-wait", type=float, default=90.0, help="seconds a job gets to take its first steps")
    ap.add_argument("--cost", choices=["none", "h200"], default="none", help="sim8x8, attached: NVML's CPU modelled")
    ap.add_argument("--only", help="sim8x8: only the configurations whose name holds this text")
    ap.add_argument("--pythonpath", help="import traintop from here (another checkout, to compare: a tree where "
                    "traintop/ holds app/, widgets/ and collectors/, as installed)")
    ap.add_argument("--json", help="write everything here")
    ap.add_argument("--table", help="write the table here too")
    args = ap.parse_args()
    if args.pythonpath:
        os.environ["PYTHONPATH"] = os.path.abspath(args.pythonpath)
    held = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if args.preset == "h200":
                phases = h200_phases(args, tmp)
            elif args.preset == "sim8x8":
                held = sleepers(64)
                phases = [p for p in sim_phases(args, tmp, [p.pid for p in held])
                          if not args.only or args.only in p[0]]
            else:
                phases = attached_phases(args, tmp)
            done = run_phases(phases, args, tmp)
        finally:
            for p in held:
                p.kill()
                p.wait()
    for p in done:
        p["ratios"] = ratios(p)
    result = {"preset": args.preset, "machine": os.uname().nodename, "cpus": os.cpu_count(), "cost": args.cost,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seconds": args.seconds,
              "warmup": args.warmup, "phases": done, "derived": derived(done) if args.preset == "sim8x8" else []}
    text = table(result)
    print(text)
    if args.table:
        with open(args.table, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
