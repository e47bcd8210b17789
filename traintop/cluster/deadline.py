"""A wall-clock deadline over a whole HTTP exchange, not httpx's per-read timeout.

httpx's timeout bounds each read: a server that sends one byte a second (of its headers or
of its body) is never timed out. Here every read, write and connect of the calling thread
gets at most the time left until its deadline, and none starts once it has passed (httpcore
then raises its own timeout, which httpx reports as ``httpx.TimeoutException``). The
deadline is per thread: queries run on several threads through one client.
"""

from __future__ import annotations

import contextlib
import threading
import time

import httpcore

_local = threading.local()


@contextlib.contextmanager
def deadline(seconds: float, cancelled: threading.Event | None = None):
    """Every network operation of this thread within the block ends by ``seconds`` from now
    (or at its next read once ``cancelled`` is set)."""
    old = getattr(_local, "at", None), getattr(_local, "cancelled", None)
    _local.at, _local.cancelled = time.monotonic() + seconds, cancelled
    try:
        yield
    finally:
        _local.at, _local.cancelled = old


def remaining() -> float | None:
    at = getattr(_local, "at", None)
    if at is None:
        return None
    cancelled = getattr(_local, "cancelled", None)
    return 0.0 if cancelled is not None and cancelled.is_set() else at - time.monotonic()


def _bounded(timeout: float | None, exc) -> float | None:
    left = remaining()
    if left is None:
        return timeout
    if left <= 0:
        raise exc("the whole exchange took longer than its deadline")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _bounded(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _bounded(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, _bounded(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str):
        return self._inner.get_extra_info(info)


class DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self, inner) -> None:
        self._inner = inner

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        return _Stream(self._inner.connect_tcp(host, port, _bounded(timeout, httpcore.ConnectTimeout),
                                               local_address, socket_options))

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        return _Stream(self._inner.connect_unix_socket(path, _bounded(timeout, httpcore.ConnectTimeout),
                                                       socket_options))

    def sleep(self, seconds: float) -> None:
        left = remaining()
        self._inner.sleep(seconds if left is None else max(0.0, min(seconds, left)))


def install(client) -> int:
    """Put the deadline under each of ``client``'s own transports (the direct one and any
    proxy's); a transport passed in by a caller (tests) is left as it is. Returns how many."""
    n = 0
    transports = [getattr(client, "_transport", None)] + list(getattr(client, "_mounts", {}).values())
    for t in transports:
        pool = getattr(t, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if pool is not None and backend is not None and not isinstance(backend, DeadlineBackend):
            pool._network_backend = DeadlineBackend(backend)
            n += 1
    return n
