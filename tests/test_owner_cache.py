"""Whose each GPU process is, kept per process: looked up once while it lives, anew when its PID is
another process's (a fake /proc's start times, and real processes' pidfds), forgotten when it leaves."""

import os
import subprocess
import sys

from fakes import fake_proc

from traintop.collectors.owner_cache import OwnerCache, start_time
from traintop.collectors.whose import whose
from traintop.samples import GpuProcess, GpuSample, Owner


def _gpus(*pids):
    return (GpuSample(0, processes=tuple(GpuProcess(p, 2**30) for p in pids)),)


def _owners(gpus):
    return [(p.pid, p.owner.user, p.owner.uid) for g in gpus for p in g.processes]


def test_a_process_is_looked_up_once_while_it_lives(tmp_path):
    fake_proc(tmp_path, 4242, uid=0, start=500)
    asked = []
    now = [0.0]

    def lookup(pid, gpu_process, nested):
        asked.append(pid)
        return whose(pid, gpu_process, proc=str(tmp_path), nested=nested)
    cache = OwnerCache(lookup=lookup, clock=lambda: now[0], nested=False, proc=str(tmp_path))
    for _ in range(5):
        assert _owners(cache.attach(_gpus(4242))) == [(4242, "root", 0)]
        now[0] += 600.0  # ten minutes a sample: no periodic re-reading of a process that lives on
    assert asked == [4242]


def test_a_pid_taken_by_another_process_gets_its_owner_and_its_users_name(tmp_path):
    """The PID is seen in every sample: only the start time says that another process has it now."""
    fake_proc(tmp_path, 4242, uid=0, start=500)
    cache = OwnerCache(lookup=lambda pid, gpu_process, nested: whose(pid, gpu_process, proc=str(tmp_path),
                                                                     nested=nested),
                       nested=False, proc=str(tmp_path))
    assert _owners(cache.attach(_gpus(4242))) == [(4242, "root", 0)]
    fake_proc(tmp_path, 4242, uid=65534, start=900, name="other")  # ended; the PID went to another user's job
    got = cache.attach(_gpus(4242))
    assert got[0].processes[0].owner.uid == 65534 and got[0].processes[0].owner.user != "root"
    assert cache.attach(_gpus(4242))[0].processes[0].owner.uid == 65534


def test_a_process_that_leaves_the_gpus_is_forgotten_and_looked_up_again_if_it_returns(tmp_path):
    fake_proc(tmp_path, 7, start=1)
    fake_proc(tmp_path, 8, start=2)
    asked = []
    cache = OwnerCache(lookup=lambda pid, **_: asked.append(pid) or Owner(pid, uid=pid), nested=False,
                       proc=str(tmp_path))
    cache.attach(_gpus(7, 8))
    cache.attach(_gpus(8))
    assert cache.known(7) is None and cache.known(8) == Owner(8, uid=8)
    cache.attach(_gpus(7, 8))
    assert asked == [7, 8, 7]


def test_a_pid_with_no_process_here_is_looked_up_again_after_a_minute(tmp_path):
    """Another PID namespace's process: no start time to tell it by."""
    asked = []
    now = [0.0]
    cache = OwnerCache(lookup=lambda pid, **_: asked.append(pid) or Owner(pid, visible=False), clock=lambda: now[0],
                       nested=False, proc=str(tmp_path))
    cache.attach(_gpus(99))
    now[0] = 59.0
    cache.attach(_gpus(99))
    now[0] = 61.0
    cache.attach(_gpus(99))
    assert asked == [99, 99]


def test_a_real_process_that_ends_is_looked_up_anew_under_its_pid():
    """A real process, watched through a pidfd: while it lives one lookup; once it has ended, whatever
    NVML lists under its PID is looked up again (here the lookup answers with another owner)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    owners = iter([Owner(p.pid, uid=1000, user="alice"), Owner(p.pid, uid=1001, user="bob")])
    asked = []

    def lookup(pid, **_):
        asked.append(pid)
        return next(owners)
    fds = len(os.listdir("/proc/self/fd"))
    cache = OwnerCache(lookup=lookup, nested=False)
    try:
        for _ in range(3):
            assert _owners(cache.attach(_gpus(p.pid))) == [(p.pid, "alice", 1000)]
        assert start_time(p.pid) is not None
        p.kill()
        p.wait()
        assert _owners(cache.attach(_gpus(p.pid))) == [(p.pid, "bob", 1001)]
        assert asked == [p.pid, p.pid]
    finally:
        p.kill()
        p.wait()
        cache.close()
    assert len(os.listdir("/proc/self/fd")) == fds  # the pidfds are closed


def test_a_sample_whose_processes_carry_their_owners_already_is_passed_on_as_it_is(tmp_path):
    fake_proc(tmp_path, 5, start=1)
    cache = OwnerCache(lookup=lambda pid, **_: Owner(pid, uid=3), nested=False, proc=str(tmp_path))
    first = cache.attach(_gpus(5))
    again = (GpuSample(0, processes=(GpuProcess(5, 2**30, owner=cache.known(5)),)),)  # as the NVML collector builds it
    assert cache.attach(again) is again and first[0].processes[0].owner is cache.known(5)


def test_the_nvml_collector_puts_the_known_owners_on_its_processes(fake_nvml):
    from traintop.collectors.nvml import NvmlCollector

    nv, _ = fake_nvml()  # one process, PID 42
    col = NvmlCollector(nv)
    col.owner_of = {42: Owner(42, uid=7)}.get
    (g,) = col.sample()
    assert [(p.pid, p.owner) for p in g.processes] == [(42, Owner(42, uid=7))]
