"""The probe's time ledger, precision reading and per-step FLOPs, on a real (CPU) torch job."""

import gzip
import json
import time
import os
import subprocess
import sys
import textwrap
import types

import pytest

from traintop.injob import goodput as probe_goodput
from traintop.injob.goodput import BUCKETS, Goodput, matmul_precision, stack_kind

# A job whose phases are known: each one timed by the job itself, as the corpus workloads do.
JOB = textwrap.dedent("""
    import json, time
    import traintop.injob.goodput as g
    g.PRECISION_EVERY_S = 0.3
    from traintop.injob.agent import Probe
    import torch
    p = Probe(interval=0.1); assert p.start()
    phase = {}
    def mark(name, t0):
        phase[name] = phase.get(name, 0.0) + time.perf_counter() - t0
    B, I, H, O = 32, 64, 128, 10
    m = torch.nn.Sequential(torch.nn.Linear(I, H), torch.nn.ReLU(), torch.nn.Linear(H, O))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x = torch.randn(B, I)
    def step():
        loss = m(x).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step(); time.sleep(0.01)
    step()
    t0 = time.perf_counter()
    for _ in range(80): step()
    # the first reading comes at a window's end: a loaded machine may need more steps (bounded)
    end = time.perf_counter() + 30
    while p.goodput.precision is None and time.perf_counter() < end:
        step()
    mark("train", t0)
    t0 = time.perf_counter()
    with torch.no_grad():
        end = time.perf_counter() + 1.5
        while time.perf_counter() < end:
            m(x); time.sleep(0.01)
    mark("eval", t0)
    precision_fp32 = p.goodput.precision
    class SlowDisk:
        def write(self, b): time.sleep(0.0005 * max(1, len(b) // 4096)); return len(b)
        def flush(self): pass
    t0 = time.perf_counter()
    for _ in range(2):
        torch.save({"w": torch.randn(1 << 20)}, SlowDisk())
    mark("checkpoint", t0)
    t0 = time.perf_counter()
    for _ in range(40): step()
    mark("train", t0)
    t0 = time.perf_counter(); time.sleep(1.2); mark("other", t0)
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(60): step()
        # the precision is read every PRECISION_EVERY_S: a loaded machine may need more steps (bounded)
        end = time.perf_counter() + 30
        while (p.goodput.precision or {}).get("matmul") != "bf16" and time.perf_counter() < end:
            step()
    mark("train", t0)
    precision_bf16 = p.goodput.precision
    t0 = time.perf_counter()
    f = torch.compile(lambda a: (a.sin() + a.cos()).sum(), backend="eager")
    f(x); mark("compile", t0)
    # after a graph is compiled no forward hook is armed (dynamo would recompile for it)
    armed_after_compile = []
    for _ in range(10):
        step(); time.sleep(0.05); armed_after_compile.append(p.goodput._armed is not None)
    p.message()
    print(json.dumps({"phase": phase, "totals": p.goodput.totals, "precision": precision_bf16, "armed_after_compile": any(armed_after_compile),
                      "fp32": precision_fp32, "flops": p.goodput.flops,
                      "expected_flops": 4 * B * (I * H + H * O) + 2 * B * H * O, "errors": p.goodput.errors}))
    p.stop()
""")


@pytest.mark.system
def test_ledger_precision_and_flops_of_a_real_torch_job(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = dict(os.environ, TRAINTOP_PROBE_DIR=str(tmp_path / "probes"),
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(probe_goodput.__file__)))))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    phase, totals = out["phase"], out["totals"]
    assert out["errors"] == 0
    # Each labelled phase lands in its bucket, within two probe windows (0.1 s each) and a margin for a busy machine.
    for bucket in ("eval", "checkpoint", "other"):
        assert abs(totals[bucket] - phase[bucket]) < 0.35, (bucket, totals, phase)
    assert totals["compile"] >= 0.5 * phase["compile"], (totals, phase)
    assert totals["train"] >= 0.85 * phase["train"], (totals, phase)
    assert totals["stalled"] == 0 and totals["input"] == 0
    # FLOPs of one whole optimizer step, as FlopCounterMode counts them: forward, weight gradients, and the
    # input gradient of the second layer only (x needs none)
    assert out["flops"]["flops"] == out["expected_flops"]
    assert out["fp32"]["matmul"] == "fp32" and out["fp32"]["params"] == "float32"
    assert out["precision"]["matmul"] == "bf16" and out["precision"]["autocast"] == "bfloat16"
    assert out["armed_after_compile"] is False


