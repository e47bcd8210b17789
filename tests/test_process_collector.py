"""Attaching to real processes: the tree, loader workers by name, exit, bad PIDs."""

import os
import subprocess
import sys
import time

import pytest
from waiting import until

from traintop.collectors.process import ProcessCollector
from traintop.errors import TraintopError

# A parent with two children that rename themselves like PyTorch's loader workers and burn CPU.
PARENT = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None)
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        libc.prctl(15, b"pt_data_worker", 0, 0, 0)  # PR_SET_NAME
        end = time.time() + 30
        while time.time() < end:
            pass
        os._exit(0)
    kids.append(pid)
print("ready", flush=True)
time.sleep(30)
"""


@pytest.fixture
def job():
    p = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"ready"
    yield p
    p.kill()
    p.wait()
    os.system(f"pkill -9 -P {p.pid} 2>/dev/null")


def test_tree_and_loader_workers(job):
    c = ProcessCollector(job.pid)
    c.sample()
    # The workers spin; on a loaded machine one 0.6 s window may give them little CPU, so read
    # a few windows (a collector that never sees their CPU still fails).
    busiest = 0.0
    for _ in range(20):
        time.sleep(0.6)
        s = c.sample()
        assert s.alive and s.pid == job.pid
        workers = s.loader_workers
        assert len(workers) == 2
        assert all(w.name == "pt_data_worker" for w in workers)
        busiest = max([busiest] + [w.cpu_percent for w in workers])
        if busiest > 20:
            break
    assert busiest > 20  # they spin (2 cores, shared with the suite)
    assert s.rss and s.threads >= 3


def test_exit_is_reported_and_history_kept(job):
    c = ProcessCollector(job.pid)
    c.sample()
    job.kill()
    job.wait()
    s = c.sample()
    assert not s.alive and c.ended_at is not None


def test_missing_pid_is_one_line():
    with pytest.raises(TraintopError, match="no process with PID"):
        ProcessCollector(2**22 + 12345)


def test_nonsense_pid():
    with pytest.raises(TraintopError, match="positive"):
        ProcessCollector(0)


def test_behind_a_shim_the_job_is_called_by_the_process_it_execs(tmp_path):
    """A pyenv shim is a script that execs python in the same process: the name follows the exec."""
    shim = tmp_path / "python3"
    shim.write_text(f"#!/bin/bash\nread _\nexec {sys.executable} -c 'import time; time.sleep(30)'\n")
    shim.chmod(0o755)
    p = subprocess.Popen([str(shim)], stdin=subprocess.PIPE)
    try:
        c = ProcessCollector(p.pid)
        assert c.sample().name in ("python3", "bash")  # the shim, before the exec
        p.stdin.write(b"go\n")
        p.stdin.flush()
        # The shim is itself called python3, so wait on the command line the exec gives
        s = until(lambda: (x := c.sample()) and "time.sleep(30)" in x.cmdline and x)
        assert s and s.name.startswith("python") and not s.cmdline.startswith("/bin/bash")
    finally:
        p.kill()
        p.wait()


def test_through_a_wrapper_with_one_child_the_job_is_called_by_the_child():
    """`conda run`, `bash -c 'python …; echo done'`: the wrapper's only child is the job."""
    p = subprocess.Popen(["bash", "-c", f"{sys.executable} -c 'import time; time.sleep(30)'; echo done"])
    try:
        c = ProcessCollector(p.pid)
        s = until(lambda: (x := c.sample()).name.startswith("python") and x)
        assert s and s.pid == p.pid and "time.sleep(30)" in s.cmdline
    finally:
        for child in __import__("psutil").Process(p.pid).children(recursive=True):
            child.kill()
        p.kill()
        p.wait()


