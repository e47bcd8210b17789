"""traintop's in-process probe agent: what only the training process itself knows.

Standalone on purpose (stdlib and torch only, no other traintop module), so that
``traintop run`` can copy it into a training job running in any Python environment.
``import traintop.probe`` starts it; importing this module does not. A daemon thread publishes, a few times a
second, one JSON line per message to every connected traintop:

- ``torch.cuda.memory_stats()`` figures for the devices this process uses (host-side
  counters of the caching allocator: no device synchronisation);
- optimizer steps and their durations (a global optimizer step hook), and the steps a
  GradScaler skipped for inf or NaN gradients (fp16 overflow: no optimizer step happens then);
- the time spent waiting inside the DataLoader iterator's ``__next__`` (the input wait);
- every thread's Python stack (``sys._current_frames``), when a reader asks (it writes
  ``stacks`` on the socket) and on its own once the job has stopped stepping
  (no optimizer step for max(30 s, 3x the usual step time)).

It never blocks or raises into the job: sends are non-blocking and a slow reader just
misses messages; every hook is wrapped. It listens on a Unix socket
``probe-<pid>.sock`` in a per-user directory (mode 0700, socket 0600) and serves only
peers of the same uid (or root).
"""

from __future__ import annotations

import atexit
import collections
import fcntl
import json
import os
import select
import socket
import struct
import sys
import termios
import threading
import time

try:  # copied next to the job by `traintop run`, or imported from the package
    from _traintop_probe_capture import Capturer, dir_problem  # type: ignore[import-not-found]
    from _traintop_probe_goodput import Goodput, stack_text  # type: ignore[import-not-found]
except ImportError:
    from traintop.injob.capture import Capturer, dir_problem
    from traintop.injob.goodput import Goodput, stack_text

PROTOCOL = 1
DEFAULT_INTERVAL = 0.33
MAX_CLIENTS = 8
STALL_MIN_S = 30.0  # no step for this long (or 3x the usual step time, if longer) is a stall
STALL_REPEAT_S = 60.0  # while stalled, the stacks again this often
PAUSE_STACK_EVERY_S = 30.0  # the training thread's stack in a pause, at most this often
MAX_STACK_BYTES = 64 * 1024
_SO_PEERCRED = getattr(socket, "SO_PEERCRED", 17)


def probe_dir() -> str:
    base = os.environ.get("TRAINTOP_PROBE_DIR")
    if base:
        return base
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "traintop")
    return os.path.join("/tmp", f"traintop-{os.getuid()}")


def private_dir_problem(path: str, owner: int | None = None) -> str | None:
    """Why ``path`` is not a private directory of ours (None when it is): probe_capture.dir_problem."""
    return dir_problem(path, owner)


