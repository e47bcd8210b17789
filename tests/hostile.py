"""Files whose every outside string is hostile: Textual markup and terminal control sequences.

A GPU name, host name, process name and command line, driver, label, file name and every
recorded alert text carries one of the payloads below. The dashboard and the text output
must show them as visible characters, never act on them.
"""

from __future__ import annotations

import dataclasses
import os

from traintop.collectors.simulated import Simulator
from traintop.watch.monitor import Monitor
from traintop.record.recording import RecordingWriter
from traintop.findings import Finding, Severity
from traintop.samples import ProcInfo

# Control payloads: a window title (OSC 0), a clipboard write (OSC 52), a screen clear (ED),
# a bell, an 8-bit CSI. None of these may reach the terminal as bytes.
OSC_TITLE = "\x1b]0;PWNED\x1b\\"
OSC_CLIPBOARD = "\x1b]52;c;cHduZWQ=\x07"
CLEAR = "\x1b[2J"
C1_CSI = "\x9b31m"
CONTROL_PAYLOADS = (OSC_TITLE, OSC_CLIPBOARD, CLEAR, C1_CSI)
# What reaches the terminal if any of them leaks (as raw bytes, in UTF-8).
LEAKS = (b"\x1b]0;PWNED", b"\x1b]52;", b"\x1b[2J", "\x9b".encode())

# Markup payloads: applied, they make a link, a style, an action, or vanish ([H100]).
LINK = "[link=https://evil.example/]click[/link]"
CLOSE_ALL = "[/]evil"
RED = "[bold red]RED[/]"
ACTION = "[@click=app.quit]Q[/]"
VANISH = "[H100]"

GPU_NAMES = (f"{VANISH} {LINK}{OSC_TITLE}", f"{CLOSE_ALL}{CLEAR}")
HOSTNAME = f"{RED}host{OSC_CLIPBOARD}"
DRIVER = f"{ACTION}535{C1_CSI}"
LABEL = f"{VANISH}label{CLEAR}"
PROC_NAME = f"{CLOSE_ALL}{OSC_TITLE}"
CMDLINE = f"{OSC_TITLE}{OSC_CLIPBOARD}{CLEAR}sleep 300 {RED}"
WORKER_NAME = f"{ACTION}{C1_CSI}"
ALERT_TITLE = f"{LINK} title{OSC_TITLE}"
ALERT_EVIDENCE = f"{RED} evidence{OSC_CLIPBOARD}{C1_CSI}\nsecond line"
ALERT_REMEDY = f"{CLOSE_ALL} remedy {ACTION}{CLEAR}"
ALERT_SUBJECT = f"gpu0{C1_CSI}"
FILE_NAME = f"[b]x{OSC_TITLE}.ttrec"

# Literal text that must be on screen when markup is not applied (control-free parts).
VISIBLE_MARKUP = ("[H100]", "[/]evil", "[bold red]RED[/]", "[@click=app.quit]Q[/]")
# How ``traintop.text.one_line`` shows an ESC: what the screen shows instead of a payload.
VISIBLE_ESC = "\\x1b]0;PWNED"


def hostile_recording(directory: str, gpus: int = 2, seconds: float = 60.0, interval: float = 0.5,
                      name: str = FILE_NAME) -> str:
    """A recording (written by the real writer) whose every string from outside is hostile;
    its alerts are the recording's own (same rules and thresholds), so replay and analyze
    show them as they are."""
    sim = Simulator("starved", gpus=gpus, seed=3, interval=interval)
    info = sim.info()
    info = dataclasses.replace(
        info, gpus=tuple(dataclasses.replace(g, name=GPU_NAMES[g.index % len(GPU_NAMES)]) for g in info.gpus),
        hostname=HOSTNAME, driver=DRIVER, cuda_driver=DRIVER, label=LABEL)
    path = os.path.join(directory, name)
    rec = RecordingWriter(path, info, flush_every=1e9)
    monitor = Monitor(info, recorder=rec)
    t = sim.t0
    for _ in range(int(seconds / interval)):
        f = sim.next_frame()
        t = f.t
        p = f.process
        members = tuple(dataclasses.replace(m, name=WORKER_NAME) if m.is_loader_worker else m for m in p.members)
        members += (ProcInfo(p.pid + 999, PROC_NAME, 1.0, 1 << 20, 1),)
        monitor.ingest(dataclasses.replace(f, process=dataclasses.replace(
            p, name=PROC_NAME, cmdline=CMDLINE, members=members)), evaluate=False)
    rec.alert(Finding("starvation", ALERT_TITLE, ALERT_SUBJECT, Severity.CRITICAL, sim.t0 + 1, None, ALERT_EVIDENCE,
                      (ALERT_REMEDY, ALERT_REMEDY + " 2"), id=1))
    rec.alert(Finding("underuse", ALERT_TITLE + " ended", "gpu1", Severity.WARNING, sim.t0 + 2, t - 5, ALERT_EVIDENCE,
                      (ALERT_REMEDY,), id=2))
    rec.flush()
    rec.close()
    return path


def hostile_csv(directory: str, name: str = "smi.csv", rows: int = 40) -> str:
    """An nvidia-smi query log whose GPU names carry markup and control sequences."""
    path = os.path.join(directory, name)
    header = "timestamp, index, name, utilization.gpu [%], power.draw [W], power.limit [W], memory.used [MiB], " \
             "memory.total [MiB], temperature.gpu"
    lines = [header]
    for k in range(rows):
        for i, gname in enumerate(GPU_NAMES):
            util = 100 if (k // 2) % 2 else 0
            lines.append(f"2026/11/30 10:00:{k:02d}.000, {i}, {gname.replace(',', ' ')}, {util} %, 300.00 W, "
                         f"700.00 W, 1000 MiB, 143771 MiB, 50")
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write("\n".join(lines) + "\n")
    return path
