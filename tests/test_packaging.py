"""Installed, traintop is one import package; nothing lands top-level as app/widgets/collectors."""

import ast
import pathlib
import subprocess
import sys
import zipfile

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_wheel_has_only_the_traintop_package(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path), str(REPO)], check=True, capture_output=True, text=True)
    # setuptools warns of folders it would have to guess about (e.g. one missing from `packages`)
    assert "Warning" not in r.stderr + r.stdout, r.stderr
    wheel = next(tmp_path.glob("traintop-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"traintop"}
    for must in ("traintop/app/main.py", "traintop/app/traintop.tcss", "traintop/widgets/gpu_panel.py",
                 "traintop/collectors/nvml.py", "traintop/demo/h200-demo.ttrec", "traintop/probe.py",
                 "traintop/injob/agent.py", "traintop/injob/goodput.py", "traintop/injob/capture.py",
                 "traintop/inject/sitecustomize.py", "traintop/sources/importers.py", "traintop/record/recording.py",
                 "traintop/watch/monitor.py", "traintop/reports/analyze.py"):
        assert must in names


def test_installed_layout_maps_the_users_folders(tmp_path):
    # A clean interpreter outside the checkout sees only what the install provides.
    code = (
        "import importlib.util, pathlib\n"
        "import traintop.app, traintop.collectors, traintop.widgets\n"
        "assert pathlib.Path(traintop.app.__file__).parent.name == 'app'\n"
        "assert pathlib.Path(traintop.collectors.__file__).parent.name == 'collectors'\n"
        "assert pathlib.Path(traintop.widgets.__file__).parent.name == 'widgets'\n"
        "clash = [n for n in ('app', 'widgets', 'collectors') if importlib.util.find_spec(n)]\n"
        "assert not clash, clash\n"
    )
    subprocess.run([sys.executable, "-I", "-c", code], check=True, cwd=tmp_path)


CORE_DIRS = [REPO / "traintop", REPO / "collectors"]


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module.split(".")[0])
            if node.module.startswith("traintop.app") or node.module.startswith("traintop.widgets"):
                out.add("traintop-ui")
    return out


def test_core_never_imports_textual_statically():
    offenders = []
    for d in CORE_DIRS:
        for f in d.rglob("*.py"):
            imports = _imports(f)
            if {"textual", "rich", "traintop-ui"} & imports and f.name != "cli.py":
                offenders.append(str(f.relative_to(REPO)))
    assert offenders == []


def test_core_never_imports_textual_at_run_time():
    code = (
        "import sys\n"
        "import traintop.store, traintop.rules, traintop.record.recording, traintop.record.codec, traintop.watch.monitor\n"
        "import traintop.watch.feeds, traintop.watch.sessions, traintop.reports.view, traintop.sources.live\n"
        "import traintop.collectors.nvml, traintop.collectors.host, traintop.collectors.process\n"
        "import traintop.collectors.simulated\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('textual', 'rich')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_scripts_show_the_installers_output_only_when_it_fails():
    lib = REPO / "scripts" / "_venv.sh"
    ok = subprocess.run(["bash", "-c", f"source {lib}; quiet t bash -c 'echo notice; echo warning >&2'"],
                        capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0 and ok.stdout == "" and ok.stderr == ""
    bad = subprocess.run(["bash", "-c", f"source {lib}; quiet t bash -c 'echo why it failed; exit 3'"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 3 and "why it failed" in bad.stderr


def test_the_dashboard_loads_no_openssl_and_ssl_still_imports():
    """asyncio would load OpenSSL (~4 MiB of RSS) for TLS the dashboard never speaks."""
    code = ("import sys, traintop.app.main; assert 'ssl' not in sys.modules and '_ssl' not in sys.modules, "
            "sorted(m for m in sys.modules if 'ssl' in m); import ssl, httpx; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
