"""Who claims what in a Prometheus answer: two sources for one host, one rank claimed twice, one
job id used by several owners.

An agent vouches only for its own node: its GPUs, and the ranks whose probe socket it read
(each with its owner's uid, from the socket's peer credentials, and that uid again as
``job_uid`` where the host's Slurm cgroup shows the process in that very job). Nothing stops a
second agent from calling itself ``nodeA``, or a process of another user, on any host, from
calling itself ``job 1234 rank 0``. So nothing is merged across sources:

- a host whose series come from two scrape targets (``instance``) is shown once per source,
  ``nodeA (from 10.0.0.7:19401)``, and each claim is a finding;
- a job id whose ranks belong to several owners (uids, compared as numbers across hosts: a
  cluster shares them through LDAP or the like) is one job per owner: the owner a host vouches
  for keeps the id, every other one's ranks are ``1234 (uid 1001)``; where no owner, or more
  than one, is vouched for, each is shown with its uid. No rule mixes one owner's ranks or time
  with another's, and it is a finding that names them all;
- a rank of one owner's job claimed by two (host, owner) pairs is used by no rule (either may
  be the forger) and is a finding that names both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from traintop.rules import across

# the rules these raise (rules/across/)
HOST_CLAIMED = across.HOST_CLAIMED.id
RANK_CLAIMED = across.RANK_CLAIMED.id
RANK_OWNERS = across.RANK_OWNERS.id


@dataclass(frozen=True)
class Conflict:
    rule: str  # one of the three above
    host: str
    subject: str
    start: float
    end: float
    evidence: str
    job: str | None = None


def times(values: dict) -> tuple[float, float] | None:
    """The first and last time of a series' values (None: none)."""
    return (min(values), max(values)) if values else None


def _span(s) -> tuple[float, float] | None:
    values = getattr(s, "values", None)
    if values is not None:
        return times(values)
    points = getattr(s, "points", ())
    return (points[0][0], points[-1][0]) if points else None


def _widen(d: dict, key, span) -> None:
    cur = d.get(key)
    if span is None:
        d.setdefault(key, None)
    elif cur is None:
        d[key] = list(span)
    else:
        cur[0], cur[1] = min(cur[0], span[0]), max(cur[1], span[1])


def _bounds(spans) -> tuple[float, float]:
    spans = [s for s in spans if s is not None]
    return (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else (0.0, 0.0)


def host_names(results: list, host_of, conflicts: list):
    """``named(series)``: the host a series is shown under, its source added where two scrape
    targets claim that host. Each contested host adds a Conflict to ``conflicts``."""
    sources: dict[str, dict[str, list | None]] = {}
    for series in results:
        for s in series:
            inst = s.get("instance")
            if inst:
                _widen(sources.setdefault(host_of(s), {}), inst, _span(s))
    contested = {h: insts for h, insts in sources.items() if len(insts) > 1}
    for h, insts in sorted(contested.items()):
        names = sorted(insts)
        a, b = _bounds(insts.values())
        conflicts.append(Conflict(HOST_CLAIMED, h, h, a, b,
                                  f"two sources claim {h}: instance {' and '.join(names[:4])}"
                                  + (f" and {len(names) - 4} more" if len(names) > 4 else "")
                                  + f"; their series are shown apart ('{h} (from {names[0]})'), never merged"))

    def named(s) -> str:
        h = host_of(s)
        if h in contested:
            return f"{h} (from {s.get('instance') or '?'})"
        return h

    return named


def _who(host: str, uid: str) -> str:
    return f"{host} (uid {uid})" if uid else host


def _ranks_text(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks[:8])) + (" …" if len(ranks) > 8 else "")


_QUALIFIED = re.compile(r" \([^()]*\)$")  # JobOwners.name's mark of one owner's share of a job id


def owner_of(uid: str) -> str:
    """A rank's owner as the claims compare it: its uid's number ("" unknown)."""
    return f"uid {uid}" if uid else ""


@dataclass
class _Claimant:
    vouched: bool = False  # a host's Slurm cgroup shows its process in this very job
    ranks: dict = field(default_factory=dict)  # host -> set of ranks
    span: list | None = None  # [first, last] time seen


