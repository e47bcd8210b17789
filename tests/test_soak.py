"""Long runs: a day of samples in compressed time stays bounded; the tick schedule does not drift."""

import time

import psutil

from traintop.collectors.simulated import Simulator
from traintop.watch.feeds import SourceFeed
from traintop.watch.monitor import Monitor
from traintop.store import Store


def test_a_day_of_samples_keeps_memory_bounded():
    sim = Simulator("starved,healthy", gpus=2, interval=8.0, seed=9)
    mon = Monitor(sim.info(), store=Store(capacity=600))
    proc = psutil.Process()
    for f in sim.frames(2000):  # warm: fill every ring buffer (600 samples) and the alert history
        mon.ingest(f)
    def sizes():
        return (len(mon.store), len(mon.store.keys()), len(mon.engine._tracks))

    rss, warm = proc.memory_info().rss, sizes()
    for f in sim.frames(10800 - 2000):  # the rest of 24 h at one sample every 8 s
        mon.ingest(f)
    assert sizes() == warm  # every structure stopped growing once full
    assert len(mon.store) == 600 and len(mon.engine.alerts) <= mon.engine.max_history
    growth = proc.memory_info().rss - rss  # allocator churn only: a loose bound
    assert growth < 32 * 1024 * 1024, f"grew by {growth / 2**20:.1f} MiB over a day"


def test_the_tick_schedule_does_not_drift():
    sim = Simulator("healthy", interval=0.05)
    mon = Monitor(sim.info())

    class SlowSource:  # each tick takes a variable part of the interval
        def __init__(self):
            self.k = 0

        def next_frame(self):
            self.k += 1
            time.sleep(0.01 + 0.02 * (self.k % 3 == 0))
            return sim.next_frame()

    feed = SourceFeed(mon, SlowSource(), 0.05)
    t = time.monotonic()
    feed.start()
    time.sleep(3.0)
    feed.stop()
    elapsed = time.monotonic() - t
    expected = elapsed / 0.05
    assert abs(feed.ticks - expected) <= 0.1 * expected + 3  # scheduled by the clock, not by sleeps
