"""What a probe reader grants the probes it reads: connections per user, descriptors, ranks,
messages and bytes a second, and time a tick.

A node's agent runs as root and reads every user's probe directory; everything in it (how
many sockets, what they send, how fast) is that user's word. Past a bound the probe is
refused, never the agent: the refusal is counted by reason (``refused``, the agent's
``traintop_agent_probe_refused_total``) and said once in one line (``take_notes``).
"""

from __future__ import annotations

import dataclasses
import os
import resource
import time

REASONS = ("per_user_limit", "descriptors", "rank_limit", "rate", "scan_limit")
MAX_NOTES = 256  # distinct things said once; past it, the counters alone


@dataclasses.dataclass(frozen=True)
class ProbeLimits:
    per_user: int = 64  # connections to one user's probes (the owner of their directory)
    fd_reserve: int = 64  # descriptors never taken for probes (the HTTP server, NVML, files), at least
    ranks_per_user: int = 256  # (job, rank) pairs one user's probes may name within rank_ttl_s
    rank_ttl_s: float = 60.0  # a rank not heard of for this long frees its place
    lines_per_s: float = 200.0  # a probe sends 3 messages a second (20 at its fastest)
    burst_lines: int = 1000  # saved up: a reader that fell behind by seconds still takes them all
    bytes_per_s: float = float(1 << 20)  # a probe's messages are a few KiB; one may be 1 MiB
    burst_bytes: int = 2 << 20  # at least one message of the longest (probe_client.MAX_LINE) at once
    tick_bytes: int = 8 << 20  # read from all probes together in one tick
    tick_read_s: float = 0.25  # spent reading probes in one tick, all together
    scan_entries: int = 4096  # entries looked at in one probe directory per scan
    tick_scan_s: float = 0.25  # spent scanning probe directories in one tick, all together


class Allowance:
    """A token bucket: ``per_s`` a second, at most ``burst`` saved up."""

    def __init__(self, per_s: float, burst: float, now: float) -> None:
        self.per_s, self.burst = per_s, burst
        self.left = burst
        self.at = now

    def refill(self, now: float) -> None:
        if now > self.at:
            self.left = min(self.burst, self.left + (now - self.at) * self.per_s)
        self.at = now

    def take(self, n: int) -> int:
        """As many of ``n`` as are left (taken)."""
        k = max(0, min(n, int(self.left)))
        self.left -= k
        return k


def open_descriptors() -> int | None:
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir held
    except OSError:
        return None


class ProbeGuard:
    """The bounds of one agent (or one attached reader), shared by its probe clients."""

    def __init__(self, limits: ProbeLimits | None = None, clock=time.monotonic) -> None:
        self.limits = limits or ProbeLimits()
        self._clock = clock
        self.refused = dict.fromkeys(REASONS, 0)
        self._notes: list[str] = []
        self._said: set[tuple] = set()
        self._open: dict[int, int] = {}  # owner uid -> connections open
        self._ranks: dict[int, dict[tuple, float]] = {}  # owner uid -> (job, rank, ...) -> last heard of
        self._fds_left: int | None = None  # this tick's, counted at the first connect
        self._tick_bytes = self.limits.tick_bytes
        self._read_until = 0.0
        self._scan_until = 0.0

    # -- one tick ------------------------------------------------------------------
    def new_tick(self) -> None:
        now = self._clock()
        self._fds_left = None
        self._tick_bytes = self.limits.tick_bytes
        self._read_until = now + self.limits.tick_read_s
        self._scan_until = now + self.limits.tick_scan_s

    def read_time_left(self) -> bool:
        return self._clock() < self._read_until

    def scan_time_left(self) -> bool:
        return self._clock() < self._scan_until

    def tick_bytes(self) -> int:
        return self._tick_bytes

    def spend_bytes(self, n: int) -> None:
        self._tick_bytes -= n

    # -- refusals --------------------------------------------------------------------
    def refuse(self, reason: str, n: int = 1, note: str | None = None, key=None) -> None:
        """Count ``n`` refusals; ``note`` is said once for (reason, key)."""
        self.refused[reason] += n
        if note is not None and (reason, key) not in self._said and len(self._said) < MAX_NOTES:
            self._said.add((reason, key))
            self._notes.append(note)

    def take_notes(self) -> list[str]:
        out, self._notes = self._notes, []
        return out

    # -- connections and descriptors -------------------------------------------------
    def open_count(self, owner: int) -> int:
        return self._open.get(owner, 0)

    def may_connect(self, owner: int) -> str | None:
        """Why no further connection to ``owner``'s probes may be opened now (None: one may)."""
        if self._open.get(owner, 0) >= self.limits.per_user:
            return "per_user_limit"
        if self._fds_left is None:
            self._fds_left = self._descriptors_left()
        if self._fds_left <= 0:
            return "descriptors"
        return None

    def _descriptors_left(self) -> int:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            soft = 1 << 20
        used = open_descriptors()
        if used is None:  # no /proc: what we opened ourselves, and a guess for the rest
            used = sum(self._open.values()) + 64
        return soft - max(self.limits.fd_reserve, soft // 8) - used

    def no_descriptors(self) -> None:
        """Opening one failed for want of descriptors: none more this tick."""
        self._fds_left = 0

    def opened(self, owner: int) -> None:
        self._open[owner] = self._open.get(owner, 0) + 1
        if self._fds_left is not None:
            self._fds_left -= 1

    def closed(self, owner: int) -> None:
        n = self._open.get(owner, 0) - 1
        if n > 0:
            self._open[owner] = n
        else:
            self._open.pop(owner, None)

    # -- ranks -----------------------------------------------------------------------
    def admit_rank(self, owner: int, key: tuple) -> bool:
        """Whether a rank named ``key`` (job, rank, ...) by ``owner``'s probe may be kept: those it
        named within ``rank_ttl_s`` may; a new one only while it names fewer than ``ranks_per_user``."""
        now = self._clock()
        known = self._ranks.setdefault(owner, {})
        if key in known:
            known[key] = now
            return True
        if len(known) >= self.limits.ranks_per_user:
            for k in [k for k, t in known.items() if now - t > self.limits.rank_ttl_s]:
                del known[k]
            if len(known) >= self.limits.ranks_per_user:
                return False
        known[key] = now
        return True
