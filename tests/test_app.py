"""The dashboard driven by Pilot: layout, keys, replay controls, live updates, tiny terminals."""

import asyncio
import time
import re

from traintop.widgets.alerts_panel import AlertsPanel
from traintop.widgets.gpu_panel import GpuPanel
from traintop.widgets.help_screen import HelpScreen
from traintop.widgets.process_panel import ProcessPanel
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


def test_at_20x8_the_alerts_drop_their_frame_rather_than_lose_its_bottom_edge(demo_app):
    """Two rows for the alerts: a frame would show its top edge and one row, cut below."""
    def rows(app):
        return ["".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips()]

    async def go():
        app, _, _ = demo_app(30)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            await pilot.resize_terminal(20, 8)
            await pilot.pause()
            alerts = app.query_one(AlertsPanel)
            assert alerts.has_class("-cramped") and alerts.outer_size.height == 2
            screen = rows(app)
            assert not any("Alerts" in r for r in screen), screen  # no top edge left without its bottom
            assert sum(r.count("╭") for r in screen) == sum(r.count("╰") for r in screen)
            assert any("No problems" in r for r in screen)
            await pilot.resize_terminal(80, 24)
            await pilot.pause()
            assert not alerts.has_class("-cramped")
            assert any("╭─ Alerts" in r for r in rows(app)) and any("╰" in r for r in rows(app))
    run(go())


def test_help_scrolls_closes_with_esc_q_or_question_mark_and_ignores_other_keys(demo_app):
    from textual import events

    async def go():
        app, _, _ = demo_app(45)
        async with app.run_test(size=(80, 24)) as pilot:
            for close in ("escape", "q", "question_mark"):
                await pilot.press("question_mark")
                assert isinstance(app.screen, HelpScreen)
                # two keys typed fast, before the screen handles either (this popped the screen twice)
                app.post_message(events.Key("a", "a"))
                app.post_message(events.Key("b", "b"))
                await pilot.pause()
                assert isinstance(app.screen, HelpScreen) and app.is_running
                await pilot.press("p", "r")  # the dashboard's keys do not act behind the help
                assert not app.paused and app.monitor.recorder is None
                await pilot.press(close)
                assert not isinstance(app.screen, HelpScreen) and app.is_running
            # a close key twice in a row closes the help once and never pops the dashboard
            await pilot.press("question_mark")
            app.post_message(events.Key("escape", None))
            app.post_message(events.Key("escape", None))
            await pilot.pause()
            assert not isinstance(app.screen, HelpScreen) and app.is_running
            # cut off at 80x24: the scrolling keys scroll it
            await pilot.press("question_mark")
            box = app.screen.query_one("#help-box")
            assert box.max_scroll_y > 0
            await pilot.press("down", "down")
            assert box.scroll_y == 2
            await pilot.press("end")
            assert box.scroll_y == box.max_scroll_y
            await pilot.press("home")
            assert box.scroll_y == 0
            assert isinstance(app.screen, HelpScreen)
        assert app.return_code in (0, None)
    run(go())


def test_an_uncaught_exception_gives_a_non_zero_exit(monkeypatch, sim_app):
    import argparse

    from traintop import cli
    from traintop.app.main import TraintopApp

    def broken(self):
        raise RuntimeError("a bug")

    original_run = TraintopApp.run

    async def press_help(pilot):
        await pilot.press("question_mark")

    monkeypatch.setattr(TraintopApp, "action_help", broken)
    monkeypatch.setattr(cli, "has_terminal", lambda: True)  # pytest's captured output is no terminal
    monkeypatch.setattr(TraintopApp, "run", lambda self: original_run(self, headless=True, size=(80, 24),
                                                                         auto_pilot=press_help))
    _, monitor, feed = sim_app()
    from traintop.watch.session import Session

    assert cli._run_app(argparse.Namespace(fps=2), Session(monitor, feed)) != 0




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
            changes = monitor.alert_changes
            t0 = time.monotonic()
            await asyncio.sleep(1.5)
            sampled = monitor.store.frames_seen - start
            feed.stop()
            await asyncio.sleep(0.4)  # the deferred redraw shows the last frame
            await pilot.pause()
            elapsed = time.monotonic() - t0  # under load the sleeps run long: the cap is per second
            assert sampled >= 15  # sampling was not slowed down
            # ~4 a second, not 20; a finding that starts or ends is drawn at once, outside the cap
            assert 3 <= len(draws) <= 4 * elapsed + 3 + (monitor.alert_changes - changes), (len(draws), elapsed)
            assert app.last_view.t == monitor.store.t_last
    run(go())


def test_a_finding_is_drawn_at_once_whatever_the_redraw_cap(sim_app):
    async def go():
        # one routine redraw every 20 s at the most; the loader starves from the first sample
        app, monitor, feed = sim_app("starved", history_s=5, max_fps=0.05)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            assert "Data starvation" not in alerts_text(app)
            before = monitor.alert_changes
            for _ in range(200):  # 100 s of samples, each announced to the app as the feed does
                feed.step()
                app._notify_from_feed()
                await pilot.pause()
                if monitor.alert_changes != before:
                    break
            assert monitor.alert_changes != before, "the simulated loader never raised a finding"
            await pilot.pause()
            assert "Data starvation" in alerts_text(app)  # drawn with the frame that raised it
            assert app.last_view.t == monitor.store.t_last
            feed.step()
            app._notify_from_feed()
            await pilot.pause()
            assert app.last_view.t < monitor.store.t_last  # a routine frame still waits for the cap
    run(go())


async def press(pilot, *keys):
    """Press keys one by one, each replay command done (they run on a worker) before the next."""
    for key in keys:
        await pilot.press(key)
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()


def test_replay_controls(demo_app):
    async def go():
        app, monitor, feed = demo_app(100)
        async with app.run_test(size=(120, 40)) as pilot:
            start_pos = feed.position
            await press(pilot, "full_stop")
            assert feed.position > start_pos and not feed.playing
            await press(pilot, "right")
            assert abs(feed.position - (start_pos + 10.5)) < 1.0
            await press(pilot, "left", "left")
            assert feed.position < start_pos
            await press(pilot, "right_square_bracket")
            assert feed.speed == 2.0
            await press(pilot, "left_square_bracket", "left_square_bracket")
            assert feed.speed == 0.5
            await press(pilot, "end")
            assert feed.position == feed.t_end and feed.at_end
            await press(pilot, "home")
            assert feed.position == feed.t_start
            await press(pilot, "5")
            assert abs((feed.position - feed.t_start) / (feed.t_end - feed.t_start) - 0.5) < 0.01
            await press(pilot, "space")
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
    from traintop.watch.monitor import Monitor

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
    from traintop.record.recording import RecordingReader
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


