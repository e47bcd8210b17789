"""CPU seconds per wall second of monitors, side by side in one run.

Each command runs in a pseudo-terminal of its own (160x48, so TUIs draw as they would
in a tmux pane), all at the same time. Two figures per command: "steady", the CPU time
of its process tree between ``--warmup`` and ``--warmup + --seconds`` divided by the wall
time between the reads (what it costs while it runs for hours), and "from launch", its
CPU time over the first ``--seconds`` (start-up included, as a quick `time`-style
measurement sees it). Peers that are not installed are listed as such.

  python bench/cpu_compare.py --preset h200            # traintop vs nvitop, gpustat, nvidia-smi dmon
  python bench/cpu_compare.py --preset sim --seconds 30  # traintop on the simulator (no GPU)
  python bench/cpu_compare.py --preset guard           # traintop simulate vs a full-repaint Textual app

Presets with references print ratios: h200 the TUIs to nvitop at the same interval and size
and the recorder to dmon; guard `traintop simulate --gpus 2 --interval 1` to
bench/textual_floor.py. nvitop and gpustat run as `python -m` where only their packages are
importable (wheels on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import json
import os
import pty
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time

import psutil

PY = sys.executable


HERE = os.path.dirname(os.path.abspath(__file__))
SMALL = (80, 24)


def peer(module: str, *args: str) -> list[str]:
    """A peer monitor's command: its script where it is installed, else ``python -m`` where only
    its package is importable (wheels put on PYTHONPATH), else the bare name (reported missing)."""
    if shutil.which(module):
        return [module, *args]
    if importlib.util.find_spec(module) is not None:
        return [PY, "-m", module, *args]
    return [module, *args]


# Each preset: rows (label, argv, optional (cols, rows)), and the ratios to print (row, reference).
def presets(name: str, tmp: str) -> list[tuple]:
    tt = [PY, "-m", "traintop"]
    if name == "sim":
        sim = ["simulate", "--scenario", "starved"]
        return [(f"traintop TUI {hz} Hz (simulated)", tt + sim + ["--interval", str(1 / hz)]) for hz in (1, 4, 10)] + [
            ("traintop TUI 4 Hz --fps 4 (simulated)", tt + sim + ["--interval", "0.25", "--fps", "4"])] + [
            (f"traintop record {hz} Hz (simulated)",
             tt + ["record", "--simulate", "starved", "--interval", str(1 / hz), f"{tmp}/sim{hz}.ttrec"])
            for hz in (1, 4, 10)]
    if name == "guard":
        return [("traintop simulate --gpus 2 --interval 1", tt + ["simulate", "--gpus", "2", "--interval", "1"]),
                ("Textual full repaint at 1 Hz", [PY, os.path.join(HERE, "textual_floor.py"), "--interval", "1"])]
    return [
        ("traintop TUI --interval 1", tt + ["--interval", "1"]),
        ("traintop TUI --interval 1, 80x24", tt + ["--interval", "1"], SMALL),
        ("traintop TUI defaults", tt),
        ("nvitop --interval 1", peer("nvitop", "--interval", "1")),
        ("nvitop --interval 1, 80x24", peer("nvitop", "--interval", "1"), SMALL),
        ("nvitop defaults", peer("nvitop")),
        ("traintop TUI --interval 1, GPU 0 only", tt + ["--interval", "1", "--only-gpus", "0"]),
        ("nvitop --interval 1, GPU 0 only", peer("nvitop", "--interval", "1", "--only", "0")),
        ("gpustat -i 1", peer("gpustat", "-i", "1")),
        ("nvidia-smi dmon -d 1", ["nvidia-smi", "dmon", "-d", "1"]),
        ("traintop record --interval 1", tt + ["record", "--interval", "1", f"{tmp}/live1.ttrec"]),
        ("traintop record defaults", tt + ["record", f"{tmp}/live.ttrec"]),
    ]


RATIOS = {
    "guard": [("traintop simulate --gpus 2 --interval 1", "Textual full repaint at 1 Hz")],
    "h200": [("traintop TUI --interval 1", "nvitop --interval 1"),
             ("traintop TUI --interval 1, 80x24", "nvitop --interval 1, 80x24"),
             ("traintop TUI defaults", "nvitop defaults"),
             ("traintop TUI --interval 1, GPU 0 only", "nvitop --interval 1, GPU 0 only"),
             ("traintop record --interval 1", "nvidia-smi dmon -d 1"),
             ("traintop record defaults", "nvidia-smi dmon -d 1")],
}


def ratios(rows: list[dict], pairs: list[tuple[str, str]]) -> list[dict]:
    """Each row's CPU over its reference's, steady and from launch (None where one is missing)."""
    by = {r["command"]: r for r in rows}
    out = []
    for a, b in pairs:
        ra, rb = by.get(a, {}), by.get(b, {})
        res = {"command": a, "reference": b}
        for key in ("cpu_per_wall_s", "from_launch"):
            x, y = ra.get(key), rb.get(key)
            res[key] = round(x / y, 2) if x is not None and y else None
        out.append(res)
    return out


class Run:
    def __init__(self, label: str, argv: list[str], cols: int = 160, rows: int = 48) -> None:
        self.label, self.argv, self.size = label, argv, f"{cols}x{rows}"
        self.proc = None
        self.error = None
        if shutil.which(argv[0]) is None:
            self.error = "not installed"
            return
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(cols), LINES=str(rows))
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                                     start_new_session=True, close_fds=True)
        os.close(slave)
        self.master = master
        self.tail = b""
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.tail = (self.tail + data)[-2000:]

    def cpu(self) -> float | None:
        if self.proc is None or self.proc.poll() is not None:
            return None
        try:
            p = psutil.Process(self.proc.pid)
            total = sum(p.cpu_times()[:2])
            for c in p.children(recursive=True):
                try:
                    total += sum(c.cpu_times()[:2])
                except psutil.Error:
                    pass
            return total
        except psutil.Error:
            return None

    def rss(self) -> int | None:
        try:
            return psutil.Process(self.proc.pid).memory_info().rss if self.proc else None
        except psutil.Error:
            return None

    def signal_group(self, sig: int) -> None:
        """Each command runs in a session of its own: its whole group, not only the process."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def close(self) -> None:
        if self.proc is not None:
            try:
                os.close(self.master)
            except OSError:
                pass


