"""Judging the cross-host rules (traintop/rules/across/) on one read range of a cluster.

The rules that judge instants are the engine's (traintop/rules/engine.py): it plays the grid
instant by instant, holds and releases, and defers, as it does on one host's store; each
finding it ends is then said with the numbers over its time (the rule's ``describe``). GPU
errors, a node that stopped and two claims of one host or rank are events and silences: found
as such, with the same record. Every finding is the one ``Finding``, with its host and the
scope "cluster".
"""

from __future__ import annotations

import dataclasses

from traintop.cluster.fetch import ClusterData
from traintop.findings import Finding
from traintop.rules.across import (GRID_RULES, HOST_CLAIMED, NODE_GPU_ERRORS, NODE_MISSING, RANK_CLAIMED,
                                   RANK_OWNERS, CrossRule)
from traintop.rules.across.grid import Across
from traintop.rules import catalogue
from traintop.rules.config import DEFAULT, Thresholds
from traintop.rules.declaration import CLUSTER, HOST
from traintop.rules.engine import RulesEngine
from traintop.store import Store
from traintop.units import fmt_duration

_CLAIMS = {r.id: r for r in (HOST_CLAIMED, RANK_CLAIMED, RANK_OWNERS)}
EVENTS = ("node_gpu_errors", "node_missing", "claims")  # what dcgm-exporter's series alone carry, with slow_node


def judge(data: ClusterData, config: Thresholds = DEFAULT, rules=GRID_RULES, events=EVENTS) -> list[Finding]:
    """The cross-host findings of ``data``: ``rules`` (classes of rules/across/judged.py) judged by the
    engine over the grid, then the ``events``."""
    x = Across.of(data, config, {r.id: r.title for r in catalogue() if r.scope == HOST})
    out = _played(x, rules) if rules else []
    if "node_gpu_errors" in events:
        out += gpu_errors(data)
    if "node_missing" in events:
        out += missing_nodes(data, config)
    if "claims" in events:
        out += [found(_CLAIMS[c.rule], c.host, c.subject, c.start, c.end, c.evidence) for c in data.conflicts]
    return out


def _played(x: Across, rules) -> list[Finding]:
    judged = [cls(x.data.step, x.config.cluster_hold_s) for cls in rules]
    engine = RulesEngine(rules=judged, config=x.config, max_history=1 << 30)
    store = Store(2)  # the rules read the read range (``across``), not a store
    for t in x.data.grid:
        engine.judge(store, t, across=x)
    engine.close_all(x.data.end)
    by_id = {r.id: r for r in judged}
    return [dataclasses.replace(f, evidence=by_id[f.rule].describe(x, f), id=0) for f in engine.alerts]


def found(rule: CrossRule, host: str, subject: str, start: float, end: float, evidence: str) -> Finding:
    return Finding(rule.id, rule.title, subject, rule.severity, start, end, evidence, tuple(rule.remedies),
                   host=host, scope=CLUSTER)


def gpu_errors(data: ClusterData) -> list[Finding]:
    out = []
    for h in sorted({h for h, _ in data.gpus}):
        bad = []
        times: list[float] = []  # of every GPU's events
        for (gh, i), g in sorted(data.gpus.items()):
            if gh != h:
                continue
            events = []
            for series, label in ((g.xid_total, "XID"), (g.ecc_uncorrected, "uncorrectable ECC")):
                pts = sorted(series.items())
                for (t0, v0), (t1, v1) in zip(pts, pts[1:]):
                    if v1 > v0:
                        events.append((t1, label))
            if events:
                codes = sorted({int(v) for v in g.last_xid.values() if v})
                bad.append(f"GPU {i}: {len(events)} new " + ", ".join(sorted({lbl for _, lbl in events}))
                           + (f" (XID {', '.join(map(str, codes))})" if codes else ""))
                times += [t for t, _ in events]
        if bad:
            out.append(found(NODE_GPU_ERRORS, h, h, min(times), max(times), f"{h}: " + "; ".join(bad)))
    return out


def last_seen(data: ClusterData) -> dict[str, float]:
    """Each host's newest sample in the window (its GPUs' utilization, its ranks' step counts)."""
    seen: dict[str, float] = {}
    for (h, _), g in data.gpus.items():
        if g.util:
            seen[h] = max(seen.get(h, 0.0), max(g.util))
    for r in data.ranks.values():
        if r.steps:
            seen[r.host] = max(seen.get(r.host, 0.0), max(r.steps))
    return seen


def silent_since(data: ClusterData, config: Thresholds = DEFAULT) -> dict[str, float]:
    """Hosts whose series stopped, each with the time of its last sample (its own sample time where
    Prometheus gave those: the grid carries a sample on for a while). Stopped while others go on
    (as `missing_nodes` judges), or, where every host stopped, long before the window's end."""
    seen = last_seen(data)
    if not seen:
        return {}
    newest = max(seen.values())
    gap = _missing_after(data, config)
    return {h: min(t, data.samples.last(h, t)) for h, t in seen.items()
            if newest - t > gap or data.end - t > max(6 * data.step, 60.0)}


def silence(data: ClusterData, since: float) -> float:
    """How long a host has been silent at the end of the read: the one age the host's line, its
    finding's span and its evidence all say (to a tenth of a second, as the span is shown)."""
    return round(data.end - since, 1)


def silent_hosts(data: ClusterData, config: Thresholds = DEFAULT) -> dict[str, float]:
    """Hosts whose series stopped: seconds since each one's last sample (``silence``)."""
    return {h: silence(data, t) for h, t in silent_since(data, config).items()}


def _missing_after(data: ClusterData, c: Thresholds) -> float:
    return max(3 * data.step, c.cluster_node_missing_s)


def missing_nodes(data: ClusterData, config: Thresholds = DEFAULT) -> list[Finding]:
    """A node whose series stopped while the others' went on: still silent at the end of the range,
    or silent for a while within it (from its real sample times: Prometheus's grid carries a value
    over a gap). A silence of every node at once is Prometheus's gap, not theirs (a note)."""
    last_seen_ = last_seen(data)
    if len(last_seen_) < 2:
        return []
    newest = max(last_seen_.values())
    gap = _missing_after(data, config)
    out = []
    for h, t in sorted(last_seen_.items()):
        jobs = sorted({r.job for r in data.ranks.values() if r.host == h})
        ran = f"; it ran ranks of job {', '.join(jobs)}" if jobs else ""
        for a, b, silent in data.samples.silences(h):
            if silent > max(gap, data.samples.tolerance) and b >= data.start and a <= data.end:
                out.append(found(NODE_MISSING, h, h, max(a, data.start), b,
                                 f"{h}'s series stopped while the other nodes' went on ({silent:.0f} s without it), "
                                 f"then came back" + ran))
        if newest - t > gap:
            t = min(t, data.samples.last(h, t))  # the grid carried its last sample on for a while
            # up to the end of the read, as the host's own line counts it: one age on the screen
            out.append(found(NODE_MISSING, h, h, t, data.end,
                             f"{h}'s series stopped at its last sample while the other nodes' go on "
                             f"({fmt_duration(silence(data, t))} without it)" + ran))
    return out
