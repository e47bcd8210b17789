"""Assembles one Frame per tick from the live collectors.

The GPU read runs on a helper thread with a time limit: a driver call that hangs makes
the tick report those GPUs as stale (fields None) instead of stopping the sampler, and
no second call is started until the hung one returns. A collector that raises costs only
its own fields: the failure is counted (``failures``) and its reason kept (``failing``, one
line per collector, until it answers again) for the dashboard to show.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from traintop.samples import Frame, GpuSample
from traintop.text import one_line


class CallTimeout(Exception):
    """The call has not returned within its time limit (it goes on; its result comes later)."""


class OneCall:
    """Runs one call at a time on its own daemon thread, waited for with a time limit.

    A daemon, not a pool's worker: a driver call that never returns must not hold the
    program at its exit (a pool joins its workers then), and no pool machinery is loaded.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._go = threading.Event()
        self._done = threading.Event()
        self._fn: Callable[[], object] | None = None
        self._outcome: tuple[object, BaseException | None] = (None, None)
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, fn) -> None:
        """Starts ``fn`` on the thread; the caller submits again only after its result came."""
        if self._closed:
            raise RuntimeError(f"{self._name}: closed")
        self._fn = fn
        self._done.clear()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._go.set()

    def result(self, timeout: float):
        """The call's return value (or its exception, raised); CallTimeout while it runs on."""
        if not self._done.wait(timeout):
            raise CallTimeout(self._name)
        value, error = self._outcome
        if error is not None:
            raise error
        return value

    def close(self) -> None:
        """Ends the thread once its call (if one runs) returns; no call is started after."""
        self._closed = True
        self._go.set()

    def _run(self) -> None:
        while True:
            self._go.wait()
            self._go.clear()
            if self._closed:
                return
            fn = self._fn
            assert fn is not None  # only submit (which sets it) and close wake the thread
            try:
                self._outcome = (fn(), None)
            except BaseException as e:  # handed to the caller, who counts it
                self._outcome = (None, e)
            self._done.set()


class LiveSampler:
    def __init__(self, gpu=None, host=None, process=None, probes=None, clock=time.time,
                 gpu_timeout: float = 1.0, owners=None) -> None:
        """``owners``: fills in whose each GPU process is (collectors/owner_cache.OwnerCache); None: nobody's."""
        self.gpu = gpu
        self.owners = owners
        if gpu is not None and owners is not None:
            gpu.owner_of = owners.known  # owners already known come with the GPU read: nothing to copy
        self.host = host
        self.process = process
        self.probes = probes
        self._clock = clock
        self.gpu_timeout = gpu_timeout
        self._worker = OneCall("traintop-nvml") if gpu is not None else None
        self._pending = False
        self.stale_since: float | None = None
        self.timeouts = 0
        self.failures: dict[str, int] = {}  # collector -> exceptions so far
        self.failing: dict[str, str] = {}  # collector -> its last error, while it keeps failing

    def _failed(self, name: str, e: Exception) -> None:
        self.failures[name] = self.failures.get(name, 0) + 1
        self.failing[name] = one_line(f"{type(e).__name__}: {e}", 120)

    def _call(self, name: str, fn, *args, fallback=None):
        try:
            out = fn(*args)
        except Exception as e:  # a collector bug must not stop sampling; its fields read as None
            self._failed(name, e)
            return fallback
        self.failing.pop(name, None)
        return out

    def _gpus(self) -> tuple[tuple[GpuSample, ...], tuple[int, ...]]:
        if self.gpu is None or self._worker is None:
            return (), ()
        if not self._pending:
            self._worker.submit(self.gpu.sample)
            self._pending = True
        try:
            gpus = self._worker.result(timeout=self.gpu_timeout)
        except CallTimeout:
            self.timeouts += 1
            self.stale_since = self.stale_since or self._clock()
            indices = tuple(i.index for i in self.gpu.infos)
            return tuple(GpuSample(index=i) for i in indices), indices
        except Exception as e:  # a collector bug must not stop sampling; the fields read as None
            self._pending = False
            self._failed("GPU", e)
            indices = tuple(i.index for i in self.gpu.infos)
            return tuple(GpuSample(index=i) for i in indices), indices
        self._pending = False
        self.stale_since = None
        self.failing.pop("GPU", None)
        return gpus, ()

    def next_frame(self) -> Frame:
        t = self._clock()
        gpus, stale = self._gpus()
        if self.owners is not None and not stale:
            gpus = self._call("owners", self.owners.attach, gpus, fallback=gpus)
        host = self._call("host", self.host.sample) if self.host is not None else None
        proc = self._call("process", self.process.sample) if self.process is not None else None
        ranks, stacks, captures = (), (), ()
        if self.probes is not None and proc is not None and proc.alive:
            ranks = self._call("probe", lambda: self.probes.sample(self.process.channel_pids()), fallback=())
            stacks = self.probes.take_stacks()
            captures = self.probes.take_captures()
        return Frame(t=t, gpus=gpus, host=host, process=proc, ranks=ranks, stale_gpus=stale, stacks=stacks,
                     captures=captures)

    def request_stacks(self) -> int:
        """Ask the job's probes for every thread's stack (they come with a later frame)."""
        return self.probes.request_stacks() if self.probes is not None else 0

    def request_capture(self, kind: str) -> int:
        """Ask the job's probes for a capture (a trace or a memory snapshot; it comes with a later frame)."""
        return self.probes.request_capture(kind) if self.probes is not None else 0

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
        if self.gpu is not None and not self._pending:
            self.gpu.close()  # with a call still hung, leave NVML alone
        if self.probes is not None:
            self.probes.close()
        if self.owners is not None:
            self.owners.close()
        close_host = getattr(self.host, "close", None)
        if close_host is not None:
            close_host()
