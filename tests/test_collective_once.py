"""The collective-wait verdict is worked out once an evaluation for each window, and not at all on
one GPU, while every rule that asks gets the same answer as before."""

import traintop.rules.collective as collective
from traintop.collectors.simulated import Simulator
from traintop.watch.monitor import Monitor
from traintop.rules.engine import RuleContext


def _monitor(scenario: str, gpus: int) -> Monitor:
    sim = Simulator(scenario, gpus=gpus, seed=3, interval=1.0)
    mon = Monitor(sim.info())
    for f in sim.frames(60):
        mon.ingest(f)
    return mon


def _ctx(mon: Monitor) -> RuleContext:
    return RuleContext(store=mon.store, now=mon.store.t_last, config=mon.engine.config,
                       is_active=lambda rule, subject: False)


def test_asked_again_in_one_evaluation_it_is_not_worked_out_again(monkeypatch):
    mon = _monitor("collective_wait", 2)
    ctx = _ctx(mon)
    fresh = collective._collective_waits(_ctx(mon), 30.0, 5)
    loads = []
    real = collective.loads
    monkeypatch.setattr(collective, "loads", lambda *a, **kw: loads.append(1) or real(*a, **kw))
    got = [collective.collective_waits(ctx, 30.0) for _ in range(4)]
    assert got == [fresh] * 4 and len(loads) == 1
    collective.collective_waits(ctx, 6.0, min_n=3)  # another window: its own
    assert len(loads) == 2
    collective.collective_waits(_ctx(mon), 30.0)  # the next evaluation: afresh
    assert len(loads) == 3


def test_one_gpu_waits_for_no_other(monkeypatch):
    mon = _monitor("healthy", 1)
    monkeypatch.setattr(collective, "loads", lambda *a, **kw: (_ for _ in ()).throw(AssertionError("read")))
    assert collective.collective_waits(_ctx(mon), 30.0) is None
