"""How long `traintop analyze` takes on a long nvidia-smi log, and the memory it holds.

    python bench/import_log.py [--mib 50 100 500] [--source FIXTURE] [--json OUT]

Each size is a real H200 log (`nvidia-smi --query-gpu ... -lms 100`, tests/fixtures/h200)
repeated end to end with its timestamps moved on, so the rules meet what they met on the
GPU, again and again. Each size runs `traintop analyze` in a fresh process: seconds, seconds
a MiB, samples a second, peak RSS. The file is written to a temporary folder and removed.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import os
import resource
import subprocess
import sys
import tempfile
import time

from benchio import save_json

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "h200", "smi-query-100ms.csv.gz")
FMT = "%Y/%m/%d %H:%M:%S.%f"


def write_log(source: str, out: str, mib: float) -> int:
    """``source`` repeated (timestamps shifted by its span each time) until ``mib`` MiB; its rows."""
    with gzip.open(source, "rt") as f:
        head, *rows = f.read().splitlines()
    t0 = datetime.datetime.strptime(rows[0].split(",")[0], FMT)
    parsed = [(datetime.datetime.strptime(r.split(",")[0], FMT) - t0, r[r.index(","):]) for r in rows]
    span = parsed[-1][0] + datetime.timedelta(seconds=0.1)
    target, size, n, k = mib * 2**20, len(head) + 1, 0, 0
    with open(out, "w") as f:
        f.write(head + "\n")
        while size < target:
            base = t0 + k * span
            chunk = "".join((base + dt).strftime(FMT)[:-3] + rest + "\n" for dt, rest in parsed)
            f.write(chunk)
            size += len(chunk)
            n += len(parsed)
            k += 1
    return n


def measure(path: str) -> dict:
    t = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([sys.executable, "-m", "traintop", "analyze", path], capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter() - t
    if p.returncode not in (0, 1):  # 1: a finding at --fail-on's level; anything else failed
        raise SystemExit(f"analyze failed ({p.returncode}): {p.stderr.strip()[-300:]}")
    return {"wall_s": wall, "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "rss_mib": after.ru_maxrss / 1024, "summary": p.stdout.splitlines()[1] if p.stdout else ""}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=float, nargs="+", default=[50.0])
    ap.add_argument("--source", default=FIXTURE)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mib in args.mib:
            path = os.path.join(tmp, f"smi-{mib:g}MiB.csv")
            samples = write_log(args.source, path, mib)
            size = os.path.getsize(path) / 2**20
            m = measure(path)
            os.unlink(path)
            rows.append({"mib": round(size, 1), "samples": samples, **m,
                         "s_per_mib": m["wall_s"] / size, "samples_per_s": samples / m["wall_s"]})
    print(f"{'MiB':>7} {'samples':>10} {'wall s':>8} {'CPU s':>8} {'s/MiB':>7} {'samples/s':>10} {'peak RSS MiB':>13}")
    for r in rows:
        print(f"{r['mib']:7.1f} {r['samples']:10d} {r['wall_s']:8.1f} {r['cpu_s']:8.1f} {r['s_per_mib']:7.2f} "
              f"{r['samples_per_s']:10.0f} {r['rss_mib']:13.0f}")
    for r in rows:
        print(f"  {r['mib']:.0f} MiB: {r['summary']}")
    save_json(args.json, {"machine": os.uname().nodename, "cpus": os.cpu_count(), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
