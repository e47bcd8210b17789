"""One rule system: every rule, single-host or cross-host, declares the same things, and every
rule id used anywhere (code, bench, deploy files, docs) is one of the catalogue's."""

import ast
import pathlib
import re

from traintop.findings import Severity
from traintop.rules import CLUSTER, CROSS_HOST_RULES, HOST, catalogue, declared, default_rules
from traintop.rules.config import CLUSTER_PREFIX, Thresholds

REPO = pathlib.Path(__file__).resolve().parents[1]
HOST_IDS = {r.id for r in default_rules()}
CLUSTER_IDS = {r.id for r in CROSS_HOST_RULES}
EVERY_ID = HOST_IDS | CLUSTER_IDS


def test_every_rule_declares_the_same_things():
    for r in catalogue():
        assert re.fullmatch(r"[a-z][a-z0-9_]*", r.id), r
        assert r.title and isinstance(r.severity, Severity), r.id
        assert r.remedies and all(isinstance(x, str) and x for x in r.remedies), r.id
        assert r.scope in (HOST, CLUSTER), r.id
        assert isinstance(r.explains, tuple) and isinstance(r.defers_to, tuple), r.id


def test_ids_are_unique_within_a_scope_and_shared_only_by_one_situation():
    for scope in (HOST, CLUSTER):
        ids = [r.id for r in catalogue() if r.scope == scope]
        assert len(ids) == len(set(ids)), scope
    # a rank the others wait for: judged on one host's GPUs and across hosts
    assert HOST_IDS & CLUSTER_IDS == {"straggler"}
    assert declared("straggler").scope == HOST and declared("straggler", CLUSTER).scope == CLUSTER
    assert declared("rank_claimed_twice").scope == CLUSTER  # an agent raises it about its own node


def test_what_a_rule_explains_and_defers_to_are_rules_judged_before_it():
    """A rule reads the verdicts of the rules judged before it in the same evaluation: those it
    defers to must come first. A rule explains rules of its own scope; a cross-host rule explains
    the agents' (single-host) verdicts."""
    for order, explained_ids in ((default_rules(), HOST_IDS), (list(CROSS_HOST_RULES), HOST_IDS)):
        seen = set()
        for r in order:
            assert set(r.explains) <= explained_ids, r.id
            assert set(r.defers_to) <= seen, (r.id, set(r.defers_to) - seen)
            assert r.id not in r.explains and r.id not in r.defers_to
            seen.add(r.id)
    from traintop.rules.imbalance import JOB_WAITS, LAGGING_CAUSES
    from traintop.rules.underuse import Underuse

    before_underuse = {r.id for r in default_rules()[: [r.id for r in default_rules()].index("underuse")]}
    assert {rule for rule, _ in Underuse.MEMORY_RISKS} <= before_underuse
    assert set(JOB_WAITS + LAGGING_CAUSES) == set(declared("imbalance").defers_to)


def _python_files():
    for folder in ("traintop", "app", "widgets", "collectors", "bench"):
        yield from (REPO / folder).rglob("*.py")


def test_every_rule_id_asked_about_in_code_is_in_the_catalogue():
    asked = {}
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("is_holding", "is_active") \
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                asked[node.args[0].value] = path
    assert asked and set(asked) <= HOST_IDS, {k: v for k, v in asked.items() if k not in HOST_IDS}
    from traintop.reports import waste
    from traintop.cluster import claims

    assert waste.WASTE_ALL | waste.WASTE_FROM_UTIL | waste.WASTE_FROM_CLOCK <= EVERY_ID
    assert waste.WASTE_FROM_UTIL | waste.WASTE_FROM_CLOCK <= HOST_IDS and waste.WASTE_ALL - HOST_IDS == {"stalled_job"}
    assert {claims.HOST_CLAIMED, claims.RANK_CLAIMED, claims.RANK_OWNERS} <= CLUSTER_IDS


def test_the_corpus_labels_name_rules_of_the_catalogue():
    import sys

    sys.path.insert(0, str(REPO / "bench"))
    try:
        import corpus_labels
    finally:
        sys.path.remove(str(REPO / "bench"))
    named = set()
    for label in corpus_labels.LABELS.values():
        named |= set(label.expect) | set(label.allow) | set(label.wrong)
    assert named and named <= HOST_IDS, named - HOST_IDS


def test_deploy_files_and_docs_name_rules_of_the_catalogue():
    for path in [*(REPO / "deploy").rglob("*.yml"), *(REPO / "tests" / "prometheus").rglob("*.yml")]:
        for rule in re.findall(r'\brule="(\w+)"', path.read_text()):
            assert rule in EVERY_ID, (path.name, rule)
    # the score table of docs/FINDINGS.md: one row per rule and source
    score = re.findall(r"^(\w+)\s+(?:probe|noprobe|smi|dmon)-\S+\s+\d", (REPO / "docs" / "FINDINGS.md").read_text(), re.M)
    assert score and set(score) <= HOST_IDS, set(score) - HOST_IDS


def _table(text: str, heading: str) -> list[list[str]]:
    part = text[text.index(heading):]
    rows = []
    for line in part.splitlines()[1:]:
        if line.startswith("#"):
            break
        if line.startswith("| ") and not line.startswith("| ---"):
            rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows[1:]  # less the header


def test_the_docs_list_every_single_host_rule_by_its_title_with_a_section_each():
    text = (REPO / "docs" / "RULES.md").read_text()
    names = [r[0] for r in _table(text, "## What it recognises")]
    sections = re.findall(r"^### (.+)$", text[text.index("## Each finding"):], re.M)
    titles = [r.title for r in default_rules()]
    # a row may add what it needs ("(probe)"); the rule's title may say more ("(normal)")
    for listed in (names, sections):
        matched = {t for t in titles for n in listed if n.startswith(t) or t.startswith(n)}
        assert matched == set(titles), set(titles) - matched
        assert len(listed) == len(titles)
    assert names == sections  # in the same order


def test_docs_list_every_cross_host_rule_with_its_title_severity_and_thresholds():
    text = (REPO / "docs" / "CLUSTER.md").read_text()
    rows = _table(text, "**The cross-host rules**")
    assert [(r[0].strip("`"), r[1], r[2]) for r in rows] == [(r.id, r.title, r.severity.label)
                                                             for r in CROSS_HOST_RULES]
    cluster_thresholds = {f for f in Thresholds.__dataclass_fields__ if f.startswith(CLUSTER_PREFIX)}
    documented = set(re.findall(r"`(cluster_\w+)`", text))
    assert cluster_thresholds and cluster_thresholds <= documented, cluster_thresholds - documented


def _attributes(path: pathlib.Path) -> set[str]:
    return {n.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)}


def test_cross_host_rules_read_only_the_cluster_thresholds_and_the_others_none_of_them():
    names = set(Thresholds.__dataclass_fields__)
    crosshost = set().union(*(_attributes(p) for p in (REPO / "traintop" / "rules" / "across").glob("*.py"))) & names
    crosshost |= _attributes(REPO / "traintop" / "cluster" / "judge.py") & names
    assert crosshost and all(n.startswith(CLUSTER_PREFIX) for n in crosshost), crosshost
    for path in (REPO / "traintop" / "rules").glob("*.py"):
        if path.name != "config.py":
            assert not {n for n in _attributes(path) if n.startswith(CLUSTER_PREFIX)}, path.name
    # every cluster threshold is read by the cross-host rules
    assert {n for n in names if n.startswith(CLUSTER_PREFIX)} <= crosshost
