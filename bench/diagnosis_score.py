"""Score traintop's diagnosis against the labelled corpus of real H200 runs.

Every run in tests/fixtures/corpus/ was recorded four ways at once (with the probe, without it,
an nvidia-smi query log, a dmon log; scripts/h200_corpus.sh) while the job wrote down what it
was doing, second by second. This re-runs the rules over each source (the recordings also
thinned to 1 Hz) and compares, second by second, what traintop said with what the job said
(bench/corpus_labels.py says what each label expects, allows and contradicts). Per rule and
source:

  recall     the share of labelled seconds the expected finding was up, from its start on
  precision  the share of the rule's finding-seconds that a label expects or allows (or that
             fall within END_GRACE_S after the situation it names ended)
  start      the longest wait from a situation's start to its finding's (a miss shows as "miss")
  end        the longest a finding stayed up after its situation ended
  wrong      seconds a finding was up whose advice the label contradicts (never allowed)
  blind      such seconds in a source that cannot carry what tells them apart (reported)

    python bench/diagnosis_score.py                      # the table
    python bench/diagnosis_score.py --detail             # and every run's segments and findings
    python bench/diagnosis_score.py --json out.json --check tests/fixtures/corpus/score-baseline.json

``--check`` exits 1 on any wrong-advice second or a recall below the baseline's (CI runs it).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import pathlib
import sys
from collections import defaultdict

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from corpus_labels import LABELS, SOURCES, carried, label  # noqa: E402

CORPUS = REPO / "tests" / "fixtures" / "corpus"
END_GRACE_S = 10.0  # a finding may take this long to end once its cause has (the goal for "end")
RECALL_SLACK = 0.02  # --check: a recall this much below the baseline is a drop (rounding, not luck)


def runs(corpus: pathlib.Path = CORPUS) -> list[str]:
    return sorted(p.name[: -len(".labels.jsonl.gz")] for p in corpus.glob("*.labels.jsonl.gz"))


@dataclasses.dataclass(frozen=True)
class Segment:
    label: str
    t0: float
    t1: float


def segments(name: str, corpus: pathlib.Path = CORPUS) -> list[Segment]:
    """The job's own timeline: its lowest rank's phases, then ``ended`` from its exit on."""
    lines = [json.loads(x) for x in gzip.open(corpus / f"{name}.labels.jsonl.gz", "rt")]
    ranks = {x.get("rank") for x in lines}
    rank = None if None in ranks else min(ranks)
    lines = sorted((x for x in lines if x.get("rank") == rank), key=lambda x: x["t"])
    out: list[Segment] = []
    for x in lines:
        if out and out[-1].label == x["phase"]:
            continue
        if out:
            out[-1] = dataclasses.replace(out[-1], t1=x["t"])
        out.append(Segment(x["phase"], x["t"], math.inf))
    exit_t = next((x["t"] for x in reversed(lines) if x["event"] == "exit"), lines[-1]["t"] + 1.0)
    out[-1] = dataclasses.replace(out[-1], t1=exit_t)
    out.append(Segment("ended", exit_t, math.inf))
    return out


def at_1hz(frames):
    """One frame a second with point samples only, as a 1-Hz recorder would have seen it."""
    return [dataclasses.replace(f, gpus=tuple(dataclasses.replace(g, util_min=None, util_max=None) for g in f.gpus))
            for k, f in enumerate(frames) if k % 10 == 0]


def load(name: str, source: str, corpus: pathlib.Path = CORPUS):
    from traintop.importers import load as import_log
    from traintop.recording import RecordingReader

    if source in ("smi-100ms", "dmon-1s"):
        log = import_log(str(corpus / f"{name}-{'smi.csv' if source == 'smi-100ms' else 'dmon.txt'}.gz"))
        return log.info, list(log.frames())
    r = RecordingReader(str(corpus / f"{name}-{'probe' if source.startswith('probe') else 'noprobe'}.ttrec"))
    frames = list(r.frames())
    if source.startswith("noprobe"):
        # that recorder was attached by PID with no probe directory of its own, but it found the
        # job's probes all the same: what it would have seen without them is NVML and psutil alone
        frames = [dataclasses.replace(f, ranks=(), stacks=()) for f in frames]
    return r.info, at_1hz(frames) if source.endswith("1Hz") else frames


def judge(info, frames, config=None, extra_rules=()):
    """Every finding the rules raise over these frames, as the live dashboard would have."""
    from traintop.monitor import Monitor
    from traintop.rules import default_engine

    engine = default_engine(config) if config is not None else default_engine()
    engine.rules.extend(extra_rules)
    mon = Monitor(info, engine=engine)
    for f in frames:
        mon.ingest(f)
    mon.engine.close_all(frames[-1].t)
    return list(mon.engine.alerts)


@dataclasses.dataclass
class Cell:
    """One rule's score on one source, summed over the corpus."""

    found: float = 0.0  # labelled seconds the finding was up, from its start on
    due: float = 0.0  # labelled seconds it should have been up, from its start on
    segments: int = 0
    misses: list = dataclasses.field(default_factory=list)  # runs where it never came
    start: float = 0.0  # the longest start latency
    end: float = 0.0  # the longest end latency
    up: float = 0.0  # finding-seconds
    good: float = 0.0  # of those, expected or allowed
    wrong: float = 0.0
    blind: float = 0.0  # wrong-advice seconds where the source cannot carry what tells them apart
    wrong_where: list = dataclasses.field(default_factory=list)
    false_where: list = dataclasses.field(default_factory=list)

    @property
    def recall(self) -> float | None:
        return self.found / self.due if self.due else None

    @property
    def precision(self) -> float | None:
        return self.good / self.up if self.up else None


