"""The one finding record: what every front end shows, records, exports and reports.

The engine emits it (``RulesEngine.findings()``), frozen, so the view, a recording,
``analyze``, the agent's series, ``--on-finding`` and the cluster report all hold the same
thing; a front end that adds something (the cluster report's host and scope) makes a new
record with ``dataclasses.replace``. No drawing, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class Severity(IntEnum):
    INFO = 1
    WARNING = 2
    CRITICAL = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> "Severity":
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown severity {text!r} (use info, warning or critical)") from None


@dataclass(frozen=True, slots=True)
class Finding:
    """One finding of one rule about one subject, as it stood when it was taken."""

    rule: str
    title: str
    subject: str  # gpu0, host, process, rank 3, a node's name …
    severity: Severity
    start: float  # unix time
    end: float | None  # None: still holds
    evidence: str
    remedies: tuple[str, ...]
    explained_by: str | None = None  # "rule subject" of the stronger finding that explains this one
    gpu_hours: float = 0.0  # what it cost (traintop.reports.waste): analyze and the cluster report fill it in
    energy_kwh: float = 0.0  # what its GPU(s) drew while it lasted
    id: int = 0  # the engine's number for it (stable while it is up)
    host: str | None = None  # the cluster report's: whose finding
    scope: str | None = None  # the cluster report's: "host" (an agent's or a local rule's) or "cluster" (cross-host)

    @property
    def active(self) -> bool:
        return self.end is None