def _torch(allow_tf32=False, fp32_precision="none", matmul_precision_setting="highest"):
    matmul = types.SimpleNamespace(allow_tf32=allow_tf32, fp32_precision=fp32_precision)
    return types.SimpleNamespace(backends=types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=matmul)),
                                 get_float32_matmul_precision=lambda: matmul_precision_setting)


@pytest.mark.parametrize("kwargs, autocast, params, expected", [
    ({}, None, "float32", "fp32"),
    ({"allow_tf32": True}, None, "float32", "tf32"),
    ({"matmul_precision_setting": "high"}, None, "float32", "tf32"),
    ({"fp32_precision": "tf32"}, None, "float32", "tf32"),
    ({"fp32_precision": "ieee", "allow_tf32": True}, None, "float32", "fp32"),
    ({}, "bfloat16", "float32", "bf16"),
    ({}, "float16", "float32", "fp16"),
    ({}, None, "bfloat16", "bf16"),
])
def test_matmul_precision_reads_every_switch(kwargs, autocast, params, expected):
    assert matmul_precision(_torch(**kwargs), autocast is not None, autocast, params) == expected


def test_window_buckets_add_up_to_the_wall_time(monkeypatch):
    """Whatever the order of windows, the ledger never loses or invents time: every second of every
    window is in exactly one bucket once the pending part is settled by a later step."""
    clock = [100.0]
    g = Goodput(clock=lambda: clock[0])
    monkeypatch.setattr(g, "arm", lambda why: None)
    total = 0.0
    steps = 0
    plan = [(0.3, 0, None)] * 3 + [(0.3, 2, 0.1)] * 5 + [(0.3, 0, 0.2), (0.3, 0, 0.5), (0.3, 0, 0.8)] \
        + [(0.3, 1, 0.05)] * 4 + [(0.3, 0, 0.35)] * 2 + [(0.3, 3, 0.02)]
    for window, new_steps, since in plan:
        clock[0] += window
        steps += new_steps
        out = g.window(clock[0], window, 0.05, steps, since, 30.0)
        assert set(out) == set(BUCKETS) and all(v >= 0 for v in out.values())
        total += window
    assert sum(g.totals.values()) == pytest.approx(total)
    assert g.totals["startup"] == pytest.approx(3 * 0.25)
    assert g.totals["input"] == pytest.approx(len(plan) * 0.05)
    assert g.totals["other"] > 0  # the 0.8 s gap without a step


def test_a_job_that_waits_in_a_collective_every_step_is_not_overdue(monkeypatch):
    """Step gaps are kept net of timed calls; the time since the last step is judged net of them too,
    or a rank that waits 0.9 s at an all-reduce every step would read as a pause ("other")."""
    clock = [100.0]
    g = Goodput(clock=lambda: clock[0])
    g.flops_disabled = True  # its counter would stay entered in this process: no step ends it here
    monkeypatch.setattr(g, "arm", lambda why: None)
    monkeypatch.setattr(probe_goodput, "stack_kind", lambda frame, depth=80: None)
    steps = [0]
    last_step = [None]
    last_tick = [clock[0]]

    def advance(dt):  # time passes on the training thread; the probe's window ends every 0.25 s
        for _ in range(round(dt / 0.05)):
            clock[0] += 0.05
            if clock[0] - last_tick[0] >= 0.25 - 1e-9:
                since = None if last_step[0] is None else clock[0] - last_step[0]
                g.window(clock[0], clock[0] - last_tick[0], 0.0, steps[0], since, 30.0)
                last_tick[0] = clock[0]

    all_reduce = g.wrap_timed(lambda: advance(0.9), "collective")
    for _ in range(20):
        advance(0.3)  # the step's own work (longer than a window), then the wait
        steps[0] += 1
        g.on_step(steps[0])
        last_step[0] = clock[0]
        all_reduce()
    totals = g.totals
    assert totals["other"] < 0.01 and totals["stalled"] == 0
    assert totals["collective"] == pytest.approx(20 * 0.9, rel=0.05)
    assert totals["train"] == pytest.approx(20 * 0.3, abs=0.5)


