"""`traintop analyze --prometheus`: one report over a time range of a cluster.

Reads the agents' series (fetch.py) and judges them (report.py); where a Prometheus holds no
traintop series but dcgm-exporter's, the local rules run on those (dcgm.py). It sits above
report.py and dcgm.py, which therefore need not know each other's way round.
"""

from __future__ import annotations

import time

from traintop.cluster.budget import REPORT_BYTES, REPORT_POINTS, REPORT_SERIES
from traintop.cluster.dcgm import dcgm_report, has_dcgm
from traintop.cluster.fetch import fetch
from traintop.cluster.promapi import Prometheus, no_gc
from traintop.cluster.report import ClusterReport, findings_of, summarise
from traintop.errors import NoTraintopSeries
from traintop.rules.config import DEFAULT


def analyze_prometheus(url: str, since: float, until: float | None = None, job: str | None = None,
                       step: float | None = None, config=None, transport=None) -> ClusterReport:
    """The report of the range [until - since, until] (until: now), of one job or all."""
    t0 = time.perf_counter()
    end = until if until is not None else time.time()
    start = end - since
    with Prometheus(url, transport=transport) as prom, \
            prom.read_budget(REPORT_BYTES, REPORT_SERIES, "one report", REPORT_POINTS):
        try:
            data = fetch(prom, start, end, step, job)
        except NoTraintopSeries:
            if not has_dcgm(prom, start, end):
                raise
            report = dcgm_report(prom, start, end, step, config)
        else:
            with no_gc():
                shown, explained = findings_of(data, config or DEFAULT)
                report = summarise(data, shown, "prometheus", job, explained=explained, config=config or DEFAULT)
        report.queries, report.bytes_read = prom.calls, prom.bytes_read
    report.seconds = round(time.perf_counter() - t0, 3)
    return report
