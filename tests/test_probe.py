"""The probe: protocol, hooks, permissions, a stuck reader, traintop restarting, `traintop run`."""

import json
import os
import socket
import stat
import subprocess
import sys
import time
import types

import pytest

from traintop.injob import agent as probe_agent
from traintop.collectors.probe_client import ProbeClient
from traintop.injob.agent import Probe, ensure_private_dir, peer_uid


class FakeIter:
    def __init__(self, delay):
        self.delay = delay

    def __next__(self):
        time.sleep(self.delay)
        return 1


@pytest.fixture
def fake_torch(monkeypatch):
    hooks = []
    stats = {"allocated_bytes.all.current": 3 << 30, "reserved_bytes.all.current": 5 << 30,
             "allocated_bytes.all.peak": 4 << 30, "active_bytes.all.current": 3 << 30,
             "inactive_split_bytes.all.current": 1 << 28, "num_alloc_retries": 2, "num_ooms": 0}
    cuda = types.SimpleNamespace(is_initialized=lambda: True, device_count=lambda: 2, current_device=lambda: 1,
                                 memory_stats=lambda d: stats if d == 1 else {"reserved_bytes.all.current": 0})
    optimizer_mod = types.SimpleNamespace(register_optimizer_step_post_hook=hooks.append)
    torch = types.ModuleType("torch")
    torch.cuda = cuda
    torch.optim = types.SimpleNamespace(optimizer=optimizer_mod)
    dl = types.ModuleType("torch.utils.data.dataloader")
    dl._BaseDataLoaderIter = type("_BaseDataLoaderIter", (FakeIter,), {})
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.optim.optimizer", optimizer_mod)
    monkeypatch.setitem(sys.modules, "torch.utils.data.dataloader", dl)
    torch.hooks, torch.stats, torch.dl = hooks, stats, dl
    return torch


@pytest.fixture
def probe_dir(tmp_path, monkeypatch):
    d = tmp_path / "probes"
    monkeypatch.setenv("TRAINTOP_PROBE_DIR", str(d))
    return d


def test_message_carries_memory_steps_and_input_wait(fake_torch, probe_dir):
    p = Probe()
    p._install_hooks()
    assert fake_torch.hooks == [p._on_step]
    it = fake_torch.dl._BaseDataLoaderIter(0.02)
    for _ in range(3):
        next(it)
        fake_torch.hooks[0](None, (), {})
    msg = json.loads(p.message())
    assert msg["v"] == 1 and msg["cuda"] is True and msg["steps"] == 3
    assert len(msg["step_times"]) == 2 and all(t >= 0.015 for t in msg["step_times"])
    assert msg["input_wait"] >= 0.05
    (mem,) = msg["memory"]  # device 0 holds nothing and is not the current one
    assert mem["device"] == 1 and mem["allocated"] == 3 << 30 and mem["reserved"] == 5 << 30
    assert mem["alloc_retries"] == 2
    assert json.loads(p.message())["step_times"] == []  # per window


def test_message_says_whether_torch_and_a_dataloader_were_seen(fake_torch, probe_dir, monkeypatch):
    p = Probe()
    p._install_hooks()
    msg = json.loads(p.message())
    assert msg["torch"] is True and msg["loader"] is False  # no batch yet: the input wait measures nothing
    next(fake_torch.dl._BaseDataLoaderIter(0.0))
    assert json.loads(p.message())["loader"] is True
    monkeypatch.delitem(sys.modules, "torch")
    assert json.loads(Probe().message())["torch"] is False


def test_without_a_dataloader_the_client_reports_no_input_wait():
    from traintop.collectors.probe_client import parse_message

    base = {"v": 1, "pid": 42, "t": time.time(), "window": 1.0, "cuda": False, "steps": 3, "input_wait": 0.0,
            "torch": True, "loader": False}
    assert parse_message(json.dumps(base).encode()) is not None
    assert parse_message(json.dumps(dict(base, loader="yes")).encode()) is None  # outside input: checked
    client = ProbeClient.__new__(ProbeClient)
    client._clock, client._rates = time.monotonic, {}
    conn = types.SimpleNamespace(pid=42, last=base, step_times=[], wait=0.0, window=1.0, last_seen=time.monotonic(),
                                 uid=None, ledger={})
    r = client._rank(conn, time.monotonic())
    assert r.input_wait is None and r.loader is False and r.torch is True
    conn.last = dict(base, loader=True)
    assert client._rank(conn, time.monotonic()).input_wait == 0.0


