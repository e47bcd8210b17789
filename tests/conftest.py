import ast
import os
import pathlib
import time

import pytest

from fakes import NVMLError, make_fake_nvml, add_hopper_extras

# Snapshots and evidence sentences show clock times: render them in one zone everywhere.
os.environ["TZ"] = "UTC"
time.tzset()


@pytest.fixture
def tmp_rec(tmp_path):
    return str(tmp_path / "session.ttrec")


# -- the dashboard, built without threads: demo replay and the simulator --------------------
def _demo_app(offset_s: float, mode: str = "demo", **kw):
    from traintop.watch import sessions
    from traintop.app.factory import build_app

    monitor, feed = sessions.replay_session(sessions.demo_path(), kind=mode)
    feed.playing = False
    feed.seek(feed.t_start + offset_s)
    return build_app(monitor, feed, mode=mode, start_feed=False, **kw), monitor, feed


def _sim_app(scenario="starved", gpus=1, history_s=120.0, start_feed=False, interval=0.5, **kw):
    from traintop.watch import sessions
    from traintop.app.factory import build_app

    monitor, feed = sessions.simulated_session(scenario, gpus=gpus, seed=7, interval=interval,
                                               history_s=history_s, realtime=False)
    return build_app(monitor, feed, mode="simulated", start_feed=start_feed, **kw), monitor, feed


@pytest.fixture
def demo_app():
    """Build the app on the embedded demo, seeked to an offset: ``demo_app(100)``."""
    return _demo_app


@pytest.fixture
def sim_app():
    """Build the app on a seeded simulator with history: ``sim_app("starved", gpus=2)``."""
    return _sim_app


# -- a fake pynvml, to test the NVML collector's logic without a GPU -------------------------
@pytest.fixture
def fake_nvml():
    """``fake_nvml(n=1, unsupported=(), failing=(), init_error=None)`` -> (pynvml-like module, call counts)."""
    return make_fake_nvml


@pytest.fixture
def nvml_error():
    return NVMLError


@pytest.fixture
def with_hopper_extras():
    """Add GPM, violation counters, ECC, link and event calls to a fake NVML."""
    return add_hopper_extras


def _attached_app(name, offset, **kw):
    import pathlib

    from traintop.watch import sessions
    from traintop.app.factory import build_app

    path = pathlib.Path(__file__).parent / "fixtures" / "h200" / name
    monitor, feed = sessions.replay_session(str(path))
    feed.playing = False
    feed.seek(feed.t_start + offset)
    return build_app(monitor, feed, mode="replay", start_feed=False, **kw), monitor, feed


@pytest.fixture
def attached_app():
    """A real H200 recording of a job attached by PID (its probe found), paused at an offset:
    ``attached_app("attach-starved-probe.ttrec", 30)``."""
    return _attached_app


def _footer_text(app) -> str:
    from textual.widgets._footer import FooterKey, FooterLabel

    keys = [f"{k.key_display} {k.description}".strip() for k in app.screen.query(FooterKey)]
    return " · ".join(keys + [str(lbl.render()) for lbl in app.screen.query(FooterLabel)])


@pytest.fixture
def footer_text():
    """What the footer shows now: ``footer_text(app)``."""
    return _footer_text


def _screen_lines(app) -> list[str]:
    return [line.text for line in app.screen._compositor.render_strips()]


@pytest.fixture
def screen_lines():
    """The screen as it is drawn now, one string a row: ``screen_lines(app)``."""
    return _screen_lines


# -- markers: `system` and `slow`, given here so that no test file has to say it ----------------
# `bash scripts/test -m "not system and not slow"` runs the fast half (under a minute). Each is
# found in the test's own code, in the code of the fixtures, helpers and constants of its module
# that it uses (transitively), or by its file.
#
# system: the test starts a real process (a job, traintop on a pty through tests/terminal.py,
# promtool or Prometheus, a wheel build, torch in a child, a hook's command).
SYSTEM_FILES = {"test_run.py", "test_monkey.py", "test_packaging.py", "test_bench_smoke.py",
                "test_cluster_prometheus.py", "test_hooks.py"}  # hooks: each runs a command
