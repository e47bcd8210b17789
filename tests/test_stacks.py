"""Thread stacks from the probes: read by the client, carried on frames, stored in the recording,
rendered as text. Uses what the probes of a real stalled DDP job on two H200s sent."""

import dataclasses
import gzip
import json
import pathlib
import socket
import time

import pytest

from traintop.collectors.probe_client import ProbeClient, stack_dump
from traintop.watch.monitor import Monitor
from traintop.record.recording import RecordingReader, RecordingWriter
from traintop.samples import Frame, SessionInfo, StackDump, ThreadStack
from traintop.stacks import latest_per_process, render, where

FIX = pathlib.Path(__file__).parent / "fixtures" / "h200"


def h200_lines(name="ddp-stall"):
    with gzip.open(FIX / f"{name}-probe.jsonl.gz", "rb") as fh:
        return [line.rstrip(b"\n") for line in fh]


@pytest.fixture
def probe_server(tmp_path, monkeypatch):
    d = tmp_path / "probes"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("TRAINTOP_PROBE_DIR", str(d))
    servers = []

    def serve(pid):
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(str(d / f"probe-{pid}.sock"))
        srv.listen(1)
        servers.append(srv)
        return srv

    yield serve
    for s in servers:
        s.close()


def test_client_takes_the_stacks_a_real_stalled_rank_sent(probe_server):
    lines = [ln for ln in h200_lines() if json.loads(ln)["pid"] == 954]  # rank 0 of the H200 job
    srv = probe_server(954)
    client = ProbeClient()
    client.sample({954})
    conn, _ = srv.accept()
    conn.sendall(b"\n".join(lines) + b"\n")
    time.sleep(0.05)
    ranks = client.sample({954})
    assert ranks and ranks[0].rank == 0
    dumps = client.take_stacks()
    assert [d.reason for d in dumps] == ["requested", "stalled"]
    assert all(d.rank == 0 and d.pid == 954 for d in dumps)
    assert dumps[1].since_step >= 30 and where(dumps[1].threads[0]) == "stop.item()"
    assert client.take_stacks() == ()  # taken once
    # and a request reaches the probe as one line
    assert client.request_stacks() == 1
    assert conn.recv(100) == b"stacks\n"
    conn.close()


def test_stack_dump_rejects_malformed_and_caps_what_it_keeps():
    assert stack_dump({"stacks": "not a list"}, 1) is None
    d = stack_dump({"stacks": [{"thread": "x" * 1000, "stack": "y" * 10**6}, {"stack": 5}, 7],
                    "rank": True, "since_step": "soon", "t": float("nan")}, 9)
    assert len(d.threads) == 1 and len(d.threads[0].name) == 200 and len(d.threads[0].stack) == 64 * 1024
    assert d.rank is None and d.since_step is None and d.reason == "requested"


def _dumps():
    out = []
    for ln in h200_lines():
        msg = json.loads(ln)
        if "stacks" in msg:
            out.append(stack_dump(msg, msg["pid"]))
    return out


def test_stacks_are_stored_in_the_recording_and_read_back(tmp_path):
    dumps = _dumps()
    path = tmp_path / "s.ttrec"
    w = RecordingWriter(str(path), SessionInfo(kind="live"))
    w.add(Frame(t=1.0))
    w.add(Frame(t=2.0, stacks=tuple(dumps[:3])))
    w.add(Frame(t=3.0, stacks=tuple(dumps[3:])))
    w.close()
    r = RecordingReader(str(path))
    assert r.stacks() == sorted(dumps, key=lambda d: d.t)
    assert [f.t for f in r.frames()] == [1.0, 2.0, 3.0]


def test_a_recording_without_the_stacks_table_reads_as_none():
    r = RecordingReader(str(FIX / "ddp-stall-10hz.ttrec"))  # recorded before stacks were stored
    assert r.stacks() == []


def test_monitor_keeps_the_latest_dump_of_each_process():
    dumps = _dumps()
    m = Monitor(SessionInfo(kind="live"))
    for k, d in enumerate(dumps):
        m.ingest(Frame(t=float(k), stacks=(d,)))
    assert {d.pid for d in dumps} == set(m.stacks)
    assert all(m.stacks[pid].reason == "stalled" for pid in (954, 955))


def test_render_names_where_each_rank_hangs():
    latest = latest_per_process(_dumps(), reason="stalled")
    assert [d.rank for d in latest] == [0, 1]
    text = "\n".join(line for d in latest for line in render(d))
    assert "rank 0 (PID 954), no optimizer step for a while (taken by the probe), 30 s after its last step:" in text
    assert "ddp_cases.py\", line 134, in main — stop.item()" in text
    assert "time.sleep(args.stall_s)" in text


