"""Thresholds from the config file and --set: validated, one-line errors, applied by analyze."""

import subprocess
import sys

import pytest

from traintop.watch.config import load_thresholds
from traintop.errors import TraintopError
from traintop.rules.config import DEFAULT


def test_defaults_without_a_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert load_thresholds() == DEFAULT


def test_file_then_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "traintop").mkdir()
    (tmp_path / "traintop" / "config.toml").write_text("[thresholds]\nunderuse_power_frac = 0.2\n"
                                                      "starvation_window_s = 30\n")
    t = load_thresholds(overrides=["starvation_window_s=45"])
    assert t.underuse_power_frac == 0.2 and t.starvation_window_s == 45.0


@pytest.mark.parametrize("text,needle", [
    ("[thresholds]\nno_such = 1\n", "unknown threshold"),
    ("[thresholds]\nunderuse_power_frac = 'high'\n", "must be a number"),
    ("[thresholds\n", "not valid TOML"),
    ("thresholds = 3\n", "must be a table"),
])
def test_bad_files(tmp_path, text, needle):
    p = tmp_path / "c.toml"
    p.write_text(text)
    with pytest.raises(TraintopError, match=needle):
        load_thresholds(str(p))


@pytest.mark.parametrize("item,needle", [
    ("nope=1", "use --set NAME=NUMBER"), ("underuse_power_frac=x", "not a number"),
    ("underuse_power_frac", "use --set"), ("underuse_power_frac=-1", "between 0 and 1, not -1"),
    # a window longer than the samples kept would silently turn the rule off
    ("starvation_window_s=1e308", "between 1 and 600, not 1e[+]308"), ("starvation_window_s=inf", "between 1 and 600"),
    ("starvation_window_s=nan", "between 1 and 600"), ("step_regression_ratio=0.5", "between 1 and 100"),
    ("starvation_idle_util=101", "between 0 and 100"),
])
def test_bad_flags(tmp_path, item, needle):
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    with pytest.raises(TraintopError, match=needle):
        load_thresholds(str(empty), [item])


def test_every_threshold_has_a_range_that_holds_its_default(tmp_path, monkeypatch):
    from dataclasses import asdict

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    from traintop.rules.config import RANGES

    assert set(RANGES) == set(asdict(DEFAULT))
    for name, value in asdict(DEFAULT).items():
        lo, hi = RANGES[name]
        assert lo <= value <= hi, name
        load_thresholds(None, [f"{name}={lo}"])
        load_thresholds(None, [f"{name}={hi}"])


@pytest.mark.parametrize("data,needle", [
    (b"[thresholds]\nunderuse_power_frac = 0.2 # \xff\xfe\n", "not UTF-8"),
    (b"[thresholds]\nx = " + b"[" * 50_000 + b"]" * 50_000 + b"\n", "not valid TOML"),
    (b"[thresholds]\ncreep_window_s = 1e400\n", "between 1 and 600"),
])
def test_hostile_config_files(tmp_path, data, needle):
    p = tmp_path / "c.toml"
    p.write_bytes(data)
    with pytest.raises(TraintopError, match=needle):
        load_thresholds(str(p))


def test_analyze_applies_them(tmp_path):
    rec = tmp_path / "u.ttrec"
    subprocess.run([sys.executable, "-m", "traintop", "record", str(rec), "--simulate", "underused",
                    "--duration", "120", "--fast", "--quiet"], check=True, timeout=120)

    def rules(*extra):
        r = subprocess.run([sys.executable, "-m", "traintop", "analyze", str(rec), *extra],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout
    assert "GPU underused" in rules()
    assert "GPU underused" not in rules("--set", "underuse_power_frac=0.05")
    r = subprocess.run([sys.executable, "-m", "traintop", "analyze", str(rec), "--set", "bogus=1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def test_traintop_config_shows_each_range(tmp_path):
    import os

    from traintop.rules.config import RANGES

    r = subprocess.run([sys.executable, "-m", "traintop", "config"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, XDG_CONFIG_HOME=str(tmp_path)))
    rows = {ln.split()[0]: ln.split()[1:] for ln in r.stdout.splitlines()[2:]}
    assert {k: v[2] for k, v in rows.items()} == {name: f"{lo:g}-{hi:g}" for name, (lo, hi) in RANGES.items()}
    # every line: the value in effect, then the default (the same here: nothing is changed)
    assert all(len(v) == 3 and v[0] == v[1] for v in rows.values()), r.stdout