def test_a_scrolling_sparkline_reuses_its_previous_row_and_draws_what_a_fresh_one_draws():
    import random

    from traintop.widgets import render

    def fresh(vals, lo, hi, width):
        vals = vals[-width:]
        span = (hi - lo) or 1.0
        return " " * (width - len(vals)) + "".join(render._spark_char(v, lo, hi, span, " ") for v in vals)

    rng = random.Random(0)
    series: list = []
    drawn = []
    counted = render._spark_char
    calls = [0]

    def counting(*a):
        calls[0] += 1
        return counted(*a)

    render._spark_char = counting
    try:
        for _ in range(400):
            series.append(rng.choice([None, rng.uniform(-10, 110), 0.0, 100.0]))
            for lo, hi, width in ((0, 100, 120), (0, 100, 7), (20, 93, 30), (0, 0, 5)):
                drawn.append((render.spark(series[-240:], lo, hi, width).plain, series[-240:], lo, hi, width))
    finally:
        render._spark_char = counted
    assert calls[0] < 4 * 400 * 2  # one new column a sample, not the whole row (~160 a row here)
    for plain, vals, lo, hi, width in drawn:
        assert plain == fresh(vals, lo, hi, width)


def test_process_panel_reads_the_starvation_thresholds_from_the_view():
    from traintop.rules import Thresholds
    from traintop.samples import RankSample
    from traintop.reports.view import RankView
    from traintop.widgets.process_panel import rank_line

    rv = RankView(RankSample(pid=1, rank=0, cuda=True, input_wait=0.5), 0, None, [], [], [], [])

    def style_of_wait(thresholds):
        line = rank_line(rv, thresholds).to_text()
        start = line.plain.index("input\u00a0wait")
        return {str(s.style) for s in line.spans if s.start <= start < s.end}

    assert style_of_wait(Thresholds()) == {"bold yellow"}  # 50 % ≥ the default 30 %
    assert style_of_wait(Thresholds(starvation_input_wait=0.6)) == {"dim"}


def test_gpu_line_marks_information_apart_from_alerts(demo_app):
    async def go():
        app, monitor, _ = demo_app(45)  # the healthy phase: only the power-cap information is up
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            assert [a.severity for a in app.last_view.active] == [1]
            line = app.query_one(GpuPanel).render().plain.splitlines()[0]
            assert "ℹ info" in line and "▲" not in line and "alert" not in line
            assert not app.query_one(AlertsPanel).has_class("-firing")
    run(go())


def no_gpu_recording(tmp_path, monkeypatch) -> str:
    """A short live recording of a host with no GPU."""
    from traintop.watch import sessions
    from traintop.collectors import nvml
    from traintop.errors import NoGpuError

    def no_nvml(*a, **k):
        raise NoGpuError("NVML: no GPU")

    monkeypatch.setattr(nvml, "NvmlCollector", no_nvml)
    path = str(tmp_path / "nogpu.ttrec")
    monitor, feed = sessions.live_session(0.1, record=path, require_gpu=False)
    for _ in range(3):
        feed.step()
    feed.stop()
    monitor.close()
    return path


def test_a_gpu_less_recording_says_no_gpu_once_and_claims_no_gpu_figures(tmp_path, monkeypatch):
    from traintop.watch import sessions
    from traintop.app.factory import build_app

    monitor, feed = sessions.replay_session(no_gpu_recording(tmp_path, monkeypatch))
    feed.playing = False
    feed.seek(feed.t_end)
    app = build_app(monitor, feed, mode="replay", start_feed=False)

    async def go():
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            status = app.query_one(StatusBar).render().plain
            assert status.count("no GPU") == 1
            text = alerts_text(app)
            assert "No problems detected" in text and "host CPU" in text
            assert "GPU utilization" not in text and "power" not in text and "temperature" not in text
            # no blank GPU column: the alerts on top, host and job across the whole width below
            side, alerts = app.query_one("#side").region, app.query_one(AlertsPanel).region
            assert side.width == alerts.width == 160 and side.y >= alerts.bottom
            assert app.query_one("#process").region.bottom == 48 - 1  # down to the footer
            await pilot.resize_terminal(60, 20)  # a pane: the alerts take the rows above two lines
            await pilot.pause()
            assert app.query_one(AlertsPanel).region.bottom == app.query_one("#host").region.y
            assert app.query_one("#process").region.bottom == 20 - 1
    run(go())


def test_a_job_on_a_host_without_a_gpu_gets_its_processes_and_memory_over_time_not_blank_rows():
    """Without a GPU memory chart (no GPU, no CUDA in the job) the process panel's rows go to the
    job's processes, the busiest first, and its resident memory over time."""
    from traintop.watch import sessions
    from traintop.app.factory import build_app
    from traintop.watch.feeds import Feed
    from traintop.samples import Frame, HostSample, ProcInfo, ProcessSample, RankSample

    monitor = sessions._monitor(sessions.no_gpu_info(1.0, "NVML: no GPU"), 1.0, None)
    for k in range(60):
        members = (ProcInfo(100, "python", 60.0, 900 << 20, 9),
                   ProcInfo(101, "pt_data_worker", 99.0, 300 << 20, 2, is_loader_worker=True, ppid=100),
                   ProcInfo(102, "pt_data_worker", 97.0, (300 << 20) + k * (8 << 20), 2, is_loader_worker=True, ppid=100))
        proc = ProcessSample(pid=100, alive=True, name="python", cmdline="python train.py", cpu_percent=256.0,
                             rss=sum(m.rss for m in members), threads=13, members=members)
        rank = RankSample(pid=100, cuda=False, steps=10 * k, steps_per_s=10.0, input_wait=0.6, loader=True)
        monitor.ingest(Frame(t=1_000_000.0 + k, host=HostSample(cpu_percent=80.0, per_core=(80.0, 80.0)),
                             process=proc, ranks=(rank,)))
    app = build_app(monitor, Feed(monitor, 1.0), mode="live", start_feed=False)

    async def go():
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            panel = app.query_one(ProcessPanel)
            return panel.render().plain.splitlines(), panel.content_size.height

    lines, height = run(go())
    text = "\n".join(lines)
    assert "3 processes, the busiest first" in text
    rows = [x for x in lines if re.match(r"PID \d+ ", x)]
    assert [r.split()[1] for r in rows] == ["101", "102", "100"] and "loader worker" in rows[0], text
    assert "RSS of the job's processes (host memory)" in text  # its chart, below
    assert len(lines) >= height - 1 and sum(not x.strip() for x in lines) <= 2, text  # no run of blank rows


