"""A reader of Prometheus's HTTP API (``/api/v1/query``, ``query_range``) through httpx.

Answers are untrusted input: each is read up to a size limit and a time limit, label
names and values pass through ``one_line`` (and are capped), values that are not finite
numbers are dropped, and every failure is one ``TraintopError`` line: unreachable, needs
authentication, not Prometheus, an error from Prometheus itself.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import httpx

from traintop.errors import TraintopError
from traintop.text import one_line

MAX_BYTES = 64 << 20
MAX_SERIES = 200_000
TIMEOUT_S = 30.0
LABEL_LIMIT = 128


@dataclass(frozen=True, slots=True)
class Series:
    labels: dict
    points: tuple[tuple[float, float], ...]  # (unix time, value), time-ordered

    def get(self, *names: str, default: str = "") -> str:
        for n in names:
            v = self.labels.get(n)
            if v:
                return v
        return default

    @property
    def last(self) -> float | None:
        return self.points[-1][1] if self.points else None


class Prometheus:
    def __init__(self, url: str, timeout: float = TIMEOUT_S, max_bytes: int = MAX_BYTES,
                 transport: httpx.BaseTransport | None = None) -> None:
        url = url.strip()
        if "://" not in url:
            url = "http://" + url
        if not url.startswith(("http://", "https://")):
            raise TraintopError(f"--prometheus expects an http(s) URL, got {one_line(url, 80)!r}")
        self.url = url.rstrip("/")
        self.shown = one_line(httpx.URL(self.url).copy_with(username=None, password=None), limit=120)
        self.max_bytes = max_bytes
        self.calls = 0
        self.bytes_read = 0
        self._client = httpx.Client(timeout=timeout, transport=transport, follow_redirects=False,
                                    headers={"Accept": "application/json"})

    def close(self) -> None:
        self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- API -------------------------------------------------------------------------------
    def query(self, promql: str, at: float | None = None) -> list[Series]:
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self._result(self._get("/api/v1/query", params))

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[Series]:
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{max(step, 0.001):.3f}"}
        return self._result(self._get("/api/v1/query_range", params))

    # -- plumbing ----------------------------------------------------------------------------
    def _get(self, path: str, params: dict) -> dict:
        self.calls += 1
        try:
            with self._client.stream("GET", self.url + path, params=params) as resp:
                if resp.status_code in (401, 403):
                    raise TraintopError(f"Prometheus at {self.shown} needs authentication (HTTP {resp.status_code}); "
                                        "put the credentials in the URL (https://user:password@host)")
                if resp.status_code in (301, 302, 303, 307, 308):
                    raise TraintopError(f"Prometheus at {self.shown} redirects elsewhere (HTTP {resp.status_code}); "
                                        "give the final URL")
                body = bytearray()
                for chunk in resp.iter_bytes():
                    body += chunk
                    if len(body) > self.max_bytes:
                        raise TraintopError(f"Prometheus at {self.shown} sent more than {self.max_bytes >> 20} MiB "
                                            "for one query; narrow --since or give --job")
                status = resp.status_code
        except httpx.TimeoutException:
            raise TraintopError(f"Prometheus at {self.shown} did not answer in time") from None
        except httpx.ConnectError as e:
            raise TraintopError(f"cannot reach Prometheus at {self.shown}: {one_line(_reason(e), 120)}") from None
        except httpx.HTTPError as e:
            raise TraintopError(f"Prometheus at {self.shown}: {one_line(_reason(e), 120)}") from None
        self.bytes_read += len(body)
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise TraintopError(f"{self.shown} did not answer like Prometheus (HTTP {status}, not JSON)") from None
        if not isinstance(doc, dict) or doc.get("status") not in ("success", "error"):
            raise TraintopError(f"{self.shown} did not answer like Prometheus (HTTP {status})")
        if doc["status"] == "error":
            raise TraintopError(f"Prometheus at {self.shown} refused the query: "
                                f"{one_line(doc.get('error') or doc.get('errorType') or 'error', 200)}")
        data = doc.get("data")
        if not isinstance(data, dict):
            raise TraintopError(f"{self.shown} did not answer like Prometheus (no data)")
        return data

    @staticmethod
    def _result(data: dict) -> list[Series]:
        kind, result = data.get("resultType"), data.get("result")
        if kind not in ("vector", "matrix") or not isinstance(result, list):
            return []
        if len(result) > MAX_SERIES:
            raise TraintopError(f"Prometheus answered with more than {MAX_SERIES} series; narrow the query (--job)")
        out = []
        for item in result:
            if not isinstance(item, dict):
                continue
            metric = item.get("metric")
            labels = {one_line(k, LABEL_LIMIT): one_line(v, LABEL_LIMIT) for k, v in metric.items()
                      if isinstance(k, str) and isinstance(v, str)} if isinstance(metric, dict) else {}
            raw = item.get("values") if kind == "matrix" else [item.get("value")]
            points = []
            for p in raw if isinstance(raw, list) else ():
                if isinstance(p, list) and len(p) == 2:
                    try:
                        t, v = float(p[0]), float(p[1])
                    except (TypeError, ValueError):
                        continue
                    if math.isfinite(t) and math.isfinite(v):
                        points.append((t, v))
            out.append(Series(labels, tuple(sorted(points))))
        return out


def _reason(e: Exception) -> str:
    text = str(e) or type(e).__name__
    if "Connection refused" in text or "Errno 111" in text:
        return "connection refused"
    if "Name or service not known" in text or "nodename nor servname" in text:
        return "unknown host"
    return text


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d`` → seconds."""
    t = text.strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    try:
        v = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise TraintopError(f"expected a duration like 90s, 15m, 2h or 1d, got {one_line(text, 40)!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise TraintopError(f"expected a positive duration, got {one_line(text, 40)!r}")
    return v
