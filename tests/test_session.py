"""The Session every front end holds: one kind, replay controls that queue, one recording route
and one --on-finding route for the dashboard, the headless recorder, traintop run and the agent."""

import argparse
import threading

import pytest

from traintop.watch import sessions
from traintop.errors import TraintopError
from traintop.watch.monitor import Monitor
from traintop.record.recording import RecordingReader
from traintop.samples import SessionKind


class Events:
    """A hook that keeps what it is told (the FindingHook's interface, no command run)."""

    def __init__(self):
        self.events, self.closed = [], 0

    def submit(self, event):
        self.events.append(event)

    def close(self, wait=5.0):
        self.closed += 1

    def problem(self):
        return None


def demo_replay():
    s = sessions.replay_session(sessions.demo_path())
    s.feed.playing = False
    return s


# -- one kind ---------------------------------------------------------------------------
def test_one_kind_for_the_dashboard_the_feed_and_the_recording(tmp_path):
    path = str(tmp_path / "sim.ttrec")
    sim = sessions.simulated_session("healthy", realtime=False, history_s=0, record=path)
    sim.feed.prefill(3)
    sim.close()
    assert sim.kind is SessionKind.SIMULATED and sim.feed.kind == "simulated" and sim.monitor.info.kind == "simulated"
    assert RecordingReader(path).info.kind == "simulated"  # the recording names the session's kind
    replay = sessions.replay_session(path)
    assert replay.kind is SessionKind.REPLAY and replay.monitor.info.kind == SessionKind.REPLAY
    demo = sessions.demo_session()
    assert demo.kind is SessionKind.DEMO and demo.monitor.info.kind == "demo" and demo.kind.replays
    assert not sim.kind.replays and f"{demo.kind}" == str(demo.kind) == "demo"


def test_a_session_reads_as_its_monitor_and_feed():
    s = sessions.simulated_session("healthy", realtime=False, history_s=0)
    monitor, feed = s
    assert monitor is s.monitor and feed is s.feed and s[1] is feed and s.replay is None


# -- replay controls: queued, in order, seeks coalesced ------------------------------------
def test_replay_commands_queue_in_order_and_a_newer_seek_replaces_a_waiting_one(monkeypatch):
    s = demo_replay()
    rc = s.replay
    started = []
    rc.runner = lambda: started.append(1)  # a UI's worker would start here; run by hand below
    seeks = []
    real_seek = s.feed.seek
    monkeypatch.setattr(s.feed, "seek", lambda t: seeks.append(t) or real_seek(t))
    start = rc.position
    rc.step(1)
    rc.seek_by(30)
    rc.seek_by(30)  # from the target still waiting: 60 s in all, one seek
    assert started == [1] and rc.busy  # one runner for the whole queue
    assert rc.position == pytest.approx(start + 60)  # the target shows before the seek runs
    rc.seek_fraction(2.0)  # clamped to the end; replaces the waiting seek
    rc.run_queued()
    assert seeks == [rc.t_end] and not rc.busy
    assert s.feed.position == rc.position == rc.t_end and s.feed.at_end and not s.feed.playing


def test_replay_speed_stops_at_its_range_and_says_so():
    s = demo_replay()
    rc = s.replay
    rc.runner = lambda: rc.run_queued()
    for _ in range(20):
        why = rc.change_speed(1)
    assert rc.speed == s.feed.SPEEDS[-1] and why == f"{rc.speed:g}× is the fastest replay speed."
    rc.change_speed(-1)
    assert rc.speed == s.feed.SPEEDS[-2]


def test_a_failing_replay_command_is_said_and_the_next_ones_still_run():
    s = demo_replay()
    rc, said, done = s.replay, [], threading.Event()
    rc.runner = lambda: None

    def broken():
        raise ValueError("chunk 3 is damaged")

    rc._submit(broken)
    rc.toggle_pause()
    rc.run_queued(said.append)
    assert said == ["replay: ValueError: chunk 3 is damaged"] and s.feed.playing
    # without a UI, the commands run on a thread of their own
    rc.runner = rc._run_on_a_thread
    rc.toggle_pause()
    for _ in range(200):
        if not rc.busy:
            break
        done.wait(0.01)
    assert not rc.busy and not s.feed.playing


