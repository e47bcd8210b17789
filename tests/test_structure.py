"""The structure drawn from the code: no import circles (imports inside functions count too) and
no import from a lower layer to a higher one (CONTRACTS below: docs/DESIGN-NOTES.md points here)."""

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
# the user's top-level folders are subpackages of the one import package (pyproject.toml)
ROOTS = {"traintop": "traintop", "app": "traintop.app", "widgets": "traintop.widgets", "collectors": "traintop.collectors"}
# Who may import whom. The command line (`traintop.cli`, `traintop.__main__`) is the front door:
# it starts the dashboard, so it may import anything. The drawing (app/, widgets/) sits under it.
# Everything else under traintop is the core. Each contract: (what it is about, the importers,
# what none of them may import); a name matches a package and everything in it. Third-party
# packages are matched by their top-level name (`rich` is Textual's renderer: the core does not
# draw through it either; text is made safe by traintop.text, markup is escaped in the drawing).
ENTRY = ("traintop.cli", "traintop.__main__")
DRAWING = ("traintop.app", "traintop.widgets")
CORE = "the core (traintop, less the command line and the drawing)"
# The core's layers, lowest first (docs/CONTRIBUTING.md draws them): the base (the modules at the
# top of traintop/: samples, findings, metrics, store, units, text...), then the collectors and the
# rules, then sources, record, watch (the session), reports and the cluster wing. A layer imports
# those below it, never one above. The in-job probe (traintop.injob, and traintop.probe that starts
# it) imports no other part of traintop at all (IN_JOB below).
PROBE_DOORS = ("traintop.probe",)  # `import traintop.probe` in a training script starts the probe
BASE = "the base (the modules at the top of traintop/, less the front door and the probe's)"
PACKAGES = ("traintop.injob", "traintop.collectors", "traintop.rules", "traintop.sources", "traintop.record",
            "traintop.watch", "traintop.reports", "traintop.cluster", "traintop.demo", *DRAWING)
SOURCES, RECORD, WATCH, REPORTS, CLUSTER = ("traintop.sources",), ("traintop.record",), ("traintop.watch",), \
    ("traintop.reports",), ("traintop.cluster",)
CONTRACTS = [
    ("the core never draws", CORE, ("textual", "rich", "traintop.app", "traintop.widgets")),
    ("the core never reaches the command line", CORE, ENTRY),
    ("the base imports only the base", BASE, (*PACKAGES, *PROBE_DOORS)),
    ("the collectors only read the machine", ("traintop.collectors",),
     ("traintop.rules", *SOURCES, *RECORD, *WATCH, *REPORTS, *CLUSTER)),
    ("the rules never reach the session that runs them", ("traintop.rules",),
     (*SOURCES, *RECORD, *WATCH, *REPORTS, *CLUSTER, "traintop.cli")),
    ("the sources only read frames in", SOURCES, ("traintop.rules", *RECORD, *WATCH, *REPORTS, *CLUSTER)),
    ("the record sits below the session", RECORD, ("traintop.collectors", *SOURCES, *WATCH, *REPORTS, *CLUSTER)),
    ("the session never reads a report", WATCH, (*REPORTS, *CLUSTER)),
    ("the reports never reach the cluster wing", REPORTS, CLUSTER),
    ("the cluster wing", CLUSTER, ("traintop.cli", "traintop.app")),
    ("the widgets only display", ("traintop.widgets",), ("traintop.app", "traintop.cli")),
]


def modules() -> dict[str, pathlib.Path]:
    out = {}
    for folder, package in ROOTS.items():
        for path in (REPO / folder).rglob("*.py"):
            if "inject" in path.parts:  # copied next to a job, never imported
                continue
            rel = path.relative_to(REPO / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts]) if parts else package] = path
    return out