def test_big_terminals_give_the_alerts_the_rows_the_gpus_leave(sim_app):
    async def go():
        app, _, _ = sim_app("starved,memory_creep", gpus=2)
        for size in ((160, 48), (200, 50)):
            async with app.run_test(size=size) as pilot:
                await pilot.pause()
                alerts = app.query_one(AlertsPanel)
                left = app.query_one("#left").region
                gpu_bottom = max(p.region.bottom for p in app.query(GpuPanel))
                assert alerts.region.y == gpu_bottom and alerts.region.bottom == left.bottom
                assert alerts.max_scroll_y == 0  # both GPUs' alerts, every remedy, on screen
                assert len(app.last_view.active) >= 2
            app, _, _ = sim_app("starved,memory_creep", gpus=2)
    run(go())


def test_alerts_scroll_with_keys_the_footer_shows_and_pause_says_resume(sim_app, footer_text):
    async def go():
        app, _, _ = sim_app("starved,memory_creep", gpus=2)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            alerts = app.query_one(AlertsPanel)
            assert alerts.max_scroll_y > 0
            footer = footer_text(app)
            assert "alerts" in footer  # the rendered line: test_the_footer_separates_every_item_with_one_space
            assert "p pause" in footer
            await pilot.press("down", "down")
            assert alerts.scroll_y == 2
            await pilot.press("pagedown")
            assert alerts.scroll_y > 2
            await pilot.press("up")
            await pilot.press("p")
            await pilot.pause()
            assert "p resume" in footer_text(app) and "p pause" not in footer_text(app)
            await pilot.press("p")
            await pilot.pause()
            assert "p pause" in footer_text(app)
    run(go())


def test_wrapped_alert_lines_hang_and_numbers_keep_their_units(sim_app):
    from rich.text import Text

    from traintop.widgets.wrap import NBSP, hang_wrap, keep_units

    s = keep_units("  GPU 0 idle 34 % of the last 20 s in 1.0 s gaps (mean utilization 63 %) while 2 of 2 "
                   "loader workers sit at 90 % CPU and memory is 22.5 GiB")
    for width in range(14, 60):
        lines = [t.plain for t in hang_wrap(Text(s), width, 2)]
        assert all(len(x) <= width for x in lines)
        assert all(x.startswith("  ") and not x.startswith("   ") for x in lines)
        assert " ".join(x.strip() for x in lines) == s.strip()
        assert not any(re.search(r"\d$", a) and re.match(r"\s*(%|s\b|GiB)", b) for a, b in zip(lines, lines[1:]))
    assert f"34{NBSP}%" in s and f"22.5{NBSP}GiB" in s and f"GPU{NBSP}0" in s

    async def go():
        app, _, _ = sim_app("starved")
        async with app.run_test(size=(60, 30)) as pilot:
            await pilot.pause()
            lines = alerts_text(app).splitlines()
            ev = [k for k, x in enumerate(lines) if x.startswith("  ") and "idle" in x][0]
            assert lines[ev + 1].startswith("  ") and lines[ev + 1].strip()  # the evidence wraps, hanging
            assert not any(re.search(r"\d$", a) and re.match(r"\s*(%|s\b|GiB|W\b)", b)
                           for a, b in zip(lines, lines[1:]))
    run(go())


def test_a_narrow_pane_shows_the_input_wait(attached_app):
    async def go():
        app, _, _ = attached_app("attach-starved-probe.ttrec", 30)
        async with app.run_test(size=(60, 20)) as pilot:
            await pilot.pause()
            from traintop.widgets.process_panel import ProcessPanel
            panel = app.query_one(ProcessPanel)
            shown = "".join(seg.text for seg in panel.render_line(0))
            assert "input wait" in shown
    run(go())


def test_at_80_columns_the_process_line_keeps_goodput_mfu_and_input_wait_and_cuts_only_whole_parts(sim_app):
    """The compact process line of a probed job: where its time goes first; what does not fit is
    left out whole ("…"), never cut inside a figure ("bf16 · MF…")."""
    async def go():
        app, _, _ = sim_app("starved")
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            panel = app.query_one(ProcessPanel)
            return "".join(seg.text for seg in panel.render_line(0)).rstrip()

    shown = run(go())
    assert re.search(r"goodput \d+ % · MFU \d+ % · input wait \d+ %", shown), shown
    assert len(shown) <= 80 and not re.search(r"\S…", shown), shown  # whole parts, then " …"


def test_ctrl_c_quits_as_q_does_from_the_dashboard_and_its_help(demo_app):
    """Not Textual's stock notice ("Do you want to quit? Press ctrl+q"): Ctrl-C quits."""
    async def go(keys):
        app, _, _ = demo_app(100)
        said = []
        app.say = lambda message, *a, **k: said.append(message)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            await pilot.press(*keys)
            await pilot.pause()
            return app.is_running, app.return_code, said

    for keys in (["ctrl+c"], ["question_mark", "ctrl+c"], ["s", "ctrl+c"]):
        running, code, said = run(go(keys))
        assert not running and code == 0, (keys, said)
        assert not any("quit" in s for s in said), said


def test_messages_show_in_the_status_line_and_cover_no_panel(sim_app):
    from textual.widgets._toast import Toast

    async def go():
        app, _, _ = sim_app(banner="NVML not found; playing the embedded demo")
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            assert "NVML not found" in app.query_one(StatusBar).render().plain
            assert not app.query(Toast)
            app.notify("[b]ctrl+q[/b] to quit")
            await pilot.pause()
            assert "ctrl+q to quit" in app.query_one(StatusBar).render().plain and not app.query(Toast)
    run(go())


def test_a_banner_too_long_for_80_columns_is_said_a_sentence_at_a_time(demo_app, screen_lines, monkeypatch):
    from traintop.app import main as app_main

    monkeypatch.setattr(app_main, "BANNER_PART_S", 1.0)
    banner = ("No GPU here: playing the embedded demo (recorded on an H200). "
              "NVML Shared Library Not Found (libnvidia-ml.so.1: cannot open shared object file).")

    async def go():
        app, _, _ = demo_app(30, banner=banner)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            top = screen_lines(app)[0]
            assert "No GPU here: playing the embedded demo (recorded on an H200)." in top, top  # whole
            await pilot.pause(1.2)
            top = screen_lines(app)[0]
            assert "NVML Shared Library Not Found" in top and "No GPU here" not in top, top
        app, _, _ = demo_app(30, banner=banner)
        async with app.run_test(size=(200, 24)) as pilot:  # room for all of it: said at once
            await pilot.pause()
            assert banner in screen_lines(app)[0]
    run(go())


