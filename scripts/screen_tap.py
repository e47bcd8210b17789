"""Run a traintop command on a pseudo-terminal of a given size and save what its screen shows, as
text, at given seconds and when it ends (what a user in a tmux pane would have read).

    python scripts/screen_tap.py --size 160x48 --at 40,80 --out dash -- python3 -m traintop --pid 1234
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import termios
import time

import pyte


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="160x48")
    ap.add_argument("--at", default="", help="seconds after the start at which to save the screen")
    ap.add_argument("--seconds", type=float, default=600.0, help="stop the command (q, then SIGTERM) after this")
    ap.add_argument("--out", required=True, help="files OUT-<seconds>s.txt")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cols, rows = (int(x) for x in a.size.split("x"))
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    marks = sorted(float(x) for x in a.at.split(",") if x.strip())
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                            env=dict(os.environ, TERM="xterm-256color", COLUMNS=str(cols), LINES=str(rows)))
    os.close(slave)
    screen = pyte.Screen(cols, rows)
    stream = pyte.ByteStream(screen)
    t0 = time.monotonic()

    def save(tag: str) -> None:
        with open(f"{a.out}-{tag}.txt", "w") as fh:
            fh.write("\n".join(line.rstrip() for line in screen.display) + "\n")

    quit_sent = False
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    while True:
        if stop:  # asked to stop: the screen as it is now, then the command
            save("end")
            os.killpg(proc.pid, signal.SIGTERM)
            break
        now = time.monotonic() - t0
        while marks and now >= marks[0]:
            save(f"{marks.pop(0):.0f}s")
        if now >= a.seconds and not quit_sent:
            save("end")
            os.write(master, b"q")
            quit_sent = True
        if now >= a.seconds + 5:
            os.killpg(proc.pid, signal.SIGTERM)
        r, _, _ = select.select([master], [], [], 0.2)
        if r:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            stream.feed(data)
        if proc.poll() is not None and not r:
            break
    if not quit_sent and not stop:
        save("end")
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
