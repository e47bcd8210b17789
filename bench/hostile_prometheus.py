"""A hostile Prometheus: peak memory and time of `analyze --prometheus` and of one cluster refresh.

    python bench/hostile_prometheus.py [--before-code DIR] [--limit-s 150] [--limit-gib 8] [--json FILE]
                                       [--scenarios big,many,deep,slow]

Each scenario starts tests/hostile_prometheus.py in its own process on 127.0.0.1 and runs,
each in a fresh process: `traintop analyze --prometheus URL --since 2h` (720 points a series)
and one refresh of `traintop cluster` (its first read: the whole 5-minute window). Peak RSS
is the child's own (``wait4``), time is wall clock. Scenarios (the worst answers of issue 23):

- big:  every query answered with 63 MiB of valid points on the asked grid (under the 64 MiB cap)
- big_range: the same for range queries only (instant queries answered small): the byte budget
- many: every query answered with 199 999 series
- deep: JSON nested 100 000 levels
- slow: the answer sent one byte a second

``--before-code DIR`` runs the same with an older traintop (``git archive main traintop |
tar -x -C DIR``): a before/after table. Each child runs under an address-space limit of
``--limit-gib`` and is killed past ``--limit-s``: "before" figures beyond them are lower bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from benchio import save_json

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIOS = {
    "big": ["big", "mib=63.0"],
    "big_range": ["big", "mib=63.0", "instant_big=0"],
    "many": ["many", "series=199999"],
    "deep": ["deep", "depth=100000"],
    "slow": ["slow", "pause=1.0"],
}
REFRESH = ("import sys\nfrom traintop.errors import TraintopError\nfrom traintop.cluster.snapshot import PrometheusSource\n"
           "try:\n    PrometheusSource(sys.argv[1])()\nexcept TraintopError as e:\n"
           "    print('traintop:', e, file=sys.stderr); sys.exit(2)\n")


def start_server(args: list[str]):
    p = subprocess.Popen([sys.executable, os.path.join(REPO, "tests", "hostile_prometheus.py"), *args],
                         stdout=subprocess.PIPE, text=True)
    return p, p.stdout.readline().strip()


def measure(cmd: list[str], code: str | None, limit_s: float, limit_gib: float) -> dict:
    env = dict(os.environ)
    if code:
        env["PYTHONPATH"] = code + os.pathsep + env.get("PYTHONPATH", "")

    def limits():
        lim = int(limit_gib * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))

    t0 = time.monotonic()
    # from the root directory: `python -m` and `-c` put the working directory first on sys.path,
    # where this checkout's traintop would shadow --before-code's
    p = subprocess.Popen(cmd, env=env, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=limits)
    killed = False
    while True:
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() - t0 > limit_s:
            p.kill()
            killed = True
            pid, status, usage = os.wait4(p.pid, 0)
            break
        time.sleep(0.05)
    seconds = time.monotonic() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode(errors="replace").strip().splitlines()
    last = err[-1] if err else ""
    return {"seconds": round(seconds, 1), "peak_rss_mib": round(usage.ru_maxrss / 1024), "exit": p.returncode,
            "killed_at_limit": killed, "traceback": any(line.startswith("Traceback") for line in err),
            "said": last[:160]}


def run(scenarios: list[str], code: str | None, limit_s: float, limit_gib: float) -> dict:
    out = {}
    for name in scenarios:
        server, url = start_server(SCENARIOS[name])
        try:
            out[name] = {
                "analyze": measure([sys.executable, "-m", "traintop", "analyze", "--prometheus", url, "--since", "2h"],
                                   code, limit_s, limit_gib),
                "refresh": measure([sys.executable, "-c", REFRESH, url], code, limit_s, limit_gib),
            }
        finally:
            server.kill()
            server.wait()
        print(f"  {name}: done", file=sys.stderr, flush=True)
    return out


def fmt(m: dict | None) -> str:
    if m is None:
        return ""
    t = f"> {m['seconds']:.0f} s (killed)" if m["killed_at_limit"] else f"{m['seconds']:.1f} s"
    how = "traceback" if m["traceback"] else f"exit {m['exit']}"
    return f"{t}, {m['peak_rss_mib']} MiB, {how}"


def table(after: dict, before: dict | None) -> str:
    rows = ["| scenario | command | now | before |", "| --- | --- | --- | --- |"]
    for name, cmds in after.items():
        for cmd, m in cmds.items():
            b = (before or {}).get(name, {}).get(cmd)
            rows.append(f"| {name} | {cmd} | {fmt(m)} | {fmt(b)} |")
    said = sorted({m["said"] for cmds in after.values() for m in cmds.values() if m["said"]})
    return "\n".join(rows + ["", "now, in one line each:"] + [f"  {s}" for s in said])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before-code", metavar="DIR")
    ap.add_argument("--limit-s", type=float, default=150.0)
    ap.add_argument("--limit-gib", type=float, default=8.0)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--before-from", metavar="FILE", help="take the before column from an earlier run's JSON")
    a = ap.parse_args()
    names = [s for s in a.scenarios.split(",") if s]
    result = {"machine": os.uname().nodename, "cpus": os.cpu_count(), "limit_s": a.limit_s, "limit_gib": a.limit_gib}
    result["after"] = run(names, None, a.limit_s, a.limit_gib)
    if a.before_code:
        result["before"] = run(names, a.before_code, a.limit_s, a.limit_gib)
    elif a.before_from:
        with open(a.before_from) as f:
            result["before"] = json.load(f)["before"]
    print(table(result["after"], result.get("before")))
    save_json(a.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
