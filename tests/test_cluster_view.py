"""The cluster view after a pause, a lost node and its return, and how its two panes share the screen."""

import asyncio
import dataclasses
import re

from test_cluster_app import fixed_data, fixed_snapshot, large_snapshot

from traintop.app.cluster import ClusterApp
from traintop.cluster.report import findings_of
from traintop.cluster.snapshot import snapshot_from
from traintop.widgets.alerts_panel import AlertsBody
from traintop.widgets.cluster_panels import HostsBody


def _silence(d, host, grid):
    """``host`` sends nothing at the instants ``grid`` (its agent stopped)."""
    for (h, _), g in d.gpus.items():
        if h == host:
            for t in grid:
                for col in (g.util, g.power, g.mem_used, g.temp, g.clock_ratio, g.reasons):
                    col.pop(t, None)
    for r in d.ranks.values():
        if r.host == host:
            for t in grid:
                r.step.pop(t, None), r.wait.pop(t, None), r.steps.pop(t, None)
    for f in d.findings:
        if f.host == host:
            f.times = [t for t in f.times if t not in grid]


def _screen(snap, size=(160, 48)):
    async def go():
        a = ClusterApp(lambda: snap, url="http://prometheus:9090", poll=False)
        async with a.run_test(size=size) as pilot:
            a.show_snapshot(snap)
            await pilot.pause()
            return a.query_one(HostsBody).render().plain, a.query_one(AlertsBody).render().plain
    return asyncio.run(go())


def test_after_a_pause_the_view_reads_at_once_and_is_not_called_stale(footer_text, monkeypatch):
    """Resumed after a pause longer than two refreshes, the top line said "STALE … no read for 11 s"
    until the next refresh came round; while paused the footer still offered "p pause", and a line
    another key had just put on the top line hid "PAUSED" for six seconds."""
    import types

    from traintop.app import cluster

    clock = {"now": 1000.0}  # the view's clock, moved by hand: a pause of a minute without waiting one
    monkeypatch.setattr(cluster, "time", types.SimpleNamespace(monotonic=lambda: clock["now"]))
    snap = fixed_snapshot()
    reads = []

    def source():
        reads.append(clock["now"])
        return snap

    async def go():
        app = ClusterApp(source, url="http://prometheus:9090", refresh=30.0)  # no timed read in this test
        async with app.run_test(size=(160, 48)) as pilot:
            while app.snapshot is None:  # the first read (a hang guard: pytest's timeout)
                await pilot.pause(0.05)
            assert "p pause" in footer_text(app) and "resume" not in footer_text(app)
            await pilot.press("x")  # a line about another key: it must not hide the pause
            await pilot.press("p")
            await pilot.pause()
            paused = app.query_one("#status").text.plain, footer_text(app)
            clock["now"] += 70.0  # more than two refreshes without a read
            n = len(reads)
            await pilot.press("p")
            await pilot.pause()
            resumed = app.query_one("#status").text.plain, footer_text(app)
            for _ in range(40):  # the read the resume started (bounded: 2 s)
                if len(reads) > n:
                    break
                await pilot.pause(0.05)
            return paused, resumed, len(reads) > n

    (paused_status, paused_footer), (status, footer), read_again = asyncio.run(go())
    assert "PAUSED" in paused_status and "p resume" in paused_footer and "p pause" not in paused_footer
    assert "STALE" not in status and "PAUSED" not in status, status
    assert "p pause" in footer and "resume" not in footer
    assert read_again


def test_a_lost_node_shows_one_age_everywhere_on_the_screen():
    """node-c's agent stopped a minute before the read: its line said "no data for 1 min 04 s", its
    finding "1 min 00 s" and the evidence "60 s without it" (three clocks: the read's end, the last
    instant of the grid, the other nodes' newest sample)."""
    d = fixed_data()
    _silence(d, "node-c", d.grid[-12:])
    hosts, findings = _screen(snapshot_from(d, findings_of(d)[0]))
    line = next(ln for ln in hosts.split("\n") if ln.startswith("node-c"))
    (age,) = re.findall(r"no data for ([^:]+):", line)
    text = " ".join(findings.split())
    assert f"Node stopped reporting · node-c · {age}" in text, (age, text)
    assert f"({age} without it)" in text, (age, text)


def test_a_straggler_node_that_went_silent_and_came_back_is_not_counted_through_the_silence():
    """node-a (both ranks) lags the whole window but its agent was away for 75 s in the middle:
    "Straggler node · 4 min 59 s" counted on through the silence, with the numbers from before it.
    What holds now is judged from the return on."""
    d = fixed_data()
    away = d.grid[20:35]
    _silence(d, "node-a", away)
    snap = snapshot_from(d, findings_of(d)[0])
    (node,) = [f for f in snap.findings if f.rule == "straggler_node"]
    assert node.host == "node-a" and node.start > away[-1], (node.start - d.grid[0])
    every = [f for f in findings_of(d)[0] if f.rule == "straggler_node"]
    assert not any(f.start < away[0] and f.end > away[-1] for f in every)  # none spans the silence
    _, findings = _screen(snap)
    head = next(ln for ln in findings.replace("\xa0", " ").split("\n") if "Straggler node" in ln)
    assert head.rstrip().endswith("2 min 04 s"), head  # from its return (175 s) to the read's end (299 s)


def _pane_heights(snap, size):
    async def go():
        a = ClusterApp(lambda: snap, url="http://prometheus:9090", poll=False)
        async with a.run_test(size=size) as pilot:
            a.show_snapshot(snap)
            await pilot.pause()
            await pilot.pause()
            hosts, findings = a.query_one("#gpus"), a.query_one("#alerts")
            body = a.query_one(AlertsBody)
            return (hosts.outer_size.height, a.query_one(HostsBody).outer_size.height,
                    findings.outer_size.height, len(body.text_lines(findings.content_size.width)))
    return asyncio.run(go())


def test_the_panes_share_the_screen_by_what_they_hold():
    """48 GPUs and one finding at 80x40: the findings kept half the screen, 12 of its 19 rows empty,
    while the GPU lines scrolled."""
    big = large_snapshot(6, 8)
    one = dataclasses.replace(big, findings=big.findings[:1])
    hosts_h, hosts_need, findings_h, findings_lines = _pane_heights(one, (80, 40))
    assert hosts_need > hosts_h  # the GPUs do not fit ...
    assert findings_h == findings_lines + 2  # ... and the finding has the rows it fills, its frame, no more
    assert hosts_h + findings_h == 40 - 2  # the rest is the GPUs' (less the top line and the footer)
    # both more than fits: half each
    hosts_h, hosts_need, findings_h, findings_lines = _pane_heights(fixed_snapshot(), (80, 24))
    assert hosts_need > hosts_h and findings_lines > findings_h - 2 and abs(hosts_h - findings_h) <= 1