def test_live_sessions_have_no_replay_controls_and_ask_for_stacks():
    s = sessions.simulated_session("starved", realtime=False, history_s=30)
    assert s.replay is None and s.ask_for_stacks() == "simulated"
    s.kind = SessionKind.LIVE  # as if the simulated job were live: its probe is asked
    assert s.ask_for_stacks() == "asked" and s.monitor.stacks_wanted
    assert demo_replay().ask_for_stacks() == "recording"


# -- one recording route -----------------------------------------------------------------
def test_start_and_stop_recording_and_where_the_files_go(tmp_path, monkeypatch):
    routes = []
    real = Monitor.start_recording
    monkeypatch.setattr(Monitor, "start_recording", lambda self, path, **kw: routes.append(path) or real(self, path, **kw))
    s = sessions.simulated_session("healthy", realtime=False, history_s=0)
    s.record_dir = str(tmp_path / "recordings")
    assert s.where_things_go() == [("recordings", f"{s.record_dir} (key r)")]
    path = s.start_recording()  # the r key's file: a new one in record_dir
    assert routes == [path] and path.startswith(s.record_dir) and s.recording_path == path
    assert s.where_things_go() == [("recording", path)]
    with pytest.raises(TraintopError):
        s.start_recording(str(tmp_path / "second.ttrec"))  # one file at a time
    s.feed.prefill(3)
    rec = s.stop_recording()
    s.feed.prefill(2)  # not written: stopped at once
    rec.close()
    assert s.recording_path is None and s.stop_recording() is None
    assert len(list(RecordingReader(path).frames())) == 3
    with pytest.raises(TraintopError, match="is a directory"):
        s.start_recording(str(tmp_path))
    assert demo_replay().where_things_go() == []  # a replay records nothing


# -- one --on-finding route ----------------------------------------------------------------
def agent_args(**kw):
    args = dict(on_finding=None, job=None, hosts=1, simulate="starved", only_gpus=None, record=None, textfile=None,
                hostname="node-a", gpus=1, seed=1, interval=0.5, thresholds=None, node_rank=0, nodes=1,
                straggler=None, stall_after=None)
    args.update(kw)
    return argparse.Namespace(**args)


def test_the_agent_and_the_dashboard_tell_a_hook_the_same_way(monkeypatch):
    from traintop.watch import hooks
    from traintop.cluster import agent

    attached = []
    real = Monitor.attach_finding_hook
    monkeypatch.setattr(Monitor, "attach_finding_hook",
                        lambda self, hook, host=None: attached.append(host) or real(self, hook, host))
    shared = Events()
    for where in (hooks, agent):
        monkeypatch.setattr(where, "finding_hook", lambda command, say=None: shared if command else None)
    hosts = agent.build_hosts(agent_args(on_finding="notify-me", hosts=2))
    dashboard = sessions.simulated_session("starved", seed=1, realtime=False, history_s=0)
    dashboard.on_finding("notify-me")
    assert attached == ["node-a-000", "node-a-001", None]  # one route: the monitor's
    assert all(h.monitor.hook is shared for h in hosts) and dashboard.monitor.hook is shared
    for h in hosts:
        h.feed.prefill(120)
    dashboard.feed.prefill(120)
    starts = [(e["host"], e["rule"]) for e in shared.events if e["event"] == "start"]
    assert ("node-a-000", "starvation") in starts and ("node-a-001", "starvation") in starts
    host = dashboard.monitor.info.hostname
    assert (host, "starvation") in starts
    for h in hosts:
        h.feed.stop()
    for h in hosts:
        h.stop()
    dashboard.close()
    assert shared.closed == 3  # each session closes it; a FindingHook closes once


def test_a_finding_hook_closes_once():
    from traintop.watch.hooks import FindingHook

    hook = FindingHook("true")
    hook.close()
    hook.close()  # the agent's second host: nothing left to do, nothing waits
    assert hook.problem() is None
