"""The diagnosis score over the labelled corpus of real H200 runs (bench/diagnosis_score.py): the
gate passes on the committed baseline, and it fails when any rule of the default engine is made to
fire always or never."""

import copy
import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import corpus_labels  # noqa: E402
import diagnosis_score  # noqa: E402
import ledger_score  # noqa: E402

BASELINE = diagnosis_score.BASELINE

# Rules no label of the corpus expects yet: a never-on mutation of them cannot fail the gate until a
# run has their situation (the list may only shrink: a run that expects one makes the test below
# demand that its never-on mutation fails). None of these can be made on a lent GPU without changing
# its clocks, power limit or cooling (thermal throttling, clocks held below maximum), a second GPU
# (GPUs busy unequally) or a faulty one (XID, ECC): the rules are tested on synthetic frames
# (tests/test_probe_rules.py, tests/test_rules.py). The power cap and host memory pressure have their
# runs now (power_capped, host_memory_pressure).
NEEDS_A_CORPUS_RUN = {"thermal", "imbalance", "low_clocks", "gpu_errors"}
# cheapest first: a mutation is scored on one run and one source
SOURCE_COST = {"dmon-1s": 0, "noprobe-1Hz": 1, "smi-100ms": 2, "noprobe-10Hz": 3, "probe-10Hz": 4}


@pytest.fixture(scope="module")
def result():
    return diagnosis_score.evaluate()


@pytest.fixture(scope="module")
def baseline():
    return json.loads(BASELINE.read_text())


def test_the_corpus_has_twenty_runs_seen_four_ways():
    runs = diagnosis_score.runs()
    assert len(runs) >= 20
    for name in runs:
        for suffix in ("-probe.ttrec", "-noprobe.ttrec", "-smi.csv.gz", "-dmon.txt.gz"):
            assert (diagnosis_score.CORPUS / f"{name}{suffix}").exists(), f"{name}{suffix}"


def test_every_label_the_jobs_wrote_has_a_meaning_and_a_ledger_bucket():
    phases = {x["phase"] for n in diagnosis_score.runs() for x in diagnosis_score.label_lines(n)}
    assert phases <= set(corpus_labels.LABELS)
    assert set(corpus_labels.LABELS) == set(corpus_labels.BUCKET)


def test_every_run_is_in_one_split_and_a_bad_split_is_refused(tmp_path):
    parts = diagnosis_score.splits()
    assert sorted(parts["training"] + parts["held_out"]) == diagnosis_score.runs()
    bad = tmp_path / "corpus"
    bad.mkdir()
    for name in ("a", "b"):
        (bad / f"{name}.labels.jsonl.gz").write_bytes(b"")
    (bad / "splits.json").write_text(json.dumps({"training": ["a"], "held_out": ["a", "c"]}))
    with pytest.raises(ValueError) as e:
        diagnosis_score.splits(bad)
    assert "in both splits: a" in str(e.value) and "in no split: b" in str(e.value) and "not in the corpus: c" in str(e.value)


def test_every_rule_has_labels_that_contradict_it():
    """A rule made to fire always must cost wrong-advice seconds somewhere."""
    contradicted = set().union(*(lab.wrong for lab in corpus_labels.LABELS.values()))
    assert {r.id for r in diagnosis_score.default_rules()} <= contradicted


def test_no_problem_against_the_baseline(result, baseline):
    problems = diagnosis_score.check(result, baseline)
    assert problems == [], "\n" + "\n".join(problems) + "\n" + diagnosis_score.report(result)


def test_recall_is_the_covered_share_of_the_labelled_seconds_after_the_allowed_start():
    """A finding that comes late covers only what it covers: "100 %" from its own start hid that an
    idle GPU named 34 s into 35 s was named for 1 s of the 3 due."""
    cells = diagnosis_score.score(["idle_alive"], sources=("smi-100ms",))
    c = cells[("idle_gpu", "smi-100ms")]
    assert c.start > c.allowed and c.due > c.found > 0
    assert c.recall == pytest.approx(c.found / c.due) and c.recall < 1


