"""The cluster dashboard: its look at 80x24 and 160x48 (snapshots of a fixed cluster), and
its keys (focus a host, a job, all again). The Pilot test against a real Prometheus is in
test_cluster_prometheus.py."""

import asyncio

import pytest

from traintop.app.cluster import ClusterApp
from traintop.cluster.fetch import ClusterData, GpuData, RankData
from traintop.cluster.report import findings_of
from traintop.cluster.fetch import AgentFinding
from traintop.cluster.snapshot import snapshot_from
from traintop.samples import REASON_SW_THERMAL
from traintop.units import GiB
from traintop.widgets.cluster_panels import HostsBody

T0 = 1_790_000_000.0


def fixed_snapshot():
    """Three hosts of one job: node-a's loader starves, node-b's rank 3 lags, node-c runs hot."""
    d = fixed_data()
    return snapshot_from(d, findings_of(d)[0])


def fixed_data():
    d = ClusterData("http://prometheus:9090", T0, T0 + 299, 5.0, [T0 + 5.0 * k for k in range(60)])
    for h_i, h in enumerate(("node-a", "node-b", "node-c")):
        for local in range(2):
            rank = 2 * h_i + local
            g = d.gpus[(h, local)] = GpuData(h, local, "NVIDIA H200", power_limit=700.0, mem_total=141 * GiB)
            r = d.ranks[("1234", rank)] = RankData("1234", rank, local, 6, h)
            for k, t in enumerate(d.grid):
                starved = h == "node-a"
                g.util[t] = (1.0 if k % 2 else 0.0) if starved else 1.0
                g.power[t] = 300.0 if starved else 650.0
                g.mem_used[t] = (40 if starved else 98) * GiB
                g.temp[t] = 84.0 if h == "node-c" else 60.0
                g.clock_ratio[t] = 0.72 if h == "node-c" else 1.0
                g.reasons[t] = REASON_SW_THERMAL if h == "node-c" else 0
                lag = (h, local) == ("node-b", 1)
                r.step[t] = 0.80 if starved else (0.14 if lag else 0.081 + 0.001 * (k % 3))
                r.wait[t] = 0.62 if starved else (0.38 if lag else 0.02)
                r.steps[t] = k * 5 / r.step[t]
        if h == "node-a":
            for gi in range(2):
                d.findings.append(AgentFinding(h, "starvation", "warning", f"gpu{gi}", list(d.grid[10:])))
    d.loader_cpu["node-a"] = {t: 0.98 for t in d.grid}
    return d




class _Shown(ClusterApp):
    def on_mount(self) -> None:
        super().on_mount()
        self.show_snapshot(self._snap)


def shown_app():
    snap = fixed_snapshot()
    a = _Shown(lambda: snap, url="http://prometheus:9090", poll=False)
    a._snap = snap
    return a


def test_the_fixed_cluster_has_the_findings_the_snapshot_shows():
    rules = {(f.rule, f.host) for f in fixed_snapshot().findings}
    assert {("straggler_node", "node-a"), ("straggler", "node-b"), ("slow_node", "node-c")} <= rules
    # node-a's loader starving and its agent's starvation verdicts are that straggler finding's cause
    assert not {("node_starving", "node-a"), ("starvation", "node-a")} & rules


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_cluster_dashboard(snap_compare, size):
    assert snap_compare(shown_app(), terminal_size=size)


def test_ctrl_c_quits_the_cluster_view_as_q_does():
    async def go():
        a = shown_app()
        async with a.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            await pilot.press("ctrl+c")
            await pilot.pause()
            return a.is_running, a.return_code

    assert asyncio.run(go()) == (False, 0)


def test_keys_focus_a_host_then_all_again():
    asyncio.run(_keys())


async def _keys():
    a = shown_app()
    async with a.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        body = a.query_one(HostsBody)
        assert {"node-a", "node-b", "node-c"} <= set(body.render().plain.split())
        await pilot.press("h")
        assert a.focus_host == "node-a"
        text = body.render().plain
        assert "node-a" in text and "node-b" not in text
        await pilot.press("h", "h")
        assert a.focus_host == "node-c"
        await pilot.press("H")
        assert a.focus_host == "node-b"
        await pilot.press("a")
        assert a.focus_host is None and "node-c" in body.render().plain
        await pilot.press("j")
        assert a.focus_job == "1234"
        await pilot.press("p")
        assert a.paused
        await pilot.press("question_mark")
        assert a.screen.__class__.__name__ == "ClusterHelp"


