"""The dashboard driven by Pilot: layout, keys, replay controls, live updates, tiny terminals."""

import asyncio

from traintop.widgets.alerts_panel import AlertsPanel
from traintop.widgets.gpu_panel import GpuPanel
from traintop.widgets.help_screen import HelpScreen
from traintop.widgets.replay_bar import ReplayBar
from traintop.widgets.status_bar import StatusBar


def run(coro):
    return asyncio.run(coro)


def alerts_text(app) -> str:
    return str(app.query_one("#alerts-body").render())


def test_one_panel_per_gpu_and_alerts_with_evidence(sim_app):
    async def go():
        app, monitor, _ = sim_app("starved,healthy", gpus=2)
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            assert len(app.query(GpuPanel)) == 2
            text = alerts_text(app)
            assert "Data starvation" in text and "loader workers" in text and "num_workers" in text
            assert app.query_one("#gpu-0").has_class("-warning")
            assert not app.query_one("#gpu-1").has_class("-warning")
            assert not app.screen.has_class("compact")
    run(go())


def test_compact_layout_in_a_tmux_pane_and_down_to_40x12(sim_app):
    async def go():
        app, _, _ = sim_app("starved")
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            assert app.screen.has_class("compact")
            assert app.query_one(GpuPanel).region.height == 3
            await pilot.resize_terminal(40, 12)
            await pilot.pause()
            assert app.screen.has_class("compact")
            await pilot.resize_terminal(160, 48)
            await pilot.pause()
            assert not app.screen.has_class("compact")
            assert app.query_one(GpuPanel).region.height == 7
    run(go())


def test_help_opens_and_closes(sim_app):
    async def go():
        app, _, _ = sim_app()
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("x")
            assert not isinstance(app.screen, HelpScreen)
    run(go())


def test_live_pause_freezes_display_but_not_sampling(sim_app):
    async def go():
        app, monitor, feed = sim_app()
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press("p")
            assert app.paused and app.query_one(StatusBar).paused
            shown = app.last_view.t
            feed.step()
            await pilot.pause()
            assert monitor.store.t_last > shown  # still sampled
            assert app.last_view.t == shown  # not redrawn
            await pilot.press("p")
            await pilot.pause()
            assert app.last_view.t == monitor.store.t_last
    run(go())


def test_feed_thread_updates_the_screen(sim_app):
    async def go():
        app, monitor, feed = sim_app(start_feed=True, interval=0.05, history_s=5)
        async with app.run_test(size=(100, 30)) as pilot:
            before = monitor.store.frames_seen
            for _ in range(40):
                await asyncio.sleep(0.05)
                if monitor.store.frames_seen > before + 5:
                    break
            await pilot.pause()
            assert monitor.store.frames_seen > before + 5
            assert app.last_view.t > feed.source.t0 + 5
    run(go())


def test_redraws_are_capped_but_the_newest_frame_is_drawn(sim_app):
    async def go():
        # sampling at 20 Hz, drawing at most 4 frames a second
        app, monitor, feed = sim_app(start_feed=True, interval=0.05, history_s=5, max_fps=4)
        draws = []
        original = app.refresh_view

        def counting():
            draws.append(monitor.store.frames_seen)
            original()
        app.refresh_view = counting
        async with app.run_test(size=(100, 30)) as pilot:
            start = monitor.store.frames_seen
            await asyncio.sleep(1.5)
            sampled = monitor.store.frames_seen - start
            feed.stop()
            await asyncio.sleep(0.4)  # the deferred redraw shows the last frame
            await pilot.pause()
            assert sampled >= 15  # sampling was not slowed down
            assert 3 <= len(draws) <= 9  # ~4 a second, not 20
            assert app.last_view.t == monitor.store.t_last
    run(go())


def test_replay_controls(demo_app):
    async def go():
        app, monitor, feed = demo_app(100)
        async with app.run_test(size=(120, 40)) as pilot:
            start_pos = feed.position
            await pilot.press("full_stop")
            assert feed.position > start_pos and not feed.playing
            await pilot.press("right")
            assert abs(feed.position - (start_pos + 10.5)) < 1.0
            await pilot.press("left")
            await pilot.press("left")
            assert feed.position < start_pos
            await pilot.press("right_square_bracket")
            assert feed.speed == 2.0
            await pilot.press("left_square_bracket", "left_square_bracket")
            assert feed.speed == 0.5
            await pilot.press("end")
            assert feed.position == feed.t_end and feed.at_end
            await pilot.press("home")
            assert feed.position == feed.t_start
            await pilot.press("5")
            assert abs((feed.position - feed.t_start) / (feed.t_end - feed.t_start) - 0.5) < 0.01
            await pilot.press("space")
            assert feed.playing
            bar = app.query_one(ReplayBar)
            assert bar.start == feed.t_start
    run(go())


