"""The cluster extra: a dashboard install has neither prometheus-client nor httpx, and the
commands over many hosts say in one line how to get them."""

import pathlib
import sys
import tomllib

import pytest

from traintop import cli

PYPROJECT = tomllib.loads((pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())


def test_the_dashboard_needs_neither_prometheus_client_nor_httpx():
    names = " ".join(PYPROJECT["project"]["dependencies"])
    assert "prometheus-client" not in names and "httpx" not in names
    cluster = " ".join(PYPROJECT["project"]["optional-dependencies"]["cluster"])
    assert "prometheus-client" in cluster and "httpx" in cluster
    assert "traintop[cluster]" in PYPROJECT["project"]["optional-dependencies"]["test"]


def _without(monkeypatch, missing: str) -> None:
    """As if ``missing`` were not installed: it and every module of ours that imported it."""
    for name in list(sys.modules):
        if name.startswith(("traintop.cluster.", "traintop.app.cluster", missing)):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, missing, None)


@pytest.mark.parametrize("argv, missing", [
    (["agent", "--help"], "prometheus_client"),
    (["agent", "--simulate", "healthy", "--textfile", "/nonexistent"], "prometheus_client"),
    (["analyze", "--prometheus", "http://127.0.0.1:9"], "httpx"),
])
def test_a_command_over_many_hosts_says_how_to_install_what_it_needs(monkeypatch, capsys, argv, missing):
    _without(monkeypatch, missing)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err == (f"traintop: this command needs traintop's cluster extra ({missing} is not installed): "
                   "pip install 'traintop[cluster]'\n")


def test_another_missing_module_is_not_blamed_on_the_extra(monkeypatch):
    _without(monkeypatch, "prometheus_client")
    monkeypatch.setitem(sys.modules, "traintop.cluster.commands", None)
    with pytest.raises(ModuleNotFoundError):
        cli.main(["agent", "--help"])