def test_the_gate_fails_on_a_pair_missing_from_either_side_and_on_each_metric(result, baseline):
    base = copy.deepcopy(baseline)
    key = "starvation|probe-10Hz"
    del base["training"][key]
    assert any(key in p and "not in the baseline" in p for p in diagnosis_score.check(result, base))
    base = copy.deepcopy(baseline)
    base["training"]["thermal|probe-10Hz"] = dict(base["training"][key])
    assert any("thermal|probe-10Hz" in p and "no longer scored" in p for p in diagnosis_score.check(result, base))
    for metric, value, says in (("recall", 1.5, "recall"), ("precision", 1.5, "precision"), ("start_s", -5.0, "start"),
                                ("end_s", -5.0, "end"), ("misses", [], None)):
        base = copy.deepcopy(baseline)
        k = next(k for k, c in base["training"].items() if c[metric] not in (None, []))
        base["training"][k][metric] = value
        problems = [p for p in diagnosis_score.check(result, base) if k in p]
        assert problems and (says is None or says in problems[0]), (metric, k, problems)


def test_the_ledger_and_mfu_gate(result, baseline):
    """A bucket more than 5 points or an MFU more than 10 % off fails, unless the baseline recorded
    that miss and it did not grow; the recorded misses are the runs' own numbers."""
    ledger, mfu = result["ledger"], result["mfu"]
    assert "healthy_bf16|PID 603" in ledger and "healthy_bf16|train" in mfu  # the runs that carry the data
    assert ledger_score.check(ledger, mfu, baseline["ledger"], baseline["mfu"]) == []
    misses = ledger_score.known_misses(ledger, mfu)
    fresh = ledger_score.check(ledger, mfu, {k: v for k, v in ledger.items() if not ledger_score._ledger_miss(v)},
                               {k: v for k, v in mfu.items() if not ledger_score._mfu_miss(v)})
    assert len(fresh) == len(misses)  # each miss fails where the baseline does not know it
    worse = copy.deepcopy(ledger)
    row = worse["healthy_bf16|PID 603"]
    row["buckets"]["train"][0] -= 6.0
    row["worst_points"] = 6.2
    assert ledger_score.check(worse, mfu, baseline["ledger"], baseline["mfu"])
    worse = copy.deepcopy(mfu)
    worse["healthy_bf16|train"]["rel"] = -0.2
    assert ledger_score.check(ledger, worse, baseline["ledger"], baseline["mfu"])


# -- mutations: every rule made to fire always, and never --------------------------------------------
def _mutated(rule_id: str, always: bool):
    from traintop.metrics import gpu_subject
    from traintop.rules import Verdict

    def rules():
        out = diagnosis_score.default_rules()
        for r in out:
            if r.id == rule_id:
                r.evaluate = ((lambda ctx: [Verdict(gpu_subject(g.index), "mutated: always") for g in ctx.gpus()]
                               or [Verdict("process", "mutated: always")]) if always else (lambda ctx: ()))
        return out
    return rules


def _length(name):
    segs = diagnosis_score.segments(name)
    return segs[-1].t0 - segs[0].t0


def _cheapest(pairs):
    return min(pairs, key=lambda p: (SOURCE_COST[p[1]], _length(p[0]), p))


def _contradicting_pair(rule_id):
    """A training run and source where a label of at least 20 s contradicts the rule and the source carries it."""
    pairs = []
    for name in diagnosis_score.splits()["training"]:
        for s in diagnosis_score.segments(name):
            lab = corpus_labels.label(s.label)
            if rule_id in lab.wrong and s.t1 - s.t0 >= 20:
                pairs += [(name, src) for src in corpus_labels.SOURCES if corpus_labels.carried(lab, src, rule_id)]
    return _cheapest(pairs)


