"""What every rule declares, wherever it is judged.

A single-host rule (rules/*.py) is judged by the engine on one host's store; a cross-host rule
(rules/across/) by the same engine on every host's series laid on Prometheus's grid, instant by
instant (cluster/judge.py plays it). What they declare is one, and the catalogue
(``traintop.rules.catalogue()``), the reports and the tests read only this:

- ``id``, unique within its scope, and ``title``;
- ``severity``: its default ``Severity`` (a verdict may raise it);
- ``remedies``: the practitioner's checklist, most useful first;
- ``explains``: the rules whose findings it explains. While both are up, those are shown under
  it ("explained by"), never as causes. A cross-host rule explains the agents' (single-host)
  findings on its job's GPUs;
- ``defers_to``: the rules of its own scope whose verdict, holding on the same subject, rules it
  out. They are judged before it (the catalogue's order; a test checks it).

Its thresholds are fields of ``Thresholds`` (rules/config.py), settable by the config file and
``--set``; a cross-host rule's are named ``cluster_*``.
"""

from __future__ import annotations

from typing import Protocol

from traintop.findings import Severity

HOST = "host"  # judged on one host's samples (the dashboard, a recording, an agent)
CLUSTER = "cluster"  # judged across hosts, on Prometheus's grid


class Declared(Protocol):
    id: str
    title: str
    severity: Severity
    remedies: tuple[str, ...]
    scope: str
    explains: tuple[str, ...]
    defers_to: tuple[str, ...]


class HostRule:
    """The base of the single-host rules: what a rule that explains nothing and defers to nothing
    need not write."""

    scope = HOST
    explains: tuple[str, ...] = ()
    explains_all_gpus = False  # what it explains on any GPU of the job, not only on its own subject
    defers_to: tuple[str, ...] = ()
