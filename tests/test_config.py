"""Thresholds from the config file and --set: validated, one-line errors, applied by analyze."""

import subprocess
import sys

import pytest

from traintop.config import load_thresholds
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


@pytest.mark.parametrize("item,needle", [("nope=1", "use --set NAME=NUMBER"), ("underuse_power_frac=x", "not a number"),
                                         ("underuse_power_frac", "use --set"), ("underuse_power_frac=-1", "≥ 0")])
def test_bad_flags(item, needle):
    with pytest.raises(TraintopError, match=needle):
        load_thresholds("/dev/null", [item])


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
