"""The alerts panel's lists: what it cuts it counts."""

import asyncio

from traintop.findings import Finding, Severity


def test_the_ended_list_counts_the_findings_it_does_not_name(sim_app):
    """Six findings ended: the "Ended:" line named the latest four and dropped the others silently."""
    async def go():
        app, monitor, _ = sim_app("healthy")
        now = monitor.store.t_last
        titles = ["Data starvation", "GPU underused", "Thermal throttling", "Creeping GPU memory",
                  "PCIe bottleneck", "GPU idle while the job is alive"]
        ended = [Finding(f"rule{k}", title, "gpu0", Severity.WARNING, now - 100 + 10 * k, now - 95 + 10 * k,
                         "it held", (), id=k + 1) for k, title in enumerate(titles)]
        async with app.run_test(size=(160, 48)) as pilot:
            with monitor.lock:
                monitor.engine.restore(ended, now)
            app.refresh_view()
            await pilot.pause()
            return str(app.query_one("#alerts-body").render())

    text = asyncio.run(go())
    line = " ".join(text[text.index("Ended: "):].split())  # the paragraph, unwrapped
    named = [t for t in ("Data starvation", "GPU underused", "Thermal throttling", "Creeping GPU memory",
                         "PCIe bottleneck", "GPU idle while the job is alive") if t in line]
    assert named == ["Thermal throttling", "Creeping GPU memory", "PCIe bottleneck",
                     "GPU idle while the job is alive"]  # the latest four, newest first in the line
    assert line.endswith("; +2 more"), line
