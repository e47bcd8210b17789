"""`traintop export --csv --rows`: the host, the attached job and the ranks as CSV too, and a CSV
with nothing in it says why."""

import csv
import io
import pathlib
import subprocess
import sys

from traintop.record.recording import RecordingReader, RecordingWriter
from traintop.samples import Frame, HostSample
from traintop.watch.sessions import no_gpu_info

RECORDING = pathlib.Path(__file__).parent / "fixtures" / "corpus" / "checkpoints-probe.ttrec"


def _export(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "traintop", "export", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def _no_gpu_recording(path) -> str:
    """What `traintop record` writes on a host without a GPU: host samples only."""
    writer = RecordingWriter(str(path), no_gpu_info(0.5, "NVML could not start (no driver)"))
    for k in range(4):
        writer.add(Frame(t=1_790_000_000.0 + 0.5 * k, host=HostSample(cpu_percent=12.0, per_core=(10.0, 15.0),
                                                                       mem_used=2 << 30, mem_total=16 << 30)))
    writer.close()
    return str(path)


def test_a_csv_of_a_recording_without_gpus_says_why_it_is_only_a_header(tmp_path):
    path = _no_gpu_recording(tmp_path / "nogpu.ttrec")
    out = _export(path, "--csv")
    assert out.returncode == 0 and out.stdout.count("\n") == 1 and out.stdout.startswith("t,host,gpu,")
    (line,) = out.stderr.splitlines()
    assert line.startswith("traintop: ") and "no GPU in its 4 sample(s)" in line and "no driver" in line
    assert "--rows host, process, ranks" in line
    host = _export(path, "--csv", "--rows", "host")
    rows = list(csv.DictReader(io.StringIO(host.stdout)))
    assert host.returncode == 0 and host.stderr == "" and len(rows) == 4
    assert rows[0]["cpu_percent"] == "12.0" and rows[0]["per_core"] == "10 15" and rows[0]["swap_used"] == ""


def test_the_job_and_its_ranks_export_as_csv_with_what_json_says():
    from traintop.record import export

    frames = list(RecordingReader(str(RECORDING)).frames())
    out = _export(RECORDING, "--csv", "--rows", "process")
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert out.returncode == 0 and len(rows) == sum(f.process is not None for f in frames) > 0
    last = [f for f in frames if f.process is not None][-1]
    record = export.sample_record(last, RecordingReader(str(RECORDING)).info)["process"]
    assert rows[-1]["pid"] == str(record["pid"]) and rows[-1]["alive"] in ("true", "false")
    assert int(rows[-1]["members"]) == len(record["members"])
    assert int(rows[-1]["loader_workers"]) == sum(m["loader_worker"] for m in record["members"])
    ranks = _export(RECORDING, "--csv", "--rows", "ranks")
    rows = list(csv.DictReader(io.StringIO(ranks.stdout)))
    assert ranks.returncode == 0 and len(rows) == sum(len(f.ranks) for f in frames) > 0
    stepped = [r for r in rows if r["steps"]]
    assert stepped and float(stepped[-1]["allocated"]) > 0 and any(r["step_time"] for r in stepped)


def test_rows_without_csv_is_one_line():
    out = _export(RECORDING, "--rows", "ranks")
    assert out.returncode == 2 and out.stdout == "" and len(out.stderr.splitlines()) == 1
    assert out.stderr.startswith("traintop: --rows") and "Traceback" not in out.stderr


def test_a_ranks_precision_and_backend_export_by_name_not_by_their_index_in_the_recording(tmp_path):
    """A recording keeps a rank's matmul precision and backend as indexes (0 is fp32); a script reading
    the export must get "fp32" and "gloo", as the dashboard says, in JSON and CSV alike."""
    import json

    from traintop.samples import RankSample, backend_index

    path = tmp_path / "ranks.ttrec"
    writer = RecordingWriter(str(path), no_gpu_info(0.5, "NVML could not start (no driver)"))
    for k in range(3):
        writer.add(Frame(t=1_790_000_000.0 + 0.5 * k, host=HostSample(cpu_percent=12.0),
                         ranks=[RankSample(pid=4242, steps=10 + k, matmul=0, backend=backend_index("gloo"))]))
    writer.close()
    lines = [json.loads(line) for line in _export(path).stdout.splitlines()]
    assert [r["ranks"][0]["matmul"] for r in lines] == ["fp32"] * 3
    assert lines[-1]["ranks"][0]["backend"] == "gloo" and lines[-1]["ranks"][0]["steps"] == 12
    out = _export(path, "--csv", "--rows", "ranks")
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert out.returncode == 0 and [r["matmul"] for r in rows] == ["fp32"] * 3 and rows[-1]["backend"] == "gloo"
