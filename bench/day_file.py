"""Open, seek and analyze a recording: what a user waits for with a long session.

    python bench/day_file.py FILE [--seeks 20] [--json OUT]

Each seek is a fresh replay session (nothing cached) jumping to a random point: the
history the view needs is rebuilt and the recorded alerts taken up. analyze is the
headless report (its fast path where the recording's own alerts apply).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

from benchio import save_json


def measure(path: str, seeks: int = 20) -> dict:
    from traintop.watch import sessions
    from traintop.reports.analyze import analyze
    from traintop.record.recording import RecordingReader

    res = {"file_mib": os.path.getsize(path) / 2**20}
    t = time.perf_counter()
    reader = RecordingReader(path)
    res["open_ms"] = (time.perf_counter() - t) * 1e3
    t0, t1 = reader.t_start, reader.t_end
    rnd = random.Random(5)
    times = []
    for _ in range(seeks):
        monitor, feed = sessions.replay_session(path)
        target = t0 + (t1 - t0) * rnd.random()
        t = time.perf_counter()
        feed.seek(target)
        times.append((time.perf_counter() - t) * 1e3)
        feed.stop()
    res["seek_ms_median"] = statistics.median(times)
    res["seek_ms_max"] = max(times)
    t = time.perf_counter()
    report = analyze(RecordingReader(path), name=os.path.basename(path))
    res["analyze_s"] = time.perf_counter() - t
    res["analyze_findings"] = len(report.findings)
    res["analyze_fast_path"] = any("while recording" in n for n in report.notes)
    res["samples"] = report.samples
    res["gpus"] = len(report.gpus)
    res["bytes_per_gpu_sample"] = os.path.getsize(path) / max(1, report.samples * max(1, len(report.gpus)))
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--seeks", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    r = measure(args.file, args.seeks)
    for k, v in r.items():
        print(f"{k:22s} {v:.3f}" if isinstance(v, float) else f"{k:22s} {v}")
    save_json(args.json, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