def stop_all(runs: list[Run]) -> None:
    """SIGINT, then SIGTERM, then SIGKILL to every command's group, all at once (3 s each step)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        live = [r for r in runs if r.proc is not None and r.proc.poll() is None]
        if not live:
            break
        for r in live:
            r.signal_group(sig)
        deadline = time.monotonic() + 3
        for r in live:
            try:
                r.proc.wait(max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    for r in runs:
        r.close()


def _exit_on_signal(signum, _frame):
    # SIGTERM or SIGHUP (a test run stopped, a closed terminal) would end this process at once
    # and leave the commands it started, each in a session of its own, running: unwind instead,
    # so that measure()'s finally stops them.
    raise SystemExit(128 + signum)


def measure(specs, seconds: float, warmup: float) -> list[dict]:
    runs: list[Run] = []
    old = {s: signal.signal(s, _exit_on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        for sp in specs:
            runs.append(Run(sp[0], sp[1], *(sp[2] if len(sp) > 2 else ())))
        launched = time.monotonic()
        time.sleep(warmup)
        c0 = [r.cpu() for r in runs]
        t0 = time.monotonic()
        time.sleep(max(0.0, launched + seconds - time.monotonic()))
        c_launch = [r.cpu() for r in runs]
        launch_wall = time.monotonic() - launched
        time.sleep(max(0.0, t0 + seconds - time.monotonic()))
        c1 = [r.cpu() for r in runs]
        wall = time.monotonic() - t0
        out = []
        for r, a, b, c in zip(runs, c0, c1, c_launch):
            row = {"command": r.label, "argv": " ".join(r.argv), "size": r.size, "wall_s": round(wall, 2)}
            if r.error:
                row["error"] = r.error
            elif a is None or b is None:
                row["error"] = "exited early: " + r.tail.decode(errors="replace").strip().splitlines()[-1:][0][:120] \
                    if r.tail.strip() else "exited early"
            else:
                row["cpu_per_wall_s"] = round((b - a) / wall, 4)
                row["from_launch"] = round(c / launch_wall, 4) if c is not None else None
                row["rss_mib"] = round((r.rss() or 0) / 2**20, 1)
            out.append(row)
        return out
    finally:
        # a second signal (Ctrl-C pressed again) must not cut the stop short
        held = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
        try:
            stop_all(runs)
        finally:
            for s, h in {**held, **old}.items():
                signal.signal(s, h)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=["h200", "sim", "guard"], default="sim")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=6.0)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--only", help="a regular expression: run only the commands whose label matches")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        import re
        specs = [sp for sp in presets(args.preset, tmp) if not args.only or re.search(args.only, sp[0])]
        rows = measure(specs, args.seconds, args.warmup)
    rat = ratios(rows, RATIOS.get(args.preset, []))
    print(f"CPU seconds per wall second; steady: {args.warmup:g}-{args.warmup + args.seconds:g} s after launch, "
          f"from launch: the first {args.seconds:g} s")
    print(f"{'command':40s} {'size':>7s} {'steady':>8s} {'from launch':>12s} {'RSS MiB':>8s}")
    for r in rows:
        if "error" in r:
            print(f"{r['command']:40s} {r['size']:>7s} {r['error']}")
        else:
            fl = r["from_launch"]
            print(f"{r['command']:40s} {r['size']:>7s} {r['cpu_per_wall_s']:8.4f} "
                  f"{fl if fl is not None else float('nan'):12.4f} {r['rss_mib']:8.1f}")
    if rat:
        print("ratios (steady, from launch)")
        fmt = lambda x: "  n/a" if x is None else f"{x:5.2f}"  # noqa: E731
        for r in rat:
            print(f"  {r['command']} / {r['reference']}: {fmt(r['cpu_per_wall_s'])} {fmt(r['from_launch'])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": os.uname().nodename, "cpus": os.cpu_count(), "seconds": args.seconds,
                       "warmup": args.warmup, "preset": args.preset, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "rows": rows, "ratios": rat}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
