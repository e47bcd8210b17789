"""The README stays short and points to docs/; the docs' links lead somewhere; --help names its page."""

import pathlib
import re
import subprocess
import sys

import pytest

from traintop import cli, options

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# the pages made from the README's reference: prose and lists, no giant table cells
REFERENCE = ["COMMANDS.md", "DASHBOARD.md", "RUN.md", "PROBE.md", "RULES.md", "ANALYZE.md", "EXPORT.md",
             "ALERTING.md", "DEVELOPING.md"]


def _cells(text: str):
    for line in text.splitlines():
        if line.startswith("|") and not re.match(r"^\|[\s:|-]+\|?$", line):
            yield from (c.strip() for c in line.strip().strip("|").split("|"))


def test_the_readme_is_short_and_its_tables_and_the_reference_pages_have_no_giant_cells():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 120
    for name, text in [("README.md", readme), *((n, (DOCS / n).read_text()) for n in REFERENCE)]:
        long = [c[:60] for c in _cells(text) if len(c.split()) > 30]
        assert not long, (name, long)


def test_every_relative_link_leads_to_a_file():
    for page in [REPO / "README.md", *DOCS.glob("*.md")]:
        for target in LINK.findall(page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), (page.name, target)


def test_the_readme_shows_how_to_attach_to_a_running_job_first():
    """A newcomer finds it in seconds: the first of the everyday uses, a one-line command."""
    readme = (REPO / "README.md").read_text()
    uses = readme[readme.index("## Five everyday uses"):]
    first = uses[:uses.index("**", uses.index("**") + 2) + 200]
    assert "already running" in first and "traintop --pid" in first


def test_every_command_has_its_section_and_its_page():
    text = (DOCS / "COMMANDS.md").read_text()
    headings = {name for line in re.findall(r"^### .*$", text, re.M) for name in re.findall(r"`traintop ([a-z]+)", line)}
    assert set(cli.COMMANDS) <= set(headings), set(cli.COMMANDS) - set(headings)
    assert set(options.DOCS) == {None, *cli.COMMANDS}
    assert all((REPO / page).is_file() for page in options.DOCS.values())


@pytest.mark.parametrize("command", [None, "run", "analyze", "cluster", "export"])
def test_help_ends_with_the_page_that_documents_the_command(command):
    r = subprocess.run([sys.executable, "-m", "traintop", *([command] if command else []), "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and options.DOCS[command] in " ".join(r.stdout.split()[-12:]), r.stdout[-300:]
