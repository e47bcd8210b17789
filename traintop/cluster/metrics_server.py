"""The agent's HTTP endpoint: ``GET /metrics`` and nothing else, bounded in connections and time.

prometheus-client's server starts a thread per connection with no socket timeout: 4 000
half-sent requests held 4 000 threads for ever. Here at most ``MAX_CONNECTIONS`` are served
at once (one more is closed at once), each has ``CONNECTION_S`` in all (a reaper closes a
connection past it however slowly it sends), and every path but ``/metrics`` is a 404.
"""

from __future__ import annotations

import http.server
import socket
import threading
import time

from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

MAX_CONNECTIONS = 16  # Prometheus scrapes with one connection; a few more for curl and a second server
CONNECTION_S = 10.0  # a scrape of an 8-GPU node takes about 16 ms (docs/CLUSTER.md)


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "traintop-agent"
    sys_version = ""
    protocol_version = "HTTP/1.0"  # one request a connection: nothing is held between scrapes
    server: MetricsServer

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path != "/metrics":
            self._send(404, b"traintop agent: the metrics are at /metrics\n", "text/plain; charset=utf-8")
            return
        self._send(200, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)

    def do_HEAD(self) -> None:
        self.do_GET()

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


class MetricsServer(http.server.HTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, addr: str, port: int, registry, max_connections: int = MAX_CONNECTIONS,
                 connection_s: float = CONNECTION_S) -> None:
        self.address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        self.registry = registry
        self.connection_s = connection_s
        self._slots = threading.BoundedSemaphore(max_connections)
        self._open: dict[socket.socket, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        super().__init__((addr, port), _Handler)
        self.timeout = None

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # all slots taken: this one waits for nothing
            return
        request.settimeout(self.connection_s)
        with self._lock:
            self._open[request] = time.monotonic()
        threading.Thread(target=self._serve_one, args=(request, client_address), daemon=True).start()

    def _serve_one(self, request, client_address) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # noqa: BLE001 - a client that went away or sent garbage costs only its connection
            pass
        finally:
            with self._lock:
                self._open.pop(request, None)
            self.shutdown_request(request)
            self._slots.release()

    def handle_error(self, request, client_address) -> None:
        pass

    def _reap(self) -> None:
        """Close connections older than ``connection_s``, however slowly they send."""
        while not self._stop.wait(min(1.0, self.connection_s / 4)):
            now = time.monotonic()
            with self._lock:
                late = [s for s, t0 in self._open.items() if now - t0 > self.connection_s]
            for s in late:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def start(self) -> "MetricsServer":
        threading.Thread(target=self.serve_forever, name="metrics", daemon=True).start()
        threading.Thread(target=self._reap, name="metrics-reaper", daemon=True).start()
        return self

    def shutdown(self) -> None:
        self._stop.set()
        super().shutdown()
        self.server_close()

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._open)