def test_a_long_wait_is_split_across_windows(fake_torch, probe_dir):
    import threading

    p = Probe()
    p._install_hooks()
    it = fake_torch.dl._BaseDataLoaderIter(0.5)  # one batch takes 0.5 s to arrive
    th = threading.Thread(target=lambda: next(it))
    p.message()
    th.start()
    shares = []
    for _ in range(4):  # windows of 0.15 s while the wait goes on
        time.sleep(0.15)
        m = json.loads(p.message())
        shares.append(m["input_wait"] / m["window"])
    th.join()
    assert all(s > 0.8 for s in shares[:3]), shares  # each window is (nearly) all waiting
    tail = json.loads(p.message())
    assert tail["input_wait"] < 0.15  # nothing counted twice


def test_cpu_job_is_never_pushed_onto_cuda(fake_torch, probe_dir):
    fake_torch.cuda.is_initialized = lambda: False
    fake_torch.cuda.memory_stats = lambda d: pytest.fail("memory_stats would initialise CUDA")
    msg = json.loads(Probe().message())
    assert msg["cuda"] is False and msg["memory"] == []


def test_private_directory_and_socket(fake_torch, probe_dir):
    p = Probe(interval=0.05)
    assert p.start()
    try:
        assert stat.S_IMODE(os.stat(probe_dir).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(p.path).st_mode) == 0o600
        s = socket.socket(socket.AF_UNIX)
        s.connect(p.path)
        assert peer_uid(s) == os.getuid()
        s.close()
    finally:
        p.stop()
    assert not os.path.exists(p.path)


def test_refuses_a_directory_others_can_read(probe_dir):
    probe_dir.mkdir(mode=0o755)
    os.chmod(probe_dir, 0o755)
    with pytest.raises(PermissionError, match="open to others"):
        ensure_private_dir(str(probe_dir))
    assert Probe().start() is False  # says so on stderr, the job goes on


def test_client_reads_ranks_and_survives_traintop_restarting(fake_torch, probe_dir):
    p = Probe(interval=0.05)
    assert p.start()
    try:
        pid = os.getpid()
        for attempt in range(2):  # a second traintop after the first went away
            client = ProbeClient()
            ranks = ()
            for _ in range(40):
                fake_torch.hooks and fake_torch.hooks[0](None, (), {})
                time.sleep(0.03)
                ranks = client.sample({pid})
                if ranks and ranks[0].steps:
                    break
            assert ranks, f"no data on attempt {attempt}"
            r = ranks[0]
            assert r.pid == pid and r.cuda and r.allocated == 3 << 30 and r.reserved == 5 << 30
            assert r.device == 1 and r.alloc_retries == 2
            client.close()
    finally:
        p.stop()


def test_a_stuck_reader_never_blocks_the_publisher(fake_torch, probe_dir):
    p = Probe(interval=10)  # we drive publishing by hand
    assert p.start()
    try:
        stuck = socket.socket(socket.AF_UNIX)
        stuck.connect(p.path)
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        good = ProbeClient()
        good.sample({os.getpid()})
        deadline = time.time() + 2
        while len(p._clients) < 2 and time.time() < deadline:
            p._accept()
            time.sleep(0.01)
        msg = p.message()
        worst = 0.0
        for _ in range(3000):  # far more than a socket buffer holds
            t = time.perf_counter()
            p._publish(msg)
            worst = max(worst, time.perf_counter() - t)
            good.sample({os.getpid()})
        assert worst < 0.05  # never waited on the reader
        assert p.drops >= 1  # the stuck reader lost messages and was let go
        assert len(p._clients) == 1
        stuck.close()
    finally:
        p.stop()


def test_the_publishing_thread_accepting_after_stop_is_a_no_op(fake_torch, probe_dir):
    # stop() waits a second for the publishing thread, then closes the socket: a thread still in
    # its loop (a slow tick) may come to accept after that
    p = Probe(interval=10)
    assert p.start()
    p.stop()
    p._accept()
    assert p._clients == []