def test_a_short_top_line_keeps_the_gpus_and_whichever_other_parts_fit_whole():
    from traintop.reports.status_text import fit_session

    parts = [("host", "simulated"), ("gpus", "16× NVIDIA H200"), ("driver", "driver 580.159.04 (simulated)"),
             ("label", "simulated: healthy,starved,underused,thermal,memory_creep,idle,healthy,healthy")]
    assert fit_session(parts, 200) == " · ".join(t for _, t in parts)
    assert fit_session(parts, 58) == "simulated · 16× NVIDIA H200"  # the label does not fit; the host still does
    assert fit_session(parts, 60) == "simulated · 16× NVIDIA H200 · driver 580.159.04 (simulated)"
    assert fit_session(parts, 15) == "16× NVIDIA H200" and fit_session(parts, 14) == ""  # never a name cut


def test_the_demo_names_itself_neutrally_and_its_top_line_fits_160_and_80_columns(demo_app, screen_lines):
    """No path of the machine it was recorded on; at 160 columns its top line whole, banner and all;
    at 80 whole parts left out (the driver first), never one cut inside."""
    from traintop.cli import DEMO_BANNER
    from traintop.record.recording import RecordingReader
    from traintop.watch.sessions import demo_path

    reader = RecordingReader(demo_path())
    assert reader.info.label == "demo: a real H200 session"
    cmdlines = {f.process.cmdline for f in reader.frames() if f.process is not None}
    assert cmdlines and not any(word.startswith("/") for c in cmdlines for word in c.split()), cmdlines

    async def top(size, banner):
        app, _, _ = demo_app(100, banner=DEMO_BANNER if banner else None)
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            return screen_lines(app)[0].rstrip()

    wide = run(top((160, 48), banner=True))  # the first seconds of `traintop demo`
    assert DEMO_BANNER in wide and "h200 · 1× NVIDIA H200 · driver 580.159.04 · demo: a real H200 session" in wide
    assert "…" not in wide and "/" not in wide, wide
    with_banner, after = run(top((80, 24), banner=True)), run(top((80, 24), banner=False))
    assert DEMO_BANNER in with_banner and len(with_banner) <= 80 and "…" not in with_banner, with_banner
    assert len(after) <= 80 and "…" not in after, after
    assert "1× NVIDIA H200 · demo: a real H200 session" in after and "driver" not in after, after


MIX = "healthy,starved,underused,thermal,memory_creep,idle,healthy,healthy"


def visible_gpus(app) -> set[int]:
    """The GPUs whose figures are on screen: a visible panel, or a row of the table."""
    from traintop.widgets.gpu_table import GpuTable

    shown = {p.index for p in app.query(GpuPanel) if p.display and p.region.height}
    table = app.query_one(GpuTable)
    if table.display:
        for line in table.render().plain.splitlines():
            m = re.match(r"GPU (\d+) ", line)
            if m:
                shown.add(int(m.group(1)))
    return shown


def test_eight_and_sixteen_gpus_all_on_screen_in_a_tmux_pane(sim_app):
    async def go():
        for gpus, size in ((8, (80, 24)), (16, (80, 24)), (8, (160, 48)), (16, (120, 36)), (4, (80, 24))):
            app, _, _ = sim_app(MIX, gpus=gpus)
            async with app.run_test(size=size) as pilot:
                await pilot.pause()
                assert visible_gpus(app) == set(range(gpus)), (gpus, size)
                assert app.query_one("#host").region.height and app.query_one("#process").region.height
                assert app.query_one(AlertsPanel).region.height >= 4
                assert "more GPUs" not in app.query_one("#gpu-table").render().plain
    run(go())


def test_too_many_gpus_for_even_one_line_each_page_with_n(sim_app, footer_text):
    async def go():
        app, _, _ = sim_app(MIX, gpus=16)
        async with app.run_test(size=(60, 16)) as pilot:
            await pilot.pause()
            first = visible_gpus(app)
            assert 0 < len(first) < 16
            assert f"+{16 - len(first)} more GPUs" in app.query_one("#gpu-table").render().plain
            assert "n more GPUs" in footer_text(app)
            seen = set(first)
            for _ in range(5):
                await pilot.press("n")
                seen |= visible_gpus(app)
            assert seen == set(range(16))
            await pilot.resize_terminal(80, 24)  # room for all: no page key
            await pilot.pause()
            assert visible_gpus(app) == set(range(16)) and "more GPUs" not in footer_text(app)
    run(go())


def test_g_focuses_one_gpus_full_panel_and_esc_goes_back(sim_app, footer_text):
    async def go():
        app, _, _ = sim_app(MIX, gpus=8)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            assert app.gpu_mode == "table" and "g one GPU" in footer_text(app)
            assert "all GPUs" not in footer_text(app)
            await pilot.press("g")
            assert app.focused_gpu == 0 and visible_gpus(app) == {0}
            panel = app.query_one("#gpu-0", GpuPanel)
            assert panel.region.height == 7 and "util" in panel.render().plain  # the full panel, in a pane
            assert "esc all GPUs" in footer_text(app)
            await pilot.press("g", "g")
            assert app.focused_gpu == 2 and visible_gpus(app) == {2}
            await pilot.press("G")
            assert app.focused_gpu == 1
            await pilot.press("escape")
            assert app.focused_gpu is None and visible_gpus(app) == set(range(8))
            await pilot.press("G")  # backwards from all: the last GPU
            assert app.focused_gpu == 7
    run(go())


def test_one_gpu_has_no_focus_key(sim_app, footer_text, screen_lines):
    async def go():
        app, _, _ = sim_app("starved")
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            assert "one GPU" not in footer_text(app)
            await pilot.press("g")
            await pilot.pause()
            assert app.focused_gpu is None
            assert "One GPU only: nothing to focus." in screen_lines(app)[0]  # never silence
    run(go())


def test_views_hold_frozen_alerts_the_engine_cannot_change(sim_app):
    import dataclasses

    from traintop.reports.view import build_view

    _, monitor, feed = sim_app("starved")
    view = build_view(monitor)
    live = [a for a in monitor.engine.alerts if a.active]
    assert live and view.active
    before = [(a.evidence, a.severity, a.end, a.remedies) for a in view.active]
    with monitor.lock:  # what the engine does on the feed's thread: a change is a new record
        monitor.engine.close_all(monitor.store.t_last)
    assert not monitor.engine.active
    assert [(a.evidence, a.severity, a.end, a.remedies) for a in view.active] == before
    assert all(a.active for a in view.active)
    for a in (view.active[0], live[0]):
        try:
            a.evidence = "x"
        except dataclasses.FrozenInstanceError:
            pass
        else:
            raise AssertionError("a finding can be changed in place")


