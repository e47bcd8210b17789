"""The view-model and the rules agree on their figures."""

from traintop.watch.monitor import Monitor
from traintop.reports.view import build_view


def test_loader_workers_have_one_figure_in_the_panel_and_the_alert():
    """The panel said "2 at 100 %" (a fixed string) while the alert said 115 %: one definition now."""
    from traintop.collectors.simulated import Simulator
    from traintop.widgets.process_panel import ProcessPanel

    sim = Simulator("starved", seed=2, interval=0.5, probe=False)  # no rank line: the workers' summary shows
    mon = Monitor(sim.info())
    for f in sim.frames(120):
        mon.ingest(f)
    while mon.engine._last_eval != mon.store.t_last:  # a frame the rules judged (once a second)
        mon.ingest(sim.next_frame())
    view = build_view(mon)
    (alert,) = [a for a in view.active if a.rule == "starvation"]
    load = view.process.workers
    assert f"{len(load.busy)} of {load.count} loader workers sit at {load.busy_mean:.0f} % CPU" in alert.evidence
    panel = ProcessPanel()
    panel.view, panel.compact = view.process, True
    body, _ = panel._body(60)  # the panel's text, without an app to wrap it for
    assert f"({len(load.busy)} at {load.busy_mean:.0f} %)" in "\n".join(line.plain for line in body)


def test_a_job_that_had_the_probe_is_not_said_to_have_none_when_its_data_stops():
    import dataclasses

    from traintop.collectors.simulated import Simulator

    sim = Simulator("healthy", seed=2, interval=0.5)
    mon = Monitor(sim.info())
    frames = sim.frames(40)
    for f in frames:
        mon.ingest(f)
    assert build_view(mon).process.ranks and build_view(mon).process.probe_silent_s is None
    last = frames[-1]
    for k in range(1, 7):  # the job goes on, its probe sends nothing (idle, between phases, ending)
        mon.ingest(dataclasses.replace(last, t=last.t + k * 0.5, ranks=()))
    view = build_view(mon)
    assert not view.process.ranks and view.process.probe_silent_s == 3.0
    # a job never probed: nothing to say about a probe that went quiet
    plain = Simulator("healthy", seed=2, interval=0.5, probe=False)
    mon2 = Monitor(plain.info())
    for f in plain.frames(10):
        mon2.ingest(f)
    assert build_view(mon2).process.probe_silent_s is None


def test_once_the_job_has_ended_its_ranks_and_time_ledger_stay_as_last_seen():
    """The job exits: its probes stop, and the panel keeps each rank as last reported with where
    its time went (before, the rank and time lines vanished with the job)."""
    import dataclasses

    from traintop.collectors.simulated import Simulator
    from widgets.process_panel import ledger_ranks

    sim = Simulator("healthy", seed=2, interval=0.5)
    mon = Monitor(sim.info())
    frames = sim.frames(40)
    for f in frames:
        mon.ingest(dataclasses.replace(f, ranks=tuple(dataclasses.replace(r, time_train=0.8, time_checkpoint=0.2)
                                                      for r in f.ranks)))
    last = frames[-1]
    ended = dataclasses.replace(last.process, alive=False)
    for k in range(1, 5):
        mon.ingest(dataclasses.replace(last, t=last.t + k * 0.5, ranks=(), process=ended))
    view = build_view(mon).process
    assert view.ranks and view.ranks_last_seen
    (rv,) = ledger_ranks(view.ranks)
    assert abs(rv.ledger["checkpoint"] - 0.2) < 0.02


def test_the_time_ledger_is_labelled_with_the_time_it_covers():
    """A job 30 s old: its ledger line says 30 s, not the 5 min window it has not filled yet."""
    import dataclasses

    from traintop.collectors.simulated import Simulator
    from traintop.reports.view import LEDGER_WINDOW_S
    from widgets.process_panel import ledger_line, ledger_ranks

    def line_after(n):
        sim = Simulator("healthy", seed=2, interval=0.5)
        mon = Monitor(sim.info())
        for f in sim.frames(n):
            mon.ingest(dataclasses.replace(f, ranks=tuple(dataclasses.replace(r, time_train=0.1, time_startup=0.9)
                                                          for r in f.ranks)))
        (rv,) = ledger_ranks(build_view(mon).process.ranks)
        return rv, ledger_line(rv, 160).plain.replace("\u00a0", " ")

    rv, line = line_after(60)  # 30 s of samples
    assert rv.ledger_s == 30.0 and line.endswith(f"({rv.sample.label}, 30 s)"), line
    rv, line = line_after(int(2 * LEDGER_WINDOW_S) + 100)  # longer than the window
    assert rv.ledger_s == LEDGER_WINDOW_S and line.endswith(f"({rv.sample.label}, 5 min)"), line


def test_the_time_ledger_says_how_long_it_covers():
    """The ledger's window (5 minutes), or less for a job younger than that: each sample counts
    the interval before it."""
    from traintop.collectors.simulated import Simulator
    from traintop.reports.view import LEDGER_WINDOW_S

    sim = Simulator("healthy", interval=1.0)
    mon = Monitor(sim.info())
    for f in sim.frames(40):
        mon.ingest(f)
    (rank,) = build_view(mon).process.ranks
    assert rank.ledger and rank.ledger_s == 40.0
    for f in sim.frames(400):
        mon.ingest(f)
    assert build_view(mon).process.ranks[0].ledger_s == LEDGER_WINDOW_S


def test_a_ranks_figures_are_read_from_the_store_once_a_sample():
    """A redraw between two samples (a finding starting, a key) reads the rank's time ledger and
    series again for nothing: they are kept until the store changes, and read afresh after."""
    import traintop.reports.view as view_module
    from traintop.collectors.simulated import Simulator

    sim = Simulator("healthy", seed=2, interval=0.5)
    mon = Monitor(sim.info())
    for f in sim.frames(40):
        mon.ingest(f)
    calls = []
    shares = view_module.ledger_shares

    def counted(*a, **kw):
        calls.append(a[1])
        return shares(*a, **kw)

    view_module.ledger_shares = counted
    try:
        first = build_view(mon).process.ranks
        again = build_view(mon).process.ranks
        assert first and len(calls) == len(first)  # once a rank, however many redraws
        assert [rv.ledger for rv in again] == [rv.ledger for rv in first]
        mon.ingest(sim.next_frame())
        after = build_view(mon).process.ranks
        assert len(calls) == len(first) + len(after)  # a new sample: read again
        assert after[0].step_time[-1] == mon.store.last(f"{calls[-1]}.step_time", 1)[0]
    finally:
        view_module.ledger_shares = shares
