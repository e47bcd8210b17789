"""Whether a host name or address stays on this machine (the agent's --listen warning; asking a
Prometheus on this machine for uncompressed answers)."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