def test_replay_keys_exist_only_in_replay_and_record_only_live(sim_app, demo_app, footer_text, screen_lines):
    async def go():
        app, monitor, feed = sim_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            keys = app.screen.active_bindings
            for k in ("left", "right", "comma", "full_stop", "home", "end", "5", "left_square_bracket"):
                assert keys[k].binding.action == "unavailable('seek')", k  # live: they only say why
            assert "r" in keys and "seek" not in footer_text(app) and "r record" in footer_text(app)
            t = app.last_view.t
            await pilot.press("right", "5", "home")  # nothing moves, nothing breaks, a line says why
            await pilot.pause()
            assert app.is_running and app.last_view.t == t
            assert "Live data: seek, step and speed apply to replays." in screen_lines(app)[0]
            await pilot.press("n")  # one GPU: no page to turn
            await pilot.pause()
            assert "All the GPUs fit on the screen: no next page." in screen_lines(app)[0]
        app, monitor, feed = demo_app(100)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            keys = app.screen.active_bindings
            assert {"left", "right", "comma", "full_stop", "home", "end", "5"} <= set(keys)
            assert keys["r"].binding.action != "record" and "record" not in footer_text(app)
            assert "seek" in footer_text(app)
            await pilot.press("r")
            await pilot.pause()
            assert monitor.recorder is None
            assert "r records live data: this is a recording already." in screen_lines(app)[0]  # whole at 80 columns
    run(go())


def test_seeks_run_off_the_ui_thread_and_coalesce(demo_app):
    import threading

    async def go():
        app, monitor, feed = demo_app(60)
        release = threading.Event()
        started = threading.Event()
        calls = []
        original = feed.seek

        def slow_seek(t):
            calls.append((t, threading.current_thread() is threading.main_thread()))
            started.set()
            release.wait(10)
            original(t)
        feed.seek = slow_seek
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            p0 = feed.position
            await pilot.press("right")
            assert started.wait(5)
            # the first seek is stuck; the UI still answers, and two more presses wait as one
            await pilot.press("right", "right")
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("escape")
            assert app.query_one(ReplayBar).position == p0 + 30  # the target shows at once
            release.set()
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert [t for t, _ in calls] == [p0 + 10, p0 + 30]
            assert not any(on_main for _, on_main in calls)
            assert feed.position == p0 + 30
            assert app.last_view.t <= feed.position and app.last_view.t > p0 + 25  # drawn after the seek
    run(go())


def test_thread_stacks_screen_closes_once_however_fast_keys_arrive(demo_app):
    """Found on an H200 by random keys at 80x24: 's' then two fast keys popped the dashboard
    itself (ScreenStackError, the app died)."""
    from textual import events

    from traintop.widgets.stacks_screen import StacksScreen

    async def go():
        app, _, _ = demo_app(45)
        async with app.run_test(size=(80, 24)) as pilot:
            for _ in range(2):
                await pilot.press("s")
                assert isinstance(app.screen, StacksScreen)
                app.post_message(events.Key("a", "a"))
                app.post_message(events.Key("b", "b"))
                app.post_message(events.Key("escape", None))
                await pilot.pause()
                assert not isinstance(app.screen, StacksScreen) and app.is_running
    run(go())


def test_a_mouse_drag_starts_no_text_selection_while_panels_redraw(demo_app):
    """Textual's selection crashed inside Textual when a drag crossed panels that were redrawn
    (found by the monkey test in replay): the dashboard leaves selecting to the terminal."""
    async def go():
        app, monitor, feed = demo_app(100, mode="replay")
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            await pilot.mouse_down(offset=(10, 3))
            await pilot.hover(offset=(120, 30))
            feed.step()
            app.refresh_view()
            await pilot.pause()
            await pilot.mouse_up(offset=(120, 30))
            await pilot.pause()
            assert not app.screen._selecting and app.screen.get_selected_text() is None
    run(go())


def test_the_footer_separates_every_item_with_one_space(sim_app, screen_lines):
    async def go():
        for gpus, size, keys, want in [
            (8, (80, 24), (), "q quit ? help p pause ↑↓ alerts g one GPU r record"),
            (1, (80, 24), (), "q quit ? help p pause ↑↓ alerts r record"),
            (8, (160, 48), ("g",), "q quit ? help p pause ↑↓ alerts g one GPU esc all GPUs r record"),
        ]:
            app, _, _ = sim_app("starved", gpus=gpus)
            async with app.run_test(size=size) as pilot:
                await pilot.pause()
                await pilot.press(*keys)
                await pilot.pause()
                assert screen_lines(app)[-1].rstrip() == want
    run(go())


def test_recording_names_the_file_whole_at_80_columns(tmp_path, sim_app, screen_lines, monkeypatch):
    from traintop.app import main as app_main
    from traintop.app.main import short_path

    monkeypatch.setattr(app_main, "BANNER_PART_S", 1.0)

    deep = tmp_path / "a-long-folder-name" / "another-long-folder-name" / "recordings"
    assert short_path(str(deep / "x.ttrec")).endswith("…/recordings/x.ttrec")

    async def go():
        app, monitor, _ = sim_app(record_dir=str(deep))
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("r")
            await pilot.pause()
            name = monitor.recorder.path.rsplit("/", 1)[1]
            top = screen_lines(app)[0]
            assert f"Recording: /…/recordings/{name}" in top
            await pilot.resize_terminal(160, 48)
            await pilot.pause()
            top = screen_lines(app)[0]
            assert top.count(name) == 1 and "● REC" in top  # named once, by the notice, not by the mark too
            await pilot.resize_terminal(80, 24)
            await pilot.pause()
            await pilot.press("r")
            await app.workers.wait_for_complete()
            await pilot.pause()
            top = screen_lines(app)[0]
            assert f"Recording saved: {name}" in top and "(in" not in top  # the folder would not fit
            await pilot.pause(1.2)
            assert "It is in /" in screen_lines(app)[0]  # said next
    run(go())


def test_gpu_lines_cut_alert_titles_only_between_words_the_history_gives_way_first(sim_app, screen_lines):
    async def go():
        for size in [(60, 20), (80, 24), (120, 36)]:
            app, _, _ = sim_app("starved,memory_creep", gpus=8)
            async with app.run_test(size=size) as pilot:
                await pilot.pause()
                assert app.gpu_mode == "table"
                titles = {a.title for a in app.last_view.active}
                rows = [line for line in screen_lines(app) if re.search(r"GPU \d .*[▲✖]", line)]
                assert len(rows) == 8
                whole = 0
                for row in rows:
                    mark = re.search(r"[▲✖] ([^│]*?)\s*(│|$)", row).group(1)
                    if mark.endswith("…"):
                        assert any(t.startswith(mark[:-1] + " ") for t in titles), (size, row)
                    else:
                        assert mark in titles, (size, row)
                        whole += 1
                assert whole >= 4, (size, rows)  # "Data starvation" fits everywhere
    run(go())