def test_the_stacks_screen_says_when_each_dump_was_taken():
    """In a replay (or a dump kept from a pause) the stacks are not "now": each says its time."""
    import time

    from traintop.widgets.stacks_screen import stacks_text

    latest = latest_per_process(_dumps(), reason="stalled")
    text = stacks_text(latest, "recording").plain
    for d in latest:
        assert f"taken at {time.strftime('%H:%M:%S', time.localtime(d.t))}:" in text, text


def test_render_makes_control_characters_visible():
    d = StackDump(t=0, pid=1, threads=(ThreadStack("evil\x1b]52;c;AAAA\x07", True, 'File "x", line 1\n  go()\x1b[2J\n'),))
    text = "\n".join(render(d))
    assert "\x1b" not in text and "\\x1b" in text


def test_a_request_from_the_dashboard_reaches_the_live_source():
    from traintop.watch.feeds import SourceFeed

    class Source:
        asked = 0

        def request_stacks(self):
            self.asked += 1

        def next_frame(self):
            return Frame(t=time.time())

    src = Source()
    m = Monitor(SessionInfo(kind="live"))
    feed = SourceFeed(m, src, 0.1)
    feed._tick()
    assert src.asked == 0
    m.request_stacks()
    feed._tick()
    feed._tick()
    assert src.asked == 1 and not m.stacks_wanted


def test_replay_brings_the_recorded_stacks_at_their_time(tmp_path):
    from traintop.watch.feeds import ReplayFeed

    dumps = sorted(_dumps(), key=lambda d: d.t)
    t0 = dumps[0].t - 5
    path = tmp_path / "s.ttrec"
    w = RecordingWriter(str(path), SessionInfo(kind="live"))
    for k in range(200):
        t = t0 + k * 0.5
        w.add(Frame(t=t, stacks=tuple(d for d in dumps if t - 0.5 < d.t <= t)))
    w.close()
    m = Monitor(SessionInfo(kind="replay"))
    feed = ReplayFeed(m, RecordingReader(str(path)))
    assert m.stacks == {}  # nothing asked for yet at the start
    last = dumps[-1]
    feed.seek(last.t + 1)
    assert m.stacks[last.pid] == last
    feed.seek(dumps[0].t + 0.1)
    assert set(m.stacks) == {dumps[0].pid} and m.stacks[dumps[0].pid].reason == "requested"


def test_key_s_asks_the_probes_and_shows_where_each_rank_is(sim_app):
    import asyncio

    from traintop.widgets.stacks_screen import StacksScreen

    async def go():
        app, monitor, feed = sim_app()
        feed.kind, monitor.probe_seen_at = "live", 1.0  # as a live session whose probe has spoken
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("s")
            assert isinstance(app.screen, StacksScreen) and monitor.stacks_wanted
            assert "asked the job's probes" in str(app.screen.query_one("#stacks-text").render())
            with monitor.lock:
                for d in latest_per_process(_dumps(), reason="stalled"):
                    monitor.stacks[d.pid] = d
            app.screen._refresh()  # what its 0.5-s timer does
            await pilot.pause()
            shown = str(app.screen.query_one("#stacks-text").render())
            assert "rank 0 (PID 954), no optimizer step for a while" in shown and "stop.item()" in shown
            await pilot.press("x")
            assert not isinstance(app.screen, StacksScreen)
    asyncio.run(go())


def test_key_s_says_why_no_stack_can_come_where_none_can(sim_app, demo_app):
    import asyncio

    from traintop.widgets.stacks_screen import StacksScreen

    def shown(app):
        return str(app.screen.query_one("#stacks-text").render())

    async def go():
        app, monitor, feed = sim_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("s")
            assert "none from the simulator" in shown(app) and not monitor.stacks_wanted
            await pilot.press("x")
            feed.kind, monitor.probe_seen_at = "live", None  # live, but no probe has ever spoken
            await pilot.press("s")
            assert "no probe watches a job here" in shown(app) and not monitor.stacks_wanted
            await pilot.press("x")
            monitor.probe_seen_at, monitor.ended_at = 1.0, 2.0  # its probe spoke, then the job ended
            await pilot.press("s")
            assert "the job has ended" in shown(app) and not monitor.stacks_wanted
        app, _, _ = demo_app(30)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("s")
            assert isinstance(app.screen, StacksScreen) and "none in this recording" in shown(app)
    asyncio.run(go())


