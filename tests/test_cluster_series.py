"""One vocabulary for Prometheus: the readers ask for series by the names of the table the
exporter names them from (cluster/series.py), and a name it does not hold fails loudly."""

import re

import pytest

from traintop.cluster import series as S
from traintop.cluster.fetch import fetch


def test_a_series_is_named_by_its_field_and_an_unknown_field_raises():
    assert S.gpu("util") == "traintop_gpu_utilization_ratio"
    assert S.rank("input_wait") == "traintop_input_wait_ratio"
    assert S.host("loader_cpu") == "traintop_host_loader_worker_cpu_ratio"
    assert S.agent("findings") == "traintop_finding_active"
    for ask, typo in ((S.gpu, "utilization"), (S.gpu, "power"), (S.rank, "step"), (S.host, "cpu"), (S.agent, "info_")):
        with pytest.raises(S.UnknownSeries, match=repr(typo)):
            ask(typo)
    with pytest.raises(S.UnknownSeries):
        S.name("node", "util")  # no such kind either


def test_every_name_has_one_entry_and_the_exporter_exposes_each():
    for table in (S.GPU_SERIES + S.GPU_DERIVED, S.RANK_SERIES, S.HOST_SERIES + S.HOST_DERIVED, S.AGENT_SERIES,
                  S.OWNER_SERIES, S.LEDGER_SERIES, S.MFU_SERIES):
        fields = [s.field for s in table]
        assert len(fields) == len(set(fields))
    every = [S.P + s.name for t in (S.GPU_SERIES, S.GPU_DERIVED, S.RANK_SERIES, S.HOST_SERIES, S.HOST_DERIVED,
                                    S.AGENT_SERIES, S.OWNER_SERIES, S.LEDGER_SERIES, S.MFU_SERIES) for s in t]
    assert len(every) == len(set(every)) == len(S.all_names())


class _Recorder:
    """A Prometheus that answers nothing but counts (so a read goes through every query) and keeps
    every query it was asked."""

    shown = "recorder"
    budget = None

    def __init__(self):
        self.asked = []

    def _answer(self, promql):
        self.asked.append(promql)
        return [object()] if promql.startswith("count(") else []

    def query_grid(self, promql, grid):
        return self._answer(promql)

    def query(self, promql, at=None):
        return self._answer(promql)


def test_a_cluster_read_asks_only_for_series_the_agents_export():
    prom = _Recorder()
    fetch(prom, 0.0, 60.0, 1.0)
    names = {n for q in prom.asked for n in re.findall(r"\btraintop_\w+", q)}
    assert names and names <= S.all_names()
    # every series a cross-host rule reads was asked for (the error counters too: one moved)
    assert {S.gpu("util"), S.gpu("sm_clock"), S.gpu("xid_total"), S.rank("steps"), S.rank("input_wait"),
            S.host("loader_cpu"), S.agent("findings")} <= names