def test_reads_slower_than_the_refresh_never_overlap():
    """A Prometheus slower than --refresh: the next read waits for the one under way (they
    would otherwise pile up, each slowing the others, and race on the kept window)."""
    import threading
    import time

    snap = fixed_snapshot()
    state = {"now": 0, "most": 0, "calls": 0}
    lock = threading.Lock()

    def slow_source():
        with lock:
            state["now"] += 1
            state["calls"] += 1
            state["most"] = max(state["most"], state["now"])
        time.sleep(0.3)
        with lock:
            state["now"] -= 1
        return snap

    async def go():
        app = ClusterApp(slow_source, url="http://prometheus:9090", refresh=0.05)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause(2.0)
            assert app.snapshot is snap

    asyncio.run(go())
    assert state["most"] == 1
    assert 2 <= state["calls"] <= 8  # ~40 timer ticks; reads go on, one at a time (0.3 s each)


def large_snapshot(hosts=16, gpus=8):
    """16 hosts x 8 GPUs, one job over all of them: node-05 runs hot and clocked down, rank 83
    (node-10, local rank 3) lags waiting for its data."""
    d = ClusterData("http://prometheus:9090", T0, T0 + 299, 5.0, [T0 + 5.0 * k for k in range(60)])
    n = hosts * gpus
    for h_i in range(hosts):
        h = f"node-{h_i:02d}"
        for local in range(gpus):
            rank = h_i * gpus + local
            g = d.gpus[(h, local)] = GpuData(h, local, "NVIDIA H200", power_limit=700.0, mem_total=141 * GiB)
            r = d.ranks[("77", rank)] = RankData("77", rank, local, n, h)
            for k, t in enumerate(d.grid):
                hot = h == "node-05"
                g.util[t] = 0.97 + 0.01 * ((k + local) % 3)
                g.power[t] = 640.0 + local
                g.mem_used[t] = 90 * GiB
                g.temp[t] = 86.0 if hot else 61.0 + local % 3
                g.clock_ratio[t] = 0.7 if hot else 1.0
                g.reasons[t] = REASON_SW_THERMAL if hot else 0
                r.step[t] = 0.16 if rank == 83 else 0.09 + 0.0001 * (rank % 7)
                r.wait[t] = 0.4 if rank == 83 else 0.02
                r.steps[t] = k * 5 / r.step[t]
    return snapshot_from(d, findings_of(d)[0])


def test_a_cluster_larger_than_the_screen_shows_a_line_per_host_and_the_slowest_ranks():
    asyncio.run(_large())


async def _large():
    snap = large_snapshot()
    a = _Shown(lambda: snap, url="http://prometheus:9090", poll=False)
    a._snap = snap
    async with a.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        text = a.query_one(HostsBody).render().plain
        lines = text.split("\n")
        assert lines[0].startswith("16 hosts · 128 GPUs")
        rows = [ln for ln in lines if ln.startswith("node-")]
        assert len(rows) == 16  # one line per host, no GPU lines
        hot = next(ln for ln in rows if ln.startswith("node-05"))
        assert "clk 70%" in hot and "86°" in hot and "▲" in hot
        assert "128 of 128 ranks" in text and "the 12 slowest" in text
        shown = [ln for ln in lines if ln.startswith(" r")]
        assert len(shown) == 12 and shown[0].startswith(" r83 ") and "node-10" in shown[0]
        assert len(lines) < 40
        await pilot.press("h")  # a host: its GPUs and its ranks, one line each
        text = a.query_one(HostsBody).render().plain
        assert "node-00  8 GPUs" in text and "node-01" not in text
        assert len([ln for ln in text.split("\n") if ln.startswith(" r")]) == 8


def test_large_cluster_dashboard(snap_compare):
    snap = large_snapshot()
    a = _Shown(lambda: snap, url="http://prometheus:9090", poll=False)
    a._snap = snap
    assert snap_compare(a, terminal_size=(100, 30))


