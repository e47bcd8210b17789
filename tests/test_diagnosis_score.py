"""The diagnosis score over the labelled corpus of real H200 runs (bench/diagnosis_score.py):
no wrong-advice second in any source, and no rule's recall below the committed baseline."""

import gzip
import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import corpus_labels  # noqa: E402
import diagnosis_score  # noqa: E402

BASELINE = REPO / "tests" / "fixtures" / "corpus" / "score-baseline.json"


@pytest.fixture(scope="module")
def cells():
    return diagnosis_score.score()


def test_the_corpus_has_twenty_runs_seen_four_ways():
    runs = diagnosis_score.runs()
    assert len(runs) >= 20
    for name in runs:
        for suffix in ("-probe.ttrec", "-noprobe.ttrec", "-smi.csv.gz", "-dmon.txt.gz"):
            assert (diagnosis_score.CORPUS / f"{name}{suffix}").exists(), f"{name}{suffix}"


def test_every_label_the_jobs_wrote_has_a_meaning():
    phases = {json.loads(x)["phase"] for n in diagnosis_score.runs()
              for x in gzip.open(diagnosis_score.CORPUS / f"{n}.labels.jsonl.gz", "rt")}
    assert phases <= set(corpus_labels.LABELS)


def test_no_wrong_advice_and_no_recall_below_the_baseline(cells):
    problems = diagnosis_score.check(cells, json.loads(BASELINE.read_text()))
    assert problems == [], "\n" + "\n".join(problems) + "\n" + diagnosis_score.table(cells)


def test_the_check_catches_wrong_advice_and_a_recall_drop():
    """The gate can fail: a rule that calls every GPU stalled gives wrong advice on running jobs;
    starvation's thresholds made unreachable lose its recall."""
    from traintop.rules import Verdict, Severity, Thresholds

    class AlwaysStalled:
        id, title, severity, raise_after, clear_after, remedies, now_s = "stall", "Stalled", Severity.CRITICAL, 0, 5, (), None

        def evaluate(self, ctx):
            return [Verdict(f"gpu{g.index}", "always") for g in ctx.gpus()]

    blind = Thresholds().with_overrides(starvation_min_idle_frac=1.0, starvation_min_busy_frac=1.0,
                                        starvation_input_wait=1.0, starvation_busy_worker_cpu=10_000.0)
    worse = diagnosis_score.score(config=blind, extra_rules=[AlwaysStalled()], sources=("probe-10Hz",))
    problems = diagnosis_score.check(worse, json.loads(BASELINE.read_text()))
    assert any(p.startswith("stall|probe-10Hz") and "wrong-advice" in p for p in problems)
    assert any(p.startswith("starvation|probe-10Hz") and "recall" in p for p in problems)
