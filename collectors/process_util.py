"""Per-process GPU utilization (SM, memory, encoder, decoder %) from NVML's process sample buffer.

Two calls answer it. ``nvmlDeviceGetProcessesUtilizationInfo`` (driver R550 and later) is asked
first: on driver R580 the older ``nvmlDeviceGetProcessUtilization``, the one other monitors use,
answers NOT_SUPPORTED on some GPUs while the newer one works. Where the newer one is missing
or unsupported the older one is the fallback; the call that answered is kept per GPU (``calls``,
shown by ``doctor``). Both return the samples taken since a timestamp: the last one seen is kept
per GPU, so each read covers one window. A value above 100 % or a sample not newer than the
last one seen is dropped; several samples of one process in a window are averaged.

The first read of a GPU only sets the timestamp (the buffer may hold samples from long ago).
"""

from __future__ import annotations

from dataclasses import dataclass

NEW_CALL = "nvmlDeviceGetProcessesUtilizationInfo"
LEGACY_CALL = "nvmlDeviceGetProcessUtilization"
_GONE = {3, 4, 13}  # NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND: this call will not answer here
_NO_SAMPLES = {0, 6}  # the size query said nothing to return (a success), or NOT_FOUND: nothing ran


@dataclass(frozen=True, slots=True)
class ProcessUtil:
    sm: float | None
    mem: float | None
    enc: float | None
    dec: float | None


def _pct(v) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if 0.0 <= x <= 100.0 else None


class ProcessUtilReader:
    def __init__(self, nv, handles) -> None:
        self.nv = nv
        self.handles = handles
        n = len(handles)
        self.calls: list[str | None] = [None] * n  # the call that answered on each GPU
        self._tried: list[set[str]] = [set() for _ in range(n)]  # calls that cannot answer there
        self._last_seen = [0] * n
        self._primed = [False] * n
        self.errors = 0

    def supported(self, i: int) -> bool:
        return len(self._tried[i]) < 2

    def poll(self, i: int) -> dict[int, ProcessUtil] | None:
        """{pid: its mean utilization since the previous poll} ({}: the call works and nothing ran);
        None where neither call answers on this GPU, on the priming read, or after an error."""
        for name in (NEW_CALL, LEGACY_CALL):
            if name in self._tried[i]:
                continue
            fn = getattr(self.nv, name, None)
            if fn is None:
                self._tried[i].add(name)
                continue
            try:
                samples = fn(self.handles[i], self._last_seen[i])
            except self.nv.NVMLError as e:
                code = getattr(e, "value", None)
                if code in _GONE:
                    self._tried[i].add(name)
                    continue
                if code in _NO_SAMPLES:
                    samples = []
                else:
                    self.errors += 1
                    return None
            self.calls[i] = name
            return self._mean(i, samples or [])
        return None

    def _mean(self, i: int, samples) -> dict[int, ProcessUtil] | None:
        last = self._last_seen[i]
        newest = last
        sums: dict[int, list] = {}
        for s in samples:
            ts = int(getattr(s, "timeStamp", 0) or 0)
            newest = max(newest, ts)
            if ts <= last:
                continue
            pid = int(getattr(s, "pid", 0) or 0)
            if pid <= 0:
                continue
            vals = [_pct(getattr(s, f, None)) for f in ("smUtil", "memUtil", "encUtil", "decUtil")]
            acc = sums.setdefault(pid, [[0.0, 0] for _ in range(4)])
            for a, v in zip(acc, vals):
                if v is not None:
                    a[0] += v
                    a[1] += 1
        self._last_seen[i] = newest
        if not self._primed[i]:
            self._primed[i] = True
            return None
        return {pid: ProcessUtil(*(a[0] / a[1] if a[1] else None for a in acc)) for pid, acc in sums.items()}