def imports(path: pathlib.Path, name: str, known: set[str]) -> set[str]:
    """Every module this one imports, anywhere in it (functions too), as known module names."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for t in targets:
            while t and t not in known and "." in t:
                t = t.rpartition(".")[0]
            if t in known and t != name:
                out.add(t)
            elif not t.startswith("traintop"):
                out.add(t.split(".")[0])  # third-party, by top-level name
    return out


def graph():
    mods = modules()
    known = set(mods)
    return {m: imports(p, m, known) for m, p in mods.items()}


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, on, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    g = graph()
    ours = {m: {t for t in ts if t in g} for m, ts in g.items()}
    assert circles(ours) == []


def test_the_circle_finder_finds_one():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def within(name: str, packages) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def is_base(name: str) -> bool:
    """A module at the top of traintop/ (or traintop itself), neither a door nor a package."""
    return (name == "traintop" or (name.startswith("traintop.") and name.count(".") == 1)) \
        and not within(name, PACKAGES + ENTRY + PROBE_DOORS)


def bound(name: str, importers) -> bool:
    """Whether a contract's importers include this module."""
    if importers == CORE:
        return within(name, ("traintop",)) and not within(name, ENTRY + DRAWING)
    if importers == BASE:
        return is_base(name)
    return within(name, importers)


def broken(g: dict[str, set[str]]) -> list[str]:
    """Each import that breaks a contract, said as '<contract>: <module> imports <module>' (the
    first contract it breaks)."""
    wrong = []
    for m, targets in sorted(g.items()):
        mine = [(about, forbidden) for about, importers, forbidden in CONTRACTS if bound(m, importers)]
        for t in sorted(targets):
            about = next((about for about, forbidden in mine if within(t, forbidden)), None)
            if about:
                wrong.append(f"{about}: {m} imports {t}")
    return wrong


def test_no_import_from_a_lower_layer_to_a_higher_one():
    wrong = broken(graph())
    assert not wrong, "imports that break the contracts in tests/test_structure.py:\n" + "\n".join(wrong)


def test_the_contracts_catch_a_breach():
    g = {"traintop.store": {"rich", "array"}, "traintop.cluster.report": {"traintop.app.cluster"},
         "traintop.rules.stall": {"traintop.watch.feeds"}, "traintop.cli": {"traintop.app.factory", "textual"},
         "traintop.widgets.line": {"rich", "textual"}, "traintop.richer": {"richtext"},
         # one import up from each layer...
         "traintop.units": {"traintop.watch.monitor"}, "traintop.collectors.nvml": {"traintop.rules.engine"},
         "traintop.sources.live": {"traintop.record.recording"}, "traintop.record.recording": {"traintop.watch.monitor"},
         "traintop.watch.session": {"traintop.reports.export_commands"},
         "traintop.reports.analyze": {"traintop.cluster.report"},
         # ...and imports down, which are fine (the probe's door is not the base)
         "traintop.reports.view": {"traintop.watch.monitor", "traintop.units"},
         "traintop.watch.monitor": {"traintop.record.recording", "traintop.rules", "traintop.collectors.procread"},
         "traintop.probe": {"traintop.injob.agent"}, "traintop.metrics": {"traintop.samples", "traintop"}}
    assert broken(g) == [
        "the core never draws: traintop.cluster.report imports traintop.app.cluster",
        "the collectors only read the machine: traintop.collectors.nvml imports traintop.rules.engine",
        "the record sits below the session: traintop.record.recording imports traintop.watch.monitor",
        "the reports never reach the cluster wing: traintop.reports.analyze imports traintop.cluster.report",
        "the rules never reach the session that runs them: traintop.rules.stall imports traintop.watch.feeds",
        "the sources only read frames in: traintop.sources.live imports traintop.record.recording",
        "the core never draws: traintop.store imports rich",
        "the base imports only the base: traintop.units imports traintop.watch.monitor",
        "the session never reads a report: traintop.watch.session imports traintop.reports.export_commands",
    ]


def test_every_package_has_its_layer():
    """A new package under traintop/ is placed in the layers above (PACKAGES and a contract) before
    its modules can be judged: else they would pass for the base."""
    found = {m for m, path in modules().items() if path.name == "__init__.py" and m != "traintop"}
    top = {".".join(m.split(".")[:2]) for m in found}
    assert top <= set(PACKAGES), top - set(PACKAGES)


