"""Attaching to real processes: the tree, loader workers by name, exit, bad PIDs."""

import os
import subprocess
import sys
import time

import pytest

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
