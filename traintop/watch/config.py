"""User settings: rule thresholds from ~/.config/traintop/config.toml and --set flags.

    [thresholds]
    underuse_power_frac = 0.25
    starvation_window_s = 30

Unknown keys, non-numbers and values outside a threshold's range (``RANGES`` in
traintop/rules/config.py) are refused with one line; nothing is evaluated. The file must be
a regular file of at most 1 MiB of UTF-8 text.
"""

from __future__ import annotations

import difflib
import os
import sys
from dataclasses import fields

from traintop.errors import TraintopError
from traintop.files import open_regular
from traintop.rules.config import CLUSTER_PREFIX, DEFAULT, RANGES, Thresholds
from traintop.text import one_line

MAX_CONFIG_BYTES = 1 << 20


def default_path() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "traintop", "config.toml")


def _number(key: str, value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraintopError(f"{where}: {key} must be a number, not {value!r}")
    lo, hi = RANGES[key]
    if not lo <= value <= hi:  # NaN fails too
        raise TraintopError(f"{where}: {key} must be between {lo:g} and {hi:g}, not {value:g}")
    return float(value)


def _unknown(key: str, names: set[str]) -> str:
    close = difflib.get_close_matches(key, sorted(names), n=2, cutoff=0.75)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    return f"unknown threshold {key!r}; {hint}`traintop config` lists them"


def describe_thresholds(values: Thresholds, path: str) -> str:
    """Every threshold: the value in effect, its default and its range; "changed" marks a value
    the config file or --set moved from its default."""
    rows = []
    width = max(len(f.name) for f in fields(Thresholds))
    for f in fields(Thresholds):
        now, default = getattr(values, f.name), getattr(DEFAULT, f.name)
        lo, hi = RANGES[f.name]
        rows.append(f"  {f.name:<{width}} {now:>9g} {default:>9g}  {f'{lo:g}-{hi:g}':<12}"
                    f"{'' if now == default else ' changed'}".rstrip())
    head = (f"Rule thresholds: set them in {one_line(path)} under [thresholds], or with --set NAME=NUMBER "
            f"({CLUSTER_PREFIX}*: the cross-host rules of traintop cluster and analyze --prometheus).\n"
            f"  {'name':<{width}} {'in effect':>9} {'default':>9}  range")
    return "\n".join([head, *rows])


def _read_toml(file: str) -> dict:
    with open_regular(file, "config file") as fh:  # a FIFO or a device is refused before any read
        data = fh.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise TraintopError(f"{file}: larger than {MAX_CONFIG_BYTES // 1024} KiB; not a traintop config file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraintopError(f"{file}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    # only where a config file exists: `traintop record` should not load a parser it never uses
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # the same parser, from PyPI (a dependency on 3.10 only)
        import tomli as tomllib

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TraintopError(f"{file}: not valid TOML ({e})") from None
    except RecursionError:
        raise TraintopError(f"{file}: not valid TOML (nested too deeply)") from None


def load_thresholds(path: str | None = None, overrides: list[str] | None = None) -> Thresholds:
    """Defaults, then the config file (the default one only if it exists), then --set KEY=VALUE."""
    names = {f.name for f in fields(Thresholds)}
    values: dict[str, float] = {}
    file = path or default_path()
    if path is not None or os.path.exists(file):
        if not os.path.lexists(file):
            raise TraintopError(f"{file}: no such config file")
        doc = _read_toml(file)
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
            number = float(raw)
        except ValueError:
            raise TraintopError(f"--set {key}: {raw!r} is not a number") from None
        values[key] = _number(key, number, "--set")
    return DEFAULT.with_overrides(**values) if values else DEFAULT
