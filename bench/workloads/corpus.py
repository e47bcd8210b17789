"""The diagnosis corpus: real training workloads that write down, second by second, what they are doing.

Each scenario plays one or more phases (``train``, ``input_bound``, ``hung_collective`` …) and
labels them itself while it runs: one JSON line at every phase change and one a second with
the phase and the allocator's own figures (``torch.cuda.memory_allocated()`` …). Those labels
are the ground truth ``bench/diagnosis_score.py`` scores traintop's findings against; the
vocabulary (what each label expects, allows and contradicts, and the time-ledger bucket it is)
is ``bench/corpus_labels.py``.

Every line has ``t`` (Unix time), ``rank`` (None without torchrun), ``event`` and ``phase``:
``phase`` at a change, ``tick`` each second, ``exit`` at exit, and ``stats`` after a timed phase,
the analytic count the MFU is scored against (bench/ledger_score.py): ``steps`` optimizer steps in
``seconds`` of wall time, ``flops_hand`` the FLOPs of one optimizer step counted by hand (not by a
FLOP counter), and ``matmul`` the precision its matmuls run in (``bf16``, ``fp16``, ``tf32``,
``fp32``; lines written before it existed: ``fp32`` in ``train_fp32``, else ``bf16``). A scenario
that knows its FLOPs writes one (``timed_train``); its MFU column is "—" otherwise.

    python bench/workloads/corpus.py starved_then_fed --labels run.labels.jsonl
    torchrun --nproc_per_node=2 bench/workloads/corpus.py gloo_hang --labels run.labels.jsonl

Multi-rank scenarios run under torchrun with the gloo backend, every rank on the one GPU
(NCCL refuses two ranks on one device); ``--cpu`` is a dry run on the CPU at tiny sizes.
Nothing here changes the GPU's clocks, power limit or modes.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import json
import os
import random
import sys
import threading
import time

import torch
import torch.nn as nn


class Labels:
    """The job's own account of what it is doing: a line at each change and one a second."""

    def __init__(self, path: str | None, rank: int | None) -> None:
        self.fh = open(path, "a", buffering=1) if path else None
        self.rank = rank
        self.phase = "startup"
        self.extra: dict = {}
        self._lock = threading.Lock()
        self._write({"event": "phase", "phase": self.phase})
        threading.Thread(target=self._tick, daemon=True).start()
        atexit.register(lambda: self._write({"event": "exit", "phase": self.phase}))

    def _write(self, rec: dict) -> None:
        if not self.fh:
            return
        rec = {"t": time.time(), "rank": self.rank, **rec}
        cuda = torch.cuda
        if cuda.is_available() and cuda.is_initialized():
            s = cuda.memory_stats()
            rec.update(allocated=cuda.memory_allocated(), reserved=cuda.memory_reserved(),
                       peak=cuda.max_memory_allocated(), ooms=s.get("num_ooms", 0),
                       alloc_retries=s.get("num_alloc_retries", 0))
        with self._lock:
            try:
                self.fh.write(json.dumps(rec) + "\n")
            except ValueError:  # closed at exit
                pass

    def __call__(self, phase: str, **extra) -> None:
        self.phase = phase
        self._write({"event": "phase", "phase": phase, **extra})

    def _tick(self) -> None:
        while True:
            time.sleep(1.0)
            self._write({"event": "tick", "phase": self.phase})


DEV = "cuda"
SMALL = False  # --cpu: tiny sizes


def dev() -> torch.device:
    if DEV == "cpu":
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) if torch.cuda.device_count() > 1 else 0)


def size(n: int, small: int) -> int:
    return small if SMALL else n


def mlp(width: int, depth: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers).to(dev())


def autocast(dtype=torch.bfloat16):
    return torch.autocast(dev().type, dtype=dtype, enabled=dtype is not None)


def step(model, opt, x, dtype=torch.bfloat16, keep: list | None = None) -> torch.Tensor:
    with autocast(dtype):
        out = model(x)
        loss = out.float().pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if keep is not None:
        keep.append(out)  # the leak: outputs (and their graphs' saved tensors) kept across steps
    return loss


def train_for(seconds: float, model, opt, x, *, dtype=torch.bfloat16, sync_every: int = 10, batches=None,
              keep: list | None = None, between=None) -> int:
    end = time.time() + seconds
    n = 0
    while time.time() < end:
        if batches is not None:
            x = next(batches).to(dev(), non_blocking=True)
        if between is not None:
            between()
        loss = step(model, opt, x, dtype, keep)
        n += 1
        if n % sync_every == 0:
            loss.item()
    if DEV == "cuda":
        torch.cuda.synchronize()
    return n