def test_help_wraps_with_hanging_indents_and_lists_every_rule(demo_app):
    from traintop.rules import default_rules
    from traintop.widgets.help_screen import HelpText

    async def go():
        app, _, _ = demo_app(45)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("question_mark")
            await pilot.pause()
            help_text = app.screen.query_one(HelpText)
            width = help_text.content_size.width
            assert width < 80
            source = help_text._text.plain.split("\n")
            lines = [t.plain for t in help_text.lines(width)]
            assert len(lines) > len(source)  # some lines did wrap
            # only a line of the text itself starts at column 0, never a wrapped continuation
            starts = [line for line in lines if line[:1] not in ("", " ")]
            assert all(any(s.startswith(line.rstrip()) for s in source if s[:1] not in ("", " ")) for line in starts)
            text = "\n".join(lines)
            for rule in default_rules():
                assert rule.title in " ".join(text.split()), rule.title
    run(go())


def test_the_alerts_scrollbar_is_one_cell_on_a_visible_track(sim_app):
    async def go():
        for size in [(80, 24), (60, 20), (120, 36)]:
            app, _, _ = sim_app("starved,memory_creep", gpus=8)
            async with app.run_test(size=size) as pilot:
                await pilot.pause()
                alerts = app.query_one(AlertsPanel)
                assert alerts.max_scroll_y > 0 and alerts.show_vertical_scrollbar
                assert alerts.vertical_scrollbar.region.width == 1
                bar = alerts.vertical_scrollbar.region
                inside = app.screen._compositor.get_style_at(bar.x - 1, bar.bottom - 1).bgcolor
                track = app.screen._compositor.get_style_at(bar.x, bar.bottom - 1).bgcolor
                # the track stands apart from the panel: not a dark thumb floating in the text
                assert track is not None and inside is not None
                contrast = abs(sum(track.triplet) - sum(inside.triplet))
                assert contrast >= 60, (size, track, inside)
    run(go())


def test_loader_workers_line_says_how_many_it_leaves_out(sim_app, screen_lines):
    async def go():
        app, _, _ = sim_app("starved", gpus=8)
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            r = app.query_one("#process").content_region
            text = " ".join(line[r.x:r.right].strip() for line in screen_lines(app)[r.y:r.bottom])
            m = re.search(r"loader workers \((\d+)\):((?: \d+%)+)(?: … \+(\d+))?", text)
            assert m, text
            n, shown, more = int(m.group(1)), len(m.group(2).split()), int(m.group(3) or 0)
            assert n > 12 and shown + more == n
    run(go())


def test_memory_chart_names_its_unit_and_keeps_the_legend_off_the_data():
    from traintop.widgets.memory_chart import memory_chart

    gib = 2**30
    alloc = [(10 + i * 0.1) * gib for i in range(100)]
    res = [(20 + i * 0.1) * gib for i in range(100)]
    nvml = [(25 + i * 0.1) * gib for i in range(100)]
    lines = [line.plain for line in memory_chart(alloc, res, nvml, 56, 8)]
    assert len(lines) <= 8 and all(len(line) <= 56 for line in lines)
    assert lines[0].startswith("GiB") and all(n in lines[0] for n in ("GPU used (NVML)", "reserved", "allocated"))
    plot = "\n".join(lines[1:])
    assert not any(n in plot for n in ("NVML", "reserved", "allocated"))


def test_s_is_in_the_footer_of_a_live_job_with_the_probe_and_stacks_name_a_pid_once(footer_text):
    from traintop.watch import sessions
    from traintop.app.factory import build_app
    from traintop.samples import StackDump
    from traintop.stacks import headline
    from traintop.widgets.stacks_screen import StacksScreen

    assert headline(StackDump(t=1.0, pid=26210)) == "PID 26210, on request"
    assert headline(StackDump(t=1.0, pid=26210, rank=1)) == "rank 1 (PID 26210), on request"

    async def go():
        for mode, shown in (("live", True), ("simulated", False)):
            monitor, feed = sessions.simulated_session("starved", gpus=1, seed=7, interval=0.5, history_s=60.0,
                                                       realtime=False)
            app = build_app(monitor, feed, mode=mode, start_feed=False)
            async with app.run_test(size=(80, 24)) as pilot:
                await pilot.pause()
                assert app.last_view.process.ranks  # the simulated job carries the probe
                assert ("s stacks" in footer_text(app)) == shown, mode
                await pilot.press("s")  # works either way; the popup says what it has
                assert isinstance(app.screen, StacksScreen)
    run(go())


def test_one_gpus_view_shows_its_alerts_and_counts_the_others(sim_app):
    async def go():
        app, _, _ = sim_app("starved,memory_creep", gpus=8)
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            everyone = list(app.last_view.active)
            alerts = app.query_one(AlertsPanel)
            assert str(alerts.border_title) == f"Alerts ({len(everyone)} active)"
            await pilot.press("g", "g")  # GPU 1
            await pilot.pause()
            assert app.focused_gpu == 1
            mine = [a for a in everyone if a.subject in ("gpu1",) or not a.subject[3:].isdigit()]
            others = len(everyone) - len(mine)
            assert mine and others > 0
            assert str(alerts.border_title) == f"Alerts: GPU 1, job and host ({len(mine)} active)"
            text = alerts_text(app).replace("\u00a0", " ")
            assert f"+{others} on other GPUs" in text
            assert "GPU 1 ·" in text and "GPU 0 ·" not in text and "GPU 2 ·" not in text
            await pilot.press("escape")
            await pilot.pause()
            assert str(alerts.border_title) == f"Alerts ({len(everyone)} active)"
            assert "on other GPUs" not in alerts_text(app)
    run(go())