def _label_at(segs: list[Segment], t: float) -> str:
    if t < segs[0].t0:
        return "startup"
    for s in segs:
        if s.t0 <= t < s.t1:
            return s.label
    return "ended"


def _active(alerts, t: float, t_last: float) -> dict[str, float]:
    """The rules with a finding up at ``t`` (not explained by a stronger one), each with its start."""
    out: dict[str, float] = {}
    for a in alerts:
        if a.start <= t < (a.end if a.end is not None else t_last + 1) and not getattr(a, "explained_by", None):
            out[a.rule] = min(a.start, out.get(a.rule, a.start))
    return out


def _segment_start(segs: list[Segment], t: float) -> float:
    return next((s.t0 for s in segs if s.t0 <= t < s.t1), segs[-1].t0 if t >= segs[-1].t0 else -math.inf)


def score_run(name: str, source: str, cells: dict, detail: list | None = None, config=None,
              corpus: pathlib.Path = CORPUS, extra_rules=()) -> None:
    segs = segments(name, corpus)
    info, frames = load(name, source, corpus)
    if not frames:
        return
    alerts = judge(info, frames, config, extra_rules)
    t_first, t_last = frames[0].t, frames[-1].t
    grid = [t_first + k for k in range(int(t_last - t_first) + 1)]
    up = {t: _active(alerts, t, t_last) for t in grid}
    # a situation ends where the next segment stops expecting its finding
    for i, s in enumerate(segs):
        lab = label(s.label)
        if not lab.expect or not carried(lab, source):
            continue
        def same(other: Segment) -> bool:  # the same situation, carried on under another name
            return label(other.label).expect == lab.expect and carried(label(other.label), source)

        if i and same(segs[i - 1]):
            continue
        t1 = s.t1
        j = i + 1
        while j < len(segs) and same(segs[j]):
            t1 = segs[j].t1
            j += 1
        lo, hi = max(s.t0, t_first), min(t1, t_last)
        if hi - lo < 1:
            continue
        cell = cells[(lab.expect[0], source)]
        cell.segments += 1
        inside = [t for t in grid if lo <= t < hi]
        hit = [t for t in inside if set(up[t]) & set(lab.expect)]
        if not hit:
            cell.misses.append(name)
            cell.due += len(inside)
            if detail is not None:
                detail.append(f"  {source:13} {name}: {s.label} {hi - lo:.0f} s, {'/'.join(lab.expect)} never raised")
            continue
        start = hit[0] - lo
        cell.start = max(cell.start, start)
        cell.found += len(hit)
        cell.due += len([t for t in inside if t >= hit[0]])
        after = [t for t in grid if t >= hi]
        still = 0.0
        for t in after:
            if not set(up[t]) & set(lab.expect):
                break
            still = t - hi + 1
        if t1 < t_last:
            cell.end = max(cell.end, still)
        if detail is not None:
            detail.append(f"  {source:13} {name}: {s.label} {hi - lo:.0f} s, {'/'.join(lab.expect)} from +{start:.0f} s, "
                          f"{len(hit)}/{len(inside) - int(start)} s, ended {still:.0f} s after")
    # a finding that was right may take END_GRACE_S to go once its situation has
    ends = [(s.t1, set(label(s.label).expect) | set(label(s.label).allow)) for s in segs]
    for t in grid:
        lab = label(_label_at(segs, t))
        if lab.ignore:
            continue
        began = _segment_start(segs, t)
        for rule, since in up[t].items():
            cell = cells[(rule, source)]
            cell.up += 1
            # a finding right before may take END_GRACE_S to go; one already up when the situation
            # changed gets as long to go before its advice counts as wrong
            grace = any(e <= t < e + END_GRACE_S and rule in exp for e, exp in ends)
            carried_over = since < began <= t < began + END_GRACE_S
            if rule in lab.expect or rule in lab.allow or grace:
                cell.good += 1
            else:
                where = f"{name}:{_label_at(segs, t)}"
                if where not in cell.false_where:
                    cell.false_where.append(where)
            if rule in lab.wrong and not grace and not carried_over:
                if not carried(lab, source):
                    cell.blind += 1
                    continue
                cell.wrong += 1
                where = f"{name}:{_label_at(segs, t)}"
                if where not in cell.wrong_where:
                    cell.wrong_where.append(where)