def test_a_probe_of_another_user_is_refused(probe_dir, monkeypatch):
    probe_dir.mkdir(mode=0o700)
    path = probe_dir / "probe-4242.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(1)
    monkeypatch.setattr("traintop.collectors.probe_client.peer_uid", lambda s: 12345)
    client = ProbeClient()
    assert client.sample({4242}) == ()
    assert 4242 in client.rejected
    srv.close()


def test_garbage_on_the_channel_is_ignored(probe_dir):
    probe_dir.mkdir(mode=0o700)
    path = probe_dir / "probe-777.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(1)
    client = ProbeClient()
    client.sample({777})
    conn, _ = srv.accept()
    conn.sendall(b"not json\n[1,2]\n" + json.dumps({"v": 1, "pid": 777, "steps": "x"}).encode() + b"\n")
    time.sleep(0.05)
    assert client.sample({777}) == () and client.bad_messages == 3  # a message with a bad field is dropped whole
    conn.sendall(json.dumps({"v": 1, "pid": 777, "steps": 5}).encode() + b"\n")
    time.sleep(0.05)
    ranks = client.sample({777})
    assert len(ranks) == 1 and ranks[0].steps == 5
    conn.close()
    srv.close()



def _stacks_from(probe, client_sock, deadline_s=3.0):
    """Messages the probe publishes until one carries stacks (the probe thread runs)."""
    buf, end = b"", time.time() + deadline_s
    client_sock.settimeout(0.2)
    while time.time() < end:
        try:
            buf += client_sock.recv(1 << 20)
        except socket.timeout:
            continue
        *lines, buf = buf.split(b"\n")
        for line in lines:
            msg = json.loads(line)
            if "stacks" in msg:
                return msg
    return None


def test_stacks_of_every_thread_on_request(fake_torch, probe_dir):
    import threading

    release = threading.Event()
    th = threading.Thread(target=lambda: release.wait(10), name="loader-feeder")
    th.start()
    p = Probe(interval=0.05)
    assert p.start()
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(p.path)
        time.sleep(0.2)
        assert _stacks_from(p, s, 0.3) is None  # not unless asked (or stalled)
        s.sendall(b"stacks\n")
        msg = _stacks_from(p, s)
        assert msg is not None and msg["stacks_reason"] == "requested"
        names = [d["thread"] for d in msg["stacks"]]
        assert names[0] == "MainThread" and msg["stacks"][0]["main"]
        assert "loader-feeder" in names and "traintop-probe" not in names
        feeder = next(d for d in msg["stacks"] if d["thread"] == "loader-feeder")
        assert "release.wait" in feeder["stack"]  # the line it blocks on
        s.close()
    finally:
        release.set()
        p.stop()


def test_stacks_sent_on_its_own_once_the_job_stops_stepping(fake_torch, probe_dir):
    p = Probe()
    p._install_hooks()
    for _ in range(5):
        fake_torch.hooks[0](None, (), {})
    first = json.loads(p.message())
    assert "stacks" not in first and first["since_step"] < 1
    p._recent_steps = [20.0] * 5  # usual step 20 s: a stall only after 60 s
    p._last_step -= 45
    assert "stacks" not in json.loads(p.message())
    p._last_step -= 20
    msg = json.loads(p.message())
    assert msg["stacks_reason"] == "stalled" and msg["since_step"] >= 65
    assert "stacks" not in json.loads(p.message())  # once per stall, not every message
    p._stall_stacks_at -= probe_agent.STALL_REPEAT_S
    assert json.loads(p.message())["stacks_reason"] == "stalled"  # and again a minute later
    fake_torch.hooks[0](None, (), {})  # stepping again: no stall
    assert "stacks" not in json.loads(p.message())


def test_stacks_are_bounded(fake_torch, probe_dir, monkeypatch):
    import threading

    monkeypatch.setattr(probe_agent, "MAX_STACK_BYTES", 300)
    go = threading.Event()
    waiting = [threading.Thread(target=go.wait, name=f"w{i}") for i in range(3)]
    for t in waiting:  # threads after the one that fills the budget must add nothing
        t.start()
    try:
        out = probe_agent.thread_stacks()
    finally:
        go.set()
        for t in waiting:
            t.join()
    assert len(out) >= 4 and sum(len(d["stack"]) for d in out) <= 300


