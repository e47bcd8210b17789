"""The view-model and the rules agree on their figures."""

from traintop.monitor import Monitor
from traintop.view import build_view


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
    assert f"({len(load.busy)} at {load.busy_mean:.0f} %)" in body.plain
