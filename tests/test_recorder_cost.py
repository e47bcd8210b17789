"""The headless recorder does only what recording needs: it imports none of what other
commands use, wakes once per sample, and the rules' window look-ups are searched once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

from traintop import cli
from traintop.store import Store
from traintop.collectors.simulated import Simulator

HEAVY = ("prometheus_client", "traintop.cluster", "traintop.reports.analyze", "textual", "rich", "numpy",
         "zstandard", "http.server", "email", "ssl", "traintop.app", "traintop.widgets", "tomllib",
         "traintop.injob.agent", "traintop.collectors.probe_client")


def test_traintop_record_imports_nothing_other_commands_need(tmp_path):
    code = ("import sys; from traintop import cli; "
            "cli.parse_args(['record', '--interval', '1', 'x.ttrec', '--simulate', 'starved']); "
            "from traintop.watch import sessions; from traintop.watch.config import load_thresholds; "
            "load_thresholds(None); sessions.live_session(1.0, require_gpu=False)[1].stop(); "
            f"print(sorted(m for m in sys.modules for h in {HEAVY!r} if m == h or m.startswith(h + '.')))")
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path))  # no config file: no TOML parser needed
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip() == "[]"


def test_the_other_commands_are_listed_with_their_own_help():
    full = cli.build_parser()
    light = cli.build_parser("record")
    for parser in (full, light):
        action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        assert {c.dest: c.help for c in action._choices_actions} == cli.SUMMARIES
    assert cli.parse_args(["analyze", "x.ttrec", "--json"]).json is True  # built in full when given


class _IdleFeed:
    """A feed that never ticks (a recorder between samples); ``fail_after`` s: one tick that failed."""

    def __init__(self, fail_after=None, state=None):
        self.fail_after, self.state = fail_after, state

    def start(self, notify=None):
        if self.fail_after is not None:
            def tick():
                self.state["failed"] = True
                notify()
            threading.Timer(self.fail_after, tick).start()


def test_the_recorder_waits_without_polling():
    checks = []

    def failed():
        checks.append(1)
        return False

    cli._record_until_stopped(_IdleFeed(), 1.5, failed)  # the main thread: it sets a SIGTERM handler
    assert 1 <= len(checks) <= 2  # before waiting and at the deadline (polling every 0.2 s: 8)


def test_the_recorder_stops_when_a_tick_fails():
    state = {"failed": False}
    sent = []

    def backstop():  # without the feed's wake-up the recorder would wait for a signal
        sent.append(1)
        os.kill(os.getpid(), signal.SIGTERM)

    timer = threading.Timer(20, backstop)
    timer.start()
    try:
        cli._record_until_stopped(_IdleFeed(0.2, state), None, lambda: state["failed"])
    finally:
        timer.cancel()
    assert state["failed"] and not sent


def test_a_window_is_searched_once_per_sample(monkeypatch):
    sim = Simulator("starved", gpus=1, interval=1.0, seed=2)
    store = Store(600)
    for _ in range(300):
        store.add(sim.next_frame())
    calls = []
    search = store._first_index_at_or_after
    monkeypatch.setattr(store, "_first_index_at_or_after", lambda t: calls.append(t) or search(t))
    first = [store.window("gpu0.util", 60) for _ in range(10)]
    assert len(calls) == 1 and all(w == first[0] for w in first)
    store.add(sim.next_frame())
    after = store.window("gpu0.util", 60)
    assert len(calls) == 2 and after[:-1] == first[0][1:]  # the window moved with the new sample