def test_torchruns_agent_is_called_torchrun_not_by_its_process_title():
    """torchrun's elastic agent sets its title to "pt_elastic" (torch/distributed/run.py)."""
    code = ("import ctypes, time; ctypes.CDLL(None).prctl(15, b'pt_elastic', 0, 0, 0); "  # PR_SET_NAME
            "print('ready', flush=True); time.sleep(30)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline().strip() == b"ready"
        c = ProcessCollector(p.pid)
        s = c.sample()
        assert c.name == s.name == "torchrun" and [m.name for m in s.members] == ["torchrun"]
    finally:
        p.kill()
        p.wait()


def test_torch_is_seen_in_the_process_maps():
    from traintop.collectors.process import maps_torch

    assert maps_torch(os.getpid()) in (False, True)  # readable
    assert maps_torch(1 << 30) is None  # no such process: not known
    pytest.importorskip("torch")
    p = subprocess.Popen([sys.executable, "-c", "import torch, time; print('ready', flush=True); time.sleep(60)"],
                         stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline().strip() == b"ready"
        assert maps_torch(p.pid) is True
        c = ProcessCollector(p.pid)
        assert c.sample().torch is True
    finally:
        p.kill()
        p.wait()
    q = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert ProcessCollector(q.pid).sample().torch is False
    finally:
        q.kill()
        q.wait()


def test_the_tree_is_every_process_under_the_job_grandchildren_included():
    """Read from each task's children file (not every process's stat on the host): the same
    processes psutil finds by walking them all, threads' children too."""
    import psutil

    from traintop.collectors.process import descendants

    code = ("import os, subprocess, sys, threading, time\n"
            "kid = subprocess.Popen(['sh', '-c', 'sleep 30 & sleep 30; wait'])\n"  # a child with children
            "threading.Thread(target=lambda: subprocess.Popen(['sleep', '30'])).start()\n"  # a thread's child
            "print('ready', flush=True); time.sleep(30)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline().strip() == b"ready"
        want = until(lambda: (kids := {c.pid for c in psutil.Process(p.pid).children(recursive=True)})
                     and len(kids) >= 4 and kids)
        assert want and set(descendants(p.pid)) == want
        c = ProcessCollector(p.pid)
        assert {m.pid for m in c.sample().members} == want | {p.pid}
    finally:
        for k in psutil.Process(p.pid).children(recursive=True):
            k.kill()
        p.kill()
        p.wait()


def test_between_full_walks_main_threads_children_are_found_at_once_and_other_threads_children_later():
    """Every thread's children file is read every TREE_EVERY_S; between, each process's main
    thread's (where DataLoader and compile workers start): a worker started by the main thread
    is in the next sample, one started by another thread within TREE_EVERY_S."""
    import psutil

    from traintop.collectors import process

    code = ("import subprocess, sys, threading, time\n"
            "print('ready', flush=True)\n"
            "sys.stdin.readline(); subprocess.Popen(['sleep', '30'])\n"  # from the main thread
            "sys.stdin.readline(); threading.Thread(target=lambda: (subprocess.Popen(['sleep', '31']), time.sleep(30)),\n"
            "                                       daemon=True).start()\n"  # a thread that lives on: the child stays its
            "time.sleep(30)")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    clock = [100.0]
    try:
        assert p.stdout.readline().strip() == b"ready"
        c = ProcessCollector(p.pid, clock=lambda: clock[0])
        assert {m.pid for m in c.sample().members} == {p.pid}

        def kids():
            return {k.pid for k in psutil.Process(p.pid).children()}

        p.stdin.write(b"\n")
        p.stdin.flush()
        first = until(lambda: len(kids()) == 1 and kids())
        clock[0] += 1
        assert {m.pid for m in c.sample().members} == {p.pid} | first
        p.stdin.write(b"\n")
        p.stdin.flush()
        both = until(lambda: len(kids()) == 2 and kids())
        clock[0] += 1
        assert {m.pid for m in c.sample().members} == {p.pid} | first  # a thread's child: not yet
        clock[0] += process.TREE_EVERY_S
        assert {m.pid for m in c.sample().members} == {p.pid} | both
        clock[0] += 1
        assert {m.pid for m in c.sample().members} == {p.pid} | both  # kept between full walks
    finally:
        for k in psutil.Process(p.pid).children(recursive=True):
            k.kill()
        p.kill()
        p.wait()


def test_a_process_read_from_proc_gives_what_psutil_gives():
    import psutil

    from traintop.collectors.process import read_cmdline, read_io, read_rss, read_stat

    me = psutil.Process()
    comm, state, ppid, ticks, threads, start = read_stat(os.getpid())
    assert comm == me.name()[:15] and ppid == me.ppid() and threads == me.num_threads() and state in "RS"
    assert read_cmdline(os.getpid()) == me.cmdline()
    assert abs(read_rss(os.getpid()) - me.memory_info().rss) < 64 * 2**20
    io = read_io(os.getpid())
    assert io is None or io[0] <= me.io_counters().read_bytes
    assert read_stat(2**22 + 12345) is None and read_rss(2**22 + 12345) is None and read_cmdline(2**22 + 12345) == []
