"""Build the embedded demo from a real recording and its phase log.

    python scripts/make_demo.py tests/fixtures/h200/training-phases-10hz.ttrec \
        tests/fixtures/h200/phases.jsonl traintop/demo/h200-demo.ttrec --every 5

Keeps every Nth frame (10 Hz -> 2 Hz, traintop's default rate); the windowed
utilization min/max of each kept frame becomes the min/max of the N raw samples it
stands for. Phase offsets go into the metadata (the screenshot script uses them).
The demo names itself neutrally and shows no path of the machine it was recorded on:
the job's command line keeps each file's name, not its folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

from traintop.record.recording import RecordingReader, RecordingWriter
from traintop.samples import SessionInfo

LABEL = "demo: a real H200 session"
WHAT = "bf16 MLP training with the probe: healthy → data-starved → tiny batches → leak → idle"


def neutral(frame):
    """``frame`` with the job's command line free of the recording machine's folders."""
    p = frame.process
    if p is None:
        return frame
    cmdline = " ".join(os.path.basename(a) if a.startswith("/") else a for a in p.cmdline.split(" "))
    return dataclasses.replace(frame, process=dataclasses.replace(p, cmdline=cmdline))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("recording")
    ap.add_argument("phases")
    ap.add_argument("out")
    ap.add_argument("--every", type=int, default=5)
    args = ap.parse_args()
    r = RecordingReader(args.recording)
    frames = list(r.frames())
    t0 = frames[0].t
    marks = [json.loads(line) for line in open(args.phases) if line.strip()]
    starts = {m["phase"]: m["t"] for m in marks if m["event"] == "start"}
    ends = {m["phase"]: m["t"] for m in marks if m["event"] == "end"}
    mids = {p: round((starts[p] + ends[p]) / 2 - t0, 1) for p in starts if p in ends}
    bounds = {p: [round(starts[p] - t0, 1), round(ends[p] - t0, 1)] for p in starts if p in ends}
    kept = []
    for k in range(0, len(frames) - args.every + 1, args.every):
        group = frames[k:k + args.every]
        last = group[-1]
        gpus = []
        for j, g in enumerate(last.gpus):
            utils = [f.gpus[j].util for f in group if j < len(f.gpus) and f.gpus[j].util is not None]
            gpus.append(dataclasses.replace(g, util_min=min(utils) if utils else None,
                                            util_max=max(utils) if utils else None))
        kept.append(neutral(dataclasses.replace(last, gpus=tuple(gpus))))
    info = r.info
    info = SessionInfo(kind="demo", gpus=info.gpus, driver=info.driver, cuda_driver=info.cuda_driver,
                       hostname="h200", interval=info.interval * args.every, label=LABEL,
                       extra={"what": WHAT, "phases": mids, "phase_bounds": bounds,
                              "source": os.path.basename(args.recording), "downsampled_every": args.every})
    if os.path.exists(args.out):
        os.unlink(args.out)
    w = RecordingWriter(args.out, info, chunk_frames=1000)
    for f in kept:
        w.add(f)
    w.close()
    print(f"wrote {args.out}: {len(kept)} frames, {os.path.getsize(args.out)} bytes, phases {mids}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
