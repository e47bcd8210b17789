"""User settings: rule thresholds from ~/.config/traintop/config.toml and --set flags.

    [thresholds]
    underuse_power_frac = 0.25
    starvation_window_s = 30

Unknown keys and non-numbers are refused with one line; nothing is evaluated.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from dataclasses import fields

from traintop.errors import TraintopError
from traintop.rules.config import DEFAULT, Thresholds
from traintop.text import one_line


def default_path() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "traintop", "config.toml")


def _number(key: str, value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraintopError(f"{where}: {key} must be a number, not {value!r}")
    if value != value or value in (float("inf"), float("-inf")) or value < 0:
        raise TraintopError(f"{where}: {key} must be a finite number ≥ 0")
    return float(value)


def _unknown(key: str, names: set[str]) -> str:
    close = difflib.get_close_matches(key, sorted(names), n=2, cutoff=0.75)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    return f"unknown threshold {key!r}; {hint}`traintop config` lists them"


def describe_thresholds(values: Thresholds, path: str) -> str:
    """Every threshold with its default and, where it differs, the value in effect."""
    rows = []
    for f in fields(Thresholds):
        now, default = getattr(values, f.name), getattr(DEFAULT, f.name)
        rows.append(f"  {f.name:<28} {now:>8g}" + ("" if now == default else f"   (default {default:g})"))
    head = (f"Rule thresholds: set them in {one_line(path)} under [thresholds], or with --set NAME=NUMBER.\n"
            f"  {'name':<28} {'value':>8}")
    return "\n".join([head, *rows])


def load_thresholds(path: str | None = None, overrides: list[str] | None = None) -> Thresholds:
    """Defaults, then the config file (the default one only if it exists), then --set KEY=VALUE."""
    names = {f.name for f in fields(Thresholds)}
    values: dict[str, float] = {}
    file = path or default_path()
    if path is not None or os.path.exists(file):
        try:
            with open(file, "rb") as fh:
                doc = tomllib.load(fh)
        except FileNotFoundError:
            raise TraintopError(f"{file}: no such config file") from None
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise TraintopError(f"{file}: not valid TOML ({e})") from None
        table = doc.get("thresholds", {})
        if not isinstance(table, dict):
            raise TraintopError(f"{file}: [thresholds] must be a table")
        for key, value in table.items():
            if key not in names:
                raise TraintopError(f"{file}: {_unknown(key, names)}")
            values[key] = _number(key, value, file)
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep:
            raise TraintopError(f"--set {item!r}: use --set NAME=NUMBER (`traintop config` lists the names)")
        if key not in names:
            raise TraintopError(f"--set {item!r}: {_unknown(key, names)}; use --set NAME=NUMBER with one of them")
        try:
            values[key] = _number(key, float(raw), "--set")
        except ValueError:
            raise TraintopError(f"--set {key}: {raw!r} is not a number") from None
    return DEFAULT.with_overrides(**values) if values else DEFAULT
