"""Score the probe's time ledger and MFU against what the corpus's jobs said (bench/diagnosis_score.py).

Ledger: per run and rank, each bucket's share of the time both sides saw (from the first second
the probe's ledger and the labels both cover to the job's ``done``), traintop's from the probe
recording's ``time_*`` series summed by traintop/reports/time_ledger.py, the job's from its labels mapped
to buckets (bench/corpus_labels.py ``BUCKET``). A rank whose labels there include one that does
not say how its time splits (``BUCKET`` None) is not scored; a recording without the ledger
(recorded before it existed) has no row.

MFU: where the job wrote its own count (a ``stats`` label line: ``steps`` optimizer steps in
``seconds`` of wall time, ``flops_hand`` FLOPs a step counted by hand, ``matmul`` its matmuls'
precision; bench/workloads/corpus.py), the analytic MFU is flops_hand x steps / seconds over the
GPU's dense peak for that precision (traintop/mfu.py); traintop's is what its process panel shows,
the MFU of the steps (traintop.mfu.mfu of the probe's step FLOPs and matmul precision over the
ledger's train and input seconds per step, traintop.metrics.step_period), over the phase's wall
time: from the first time the job named that phase to its stats line (its ``seconds`` are its
steps' time within, their waits for input included, as nanoGPT times an iteration). A recording
without the ledger: the median of the recorded step rate's period instead.

The gate: every bucket within LEDGER_GATE_POINTS, MFU within MFU_GATE (relative).
"""

from __future__ import annotations

import json
import pathlib
import statistics
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from corpus_labels import BUCKET  # noqa: E402

LEDGER_GATE_POINTS = 5.0
MFU_GATE = 0.10
RATE_S = 10.0  # the probe client's step rate is over the last 10 s (collectors/probe_client.py RATE_S)
# corpus.py's step() autocasts to bf16 unless told otherwise; fp32_no_tf32 turns TF32 off: for stats
# lines written before they carried "matmul"
MATMUL_OF_PHASE = {"train_fp32": "fp32"}
GROWTH_POINTS = 1.0  # a recorded miss may not grow by more than this (points; MFU: this share of a point)


def _load(name: str, corpus: pathlib.Path):
    import diagnosis_score

    return diagnosis_score.load(name, "probe-10Hz", corpus)


def _labels(name: str, corpus: pathlib.Path) -> list[dict]:
    import diagnosis_score

    return diagnosis_score.label_lines(name, corpus)


def _rank_label(rank: int | None, frames) -> str | None:
    """The ledger's label of the probed process that is this labelled rank: ``rank N``, or for a
    job without ranks the one process that stepped (a compile worker carries a probe too)."""
    if rank is not None:
        return f"rank {rank}"
    stepped = {r.label for f in frames for r in f.ranks if r.steps}
    return next(iter(stepped)) if len(stepped) == 1 else None


def ledger_rows(names, corpus: pathlib.Path) -> dict:
    import diagnosis_score
    from traintop.reports.time_ledger import TimeLedger

    out: dict = {}
    for name in names:
        info, frames = _load(name, corpus)
        with_ledger = [f for f in frames if any(r.ledger() for r in f.ranks)]
        if not with_ledger:
            continue
        for rank in sorted({x.get("rank") for x in _labels(name, corpus)}, key=lambda r: -1 if r is None else r):
            who = _rank_label(rank, frames)
            segs = diagnosis_score.segments(name, corpus, rank=rank)
            done = next((s.t0 for s in segs if s.label in ("done", "ended")), segs[-1].t0)
            t0, t1 = max(segs[0].t0, with_ledger[0].t), min(done, with_ledger[-1].t)
            if who is None or t1 - t0 < 1:
                continue
            label_s: dict[str, float] = {}
            unsplit = set()
            for s in segs:
                lo, hi = max(s.t0, t0), min(s.t1, t1)
                if hi <= lo:
                    continue
                bucket = BUCKET.get(s.label)
                if bucket is None:
                    unsplit.add(s.label)
                    continue
                label_s[bucket] = label_s.get(bucket, 0.0) + hi - lo
            if unsplit:
                continue
            ledger = TimeLedger()
            for f in frames:
                if t0 <= f.t <= t1:
                    ledger.add(f)
            mine = next((r for r in ledger.report() if r["rank"] == who), None)
            if mine is None:
                continue
            total = sum(label_s.values())
            buckets = {}
            for b in sorted(set(label_s) | set(mine["buckets"])):
                ours = mine["buckets"].get(b, {}).get("share", 0.0)
                theirs = label_s.get(b, 0.0) / total
                buckets[b] = [round(ours * 100, 1), round(theirs * 100, 1)]
            worst = max(abs(a - b) for a, b in buckets.values())
            out[f"{name}|{who}"] = {"seconds": round(total, 1), "buckets": buckets, "worst_points": round(worst, 1)}
    return out