def test_seek_rebuilds_history_and_alerts(demo_app):
    async def go():
        app, monitor, feed = demo_app(10)
        async with app.run_test(size=(120, 40)) as pilot:
            assert "No problems" in alerts_text(app)
            feed.seek(feed.t_start + 110)  # the data-starved phase of the real H200 run
            app.refresh_view()
            await pilot.pause()
            assert "Data starvation" in alerts_text(app)
            assert len(monitor.store) > 100  # history before the seek point was rebuilt
    run(go())


def test_replay_plays_on_its_own_clock(demo_app):
    async def go():
        app, monitor, feed = demo_app(50)
        feed.speed = 16.0
        feed.playing = True
        app.start_feed = True
        async with app.run_test(size=(120, 40)) as pilot:
            p0 = feed.position
            await asyncio.sleep(0.6)
            await pilot.pause()
            assert feed.position > p0 + 3
    run(go())


def test_record_key_writes_a_recording(tmp_path, monkeypatch, sim_app):
    from traintop.monitor import Monitor

    routes = []  # the r key records through the core's one route, like --record
    real = Monitor.start_recording
    monkeypatch.setattr(Monitor, "start_recording", lambda self, path, **kw: routes.append(path) or real(self, path, **kw))

    async def go():
        app, monitor, feed = sim_app(record_dir=str(tmp_path))
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press("r")
            assert monitor.recorder is not None
            assert app.query_one(StatusBar).recording
            for _ in range(5):
                feed.step()
            await pilot.press("r")
            assert monitor.recorder is None
            await app.workers.wait_for_complete()  # the file is closed off the UI loop
    run(go())
    files = list(tmp_path.glob("*.ttrec"))
    assert len(files) == 1 and routes == [str(files[0])]
    from traintop.recording import RecordingReader
    assert len(list(RecordingReader(str(files[0])).frames())) == 5


def test_recording_failure_is_shown_and_live_view_goes_on(sim_app):
    class Broken:
        path = "/full/disk.ttrec"

        def add(self, frame):
            from traintop.errors import RecordingError
            raise RecordingError("writing /full/disk.ttrec failed: database or disk is full")

        def alert(self, a):
            pass

        def close(self):
            pass

    async def go():
        app, monitor, feed = sim_app()
        monitor.recorder = Broken()
        async with app.run_test(size=(100, 30)) as pilot:
            feed.step()
            feed.step()
            app.refresh_view()
            await pilot.pause()
            assert "disk is full" in app.query_one(StatusBar).problem
            n = monitor.store.frames_seen
            feed.step()
            assert monitor.store.frames_seen == n + 1
    run(go())


def test_updates_continue_while_help_is_open(sim_app):
    async def go():
        app, monitor, feed = sim_app(start_feed=True, interval=0.05, history_s=5)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            shown = app.last_view.t
            await asyncio.sleep(0.5)
            await pilot.pause()
            assert app.last_view.t > shown  # the main screen kept updating underneath
            await pilot.press("escape")
            assert not isinstance(app.screen, HelpScreen)
    run(go())


def test_process_exit_keeps_history_and_says_when(sim_app):
    import dataclasses

    from traintop.widgets.process_panel import ProcessPanel

    async def go():
        app, monitor, feed = sim_app()
        async with app.run_test(size=(160, 48)) as pilot:
            n = len(monitor.store)
            last = monitor.store.latest
            ended = dataclasses.replace(last, t=last.t + 0.5,
                                        process=dataclasses.replace(last.process, alive=False, members=()))
            monitor.ingest(ended)
            app.refresh_view()
            await pilot.pause()
            text = str(app.query_one(ProcessPanel).render())
            assert "ended at" in text and "history stays" in text
            assert len(monitor.store) == n + 1 and monitor.ended_at == ended.t
    run(go())


def test_no_color_is_honoured(monkeypatch, sim_app):
    monkeypatch.setenv("NO_COLOR", "1")
    app, _, _ = sim_app()
    assert app.no_color


def test_sparklines_use_fixed_scales():
    from traintop.widgets.render import spark

    # Textual's Sparkline scales to min..max, so a flat 3 % would fill the row; ours stays at the bottom.
    assert spark([3.0, 3.0, 3.0], 0, 100, 3).plain == "▁▁▁"
    assert spark([100.0, 50.0, 0.0], 0, 100, 3).plain == "█▅▁"
    assert spark([None, 100.0], 0, 100, 4).plain == "   █"  # missing is blank, never 0


def test_process_panel_reads_the_starvation_thresholds_from_the_view():
    from traintop.rules import Thresholds
    from traintop.samples import RankSample
    from traintop.view import RankView
    from traintop.widgets.process_panel import rank_line

    rv = RankView(RankSample(pid=1, rank=0, cuda=True, input_wait=0.5), 0, None, [], [], [], [])

    def style_of_wait(thresholds):
        line = rank_line(rv, thresholds)
        start = line.plain.index("input wait")
        return {str(s.style) for s in line.spans if s.start <= start < s.end}

    assert style_of_wait(Thresholds()) == {"bold yellow"}  # 50 % ≥ the default 30 %
    assert style_of_wait(Thresholds(starvation_input_wait=0.6)) == {"dim"}
