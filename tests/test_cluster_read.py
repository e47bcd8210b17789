"""Range answers laid on their grid (promapi._on_grid): the usual contiguous run is taken
whole, anything else point by point, and nothing malformed gets through."""

import math

from traintop.cluster.promapi import Grid, _on_grid
from traintop.cluster.rolling import window_grid


def test_a_contiguous_run_lands_on_the_grid_times():
    g = Grid(100.0, 5.0, 6)
    got = _on_grid([[110, "0.5"], [115, "1"], [120.0, "0.25"]], g, g.times)
    assert got == {110.0: 0.5, 115.0: 1.0, 120.0: 0.25}
    assert all(any(t is x for x in g.times) for t in got)  # the grid's own floats: lookups by identity


def test_gaps_millisecond_times_and_non_finite_values():
    g = Grid.over(1000.0004, 1010, 2.5)  # start and step as the query string carries them (ms)
    assert (g.start, g.step, g.n) == (1000.0, 2.5, 5)
    assert _on_grid([[1000, "1"], [1005, "2"], [1010, "3"]], g, g.times) == {1000.0: 1.0, 1005.0: 2.0, 1010.0: 3.0}
    assert _on_grid([[1000, "NaN"], [1002.5, "+Inf"], [1005, "4"]], g, g.times) == {1005.0: 4.0}


def test_malformed_points_are_dropped_and_the_rest_kept():
    g = Grid(0.0, 1.0, 10)
    hostile = [[0, "1"], "ab", [2, {"x": 1}], [3], [4, "5", 6], None, [5, "nope"], ["x", "1"], [6, "7"],
               [99, "1"], [-5, "1"], [float("inf"), "1"], [7.4, "8"]]
    assert _on_grid(hostile, g, g.times) == {0.0: 1.0, 6.0: 7.0, 7.0: 8.0}
    # looks contiguous (first and last on the grid, as many points as instants) but is not
    assert _on_grid([[0, "1"], "ab", [2, "3"]], g, g.times) == {0.0: 1.0, 2.0: 3.0}
    assert _on_grid([[0, "1"], [1, [2]], [2, "3"]], g, g.times) == {0.0: 1.0, 2.0: 3.0}
    for junk in (None, {}, "values", 7, [], [[]]):
        assert _on_grid(junk, g, g.times) == {}


def test_the_dashboards_grid_lines_up_from_one_read_to_the_next():
    a, b = window_grid(1_000_003.7, 300, 5.0), window_grid(1_000_011.2, 300, 5.0)
    assert a.times[-1] == 1_000_000.0 and b.times[-1] == 1_000_010.0 and a.n == b.n == 61
    assert set(a.times) & set(b.times) == set(a.times[2:])
    assert all(t == math.floor(t) for t in a.times)


def test_answers_from_this_machine_are_asked_for_uncompressed():
    """Compressing costs Prometheus more CPU than a loopback copy saves; across a network it pays."""
    import http.server
    import threading

    from traintop.cluster.addresses import is_loopback as _is_loopback
    from traintop.cluster.promapi import Prometheus

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.headers.get("Accept-Encoding"))
            body = b'{"status":"success","data":{"resultType":"matrix","result":[]}}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with Prometheus(f"http://127.0.0.1:{srv.server_port}") as prom:
            assert prom.query_grid("x", Grid(0.0, 1.0, 3)) == []
    finally:
        srv.shutdown()
    assert seen == ["identity"]
    assert _is_loopback("localhost") and _is_loopback("127.0.0.2") and _is_loopback("::1")
    assert not _is_loopback("prometheus.example") and not _is_loopback("10.0.0.5")