def cpu_work(seconds: float, x: torch.Tensor) -> torch.Tensor:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        x = torch.tanh(x * 1.0001)
    return x


class SlowItems(torch.utils.data.Dataset):
    """Batches that each cost ``cpu_s`` of CPU in a loader worker (slow decoding or augmentation)."""

    def __init__(self, batch: int, width: int, cpu_s: float, hang_after: float | None = None,
                 hang_s: float = 0.0) -> None:
        self.batch, self.width, self.cpu_s = batch, width, cpu_s
        self.hang_after, self.hang_s = hang_after, hang_s

    def __len__(self) -> int:
        return 10**9

    def __getitem__(self, i: int) -> torch.Tensor:
        info = torch.utils.data.get_worker_info()
        if self.hang_after is not None and info is not None and info.id == 0 and time.time() >= self.hang_after:
            time.sleep(self.hang_s)  # a worker stuck on a dead file system, a lock, a bad record
        x = torch.randn(self.batch, self.width)
        return cpu_work(self.cpu_s, x) if self.cpu_s else x


def loader(ds, workers: int = 2, timeout: float = 0):
    return iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers, pin_memory=DEV == "cuda",
                                            persistent_workers=True, prefetch_factor=2, timeout=timeout))


def big_model():
    w = size(8192, 64)
    model = mlp(w, 4)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-5), torch.randn(size(8192, 64), w, device=dev())


# -- single-process scenarios ------------------------------------------------------------------------------
def big_model_flops() -> int:
    """FLOPs of one optimizer step of big_model by hand: 4 square matmuls forward (2·B·w² each),
    their weight gradients (the same), and the input gradients of layers 2-4 (x needs none)."""
    w, b = size(8192, 64), size(8192, 64)
    return 2 * b * w * w * (4 + 4 + 3)


def timed_train(L, seconds: float, model, opt, x, **kw) -> None:
    """train_for, then the job's own step time and hand-counted FLOPs for the MFU check."""
    dtype = kw.get("dtype", torch.bfloat16)
    matmul = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype) or (
        "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32")
    t = time.time()
    n = train_for(seconds, model, opt, x, **kw)
    L._write({"event": "stats", "phase": L.phase, "steps": n, "seconds": time.time() - t,
              "flops_hand": big_model_flops(), "matmul": matmul})


def healthy_bf16(L, a):
    model, opt, x = big_model()
    L("train")
    timed_train(L, a.scale * 30, model, opt, x)


def compile_warmup(L, a):
    """torch.compile's warm-up (its compile time: the GPU waits), then compiled training."""
    model, opt, x = big_model()
    compiled = torch.compile(model)
    L("compile")
    step(compiled, opt, x)  # the first call compiles forward and backward
    if DEV == "cuda":
        torch.cuda.synchronize()
    L("train")
    train_for(a.scale * 20, compiled, opt, x)


def healthy_crash(L, a):
    """Healthy training that ends mid-run with an exception (a job that dies)."""
    model, opt, x = big_model()
    L("train")
    train_for(a.scale * 25, model, opt, x)
    raise RuntimeError("the job fails mid-run (on purpose)")


