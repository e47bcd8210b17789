"""Where a monitor's resident memory lies: RSS by mapping of processes started together.

    python bench/rss_map.py [--seconds 20] [--top 12] [--json OUT] -- LABEL=CMD [LABEL=CMD ...]

Each command runs on its own 160x48 pty (output drained) for ``--seconds``; then, for each,
VmRSS split into anonymous and file-backed pages and the mappings holding the most of it
(shared libraries by name, "[heap]", anonymous maps as "[anon]"), read from /proc/PID/smaps.
A command is a shell-free string split on spaces, e.g. ``rec="traintop record --interval 1 x.ttrec"``.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
import time

from benchio import save_json

_MAP = re.compile(r"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(.*)$")


def start(argv: list[str]) -> tuple[subprocess.Popen, int]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 48, 160, 0, 0))
    p = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                         env=dict(os.environ, TERM="xterm-256color", COLORTERM="truecolor"))
    os.close(slave)

    def drain():
        while True:
            try:
                if not os.read(master, 65536):
                    return
            except OSError:
                return

    threading.Thread(target=drain, daemon=True).start()
    return p, master


def by_mapping(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    name = "[anon]"
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            m = _MAP.match(line)
            if m:
                path = m.group(1) or "[anon]"
                name = os.path.basename(path) if path.startswith("/") else path
            elif line.startswith("Rss:"):
                out[name] = out.get(name, 0) + int(line.split()[1])
    return out


def status(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/status") as f:
        text = f.read()
    return {k: int(re.search(rf"{k}:\s+(\d+)", text).group(1)) for k in ("VmRSS", "RssAnon", "RssFile", "Threads")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json")
    ap.add_argument("commands", nargs="+", help="LABEL=CMD")
    args = ap.parse_args()
    specs = [c.split("=", 1) for c in args.commands]
    if any(len(s) != 2 for s in specs):
        ap.error("each command is LABEL=CMD")
    procs = [(label, *start(cmd.split())) for label, cmd in specs]
    time.sleep(args.seconds)
    report = {}
    for label, p, master in procs:
        if p.poll() is not None:
            report[label] = {"exited": p.returncode}
            continue
        st, maps = status(p.pid), by_mapping(p.pid)
        report[label] = {"rss_mib": round(st["VmRSS"] / 1024, 1), "anon_mib": round(st["RssAnon"] / 1024, 1),
                         "file_mib": round(st["RssFile"] / 1024, 1), "threads": st["Threads"],
                         "top": [(k, round(v / 1024, 2)) for k, v in sorted(maps.items(), key=lambda kv: -kv[1])
                                 [:args.top]]}
    for label, p, master in procs:
        try:
            os.killpg(p.pid, 9)
        except ProcessLookupError:
            pass
        p.wait()
        os.close(master)
    for label, r in report.items():
        if "exited" in r:
            print(f"{label}: exited with {r['exited']} before it was measured")
            continue
        print(f"{label}: RSS {r['rss_mib']} MiB (anonymous {r['anon_mib']}, files {r['file_mib']}), "
              f"{r['threads']} threads")
        for name, mib in r["top"]:
            print(f"  {mib:7.2f} MiB  {name}")
    save_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
