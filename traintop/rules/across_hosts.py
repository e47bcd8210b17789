"""The cross-host rules: what only a view over every host and rank of a job can see.

Declared here beside the single-host rules (rules/declaration.py says what a declaration
holds); judged on every host's series laid on Prometheus's grid by cluster/crosshost.py, with
the ``cluster_*`` thresholds of rules/config.py.

``straggler`` is an id of both scopes: one situation (a rank the others wait for), judged on
one host's GPUs by rules/straggler.py and across hosts here.
"""

from __future__ import annotations

from dataclasses import dataclass

from traintop.findings import Severity
from traintop.rules.declaration import CLUSTER

# An agent's verdicts on a GPU of a job that has a straggler: the waiting ranks' GPUs idle (or
# spin) for it, the straggler's own starves (the cause its finding names).
_WAITING_LOOKS_LIKE = ("starvation", "underuse", "idle_gpu")


@dataclass(frozen=True)
class CrossRule:
    id: str
    title: str
    severity: Severity
    remedies: tuple[str, ...]
    explains: tuple[str, ...] = ()  # the agents' (single-host) rules whose verdicts on its job's GPUs it explains
    defers_to: tuple[str, ...] = ()  # cross-host rules that, found on its host and job, fold it into theirs
    scope: str = CLUSTER


STRAGGLER = CrossRule("straggler", "Straggler rank", Severity.WARNING, (
    "Look at the lagging rank's host: its input pipeline, its GPU clocks, other processes on it.",
    "If its loader starves: more DataLoader workers on that node, or a local copy of the data.",
    "Exclude a persistently slow node from the allocation (Slurm --exclude) and report it.",
), explains=_WAITING_LOOKS_LIKE)
STRAGGLER_NODE = CrossRule("straggler_node", "Straggler node", Severity.WARNING, STRAGGLER.remedies,
                           explains=_WAITING_LOOKS_LIKE)
STALLED = CrossRule("stalled_job", "Job stalled", Severity.CRITICAL, (
    "Dump the ranks' stacks (py-spy dump --pid) to see where they wait: usually a collective.",
    "Set NCCL_DEBUG=INFO and TORCH_NCCL_ASYNC_ERROR_HANDLING=1 so a hang becomes an error.",
    "Check for a dead or missing rank (a node that stopped reporting).",
))
# A node whose loader starves the job and the straggler it makes are one finding: the straggler's,
# which names the rank and carries the cause.
NODE_STARVING = CrossRule("node_starving", "One node's loader starves the job", Severity.WARNING, (
    "Compare that node's storage and CPU with the others (a slower mount, fewer cores, a busy neighbour).",
    "Raise DataLoader num_workers on that node, or stage the data on its local disk.",
), defers_to=(STRAGGLER.id, STRAGGLER_NODE.id))
SLOW_NODE = CrossRule("slow_node", "Slow node: all its GPUs clocked down", Severity.WARNING, (
    "Check that node's cooling and power (nvidia-smi -q -d PERFORMANCE shows why clocks are held).",
    "Drain it for maintenance if it persists: the whole job runs at its pace.",
))
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

# In the order they are judged: a rule comes after those it defers to.
CROSS_HOST_RULES = (STRAGGLER, STRAGGLER_NODE, STALLED, NODE_STARVING, SLOW_NODE, NODE_GPU_ERRORS, NODE_MISSING,
                    HOST_CLAIMED, RANK_CLAIMED, RANK_OWNERS)