def starved_then_fed(L, a):
    w = size(4096, 64)
    model = mlp(w, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    slow = loader(SlowItems(size(2048, 16), w, 0.25), workers=2)
    L("input_bound", workers=2, cpu_s=0.25)
    train_for(a.scale * 25, model, opt, None, batches=slow, sync_every=1)
    x = torch.randn(size(2048, 16), w, device=dev())
    L("train")
    train_for(a.scale * 20, model, opt, x)


def underused(L, a):
    model = mlp(size(256, 32), 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(32, size(256, 32), device=dev())
    L("underused", batch=32)
    train_for(a.scale * 30, model, opt, x, sync_every=1)


def leak(L, a):
    model, opt, x = big_model()
    keep: list = []
    L("train")
    train_for(a.scale * 10, model, opt, x)
    L("leak")
    train_for(a.scale * 20, model, opt, x, keep=keep, sync_every=1,
              between=lambda: time.sleep(0.02))  # ~0.3-0.5 GiB/s


def oom_retries(L, a):
    """A job capped with set_per_process_memory_fraction: allocations retry, then one OOM is caught."""
    if DEV == "cuda":
        torch.cuda.set_per_process_memory_fraction(0.12)
    model, opt, x = big_model()
    L("train")
    train_for(a.scale * 10, model, opt, x)
    cap = int(torch.cuda.get_device_properties(0).total_memory * 0.12) if DEV == "cuda" else 2**30
    free = max(cap - torch.cuda.memory_reserved(), 2**28) if DEV == "cuda" else 2**28
    for k in range(3):  # fill the cache with one size, free it, ask for another: cudaMalloc fails, retry
        blocks = [torch.empty(int(free * 0.8) // 8, dtype=torch.uint8, device=dev()) for _ in range(7)]
        del blocks
        big = torch.empty(int(free * 0.9), dtype=torch.uint8, device=dev())
        del big
    L("oom")
    try:
        torch.empty(cap * 2, dtype=torch.uint8, device=dev())
    except torch.OutOfMemoryError:
        pass
    L("after_oom")
    train_for(a.scale * 20, model, opt, x)


def reserved_gap(L, a):
    """Healthy: the forward/backward peaks at ~11 GiB, shapes vary so the cache holds ~20 GiB, and
    between steps little is allocated (item 4 of the diagnosis issue: not fragmentation)."""
    w = size(8192, 64)
    model = mlp(w, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    sizes = [size(s, 16) for s in (40000, 52000, 64000, 46000, 58000)]
    xs = [torch.randn(s, w, device=dev(), dtype=torch.bfloat16) for s in sizes]
    L("train")
    end = time.time() + a.scale * 30
    i = 0
    while time.time() < end:
        with autocast():
            loss = model(xs[i % len(xs)]).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        i += 1


def fragmented(L, a):
    rnd = random.Random(7)
    L("startup")
    tensors = [torch.empty(int(rnd.uniform(1.1, 9.0) * 2**20) if not SMALL else 1024, dtype=torch.uint8,
                           device=dev()) for _ in range(6000)]
    _kept = tensors[1::2]  # held to the end: the holes between them stay reserved
    del tensors
    w = torch.randn(size(8192, 64), size(8192, 64), device=dev(), dtype=torch.bfloat16)
    x = torch.randn(size(8192, 64), size(8192, 64), device=dev(), dtype=torch.bfloat16)
    L("fragmented")
    end = time.time() + a.scale * 30
    while time.time() < end:
        for _ in range(20):
            x = torch.tanh(x @ w)
        x.sum().item()
        time.sleep(0.01)


def copies_and_kernels(L, a):
    """Tiny kernels in CUDA graphs, then pageable copies, then pinned copies: three GPU-bound-elsewhere phases."""
    L("startup")
    if DEV == "cuda":
        _play_tiny_kernels(L, a.scale * 20)
    n = size(64 * 2**20, 1024)
    host = torch.empty(n, dtype=torch.float32).uniform_()
    d = torch.empty(n, dtype=torch.float32, device=dev())
    w = torch.randn(size(2048, 32), size(2048, 32), device=dev())
    L("pageable_copy")
    end = time.time() + a.scale * 20
    while time.time() < end:
        d.copy_(host)
        (d[: w.numel()].view_as(w) @ w).sum().item()
    n = size(512 * 2**20, 1024)
    pinned = torch.empty(n, dtype=torch.float32, pin_memory=DEV == "cuda").uniform_()
    d = torch.empty(n, dtype=torch.float32, device=dev())
    w = torch.randn(size(4096, 32), size(4096, 32), device=dev())
    L("pinned_copy")
    end = time.time() + a.scale * 20
    while time.time() < end:
        d.copy_(pinned, non_blocking=True)
        (d[: w.numel()].view_as(w) @ w).sum().item()


def _play_tiny_kernels(L, seconds: float) -> None:
    """CUDA graphs of 400 tiny matmuls each, replayed for ``seconds``."""
    m = torch.randn(64, 64, device="cuda") * 0.01
    x = torch.randn(64, 64, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside the graph, as capture requires
        for _ in range(3):
            torch.tanh(x @ m)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x
        for _ in range(400):
            y = torch.tanh(y @ m)
    L("tiny_kernels")
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(20):
            g.replay()
        torch.cuda.synchronize()


def tiny_kernels(L, a):
    """Tiny kernels alone, long enough for a finding that needs 30 s: utilization ~100 %, a few SMs busy."""
    if DEV == "cuda":
        _play_tiny_kernels(L, a.scale * 40)
        return
    m, x = torch.randn(64, 64) * 0.01, torch.randn(64, 64)
    L("tiny_kernels")
    end = time.time() + a.scale * 40
    while time.time() < end:
        x = torch.tanh(x @ m)


def fp32_no_tf32(L, a):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, opt, x = big_model()
    x = x.float()
    L("train_fp32")
    timed_train(L, a.scale * 25, model, opt, x, dtype=None)


def eval_phases(L, a):
    """Training, then a long evaluation (forward passes, no optimizer step, the GPU busy), then training."""
    model, opt, x = big_model()
    L("train")
    train_for(a.scale * 12, model, opt, x)
    L("eval")
    end = time.time() + a.scale * 36
    with torch.no_grad():
        n = 0
        while time.time() < end:
            with autocast():
                y = model(x)
            n += 1
            if n % 10 == 0:
                y.sum().item()
    L("train")
    train_for(a.scale * 10, model, opt, x)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def checkpoints(L, a, path=None):
    """Training with a full, fsynced checkpoint every 10 s: the GPU waits while it is written."""
    w = size(8192, 64)
    model = mlp(w, 2)  # 134 M parameters: ~1.6 GB of checkpoint with the optimizer state
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    x = torch.randn(size(8192, 64), w, device=dev())
    target = path or os.path.join(os.environ.get("CORPUS_SCRATCH", "/tmp"), f"corpus-ckpt-{os.getpid()}.pt")
    end = time.time() + a.scale * 45
    try:
        while time.time() < end:
            L("train")
            train_for(min(8.0 * a.scale, max(0.0, end - time.time())), model, opt, x)
            if time.time() >= end:
                break
            L("checkpoint")
            _checkpoint(model, opt, target)
    finally:
        _unlink_quietly(target)


def loader_hang(L, a):
    w = size(4096, 64)
    model = mlp(w, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    hang_after = time.time() + a.scale * 15
    it = loader(SlowItems(size(4096, 16), w, 0.01, hang_after=hang_after, hang_s=200), workers=2,
                timeout=a.scale * 40)
    L("train")
    hung = False
    try:
        while True:
            xb = next(it).to(dev(), non_blocking=True)
            if time.time() >= hang_after and not hung:
                hung = True  # the next batch worker 0 owes never comes
                L("hung_loader")
            step(model, opt, xb).item()
    except RuntimeError:
        L("hung_loader_timeout")
        raise SystemExit(1)


def idle_alive(L, a):
    model, opt, x = big_model()
    L("train")
    train_for(a.scale * 8, model, opt, x)
    L("idle")
    time.sleep(a.scale * 35)  # alive, holding its memory, doing nothing on the GPU


def cpu_training(L, a):
    global DEV
    DEV = "cpu"
    torch.set_num_threads(min(4, os.cpu_count() or 1))
    model = mlp(512, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(512, 512)
    L("cpu_train")
    train_for(a.scale * 30, model, opt, x, dtype=None)


_HOLDER = """
import sys, time, torch
hold = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
hold.fill_(1)
torch.cuda.synchronize()
open(sys.argv[2], "w").close()
time.sleep(float(sys.argv[3]))
"""


def other_process(L, a):
    """A process outside the job's tree holds 20 GiB of the job's GPU while the job trains."""
    _start_outside(_HOLDER, str(size(20 * 2**30, 1024)), a.scale * 40 + 10)
    model, opt, x = big_model()
    L("train_other")
    train_for(a.scale * 30, model, opt, x)


_COMPUTER = """
import sys, time, torch
dev = "cuda" if torch.cuda.is_available() else "cpu"
n = int(sys.argv[1])
x = torch.randn(n, n, device=dev, dtype=torch.bfloat16 if dev == "cuda" else torch.float32)
end = time.time() + float(sys.argv[3])
open(sys.argv[2], "w").close()
while time.time() < end:
    for _ in range(10):
        y = x @ x
    if dev == "cuda":
        torch.cuda.synchronize()
"""


def _start_outside(script: str, arg: str, seconds: float) -> None:
    """Start ``script`` as another job outside this one's tree (spawned twice over: its parent exits
    at once, so it is re-parented away; no probe) for ``seconds``; return once it has begun."""
    import subprocess
    import tempfile

    ready = os.path.join(tempfile.mkdtemp(), "ready")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRAINTOP_PROBE_DIR")}
    launcher = ("import subprocess, sys; subprocess.Popen(sys.argv[1:], start_new_session=True, "
                "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)")
    subprocess.run([sys.executable, "-c", launcher, sys.executable, "-c", script, arg, ready, str(seconds)],
                   env=env, check=True)
    for _ in range(600):
        if os.path.exists(ready):
            break
        time.sleep(0.1)


def _start_second_job(seconds: float) -> None:
    """Another job that computes on the same GPU (bf16 matmuls back to back) for ``seconds``."""
    _start_outside(_COMPUTER, str(size(8192, 256)), seconds)

def second_job(L, a):
    """Healthy training; then a second job outside this one's tree computes on the same GPU (its
    steps slow down while the GPU is shared), then it ends and the pace comes back."""
    model, opt, x = big_model()
    L("train")
    train_for(a.scale * 40, model, opt, x)
    contended_s = a.scale * 40
    _start_second_job(contended_s)
    L("train_contended")
    train_for(contended_s, model, opt, x)
    time.sleep(1.0)  # its loop ends at its deadline: its last matmuls
    L("train")
    train_for(a.scale * 40, model, opt, x)


def _scaled_step(model, opt, scaler, x) -> torch.Tensor:
    """One fp16 step through a GradScaler: it skips the optimizer step when a gradient is inf or NaN."""
    with autocast(torch.float16):
        loss = model(x).float().pow(2).mean()
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    return loss


def _scaled_train(seconds: float, model, opt, scaler, x) -> int:
    end, n = time.time() + seconds, 0
    while time.time() < end:
        loss = _scaled_step(model, opt, scaler, x)
        n += 1
        if n % 10 == 0:
            loss.item()
    return n


def fp16_overflow(L, a):
    """fp16 with a GradScaler: healthy, then inputs that overflow fp16 (an inf loss every step, so
    the scaler skips every optimizer step while the GPU stays busy), then healthy again with a
    fresh scaler (as after a restart from the last checkpoint)."""
    model, opt, x = big_model()
    scaler = torch.amp.GradScaler(dev().type)
    L("train")
    _scaled_train(a.scale * 30, model, opt, scaler, x)
    L("overflow", scale=scaler.get_scale())
    _scaled_train(a.scale * 40, model, opt, scaler, x * 1e6)  # beyond fp16's 65504 at the cast
    L("train", scale=scaler.get_scale())  # the scale has fallen to 0 (it halves at each skip): it never
    _scaled_train(a.scale * 30, model, opt, torch.amp.GradScaler(dev().type), x)  # recovers; a fresh one


def recompile(L, a):
    """torch.compile'd training whose batch size changes twice mid-run: dynamo compiles a new graph
    each time (the GPU waits for the compiler), then trains on."""
    model, opt, x = big_model()
    compiled = torch.compile(model, dynamic=False)
    for k, rows in enumerate((size(8192, 64), size(6144, 48), size(4096, 32))):
        xb = x[:rows].contiguous()
        L("compile", rows=rows)
        step(compiled, opt, xb)  # a new shape: a new graph, forward and backward
        if DEV == "cuda":
            torch.cuda.synchronize()
        L("train", rows=rows)
        train_for(a.scale * 30, compiled, opt, xb)


def killed_worker(L, a):
    """Training fed by two loader workers (small batches that add to a large resident one, so the GPU,
    not the loader, sets the pace); one worker is killed (the kernel's OOM killer, an operator's
    kill -9): the DataLoader notices at once, raises, and the job dies with a traceback."""
    import signal

    model, opt, x = big_model()
    rows = min(64, x.shape[0])
    it = loader(SlowItems(rows, x.shape[1], 0.0), workers=2)

    def fed_step() -> None:
        x[:rows].copy_(next(it), non_blocking=True)
        step(model, opt, x).item()

    L("train")
    end = time.time() + a.scale * 30
    while time.time() < end:
        fed_step()
    L("ended")  # the job is going: every finding about it must end (the DataLoader raises at once)
    os.kill(it._workers[0].pid, signal.SIGKILL)
    while True:
        fed_step()


def _checkpoint(model, opt, target: str) -> None:
    with open(target, "wb") as f:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, f)
        f.flush()
        os.fsync(f.fileno())


def long_mixed(L, a):
    """Twelve minutes of one job: healthy stretches of minutes, a checkpoint every two minutes or so,
    two evaluations, a slow leak (1 MiB kept each step for 90 s, then freed) and, later, a second job
    that computes on the same GPU for 60 s."""
    model, opt, x = big_model()
    target = os.path.join(os.environ.get("CORPUS_SCRATCH", "/tmp"), f"corpus-ckpt-{os.getpid()}.pt")
    t0 = time.time()
    keep: list = []

    def until(at: float, phase: str = "train", **kw) -> None:
        L(phase)
        train_for(max(0.0, t0 + a.scale * at - time.time()), model, opt, x, **kw)

    def evaluate(seconds: float) -> None:
        L("eval")
        end = time.time() + seconds
        with torch.no_grad():
            while time.time() < end:
                with autocast():
                    model(x).sum().item()

    def leak_step() -> None:
        keep.append(torch.empty(2**20, dtype=torch.uint8, device=dev()))

    try:
        until(90)
        L("checkpoint")
        _checkpoint(model, opt, target)
        until(150)
        evaluate(a.scale * 15)
        until(210)
        L("checkpoint")
        _checkpoint(model, opt, target)
        until(250)
        until(340, "leak", between=leak_step, sync_every=1)
        keep.clear()
        until(360)
        L("checkpoint")
        _checkpoint(model, opt, target)
        until(420)
        _start_second_job(a.scale * 60)
        L("train_contended")
        train_for(a.scale * 60, model, opt, x)
        time.sleep(1.0)
        until(510)
        evaluate(a.scale * 15)
        until(560)
        L("checkpoint")
        _checkpoint(model, opt, target)
        until(720)
    finally:
        _unlink_quietly(target)


def _meminfo() -> dict:
    with open("/proc/meminfo") as f:
        return {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f)}


def _cgroup_room() -> int | None:
    """Bytes this process's memory cgroup may still take (None: no limit)."""
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit == "max":
            return None
        with open("/sys/fs/cgroup/memory.current") as f:
            return int(limit) - int(f.read())
    except (OSError, ValueError):
        return None


def _fill_host_ram(target_used: float, floor_avail: float, at_pressure) -> tuple[list, float]:
    """Resident host memory in 1 GiB blocks until the host's used share (total less MemAvailable, as
    traintop counts it) reaches ``target_used``; never below ``floor_avail`` of it available, nor
    past this cgroup's limit. ``at_pressure()`` is called once the share passes 95 %. Returns the
    blocks and the used share reached."""
    held: list = []
    block = size(2**30, 2**20)
    told = False
    while True:
        m = _meminfo()
        total, avail = m["MemTotal"], m["MemAvailable"]
        used = 1 - avail / total
        if used >= 0.95 and not told:
            at_pressure()
            told = True
        room = _cgroup_room()
        if used >= target_used or avail - block < floor_avail * total or (room is not None and room < 2 * block) \
                or (SMALL and len(held) >= 4):
            return held, used
        held.append(torch.empty(block, dtype=torch.uint8).fill_(1))  # written: resident, not just reserved


def host_memory_pressure(L, a):
    """Training while the host's RAM is nearly full (another process's dataset in RAM, a loader's
    copies): filled to 96.5 % by a thread while the job trains, held ~35 s, then freed and training
    goes on. ``host_memory`` is labelled from the moment the RAM passes 95 % used (the threshold the
    rule names); a machine where the fill stops short stays ``train`` (its lines say how far it got)."""
    model, opt, x = big_model()
    L("train")
    train_for(a.scale * 15, model, opt, x)
    got: dict = {}

    def fill() -> None:
        got["held"], got["used"] = _fill_host_ram(0.965, 0.025, lambda: L("host_memory"))

    filler = threading.Thread(target=fill, daemon=True)
    filler.start()
    while filler.is_alive():
        train_for(1.0, model, opt, x)
    L._write({"event": "note", "phase": L.phase, "host_used": round(got["used"], 4),
              "held_gib": round(len(got["held"]) * size(2**30, 2**20) / 2**30, 3)})
    train_for(a.scale * 35, model, opt, x)
    got.clear()
    m = _meminfo()
    L("train", host_used=round(1 - m["MemAvailable"] / m["MemTotal"], 4))
    train_for(a.scale * 25, model, opt, x)


def power_capped(L, a):
    """bf16 matmuls back to back (a GPU at full load: at its power limit, the driver trims its clocks),
    then the job sits idle holding its memory."""
    n = size(8192, 64)
    x = torch.randn(n, n, device=dev(), dtype=torch.bfloat16 if DEV == "cuda" else torch.float32)
    L("full_load")
    end = time.time() + a.scale * 45
    while time.time() < end:
        for _ in range(20):
            y = x @ x
        if DEV == "cuda":
            torch.cuda.synchronize()
    del y
    L("idle")
    time.sleep(a.scale * 25)


def compiled_eval_no_grad(L, a):
    """A compiled model trained, then evaluated under ``torch.no_grad()`` alone (no ``model.eval()``:
    a model without dropout or batch norm needs none), then trained again."""
    model, opt, x = big_model()
    compiled = torch.compile(model, dynamic=False)
    L("compile")
    step(compiled, opt, x).item()
    with torch.no_grad():  # its no-grad graph compiled here, not inside the timed evaluation
        with autocast():
            compiled(x).sum().item()
    L("train")
    timed_train(L, a.scale * 20, compiled, opt, x)
    L("eval")
    end = time.time() + a.scale * 15
    with torch.no_grad():
        while time.time() < end:
            with autocast():
                compiled(x).sum().item()
    L("train")
    train_for(a.scale * 15, compiled, opt, x)

def long_compiled(L, a):
    """Ten minutes of one torch.compile'd job: healthy stretches of minutes, checkpoints, an evaluation,
    a slow leak (16 MiB a second for four minutes, at a steady rate whatever the step time, then
    freed), a recompile when the batch shrinks, and a second job on the same GPU for 40 s."""
    model, opt, x = big_model()
    compiled = torch.compile(model, dynamic=False)
    target = os.path.join(os.environ.get("CORPUS_SCRATCH", "/tmp"), f"corpus-ckpt-{os.getpid()}.pt")
    keep: list = []
    leak = {"t0": 0.0, "kept": 0}
    rate = size(16 * 2**20, 2**12)

    L("compile")
    step(compiled, opt, x)
    if DEV == "cuda":
        torch.cuda.synchronize()
    t0 = time.time()

    def until(at: float, phase: str = "train", **kw) -> None:
        L(phase)
        train_for(max(0.0, t0 + a.scale * at - time.time()), compiled, opt, xs[0], **kw)

    def evaluate(seconds: float) -> None:
        L("eval")
        end = time.time() + seconds
        with torch.no_grad():
            while time.time() < end:
                with autocast():
                    compiled(xs[0]).sum().item()

    def leak_step() -> None:
        due = int((time.time() - leak["t0"]) * rate) - leak["kept"]
        if due >= 2**20:
            keep.append(torch.empty(due, dtype=torch.uint8, device=dev()))
            leak["kept"] += due

    xs = [x]
    try:
        until(75)
        L("checkpoint")
        _checkpoint(model, opt, target)
        until(150)
        evaluate(a.scale * 20)
        until(200)
        leak["t0"] = time.time()
        until(440, "leak", between=leak_step, sync_every=1)
        keep.clear()
        if DEV == "cuda":
            torch.cuda.empty_cache()
        until(455)
        evaluate(a.scale * 15)
        until(490)
        L("checkpoint")
        _checkpoint(model, opt, target)
        xs[0] = x[:size(6144, 48)].contiguous()
        L("compile", rows=xs[0].shape[0])  # a new shape: dynamo compiles a new graph, the GPU waits
        step(compiled, opt, xs[0]).item()
        until(530)
        _start_second_job(a.scale * 40)
        L("train_contended")
        train_for(a.scale * 40, compiled, opt, xs[0])
        time.sleep(1.0)
        until(600)
    finally:
        _unlink_quietly(target)


# -- torchrun scenarios (gloo, every rank on the one GPU) ---------------------------------------------------
def _ddp(a, width: int, depth: int, timeout_s: float = 60.0):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    torch.manual_seed(0)
    model = DDP(mlp(width, depth))
    return dist, model, torch.optim.AdamW(model.parameters(), lr=1e-5)


def _ddp_loop(dist, seconds, model, opt, x, *, batches=None, before=None) -> int:
    end = time.time() + seconds
    n = 0
    while True:
        flag = torch.tensor([1.0 if time.time() > end else 0.0])
        dist.all_reduce(flag)  # every rank stops at the same step
        if flag.item() > 0:
            return n
        if batches is not None:
            x = next(batches).to(dev(), non_blocking=True)
        if before is not None:
            before()
        step(model, opt, x).item()
        n += 1


def torchrun_healthy(L, a):
    """A healthy 2-rank job under torchrun: small gradients, a large batch (compute-bound)."""
    dist, model, opt = _ddp(a, size(1024, 32), 6)
    x = torch.randn(size(131072, 64), size(1024, 32), device=dev())
    L("train")
    _ddp_loop(dist, a.scale * 30, model, opt, x)
    dist.destroy_process_group()


def gloo_hang(L, a):
    """Gradients through the host (~GB/s each way), then rank 1 stops calling collectives."""
    dist, model, opt = _ddp(a, size(4096, 32), 4, timeout_s=a.scale * 40)
    x = torch.randn(size(4096, 16), size(4096, 32), device=dev())
    L("train")
    _ddp_loop(dist, a.scale * 18, model, opt, x)
    L("hung_collective")
    if dist.get_rank() == 1:
        time.sleep(a.scale * 45)  # never reaches the next all-reduce
        raise SystemExit(1)
    try:
        step(model, opt, x).item()  # waits in the gradient all-reduce until the timeout
    except Exception:
        raise SystemExit(1)


def _straggler(L, a, how: str):
    dist, model, opt = _ddp(a, size(2048, 32), 4)
    rank = dist.get_rank()
    w = size(2048, 32)
    x = torch.randn(size(16384, 16), w, device=dev())
    batches = None
    before = None
    if rank == 1 and how == "input":
        batches = loader(SlowItems(size(16384, 16), w, 0.3), workers=2)
    elif rank == 1 and how == "cpu":
        host = torch.randn(256, 1024)
        before = lambda: cpu_work(0.2, host)  # noqa: E731
    elif rank == 1 and how == "sleep":
        before = lambda: time.sleep(0.2)  # noqa: E731
    L(f"straggler_{how}")
    _ddp_loop(dist, a.scale * 30, model, opt, x, batches=batches, before=before)
    dist.destroy_process_group()


def gloo_rank0_saves(L, a):
    """Two ranks; every 8 s rank 0 alone writes a full, fsynced checkpoint while rank 1 waits for it
    at a barrier (the common `if rank == 0: torch.save(...)`, then `dist.barrier()`)."""
    dist, model, opt = _ddp(a, size(4096, 64), 4, timeout_s=a.scale * 120)
    rank = dist.get_rank()
    x = torch.randn(size(8192, 64), size(4096, 64), device=dev())
    target = os.path.join(os.environ.get("CORPUS_SCRATCH", "/tmp"), f"corpus-ckpt-{os.getpid()}.pt")
    end = time.time() + a.scale * 45
    try:
        while True:
            L("train_gloo")  # its 268 MB of gradients go through host memory each step
            n = _ddp_loop(dist, min(8.0 * a.scale, max(0.0, end - time.time())), model, opt, x)
            if n == 0 or time.time() >= end:
                break
            if rank == 0:
                L("checkpoint")
                state = {"model": model.module.state_dict(), "opt": opt.state_dict()}
                with open(target, "wb") as f:
                    torch.save(state, f)
                    f.flush()
                    os.fsync(f.fileno())
            else:
                L("barrier_wait")
            dist.barrier()
    finally:
        _unlink_quietly(target)
    dist.destroy_process_group()


class _SlowFile:
    """A file written at a bounded rate (a slow network file system)."""

    def __init__(self, f, seconds_per_mib: float) -> None:
        self.f, self.rate = f, seconds_per_mib

    def write(self, b) -> int:
        time.sleep(self.rate * len(b) / 2**20)
        return self.f.write(b)

    def flush(self) -> None:
        self.f.flush()


def gloo_long_save(L, a):
    """Two ranks; once, rank 0 alone writes an 800 MB checkpoint to a slow file system (~40 s) while
    rank 1 waits for it at a barrier, then both train on. No stall: rank 0 is saving."""
    dist, model, opt = _ddp(a, size(4096, 64), 4, timeout_s=a.scale * 300)
    rank = dist.get_rank()
    x = torch.randn(size(8192, 64), size(4096, 64), device=dev())
    target = os.path.join(os.environ.get("CORPUS_SCRATCH", "/tmp"), f"corpus-ckpt-{os.getpid()}.pt")
    try:
        L("train_gloo")
        _ddp_loop(dist, a.scale * 15, model, opt, x)
        if rank == 0:
            L("checkpoint")
            state = {"model": model.module.state_dict(), "opt": opt.state_dict()}
            with open(target, "wb") as f:
                torch.save(state, _SlowFile(f, 0.05 * a.scale))
                f.flush()
                os.fsync(f.fileno())
        else:
            L("barrier_wait")
        dist.barrier()
        L("train_gloo")
        _ddp_loop(dist, a.scale * 12, model, opt, x)
    finally:
        _unlink_quietly(target)
    dist.destroy_process_group()


def straggler_input(L, a):
    _straggler(L, a, "input")


def straggler_cpu(L, a):
    _straggler(L, a, "cpu")


def straggler_sleep(L, a):
    _straggler(L, a, "sleep")


SCENARIOS = {f.__name__: f for f in (
    healthy_bf16, compile_warmup, healthy_crash, starved_then_fed, underused, leak, oom_retries, reserved_gap, fragmented,
    copies_and_kernels, tiny_kernels, fp32_no_tf32, eval_phases, checkpoints, loader_hang, idle_alive, cpu_training,
    other_process, second_job, fp16_overflow, recompile, killed_worker, long_mixed, long_compiled,
    host_memory_pressure, power_capped, compiled_eval_no_grad,
    torchrun_healthy, gloo_hang, gloo_rank0_saves, gloo_long_save, straggler_input, straggler_cpu, straggler_sleep)}


def main() -> int:
    global DEV, SMALL
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--labels", help="append the job's own phase labels (JSON lines) here")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every phase's length")
    ap.add_argument("--cpu", action="store_true", help="a dry run on the CPU at tiny sizes")
    a = ap.parse_args()
    if a.cpu:
        DEV, SMALL = "cpu", True
    rank = int(os.environ["RANK"]) if "RANK" in os.environ else None
    L = Labels(a.labels, rank)
    SCENARIOS[a.scenario](L, a)
    L("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
