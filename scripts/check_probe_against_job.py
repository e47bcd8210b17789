"""Compare what the probe recorded with what the job itself printed at the same moments.

    python scripts/check_probe_against_job.py RECORDING MEMORY_LOG

MEMORY_LOG: JSON lines {t, step, allocated, reserved} written by the job
(bench/workloads/train_phases.py --log-memory). For each logged moment the probe's
sample nearest in time is compared.
"""

from __future__ import annotations

import bisect
import json
import statistics
import sys

from traintop.record.recording import RecordingReader


def main() -> int:
    rec, log = sys.argv[1], sys.argv[2]
    frames = [f for f in RecordingReader(rec).frames() if f.ranks]
    times = [f.t for f in frames]
    rows = [json.loads(x) for x in open(log) if x.strip()]
    diffs_a, diffs_r, lags = [], [], []
    for row in rows:
        i = bisect.bisect_left(times, row["t"])
        cands = [j for j in (i - 1, i) if 0 <= j < len(frames)]
        if not cands:
            continue
        j = min(cands, key=lambda k: abs(times[k] - row["t"]))
        r = max(frames[j].ranks, key=lambda x: x.reserved or 0)
        if r.allocated is None:
            continue
        lags.append(abs(times[j] - row["t"]))
        diffs_a.append(abs(r.allocated - row["allocated"]) / max(row["allocated"], 1))
        diffs_r.append(abs(r.reserved - row["reserved"]) / max(row["reserved"], 1))
    if not diffs_a:
        print("no overlapping samples")
        return 1
    print(f"{len(diffs_a)} moments compared (nearest probe sample {statistics.median(lags):.2f} s away, median)")
    print(f"allocated: median relative difference {statistics.median(diffs_a) * 100:.3f} %, "
          f"90th percentile {sorted(diffs_a)[int(0.9 * (len(diffs_a) - 1))] * 100:.3f} %")
    print(f"reserved:  median relative difference {statistics.median(diffs_r) * 100:.3f} %, "
          f"90th percentile {sorted(diffs_r)[int(0.9 * (len(diffs_r) - 1))] * 100:.3f} %")
    exact = sum(1 for d in diffs_r if d == 0) / len(diffs_r)
    print(f"reserved identical (to the MiB the recording keeps) at {exact * 100:.0f} % of moments")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