TRAIN = r"""
import time, torch
from torch.utils.data import DataLoader, Dataset
class Slow(Dataset):
    def __len__(self): return 10_000
    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.randn(8)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
end = time.time() + 4
for x in DataLoader(Slow(), batch_size=8, num_workers=2):
    loss = model(x).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if time.time() > end:
        break
"""


def test_traintop_run_injects_the_probe_into_a_real_torch_job(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    rec = tmp_path / "run.ttrec"
    env = dict(os.environ, TRAINTOP_PROBE_DIR=str(tmp_path / "probes"))
    r = subprocess.run([sys.executable, "-m", "traintop", "run", "--no-ui", "--interval", "0.25",
                        "--record", str(rec), "--log", str(tmp_path / "job.log"), "--",
                        sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr + (tmp_path / "job.log").read_text()
    from traintop.record.recording import RecordingReader

    frames = list(RecordingReader(str(rec)).frames())
    ranks = [rk for f in frames for rk in f.ranks]
    assert ranks, "no probe data recorded"
    last = max(ranks, key=lambda rk: rk.steps or 0)
    assert last.steps > 10 and last.cuda is False
    # 8 samples x 10 ms per batch from 2 workers = 40 ms a batch; the step takes ~1 ms: nearly all wait
    waits = [rk.input_wait for rk in ranks if rk.input_wait is not None and rk.steps]
    assert waits and sorted(waits)[len(waits) // 2] > 0.6
    assert any(rk.step_time for rk in ranks)
    workers = [m for f in frames if f.process for m in f.process.members if m.is_loader_worker]
    assert workers


def test_idle_readers_cannot_take_every_slot(fake_torch, probe_dir):
    """Eight connections that never read hold every slot; a ninth reader (traintop) gets in at
    once: the reader with the most unread data gives its slot up."""
    p = Probe(interval=0.05)
    assert p.start()
    idle = []
    try:
        for _ in range(probe_agent.MAX_CLIENTS):
            s = socket.socket(socket.AF_UNIX)
            s.connect(p.path)
            idle.append(s)
        deadline = time.time() + 5
        while (len(p._clients) < probe_agent.MAX_CLIENTS or p.sent < 2 * probe_agent.MAX_CLIENTS) \
                and time.time() < deadline:
            time.sleep(0.02)
        assert len(p._clients) == probe_agent.MAX_CLIENTS  # every slot taken, none reading
        client = ProbeClient()
        ranks = ()
        for _ in range(40):
            ranks = client.sample({os.getpid()})
            if ranks:
                break
            time.sleep(0.05)
        assert ranks and ranks[0].pid == os.getpid()
        assert p.evicted >= 1 and len(p._clients) <= probe_agent.MAX_CLIENTS
        client.close()
    finally:
        for s in idle:
            s.close()
        p.stop()


DDP = r"""
import os, sys, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
class Batches(Dataset):
    def __init__(self, delay): self.delay = delay
    def __len__(self): return 1 << 30
    def __getitem__(self, i):
        if self.delay: time.sleep(self.delay)
        return torch.ones(16, 64)
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
end = time.time() + float(sys.argv[1])
for x in DataLoader(Batches(0.04 if rank == 1 else 0.0), batch_size=None, num_workers=0):
    stop = torch.tensor([1.0 if time.time() > end else 0.0]); dist.all_reduce(stop)
    if stop.item() > 0: break
    loss = model(x).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
dist.destroy_process_group()
"""


def test_a_rank_waiting_for_a_slow_rank_in_the_all_reduce_is_not_waiting_for_input(tmp_path):
    """The measure behind the cross-host straggler: time a rank spends in DDP's all-reduce waiting
    for a slower rank is not input wait (only DataLoader.__next__ is). Two CPU ranks (gloo), rank 1's
    loader sleeps 40 ms a batch, rank 0's is instant: both step at rank 1's pace, rank 1 waits for
    input most of the step, rank 0 hardly at all (it waits in backward(), for rank 1)."""
    pytest.importorskip("torch")
    script = tmp_path / "ddp.py"
    script.write_text(DDP)
    rec = tmp_path / "run.ttrec"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, TRAINTOP_PROBE_DIR=str(tmp_path / "probes"), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "traintop", "run", "--no-ui", "--interval", "0.25",
                        "--record", str(rec), "--log", str(tmp_path / "job.log"), "--",
                        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "--master-addr", "127.0.0.1", "--master-port", str(port), str(script), "6"],
                       capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr + (tmp_path / "job.log").read_text()
    from traintop.record.recording import RecordingReader

    waits: dict[int, list[float]] = {0: [], 1: []}
    for f in RecordingReader(str(rec)).frames():
        for rk in f.ranks:
            if rk.rank in waits and rk.input_wait is not None and rk.steps:
                waits[rk.rank].append(rk.input_wait)
    assert len(waits[0]) >= 5 and len(waits[1]) >= 5, waits
    median = {k: sorted(v)[len(v) // 2] for k, v in waits.items()}
    assert median[1] > 0.5, median
    assert median[0] < 0.15, median


def test_the_socket_of_a_job_killed_by_a_signal_is_removed_by_the_next_reader(tmp_path):
    from traintop.collectors.node import AllProbes

    d = tmp_path / "probes"
    d.mkdir(mode=0o700)
    # a job that made its socket and was killed before it could remove it
    child = subprocess.Popen([sys.executable, "-c",
                              "import socket, os, sys, time; s = socket.socket(socket.AF_UNIX); "
                              "s.bind(sys.argv[1] + f'/probe-{os.getpid()}.sock'); s.listen(1); time.sleep(60)",
                              str(d)])
    for _ in range(100):
        if os.listdir(d):
            break
        time.sleep(0.05)
    child.kill()
    child.wait()
    (left,) = os.listdir(d)
    probes = AllProbes(dirs=lambda: [str(d)])
    assert probes.ranks() == ()
    probes.close()
    assert os.listdir(d) == []
    # a socket of a process that still lives is left alone, even with nobody listening
    alive = d / f"probe-{os.getpid()}.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(alive))
    s.close()
    probes = AllProbes(dirs=lambda: [str(d)])
    probes.ranks()
    probes.close()
    assert alive.exists()


def test_the_step_rate_is_taken_over_seconds_not_one_message():
    """A job that syncs every 10 steps sends messages holding 0 or 10 steps: the rate beside the step
    time is over RATE_S, so it neither swings between 0 and 30 steps/s nor contradicts the step time."""
    from traintop.collectors import probe_client

    rate = probe_client.StepRate()
    rates = [rate.rate(t * 0.33, (int(t * 0.33 / 2.0)) * 10, [], 0.0) for t in range(100)]
    settled = [r for r in rates[40:] if r is not None]
    assert settled and all(abs(r - 5.0) < 1.2 for r in settled)
    assert rates[0] is None  # not yet RATE_MIN_S of history, nor a step period


def test_a_starved_jobs_step_rate_stays_near_its_mean_however_its_steps_bunch_and_readers_reconnect(probe_dir):
    """A starved job steps in bursts (12 steps in a third of a second, then as long with none: 18
    steps/s on average). Its probe drops a reader that falls behind, which reconnects: the rate
    shown must stay near the mean, never 0.0 for a message with no step end nor 36 for a burst."""
    probe_dir.mkdir(mode=0o700)
    path = probe_dir / "probe-4343.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(4)
    now = [1000.0]
    client = ProbeClient(clock=lambda: now[0])
    client.sample({4343})
    conn, _ = srv.accept()
    steps, rates = 0, []
    try:
        for k in range(60):  # a message every 1/3 s, the reader dropped every 2 s
            burst = 12 if k % 2 else 0
            times = ([2 / 3 - 11 / 36] + [1 / 36] * 11) if burst else []  # the first after the gap
            steps += burst
            since = 0.0 if burst else 1 / 3
            conn.sendall(json.dumps({"v": 1, "pid": 4343, "steps": steps, "step_times": times, "window": 1 / 3,
                                     "since_step": since}).encode() + b"\n")
            time.sleep(0.01)
            now[0] += 1 / 3
            rates += [r.steps_per_s for r in client.sample({4343})]
            if k % 6 == 5:
                conn.close()
                client.sample({4343})  # sees the end of the connection
                client.sample({4343})  # and connects again
                conn, _ = srv.accept()
    finally:
        conn.close()
        srv.close()
        client.close()
    shown = [r for r in rates[2:] if r is not None]
    assert len(shown) > 40
    assert all(12.0 <= r <= 25.0 for r in shown), shown
