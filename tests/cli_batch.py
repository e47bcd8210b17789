"""Many traintop commands, each as the real CLI runs it, in forked children of one warm process.

``python tests/cli_batch.py CASES.json RESULTS.json``: CASES is a list of argument lists. Each runs
in a child forked from this process (traintop imported once), as ``python -m traintop ARGS`` would:
``traintop.cli.main``, an uncaught exception printed as the interpreter prints it (a traceback,
exit 1), under the hostile-file tests' limits (1.5 GiB of address space, a time limit). RESULTS is
a list of {"rc", "stdout", "stderr", "strict_json", "summary", "control"}, rc negative where a signal
ended the child (-14: out of time); outputs cut to their ends, ``strict_json`` whether the whole of
stdout is JSON without NaN or Infinity, ``summary`` a JSON report's counts, ``control`` whether an
ESC reached either output.
Hundreds of cases then cost seconds instead of an interpreter start each.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import traceback

MEMORY_LIMIT = 1536 * 1024 * 1024  # as tests/test_hostile_files.py
TIME_LIMIT = 60  # a guard against hangs, per command
SUMMARY = ("samples", "skipped_chunks", "skipped_lines")  # of a JSON report, kept whole
KEEP = 20_000  # characters of each output kept for the test (a report may be long; a traceback is at its end)


def _child(args: list[str], out: str, err: str) -> int:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    signal.alarm(TIME_LIMIT)
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    from traintop.cli import main

    try:
        code = main(args)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - what the interpreter would print
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code


def _not_json(name: str):
    raise ValueError(f"{name} is not JSON")


def run(cases: list[list[str]], scratch: str) -> list[dict]:
    results = []
    for k, args in enumerate(cases):
        out, err = os.path.join(scratch, f"{k}.out"), os.path.join(scratch, f"{k}.err")
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(args, out, err)
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        rc = os.waitstatus_to_exitcode(status)
        texts = []
        for path in (out, err):
            with open(path, encoding="utf-8", errors="replace") as fh:
                texts.append(fh.read())
            os.unlink(path)
        try:
            doc = json.loads(texts[0], parse_constant=_not_json)
            strict = True
        except ValueError:
            doc, strict = None, False
        summary = {k: doc[k] for k in SUMMARY if k in doc} if isinstance(doc, dict) else {}
        results.append({"rc": rc, "strict_json": strict, "summary": summary, "control": "\x1b" in texts[0] + texts[1],
                        **{k: t if len(t) <= KEEP else t[:KEEP // 2] + "\n…\n" + t[-KEEP // 2:]
                           for k, t in zip(("stdout", "stderr"), texts)}})
    return results


if __name__ == "__main__":
    cases_path, results_path = sys.argv[1], sys.argv[2]
    with open(cases_path) as fh:
        todo = json.load(fh)
    import traintop.reports.analyze  # noqa: F401 - imported once, before the forks
    import traintop.cli  # noqa: F401
    import traintop.reports.export_commands  # noqa: F401
    import traintop.sources.importers  # noqa: F401
    import traintop.record.recording  # noqa: F401

    got = run(todo, os.path.dirname(os.path.abspath(results_path)))
    with open(results_path, "w") as fh:
        json.dump(got, fh)
