"""Where a training process's wall time goes, its matmul precision and the FLOPs of one step.

Part of the probe (see probe_agent): standalone on purpose (stdlib and torch only), copied
next to the job by ``traintop run``. The probe thread calls ``Goodput.window`` once per message;
the training thread only passes through the tiny hooks installed here.

The ledger splits each message window's wall time into buckets that add up to it:

- ``input``: inside ``DataLoader.__next__`` (measured by the probe itself);
- ``collective``: inside a blocking ``torch.distributed`` call on the training thread (a barrier,
  an object collective, any collective on gloo): the wait for the other ranks and the transfer
  (measured), or its stack in c10d while the step is overdue (sampled). On gloo with CPU tensors,
  the training thread's idle time inside ``backward()`` too: DDP's gradient all-reduce waits there,
  in C++ (wall time less the thread's CPU time, measured). NCCL collectives on tensors return at
  once and wait on the GPU: those waits are not here (the straggler finding measures them from the
  GPUs);
- ``checkpoint``: inside ``torch.save``/``torch.load`` or ``torch.distributed.checkpoint``'s
  save/load on the training thread (measured), or the training thread's stack in
  serialization code while its step is overdue (sampled);
- ``compile``: torch.compile's own compile time (dynamo's counter), or its stack in dynamo or
  inductor while the step is overdue;
- ``eval``: from ``model.eval()`` on the training thread, for a module the optimizer trains, to
  its ``model.train()`` or the next optimizer step (measured: ``Module.train`` is wrapped, which
  works under torch.compile, in ``Trainer``, Lightning and hand-written loops); a checkpoint saved
  meanwhile is the checkpoint's. Or, with no such call, the step is overdue and a forward pass
  ran with grad disabled on the training thread (a one-shot forward hook, armed only then: grad
  mode is thread-local; never once torch.compile has compiled a graph);
- ``train``: the rest of a window where steps run at their usual pace;
- ``startup``: before the first optimizer step; ``stalled``: no step for the stall threshold;
  ``other``: an overdue step with none of the above (a pause: logging, ``.item()``, GC, …).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import traceback
from typing import Any

BUCKETS = ("train", "input", "collective", "checkpoint", "eval", "compile", "startup", "stalled", "other")
PRECISION_EVERY_S = 10.0  # one forward hook this often reads the training thread's precision
FLOPS_FIRST_STEP = 20  # count one step's FLOPs after the warm-up ...
FLOPS_EVERY_S = 600.0  # ... and again this often
OVERDUE_FACTOR = 1.5  # a step later than this x the longest recent step gap is overdue
GAPS_KEPT = 32  # a job that syncs every N steps has one long gap in N: the longest of these is normal
OVERDUE_MIN_S = 0.3
HELD = ("checkpoint", "collective", "eval")  # the buckets measured as intervals on the training thread
PARAMS_LOOKED_AT = 100_000  # parameters of a module looked at to tell whether an optimizer trains it

_CHECKPOINT_FILES = ("/torch/serialization.py", "/torch/distributed/checkpoint/", "/safetensors/",
                     "/pickle.py", "/torch/storage.py")
# The blocking calls of torch.distributed a training loop makes itself (DDP's gradient all-reduce
# runs inside backward, in C++: not these).
_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
                "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "barrier", "monitored_barrier",
                "reduce", "gather", "gather_object", "scatter", "scatter_object_list", "all_to_all",
                "all_to_all_single")
_COLLECTIVE_FILES = ("/torch/distributed/distributed_c10d.py", "/torch/distributed/c10d_logger.py")
_LOADER_FILE = "/torch/utils/data/dataloader.py"  # a thread in it waits for its next batch (or starts workers)
# Where torch.compile compiles (every frame dynamo takes passes through convert_frame); not all of
# torch/_dynamo: its eval_frame wrappers sit on every optimizer step's stack.
_COMPILE_FILES = ("/torch/_dynamo/convert_frame.py", "/torch/_inductor/compile_fx.py",
                  "/torch/_inductor/async_compile.py", "/torch/_functorch/_aot_autograd/", "/triton/compiler/")


# the probe's own work inside a step (its FLOP count, its profiler trace): the step runs, slower
_PROBE_COUNTING = ("/torch/utils/flop_counter.py", "/torch/autograd/profiler_util.py", "/torch/profiler/profiler.py",
                   "/torch/autograd/profiler.py")
# (module, class or None, names, bucket): the calls timed on the training thread. fsync is a checkpoint's
# too (torch.save returns before the data is on disk); safetensors' _flatten and serialize_file are
# looked up at each call, so they time a save_file imported by name too; the frameworks' own save
# methods hold their bookkeeping (configs, RNG and trainer state, old checkpoints rotated out).
_TIMED = (
    ("os", None, ("fsync",), "checkpoint"),
    ("torch", None, ("save", "load"), "checkpoint"),
    ("torch.distributed.checkpoint", None, ("save", "load", "async_save", "save_state_dict", "load_state_dict"),
     "checkpoint"),
    ("safetensors.torch", None, ("save_file", "save_model", "load_file", "load_model", "_flatten", "serialize_file"),
     "checkpoint"),
    ("transformers.trainer", "Trainer", ("_save_checkpoint", "save_model"), "checkpoint"),
    ("transformers.modeling_utils", "PreTrainedModel", ("save_pretrained",), "checkpoint"),
    ("lightning.pytorch.trainer.trainer", "Trainer", ("save_checkpoint",), "checkpoint"),
    ("pytorch_lightning.trainer.trainer", "Trainer", ("save_checkpoint",), "checkpoint"),
    ("accelerate.accelerator", "Accelerator", ("save_state", "save_model"), "checkpoint"),
    ("torch.distributed", None, _COLLECTIVES, "collective"),
)


def stack_kind(frame, depth: int = 80) -> str | None:
    """'train' inside the probe's own FLOP count (a step, slower), 'checkpoint' or 'compile' where a function on the stack is in such code, else 'collective'
    where one is in torch.distributed's collectives (a checkpoint's own collectives are the
    checkpoint's), else None.

    Module-level code does not count: importing torch's compiler or serializer is neither
    (``torch.compile()`` itself, which imports the compiler, is compile time)."""
    collective = False
    while frame is not None and depth > 0:
        code = frame.f_code
        name = code.co_filename
        if code.co_name != "<module>" and not name.startswith("<frozen"):
            if name.endswith(_PROBE_COUNTING):
                return "train"  # the step the probe counts FLOPs of, or traces, runs slower: still a step
            if any(p in name for p in _COMPILE_FILES) or (code.co_name == "compile"
                                                          and name.endswith("/torch/__init__.py")):
                return "compile"
            if any(p in name for p in _CHECKPOINT_FILES):
                return "checkpoint"
            if any(p in name for p in _COLLECTIVE_FILES):
                collective = True
        frame = frame.f_back
        depth -= 1
    return "collective" if collective else None


def _in_loader(frame, depth: int = 80) -> bool:
    while frame is not None and depth > 0:
        if frame.f_code.co_filename.endswith(_LOADER_FILE):
            return True
        frame = frame.f_back
        depth -= 1
    return False


def stack_text(frame, limit: int = 40) -> str:
    """Another thread's stack as traceback text. Its (file, line, function) are read first in one
    tight loop, the source lines after: formatting as it walks lets that thread run on meanwhile,
    and its outer frames then show lines it reached later (a torn stack)."""
    calls: list[tuple] = []
    while frame is not None and len(calls) < limit:
        code = frame.f_code
        calls.append((code.co_filename, frame.f_lineno, code.co_name, None))
        frame = frame.f_back
    calls.reverse()
    return "".join(traceback.format_list(traceback.StackSummary.from_list(calls)))


def _dtype_name(dt) -> str | None:
    s = str(dt) if dt is not None else None
    return s.replace("torch.", "") if s else None


def matmul_precision(torch, autocast: bool, autocast_dtype, param_dtype) -> str:
    """The precision the job's matmuls run in: bf16/fp16 (autocast or parameters), tf32 or fp32."""
    if autocast and autocast_dtype in ("bfloat16", "float16"):
        return "bf16" if autocast_dtype == "bfloat16" else "fp16"
    if param_dtype in ("bfloat16", "float16"):
        return "bf16" if param_dtype == "bfloat16" else "fp16"
    return "tf32" if tf32_allowed(torch) else "fp32"