def test_a_barrier_before_the_first_step_is_startup(monkeypatch):
    clock = [100.0]
    g = Goodput(clock=lambda: clock[0])
    monkeypatch.setattr(g, "arm", lambda why: None)
    monkeypatch.setattr(probe_goodput, "stack_kind", lambda frame, depth=80: "collective")

    def wait():
        clock[0] += 0.4
        g.window(clock[0], 0.5, 0.0, 0, None, 30.0)  # the probe's window ends inside the barrier

    clock[0] += 0.1
    g.wrap_timed(wait, "collective")()
    clock[0] += 0.5
    g.window(clock[0], 0.5, 0.0, 0, None, 30.0)  # no step yet, its stack in c10d
    assert g.totals["collective"] == 0
    assert g.totals["startup"] == pytest.approx(1.0)


def _thread_waiting_in(path: str):
    """A thread blocked in a function whose code lies in ``path`` (as torch's own would); its release."""
    import threading

    code: dict = {}
    exec(compile("def wait(inside, release):\n    inside.set()\n    release.wait(60)\n", path, "exec"), code)
    inside, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=code["wait"], args=(inside, release), daemon=True)
    thread.start()
    assert inside.wait(30)
    return thread, release


@pytest.mark.parametrize("path, input_wait, taken", [
    # the whole window in the loader's wait (measured up to now): its stack is no pause's
    ("/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 1.0, False),
    ("/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 0.0, False),
    ("/home/u/train.py", 0.0, True),  # a pause in the job's own code
])
def test_a_pause_stack_is_never_a_wait_for_the_next_batch(monkeypatch, path, input_wait, taken):
    """An overdue step while the training thread sits in the DataLoader is input wait, not a pause: its
    stack, labelled "not waiting for input", would say the opposite of what it shows."""
    clock = [100.0]
    g = Goodput(clock=lambda: clock[0])
    g.flops_disabled = True
    monkeypatch.setattr(g, "arm", lambda why: None)
    for k in range(1, 6):  # steps 0.1 s apart
        clock[0] += 0.1
        g.on_step(k)
    thread, release = _thread_waiting_in(path)
    try:
        g.train_thread = thread.ident
        clock[0] += 1.0
        g.window(clock[0], 1.0, input_wait, 5, 1.0, 30.0)  # the step is overdue
        assert g.totals["input"] == input_wait
        assert (g.pause_stack is not None) is taken, g.pause_stack
    finally:
        release.set()
        thread.join(10)


def test_a_module_seen_while_it_is_still_being_imported_is_wrapped_once_it_is_whole(monkeypatch):
    """The probe's tick can find torch.distributed in sys.modules before its names are defined; it
    must look again at the next tick rather than mark it done with nothing wrapped."""
    import importlib.machinery

    half = types.ModuleType("torch.distributed")
    half.__spec__ = importlib.machinery.ModuleSpec("torch.distributed", None)
    half.__spec__._initializing = True  # what the import system sets while the module's code runs
    monkeypatch.setitem(sys.modules, "torch.distributed", half)
    g = Goodput()
    try:
        g.install()
        assert "torch.distributed" not in g._patched
        half.all_reduce = lambda *a, **k: "reduced"
        half.barrier = lambda *a, **k: "met"
        half.__spec__._initializing = False
        g.install()
        assert "torch.distributed" in g._patched
        assert getattr(half.barrier, "__traintop_probe__", False) and half.barrier() == "met"
    finally:
        g.uninstall()
    assert not getattr(half.barrier, "__traintop_probe__", False)


def _frame(path, function, outer=None):
    return types.SimpleNamespace(f_code=types.SimpleNamespace(co_filename=path, co_name=function), f_back=outer)


def test_imports_are_not_compile_time():
    user = _frame("/home/u/train.py", "main")
    importing = _frame("/torch/_dynamo/convert_frame.py", "<module>", _frame("<frozen importlib._bootstrap>", "_load", user))
    assert stack_kind(importing) is None
    assert stack_kind(_frame("/torch/_dynamo/convert_frame.py", "_compile", user)) == "compile"
    # torch.compile() importing its compiler is compile time
    assert stack_kind(_frame("<frozen importlib._bootstrap>", "_load", _frame("/torch/__init__.py", "compile", user))) \
        == "compile"
    assert stack_kind(_frame("/torch/serialization.py", "save", user)) == "checkpoint"
    # dynamo's eval_frame wrappers sit on every optimizer step: not compile
    assert stack_kind(_frame("/torch/_dynamo/eval_frame.py", "_fn", user)) is None
    barrier = _frame("/torch/distributed/distributed_c10d.py", "barrier", user)
    assert stack_kind(barrier) == "collective"
    # a checkpoint's own collectives are the checkpoint's
    assert stack_kind(_frame("/torch/distributed/distributed_c10d.py", "all_gather_object",
                             _frame("/torch/distributed/checkpoint/state_dict_saver.py", "save", user))) == "checkpoint"


# Two gloo ranks on the CPU: every 10 steps rank 1 works alone (a save on rank 1 only) and both
# meet at a barrier, and every step both all-reduce the loss for logging. Rank 0's wait at the
# barrier is the collective bucket; rank 1's own work is not.
COLLECTIVE_JOB = textwrap.dedent("""
    import json, os, sys, time
    import torch, torch.distributed as dist
    from traintop.injob.agent import Probe
    rank = int(sys.argv[1])
    dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
    t_start = time.perf_counter()
    p = Probe(interval=0.1); assert p.start()
    m = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    waited = alone = 0.0
    for i in range(1, 121):
        loss = m(x).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()
        t1 = time.perf_counter()
        dist.all_reduce(loss.detach())
        waited += time.perf_counter() - t1
        time.sleep(0.01)
        if i % 10 == 0:
            t0 = time.perf_counter()
            if rank == 1:
                time.sleep(0.4)
                alone += time.perf_counter() - t0
            t1 = time.perf_counter()
            dist.barrier()
            waited += time.perf_counter() - t1
    time.sleep(0.3)
    p.message()
    wall = time.perf_counter() - t_start  # the probe's life: its ledger covers all of it
    from traintop.injob.agent import _dist_backend
    print(json.dumps({"totals": p.goodput.totals, "waited": waited, "alone": alone, "wall": wall,
                      "errors": p.goodput.errors, "backend": _dist_backend()}))
    p.stop()
    dist.destroy_process_group()
""")


@pytest.mark.system
def test_a_wait_at_a_barrier_is_the_collective_bucket_on_two_real_gloo_ranks(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "job.py"
    script.write_text(COLLECTIVE_JOB)
    rdv = tmp_path / "rendezvous"
    env = dict(os.environ, TRAINTOP_PROBE_DIR=str(tmp_path / "probes"),
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(probe_goodput.__file__)))))
    procs = [subprocess.Popen([sys.executable, str(script), str(rank), str(rdv)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for rank in (0, 1)]
    outs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, err
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            proc.kill()
    r0, r1 = outs
    assert r0["errors"] == 0 and r1["errors"] == 0
    assert r0["backend"] == "gloo"  # sent with every message: the PCIe finding names gloo's copies
    # rank 0 waited ~12 x 0.4 s at the barrier, and in its all-reduces: that is its collective time
    assert r0["waited"] > 3.0
    assert r0["totals"]["collective"] == pytest.approx(r0["waited"], abs=0.25), r0
    # rank 1 worked alone meanwhile: its barrier returned at once, its sleep is no collective wait
    assert r1["totals"]["collective"] == pytest.approx(r1["waited"], abs=0.25), r1
    assert r1["totals"]["collective"] < 0.5 * r0["totals"]["collective"], r1
    # the barrier's gaps are no "other" pause of rank 0: only the job's last 0.3 s sleep is
    assert r0["totals"]["other"] < 0.3 + 0.2, r0
    for r in outs:
        assert sum(r["totals"].values()) == pytest.approx(r["wall"], rel=0.02), r


CAPTURE_JOB = textwrap.dedent("""
    import time, torch
    from traintop.injob.agent import Probe
    p = Probe(interval=0.1); assert p.start()
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    end = time.time() + 60
    while time.time() < end:
        loss = m(x).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step(); time.sleep(0.01)
""")


@pytest.mark.system
def test_a_finding_asks_the_job_for_a_trace_kept_beside_the_recording_and_listed_by_analyze(tmp_path):
    """The whole path on a real (CPU) torch job: traintop asks the probe, the probe profiles three steps
    and writes the trace, the record reaches the monitor, the file is copied beside the recording,
    and analyze lists it with its viewer."""
    pytest.importorskip("torch")
    from tests.waiting import until
    from traintop.reports.analyze import analyze, render_text
    from traintop.collectors.probe_client import ProbeClient
    from traintop.watch.monitor import Monitor
    from traintop.record.recording import RecordingReader
    from traintop.samples import Frame, SessionInfo

    script = tmp_path / "job.py"
    script.write_text(CAPTURE_JOB)
    probes = tmp_path / "probes"
    env = dict(os.environ, TRAINTOP_PROBE_DIR=str(probes),
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(probe_goodput.__file__)))))
    job = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    client = ProbeClient(str(probes))
    try:
        # steps before the capture: its "before" step time
        assert until(lambda: any((r.steps or 0) > 30 for r in client.sample({job.pid})), 60), \
            "the job's probe never reported its steps"
        rec = tmp_path / "run.ttrec"
        monitor = Monitor(SessionInfo(kind="live", interval=0.1))
        monitor.start_recording(str(rec))
        monitor.capture_evidence = True
        monitor._capture_for["trace"] = "Data starvation"
        assert client.request_capture("trace") == 1
        got = []

        def arrived():
            client.sample({job.pid})
            got.extend(client.take_captures())
            return any(not c.follow_up for c in got)

        assert until(arrived, 60), "no capture came back"
        monitor.ingest(Frame(t=time.time(), captures=tuple(got)), evaluate=False)
        assert until(lambda: (client.sample({job.pid}), got.extend(client.take_captures()),
                              any(c.follow_up for c in got))[-1], 60), "no step time after the capture"
        monitor.ingest(Frame(t=time.time() + 1, captures=tuple(c for c in got if c.follow_up)), evaluate=False)
        monitor.stop_recording().close()
    finally:
        job.kill()
        job.wait(timeout=30)
        client.close()
    cap, = RecordingReader(str(rec)).captures()
    assert cap.kind == "trace" and cap.error is None and cap.reason == "Data starvation"
    assert cap.path == str(tmp_path / "run.ttrec.captures" / os.path.basename(cap.path))
    assert cap.path.endswith(".pt.trace.json.gz")  # compressed: Perfetto and TensorBoard open it as it is
    with gzip.open(cap.path, "rt") as f:
        assert "traceEvents" in json.load(f)
    assert cap.step_s_before and cap.step_s_after
    text = render_text(analyze(RecordingReader(str(rec))))
    assert "profiler trace (on Data starvation)" in text and "ui.perfetto.dev" in text


@pytest.mark.parametrize("env, expected", [
    ({"SLURM_JOB_ID": "77", "TORCHELASTIC_RUN_ID": "r1", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, "77"),
    ({"TORCHELASTIC_RUN_ID": "r1", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, "r1"),
    # torchrun without --rdzv-id: "none" for every job; two jobs at once have two rendezvous endpoints
    ({"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, "127.0.0.1:29500"),
    ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29501"}, "127.0.0.1:29501"),  # mp.spawn
    ({"TORCHELASTIC_RUN_ID": "none"}, None),
    ({}, None),
])
def test_the_job_id_a_rank_sends(monkeypatch, env, expected):
    from traintop.injob import agent as probe_agent

    for name in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert probe_agent._job_id() == expected