def test_a_job_whose_probe_went_quiet_is_not_said_to_have_no_probe(demo_app):
    """The demo job had the probe; its last sample carries no rank data. Alive (the demo's job
    ends there: the view is made alive to show the panel's probe line, not the end line)."""
    import dataclasses

    async def go():
        app, monitor, feed = demo_app(0)
        feed.seek(feed.t_end)
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            app.refresh_view()
            await pilot.pause()
            pv = app.last_view.process
            # ended: its ranks as last reported stay on screen
            assert pv.probe_silent_s is not None and pv.ranks and pv.ranks_last_seen
            panel = app.query_one(ProcessPanel)
            alive = dataclasses.replace(pv.sample, alive=True)
            panel.show(dataclasses.replace(pv, ended_at=None, sample=alive, ranks=[], ranks_last_seen=False), False)
            await pilot.pause()
            text = str(panel.render())
            assert "Probe: no message for" in text and "No probe in this job" not in text
    run(go())


def test_the_all_gpus_subject_reads_as_words():
    from traintop.widgets.alerts_panel import subject_label

    assert subject_label("gpus") == "all GPUs" and subject_label("gpu3") == "GPU 3"
    assert subject_label("host") == "host"


def test_the_memory_chart_follows_a_trend_at_once_and_a_wobble_every_half_minute(monkeypatch):
    """The chart is drawn again only when it moves: again after 10 s when a
    series leaves the band it was drawn in (a leak, memory freed), after 30 s when it only wobbles."""
    import types

    from traintop.samples import RankSample
    from traintop.reports.view import RankView
    from traintop.widgets import process_panel

    clock = [1000.0]
    monkeypatch.setattr(process_panel, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    builds = []
    real = process_panel.memory_chart
    monkeypatch.setattr(process_panel, "memory_chart", lambda *a: builds.append(clock[0]) or real(*a))
    gib = 2**30
    panel = process_panel.ProcessPanel()

    def chart_at(t, allocated):
        clock[0] = t
        rv = RankView(RankSample(pid=7, rank=0, cuda=True), 0, None, allocated, [a + gib for a in allocated],
                      [a + 2 * gib for a in allocated], [])
        panel._chart(rv, 56, 12)

    wobble = [(10 + (k % 3) * 0.2) * gib for k in range(100)]
    chart_at(1000, wobble)
    for t in range(1001, 1031):  # the same band, one sample a second
        chart_at(t, wobble[1:] + wobble[:1])
    assert builds == [1000, 1030]  # only the half-minute redraw
    rising = wobble + [16 * gib]
    chart_at(1035, rising)
    assert builds[-1] == 1030  # within 10 s of the last build: not yet
    chart_at(1040, rising)
    assert builds[-1] == 1040  # out of its band: drawn again after 10 s


def test_the_replay_bar_keeps_its_length_as_the_position_grows():
    bar = ReplayBar()
    lines = []
    for done in (9, 59, 60, 61, 119, 253):
        bar.show(1000.0, 1253.0, 1000.0 + done, 1.0, True)
        lines.append(bar.render().plain)
    assert len({len(x) for x in lines}) == 1, lines
    assert len({x.index(" ", 2) for x in lines}) == 1, lines  # the bar itself: same cells each time
    assert lines[0].endswith(" 9 s / 4 min 13 s  1×") and lines[-1].endswith("4 min 13 s / 4 min 13 s  1×")


def test_focusing_a_gpu_names_it_in_the_alerts_title_even_with_no_alert(sim_app):
    async def go():
        app, _, _ = sim_app("healthy,healthy", gpus=2, history_s=2.0)  # too soon for any alert
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            assert app.query_one(AlertsPanel).border_title == "Alerts"
            await pilot.press("g")
            await pilot.pause()
            assert app.query_one(AlertsPanel).border_title == "Alerts: GPU 0, job and host (0 active)"
            await pilot.press("escape")
            await pilot.pause()
            assert app.query_one(AlertsPanel).border_title == "Alerts"
    run(go())


def test_a_focused_gpu_in_a_short_terminal_keeps_its_name_and_no_cut_frame(sim_app):
    def rows(app):
        return ["".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips()]

    async def go():
        app, _, _ = sim_app("healthy,healthy", gpus=2)
        async with app.run_test(size=(30, 10)) as pilot:
            await pilot.pause()
            await pilot.press("g")
            await pilot.pause()
            screen = rows(app)
            assert any("GPU 0 · NVIDIA H200" in r for r in screen), screen
            assert sum(r.count("╭") for r in screen) == sum(r.count("╰") for r in screen), screen
            await pilot.resize_terminal(80, 24)
            await pilot.pause()
            screen = rows(app)
            assert any("╭─ GPU 0 · NVIDIA H200" in r for r in screen) and app.query_one("#gpu-0").region.height == 7
    run(go())


def test_a_long_sentence_of_a_banner_is_cut_after_a_colon_outside_parentheses():
    from traintop.app.main import banner_parts

    nvml = "NVML could not start (NVML Shared Library Not Found): is the NVIDIA driver installed and loaded?"
    assert banner_parts("No GPU here: the demo plays. " + nvml, 63) == [
        "No GPU here: the demo plays.", "NVML could not start (NVML Shared Library Not Found):",
        "is the NVIDIA driver installed and loaded?"]
    inside = "Cannot read it (libnvidia-ml.so.1: cannot open shared object file), nothing else to say here."
    assert banner_parts(inside, 40) == [inside]  # the colon inside parentheses is the error's own
    assert banner_parts(nvml, 200) == [nvml]
    hints = "Replaying ddp-stall-10hz.ttrec. space: pause  ← →: seek  [ ]: speed  ?: help"
    assert banner_parts(hints, 61) == ["Replaying ddp-stall-10hz.ttrec.", "space: pause  ← →: seek  [ ]: speed  ?: help"]
    assert banner_parts(hints, 30) == ["Replaying ddp-stall-10hz.ttrec.", "space: pause  ← →: seek",
                                       "[ ]: speed  ?: help"]  # a key stays with what it does


def test_the_run_banners_are_said_in_parts_that_each_show_whole_at_80_columns(sim_app, monkeypatch):
    """`traintop run` at 80x24: the log's path (said before the first sample, when the top line
    has no clock yet) and "q quits with its status" after the job's end each show whole."""
    import traintop.app.main as app_main
    from traintop.watch.job import JobEnd

    monkeypatch.setattr(app_main, "BANNER_PART_S", 1.0)  # each part for 1 s, not 6
    log = "/tmp/traintop-0/logs/run-20251203-151031.log"
    banner = f"Job started (PID 15626). Its output goes to: {log}. ? says it again; q asks whether to stop the job."

    async def shown_in_turn(app, pilot, feed, until):
        """Each notice the top line showed, and whether it showed whole, until one with ``until``
        in it was seen (at most 10 s)."""
        seen = {}
        for _ in range(100):
            feed.step()  # samples arrive: the clock shows from the first
            app.refresh_view()
            await pilot.pause(0.1)
            bar = app.query_one(StatusBar)
            if bar.notice:
                seen[bar.notice] = seen.get(bar.notice, True) and bar.notice in bar.render().plain
            if any(until in n for n in seen):
                break
        return seen

    async def go():
        app, monitor, feed = sim_app("healthy", history_s=0, banner=banner)
        async with app.run_test(size=(80, 24)) as pilot:
            seen = await shown_in_turn(app, pilot, feed, "? says it again; q asks whether to stop the job.")
            assert seen and all(seen.values()), seen  # none cut
            assert log in " ".join(seen) and "q asks whether to stop the job." in " ".join(seen), seen
            monitor.end_job(JobEnd(15626, time.time(), 3))
            seen = await shown_in_turn(app, pilot, feed, "q quits with its status.")
            assert all(seen.values()) and any("q quits with its status." in n for n in seen), seen
            assert any(n.startswith("Job exited with 3 at") for n in seen), seen
    run(go())


def test_the_footer_says_r_stops_the_recording_while_one_runs(tmp_path, sim_app, footer_text):
    async def go():
        app, monitor, _ = sim_app(record_dir=str(tmp_path))
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            assert "r record" in footer_text(app) and "stop rec" not in footer_text(app)
            await pilot.press("r")
            await pilot.pause()
            assert monitor.recorder is not None and "r stop rec" in footer_text(app)
            await pilot.press("r")
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert monitor.recorder is None and "r record" in footer_text(app)
    run(go())


def test_speed_keys_at_their_limits_and_scroll_keys_with_nothing_to_scroll_say_why(demo_app, screen_lines):
    async def go():
        app, monitor, feed = demo_app(30)
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            for _ in range(len(feed.SPEEDS)):
                await press(pilot, "right_square_bracket")
            assert feed.speed == feed.SPEEDS[-1]
            await press(pilot, "right_square_bracket")
            await pilot.pause()
            assert "64× is the fastest replay speed." in screen_lines(app)[0]
            for _ in range(len(feed.SPEEDS)):
                await press(pilot, "left_square_bracket")
            await pilot.pause()
            assert feed.speed == feed.SPEEDS[0] and "0.25× is the slowest replay speed." in screen_lines(app)[0]
            await press(pilot, "down")  # 160x48: the demo's alerts fit their panel
            await pilot.pause()
            assert "The alerts fit their panel: nothing to scroll." in screen_lines(app)[0]
    run(go())


def test_the_cluster_views_keys_in_the_dashboard_say_where_they_work(sim_app):
    async def go():
        app, _, _ = sim_app("healthy")
        said = []
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            for key in ("h", "j", "a"):
                app._status.show_notice(None)
                await pilot.press(key)
                said.append(app._status.notice)
        return said

    said = run(go())
    assert all(s and "traintop cluster" in s for s in said), said


def test_at_120x36_no_figure_is_parted_from_its_unit_and_the_pcie_figure_stays(tmp_path):
    """A real H200 replay of pageable copies (a PCIe finding) in a real terminal at 120x36: the GPU
    panel keeps the PCIe figure whole (it dropped lesser fields), the process lines keep "I/O ↓0 B/s",
    "wait N %" and the chart legend whole."""
    import os

    from terminal import Terminal

    path = os.path.join(os.path.dirname(__file__), "fixtures", "h200", "pageable-10hz.ttrec")
    with Terminal(["replay", path], 120, 36, home=str(tmp_path)) as term:
        term.wait_text("REPLAY")
        term.press("space", "6")  # paused, at 60 %: copies under way
        screen = term.wait_for(lambda s: "━ allocated" in s and "PCIe ↑" in s and "Host-to-device" in s,
                               "the panels at 60 %").replace("\u00a0", " ")  # no-break spaces read as spaces
        pcie = [line for line in screen.splitlines() if "PCIe ↑" in line]
        assert pcie and all("↓" in line.split("PCIe ↑")[1] and "/s …" not in line and "/…" not in line
                            for line in pcie), pcie
        assert "I/O ↓0 B/s ↑0 B/s" in screen and "wait 0 %" in screen
        for line in screen.splitlines():
            right = line.split("││")[-1] if "││" in line else line
            assert not right.rstrip(" │").endswith(("I/O ↓0", "wait", "wait 0")), line
        assert "━ alloca\n" not in screen and "━ allocated" in screen
        term.press("q")
        assert term.wait_exit() == 0


def test_a_finished_jobs_cpu_peak_keeps_its_unit_on_its_line(sim_app):
    import dataclasses

    from traintop.widgets.process_panel import ProcessPanel

    async def go():
        app, monitor, feed = sim_app()
        async with app.run_test(size=(120, 36)) as pilot:
            last = monitor.store.latest
            monitor.ingest(dataclasses.replace(last, t=last.t + 0.5,
                                               process=dataclasses.replace(last.process, alive=False, members=())))
            app.refresh_view()
            await pilot.pause()
            return str(app.query_one(ProcessPanel).render())

    text = run(go())
    (peak,) = [line for line in text.splitlines() if "peak" in line and line.lstrip("│ ").startswith("CPU")]
    assert peak.rstrip().rstrip("│").rstrip().endswith("%"), text


def test_the_same_finding_on_several_gpus_is_one_entry(sim_app):
    async def go():
        app, _, _ = sim_app("starved", gpus=8)
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            return alerts_text(app), app._alerts.border_title

    text, title = run(go())
    assert title == "Alerts (8 active)"
    assert text.count("Data starvation") == 1 and "Data starvation · GPUs 0–7 · since" in text
    assert "The same on GPUs 1–7" in text


def test_the_process_panel_shows_the_ledger_mfu_and_the_latest_capture_as_text(sim_app):
    from traintop.samples import Capture

    async def go():
        app, monitor, _ = sim_app("healthy", gpus=1)
        # a path is the probe's word: markup and control codes in it are shown as text
        monitor.captures.append(Capture(t=0.0, pid=4242, kind="trace", path="/tmp/[bold]x[/bold]\x1b[2J.json",
                                        reason="Data starvation", step_s_before=0.025, step_s_after=0.0251))
        async with app.run_test(size=(160, 48)) as pilot:
            app.refresh_view()
            await pilot.pause()
            text = app.query_one(ProcessPanel).render().plain
            assert "goodput" in text and "MFU" in text and "bf16" in text
            words = " ".join(text.split())  # the panel wraps the line
            assert ("captured trace on Data starvation: /tmp/[bold]x[/bold]\\x1b[2J.json (step time 25.0 ms before, "
                    "25.1 ms after it: +0.4 %)") in words  # what "+0.4 %" compares, in words
            assert "\x1b" not in text
    run(go())