def mfu_rows(names, corpus: pathlib.Path) -> dict:
    from traintop.metrics import step_period
    from traintop.mfu import mfu, peak_flops

    out: dict = {}
    for name in names:
        stats = [x for x in _labels(name, corpus) if x["event"] == "stats" and x.get("flops_hand")]
        if not stats:
            continue
        info, frames = _load(name, corpus)
        gpu = info.gpus[0].name if info.gpus else None
        starts = {}
        for x in _labels(name, corpus):
            if x["event"] == "phase":
                starts.setdefault((x.get("rank"), x["phase"]), x["t"])
        for x in stats:
            t1 = x["t"]
            t0 = starts.get((x.get("rank"), x["phase"]), t1 - x["seconds"])
            matmul = x.get("matmul") or MATMUL_OF_PHASE.get(x["phase"], "bf16")
            peak = peak_flops(gpu, matmul)
            analytic = x["flops_hand"] * x["steps"] / x["seconds"] / peak if peak else None
            who = _rank_label(x.get("rank"), frames)
            timed = [(f.t, r) for f in frames if t0 <= f.t <= t1 for r in f.ranks if r.label == who]
            mine = [r for _, r in timed]
            period = step_period([(t, r.steps) for t, r in timed if r.steps is not None],
                                 [(t, r.time_train) for t, r in timed if r.time_train is not None],
                                 [(t, r.time_input) for t, r in timed if r.time_input is not None])
            if period is None:
                rates = [r.steps_per_s for t, r in timed if r.steps_per_s and t >= t0 + RATE_S]
                period = 1.0 / statistics.median(rates) if rates else None
            flops = next((r.step_flops for r in reversed(mine) if r.step_flops), None)
            mode = next((r.matmul_mode for r in reversed(mine) if r.matmul_mode), None)
            ours = mfu(flops, period, gpu, mode)
            out[f"{name}|{x['phase']}"] = {
                "analytic": None if analytic is None else round(analytic, 4), "traintop": None if ours is None else round(ours, 4),
                "rel": None if ours is None or not analytic else round(ours / analytic - 1, 4),
                "matmul": [matmul, mode]}
    return out


def _ledger_miss(row: dict) -> float:
    return max(0.0, row["worst_points"] - LEDGER_GATE_POINTS)


def _mfu_miss(row: dict) -> float:
    return 100.0 if row["rel"] is None else max(0.0, abs(row["rel"]) - MFU_GATE) * 100


def check(ledger: dict, mfu: dict, base_ledger: dict, base_mfu: dict) -> list[str]:
    """A row off by more than the gate fails, unless the baseline recorded that miss and it did not
    grow; a row of the baseline no longer there fails."""
    problems = []
    for kind, now, was, miss, say in (
            ("ledger", ledger, base_ledger, _ledger_miss,
             lambda r: "; ".join(f"{b} {a:.0f} % vs {c:.0f} % labelled" for b, (a, c) in r["buckets"].items()
                                 if abs(a - c) > LEDGER_GATE_POINTS)),
            ("mfu", mfu, base_mfu, _mfu_miss,
             lambda r: f"traintop {_pct(r['traintop'])} vs analytic {_pct(r['analytic'])}")):
        for key in sorted(set(now) | set(was)):
            if key not in now:
                problems.append(f"{kind} {key}: in the baseline, no longer scored")
                continue
            m = miss(now[key])
            if m and (key not in was or m > miss(was[key]) + GROWTH_POINTS):
                problems.append(f"{kind} {key}: {say(now[key])}")
    return problems


def known_misses(ledger: dict, mfu: dict) -> list[str]:
    return ([f"ledger {k}: worst bucket {r['worst_points']:.0f} points off" for k, r in ledger.items() if _ledger_miss(r)]
            + [f"mfu {k}: traintop {_pct(r['traintop'])} vs analytic {_pct(r['analytic'])}"
               for k, r in mfu.items() if _mfu_miss(r)])


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:.1f} %"


def ledger_table(rows: dict) -> str:
    out = [f"Time ledger: each bucket's share, traintop / labelled (gate: within {LEDGER_GATE_POINTS:.0f} points)"]
    if not rows:
        return out[0] + "\n  (no run's probe recording has the ledger)"
    for key, r in rows.items():
        parts = ", ".join(f"{b} {a:.0f}/{c:.0f}" + (" MISS" if abs(a - c) > LEDGER_GATE_POINTS else "")
                          for b, (a, c) in r["buckets"].items())
        out.append(f"  {key:34} {r['seconds']:>5.0f} s  {parts}")
    return "\n".join(out)


def mfu_table(rows: dict) -> str:
    out = [f"MFU: traintop against the job's analytic count (gate: within {MFU_GATE * 100:.0f} %)"]
    if not rows:
        return out[0] + "\n  (no run wrote its FLOPs: —)"
    for key, r in rows.items():
        rel = "—" if r["rel"] is None else f"{r['rel'] * 100:+.0f} %"
        out.append(f"  {key:34} traintop {_pct(r['traintop']):>7}  analytic {_pct(r['analytic']):>7}  {rel}"
                   + ("  MISS" if _mfu_miss(r) else ""))
    return "\n".join(out)


if __name__ == "__main__":
    import diagnosis_score

    names = diagnosis_score.runs()
    print(json.dumps({"ledger": ledger_rows(names, diagnosis_score.CORPUS),
                      "mfu": mfu_rows(names, diagnosis_score.CORPUS)}, indent=1))
