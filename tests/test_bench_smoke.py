"""The benchmarks keep running (their figures are reported, not asserted)."""

import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_bench_quick_runs_and_writes_json(tmp_path):
    out = tmp_path / "b.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), "--quick", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "draw one frame" in r.stdout
    assert "frame cost, 2 GPUs at 1 s, 160x48" in r.stdout
    res = json.loads(out.read_text())
    assert res["recording_8gpu"]["bytes_per_gpu_sample"] > 0
    assert all(r["lines"] > 0 and r["bytes"] > 0 for r in res["frame_cost_2gpu"])