_SPAWNING_NAMES = {"subprocess", "pty", "Popen", "multiprocessing", "Terminal"}
_SPAWNING_ATTRS = {("sys", "executable"), ("os", "fork"), ("os", "forkpty"), ("os", "system"),
                   ("os", "execv"), ("os", "execvp"), ("os", "posix_spawn")}
# slow: seconds each, in-process all the same: a Textual Pilot session (the conftest's app
# fixtures, run_test), an SVG snapshot, a long simulation, fuzzing; whole files, then single tests
SLOW_FIXTURES = {"demo_app", "sim_app", "attached_app", "snap_compare"}
SLOW_FILES = {"test_app.py", "test_snapshots.py", "test_repaint.py", "test_fuzz.py", "test_soak.py",
              "test_diagnosis_score.py", "test_ddp_attribution.py", "test_h200_recordings.py",
              "test_analyze.py"}
SLOW_TESTS = {"test_each_scenario_yields_its_finding_at_10hz_and_1hz",
              "test_the_writer_only_makes_chunks_the_reader_accepts", "test_round_trip_frames_and_alerts",
              "test_a_chunk_decoded_into_series_fills_the_store_as_its_frames_do",
              "test_a_server_sending_a_byte_at_a_time_meets_the_whole_query_deadline"}


def _spawns(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in _SPAWNING_NAMES:
            return True
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) \
                and ((n.value.id, n.attr) in _SPAWNING_ATTRS or n.value.id in _SPAWNING_NAMES):
            return True
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""]
            if any(m.split(".")[0] in ("subprocess", "pty", "multiprocessing", "terminal") for m in mods):
                return True
        if isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", None)) == "which":
            return True  # shutil.which: a program it will run (promtool, prometheus, unshare)
    return False


# torch: the test uses a real torch (it imports it, or skips without it: pytest.importorskip), or
# is named for torch (what traintop does where there is none). scripts/test runs these again in a
# Python without torch when it has one: there they must skip cleanly or pass.
def _imports_torch(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Import) and any(a.name.split(".")[0] == "torch" for a in n.names):
            return True
        if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "torch":
            return True
        if isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", None)) == "importorskip" \
                and n.args and isinstance(n.args[0], ast.Constant) and n.args[0].value == "torch":
            return True
    return False


def _pilots(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "run_test" for n in ast.walk(node))


class _Module:
    """One test module's syntax tree: which of its tests do what, through what they use."""

    def __init__(self, path: pathlib.Path) -> None:
        tree = ast.parse(path.read_text(), str(path))
        self.defs: dict[str, ast.AST] = {}  # top-level functions, classes and constants by name
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defs[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    self.defs.update((n.id, node) for n in ast.walk(t) if isinstance(n, ast.Name))
        self.tests = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self._memo: dict[tuple, bool] = {}

    def does(self, what, node: ast.AST, names=(), seen=None) -> bool:
        """``what(node)`` holds for the node or for anything of this module it names, transitively."""
        seen = set() if seen is None else seen
        if what(node):
            return True
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | set(names)
        return any(self._named(what, n, seen) for n in names)

    def _named(self, what, name: str, seen: set) -> bool:
        key = (what, name)
        if key not in self._memo:
            if name in seen or name not in self.defs:
                return False
            seen.add(name)
            self._memo[key] = self.does(what, self.defs[name], (), seen)
        return self._memo[key]


_modules: dict[pathlib.Path, _Module] = {}


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = pathlib.Path(str(item.fspath))
        name = getattr(item, "originalname", None) or item.name
        module = _modules.get(path) or _modules.setdefault(path, _Module(path))
        node = module.tests.get(name)
        if path.name in SYSTEM_FILES or (node is not None and module.does(_spawns, node, item.fixturenames)):
            item.add_marker(pytest.mark.system)
        if path.name in SLOW_FILES or name in SLOW_TESTS or SLOW_FIXTURES & set(item.fixturenames) \
                or (node is not None and module.does(_pilots, node, item.fixturenames)):
            item.add_marker(pytest.mark.slow)
        if "torch" in name.split("_") or (node is not None and module.does(_imports_torch, node, item.fixturenames)):
            item.add_marker(pytest.mark.torch)
