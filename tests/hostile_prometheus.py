"""A tiny hostile "Prometheus" on 127.0.0.1: it answers the HTTP API the way an attacker would.

Modes (``server.mode``, changeable while it runs):
- ``ok``: a small, valid cluster (two hosts, one GPU and one rank each) on the asked grid.
- ``big``: every range query answered with about ``server.mib`` MiB of valid points on the
  asked grid (just under a per-answer cap), every instant query with as many series
  (``server.instant_big = 0``: instant queries answered as ``ok``).
- ``many``: every query answered with ``server.series`` series of one point each.
- ``slow``: headers, then the body one byte every ``server.pause`` seconds.
- ``slow_headers``: the status line and headers one byte at a time.
- ``deep``: JSON nested ``server.depth`` levels deep.
- ``empty``: every query answered with no series (a Prometheus that scrapes no agent).
- ``absurd``: valid JSON with absurd values (-Inf utilization, 309-digit XIDs, a 120-digit rank,
  rank 5 of 4, input wait 1000, step counts of 1e300).
- ``custom``: ``server.answer(query, grid, path)`` gives the series, as ``[(labels, [[t, value], ...])]``
  (``ok_series`` is the usual cluster; a test changes what it wants), or the whole body as bytes.

Used by tests/test_cluster_hostile_prometheus.py and bench/hostile_prometheus.py.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
import urllib.parse

MiB = 1 << 20


def _grid(q: dict) -> list[float]:
    if "start" not in q:
        return [float(q.get("time", [time.time()])[0])]
    start, end, step = (float(q[k][0]) for k in ("start", "end", "step"))
    n = min(11_000, int((end - start) / step + 1e-9) + 1)
    return [round(start + k * step, 3) for k in range(n)]


def _answer(kind: str, series: list) -> bytes:
    items = []
    for labels, points in series:
        if kind == "matrix":
            items.append({"metric": labels, "values": points})
        else:
            items.append({"metric": labels, "value": points[-1]})
    return json.dumps({"status": "success", "data": {"resultType": kind, "result": items}},
                      separators=(",", ":")).encode()


GPU = {"gpu": "0", "UUID": "GPU-x", "modelName": "H200"}
RANK = {"job": "j1", "local_rank": "0", "world_size": "2"}


def ok_series(query: str, grid: list[float]) -> list:
    def pts(v):
        return [[t, v] for t in grid]
    if "agent_info" in query:
        return [({}, pts("2"))]
    if "changes(" in query:
        return []
    out = []
    for host, rank in (("node-a", "0"), ("node-b", "1")):
        base = {"Hostname": host, "instance": f"{host}:19401"}
        if "gpu_utilization_ratio" in query:
            out.append((dict(base, **GPU), pts("0.9")))
        elif "sm_clock" in query:
            out.append((dict(base, **GPU), pts("0.98")))
        elif "gpu_" in query:
            out.append((dict(base, **GPU), pts("100")))
        elif "step_seconds" in query:
            out.append((dict(base, rank=rank, **RANK), pts("0.1")))
        elif "steps_total" in query:
            out.append((dict(base, rank=rank, **RANK), [[t, str(k)] for k, t in enumerate(grid)]))
        elif "input_wait_ratio" in query:
            out.append((dict(base, rank=rank, **RANK), pts("0.05")))
    return out


def absurd_series(query: str, grid: list[float]) -> list:
    def pts(v):
        return [[t, v] for t in grid]
    base = {"Hostname": "node-a", "instance": "node-a:19401"}
    r0 = dict(base, rank="0", job="j1", local_rank="0", world_size="4")
    if "agent_info" in query:
        return [({}, pts("1"))]
    if "changes(" in query:
        return [({}, pts("1"))]
    if "gpu_utilization_ratio" in query:
        return [(dict(base, **GPU), pts("-Inf")), (dict(base, gpu="1", UUID="GPU-y", modelName="H200"), pts("-1e300")),
                (dict(base, gpu="9" * 40), pts("0.5"))]
    if "gpu_last_xid" in query or "xid_errors_total" in query:
        return [(dict(base, **GPU), pts("1" + "0" * 308))]
    if "gpu_temperature" in query:
        return [(dict(base, **GPU), pts("1e12"))]
    if "gpu_power_watts" in query:
        return [(dict(base, **GPU), pts("-5e9"))]
    if "step_seconds" in query:
        return [(dict(base, rank="1" * 120, job="j1", local_rank="0", world_size="4"), pts("0.1")),
                (dict(base, rank="5", job="j1", local_rank="1", world_size="4"), pts("0.1")),
                (r0, pts("1e200"))]
    if "steps_total" in query:
        return [(r0, pts("1e300"))]
    if "input_wait_ratio" in query:
        return [(r0, pts("1000"))]
    return []


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        srv = self.server
        srv.requests += 1
        url = urllib.parse.urlsplit(self.path)
        q = urllib.parse.parse_qs(url.query)
        query = q.get("query", [""])[0]
        kind = "matrix" if url.path.endswith("query_range") else "vector"
        grid = _grid(q)
        mode = srv.mode
        try:
            if mode == "slow_headers":
                for b in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Slow: " + b"x" * 10_000:
                    self.wfile.write(bytes([b]))
                    self.wfile.flush()
                    time.sleep(srv.pause)
                return
            if mode == "empty":
                body = _answer(kind, [])
            elif mode == "absurd":
                body = _answer(kind, absurd_series(query, grid))
            elif mode == "custom":
                body = srv.answer(query, grid, url.path)
                body = body if isinstance(body, bytes) else _answer(kind, body)
            elif mode == "deep":
                body = (b'{"status":"success","data":{"resultType":"matrix","result":' + b"[" * srv.depth
                        + b"]" * srv.depth + b"}}")
            elif mode == "many":
                body = srv.cached(("many", kind), lambda: _many(kind, srv.series, grid[-1]))
            elif mode == "big" and kind == "vector" and not srv.instant_big:
                body = _answer(kind, ok_series(query, grid))
            elif mode == "big":
                body = srv.cached(("big", kind, len(grid)), lambda: _big(kind, grid, srv.mib))
            else:  # ok, slow
                body = _answer(kind, ok_series(query, grid))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if mode == "slow":
                for b in body:
                    self.wfile.write(bytes([b]))
                    self.wfile.flush()
                    time.sleep(srv.pause)
            else:
                self.wfile.write(body)
        except OSError:
            pass

    def log_message(self, *args):
        pass


def _many(kind: str, n: int, t: float) -> bytes:
    key = "values" if kind == "matrix" else "value"
    pt = f'[[{t},"0.5"]]' if kind == "matrix" else f'[{t},"0.5"]'
    one = '{"metric":{"Hostname":"h%d","gpu":"0","instance":"i"},"' + key + '":' + pt + "}"
    head = b'{"status":"success","data":{"resultType":"' + kind.encode() + b'","result":['
    return head + ",".join(one % i for i in range(n)).encode() + b"]}}"


def _big(kind: str, grid: list[float], mib: float) -> bytes:
    """About ``mib`` MiB of series, each with a value at every instant of the grid: all of it is kept."""
    key = "values" if kind == "matrix" else "value"
    pts = "[" + ",".join(f'[{t},"0.5"]' for t in grid) + "]" if kind == "matrix" else f'[{grid[-1]},"0.5"]'
    one = '{"metric":{"Hostname":"h%d","gpu":"0","instance":"i%d"},"' + key + '":' + pts + "}"
    n = max(1, int(mib * MiB / (len(one) + 8)))
    head = b'{"status":"success","data":{"resultType":"' + kind.encode() + b'","result":['
    return head + ",".join(one % (i, i) for i in range(n)).encode() + b"]}}"


class HostileServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, mode: str = "ok", **kw) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.mode = mode
        self.mib, self.series, self.depth, self.pause = 63.0, 199_999, 100_000, 1.0
        self.instant_big = 1  # big: instant queries too (0: only range queries are 63 MiB)
        for k, v in kw.items():
            setattr(self, k, v)
        self.requests = 0
        self._cache: dict = {}
        self._lock = threading.Lock()

    def handle_error(self, request, client_address):
        pass  # a client that gave up (the point of most modes)

    def cached(self, key, make):
        with self._lock:
            if key not in self._cache:
                self._cache[key] = make()
            return self._cache[key]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}"

    def start(self) -> "HostileServer":
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


if __name__ == "__main__":  # in its own process: python tests/hostile_prometheus.py MODE [key=value ...]
    import sys

    kw = {k: float(v) if "." in v else int(v) for k, v in (a.split("=", 1) for a in sys.argv[2:])}
    s = HostileServer(sys.argv[1] if len(sys.argv) > 1 else "ok", **kw)
    print(s.url, flush=True)
    s.serve_forever()
