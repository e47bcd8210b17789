"""The probe on the loops people write with frameworks: a torch.compile'd model that evaluates with
``model.eval()`` and saves in between (as nanoGPT and transformers' Trainer do), a frozen teacher put
in eval mode every step, DDP over gloo waiting for a slow peer inside ``backward()``, and the Python
processes a job starts that are no ranks. Real (CPU) torch jobs; each times its own phases."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from traintop.injob import agent as probe_agent, goodput as probe_goodput

PYTHONPATH = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(probe_goodput.__file__))))

COMPILED_JOB = textwrap.dedent("""
    import json, os, time
    import torch, torch.nn as nn
    from torch.utils.flop_counter import FlopCounterMode
    probe = None
    if os.environ.get("WITH_PROBE") == "1":
        from traintop.injob.agent import Probe
        probe = Probe(interval=0.1); assert probe.start()
    torch.manual_seed(0)
    EVAL_MODE = os.environ.get("EVAL_MODE", "1") == "1"  # else no dropout: evaluation needs no eval()

    class Block(nn.Module):
        def __init__(self, d, h):
            super().__init__()
            self.h, self.ln = h, nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
            self.drop = nn.Dropout(0.1 if EVAL_MODE else 0.0)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.qkv(self.ln(x)).split(C, dim=2)
            q, k, v = [t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v)]
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
            x = x + self.drop(self.proj(y))
            return x + self.mlp(x)

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.block, self.head = nn.Embedding(256, 64), Block(64, 4), nn.Linear(64, 256, bias=False)

        def forward(self, idx, tgt):
            logits = self.head(self.block(self.emb(idx)))
            return nn.functional.cross_entropy(logits.view(-1, 256), tgt.view(-1))

    class SlowDisk:  # a checkpoint of ~0.2 s
        def write(self, b): time.sleep(0.002 * max(1, len(b) // 65536)); return len(b)
        def flush(self): pass

    model = GPT()
    teacher = nn.Linear(64, 64).requires_grad_(False)  # frozen: put in eval mode every step, never evaluated
    x, y = torch.randint(0, 256, (4, 32)), torch.randint(0, 256, (4, 32))
    with FlopCounterMode(display=False) as fc:
        model(x, y).backward()
    model.zero_grad()
    compiled = torch.compile(model, backend="aot_eager")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    phase, losses = {}, []

    def mark(name, t0):
        phase[name] = phase.get(name, 0.0) + time.perf_counter() - t0

    if not EVAL_MODE:
        with torch.no_grad():
            compiled(x, y)  # its no-grad graph compiled before the timed evaluation (compile time is no eval time)
    for it in range(1, 61):
        teacher.eval()
        t0 = time.perf_counter()
        loss = compiled(x, y)
        loss.backward(); opt.step(); opt.zero_grad()
        losses.append(round(loss.item(), 6))
        time.sleep(0.05)
        if it > 20: mark("train", t0)
        if (it % 15 == 0) if EVAL_MODE else it == 30:  # under no_grad alone: one long evaluation
            t0 = time.perf_counter()
            if EVAL_MODE:
                compiled.eval()  # as Trainer's evaluation loop and nanoGPT's estimate_loss() do
            with torch.no_grad():  # without eval(): a forward under no_grad alone (a model without dropout)
                # with eval(): shorter than a pause (steps of ~0.06 s are overdue after 0.3 s); under no_grad
                # alone, only an overdue step is looked at (a frozen teacher's no-grad forward in every step
                # is no evaluation), so that one lasts longer
                end = time.perf_counter() + (0.25 if EVAL_MODE else 2.5)
                while time.perf_counter() < end:
                    compiled(x, y); time.sleep(0.02)
            mark("eval", t0)
            t0 = time.perf_counter()
            torch.save(model.state_dict(), SlowDisk())  # saved before model.train(), as Trainer does
            mark("checkpoint", t0)
            if EVAL_MODE:
                compiled.train()
    from torch._dynamo.utils import counters
    out = {"losses": losses, "graphs": counters["stats"]["unique_graphs"],
           "breaks": sum(counters["graph_break"].values()), "recompiles": sum(counters["recompiles"].values()),
           "phase": phase, "eager_flops": fc.get_total_flops()}
    if probe is not None:
        time.sleep(0.3)
        probe.message()
        out.update(totals=probe.goodput.totals, flops=probe.goodput.flops, precision=probe.goodput.precision,
                   errors=probe.goodput.errors)
        probe.stop()
    print(json.dumps(out))
""")


def _run(tmp_path, script: str, with_probe: bool, *args, timeout=280, eval_mode: bool = True) -> dict:
    path = tmp_path / "job.py"
    path.write_text(script)
    env = dict(os.environ, TRAINTOP_PROBE_DIR=str(tmp_path / "probes"), PYTHONPATH=PYTHONPATH,
               WITH_PROBE="1" if with_probe else "0", CKPT=str(tmp_path / "ckpt.pt"), EVAL_MODE=str(int(eval_mode)))
    r = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.system
@pytest.mark.parametrize("eval_mode", [True, False], ids=["model.eval()", "no_grad-alone"])
def test_a_compiled_model_evaluated_and_saved_between_steps(tmp_path, eval_mode):
    """With ``model.eval()`` around the evaluation, and with a forward under ``torch.no_grad()`` alone
    (the compiled no-grad graph's own call says it is evaluation)."""
    pytest.importorskip("torch")
    plain = _run(tmp_path, COMPILED_JOB, with_probe=False, eval_mode=eval_mode)
    probed = _run(tmp_path, COMPILED_JOB, with_probe=True, eval_mode=eval_mode)
    # the probe changes nothing of the job's: the same graphs, no graph break, no recompile, the same losses
    for key in ("graphs", "breaks", "recompiles", "losses"):
        assert probed[key] == plain[key], key
    assert probed["breaks"] == 0 and probed["errors"] == 0
    phase, totals = probed["phase"], probed["totals"]
    # evaluations shorter than a pause are evaluation, not training; the save after each is the checkpoint's
    if eval_mode:
        assert totals["eval"] == pytest.approx(phase["eval"], abs=0.3), (sorted(totals.items()), phase)
    else:  # seen once the step is overdue (1.5x the longest recent gap, longer on a busy machine): the
        # seconds before it read as training; without the graph's own call it was not seen at all (0 s)
        assert 0.3 * phase["eval"] <= totals["eval"] <= phase["eval"] + 0.3, (sorted(totals.items()), phase)
    assert totals["checkpoint"] == pytest.approx(phase["checkpoint"], abs=0.3), (totals, phase)
    assert totals["other"] < 0.5, totals  # neither the evaluations nor the teacher's eval() read as pauses
    # the compiled graphs' FLOPs of one step: what FlopCounterMode counts on the eager model
    assert probed["flops"]["how"] == "compiled"
    assert probed["flops"]["flops"] == plain["eager_flops"]
    # its precision, from the matmuls of the compiled training graph (no module hook under torch.compile)
    assert probed["precision"]["matmul"] == "fp32" and probed["precision"]["how"] == "compiled graph"


DDP_JOB = textwrap.dedent("""
    import json, os, sys, time
    import torch, torch.distributed as dist
    from traintop.injob.agent import Probe
    rank = int(sys.argv[1])
    dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
    t_start = time.perf_counter()
    p = Probe(interval=0.1); assert p.start()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    slow, cpu0 = 0.0, time.thread_time()
    for i in range(60):
        if rank == 1:  # its input comes late: rank 0 waits for its gradients inside backward()
            t0 = time.perf_counter(); time.sleep(0.15); slow += time.perf_counter() - t0
        loss = model(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    dist.barrier()
    time.sleep(0.3)
    p.message()
    wall = time.perf_counter() - t_start
    print(json.dumps({"totals": p.goodput.totals, "slow": slow, "wall": wall, "errors": p.goodput.errors,
                      "cpu": time.thread_time() - cpu0}))
    p.stop()
    dist.destroy_process_group()
""")


@pytest.mark.system
def test_a_ddp_rank_waiting_in_backward_for_a_slow_peer_on_gloo_is_collective_time(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "job.py"
    script.write_text(DDP_JOB)
    env = dict(os.environ, TRAINTOP_PROBE_DIR=str(tmp_path / "probes"), PYTHONPATH=PYTHONPATH)
    procs = [subprocess.Popen([sys.executable, str(script), str(rank), str(tmp_path / "rdv")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for rank in (0, 1)]
    outs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, err[-4000:]
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            proc.kill()
    r0, r1 = outs
    assert r0["errors"] == 0 and r1["errors"] == 0
    # rank 0 slept inside backward's all-reduce while rank 1 took its 0.15 s (and, on a busy machine, its
    # compute): that is collective time, and never more than the time rank 0's thread was off the CPU
    assert 0.8 * r1["slow"] <= r0["totals"]["collective"] <= r0["wall"] - r0["cpu"], r0
    # (rank 1 waits too, for rank 0's compute, however long a busy machine makes it: not asserted)
    for r in outs:  # each rank's ledger covers its whole life
        assert sum(r["totals"].values()) == pytest.approx(r["wall"], rel=0.03), r


@pytest.mark.parametrize("argv, helper", [
    (["python3", "/opt/venv/lib/python3.12/site-packages/torch/_inductor/compile_worker/__main__.py",
      "--pickler=torch._inductor.compile_worker.subproc_pool.SubprocPickler", "--kind=fork", "--workers=32"], True),
    (["python3", "-m", "torch._inductor.compile_worker", "--workers=4"], True),
    (["python3", "train.py", "--compile"], False),
    (["python3", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()", "--multiprocessing-fork"], False),
    (["python3", "-m", "torch.distributed.run", "--nproc_per_node=2", "train.py"], False),
])
def test_compile_workers_start_no_probe(argv, helper):
    assert probe_agent.is_helper(argv) is helper


def _client_with(messages):
    """A ProbeClient fed these probe messages (pid -> message), as its sockets would have."""
    import types

    from traintop.collectors.probe_client import ProbeClient, _Conn

    client = ProbeClient("/nonexistent", clock=lambda: 100.0)
    for pid, msg in messages.items():
        c = _Conn(pid, types.SimpleNamespace(close=lambda: None))
        c.last, c.fresh, c.window = msg, True, msg.get("window", 0.0)
        client._conns[pid] = c
    client._read = lambda c, now: True  # type: ignore[method-assign]
    return client


def test_a_process_a_probed_process_started_is_no_rank_until_it_steps_or_holds_gpu_memory():
    base = {"v": 1, "t": 1.8e9, "window": 0.3, "cuda": False, "torch": True, "memory": [], "ledger": {"startup": 0.3}}
    main = dict(base, pid=10, ppid=1, steps=5)
    worker = dict(base, pid=11, ppid=10, steps=0)  # a compile worker, a loader worker started by spawn
    spawned_rank = dict(base, pid=12, ppid=10, steps=0, cuda=True,
                        memory=[{"device": 0, "reserved": 1 << 30, "allocated": 1 << 29}])
    stepped = dict(base, pid=13, ppid=10, steps=1)  # mp.spawn's rank, once it steps
    client = _client_with({m["pid"]: m for m in (main, worker, spawned_rank, stepped)})
    assert sorted(r.pid for r in client.sample({10, 11, 12, 13})) == [10, 12, 13]
    alone = _client_with({11: worker})  # its parent carries no probe: it is the job's own process
    assert [r.pid for r in alone.sample({11})] == [11]


def test_a_pause_settled_later_keeps_its_seconds():
    """A window with no step that is not overdue yet is held back by the probe and given to a later
    window: the later sample's shares add up to more than 1 rather than lose those seconds."""
    from traintop.collectors import probe_client

    conn = probe_client._Conn(7, None)
    msg = {"ledger": {}}
    # held back: 0.9 s of windows, no bucket yet
    conn.window, conn.ledger = 0.9, dict.fromkeys(probe_client.LEDGER_BUCKETS, 0.0)
    held = probe_client.ProbeClient._shares(conn, msg)
    assert sum(held.values()) == 0
    # settled: this 0.3-s window plus the 0.9 s before, all train
    conn.window = 0.3
    conn.ledger = dict(conn.ledger, train=1.2)
    settled = probe_client.ProbeClient._shares(conn, msg)
    assert settled["time_train"] == pytest.approx(4.0)
    assert 0.9 * sum(held.values()) + 0.3 * sum(settled.values()) == pytest.approx(1.2)


def test_a_rank_on_no_gpu_waiting_for_its_input_is_starved_by_the_measured_wait():
    """A gloo DDP job on a host with no GPU: rank 1's loader keeps it waiting 95 % of the time, rank 0
    waits for rank 1 in its all-reduce (collective, not input). The measured input wait decides."""
    from traintop.watch.monitor import Monitor
    from traintop.samples import Frame, RankSample, SessionInfo

    mon = Monitor(SessionInfo(kind="live", interval=0.5))

    def frame(t, fed):
        r0 = RankSample(pid=10, rank=0, world_size=2, cuda=False, loader=True, steps=int(t), input_wait=0.02,
                        time_train=0.2, time_collective=0.78, time_input=0.02)
        wait = 0.05 if fed else 0.95
        r1 = RankSample(pid=11, rank=1, world_size=2, cuda=False, loader=True, steps=int(t), input_wait=wait,
                        time_train=1.0 - wait, time_input=wait)
        return Frame(t=1000.0 + t, gpus=(), ranks=(r0, r1))
    for k in range(120):
        mon.ingest(frame(k * 0.5, fed=k >= 80))
    mon.engine.close_all(1060.0)
    starved = [a for a in mon.engine.alerts if a.rule == "starvation"]
    assert [a.subject for a in starved] == ["rank1"]
    (a,) = starved
    assert a.evidence.startswith("rank 1 (on no GPU) waits for its next batch") and "(measured in the job)" in a.evidence
    assert 1000.0 < a.start < 1020.0 and a.end is not None and 1040.0 <= a.end < 1048.0  # fed from 40 s on


WRAPPED_FORWARD_JOB = textwrap.dedent("""
    import json, time, torch, torch.nn as nn
    import traintop.injob.goodput as g
    g.PRECISION_EVERY_S = 0.2
    from traintop.injob.agent import Probe
    p = Probe(interval=0.1); assert p.start()
    m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    plain = m.forward
    def forward(x):  # as Accelerate and transformers' Trainer wrap a model's forward in autocast
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return plain(x)
    m.forward = forward
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    end = time.time() + 3
    while time.time() < end:
        m(torch.randn(4, 32)).float().sum().backward(); opt.step(); opt.zero_grad(); time.sleep(0.01)
    print(json.dumps(p.goodput.precision))
    p.stop()
""")


@pytest.mark.system
def test_the_precision_of_a_model_whose_forward_enters_autocast_itself(tmp_path):
    pytest.importorskip("torch")
    out = _run(tmp_path, WRAPPED_FORWARD_JOB, with_probe=True)
    assert out["matmul"] == "bf16" and out["autocast"] == "bfloat16"


SCALED_JOB = textwrap.dedent("""
    import json, os
    import torch, torch.nn as nn
    from torch.amp.grad_scaler import GradScaler
    from traintop.injob.agent import Probe
    import time
    probe = Probe(interval=0.1); assert probe.start()
    for _ in range(200):  # its thread installs the hooks once torch is whole
        if probe._hooks_installed: break
        time.sleep(0.05)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 32))
    class NoHooks:  # an optimizer of its own that never calls Optimizer.__init__: no step hooks run
        def __init__(self, params):
            self.param_groups = [{"params": list(params)}]
            self.state = {}
        def zero_grad(self):
            for p in self.param_groups[0]["params"]:
                p.grad = None
        def step(self):
            with torch.no_grad():
                for p in self.param_groups[0]["params"]:
                    p -= 1e-3 * p.grad
    kind = os.environ["OPTIMIZER"]
    opt = (torch.optim.SGD(model.parameters(), lr=1e-3) if kind == "sgd" else
           torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True) if kind == "fused" else NoHooks(model.parameters()))
    scaler = GradScaler("cpu")
    x = torch.randn(8, 32)

    def step(xb):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(xb).float().pow(2).mean()
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    for _ in range(20):
        step(x)
    healthy = json.loads(probe.message())
    for _ in range(15):
        step(x * 1e6)  # beyond fp16's range at the cast: an inf loss, every step skipped
    overflow = json.loads(probe.message())
    probe.stop()
    print(json.dumps({"healthy": [healthy["steps"], healthy.get("skipped")],
                      "overflow": [overflow["steps"], overflow.get("skipped")],
                      "restored": not any(getattr(getattr(GradScaler, m), "__traintop_probe__", False)
                                          for m in ("_maybe_opt_step", "step"))}))
""")


@pytest.mark.parametrize("optimizer", ["sgd", "fused", "nohooks"])
def test_steps_a_grad_scaler_skips_are_counted_as_steps_of_the_loop_and_as_skipped(tmp_path, monkeypatch, optimizer):
    """fp16 overflow: GradScaler skips optimizer.step(), so the step hook never fires and the job
    would read as stalled; the probe counts each skipped step (a step of the loop) apart, from the
    scaler's own found_inf: a fused AdamW (Trainer's default) skips inside its kernel with its hook
    firing, and an optimizer that runs no hooks steps without any (neither read as skipped)."""
    pytest.importorskip("torch")
    monkeypatch.setenv("OPTIMIZER", optimizer)
    out = _run(tmp_path, SCALED_JOB, True)
    assert out["healthy"] == [20, 0]  # a scaler seen: its count is sent, 0 included
    assert out["overflow"] == [35, 15]
    assert out["restored"]