def test_findings_that_come_after_the_first_frame_are_drawn_without_a_resize():
    """At 80x24 the findings panel stayed 0 rows tall under "Findings (N active)" when the first
    snapshot came after the empty first frame (agents just started, Prometheus restarted)."""
    from traintop.widgets.alerts_panel import AlertsBody

    async def go():
        snap = fixed_snapshot()
        a = ClusterApp(lambda: snap, url="http://prometheus:9090", poll=False)
        async with a.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            a.show_problem("cannot reach http://prometheus:9090")
            await pilot.pause()
            a.show_snapshot(snap)
            for _ in range(50):  # bounded: the layout pass that follows
                await pilot.pause(0.05)
                if a.query_one(AlertsBody).size.height:
                    break
            body = a.query_one(AlertsBody)
            return body.size.height, len(body.text_lines(body.size.width or 78)), a.query_one("#alerts").border_title

    height, lines, title = asyncio.run(go())
    assert title.startswith("Findings (") and lines > 1
    assert height == lines


def test_a_node_that_stopped_reporting_is_dimmed_with_how_long_and_counted_so():
    d = fixed_data()
    for series in [g for (h, _), g in d.gpus.items() if h == "node-c"]:
        for t in d.grid[-12:]:  # its last minute: nothing
            for col in (series.util, series.power, series.mem_used, series.temp, series.clock_ratio):
                col.pop(t, None)
    for r in d.ranks.values():
        if r.host == "node-c":
            for t in d.grid[-12:]:
                r.step.pop(t, None), r.wait.pop(t, None), r.steps.pop(t, None)
    snap = snapshot_from(d, findings_of(d)[0])
    assert [h for h, _ in snap.silent] == ["node-c"] and snap.silent_for("node-c") >= 55

    async def go():
        a = ClusterApp(lambda: snap, url="http://prometheus:9090", poll=False)
        async with a.run_test(size=(160, 48)) as pilot:
            a.show_snapshot(snap)
            await pilot.pause()
            from traintop.widgets.cluster_panels import status_line
            return a.query_one(HostsBody).render(), status_line(snap, "", None, None, False, None).plain

    body, status = asyncio.run(go())
    lines = body.plain.split("\n")
    head = next(k for k, line in enumerate(lines) if line.startswith("node-c"))
    assert "no data for 1 min" in lines[head] or "no data for 60 s" in lines[head], lines[head]
    dim_from = len("\n".join(lines[:head + 1])) + 1  # node-c's GPU lines: drawn dim
    assert any("dim" in str(span.style) and span.start <= dim_from < span.end for span in body.spans)
    assert "3 hosts (1 without data) · 6 GPUs (2 without data) · 6 ranks (2 without data)" in status
    node_a = next(k for k, line in enumerate(lines) if line.startswith("node-a"))
    assert "no data" not in lines[node_a]


def test_a_node_whose_agent_cannot_read_its_gpus_is_no_cpu_node():
    """Its agent serves traintop_gpus_unreadable 1 and no GPU series: the read keeps the host, the
    dashboard says its GPUs are unreadable, the top line counts it."""
    from traintop.cluster.fetch import fetch_grid
    from traintop.cluster.promapi import Grid, GridSeries, Series
    from traintop.widgets.cluster_panels import status_line

    grid = Grid(T0, 5.0, 12)

    class FakeProm:
        shown = "http://prometheus:9090"
        budget = None  # no whole-read limit here

        def query(self, promql, at=None):
            if "gpus_unreadable" in promql:
                return [Series({"Hostname": "gpu-b"}, ((at, 1.0),))]
            if "agent_info" in promql:
                return [Series({}, ((at, 2.0),))]
            return []

        def query_grid(self, promql, g):
            if promql.endswith("gpu_utilization_ratio"):
                return [GridSeries({"Hostname": "gpu-a", "gpu": "0"}, {t: 1.0 for t in g.times})]
            if promql.endswith("steps_total"):
                return [GridSeries({"Hostname": "gpu-b", "exported_job": "7", "rank": "1", "local_rank": "0",
                                    "world_size": "2"}, {t: k * 10.0 for k, t in enumerate(g.times)})]
            return []

    data = fetch_grid(FakeProm(), grid, grid.times[-1])
    assert data.unreadable == {"gpu-b"} and data.hosts == ["gpu-a", "gpu-b"]
    snap = snapshot_from(data, findings_of(data)[0])
    assert snap.unreadable == ("gpu-b",)

    async def go():
        a = ClusterApp(lambda: snap, url="http://prometheus:9090", poll=False)
        async with a.run_test(size=(160, 48)) as pilot:
            a.show_snapshot(snap)
            await pilot.pause()
            return a.query_one(HostsBody).render().plain

    body = asyncio.run(go())
    line = next(line for line in body.split("\n") if line.startswith("gpu-b"))
    assert "0 GPUs" in line and "GPUs unreadable" in line
    assert "GPUs unreadable on 1 host" in status_line(snap, "", None, None, False, None).plain