MAX_FUNCTION_LINES = 80  # a function of the core, its docstring counted: beyond, split it into helpers


def long_functions(source: str) -> list[tuple[str, int, int]]:
    """Each function (methods and nested ones too) over MAX_FUNCTION_LINES, as (name, first line, lines)."""
    return [(node.name, node.lineno, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


def test_no_core_function_is_over_80_lines():
    """The core (traintop/ and collectors/, less the drawing; the command line is in it) reads in
    functions of one job each (docs/CONTRIBUTING.md)."""
    long = [f"{path.relative_to(REPO)}:{line} {name}: {n} lines" for m, path in sorted(modules().items())
            if not within(m, DRAWING) for name, line, n in long_functions(path.read_text())]
    assert not long, f"functions of the core over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_the_length_check_finds_a_long_function():
    def function(name: str, lines: int, indent: str = "") -> str:  # a def, its docstring, statements
        return f"{indent}def {name}():\n{indent}    \"\"\"doc\"\"\"\n" + f"{indent}    x = 1\n" * (lines - 2)

    source = function("fits", MAX_FUNCTION_LINES) + "\n\nclass C:\n" + function("over", MAX_FUNCTION_LINES + 1, "    ")
    assert long_functions(source) == [("over", MAX_FUNCTION_LINES + 4, MAX_FUNCTION_LINES + 1)]


def test_every_module_imports_without_torch():
    """traintop never needs torch (the probe reads it inside a job that has it): every module imports
    where `import torch` fails. scripts/test runs this again in a Python with no torch installed."""
    import subprocess
    import sys

    names = sorted(m for m in modules() if not m.endswith("__main__"))
    code = ("import importlib, sys\n"
            "sys.modules['torch'] = None  # `import torch` raises ImportError, as where it is not installed\n"
            "for name in sys.argv[1:]:\n"
            "    try:\n"
            "        importlib.import_module(name)\n"
            "    except ImportError as e:\n"
            "        print(f'{name}: {e}')\n")
    r = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == "", r.stdout + r.stderr
    assert len(names) > 100


# The in-job probe runs inside users' training processes (`traintop run` copies these files next to
# the job as _traintop_probe_*.py): it may import the standard library, torch (the job's own) and
# itself, nothing else (not even the rest of traintop, which a job may not have installed).
IN_JOB = ("traintop.injob", *PROBE_DOORS)
IN_JOB_FILES = (REPO / "traintop" / "inject" / "sitecustomize.py",)


def in_job_breaches(g: dict[str, set[str]]) -> list[str]:
    import sys

    # sitecustomize: ours hands over to the one that was on the path before it
    allowed = set(sys.stdlib_module_names) | {"torch", "__future__", "sitecustomize"}
    return [f"{m} imports {t}" for m in sorted(g) if within(m, IN_JOB) for t in sorted(g[m])
            if t not in allowed and not within(t, IN_JOB) and not t.startswith("_traintop_probe_")]


def test_the_in_job_probe_imports_only_the_standard_library_torch_and_itself():
    g = graph()
    for path in IN_JOB_FILES:  # never imported as traintop.*: read as a module of the probe
        g["traintop.probe"] = g["traintop.probe"] | imports(path, "sitecustomize", set(g))
    wrong = in_job_breaches(g)
    assert not wrong, "the in-job probe imports outside the standard library and torch:\n" + "\n".join(wrong)


def test_the_in_job_contract_catches_a_breach():
    g = {"traintop.injob.agent": {"json", "torch", "traintop.injob.goodput", "_traintop_probe_capture", "psutil"},
         "traintop.injob.goodput": {"traintop.metrics"}, "traintop.store": {"psutil"},
         "traintop.probe": {"os", "traintop.injob.agent", "traintop.injob", "traintop.probes"},
         "traintop.injob": {"traintop.watch.launch"}}
    assert in_job_breaches(g) == ["traintop.injob imports traintop.watch.launch", "traintop.injob.agent imports psutil",
                                  "traintop.injob.goodput imports traintop.metrics", "traintop.probe imports traintop.probes"]