def tf32_allowed(torch) -> bool:
    matmul = torch.backends.cuda.matmul
    mode = getattr(matmul, "fp32_precision", None)  # torch >= 2.9; "none" defers to the older flags
    if mode == "tf32":
        return True
    if mode == "ieee":
        return False
    try:
        if matmul.allow_tf32:
            return True
    except (AttributeError, RuntimeError):
        pass
    return torch.get_float32_matmul_precision() in ("high", "medium")


# matmul-like ATen ops and which argument holds their input (addmm's first is the bias)
_MATMUL_INPUT = {"mm": 0, "addmm": 1, "bmm": 0, "baddbmm": 1, "matmul": 0, "convolution": 0, "linear": 0,
                 "_scaled_dot_product_flash_attention": 0, "_scaled_dot_product_efficient_attention": 0,
                 "_scaled_dot_product_cudnn_attention": 0, "_scaled_dot_product_flash_attention_for_cpu": 0}


def _matmul_dtypes():
    """A dispatch mode that weighs the dtypes matmul-like ops run in by their outputs' sizes."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class MatmulDtypes(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.weights: dict[str, int] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            k = _MATMUL_INPUT.get(getattr(getattr(func, "overloadpacket", None), "__name__", ""))
            if k is not None and len(args) > k and hasattr(args[k], "dtype"):
                name = str(args[k].dtype).replace("torch.", "")
                first = out[0] if isinstance(out, (tuple, list)) and out else out
                self.weights[name] = self.weights.get(name, 0) + int(getattr(first, "numel", lambda: 1)())
            return out

    return MatmulDtypes()


def _computes(module) -> bool:
    """A leaf module with weights of its own (a Linear, a convolution): where the matmuls run."""
    return next(module.children(), None) is None and next(module.parameters(recurse=False), None) is not None


def _hint(n) -> int:
    """A size as a plain int (a symbolic one by the value it had when traced)."""
    if isinstance(n, int):
        return n
    hint = getattr(getattr(n, "node", None), "hint", None)
    if isinstance(hint, int):
        return hint
    return int(n)


def _compiling_check():
    """torch.compiler.is_compiling where this torch has it (dynamo answers it while tracing)."""
    compiler = getattr(sys.modules.get("torch"), "compiler", None)
    check = getattr(compiler, "is_compiling", None)
    return check if callable(check) else (lambda: False)


class Goodput:
    """The ledger, precision and FLOPs of one process (see the module's docstring)."""

    def __init__(self, clock=time.perf_counter) -> None:
        self.clock = clock
        self.train_thread: int | None = None  # ident of the thread that steps the optimizer
        self._tls = threading.local()
        # seconds inside timed calls (checkpoint, collective) and evaluation in the current window
        self._held = dict.fromkeys(HELD, 0.0)
        self._held_total = 0.0  # all timed seconds so far (for step gaps net of them)
        self._gaps: list[float] = []  # the last step gaps, less the timed calls inside them
        self._last_step_at: tuple[float, float] | None = None  # (when, _held_total then)
        self._held_since: tuple[str, float] | None = None  # (bucket, start) of the timed call in progress
        self._eval_since: float | None = None  # the trained model in eval mode since then (not inside a checkpoint)
        self._eval_paused = False  # a checkpoint interrupted that evaluation: it resumes after
        self._bwd: tuple[float, float] | None = None  # (wall, thread CPU) where backward's current stretch began
        # the fields above change together on the training thread and are read together on the
        # probe's (uncontended: the calls it guards block for far longer)
        self._held_lock = threading.Lock()
        self._trained: set[int] = set()  # ids of the parameters an optimizer steps
        self._optimizers: dict[int, int] = {}  # id(optimizer) -> parameters seen in it
        self._gloo_cpu: bool | None = None  # DDP on gloo with CPU tensors: backward's idle time is its all-reduce
        self.ddp_seen = False  # a DistributedDataParallel was made
        self._sched_fd: int | None = None  # the training thread's /proc schedstat (opened on that thread)
        self.graph_flops = 0  # FLOPs of the compiled graphs run with grad enabled so far (torch.compile)
        self._graph_flops_at_step = 0
        self._window_start = clock()
        # dynamo's cumulative compile seconds at the last window: 0 before torch.compile is imported (a
        # first compile can finish inside the window that first sees the counter)
        self._compile_total = 0.0
        self._compile_call_s = 0.0  # seconds inside torch.compile() calls themselves (training thread)
        self._pending = 0.0  # seconds of windows with no step yet, not overdue: train if a step follows
        self._steps_seen = 0
        self._forward: tuple | None = None  # (t, grad enabled) of the last sampled forward on the training thread
        self._armed = None  # the one-shot forward hook's handle while armed
        self._armed_for = ""  # "eval" (an overdue step) or "precision"
        self._precision_at = -PRECISION_EVERY_S
        self.precision: dict | None = None
        self.totals = dict.fromkeys(BUCKETS, 0.0)
        self._undo: list = []
        self._patched: set[str] = set()
        # FLOPs of one optimizer step
        self._flop_mode: Any = None
        self._flop_started: float | None = None
        self._flops_at: float | None = None
        self.flops: dict | None = None
        self.flops_disabled = os.environ.get("TRAINTOP_PROBE_FLOPS") == "0"
        self.busy = lambda: False  # a capture is running: no FLOP counting meanwhile
        self.closing = False  # the probe is stopping (the job exits): its own join is no pause
        self.errors = 0
        self.pause_stack: str | None = None  # the training thread's stack in the last "other" window
        self._compiling = lambda: False  # torch.compiler.is_compiling, once torch is whole
        self.compile_seen = False  # the job has called torch.compile: no global module hook from then on

    # -- hooks (training thread) ------------------------------------------------
    def on_step(self, steps: int, optimizer=None) -> None:
        """From the probe's optimizer step hook: remember the training thread and the step's gap; count FLOPs."""
        self.train_thread = threading.get_ident()
        now = self.clock()
        self._end_eval(now)  # a step trains: whatever evaluation ran has ended
        if optimizer is not None:
            self._learn_parameters(optimizer)
        last = self._last_step_at
        if last is not None:
            self._gaps.append(max(0.0, now - last[0] - (self._held_total - last[1])))
            if len(self._gaps) > GAPS_KEPT:
                del self._gaps[0]
        self._last_step_at = (now, self._held_total)
        if self.flops_disabled:
            return
        if self.graph_flops > self._graph_flops_at_step:  # compiled graphs ran in this step: their FLOPs
            self.flops = {"flops": self.graph_flops - self._graph_flops_at_step, "step_s": None, "t": time.time(),
                          "step": steps, "how": "compiled"}
            self._graph_flops_at_step = self.graph_flops
            return
        try:
            self._flops_step(steps)
        except Exception:
            self.flops_disabled = True  # an op the counter cannot take: never again
            self.errors += 1
            self._flop_mode = None

    def _flops_step(self, steps: int) -> None:
        now = self.clock()
        if self._flop_mode is not None:
            mode, self._flop_mode = self._flop_mode, None
            mode.__exit__(None, None, None)
            took = now - self._flop_started
            self.flops = {"flops": int(mode.get_total_flops()), "step_s": took, "t": time.time(), "step": steps,
                          "how": "counted"}
            self._flops_at = now
            return
        due = (self._flops_at is None and steps >= FLOPS_FIRST_STEP) or \
              (self._flops_at is not None and now - self._flops_at >= FLOPS_EVERY_S)
        if not due or self.compiled() or self.busy():
            return
        counter = getattr(sys.modules.get("torch.utils.flop_counter"), "FlopCounterMode", None)
        if counter is None:
            import torch.utils.flop_counter as fc  # torch is imported: it steps an optimizer
            counter = fc.FlopCounterMode
        mode = counter(display=False)
        mode.__enter__()
        self._flop_mode, self._flop_started = mode, self.clock()

    def compiled(self) -> bool:
        """Whether torch.compile has compiled a graph here (then no module hooks: they would recompile)."""
        utils = sys.modules.get("torch._dynamo.utils")
        counters = getattr(utils, "counters", None)
        try:
            return bool(counters and counters["stats"]["unique_graphs"])
        except Exception:
            return False

    def wrap_timed(self, fn, bucket: str = "checkpoint"):
        """``fn`` timed into ``bucket`` when the training thread calls it (outermost timed call only:
        a checkpoint's own collectives are the checkpoint's)."""
        goodput = self
        compiling = _compiling_check()

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if compiling():  # inside torch.compile's tracing: leave the call as it is
                return fn(*args, **kwargs)
            tls = goodput._tls
            if getattr(tls, "depth", 0) or not goodput._on_training_thread():
                return fn(*args, **kwargs)
            if bucket != "checkpoint" and goodput._eval_since is not None:
                return fn(*args, **kwargs)  # an evaluation's own collectives (gathering its metrics) are its
            tls.depth = 1
            with goodput._held_lock:
                t = goodput.clock()
                if goodput._eval_since is not None:  # a checkpoint saved after an evaluation, before train()
                    goodput._close_eval(t)
                    goodput._eval_paused = True
                goodput._held_since = (bucket, t)
            try:
                return fn(*args, **kwargs)
            finally:
                tls.depth = 0
                with goodput._held_lock:
                    end = goodput.clock()
                    goodput._held_since = None
                    goodput._held[bucket] += end - max(t, goodput._window_start)
                    goodput._held_total += end - t
                    if goodput._eval_paused:
                        goodput._eval_paused, goodput._eval_since = False, end

        timed.__traintop_probe__ = True  # type: ignore[attr-defined]
        return timed

    def _on_training_thread(self) -> bool:
        me = threading.get_ident()
        return me == self.train_thread if self.train_thread is not None else me == threading.main_thread().ident

    # -- evaluation: the trained model in eval mode --------------------------------
    def _learn_parameters(self, optimizer) -> None:
        """Remember which parameters optimizers step (looked at again only when a group is added)."""
        groups = getattr(optimizer, "param_groups", None)
        if not isinstance(groups, list) or self._optimizers.get(id(optimizer)) == len(groups):
            return
        self._optimizers[id(optimizer)] = len(groups)
        for group in groups:
            for p in group.get("params", ()) if isinstance(group, dict) else ():
                self._trained.add(id(p))

    def _is_trained(self, module) -> bool:
        """Whether an optimizer steps any of the module's parameters: the model, not a frozen teacher,
        an EMA copy or a metric's module."""
        trained = self._trained
        if not trained:
            return False
        for k, p in enumerate(module.parameters()):
            if id(p) in trained:
                return True
            if k >= PARAMS_LOOKED_AT:
                return False
        return False

    def _on_mode(self, module, training: bool) -> None:
        """``module.train(training)`` returned on the training thread."""
        if training and self._eval_since is None and not self._eval_paused:
            return  # HF's Trainer calls model.train() every step: nothing to end, nothing to look at
        if not self._is_trained(module):
            return
        now = self.clock()
        if training:
            self._end_eval(now)
            return
        with self._held_lock:
            if self._eval_since is None and self._held_since is None and not self._eval_paused:
                self._eval_since = now

    def _end_eval(self, now: float) -> None:
        if self._eval_since is None and not self._eval_paused:
            return
        with self._held_lock:
            self._eval_paused = False
            if self._eval_since is not None:
                self._close_eval(now)

    def _close_eval(self, now: float) -> None:
        """(Under the lock.) The evaluation in progress ends now."""
        since, self._eval_since = self._eval_since, None
        assert since is not None  # the callers check it under the same lock
        self._held["eval"] += max(0.0, now - max(since, self._window_start))
        self._held_total += max(0.0, now - since)

    def in_eval(self) -> bool:
        """The trained model is being evaluated now (its input wait is the evaluation's)."""
        return self._eval_since is not None

    def wrap_train(self, fn):
        """``nn.Module.train`` reporting, on the training thread, the outermost call's mode."""
        goodput = self
        compiling = _compiling_check()

        @functools.wraps(fn)
        def train(module, mode=True):
            if compiling():
                return fn(module, mode)
            tls = goodput._tls
            if getattr(tls, "in_train", False) or not goodput._on_training_thread():
                return fn(module, mode)  # a child's call inside the model's own
            tls.in_train = True
            try:
                return fn(module, mode)
            finally:
                tls.in_train = False
                try:
                    goodput._on_mode(module, bool(mode))
                except Exception:
                    goodput.errors += 1

        train.__traintop_probe__ = True
        return train

    # -- DDP's all-reduce inside backward, on gloo with CPU tensors -----------------
    def _gloo_on_cpu(self) -> bool:
        """DDP over gloo with CPU tensors: the training thread's sleep inside backward is the all-reduce."""
        if self._gloo_cpu is None:
            if not self.ddp_seen:
                return False
            torch = sys.modules.get("torch")
            dist = sys.modules.get("torch.distributed")
            try:
                if torch is None or dist is None or not dist.is_available() or not dist.is_initialized():
                    return False  # not yet: asked again at the next backward
                self._gloo_cpu = "gloo" in str(dist.get_backend()) and not torch.cuda.is_initialized()
            except Exception:
                self._gloo_cpu = False
        return self._gloo_cpu

    def _busy_seconds(self) -> float | None:
        """The training thread's seconds on a CPU or waiting for one (/proc's schedstat): the rest of
        its wall time it slept. A busy host keeps a runnable thread waiting; that is no collective."""
        try:
            if self._sched_fd is None:
                self._sched_fd = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
            fields = os.pread(self._sched_fd, 64, 0).split()
            return (int(fields[0]) + int(fields[1])) / 1e9
        except (OSError, ValueError, IndexError):
            self._gloo_cpu = False  # no schedstat here: no measure
            return None

    def wrap_ddp_init(self, fn):
        goodput = self

        @functools.wraps(fn)
        def __init__(*args, **kwargs):
            fn(*args, **kwargs)
            goodput.ddp_seen = True

        __init__.__traintop_probe__ = True
        return __init__

    def wrap_backward(self, fn):
        """``torch.autograd.backward``: on gloo with CPU tensors, the training thread's idle time inside
        it is the wait for the other ranks' gradients (DDP all-reduces them from C++ in there)."""
        goodput = self
        compiling = _compiling_check()

        @functools.wraps(fn)
        def backward(*args, **kwargs):
            if compiling() or not goodput._on_training_thread():
                return fn(*args, **kwargs)
            with goodput._held_lock:
                goodput._eval_since = None  # a backward: that "evaluation" was training (a GAN's eval())
                goodput._eval_paused = False
                measure = goodput._bwd is None and goodput._held_since is None and goodput._gloo_on_cpu()
                busy = goodput._busy_seconds() if measure else None
                if busy is not None:
                    goodput._bwd = (goodput.clock(), busy)
            try:
                return fn(*args, **kwargs)
            finally:
                if busy is not None:
                    with goodput._held_lock:
                        now_busy = goodput._busy_seconds()
                        if now_busy is not None and goodput._bwd is not None:
                            goodput._bwd_idle(goodput.clock(), now_busy)
                        goodput._bwd = None

        backward.__traintop_probe__ = True
        return backward

    def _bwd_idle(self, now: float, busy: float) -> None:
        """(Under the lock.) The sleep in backward's stretch up to now goes to the collective bucket."""
        assert self._bwd is not None  # the callers check it under the same lock
        wall0, busy0 = self._bwd
        idle = max(0.0, (now - wall0) - (busy - busy0))
        self._held["collective"] += idle
        self._held_total += idle
        self._bwd = (now, busy)

    # -- FLOPs of compiled graphs (torch.compile) -----------------------------------
    def _count_graph(self, gm, example_inputs) -> int:
        """FLOPs of one run of a graph dynamo hands its backend, forward and (with grad on) backward,
        counted on fake tensors of its inputs' shapes: nothing runs, nothing of the job's is touched."""
        torch = sys.modules["torch"]
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.utils._pytree import tree_leaves
        from torch.utils.flop_counter import FlopCounterMode

        fake = FakeTensorMode(allow_non_fake_inputs=True)
        dtypes = _matmul_dtypes()
        args = []
        for x in example_inputs:
            if isinstance(x, torch.Tensor):
                with fake:
                    args.append(torch.empty_strided([_hint(n) for n in x.shape], [_hint(n) for n in x.stride()],
                                                    dtype=x.dtype, device=x.device, requires_grad=x.requires_grad))
            elif isinstance(x, torch.SymInt):
                args.append(_hint(x))
            else:
                args.append(x)
        grad = torch.is_grad_enabled()
        with fake, FlopCounterMode(display=False) as counter, dtypes:
            out = gm(*args)
            if grad:
                outs = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
                if outs:
                    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        if grad and dtypes.weights:  # the training graph's matmuls say their precision (no hook can, here)
            main = max(dtypes.weights, key=dtypes.weights.get)
            mode = {"bfloat16": "bf16", "float16": "fp16"}.get(main) or ("tf32" if tf32_allowed(torch) else "fp32")
            params = next((str(x.dtype).replace("torch.", "") for x in example_inputs
                           if isinstance(x, torch.nn.Parameter)), None)
            self.precision = {"matmul": mode, "autocast": None, "params": params, "tf32": tf32_allowed(torch),
                              "cudnn_tf32": bool(getattr(torch.backends.cudnn, "allow_tf32", False)),
                              "grad": True, "t": time.time(), "how": "compiled graph"}
        return int(counter.get_total_flops())

    def wrap_user_compiler(self, fn):
        """dynamo's ``OutputGraph.call_user_compiler``: count each new graph's FLOPs once, and every run
        of its compiled form with grad enabled adds them to ``graph_flops``."""
        goodput = self

        @functools.wraps(fn)
        def call_user_compiler(output_graph, gm, *args, **kwargs):
            flops = 0
            if not goodput.flops_disabled:
                try:
                    example = args[0] if args else kwargs.get("example_inputs")
                    flops = goodput._count_graph(gm, output_graph.example_inputs() if example is None else example)
                except Exception:
                    flops = 0  # a graph the counter cannot take: no FLOPs, never the job's error
            compiled = fn(output_graph, gm, *args, **kwargs)
            return goodput._counting(compiled, flops) if flops > 0 else compiled

        call_user_compiler.__traintop_probe__ = True
        return call_user_compiler

    def _counting(self, compiled, flops: int):
        torch = sys.modules["torch"]
        module = torch.nn.Module
        if isinstance(compiled, module) or isinstance(getattr(compiled, "__self__", None), module) \
                or not callable(compiled):
            return compiled  # a debugging backend's graph module: dynamo treats those specially
        grad_enabled = torch.is_grad_enabled
        goodput = self

        @functools.wraps(compiled)
        def counted(*args, **kwargs):
            if grad_enabled():
                goodput.graph_flops += flops
            else:
                goodput.forward_without_grad()
            return compiled(*args, **kwargs)

        return counted

    def wrap_compile(self, fn):
        """``torch.compile``: once it has imported dynamo, its compiler hook goes in at once (the first
        graph is compiled at the model's first call, often before the probe's next tick)."""
        goodput = self

        @functools.wraps(fn)
        def compile(*args, **kwargs):
            goodput.compile_seen = True
            goodput.disarm()  # no global hook may be in place when the first graph compiles
            t0 = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
            finally:  # the first call imports the compiler (dynamo, inductor): seconds its counter never sees
                goodput._compile_call_s += time.perf_counter() - t0
            try:
                goodput._install_compiler_hook()
            except Exception:
                goodput.errors += 1
            return out

        compile.__traintop_probe__ = True
        return compile

    def _install_compiler_hook(self) -> None:
        if "compiler" in self._patched or self.flops_disabled:
            return
        og = sys.modules.get("torch._dynamo.output_graph")
        cls = getattr(og, "OutputGraph", None)
        original = getattr(cls, "call_user_compiler", None)
        if cls is None or original is None or getattr(getattr(og, "__spec__", None), "_initializing", False):
            return
        if not getattr(original, "__traintop_probe__", False):
            cls.call_user_compiler = self.wrap_user_compiler(original)
            self._undo.append(functools.partial(setattr, cls, "call_user_compiler", original))
        self._patched.add("compiler")

    def install(self) -> None:
        """Wrap the checkpoint and collective calls of the modules imported so far (called each tick)."""
        for modname, clsname, names, bucket in _TIMED:
            key = f"{modname}:{clsname}" if clsname else modname
            if key in self._patched:
                continue
            mod = sys.modules.get(modname)
            # a module still being imported (in sys.modules, its names not yet defined): the next tick
            if mod is None or getattr(getattr(mod, "__spec__", None), "_initializing", False) \
                    or (modname == "torch" and not hasattr(mod, "save")):
                continue
            owner = getattr(mod, clsname, None) if clsname else mod
            if owner is None:
                continue
            for name in names:
                # a class's own attribute only: a subclass's override is wrapped where it is defined
                original = (vars(owner).get(name) if clsname else getattr(owner, name, None))
                if original is None or getattr(original, "__traintop_probe__", False) or not callable(original):
                    continue
                setattr(owner, name, self.wrap_timed(original, bucket))
                self._undo.append(functools.partial(setattr, owner, name, original))
            self._patched.add(key)
        self._install_methods()

    def _install_methods(self) -> None:
        """Wrap ``nn.Module.train``, ``torch.autograd.backward``, ``torch.compile`` and dynamo's compiler
        hook, each once its module is whole."""
        torch = sys.modules.get("torch")
        if torch is None or getattr(getattr(torch, "__spec__", None), "_initializing", False):
            return
        if "compiling" not in self._patched:
            self._compiling = _compiling_check()
            self._patched.add("compiling")
        targets = (("train", "torch.nn.modules.module", "Module", "train", self.wrap_train),
                   ("backward", "torch.autograd", None, "backward", self.wrap_backward),
                   ("compile", "torch", None, "compile", self.wrap_compile),
                   ("ddp", "torch.nn.parallel.distributed", "DistributedDataParallel", "__init__", self.wrap_ddp_init))
        for key, modname, clsname, name, wrap in targets:
            if key in self._patched:
                continue
            mod = sys.modules.get(modname)
            if mod is None or getattr(getattr(mod, "__spec__", None), "_initializing", False):
                continue
            owner = getattr(mod, clsname, None) if clsname else mod
            original = getattr(owner, name, None)
            if owner is None or not callable(original):
                continue
            if not getattr(original, "__traintop_probe__", False):
                setattr(owner, name, wrap(original))
                self._undo.append(functools.partial(setattr, owner, name, original))
            self._patched.add(key)
        self._install_compiler_hook()

    def uninstall(self) -> None:
        self.disarm()
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception:
                pass
        self._undo = []

    def forward_without_grad(self) -> None:
        """A compiled graph ran on the training thread with grad off: an evaluation, also where the job
        never calls ``model.eval()`` (a forward under ``torch.no_grad()`` alone). No module hook can
        tell it under torch.compile; the graph's own call can."""
        if self._on_training_thread():
            self._forward = (self.clock(), False)

    def _on_forward(self, module, args) -> None:
        if self._compiling():
            return
        try:
            if not self._on_training_thread():
                return  # another thread's forward: leave the hook for the training thread's
            leaf = _computes(module)
            if self._armed_for == "precision" and not leaf:
                # a leaf with weights does the math: a model whose forward enters autocast itself
                # (Accelerate and transformers' Trainer wrap it so) is still outside it in its pre-hook
                return
            self.disarm()
            torch = sys.modules["torch"]
            grad = torch.is_grad_enabled()
            self._forward = (self.clock(), grad)
            if (self._armed_for == "precision" or self.precision is None) and leaf:
                self._read_precision(torch, module)
        except Exception:
            self.errors += 1
            self.disarm()

    def _read_precision(self, torch, module) -> None:
        param = next(module.parameters(), None)
        device = param.device.type if param is not None else "cuda"
        try:
            autocast = bool(torch.is_autocast_enabled(device))
            ac_dtype = _dtype_name(torch.get_autocast_dtype(device)) if autocast else None
        except (TypeError, RuntimeError):  # older torch: no device argument
            autocast = bool(torch.is_autocast_enabled())
            ac_dtype = _dtype_name(torch.get_autocast_gpu_dtype()) if autocast else None
        p_dtype = _dtype_name(param.dtype) if param is not None else None
        self.precision = {"matmul": matmul_precision(torch, autocast, ac_dtype, p_dtype),
                          "autocast": ac_dtype, "params": p_dtype, "tf32": tf32_allowed(torch),
                          "cudnn_tf32": bool(getattr(torch.backends.cudnn, "allow_tf32", False)),
                          "grad": torch.is_grad_enabled(), "t": time.time()}

    def arm(self, why: str) -> None:
        # Never where torch.compile is about: a graph compiled with a global hook in place traces it
        # (a graph break where it does what dynamo cannot), warns, and recompiles once the hook is gone.
        # Nor before the first step: everything then is start-up, and a model compiled at its start
        # compiles at its first call.
        if self._armed is not None or self.compile_seen or self._last_step_at is None or self.compiled():
            return
        hooks = sys.modules.get("torch.nn.modules.module")
        register = getattr(hooks, "register_module_forward_pre_hook", None)
        if register is None:
            return
        self._armed_for = why
        self._armed = register(self._on_forward)

    def disarm(self) -> None:
        handle, self._armed = self._armed, None
        if handle is not None:
            handle.remove()

    # -- the ledger (probe thread) -------------------------------------------------
    def _compile_seconds(self) -> float | None:
        utils = sys.modules.get("torch._dynamo.utils")
        spent = getattr(utils, "cumulative_time_spent_ns", None)
        calls = self._compile_call_s
        if not isinstance(spent, dict):
            return calls or None
        return calls + sum(v for k, v in list(spent.items())
                           if k in ("entire_frame_compile", "entire_backward_compile")) / 1e9

    def held_seconds(self) -> float:
        """Seconds the training thread has spent in timed calls (checkpoints, collectives) and evaluation so far."""
        with self._held_lock:
            held = self._held_total
            now = self.clock()
            if self._held_since is not None:
                held += now - self._held_since[1]
            if self._eval_since is not None:
                held += now - self._eval_since
            return held

    def recent_gaps(self) -> list[float]:
        """The last step gaps, less the timed calls inside them."""
        return list(self._gaps)

    def usual_gap(self) -> float:
        """The longest recent gap between steps (less checkpoints): a job that synchronises with the GPU
        every N steps queues N-1 steps in milliseconds, then waits for them all in one long gap."""
        return max(self._gaps) if self._gaps else 0.0

    def window(self, now: float, window: float, input_wait: float, steps: int, since_step: float | None,
               stall_after: float) -> dict:
        """Split the window that ends now into the buckets (seconds, adding up to ``window``)."""
        out = dict.fromkeys(BUCKETS, 0.0)
        with self._held_lock:  # one consistent view of the timed calls (the training thread ends them)
            if self._bwd is not None:
                busy = self._busy_seconds()
                if busy is not None:
                    self._bwd_idle(now, busy)
            held, self._held = self._held, dict.fromkeys(HELD, 0.0)
            in_call, held_total = self._held_since, self._held_total
            if in_call is not None:
                held[in_call[0]] += max(0.0, now - max(in_call[1], self._window_start))
            evaluating = self._eval_since
            if evaluating is not None:
                held["eval"] += max(0.0, now - max(evaluating, self._window_start))
            self._window_start = now
        total = self._compile_seconds()
        comp = 0.0
        if total is not None:
            comp = max(0.0, total - self._compile_total)
            self._compile_total = total
        input_wait = min(max(input_wait, 0.0), window)
        ckpt = min(max(held["checkpoint"], 0.0), window - input_wait)
        coll = min(max(held["collective"], 0.0), window - input_wait - ckpt)
        timed = ckpt + coll
        before_first_step = coll if not steps else 0.0  # a barrier then waits for the other ranks to start
        coll -= before_first_step
        # a compile reported now ran over the windows still pending too (no step came meanwhile)
        from_pending = min(comp, self._pending)
        self._pending -= from_pending
        comp = from_pending + min(comp - from_pending, window - input_wait - timed)
        # an evaluation's first call compiles its graph: that part is compile time
        ev = min(max(held["eval"], 0.0), window - input_wait - timed - (comp - from_pending))
        timed += ev
        rest = window - input_wait - timed - (comp - from_pending)
        out["input"], out["checkpoint"], out["collective"], out["compile"] = input_wait, ckpt, coll, comp
        out["eval"] = ev
        out["startup"] = before_first_step
        # the usual gap is net of timed calls, so the time since the last step is too: a job that waits in
        # a collective every step is not overdue for it
        since_net = since_step
        last = self._last_step_at
        if since_step is not None and last is not None:
            held_since_step = held_total - last[1]
            if in_call is not None:
                held_since_step += max(0.0, now - max(in_call[1], last[0]))
            if evaluating is not None:
                held_since_step += max(0.0, now - max(evaluating, last[0]))
            since_net = max(0.0, since_step - held_since_step)
        overdue = since_net is not None and since_net > max(OVERDUE_MIN_S, OVERDUE_FACTOR * self.usual_gap())
        stepped = steps > self._steps_seen
        self._steps_seen = steps
        if steps and not overdue and not stepped:
            self._pending += rest  # a step in progress, or the start of a pause: the next window tells
        else:
            bucket = "train" if steps and not overdue else self._overdue_bucket(now, window, steps, since_step,
                                                                                 stall_after)
            out[bucket] += rest + self._pending
            self._pending = 0.0
        for k, v in out.items():
            self.totals[k] += v
        if not stepped:
            self.arm("eval")  # the next forward on the training thread says whether it is evaluation
        elif now - self._precision_at >= PRECISION_EVERY_S:
            self._precision_at = now
            self.arm("precision")
        return out

    def _overdue_bucket(self, now: float, window: float, steps: int, since_step: float | None,
                        stall_after: float) -> str:
        ident = self.train_thread or threading.main_thread().ident
        frame = sys._current_frames().get(ident) if ident is not None else None
        kind = stack_kind(frame)
        if kind is not None:
            return "startup" if kind in ("collective", "train") and not steps else kind
        fwd = self._forward
        if fwd is not None and now - fwd[0] <= window + 0.05:
            return "eval" if not fwd[1] else "train"
        if not steps:
            return "startup"
        if since_step is not None and since_step >= stall_after:
            return "stalled"
        # a thread waiting for its next batch is no pause: its stack would only show the loader's wait
        if frame is not None and not self.closing and not _in_loader(frame):
            self.pause_stack = stack_text(frame, 12)[-4096:]
        return "other"
