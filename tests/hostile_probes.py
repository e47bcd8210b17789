"""Another local user's processes in their own probe directory, attacking the root agent that
reads it: sockets that listen and never answer, probes that name a new rank in every message
or send bare newlines as fast as they can, plain files named like sockets.

Each attacker is a forked child running as ``uid`` (it needs no access to this Python), ended
by ``stop`` or, at the latest, after ``life_s``.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import tempfile
import time


def user_probe_dir(uid: int = 65534) -> tuple[str, str]:
    """A private probe directory of ``uid`` (0700, hers) in a folder others may pass through;
    returns (the folder to remove, the directory)."""
    base = tempfile.mkdtemp(prefix="traintop-hostile-")
    os.chmod(base, 0o711)
    d = os.path.join(base, "probes")
    os.mkdir(d, 0o700)
    os.chown(d, uid, uid)
    return base, d


def _message(pid: int, rank: int, job: str, steps: int = 10, world_size: int = 1 << 20) -> bytes:
    msg = {"v": 1, "pid": pid, "rank": rank, "local_rank": 0, "world_size": world_size, "job": job, "steps": steps,
           "step_times": [0.1], "window": 0.1, "input_wait": 0.0, "t": time.time()}
    return (json.dumps(msg) + "\n").encode()


def attack(directory: str, mode: str, n: int = 1, uid: int = 65534, life_s: float = 60.0, first: int = 100_000) -> int:
    """Start an attacker; returns its pid once its sockets or files are in place.

    ``listen``: n sockets that listen and never accept; ``new_ranks``: n probes, each message
    naming a rank never named before; ``newlines``: n probes sending bare newlines as fast as
    they can; ``files``: n plain files named ``probe-N.sock`` (then it waits); ``steps``: n
    well-behaved probes of job "legit", ten messages a second, one more step in each."""
    r, w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(w)
        ready = os.read(r, 1)
        os.close(r)
        if ready != b"y":
            os.waitpid(pid, 0)
            raise RuntimeError(f"the attacker as uid {uid} could not set up ({mode})")
        return pid
    try:  # the child: nothing here may return into pytest
        os.close(r)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.setgid(uid)
        os.setuid(uid)
        _serve(directory, mode, n, w, time.monotonic() + life_s, first)
    finally:
        os._exit(0)


def _serve(directory: str, mode: str, n: int, ready: int, end: float, first: int) -> None:
    if mode == "files":
        for k in range(n):
            os.close(os.open(os.path.join(directory, f"probe-{first + k}.sock"), os.O_CREAT | os.O_WRONLY, 0o600))
        os.write(ready, b"y")
        while time.monotonic() < end:
            time.sleep(0.5)
        return
    servers = []
    for k in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(os.path.join(directory, f"probe-{first + k}.sock"))
        s.listen(64)
        s.setblocking(False)
        servers.append(s)
    os.write(ready, b"y")
    if mode == "listen":
        while time.monotonic() < end:
            time.sleep(0.5)
        return
    conns: list[socket.socket] = []
    rank = 0
    newlines = b"\n" * 65536
    while time.monotonic() < end:
        readable, writable, _ = select.select(servers, conns, [], 0.05)
        if mode == "steps":
            time.sleep(0.1)
        for s in readable:
            try:
                c, _ = s.accept()
                c.setblocking(False)
                conns.append(c)
            except OSError:
                pass
        for c in writable:
            try:
                if mode == "newlines":
                    c.send(newlines)
                elif mode == "steps":
                    rank += 1
                    c.send(_message(os.getpid(), 0, "legit", steps=rank, world_size=1))
                else:
                    rank += 1
                    c.send(_message(os.getpid(), rank % (1 << 20), "4242"))
            except BlockingIOError:
                pass
            except OSError:
                conns.remove(c)
                c.close()


def stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except OSError:
        pass


def remove(base: str) -> None:
    shutil.rmtree(base, ignore_errors=True)


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
