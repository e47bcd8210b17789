"""What the benchmarks share: writing their figures where --json asks."""

from __future__ import annotations

import json


def save_json(path: str | None, figures) -> None:
    """``--json PATH``: the figures as indented JSON (nothing without a path)."""
    if path:
        with open(path, "w") as f:
            json.dump(figures, f, indent=1)