def ensure_private_dir(path: str) -> str:
    """Create ``path`` 0700, or check that an existing one is ours and private."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    problem = private_dir_problem(path)
    if problem:
        raise PermissionError(problem)
    return path


def peer_uid(sock: socket.socket) -> int | None:
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, _SO_PEERCRED, struct.calcsize("3i"))
        return struct.unpack("3i", creds)[1]
    except OSError:
        return None


def peer_pid(sock: socket.socket) -> int | None:
    """The process behind the socket as the kernel saw it (not the PID in the socket's name)."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, _SO_PEERCRED, struct.calcsize("3i"))
        return struct.unpack("3i", creds)[0] or None
    except OSError:
        return None


def socket_path(pid: int | None = None, directory: str | None = None) -> str:
    return os.path.join(directory or probe_dir(), f"probe-{pid or os.getpid()}.sock")


def _dist_backend() -> str | None:
    """The default process group's backend ("nccl", "gloo", ...) once the job has made one."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        return str(dist.get_backend())[:32]
    except Exception:
        return None


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _job_id() -> str | None:
    """The scheduler's id for this job, as the job sees it (an agent beside it labels the rank with it).
    torchrun without --rdzv-id says "none" for every job: then the rendezvous endpoint, which two jobs
    running at once cannot share."""
    for name in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        v = os.environ.get(name)
        if v and v != "none":
            return v[:64]
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    return f"{addr}:{port}"[:64] if addr and port else None


class Probe:
    def __init__(self, interval: float = DEFAULT_INTERVAL) -> None:
        self.interval = interval
        self.pid = os.getpid()
        self.path: str | None = None
        self._server: socket.socket | None = None
        self._clients: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._steps = 0
        self._skipped = 0  # steps a GradScaler skipped (counted in _steps too: the loop went round)
        self._scaler_seen = False  # a GradScaler has stepped: its skipped count is sent, 0 included
        self._fused_pending: collections.deque = collections.deque()  # (CUDA event, host found_inf)
        self._step_times: list[float] = []
        self._last_step: float | None = None
        self._input_wait = 0.0
        self._waiting_since: float | None = None  # inside DataLoader.__next__ since then
        self._loader_seen = False  # a DataLoader iterator has handed out a batch: its input wait means something
        self._hooks_installed = False
        self._undo: list = []
        self._window_start = time.perf_counter()
        self._recent_steps: list[float] = []  # the last step durations, for the usual step time
        self._want_stacks: str | None = None  # why the next message carries the stacks
        self._stall_stacks_at: float | None = None  # when the stacks last went out for a stall
        self.goodput = Goodput()
        self.capture: Capturer | None = None  # made at the first request (a directory of its own)
        self._capture_asked: list[str] = []  # kinds a reader asked for, not yet handed to the capturer
        self._capture_refused: list[dict] = []
        self.goodput.busy = lambda: self.capture is not None and self.capture.busy
        self._pause_stack_at = -1e9  # when a pause's stack last went out
        self.drops = 0
        self.evicted = 0  # readers dropped to make room for a new one
        self.errors = 0
        self.sent = 0

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> bool:
        if self._thread is not None:
            return True
        try:
            directory = ensure_private_dir(probe_dir())
        except OSError as e:
            print(f"traintop probe: not started ({e}; to fix: remove it, or set XDG_RUNTIME_DIR or "
                  "TRAINTOP_PROBE_DIR to a directory of yours with mode 0700)", file=sys.stderr)
            return False
        try:
            self.path = socket_path(self.pid, directory)
            if os.path.exists(self.path):
                os.unlink(self.path)  # a stale socket of an earlier process with this PID
            srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old_umask = os.umask(0o177)
            try:
                srv.bind(self.path)
            finally:
                os.umask(old_umask)
            os.chmod(self.path, 0o600)
            srv.listen(MAX_CLIENTS)
            srv.setblocking(False)
            self._server = srv
        except OSError as e:
            print(f"traintop probe: not started ({e})", file=sys.stderr)
            return False
        self._thread = threading.Thread(target=self._run, name="traintop-probe", daemon=True)
        self._thread.start()
        atexit.register(self.stop)
        return True

    def stop(self) -> None:
        self.goodput.closing = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
        for undo in reversed(self._undo):  # leave the job as it was
            try:
                undo()
            except Exception:
                pass
        self._undo = []
        self.goodput.uninstall()
        if self.capture is not None:
            self.capture.close()
        for c in self._clients:
            c.close()
        self._clients = []
        if self._server is not None:
            self._server.close()
            self._server = None
        if self.path and os.getpid() == self.pid:  # a forked child must not remove the parent's socket
            try:
                os.unlink(self.path)
            except OSError:
                pass

    def _after_fork_in_child(self) -> None:
        # DataLoader workers are forks: they inherit the socket but must not serve it.
        self._server = None
        self._clients = []
        self._thread = None
        self._stop.set()

    # -- hooks (run on the training thread: keep them tiny) ------------------
    def _on_step(self, *args, **kwargs) -> None:
        try:
            now = time.perf_counter()
            with self._lock:
                if self._last_step is not None:
                    self._step_times.append(now - self._last_step)
                    if len(self._step_times) > 10_000:
                        del self._step_times[:5_000]
                    self._recent_steps.append(now - self._last_step)
                    if len(self._recent_steps) > 64:
                        del self._recent_steps[:32]
                self._last_step = now
                self._steps += 1
            self.goodput.on_step(self._steps, args[0] if args else None)
            capture = self.capture
            if capture is not None:
                capture.on_step()
        except Exception:
            self.errors += 1

    def _install_hooks(self) -> None:
        # Read the submodules from sys.modules: torch does not always expose them as attributes.
        optimizer = getattr(sys.modules.get("torch.optim.optimizer"), "register_optimizer_step_post_hook", None)
        dl = sys.modules.get("torch.utils.data.dataloader")
        base = getattr(dl, "_BaseDataLoaderIter", None) if dl else None
        if optimizer is None or base is None:
            return  # torch is still importing: try again next tick
        handle = optimizer(self._on_step)
        if handle is not None and hasattr(handle, "remove"):
            self._undo.append(handle.remove)
        original = base.__next__
        probe = self

        def __next__(it):
            t = time.perf_counter()
            probe._waiting_since = t
            probe._loader_seen = True
            try:
                return original(it)
            finally:
                # Only the part of this wait inside the current window: message() has already
                # counted what fell in earlier windows (a 1.5 s wait spans several). An evaluation's
                # input wait is the evaluation's.
                if not probe.goodput.in_eval():
                    probe._input_wait += time.perf_counter() - max(t, probe._window_start)
                probe._waiting_since = None

        __next__.__traintop_probe__ = True  # type: ignore[attr-defined]  # a mark a second install sees
        if not getattr(original, "__traintop_probe__", False):
            base.__next__ = __next__
            self._undo.append(lambda: setattr(base, "__next__", original))
        self._install_scaler_hook()
        self._hooks_installed = True

    def _install_scaler_hook(self) -> None:
        """A GradScaler that finds inf or NaN gradients skips the optimizer step, so the step hook never
        fires and an fp16 job that overflows every step would look stalled. Two paths, read from the
        scaler's own decision (its ``found_inf`` per device), never inferred from a hook not firing:
        - an optimizer without fused loss scaling goes through ``_maybe_opt_step``, which has just
          synchronised on ``found_inf``: read there, and a skipped step counts as a step of the loop;
        - a fused optimizer (``_step_supports_amp_scaling``: ``fused=True`` AdamW, Trainer's default)
          skips inside its kernel and its step hook fires: its ``found_inf`` is copied to the host
          without blocking the training thread and read by the publishing thread once the GPU is done."""
        scaler = getattr(sys.modules.get("torch.amp.grad_scaler"), "GradScaler", None)
        maybe_step = getattr(scaler, "_maybe_opt_step", None)
        scaler_step = getattr(scaler, "step", None)
        if maybe_step is None or scaler_step is None or getattr(maybe_step, "__traintop_probe__", False):
            return
        probe = self

        def _maybe_opt_step(grad_scaler, optimizer, optimizer_state, *args, **kwargs):
            before = probe._steps
            out = maybe_step(grad_scaler, optimizer, optimizer_state, *args, **kwargs)
            try:
                skipped = bool(sum(v.item() for v in optimizer_state["found_inf_per_device"].values()))
            except Exception:
                return out
            if skipped:
                with probe._lock:
                    probe._skipped += 1
            if probe._steps == before:  # skipped, or an optimizer whose step runs no hooks
                probe._on_step(optimizer)
            return out

        def step(grad_scaler, optimizer, *args, **kwargs):
            out = scaler_step(grad_scaler, optimizer, *args, **kwargs)
            probe._scaler_seen = True
            if getattr(optimizer, "_step_supports_amp_scaling", False) and getattr(grad_scaler, "_enabled", False):
                probe._note_fused_found_inf(grad_scaler, optimizer)
            return out

        for name, wrapper in (("_maybe_opt_step", _maybe_opt_step), ("step", step)):
            original = getattr(scaler, name)
            wrapper.__traintop_probe__ = True  # type: ignore[attr-defined]
            setattr(scaler, name, wrapper)
            self._undo.append(lambda name=name, original=original: setattr(scaler, name, original))

    def _note_fused_found_inf(self, grad_scaler, optimizer) -> None:
        """Queue a fused optimizer's found_inf for the publishing thread: summed on its device and
        copied to pinned host memory behind a CUDA event (the training thread never waits)."""
        try:
            torch = sys.modules["torch"]
            found = list(grad_scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"].values())
            if not found or len(self._fused_pending) >= 1024:
                return
            total = sum(t.float().sum() for t in found)
            if total.device.type != "cuda":
                with self._lock:
                    self._skipped += int(bool(total.item()))
                return
            host = torch.empty((), dtype=torch.float32, pin_memory=True)
            host.copy_(total, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            self._fused_pending.append((done, host))
        except Exception:
            return

    def _read_fused_found_inf(self) -> None:
        """The fused optimizers' decisions the GPU has made by now (publishing thread)."""
        pending = self._fused_pending
        while pending:
            done, host = pending[0]
            try:
                if not done.query():
                    return
                skipped = bool(host.item())
            except Exception:
                skipped = False
            pending.popleft()
            if skipped:
                with self._lock:
                    self._skipped += 1

    # -- publishing --------------------------------------------------------------
    def _memory(self) -> list[dict]:
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None) if torch else None
        if cuda is None or not cuda.is_initialized():
            return []  # never initialise CUDA ourselves: a CPU job must stay CPU-only
        out = []
        for d in range(cuda.device_count()):
            s = cuda.memory_stats(d)
            reserved = s.get("reserved_bytes.all.current", 0)
            if not reserved and d != cuda.current_device():
                continue
            out.append({
                "device": d,
                "allocated": s.get("allocated_bytes.all.current"),
                "reserved": reserved,
                "peak": s.get("allocated_bytes.all.peak"),
                "active": s.get("active_bytes.all.current"),
                "inactive_split": s.get("inactive_split_bytes.all.current"),
                "alloc_retries": s.get("num_alloc_retries"),
                "ooms": s.get("num_ooms"),
            })
        return out

    def stall_after(self) -> float:
        """Seconds without a step that count as stalled: max(30 s, 3x the usual step time)."""
        recent = sorted(self._recent_steps)
        usual = recent[len(recent) // 2] if recent else 0.0
        return max(STALL_MIN_S, 3.0 * usual)

    def _check_stall(self, now: float) -> None:
        last = self._last_step
        if last is None or now - last < self.stall_after():
            return
        sent = self._stall_stacks_at
        if sent is None or sent < last or now - sent >= STALL_REPEAT_S:
            self._want_stacks = "stalled"
            self._stall_stacks_at = now

    def message(self) -> bytes:
        now = time.perf_counter()
        self._read_fused_found_inf()
        with self._lock:
            step_times, self._step_times = self._step_times, []
            steps = self._steps
            skipped = self._skipped
            last_step = self._last_step
        wait, self._input_wait = self._input_wait, 0.0
        since = self._waiting_since
        if since is not None and not self.goodput.in_eval():  # a wait in progress counts up to now
            wait += now - max(since, self._window_start)
        window = now - self._window_start
        self._window_start = now
        since_step = None if last_step is None else now - last_step
        recent = sorted(self._recent_steps)
        usual = recent[len(recent) // 2] if recent else None
        ledger = self.goodput.window(now, window, wait, steps, since_step, self.stall_after())
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None) if torch else None
        msg = {
            "v": PROTOCOL, "pid": self.pid, "ppid": os.getppid(), "t": time.time(), "window": window,
            "rank": _env_int("RANK"), "local_rank": _env_int("LOCAL_RANK"), "world_size": _env_int("WORLD_SIZE"),
            "job": _job_id(), "backend": _dist_backend(),
            "cuda": bool(cuda is not None and cuda.is_initialized()),
            "memory": self._memory(), "steps": steps, "step_times": step_times,
            "input_wait": wait, "hooks": self._hooks_installed, "drops": self.drops,
            "torch": torch is not None, "loader": self._loader_seen,
            "since_step": since_step,
            "ledger": {k: round(v, 4) for k, v in ledger.items() if v},
        }
        goodput = self.goodput
        if self._scaler_seen or skipped:
            msg["skipped"] = min(skipped, steps)
        if goodput.precision is not None:
            msg["precision"] = goodput.precision
        if goodput.flops is not None:
            msg["flops"] = dict(goodput.flops, usual_s=usual)
        if self.capture is not None and self._clients:  # with no reader a record would be lost: it waits
            done = self.capture.poll()
            if done:
                msg["captures"] = done
        if self._capture_refused:
            msg["capture_refused"], self._capture_refused = self._capture_refused[:8], []
        if goodput.pause_stack is not None:
            if now - self._pause_stack_at >= PAUSE_STACK_EVERY_S:
                msg["pause_stack"] = goodput.pause_stack
                self._pause_stack_at = now
            goodput.pause_stack = None
        self._check_stall(now)
        if self._want_stacks:
            msg["stacks"] = thread_stacks()
            msg["stacks_reason"] = self._want_stacks
            self._want_stacks = None
        return (json.dumps(msg, separators=(",", ":")) + "\n").encode()

    def _accept(self) -> None:
        srv = self._server
        if srv is None:  # stopped (stop() gives up waiting for this thread after a second)
            return
        while True:
            try:
                conn, _ = srv.accept()
            except (BlockingIOError, InterruptedError):
                return
            uid = peer_uid(conn)
            if uid not in (os.getuid(), 0) or (len(self._clients) >= MAX_CLIENTS and not self._make_room()):
                conn.close()
                continue
            conn.setblocking(False)
            self._clients.append(conn)

    def _make_room(self) -> bool:
        """Every slot taken: drop the reader with the most unread data (one that stopped reading,
        or the slowest), so idle connections cannot lock traintop out. False: all keep up."""
        def unread(c: socket.socket) -> int:
            try:
                return struct.unpack("i", fcntl.ioctl(c.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
            except (OSError, struct.error):
                return -1  # unknown here: the oldest reader goes
        backlog = [unread(c) for c in self._clients]
        worst = max(range(len(backlog)), key=lambda k: (backlog[k], -k))
        if backlog[worst] == 0:
            return False
        victim = self._clients.pop(worst)
        victim.close()
        self.evicted += 1
        return True

    def _read_request(self, c: socket.socket) -> None:
        """A reader may ask for the stacks (``stacks``); anything else is ignored."""
        try:
            data = c.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the reader went away
            if c in self._clients:
                self._clients.remove(c)
            c.close()
            return
        if b"stacks" in data:
            self._want_stacks = "requested"
        for kind in ("trace", "memory"):
            if b"capture " + kind.encode() in data and kind not in self._capture_asked:
                self._capture_asked.append(kind)

    def _captures(self) -> None:
        """Hand what readers asked for to the capturer (refusals go out with the next message)."""
        while self._capture_asked:
            kind = self._capture_asked.pop(0)
            if self.capture is None:
                self.capture = Capturer(os.path.join(os.path.dirname(self.path or socket_path()), "captures"))
                self.capture.held = self.goodput.held_seconds
            # the step gaps net of checkpoints and collective waits, where the ledger has them
            recent = self.goodput.recent_gaps() or self._recent_steps
            why = self.capture.request(kind, recent_steps=list(recent))
            if why is not None:
                self._capture_refused.append({"kind": kind, "why": why})

    def _publish(self, data: bytes) -> None:
        for c in list(self._clients):
            try:
                n = c.send(data)
                if n < len(data):  # a partial line would corrupt the stream: drop this reader
                    raise BlockingIOError
                self.sent += 1
            except BlockingIOError:
                self.drops += 1
                # A reader that cannot keep up loses this message, never stalls the job; one
                # whose buffer stays full is dropped and can reconnect.
                self._clients.remove(c)
                c.close()
            except OSError:
                self._clients.remove(c)
                c.close()

    def _run(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                if not self._hooks_installed:
                    self._install_hooks()
                self.goodput.install()
                timeout = max(0.0, next_t - time.monotonic())
                srv = self._server
                if srv is None:
                    return
                readable, _, _ = select.select([srv, *self._clients], [], [], timeout)
                if srv in readable:
                    self._accept()
                for c in readable:
                    if c is not srv:
                        self._read_request(c)
                if self._capture_asked:
                    self._captures()
                if time.monotonic() >= next_t:
                    next_t += self.interval
                    if time.monotonic() > next_t:
                        next_t = time.monotonic() + self.interval
                    data = self.message()
                    if self._clients:
                        self._publish(data)
            except Exception:
                self.errors += 1
                self._stop.wait(self.interval)


def thread_stacks(limit: int = 40) -> list[dict]:
    """Every thread's Python stack, the main thread first, the probe's own left out."""
    threads = {t.ident: t for t in threading.enumerate()}
    out, size = [], 0
    for ident, frame in sys._current_frames().items():
        t = threads.get(ident)
        if t is not None and t.name == "traintop-probe":
            continue
        text = stack_text(frame, limit)
        if size + len(text) > MAX_STACK_BYTES:
            room = max(0, MAX_STACK_BYTES - size)
            text = text[len(text) - room:]  # its innermost frames (text[-0:] would be all of it)
        size += len(text)
        out.append({"thread": t.name if t is not None else f"thread {ident}",
                    "main": t is threading.main_thread(), "stack": text})
    out.sort(key=lambda d: not d["main"])
    return out


_probe: Probe | None = None


_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")
_LAUNCHER_SCRIPTS = ("torchrun",)
# Python processes a job starts that train nothing: torch.compile's compile workers (inductor starts
# them as `python .../torch/_inductor/compile_worker/__main__.py`)
_HELPER_MODULES = ("torch._inductor.compile_worker",)
_HELPER_SCRIPTS = ("/torch/_inductor/compile_worker/__main__.py",)


def is_helper(argv: list[str] | None = None) -> bool:
    """Whether this process is one the job starts to help it, never a rank (no probe there)."""
    argv = list(getattr(sys, "orig_argv", None) or sys.argv) if argv is None else argv
    script = _script(argv)
    return script is not None and (script in _HELPER_MODULES or script.replace(os.sep, "/").endswith(_HELPER_SCRIPTS))


def _script(argv: list[str]) -> str | None:
    """The module (``-m NAME``) or script path a Python command line runs; None for ``-c`` or stdin."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            return argv[i + 1] if i + 1 < len(argv) else None
        if arg.startswith("-m"):
            return arg[2:]
        if arg.startswith("-c") or arg == "-":
            return None
        if arg in ("-W", "-X"):  # options that take the next word as their value
            i += 2
            continue
        if not arg.startswith("-"):
            return arg
        i += 1
    return None


def is_launcher(argv: list[str] | None = None) -> bool:
    """Whether this process is torchrun's launcher (the elastic agent), not a rank.

    The launcher imports the injected sitecustomize too; it trains nothing, and counted as a
    rank it reads as one that never steps (a false stall). ``sys.orig_argv`` is read because
    ``sys.argv[0]`` is still ``-m`` while ``python -m`` locates the module."""
    argv = list(getattr(sys, "orig_argv", None) or sys.argv) if argv is None else argv
    script = _script(argv)
    return script is not None and (script in _LAUNCHER_MODULES or os.path.basename(script) in _LAUNCHER_SCRIPTS)


def start(interval: float | None = None) -> Probe | None:
    """Start the probe once per process; returns it (None if it could not start, or in torchrun's launcher)."""
    global _probe
    if is_launcher() or is_helper():
        return None
    if _probe is not None and _probe.pid == os.getpid() and _probe._thread is not None:
        return _probe
    env = os.environ.get("TRAINTOP_PROBE_INTERVAL")
    try:
        iv = interval or (float(env) if env else DEFAULT_INTERVAL)
    except ValueError:
        iv = DEFAULT_INTERVAL
    p = Probe(min(max(iv, 0.05), 5.0))
    if p.start():
        _probe = p
        os.register_at_fork(after_in_child=p._after_fork_in_child)
        return p
    return None

