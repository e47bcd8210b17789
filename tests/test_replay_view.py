"""What a replay shows: its first frame, and the speed keys' notices."""

import asyncio
import dataclasses

from traintop.watch import sessions
from traintop.app.factory import build_app
from traintop.collectors.simulated import Simulator
from traintop.record.recording import RecordingWriter


def _recording_off_the_millisecond(path, n=20):
    """A recording as traintop wrote one before its sample times were kept to the millisecond live:
    each chunk's first time exact, its samples' times (stored in milliseconds) a little earlier."""
    sim = Simulator("starved", seed=3, t0=1_790_000_000.1234567)
    writer = RecordingWriter(path, sim.info())
    for f in sim.frames(n):
        writer.add(dataclasses.replace(f, t=f.t + 0.0004))
    writer.close()
    return path


def test_a_replay_shows_the_host_and_the_process_from_its_first_frame(tmp_path):
    """At 0 s the replay said "no host data" and "No process was attached when this was recorded";
    one step later both were there: it opened the recording at the first chunk's exact time, after
    the first sample's time as stored, and so drew nothing of it."""
    path = _recording_off_the_millisecond(str(tmp_path / "run.ttrec"))

    async def go():
        monitor, feed = sessions.replay_session(path)
        feed.playing = False
        app = build_app(monitor, feed, mode="replay", start_feed=False)
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            return (feed.position - feed.t_start, str(app.query_one("#host").render()),
                    str(app.query_one("#process").render()), app.last_view.t == feed.t_start)

    at, host, process, first = asyncio.run(go())
    assert at == 0 and first
    assert "no host data" not in host and "CPU" in host and "RAM" in host
    assert "No process was attached" not in process and "train.py" in process


def test_the_slowest_speed_notice_goes_when_the_speed_changes(demo_app, screen_lines):
    """'0.25× is the slowest replay speed.' stayed on the top line after ] had raised the speed."""
    async def go():
        app, monitor, feed = demo_app(30)
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            for _ in range(len(feed.SPEEDS)):
                await pilot.press("left_square_bracket")
                await app.workers.wait_for_complete()
            await pilot.pause()
            assert feed.speed == feed.SPEEDS[0]
            assert "0.25× is the slowest replay speed." in screen_lines(app)[0]
            await pilot.press("right_square_bracket")
            await app.workers.wait_for_complete()
            await pilot.pause()
            top = screen_lines(app)[0]
            assert feed.speed == feed.SPEEDS[1]
            assert "slowest" not in top, top
            app.say("Another message.")  # what another key said stays its time
            await pilot.press("right_square_bracket")
            await app.workers.wait_for_complete()
            await pilot.pause()
            return screen_lines(app)[0]

    assert "Another message." in asyncio.run(go())