def test_the_stacks_screen_says_when_the_probes_did_not_answer(sim_app):
    import asyncio

    from traintop.widgets.stacks_screen import ANSWER_WAIT_S, StacksScreen

    now = [100.0]

    async def go():
        app, monitor, _ = sim_app()
        async with app.run_test(size=(120, 40)) as pilot:
            screen = StacksScreen(monitor, "asked", clock=lambda: now[0])
            await app.push_screen(screen)
            await pilot.pause()
            assert "asked the job's probes" in str(screen.query_one("#stacks-text").render())
            now[0] += ANSWER_WAIT_S + 0.1
            screen._refresh()
            assert "no answer from the job's probes" in str(screen.query_one("#stacks-text").render())
            # stacks that did answer the ask are not called older once the wait is over
            fresh = dataclasses.replace(_dumps()[0], t=time.time())
            with monitor.lock:
                monitor.stacks[fresh.pid] = fresh
            screen._refresh()
            shown = str(screen.query_one("#stacks-text").render())
            assert "older" not in shown and "Thread stacks, innermost calls last" in shown
    asyncio.run(go())


def test_analyze_prints_where_each_rank_hangs(tmp_path):
    """The H200 stall recording with the stacks its probes sent, as a recording made now stores them."""
    from traintop.reports.analyze import analyze, render_json, render_text

    src = RecordingReader(str(FIX / "ddp-stall-10hz.ttrec"))
    dumps = sorted(_dumps(), key=lambda d: d.t)
    path = tmp_path / "stall.ttrec"
    w = RecordingWriter(str(path), src.info)
    prev = None
    for f in src.frames():
        w.add(Frame(t=f.t, gpus=f.gpus, host=f.host, process=f.process, ranks=f.ranks,
                    stacks=tuple(d for d in dumps if (prev is None or d.t > prev) and d.t <= f.t)))
        prev = f.t
    w.close()
    report = analyze(RecordingReader(str(path)), name="stall.ttrec", rerun=True)
    text = render_text(report)
    assert "Training stalled" in text
    where = text.split("Where the job's threads were")[1]
    assert "rank 0 (PID 954)" in where and "no optimizer step for a while (taken by the probe), 30 s after its last step" in where
    assert "stop.item()" in where and "time.sleep(args.stall_s)" in where
    assert [d["label"] for d in report.stacks] == ["rank 0", "rank 1"]  # the stall's dumps, ranks in order
    assert json.loads(render_json(report))["stacks"][0]["threads"][0]["main"] is True


def test_the_stacks_screen_scrolls_with_the_arrows_and_closes_with_any_other_key(sim_app):
    import asyncio

    from traintop.widgets.stacks_screen import StacksScreen

    async def go():
        app, monitor, feed = sim_app()
        feed.kind, monitor.probe_seen_at = "live", 1.0
        async with app.run_test(size=(60, 12)) as pilot:
            with monitor.lock:
                for d in latest_per_process(_dumps(), reason="stalled"):
                    monitor.stacks[d.pid] = d
            await pilot.press("s")
            await pilot.pause()
            box = app.screen.query_one("#help-box")
            assert isinstance(app.screen, StacksScreen) and box.max_scroll_y > 0  # more than fits
            await pilot.press("down", "down")
            await pilot.pause()
            assert isinstance(app.screen, StacksScreen) and box.scroll_y == 2
            await pilot.press("end")
            await pilot.pause()
            assert box.scroll_y == box.max_scroll_y
            await pilot.press("home")
            await pilot.pause()
            assert box.scroll_y == 0
            await pilot.press("x")
            assert not isinstance(app.screen, StacksScreen)
    asyncio.run(go())


def test_stacks_shown_after_the_job_ended_say_so_and_the_popup_takes_a_wide_terminal(sim_app):
    import asyncio

    from traintop.widgets.stacks_screen import StacksScreen

    async def go():
        app, monitor, feed = sim_app()
        feed.kind, monitor.probe_seen_at, monitor.ended_at = "live", 1.0, 2.0
        with monitor.lock:
            for d in latest_per_process(_dumps(), reason="stalled"):
                monitor.stacks[d.pid] = d
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.press("s")
            await pilot.pause()
            assert isinstance(app.screen, StacksScreen)
            text = str(app.screen.query_one("#stacks-text").render())
            width = app.screen.query_one("#help-box").outer_size.width
        return text, width

    text, width = asyncio.run(go())
    assert "The job has ended: these stacks were taken before it did (the latest at" in text
    assert "rank 0 (PID 954), no optimizer step for a while" in text and "(PID 954) (PID" not in text
    assert width > 140  # not the help's 84 columns


def test_analyze_names_a_process_without_a_rank_by_its_pid_once():
    from traintop.reports.analyze import Report, render_text

    stack = {"t_s": 3.0, "label": "PID 23472", "pid": 23472, "rank": None, "reason": "requested",
             "since_step_s": None, "threads": []}
    text = render_text(Report("x", "recording", 10.0, 10, 1.0, [], [], 0.0, 0.0, stacks=[stack]))
    assert "PID 23472 at 3 s, on request:" in text and "(PID 23472)" not in text
