"""How many of a GPU's NVLinks are up: read once at start (``nvmlDeviceGetNvLinkState`` per link).

The traffic itself is GPM's (gpm.py: ``nvlink_tx``/``nvlink_rx``, all links together). A GPU
without NVLink answers NOT_SUPPORTED for link 0 (None: "no NVLink"); the links past the last
one a GPU has answer INVALID_ARGUMENT or NOT_SUPPORTED, which ends the count. Never raises.
"""

from __future__ import annotations

_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS of older bindings (H100 has 18 links; newer bindings say 36)


def active_links(nv, handle) -> int | None:
    """Active NVLinks of one GPU; None where it has none that NVML knows of or the call is missing."""
    fn = getattr(nv, "nvmlDeviceGetNvLinkState", None)
    if fn is None:
        return None
    limit = getattr(nv, "NVML_NVLINK_MAX_LINKS", _MAX_LINKS)
    if not isinstance(limit, int) or not 0 < limit <= 64:
        limit = _MAX_LINKS
    active = 0
    seen = 0
    for link in range(limit):
        try:
            state = fn(handle, link)
        except Exception:  # NVMLError past the last link (or none at all); any odd answer: stop
            break
        seen += 1
        if state == 1:  # NVML_FEATURE_ENABLED
            active += 1
    return active if seen else None
