"""Who claims what in a Prometheus answer: two sources for one host, one rank claimed twice.

An agent vouches only for its own node: its GPUs, and the ranks whose probe socket it read
(each with its owner's uid, from the socket's peer credentials). Nothing stops a second
agent from calling itself ``nodeA``, or a process of another user from calling itself
``job 1234 rank 0``. So nothing is merged across sources:

- a host whose series come from two scrape targets (``instance``) is shown once per source,
  ``nodeA (from 10.0.0.7:19401)``, and each claim is a finding;
- a rank of a job claimed by two (host, owner) pairs is used by no rule (either may be the
  forger) and is a finding that names both; ranks of one job on one host that belong to
  different users are a finding too.
"""

from __future__ import annotations

from dataclasses import dataclass

from traintop.rules import across_hosts

# the rules these raise (rules/across_hosts.py)
HOST_CLAIMED = across_hosts.HOST_CLAIMED.id
RANK_CLAIMED = across_hosts.RANK_CLAIMED.id
RANK_OWNERS = across_hosts.RANK_OWNERS.id


@dataclass(frozen=True)
class Conflict:
    rule: str  # one of the three above
    host: str
    subject: str
    start: float
    end: float
    evidence: str
    job: str | None = None


def _times(values: dict) -> tuple[float, float] | None:
    return (min(values), max(values)) if values else None


def _span(s) -> tuple[float, float] | None:
    values = getattr(s, "values", None)
    if values is not None:
        return _times(values)
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


class RankClaims:
    def __init__(self) -> None:
        self.by: dict[tuple[str, int], dict[tuple[str, str], list | None]] = {}

    def see(self, job: str, rank: int, host: str, uid: str, values: dict) -> None:
        _widen(self.by.setdefault((job, rank), {}), (host, uid), _times(values))

    def settle(self, ranks: dict, conflicts: list) -> dict:
        """``ranks`` keyed (job, rank, host, uid) → keyed (job, rank), less the ranks claimed twice."""
        out = {}
        owners: dict[tuple[str, str], dict[str, list[int]]] = {}
        for (job, rank), claimants in sorted(self.by.items()):
            for host, uid in claimants:
                if uid:
                    owners.setdefault((job, host), {}).setdefault(uid, []).append(rank)
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
        for (job, host), by_uid in sorted(owners.items()):
            if len(by_uid) > 1:
                spans = [self.by[(job, r)].get((host, u)) for u, rs in by_uid.items() for r in rs]
                a, b = _bounds(spans)
                parts = [f"uid {u} ({_ranks_text(rs)})" for u, rs in sorted(by_uid.items())]
                conflicts.append(Conflict(RANK_OWNERS, host, f"job {job}", a, b,
                                          f"ranks of job {job} on {host} belong to different users: "
                                          + ", ".join(parts[:4]), job))
        return out


def roll(old: list, new: list, start: float) -> list:
    """The conflicts of a window kept between reads: the newest of each, less those that left it."""
    out: dict[tuple, Conflict] = {}
    for c in list(old) + list(new):
        if c.end >= start:
            out[(c.rule, c.host, c.subject)] = c
    return list(out.values())
