"""The cross-host rules: what only a view over every host and rank of a job can see.

Declared as the single-host rules are (rules/declaration.py says what a declaration holds),
with the ``cluster_*`` thresholds of rules/config.py. Those that judge instants (``GridRule``:
a straggler, a stalled job, a starving node, a slow node) are judged by the one engine
(rules/engine.py), instant by instant over one read range of the cluster (``Across``, played
by cluster/judge.py), after the fact: a finding starts where its verdict first held, once it
has held ``cluster_hold_s`` (gaps of up to two steps bridged), and ends where it last held.
What defers to what is the engine's (``is_holding``, in the catalogue's order). Those that
are events or silences (``CrossRule``: GPU errors, a node that stopped, two claims of one
host or rank) are found as such by cluster/judge.py and cluster/claims.py.

``straggler`` is an id of both scopes: one situation (a rank the others wait for), judged on
one host's GPUs by rules/straggler.py and across hosts here.
"""

from __future__ import annotations

from dataclasses import dataclass

from traintop.findings import Severity
from traintop.rules.declaration import CLUSTER

@dataclass(frozen=True)
class CrossRule:
    """A cross-host rule found as an event or a silence, with nothing to hold."""

    id: str
    title: str
    severity: Severity
    remedies: tuple[str, ...]
    explains: tuple[str, ...] = ()  # the agents' (single-host) rules whose verdicts on its job's GPUs it explains
    defers_to: tuple[str, ...] = ()  # cross-host rules that, found on its host and job, fold it into theirs
    scope: str = CLUSTER


NODE_GPU_ERRORS = CrossRule("node_gpu_errors", "GPU errors on a node", Severity.CRITICAL, (
    "Read the node's kernel log for the XID (dmesg | grep -i xid).",
    "Drain the node (scontrol update nodename=… state=drain) before the job is restarted on it.",
))
NODE_MISSING = CrossRule("node_missing", "Node stopped reporting", Severity.CRITICAL, (
    "Check whether the node and its agent are alive (a crash, a reboot, the network).",
    "A training job that lost a node usually hangs in its next collective: check the job too.",
))
# Who claims what (cluster/claims.py); an agent raises the rank claims of its own node too.
HOST_CLAIMED = CrossRule("host_claimed_twice", "Two sources claim one host", Severity.WARNING, (
    "See which scrape targets send this Hostname: count by (instance) (traintop_agent_info{Hostname=\"…\"}).",
    "Stop the agent that should not speak for this host, or give each agent its own --hostname.",
    "Scrape agents without honor_labels (docs/CLUSTER.md): a target then cannot choose its own instance label.",
))
RANK_CLAIMED = CrossRule("rank_claimed_twice", "One rank claimed twice", Severity.WARNING, (
    "Find the processes on the hosts named (traintop --pid, or ps on that host) and the users that own them.",
    "A rank claimed by another user's process is someone posing as the job: report it to the cluster's admins.",
    "Two runs of one job id at once (a restart before the old run ended) claim every rank twice: stop the old one.",
))
RANK_OWNERS = CrossRule("rank_owners_differ", "A job's ranks run as different users", Severity.WARNING, (
    "A job's ranks, on every host, normally belong to one user: find the processes of the uid that is not "
    "the job's on the hosts named (traintop --pid, or ps on that host) and who started them.",
    "Until then each user's ranks are judged as a job of their own ('1234 (uid 1001)'): the user whose job "
    "a host's Slurm cgroup vouches for keeps its id; no rule mixes one user's ranks or time into another's.",
    "uids are compared as numbers across hosts: where the hosts do not share them (no LDAP or the like), one "
    "user's ranks on two hosts look like two users'; give each user one uid everywhere.",
))


from traintop.rules.across.judged import (NodeStarving, SlowNode, Stalled, Straggler,  # noqa: E402
                                          StragglerNode)

STRAGGLER, STRAGGLER_NODE, STALLED, NODE_STARVING, SLOW_NODE = (
    Straggler(), StragglerNode(), Stalled(), NodeStarving(), SlowNode())
GRID_RULES = (Straggler, StragglerNode, Stalled, NodeStarving, SlowNode)  # in the order the engine judges them
# In the order they are judged: a rule comes after those it defers to.
CROSS_HOST_RULES = (STRAGGLER, STRAGGLER_NODE, STALLED, NODE_STARVING, SLOW_NODE, NODE_GPU_ERRORS, NODE_MISSING,
                    HOST_CLAIMED, RANK_CLAIMED, RANK_OWNERS)