def score(names=None, sources=SOURCES, detail: list | None = None, config=None, corpus: pathlib.Path = CORPUS,
          extra_rules=()):
    cells: dict = defaultdict(Cell)
    for name in names or runs(corpus):
        for source in sources:
            score_run(name, source, cells, detail, config, corpus, extra_rules)
    return cells


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:.0f} %"


def table(cells: dict, sources=SOURCES) -> str:
    rules = sorted({r for r, _ in cells})
    head = f"{'rule':15} {'source':13} {'seg':>3} {'recall':>7} {'start':>6} {'end':>5} {'precision':>9} {'up s':>5} {'wrong':>5} {'blind':>5}"
    out = [head, "-" * len(head)]
    for rule in rules:
        for source in sources:
            c = cells.get((rule, source))
            if c is None:
                continue
            start = "miss" if c.misses and not c.found else (f"{c.start:.0f} s" if c.segments else "—")
            out.append(f"{rule:15} {source:13} {c.segments:>3} {_pct(c.recall):>7} {start:>6} "
                       f"{(f'{c.end:.0f} s' if c.segments else '—'):>5} {_pct(c.precision):>9} {c.up:>5.0f} {c.wrong:>5.0f} {c.blind:>5.0f}"
                       + (f"  misses: {', '.join(c.misses)}" if c.misses else "")
                       + (f"  wrong: {', '.join(c.wrong_where)}" if c.wrong_where else ""))
    return "\n".join(out)


def to_json(cells: dict) -> dict:
    return {f"{rule}|{source}": {"segments": c.segments, "recall": c.recall, "precision": c.precision,
                                 "start_s": c.start, "end_s": c.end, "up_s": c.up, "wrong_s": c.wrong, "blind_s": c.blind,
                                 "misses": c.misses, "wrong_where": c.wrong_where, "false_where": c.false_where}
            for (rule, source), c in sorted(cells.items())}


def check(cells: dict, baseline: dict) -> list[str]:
    """What fails CI: any wrong-advice second; a recall below the baseline's."""
    problems = []
    now = to_json(cells)
    for key, c in now.items():
        if c["wrong_s"]:
            problems.append(f"{key}: {c['wrong_s']:.0f} wrong-advice seconds ({', '.join(c['wrong_where'])})")
        was = baseline.get(key, {}).get("recall")
        if was is not None and (c["recall"] is None or c["recall"] < was - RECALL_SLACK):
            problems.append(f"{key}: recall {_pct(c['recall'])}, was {_pct(was)}")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--detail", action="store_true", help="every run's situations and when they were named")
    ap.add_argument("--json", help="write the scores here")
    ap.add_argument("--check", help="a baseline JSON: exit 1 on any wrong-advice second or a recall drop")
    ap.add_argument("--runs", help="comma-separated run names (default: all)")
    args = ap.parse_args()
    unknown = {json.loads(x)["phase"] for n in runs() for x in gzip.open(CORPUS / f"{n}.labels.jsonl.gz", "rt")} - set(LABELS)
    if unknown:
        print(f"diagnosis_score: labels without a meaning in bench/corpus_labels.py: {', '.join(sorted(unknown))}",
              file=sys.stderr)
        return 2
    detail: list | None = [] if args.detail else None
    cells = score(args.runs.split(",") if args.runs else None, detail=detail)
    if detail:
        print("\n".join(detail))
        print()
    print(table(cells))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(to_json(cells), indent=1) + "\n")
    if args.check:
        problems = check(cells, json.loads(pathlib.Path(args.check).read_text()))
        for p in problems:
            print(f"FAIL {p}")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