class JobOwners:
    """Each job id's owners: whether a host vouches for one, on which hosts with which ranks, and
    when. ``name(job, owner)`` is the job that owner's ranks (or GPUs, or time) belong to."""

    def __init__(self) -> None:
        self.by: dict[str, dict[str, _Claimant]] = {}

    def see(self, job: str, owner: str, vouched: bool = False, host: str | None = None, rank: int | None = None,
            span: tuple[float, float] | None = None) -> None:
        c = self.by.setdefault(job, {}).setdefault(owner, _Claimant())
        c.vouched = c.vouched or vouched
        if host is not None:
            c.ranks.setdefault(host, set()).update(() if rank is None else (rank,))
        if span is not None:
            c.span = list(span) if c.span is None else [min(c.span[0], span[0]), max(c.span[1], span[1])]

    def contested(self, job: str) -> bool:
        return len([o for o in self.by.get(job, {}) if o]) > 1

    def keeper(self, job: str) -> str | None:
        """The owner who keeps a contested job's id: the one a host vouches for, where only one is."""
        vouched = [o for o, c in self.by.get(job, {}).items() if o and c.vouched]
        return vouched[0] if len(vouched) == 1 else None

    def name(self, job: str, owner: str) -> str:
        # an id shaped like a name given here ("4242 (uid 1000)", anyone's to claim) is always
        # qualified too: no claim can take the name another owner's share of a job was given
        if not _QUALIFIED.search(job) and (not self.contested(job) or (owner and owner == self.keeper(job))):
            return job
        return f"{job} ({owner or 'owner unknown'})"

    def merged(self, other: "JobOwners", since: float | None = None) -> "JobOwners":
        """Both together (``other``'s claimants last seen before ``since`` left out): a refresh sees
        the owners of the whole window, so a job keeps its name from one read to the next."""
        out = JobOwners()
        for src, cut in ((other, since), (self, None)):
            for job, owners in src.by.items():
                for owner, c in owners.items():
                    if cut is not None and c.span is not None and c.span[1] < cut:
                        continue
                    out.see(job, owner, c.vouched, span=tuple(c.span) if c.span else None)
                    for host, ranks in c.ranks.items():
                        out.by[job][owner].ranks.setdefault(host, set()).update(ranks)
        return out

    def conflicts(self, out: list) -> None:
        """One finding per job id used by several owners, naming each and what became of its ranks."""
        for job, owners in sorted(self.by.items()):
            if not self.contested(job):
                continue
            keeper = self.keeper(job)
            parts = [_told(o, c) for o, c in sorted(owners.items())]
            apart = [f"'{self.name(job, o)}'" for o in sorted(owners) if o != keeper]
            fate = (f"{keeper} keeps job {job} (its host vouches for it); the others are judged apart, as "
                    if keeper else "no host vouches for one of them alone: each is judged apart, as ")
            a, b = _bounds(c.span for c in owners.values())
            host = next((h for o in sorted(owners) if o != keeper for h in sorted(owners[o].ranks)), "")
            out.append(Conflict(RANK_OWNERS, host, f"job {job}", a, b,
                                f"job {job} is used by different users: " + "; ".join(parts[:4])
                                + (f" and {len(parts) - 4} more" if len(parts) > 4 else "")
                                + f". {fate}" + ", ".join(apart[:4]) + (" …" if len(apart) > 4 else ""), job))


def _told(owner: str, c: _Claimant) -> str:
    where = ", ".join(f"{h} {_ranks_text(sorted(rs))}" if rs else h for h, rs in sorted(c.ranks.items())[:4])
    detail = "; ".join(x for x in (where, "its job by its host's Slurm cgroup" if c.vouched else "") if x)
    return (owner or "an unknown owner") + (f" ({detail})" if detail else "")


class RankClaims:
    def __init__(self) -> None:
        self.by: dict[tuple[str, int], dict[tuple[str, str], list | None]] = {}

    def see(self, job: str, rank: int, host: str, uid: str, values: dict) -> None:
        _widen(self.by.setdefault((job, rank), {}), (host, uid), times(values))

    def settle(self, ranks: dict, conflicts: list) -> dict:
        """``ranks`` keyed (job, rank, host, uid) → keyed (job, rank), less the ranks claimed twice
        (``job``: each owner's own, JobOwners.name)."""
        out = {}
        for (job, rank), claimants in sorted(self.by.items()):
            if len(claimants) == 1:
                (host, uid), = claimants
                out[(job, rank)] = ranks[(job, rank, host, uid)]
                continue
            who = sorted(claimants)
            a, b = _bounds(claimants.values())
            conflicts.append(Conflict(RANK_CLAIMED, who[0][0], f"job {job} rank {rank}", a, b,
                                      f"job {job} rank {rank} is claimed by "
                                      + " and by ".join(_who(h, u) for h, u in who[:4])
                                      + "; no rule uses it until one of them stops", job))
        return out


def roll(old: list, new: list, start: float) -> list:
    """The conflicts of a window kept between reads: the newest of each, less those that left it."""
    out: dict[tuple, Conflict] = {}
    for c in list(old) + list(new):
        if c.end >= start:
            out[(c.rule, c.host, c.subject)] = c
    return list(out.values())
