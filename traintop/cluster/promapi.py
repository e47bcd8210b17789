"""A reader of Prometheus's HTTP API (``/api/v1/query``, ``query_range``) through httpx.

Answers are untrusted input: each is read up to a size limit and a time limit, label
names and values pass through ``one_line`` (and are capped), values that are not finite
numbers are dropped, and every failure is one ``TraintopError`` line: unreachable, needs
authentication, not Prometheus, an error from Prometheus itself.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import threading
from operator import itemgetter
from dataclasses import dataclass

import httpx

from traintop.cluster.addresses import is_loopback
from traintop.cluster.budget import ReadBudget
from traintop.cluster.deadline import deadline, install as install_deadline, remaining
from traintop.errors import TraintopError
from traintop.text import one_line

MAX_BYTES = 64 << 20
MAX_SERIES = 200_000
TIMEOUT_S = 30.0
LABEL_LIMIT = 128
MAX_GRID = 11_000  # points a series in one range query: Prometheus's own limit
MAX_TIME = 4_102_444_800.0  # 2100-01-01


class _Labelled:
    __slots__ = ()
    labels: dict  # each subclass's field

    def get(self, *names: str, default: str = "") -> str:
        for n in names:
            v = self.labels.get(n)
            if v:
                return v
        return default


@dataclass(frozen=True, slots=True)
class Series(_Labelled):
    labels: dict
    points: tuple[tuple[float, float], ...]  # (unix time, value), time-ordered

    @property
    def last(self) -> float | None:
        return self.points[-1][1] if self.points else None


@dataclass(frozen=True, slots=True)
class GridSeries(_Labelled):
    """A series of a range query laid on its grid: ``values`` maps the grid's own times
    (``Grid.times``, the same float objects) to finite values."""
    labels: dict
    values: dict

    @property
    def last(self) -> float | None:
        return self.values[max(self.values)] if self.values else None


@dataclass(frozen=True)
class Grid:
    """The instants a range query is evaluated at: ``start + k·step``, k < n (ms-rounded,
    as the query string carries them)."""
    start: float
    step: float
    n: int

    @classmethod
    def over(cls, start: float, end: float, step: float) -> "Grid":
        if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in (start, end, step)):
            raise TraintopError("the time range and step must be finite numbers")
        if not (0 <= start <= end <= MAX_TIME):
            raise TraintopError("the time range must lie between 1970 and 2100, its end after its start")
        start, step = round(start, 3), round(max(step, 0.001), 3)
        n = int((round(end, 3) - start) / step + 1e-9) + 1
        if n > MAX_GRID:
            raise TraintopError(f"a step of {step:g} s over {end - start:.0f} s is {n} points a series; Prometheus "
                                f"answers at most {MAX_GRID}: give --step {math.ceil((end - start) / (MAX_GRID - 1))} "
                                "or more")
        return cls(start, step, n)

    @property
    def end(self) -> float:
        return self.times[-1]

    @property
    def times(self) -> list[float]:
        t = self.__dict__.get("_times")
        if t is None:
            t = [round(self.start + k * self.step, 3) for k in range(self.n)]
            object.__setattr__(self, "_times", t)
        return t


class Prometheus:
    def __init__(self, url: str, timeout: float = TIMEOUT_S, max_bytes: int = MAX_BYTES,
                 transport: httpx.BaseTransport | None = None) -> None:
        url = url.strip()
        if "://" not in url:
            url = "http://" + url
        if not url.startswith(("http://", "https://")):
            raise TraintopError(f"--prometheus expects an http(s) URL, got {one_line(url, 80)!r}")
        try:
            parsed = httpx.URL(url.rstrip("/"))
            if not parsed.host:
                raise httpx.InvalidURL("no host")
        except (httpx.InvalidURL, ValueError, TypeError) as e:
            raise TraintopError(f"--prometheus: not a URL ({one_line(e, 80)}): "
                                f"{one_line(_hide_password(url), 80)!r}") from None
        self.url = url.rstrip("/")
        self.shown = one_line(parsed.copy_with(username=None, password=None), limit=120)
        self.max_bytes = max_bytes
        self.timeout = timeout  # the whole of one query, wall clock (deadline.py), not only each read
        self.calls = 0
        self.bytes_read = 0
        self.budget: ReadBudget | None = None  # the whole read under way (read_budget)
        self._count = threading.Lock()  # queries may run on several threads (one client: httpx's pool is thread-safe)
        self._decode = threading.Lock()  # one answer decoded at a time (_get)
        headers = {"Accept": "application/json"}
        if is_loopback(parsed.host):
            # compressing answers only pays across a network: on this machine it costs
            # Prometheus more CPU than the copy it saves (a 50 MB read: 3.3 s with gzip, 1.3 s without)
            headers["Accept-Encoding"] = "identity"
        try:
            self._client = httpx.Client(timeout=timeout, transport=transport, follow_redirects=False, headers=headers)
        except (httpx.InvalidURL, ValueError) as e:  # a proxy from the environment that is not a URL
            raise TraintopError(f"cannot use the HTTP proxy settings: {one_line(e, 120)}") from None
        install_deadline(self._client)

    @contextlib.contextmanager
    def read_budget(self, max_bytes: int, max_series: int, what: str, max_points: int | None = None):
        """Every query within the block is charged to one budget (budget.py)."""
        old, self.budget = self.budget, ReadBudget(max_bytes, max_series, what, max_points)
        try:
            yield self.budget
        finally:
            self.budget = old

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
        return self._get("/api/v1/query", params, self._result)

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[Series]:
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{max(step, 0.001):.3f}"}
        return self._get("/api/v1/query_range", params, self._result)

    def query_grid(self, promql: str, grid: Grid) -> list[GridSeries]:
        """A range query over ``grid``, each series' values keyed by the grid's times. The
        common answer (a series with a value at every instant of a contiguous run) costs no
        Python work per point beyond the float conversion; anything else is checked point
        by point."""
        params = {"query": promql, "start": f"{grid.start:.3f}", "end": f"{grid.end:.3f}", "step": f"{grid.step:.3f}"}
        times = grid.times

        def convert(data: dict) -> list[GridSeries]:
            return [GridSeries(labels, _on_grid(raw, grid, times)) for labels, raw in self._items(data, "matrix")]
        return self._get("/api/v1/query_range", params, convert)

    # -- plumbing ----------------------------------------------------------------------------
    def _get(self, path: str, params: dict, convert):
        """``convert(data)`` of the answer. Answers are read concurrently but decoded one at a
        time: a decoded answer is several times its bytes in Python objects, and only the
        converted series (floats on the grid) outlive it."""
        with self._count:
            self.calls += 1
        budget = self.budget
        try:
            with deadline(self.timeout, budget.cancelled if budget is not None else None):
                body, status = self._fetch(path, params, budget)
        except httpx.TimeoutException:
            raise TraintopError(f"Prometheus at {self.shown} did not answer in time "
                                f"(a query gets {self.timeout:g} s in all)") from None
        except httpx.ConnectError as e:
            raise TraintopError(f"cannot reach Prometheus at {self.shown}: {one_line(_reason(e), 120)}") from None
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as e:
            raise TraintopError(f"Prometheus at {self.shown}: {one_line(_reason(e), 120)}") from None
        with self._count:
            self.bytes_read += len(body)
        with self._decode:
            data = self._decode_answer(body, status, budget)
            del body
            try:
                return convert(data)
            finally:
                del data

    def _decode_answer(self, body: bytearray, status: int, budget: ReadBudget | None) -> dict:
        # counted before decoding: every series is an object, so an answer has at least as many
        # '{' as series (json.loads of 200 000 series costs far more than this pass over the bytes)
        if budget is not None and body.count(b"{") > 2 * budget.room_for_series() + 2:
            budget.take_series(body.count(b"{") // 2, self.shown)
        if budget is not None:
            budget.take_points(body.count(b"],["), self.shown)  # between two points of a range answer
        try:
            doc = json.loads(body)
        except RecursionError:
            raise TraintopError(f"{self.shown} did not answer like Prometheus (JSON nested too deeply)") from None
        except MemoryError:
            raise TraintopError(f"{self.shown}: its answer does not fit in memory; narrow --since or give --job") \
                from None
        except (ValueError, UnicodeDecodeError):
            raise TraintopError(f"{self.shown} did not answer like Prometheus (HTTP {status}, not JSON)") from None
        body.clear()  # the caller's reference too: the raw bytes are not needed once decoded
        if not isinstance(doc, dict) or doc.get("status") not in ("success", "error"):
            raise TraintopError(f"{self.shown} did not answer like Prometheus (HTTP {status})")
        if doc["status"] == "error":
            raise TraintopError(f"Prometheus at {self.shown} refused the query: "
                                f"{one_line(doc.get('error') or doc.get('errorType') or 'error', 200)}")
        data = doc.get("data")
        if not isinstance(data, dict):
            raise TraintopError(f"{self.shown} did not answer like Prometheus (no data)")
        if budget is not None and isinstance(data.get("result"), list):
            budget.take_series(len(data["result"]), self.shown)
        return data

    def _fetch(self, path: str, params: dict, budget: ReadBudget | None) -> tuple[bytearray, int]:
        """The raw answer, read up to the size limits and the deadline (checked between chunks too:
        a transport passed in by a caller does not carry deadline.py's)."""
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
                if budget is not None:
                    budget.take_bytes(len(chunk), self.shown)
                if len(body) > self.max_bytes:
                    raise TraintopError(f"Prometheus at {self.shown} sent more than {self.max_bytes >> 20} MiB "
                                        "for one query; narrow --since or give --job")
                left = remaining()
                if left is not None and left <= 0:
                    raise httpx.ReadTimeout("deadline")
            return body, resp.status_code

    @staticmethod
    def _items(data: dict, only: str | None = None):
        """(labels, raw points) of each series of an answer; labels made safe to show (each
        distinct string once per answer: the same host and model names recur in every series)."""
        kind, result = data.get("resultType"), data.get("result")
        if kind not in ("vector", "matrix") or (only and kind != only) or not isinstance(result, list):
            return
        if len(result) > MAX_SERIES:
            raise TraintopError(f"Prometheus answered with more than {MAX_SERIES} series; narrow the query (--job)")
        safe: dict[str, str] = {}

        def clean(text: str) -> str:
            v = safe.get(text)
            if v is None:
                v = safe[text] = one_line(text, LABEL_LIMIT)
            return v

        for item in result:
            if not isinstance(item, dict):
                continue
            metric = item.get("metric")
            labels = {clean(k): clean(v) for k, v in metric.items()
                      if isinstance(k, str) and isinstance(v, str)} if isinstance(metric, dict) else {}
            yield labels, (item.get("values") if kind == "matrix" else [item.get("value")])

    @classmethod
    def _result(cls, data: dict) -> list[Series]:
        out = []
        for labels, raw in cls._items(data):
            points = []
            for p in raw if isinstance(raw, list) else ():
                if isinstance(p, list) and len(p) == 2:
                    try:
                        t, v = float(p[0]), float(p[1])
                    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer of 400 digits
                        continue
                    if 0.0 <= t <= MAX_TIME and math.isfinite(v):  # a sample of 1970-2100, a finite value
                        points.append((t, v))
            out.append(Series(labels, tuple(sorted(points))))
        return out


_second = itemgetter(1)


def _on_grid(raw, grid: Grid, times: list[float]) -> dict:
    """One series' ``values`` as {grid time: value}, finite values only. Prometheus answers a
    range query with a value at each instant where the series exists: a run from its first
    to its last instant is the usual case, taken whole; gaps, times off the grid, or
    anything malformed go point by point (and malformed points are dropped)."""
    if not isinstance(raw, list) or not raw:
        return {}
    start, step, n = grid.start, grid.step, grid.n
    try:
        k0 = round((float(raw[0][0]) - start) / step)
        k1 = round((float(raw[-1][0]) - start) / step)
        # C-level passes over the points (no Python frame per point): all [time, value] pairs
        if k1 - k0 + 1 == len(raw) and 0 <= k0 and k1 < n and set(map(type, raw)) == {list} \
                and set(map(len, raw)) == {2}:
            vals = list(map(float, map(_second, raw)))
            out = dict(zip(times[k0:k1 + 1], vals))
            if all(map(math.isfinite, vals)):
                return out
            return {t: v for t, v in out.items() if math.isfinite(v)}
    except (TypeError, ValueError, KeyError, IndexError, OverflowError):
        pass
    out = {}
    for p in raw:
        if isinstance(p, list) and len(p) == 2:
            try:
                t, v = float(p[0]), float(p[1])
            except (TypeError, ValueError, OverflowError):
                continue
            if not (0.0 <= t <= MAX_TIME and math.isfinite(v)):  # off any grid (1e308 / step is no index)
                continue
            k = round((t - start) / step)
            if 0 <= k < n:
                out[times[k]] = v
    return out


@contextlib.contextmanager
def no_gc():
    """The cyclic garbage collector off while a read builds millions of small objects that
    hold no cycles (it would walk them over and over as they accumulate)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _hide_password(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    at = rest.rfind("@")
    return f"{scheme}{sep}…@{rest[at + 1:]}" if at >= 0 else url


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
