"""XID and ECC error events from NVML, on a thread of their own.

NVML delivers these as events (``nvmlEventSetWait``), not as readings: a critical XID
(the driver's error code: 31 a memory fault in the application, 48 an uncorrectable ECC
error, 79 the GPU fell off the bus, ...) happens once and is gone. The listener blocks in
the driver with a short timeout, so it costs nothing while nothing happens, and hands
each event to the next tick through ``take()``. Where the driver or the container does
not allow event registration it stays silent (``available`` is False).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

XID_CRITICAL = 0x8       # nvmlEventTypeXidCriticalError
ECC_SINGLE_BIT = 0x1     # nvmlEventTypeSingleBitEccError
ECC_DOUBLE_BIT = 0x2     # nvmlEventTypeDoubleBitEccError
WANTED = XID_CRITICAL | ECC_SINGLE_BIT | ECC_DOUBLE_BIT
_TIMEOUT_CODE = 10       # NVML_ERROR_TIMEOUT: no event within the wait


def _key(handle: Any) -> Any:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


class EventListener:
    def __init__(self, nv, handles: list[Any], wait_ms: int = 500) -> None:
        self.nv = nv
        self.wait_ms = wait_ms
        self._index = {_key(h): i for i, h in enumerate(handles)}
        self._pending: dict[int, list[tuple[int, int]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._set = None
        self.registered: list[int] = []
        self.errors = 0
        if not all(hasattr(nv, f) for f in ("nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait")):
            return
        try:
            self._set = nv.nvmlEventSetCreate()
        except nv.NVMLError:
            return
        for i, h in enumerate(handles):
            try:
                supported = nv.nvmlDeviceGetSupportedEventTypes(h) if hasattr(nv, "nvmlDeviceGetSupportedEventTypes") \
                    else WANTED
                types = int(supported) & WANTED
                if types:
                    nv.nvmlDeviceRegisterEvents(h, types, self._set)
                    self.registered.append(i)
            except nv.NVMLError:
                continue

    @property
    def available(self) -> bool:
        return bool(self.registered)

    def start(self) -> None:
        if self.available and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="traintop-nvml-events", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        nv = self.nv
        while not self._stop.is_set():
            try:
                ev = nv.nvmlEventSetWait(self._set, self.wait_ms)
            except nv.NVMLError as e:
                if getattr(e, "value", None) != _TIMEOUT_CODE:
                    self.errors += 1
                    self._stop.wait(1.0)
                continue
            i = self._index.get(_key(ev.device))
            if i is None:
                continue
            with self._lock:
                self._pending.setdefault(i, []).append((int(ev.eventType), int(ev.eventData)))

    @property
    def pending(self) -> bool:
        return bool(self._pending)  # a read without the lock: a miss waits for the next tick

    def take(self, i: int) -> list[tuple[int, int]]:
        """Events of GPU ``i`` since the last call: (event type, data; the XID code for XIDs)."""
        with self._lock:
            return self._pending.pop(i, [])

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.wait_ms / 1000.0 + 0.5)
        if self._set is not None and hasattr(self.nv, "nvmlEventSetFree"):
            try:
                self.nv.nvmlEventSetFree(self._set)
            except Exception:  # shutting down
                pass
            self._set = None
