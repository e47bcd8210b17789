"""Save every message the probes of running jobs publish (JSON lines, as sent), for checking
what reached traintop; optionally ask every probe for its threads' stacks at given seconds.

    python scripts/probe_tap.py --seconds 90 --ask 35,60 stall-probe.jsonl
"""

from __future__ import annotations

import argparse
import glob
import os
import select
import socket
import time

from traintop.injob.agent import probe_dir


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--ask", default="", help="seconds after the start at which to ask for the stacks")
    args = ap.parse_args()
    asks = sorted(float(a) for a in args.ask.split(",") if a.strip())
    conns: dict[str, socket.socket] = {}
    bufs: dict[socket.socket, bytes] = {}
    t0 = time.monotonic()
    with open(args.out, "wb") as out:
        while time.monotonic() - t0 < args.seconds:
            for path in glob.glob(os.path.join(probe_dir(), "probe-*.sock")):
                if path in conns:
                    continue
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect(path)
                except OSError:
                    s.close()
                    continue
                conns[path], bufs[s] = s, b""
            if asks and time.monotonic() - t0 >= asks[0]:
                asks.pop(0)
                for s in conns.values():
                    try:
                        s.send(b"stacks\n")
                    except OSError:
                        pass
            readable, _, _ = select.select(list(conns.values()), [], [], 0.2) if conns else ([], [], time.sleep(0.2))
            for s in readable:
                try:
                    chunk = s.recv(1 << 20)
                except OSError:
                    chunk = b""
                if not chunk:
                    path = next(p for p, c in conns.items() if c is s)
                    del conns[path], bufs[s]
                    s.close()
                    continue
                *lines, bufs[s] = (bufs[s] + chunk).split(b"\n")
                for line in lines:
                    out.write(line + b"\n")
                out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