def _expecting_pair(rule_id, baseline):
    """A run and source where a situation expects the rule, the source carries it, and it was named
    (the baseline's cells of the run's split say which). A training run where one expects it; else a
    held-out one (a rule whose only situation is in a run recorded to test it: the mutation changes
    no rule, so nothing is tuned on that run)."""
    for split in ("training", "held_out"):
        pairs = []
        for name in diagnosis_score.splits()[split]:
            for s in diagnosis_score.segments(name):
                lab = corpus_labels.label(s.label)
                if rule_id in lab.expect:
                    for src in corpus_labels.SOURCES:
                        cell = baseline[split].get(f"{lab.expect[0]}|{src}")
                        # named there, by this rule itself (not only by another the label also expects)
                        if corpus_labels.carried(lab, src) and cell and name not in cell["misses"] and cell["up_s"]:
                            pairs.append((name, src))
        if pairs:
            return _cheapest(pairs)
    raise AssertionError(f"no run expects {rule_id} and names it")


def test_the_rules_no_run_expects_yet_are_listed_and_the_list_only_shrinks():
    expected = set().union(*(set(lab.expect) for lab in corpus_labels.LABELS.values()))
    unexpected = {r.id for r in diagnosis_score.default_rules()} - expected
    assert unexpected <= NEEDS_A_CORPUS_RUN, f"a rule no run expects is not listed: {unexpected - NEEDS_A_CORPUS_RUN}"
    assert NEEDS_A_CORPUS_RUN <= unexpected, \
        f"a run now expects {NEEDS_A_CORPUS_RUN - unexpected}: take it off the list (its never-on mutation must fail)"


MUTATIONS = [(r.id, always) for r in diagnosis_score.default_rules() for always in (True, False)
             if always or r.id not in NEEDS_A_CORPUS_RUN]


@pytest.mark.parametrize("rule_id,always", MUTATIONS, ids=[f"{r}-{'always' if a else 'never'}" for r, a in MUTATIONS])
def test_a_rule_made_to_fire_always_or_never_fails_the_gate(rule_id, always, baseline):
    """Scored on one run and source that contradict (always) or expect (never) the rule, against the
    same run and source scored unmutated. The failures kept are those that hold on any corpus that
    contains this run: a wrong-advice second stays one; a rule that never fires stays unnamed."""
    pair = _contradicting_pair(rule_id) if always else _expecting_pair(rule_id, baseline)
    clean = diagnosis_score.to_json(diagnosis_score.score(pairs=[pair]))
    mutated = diagnosis_score.score(pairs=[pair], rules=_mutated(rule_id, always))
    problems = [p for p in diagnosis_score.check_cells(mutated, clean) if p.startswith(f"training {rule_id}|")]
    if always:
        assert any("wrong-advice" in p for p in problems), (pair, problems)
    else:
        assert any(k in p for p in problems for k in ("recall", "precision", "missed", "no longer scored")), \
            (pair, problems)


def test_wrong_advice_fails_in_training_always_and_in_held_out_when_it_grows():
    """Held-out runs are scored, never tuned on: what they show wrong is recorded and may not grow;
    in the training split no wrong-advice second is allowed."""
    Cell = diagnosis_score.Cell
    cells = {("underuse", "noprobe-1Hz"): Cell(up=29.0, good=0.0, wrong=3.0, wrong_where=["run:input_bound"])}
    recorded = diagnosis_score.to_json(cells)
    assert any("wrong-advice" in p for p in diagnosis_score.check_cells(cells, recorded, "training"))
    assert diagnosis_score.check_cells(cells, recorded, "held_out") == []
    more = {("underuse", "noprobe-1Hz"): Cell(up=29.0, good=0.0, wrong=4.0, wrong_where=["run:input_bound"])}
    assert any("4 wrong-advice seconds" in p and "was 3" in p
               for p in diagnosis_score.check_cells(more, recorded, "held_out"))
