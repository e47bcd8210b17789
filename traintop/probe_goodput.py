"""Where a training process's wall time goes, its matmul precision and the FLOPs of one step.

Part of the probe (see probe_agent): standalone on purpose (stdlib and torch only), copied
next to the job by ``traintop run``. The probe thread calls ``Goodput.window`` once per message;
the training thread only passes through the tiny hooks installed here.

The ledger splits each message window's wall time into buckets that add up to it:

- ``input``: inside ``DataLoader.__next__`` (measured by the probe itself);
- ``collective``: inside a blocking ``torch.distributed`` call on the training thread (a barrier,
  an object collective, any collective on gloo): the wait for the other ranks and the transfer
  (measured), or its stack in c10d while the step is overdue (sampled). NCCL collectives on
  tensors return at once and wait on the GPU: those waits are not here (the straggler finding
  measures them from the GPUs);
- ``checkpoint``: inside ``torch.save``/``torch.load`` or ``torch.distributed.checkpoint``'s
  save/load on the training thread (measured), or the training thread's stack in
  serialization code while its step is overdue (sampled);
- ``compile``: torch.compile's own compile time (dynamo's counter), or its stack in dynamo or
  inductor while the step is overdue;
- ``eval``: the step is overdue and a forward pass ran with grad disabled on the training
  thread (a one-shot forward hook, armed only then: grad mode is thread-local);
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

_CHECKPOINT_FILES = ("/torch/serialization.py", "/torch/distributed/checkpoint/", "/safetensors/",
                     "/pickle.py", "/torch/storage.py")
# The blocking calls of torch.distributed a training loop makes itself (DDP's gradient all-reduce
# runs inside backward, in C++: not these).
_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
                "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "barrier", "monitored_barrier",
                "reduce", "gather", "gather_object", "scatter", "scatter_object_list", "all_to_all",
                "all_to_all_single")
_COLLECTIVE_FILES = ("/torch/distributed/distributed_c10d.py", "/torch/distributed/c10d_logger.py")
# Where torch.compile compiles (every frame dynamo takes passes through convert_frame); not all of
# torch/_dynamo: its eval_frame wrappers sit on every optimizer step's stack.
_COMPILE_FILES = ("/torch/_dynamo/convert_frame.py", "/torch/_inductor/compile_fx.py",
                  "/torch/_inductor/async_compile.py", "/torch/_functorch/_aot_autograd/", "/triton/compiler/")


def stack_kind(frame, depth: int = 80) -> str | None:
    """'checkpoint' or 'compile' where a function on the stack is in such code, else 'collective'
    where one is in torch.distributed's collectives (a checkpoint's own collectives are the
    checkpoint's), else None.

    Module-level code does not count: importing torch's compiler or serializer is neither
    (``torch.compile()`` itself, which imports the compiler, is compile time)."""
    collective = False
    while frame is not None and depth > 0:
        code = frame.f_code
        name = code.co_filename
        if code.co_name != "<module>" and not name.startswith("<frozen"):
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
        # seconds inside timed calls (checkpoint, collective) in the current window
        self._held = {"checkpoint": 0.0, "collective": 0.0}
        self._held_total = 0.0  # all timed seconds so far (for step gaps net of them)
        self._gaps: list[float] = []  # the last step gaps, less the timed calls inside them
        self._last_step_at: tuple[float, float] | None = None  # (when, _held_total then)
        self._held_since: tuple[str, float] | None = None  # (bucket, start) of the timed call in progress
        # the three fields above change together on the training thread and are read together on the
        # probe's (uncontended: the calls it guards block for far longer)
        self._held_lock = threading.Lock()
        self._window_start = clock()
        # dynamo's cumulative compile seconds at the last window: 0 before torch.compile is imported (a
        # first compile can finish inside the window that first sees the counter)
        self._compile_total = 0.0
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

    # -- hooks (training thread) ------------------------------------------------
    def on_step(self, steps: int) -> None:
        """From the probe's optimizer step hook: remember the training thread and the step's gap; count FLOPs."""
        self.train_thread = threading.get_ident()
        now = self.clock()
        last = self._last_step_at
        if last is not None:
            self._gaps.append(max(0.0, now - last[0] - (self._held_total - last[1])))
            if len(self._gaps) > GAPS_KEPT:
                del self._gaps[0]
        self._last_step_at = (now, self._held_total)
        if self.flops_disabled:
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
            self.flops = {"flops": int(mode.get_total_flops()), "step_s": took, "t": time.time(), "step": steps}
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
            tls.depth = 1
            with goodput._held_lock:
                t = goodput.clock()
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

        timed.__traintop_probe__ = True  # type: ignore[attr-defined]
        return timed

    def _on_training_thread(self) -> bool:
        me = threading.get_ident()
        return me == self.train_thread if self.train_thread is not None else me == threading.main_thread().ident

    def install(self) -> None:
        """Wrap the checkpoint and collective calls of the torch modules imported so far (called each tick)."""
        # fsync on the training thread is a checkpoint's too (torch.save returns before the data is on disk)
        targets = (("os", ("fsync",), "checkpoint"), ("torch", ("save", "load"), "checkpoint"),
                   ("torch.distributed.checkpoint", ("save", "load", "async_save", "save_state_dict",
                                                     "load_state_dict"), "checkpoint"),
                   ("torch.distributed", _COLLECTIVES, "collective"))
        for modname, names, bucket in targets:
            if modname in self._patched:
                continue
            mod = sys.modules.get(modname)
            # a module still being imported (in sys.modules, its names not yet defined): the next tick
            if mod is None or getattr(getattr(mod, "__spec__", None), "_initializing", False) \
                    or (modname == "torch" and not hasattr(mod, "save")):
                continue
            for name in names:
                original = getattr(mod, name, None)
                if original is None or getattr(original, "__traintop_probe__", False):
                    continue
                if not callable(original):
                    continue
                setattr(mod, name, self.wrap_timed(original, bucket))
                self._undo.append(functools.partial(setattr, mod, name, original))
            self._patched.add(modname)

    def uninstall(self) -> None:
        self.disarm()
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception:
                pass
        self._undo = []

    def _on_forward(self, module, args) -> None:
        try:
            if not self._on_training_thread():
                return  # another thread's forward: leave the hook for the training thread's
            self.disarm()
            torch = sys.modules["torch"]
            grad = torch.is_grad_enabled()
            self._forward = (self.clock(), grad)
            if self._armed_for == "precision" or self.precision is None:
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
        if self._armed is not None or self.compiled():
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
        if not isinstance(spent, dict):
            return None
        return sum(v for k, v in list(spent.items()) if k in ("entire_frame_compile", "entire_backward_compile")) / 1e9

    def held_seconds(self) -> float:
        """Seconds the training thread has spent in timed calls (checkpoints, collectives) so far."""
        with self._held_lock:
            held = self._held_total
            since = self._held_since
            return held + (self.clock() - since[1]) if since is not None else held

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
            held, self._held = self._held, {"checkpoint": 0.0, "collective": 0.0}
            in_call, held_total = self._held_since, self._held_total
            if in_call is not None:
                held[in_call[0]] += max(0.0, now - max(in_call[1], self._window_start))
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
        rest = window - input_wait - timed - (comp - from_pending)
        out["input"], out["checkpoint"], out["collective"], out["compile"] = input_wait, ckpt, coll, comp
        out["startup"] = before_first_step
        # the usual gap is net of timed calls, so the time since the last step is too: a job that waits in
        # a collective every step is not overdue for it
        since_net = since_step
        last = self._last_step_at
        if since_step is not None and last is not None:
            held_since_step = held_total - last[1]
            if in_call is not None:
                held_since_step += max(0.0, now - max(in_call[1], last[0]))
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
        frame = sys._current_frames().get(self.train_thread or threading.main_thread().ident)
        kind = stack_kind(frame)
        if kind is not None:
            return "startup" if kind == "collective" and not steps else kind
        fwd = self._forward
        if fwd is not None and now - fwd[0] <= window + 0.05:
            return "eval" if not fwd[1] else "train"
        if not steps:
            return "startup"
        if since_step is not None and since_step >= stall_after:
            return "stalled"
        if frame is not None and not self.closing:
            self.pause_stack = stack_text(frame, 12)[-4096:]
        return "other"