def test_host_then_job_focus_shows_that_hosts_job_and_its_findings_only():
    async def go():
        a = shown_app()
        async with a.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            await pilot.press("h", "h")  # node-b
            await pilot.press("j")
            body = a.query_one(HostsBody).render().plain
            findings = [f.host for f in a.snapshot.findings]
            from traintop.widgets.alerts_panel import AlertsBody
            shown = a.query_one(AlertsBody).render().plain
            return a.focus_host, a.focus_job, body, findings, shown

    host, job, body, findings, shown = asyncio.run(go())
    assert (host, job) == ("node-b", "1234")
    assert "node-b" in body and "r2" in body and "r3" in body and "node-a" not in body
    assert "node-b" in shown and "node-a ·" not in shown and "node-c ·" not in shown


def test_findings_scroll_and_keys_that_do_nothing_here_say_why():
    async def go():
        a = shown_app()
        said = {}
        async with a.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            alerts = a.query_one("#alerts")
            assert alerts.max_scroll_y > 0  # at 80x24 the findings run past their panel
            await pilot.press("down", "down")
            said["scrolled"] = alerts.scroll_y
            for key in ("g", "n", "s", "r", "left", "5", "enter", "x"):
                a.notice = None
                await pilot.press(key)
                said[key] = a.notice
            status = a.query_one("#status").render().plain
        return said, status

    said, status = asyncio.run(go())
    assert said.pop("scrolled") == 2
    assert all(said.values()), said
    assert "h/H focus a host" in said["g"] and "replays" in said["left"] and "? lists" in said["x"]
    assert said["x"] in status or status.strip()  # the line is drawn where the status goes


def test_the_cluster_help_wraps_at_the_width_of_its_box():
    from traintop.app.cluster import HELP

    first = HELP.split("\n\n")[0]
    assert "\n" not in first.strip()  # one paragraph: wrapped by the box, never broken by hand


def _turning_source(exc):
    """A source that answers once, then raises ``exc`` at every read (a server turned hostile)."""
    snap = fixed_snapshot()
    calls = {"n": 0}

    def source():
        calls["n"] += 1
        if calls["n"] > 1:
            raise exc
        return snap
    return source


def test_a_read_failing_mid_session_marks_the_data_stale_visibly():
    from traintop.errors import TraintopError

    async def go():
        app = ClusterApp(_turning_source(TraintopError("Prometheus at x did not answer in time")),
                         url="http://prometheus:9090", refresh=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            for _ in range(100):  # bounded: up to 10 s
                await pilot.pause(0.1)
                if "STALE" in app.query_one("#status").text.plain:
                    break
            status = app.query_one("#status").text.plain
            assert "STALE" in status and "did not answer in time" in status
            assert app.query_one("#gpus").has_class("-stale")
            assert app.is_running and app.failure is None

    asyncio.run(go())


def test_an_unexpected_error_mid_session_ends_the_view_with_one_line_and_a_failure_code():
    async def go():
        app = ClusterApp(_turning_source(RecursionError("maximum recursion depth exceeded")),
                         url="http://prometheus:9090", refresh=0.2)
        async with app.run_test(size=(80, 24)) as pilot:
            for _ in range(100):
                await pilot.pause(0.1)
                if app.failure:
                    break
        assert app.failure and "\n" not in app.failure and "RecursionError" in app.failure
        assert app.return_code == 2

    asyncio.run(go())
