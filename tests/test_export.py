"""Samples for scripts: `traintop snapshot`, `traintop export`, the JSON-lines stream."""

import csv
import io
import json
import os
import pathlib
import shutil
import subprocess
import sys
import types

import pytest

from traintop.record import export
from traintop.cli import main

FIX = pathlib.Path(__file__).parent / "fixtures"
RECORDING = FIX / "corpus" / "checkpoints-probe.ttrec"
LOG = FIX / "h200" / "smi-query-100ms.csv.gz"


def _export(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "traintop", "export", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_export_jsonl_is_one_sample_a_line_in_the_documented_shape():
    from traintop.record.recording import RecordingReader

    reader = RecordingReader(str(RECORDING))
    frames = list(reader.frames())
    out = _export(RECORDING)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == len(frames)
    first = json.loads(lines[0])
    assert first["schema"] == export.SCHEMA and first["t"] == frames[0].t
    g = first["gpus"][0]
    assert g["name"] == "NVIDIA H200" and g["mem_total"] == frames[0].gpus[0].mem_total
    assert {"util", "power_w", "sm_active", "processes", "stale"} <= set(g)
    busy = [json.loads(line) for line in lines if json.loads(line)["ranks"]]
    assert busy and busy[-1]["ranks"][0]["steps"] is not None  # the probe's ranks come along


@pytest.mark.skipif(shutil.which("jq") is None, reason="jq is not installed")
def test_export_pipes_into_jq():
    p1 = subprocess.Popen([sys.executable, "-m", "traintop", "export", str(LOG)], stdout=subprocess.PIPE)
    p2 = subprocess.run(["jq", "-r", "[.t, .gpus[0].util, .gpus[0].power_w] | @csv"], stdin=p1.stdout,
                        capture_output=True, text=True, timeout=120)
    p1.stdout.close()
    assert p1.wait(60) == 0 and p2.returncode == 0, p2.stderr
    rows = list(csv.reader(io.StringIO(p2.stdout)))
    assert len(rows) == 2469 and float(rows[-1][2]) > 0


def test_export_csv_is_a_row_a_gpu_a_sample_and_head_ends_it_quietly():
    out = _export(LOG, "--csv", "--limit", "5")
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert out.returncode == 0 and len(rows) == 5
    assert rows[0]["gpu"] == "0" and float(rows[0]["power_w"]) == pytest.approx(81.22)
    assert rows[0]["mem_reserved"] == ""  # missing is empty, never 0
    p1 = subprocess.Popen([sys.executable, "-m", "traintop", "export", str(LOG), "--csv"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = p1.stdout.readline()
    p1.stdout.close()  # the reader goes away, as `| head -1` does
    assert head.startswith(b"t,host,gpu")
    assert p1.wait(60) == 141 and b"Traceback" not in p1.stderr.read()  # as `yes | head` ends


def test_export_to_a_file_and_a_bad_file_is_one_line(tmp_path):
    out = _export(LOG, "-o", tmp_path / "s.jsonl", "--limit", "3")
    assert out.returncode == 0 and "3 sample(s) written" in out.stderr
    assert len((tmp_path / "s.jsonl").read_text().splitlines()) == 3
    bad = tmp_path / "bad.ttrec"
    bad.write_bytes(b"SQLite format 3\x00" + os.urandom(3000))
    out = _export(bad)
    assert out.returncode != 0 and len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


@pytest.mark.parametrize("where", ["missing/dir/x.csv", ".", "/proc/traintop-x.csv"])
def test_export_to_a_place_that_cannot_be_written_is_one_line(tmp_path, where):
    target = where if where.startswith("/") else str(tmp_path / where)
    out = _export(LOG, "--csv", "--limit", "2", "-o", target)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [f"traintop: cannot create {target}: "
                                                f"{'Is a directory' if where == '.' else 'No such file or directory'}"]


def test_export_never_writes_over_a_file_as_record_never_does(tmp_path):
    kept = tmp_path / "kept.jsonl"
    kept.write_text("earlier\n")
    out = _export(LOG, "--limit", "2", "-o", kept)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "exists" in out.stderr
    assert kept.read_text() == "earlier\n"


def test_names_from_outside_stay_data():
    from traintop.samples import Frame, GpuInfo, GpuSample, SessionInfo

    info = SessionInfo(kind="live", hostname="h\x1b[2Jost", gpus=(GpuInfo(0, "GPU\x1b]52;c;AAAA\x07,\"x\""),))
    frame = Frame(t=1.0, gpus=(GpuSample(0, util=50.0),))
    line = export.json_line(export.sample_record(frame, info))
    assert "\x1b" not in line and json.loads(line)["gpus"][0]["name"].startswith("GPU\x1b")
    rows = export.csv_rows(frame, info)
    assert "\x1b" not in rows and "\x07" not in rows
    assert next(csv.reader(io.StringIO(rows)))[3].startswith("GPU\\x1b")


def test_snapshot_json_and_csv_with_whose_processes(monkeypatch, capsys, fake_nvml):
    nv, _ = fake_nvml(n=2)
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: [types.SimpleNamespace(pid=os.getpid(),
                                                                               usedGpuMemory=2**30)]
    stamps = iter(range(10, 10_000, 10))
    nv.nvmlDeviceGetProcessesUtilizationInfo = lambda h, since: [types.SimpleNamespace(
        timeStamp=next(stamps), pid=os.getpid(), smUtil=64, memUtil=30, encUtil=0, decUtil=0)]
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    assert main(["snapshot", "--wait", "0.05"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == export.SCHEMA and len(doc["gpus"]) == 2 and doc["host_stats"]["cpu_percent"] is not None
    proc = doc["gpus"][0]["processes"][0]
    assert proc["pid"] == os.getpid() and proc["used_bytes"] == 2**30 and proc["visible"] is True
    assert (proc["sm_util"], proc["mem_util"]) == (64, 30)  # a one-off reading still gets each process's share
    assert proc["uid"] == os.getuid() and proc["user"]
    assert main(["snapshot", "--csv", "--wait", "0.05"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["gpu"] for r in rows] == ["0", "1"] and rows[0]["processes"] == f"{os.getpid()}:{2**30}:64"


def test_snapshot_without_a_gpu_prints_the_host_and_says_why_in_one_line(monkeypatch, capsys, fake_nvml):
    """As `record --jsonl -` streams host-only samples: the host's sample, no GPU, the reason on stderr."""
    nv, _ = fake_nvml(init_error=9)  # NVML_ERROR_DRIVER_NOT_LOADED
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    assert main(["snapshot", "--wait", "0.05"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["schema"] == export.SCHEMA and doc["gpus"] == [] and doc["host_stats"]["mem_total"] > 0
    assert len(err.strip().splitlines()) == 1 and err.startswith("traintop: no GPU (") and "the host only" in err
    assert main(["snapshot", "--csv", "--wait", "0.05"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [export.csv_header().strip()] and len(err.strip().splitlines()) == 1


def test_snapshot_without_nvml_at_all_is_one_line_and_a_sample():
    env = {**os.environ, "LD_LIBRARY_PATH": "/nonexistent"}
    out = subprocess.run([sys.executable, "-m", "traintop", "snapshot", "--compact"], capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 0 and "Traceback" not in out.stderr
    assert json.loads(out.stdout)["host_stats"]["cpu_percent"] is not None
    assert len(out.stderr.strip().splitlines()) <= 1  # the reason, where this machine has no GPU


def test_a_slow_reader_never_holds_the_sampler_back():
    r, w = os.pipe()
    writer = export.StreamWriter(os.fdopen(w, "w"), max_lines=10)
    line = "x" * 32768 + "\n"
    for _ in range(100):  # nobody reads: the pipe fills after two lines, then the queue; no put waits
        writer.put(line)
    assert writer.dropped >= 100 - 10 - 3
    os.close(r)  # the reader goes away: the writer's blocked write ends the stream, nothing raises
    writer.close(timeout=10)
    assert writer.closed_by_reader and not writer._thread.is_alive()


def test_record_streams_json_lines_to_a_python_reader_and_to_jq(tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "traintop", "record", "--simulate", "starved", "--fast",
                          "--duration", "30", "--interval", "0.5", "--jsonl", "-"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert len(records) == 60 and all(r["schema"] == export.SCHEMA for r in records)
    assert records[1]["t"] - records[0]["t"] == pytest.approx(0.5) and records[-1]["ranks"]
    assert "streamed 60 sample(s)" in err and not err.count("\n") > 3
    if shutil.which("jq"):
        jq = subprocess.run(["jq", "-s", "map(.gpus[0].util) | length"], input=out, capture_output=True,
                            text=True, timeout=60)
        assert jq.stdout.strip() == "60"


def test_record_to_a_file_and_a_stream_at_once_and_never_over_a_file(tmp_path):
    rec, stream = tmp_path / "s.ttrec", tmp_path / "s.jsonl"
    args = ["record", str(rec), "--simulate", "healthy", "--fast", "--duration", "10", "--interval", "0.5"]
    out = subprocess.run([sys.executable, "-m", "traintop", *args, "--jsonl", str(stream)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    from traintop.record.recording import RecordingReader

    assert len(stream.read_text().splitlines()) == RecordingReader(str(rec)).frame_count == 20
    again = subprocess.run([sys.executable, "-m", "traintop", "record", "--simulate", "healthy", "--duration", "1",
                            "--jsonl", str(stream)], capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "exists" in again.stderr and len(stream.read_text().splitlines()) == 20
    none = subprocess.run([sys.executable, "-m", "traintop", "record"], capture_output=True, text=True, timeout=60)
    assert none.returncode == 2 and "--jsonl" in none.stderr


def test_a_stream_whose_reader_leaves_ends_the_recorder_quietly():
    p = subprocess.Popen([sys.executable, "-m", "traintop", "record", "--simulate", "healthy", "--interval", "0.1",
                          "--jsonl", "-"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = p.stdout.readline()
    p.stdout.close()  # as `| head -1` does
    assert json.loads(first)["schema"] == export.SCHEMA
    assert p.wait(60) == 141
    err = p.stderr.read().decode()
    assert "the reader closed the stream" in err and "Traceback" not in err
