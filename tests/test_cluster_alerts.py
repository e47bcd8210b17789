"""The shipped Prometheus rules and Grafana dashboard: promtool checks and unit-tests the
rules; every series a rule or a panel reads is one the agent exposes."""

import json
import os
import re
import shutil
import subprocess

import pytest

from traintop.cluster import series as S

DEPLOY = os.path.join(os.path.dirname(__file__), "..", "deploy")
RULES = os.path.join(DEPLOY, "prometheus")
UNIT_TESTS = os.path.join(os.path.dirname(__file__), "prometheus")  # promtool's unit tests of the rules
DASHBOARD = os.path.join(DEPLOY, "grafana", "traintop-dashboard.json")
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="no promtool (scripts/test installs Debian's prometheus)")

# names made by the recording rules, and Prometheus's own
OTHER = {"up", "ALERTS"}


def unknown_series(expr: str, also=frozenset()) -> set[str]:
    names = set(re.findall(r"\b(traintop_[a-z_]+)\b", expr)) | set(re.findall(r"\b(up)\{", expr))
    return {n for n in names if n not in S.all_names() | OTHER | set(also)}


def dashboard_exprs() -> list[str]:
    with open(DASHBOARD) as f:
        d = json.load(f)
    return [t["expr"] for p in d["panels"] for t in p.get("targets", [])] + \
        [v["definition"] for v in d["templating"]["list"] if "definition" in v]


def rule_exprs(name: str) -> list[str]:
    text = open(os.path.join(RULES, name)).read()
    return re.findall(r"expr: *\|?\n?((?:.*\n)+?)(?= {6}[a-z]+:| *- (?:alert|record):|\Z)", text)


@needs_promtool
def test_promtool_checks_the_rules():
    r = subprocess.run([PROMTOOL, "check", "rules", "traintop-alerts.yml", "traintop-recording.yml"],
                       cwd=RULES, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_promtool_unit_tests_of_the_alerts_pass():
    # a finding pages at once when critical and after 5 minutes as a warning; a job whose step
    # counters stay flat, and a rank 1.75x slower than its job, raise their alerts
    r = subprocess.run([PROMTOOL, "test", "rules", "traintop-alerts.test.yml"], cwd=UNIT_TESTS, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_promtool_checks_every_file_in_the_rules_folder():
    """`promtool check rules deploy/prometheus/*.yml`, as a user runs it: rule files only there."""
    import glob

    files = sorted(glob.glob(os.path.join(RULES, "*.yml")))
    assert len(files) >= 2
    r = subprocess.run([PROMTOOL, "check", "rules", *files], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_series_the_rules_and_dashboard_read_is_one_the_agent_exposes():
    exprs = dashboard_exprs() + rule_exprs("traintop-alerts.yml") + rule_exprs("traintop-recording.yml")
    assert len(exprs) >= 20
    for e in exprs:
        assert not unknown_series(e), e
    assert unknown_series("rate(traintop_gpu_utilisation_ratio[5m])") == {"traintop_gpu_utilisation_ratio"}


def test_dashboard_is_grafana_json_with_panels_and_variables():
    with open(DASHBOARD) as f:
        d = json.load(f)
    assert d["uid"] and d["title"]
    assert {v["name"] for v in d["templating"]["list"]} >= {"datasource", "job", "host"}
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        assert p["targets"] and all(t["expr"] for t in p["targets"])
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24


def test_every_agent_series_comes_from_a_field_of_the_samples():
    from traintop import metrics

    for group, table in (("gpu", S.GPU_SERIES), ("rank", S.RANK_SERIES), ("host", S.HOST_SERIES)):
        for s in table:
            assert metrics.checked_name(group, s.field) == s.field
            assert s.name.endswith(("_ratio", "_bytes", "_watts", "_joules_total", "_celsius", "_hertz", "_reasons",
                                    "_bytes_per_second", "_errors_total", "_seconds", "_total"))
