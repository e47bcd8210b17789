"""One vocabulary of series names: every name the store, codec, analyze, rules and view ask for exists."""

import ast
import pathlib

import pytest

from traintop.record import codec
from traintop import metrics
from traintop.watch import sessions
from traintop.collectors.simulated import SCENARIOS
from traintop.metrics import VOCABULARY, UnknownSeries, check_key
from traintop.rules import default_engine
from traintop.samples import Frame, GpuSample
from traintop.store import Store
from traintop.reports.view import build_view

ROOT = pathlib.Path(__file__).resolve().parent.parent
# helper -> (group, index of the name argument)
NAMED = {
    "gpu_window": ("gpu", 1), "gpu_mean": ("gpu", 1), "gpu_pairs": ("gpu", 1), "gpu_key": ("gpu", 1),
    "gpu_column": ("gpu", 1), "host_key": ("host", 0), "host_window": ("host", 0), "proc_key": ("proc", 0),
    "proc_window": ("proc", 0), "rank_key": ("rank", 1), "rank_window": ("rank", 1), "rank_pairs": ("rank", 1),
}


def _sources():
    for folder in ("traintop", "app", "widgets", "collectors"):
        yield from (ROOT / folder).rglob("*.py")


def _literal_names():
    """(file, helper, group, name) for every call of a series helper with a literal name."""
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if fn not in NAMED:
                continue
            group, pos = NAMED[fn]
            if len(node.args) > pos and isinstance(node.args[pos], ast.Constant):
                yield path.name, fn, group, node.args[pos].value


def test_every_literal_series_name_in_the_code_is_in_the_vocabulary():
    found = list(_literal_names())
    assert len(found) >= 40  # the rules, the view and analyze all name their series this way
    unknown = [f for f in found if f[3] not in VOCABULARY[f[2]]]
    assert not unknown


def test_no_series_key_is_spelt_by_hand_outside_the_vocabulary():
    """Keys are built by metrics' helpers only: a hand-made f"gpu{i}.power" would bypass the check."""
    offenders = []
    for path in _sources():
        if path.name == "metrics.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
                head = str(node.values[0].value)
                if head in ("gpu", "rank") and any(isinstance(v, ast.Constant) and str(v.value).startswith(".")
                                                   for v in node.values[1:]):
                    offenders.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.startswith(("host.", "proc.")) and node.value[5:].isidentifier():
                offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders


def test_the_codec_stores_the_vocabulary_names():
    for scheme in codec.SCHEMES.values():
        gpu, host, proc, rank = scheme[:4]
        for group, table in (("gpu", gpu), ("host", host), ("proc", proc), ("rank", rank)):
            assert set(table) <= VOCABULARY[group] | metrics.IDENTITY, group


def test_frames_flatten_into_vocabulary_keys_only():
    sim = sessions.simulated_session("healthy,starved,memory_creep", gpus=3, realtime=False, history_s=0)[1].source
    for key, _ in metrics.frame_metrics(sim.next_frame()):
        assert check_key(key) == key


def test_an_unknown_series_raises_and_a_known_unseen_one_reads_empty():
    s = Store(capacity=10)
    s.add(Frame(t=0.0, gpus=(GpuSample(index=0, util=50.0),)))
    assert s.window("gpu0.util") == [50.0]
    assert s.window("gpu0.power_w") == [] and s.window("gpu3.util") == [] and s.latest_value("rank2.input_wait") is None
    for bad in ("gpu0.power", "gpu0.temp", "host.cpu", "proc.cpu", "gpu0.util ", "gpus.util", "rank0.wait"):
        with pytest.raises(UnknownSeries):
            s.window(bad)
        with pytest.raises(UnknownSeries):
            s.window_pairs(bad)
        with pytest.raises(UnknownSeries):
            s.last(bad, 3)
    with pytest.raises(UnknownSeries):
        metrics.gpu_key(0, "power")


class _Asking(Store):
    """A store that notes every series it is asked for."""

    asked: set

    def _column(self, key):
        self.asked.add(key)
        return super()._column(key)


def test_every_series_the_rules_and_the_view_ask_for_exists():
    store = _Asking(capacity=2000)
    store.asked = set()
    monitor, feed = sessions.simulated_session(",".join(SCENARIOS), gpus=len(SCENARIOS), realtime=False,
                                               history_s=0)
    monitor.store = store
    monitor.engine = default_engine()
    feed.prefill(240)
    build_view(monitor)
    assert {k.split(".")[1] for k in store.asked} >= {"util", "power_w", "temp_c", "mem_used", "input_wait",
                                                      "allocated", "cpu_percent"}
    for key in store.asked:
        check_key(key)


def test_a_gpu_subject_and_its_index_go_both_ways():
    from traintop.metrics import gpu_index, gpu_subject

    assert all(gpu_index(gpu_subject(i)) == i for i in (0, 7, 15))
    assert [gpu_index(s) for s in ("gpus", "host", "gpu", "gpux", "rank3", "gpu-1")] == [None] * 6
