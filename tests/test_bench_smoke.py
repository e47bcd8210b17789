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


def test_dashboard_cpu_is_bounded_by_a_full_repaint_textual_app(tmp_path):
    """The development-machine guard: `traintop simulate --gpus 2 --interval 1` at 160x48 beside
    a minimal Textual app that repaints the whole screen once a second, started together. The
    target is 0.5x (bench/cpu_compare.py --preset guard prints the ratio); the bound here is
    generous (2x; measured 1.2-1.34x on a loaded 2-core machine) so that CI noise cannot flake
    it, and still fails a dashboard that repaints every panel every frame (2.6x)."""
    out = tmp_path / "guard.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "cpu_compare.py"), "--preset", "guard",
                        "--seconds", "15", "--warmup", "5", "--json", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert all("error" not in row for row in res["rows"]), res["rows"]
    (ratio,) = res["ratios"]
    assert ratio["cpu_per_wall_s"] <= 2.0, r.stdout
