"""Text from outside never reaches the terminal as markup or control sequences.

The real program runs on a pty (tests/terminal.py) with hostile GPU, host, process and file
names, command lines and recorded alerts: what it writes must hold none of the payloads'
bytes, the screen must show them as visible characters, and markup must stay literal text.
The text outputs (analyze, doctor, error lines) are checked the same way.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest


import hostile  # noqa: E402
from terminal import Terminal  # noqa: E402

from traintop import cli  # noqa: E402
from traintop.reports import doctor
from traintop.text import is_clean  # noqa: E402


def assert_no_leak(raw: bytes) -> None:
    for leak in hostile.LEAKS:
        assert leak not in raw, f"{leak!r} reached the terminal"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("hostile"))
    return {"recording": hostile.hostile_recording(d), "csv": hostile.hostile_csv(d)}


@pytest.mark.parametrize("size", [(160, 48), (80, 24)])
def test_replayed_recording_shows_every_hostile_string_as_text(files, tmp_path, size):
    cols, rows = size
    with Terminal(["replay", files["recording"]], cols, rows, home=str(tmp_path)) as term:
        term.wait_text("REPLAY")
        term.press("5")  # a seek takes up the recording's own (hostile) alerts
        if cols >= 120:
            # Every string asserted is waited for (under load one panel may be drawn before another):
            # the host name's clipboard payload and the evidence's 8-bit CSI made visible, markup literal.
            wanted = ["click[/link] title", hostile.VISIBLE_ESC, "[/]evil\\x1b[2J", *hostile.VISIBLE_MARKUP,
                      "\\x1b]52;c;cHduZWQ=\\x07", "\\x9b31m"]
            screen = term.wait_text(*wanted)
            for literal in wanted:
                assert literal in screen, literal
        else:
            term.wait_text("[H100] [link=", "click[/link] title")
        term.press("?")
        term.settle()
        term.press("escape")
        term.settle()
        term.press("q")
        assert term.wait_exit() == 0
        assert term.traceback() is None
        assert_no_leak(term.raw_bytes())


def test_replayed_nvidia_smi_log_with_markup_in_gpu_names(files, tmp_path):
    with Terminal(["replay", files["csv"]], 160, 48, home=str(tmp_path)) as term:
        term.wait_text("GPU 0 · [H100] [link=https://evil.example/]click[/link]\\x1b]0;PWNED",
                       "GPU 1 · [/]evil\\x1b[2J", "Replaying smi.csv")
        term.press("q")
        assert term.wait_exit() == 0
        assert_no_leak(term.raw_bytes())


@pytest.mark.skipif(not os.path.exists("/proc/self/comm"), reason="needs Linux /proc")
def test_attached_process_with_a_hostile_name_and_command_line(tmp_path):
    ready = tmp_path / "ready"
    # exec -a sets the command line; the process then names itself (comm) with markup and an ESC
    script = (f"import time; open('/proc/self/comm', 'w').write('[/]e\\x1b]0;PWN'); "
              f"open({str(ready)!r}, 'w').close(); time.sleep(300)")
    child = subprocess.Popen(["bash", "-c", f'exec -a "$ARGV0" {sys.executable} -c "$SCRIPT"'],
                             env={**os.environ, "ARGV0": hostile.CMDLINE, "SCRIPT": script})
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert child.poll() is None and time.monotonic() < deadline, "the hostile child did not start"
            time.sleep(0.05)
        with Terminal(["--pid", str(child.pid)], 160, 48, home=str(tmp_path)) as term:
            # the command line's first payload, visible: waited for with the rest (panels are drawn one by one)
            term.wait_text(f"Process {child.pid} · [/]e\\x1b]0;PWN", "\\x1b]52;c;cHduZWQ=\\x07", "\\x1b]0;PWNED\\x1b\\")
            term.press("q")
            assert term.wait_exit() == 0
            assert term.traceback() is None
            raw = term.raw_bytes()
            assert_no_leak(raw)
            assert b"\x1b]0;PWN" not in raw
    finally:
        child.kill()
        child.wait()


def test_analyze_prints_recorded_strings_as_visible_text(files, capsys):
    assert cli.main(["analyze", files["recording"]]) == 0
    out = capsys.readouterr().out
    assert is_clean(out), "a control character from the recording was printed"
    assert "\\x1b]0;PWNED" in out and "[link=https://evil.example/]click[/link]" in out
    assert "[bold red]RED[/] evidence" in out  # the recorded alert, as the recording says it


def test_analyze_of_a_hostile_csv_and_an_error_that_quotes_a_file_name(files, tmp_path, capsys):
    assert cli.main(["analyze", files["csv"]]) == 0
    out = capsys.readouterr().out
    assert is_clean(out) and "[/]evil\\x1b[2J" in out
    missing = str(tmp_path / f"gone{hostile.OSC_TITLE}.ttrec")
    assert cli.main(["analyze", missing]) == 2
    err = capsys.readouterr().err
    assert is_clean(err) and "gone\\x1b]0;PWNED" in err


def test_doctor_report_shows_what_it_quotes_as_text():
    checks = [doctor.Check("GPU visible", doctor.FAIL, f"nvidia-smi said: {hostile.OSC_CLIPBOARD}{hostile.RED}",
                           f"fix {hostile.CLEAR}")]
    text = doctor.render(checks)
    assert is_clean(text) and "\\x1b]52;c;cHduZWQ=\\x07[bold red]RED[/]" in text and "fix \\x1b[2J" in text
