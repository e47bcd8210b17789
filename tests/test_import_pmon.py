"""`nvidia-smi pmon` logs: each process's share of its GPU, never read as the GPU's own."""

import asyncio

import pytest

from traintop.sources import importers
from traintop.watch import sessions
from traintop.reports.analyze import analyze
from traintop.errors import TraintopError

PMON_DT_UM = """\
#Date       Time        gpu         pid   type     sm    mem    enc    dec    jpg    ofa     fb   command
#YYYYMMDD   HH:MM:SS    Idx           #    C/G      %      %      %      %      %      %     MB   name
20261202    10:00:00      0      12345     C     64     30      -      -      -      -  20480   python
20261202    10:00:00      0      12399     C     12      3      -      -      -      -   1024   python
20261202    10:00:00      1          -     -      -      -      -      -      -      -      -   -
20261202    10:00:01      0      12345     C     60     28      -      -      -      -  20480   python
20261202    10:00:01      0      12399     C    180      5      -      -      -      -   1024   python
20261202    10:00:01      1      77777     C     99     40      -      -      -      -  40960   torchrun --nproc 8
20261202    10:00:02      0      12345     C      -      -      -      -      -      -  20480   python
#Date       Time        gpu         pid   type     sm    mem    enc    dec    jpg    ofa     fb   command
20261202    10:00:03      0  99999999999     C     50     50      -      -      -      -      1   forged
20261202    10:00:03      0      12345     C     70     31      -      -      -      -  20480   python
"""

PMON_PLAIN = """\
# gpu         pid   type     sm    mem    enc    dec   command
# Idx           #    C/G      %      %      %      %   name
    0      12345     C     64     30      0      0   python
    1      23456     C     10      1      0      0   python
    0      12345     C     66     31      0      0   python
    1      23456     C     11      1      0      0   python
"""


def _load(tmp_path, text, name="pmon.txt"):
    p = tmp_path / name
    p.write_text(text)
    return importers.load(str(p))


def test_pmon_with_dates_and_memory(tmp_path):
    log = _load(tmp_path, PMON_DT_UM)
    frames = log.frames_list
    assert log.kind == "nvidia-smi pmon" and len(frames) == 4 and log.skipped_lines == 1  # the forged PID
    first = {g.index: g for g in frames[0].gpus}
    assert first[1].processes == ()  # "-": the GPU had no process then
    p = first[0].processes[0]
    assert (p.pid, p.sm_util, p.mem_util, p.enc_util, p.used_bytes) == (12345, 64.0, 30.0, None, 20480 * 2**20)
    assert first[0].util is None and first[0].mem_util is None  # a process's share is not the GPU's reading
    second = {g.index: g for g in frames[1].gpus}
    assert [(q.pid, q.sm_util) for q in second[0].processes] == [(12345, 60.0), (12399, None)]  # 180 %: dropped
    assert second[1].processes[0].pid == 77777  # a command with spaces stays one column
    assert frames[1].t - frames[0].t == pytest.approx(1.0)
    assert [g.index for g in frames[2].gpus] == [0] and frames[2].gpus[0].processes[0].sm_util is None


def test_pmon_without_dates_counts_rounds(tmp_path):
    log = _load(tmp_path, PMON_PLAIN)
    frames = log.frames_list
    assert [f.t for f in frames] == [0.0, 1.0]
    assert [[(g.index, g.processes[0].sm_util) for g in f.gpus] for f in frames] == [[(0, 64.0), (1, 10.0)],
                                                                                    [(0, 66.0), (1, 11.0)]]
    assert any("no timestamps" in n for n in log.notes)


def test_analyze_says_what_a_pmon_log_cannot_show(tmp_path):
    p = tmp_path / "pmon.txt"
    p.write_text(PMON_DT_UM)
    report = analyze(importers.load(str(p)))
    assert report.findings == [] and any("not the GPU's own readings" in n for n in report.notes)


@pytest.mark.parametrize("text, needle", [
    ("# gpu pid type sm mem command\n    0   x   C  1  2  py\n" * 20, "unreadable"),
    ("# gpu pid type sm mem command\n", "no sample"),
])
def test_a_bad_pmon_log_is_one_line(tmp_path, text, needle):
    p = tmp_path / "bad.txt"
    p.write_text(text)
    with pytest.raises(TraintopError, match=needle):
        importers.load(str(p))


def test_a_pmon_log_replays_in_the_dashboard(tmp_path):
    from traintop.app.factory import build_app
    from traintop.widgets.gpu_panel import GpuPanel

    p = tmp_path / "pmon.txt"
    p.write_text(PMON_DT_UM)
    monitor, feed = sessions.replay_session(str(p))
    feed.playing = False
    feed.seek(feed.t_start)

    async def go():
        app = build_app(monitor, feed, mode="replay", start_feed=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            panels = list(app.query(GpuPanel))
            assert len(panels) == 2
            assert "2 procs, PID 12345 busiest at 64 %" in str(panels[0].render())
    asyncio.run(go())


def test_on_an_h200_traintops_share_of_each_process_matches_pmons(tmp_path):
    """Recorded on an H200 (driver 580.159): two jobs on GPU 0, a busy one and a light one,
    `nvidia-smi pmon -s um -o DT` beside `traintop record --jsonl` in one run. Each second
    traintop gives both seconds' shares within 10 points of pmon's (pmon's "-": no samples, 0 %)."""
    import json
    import pathlib

    fix = pathlib.Path(__file__).parent / "fixtures" / "h200"
    pmon = importers.load(str(fix / "pmon-two-jobs.txt"))
    theirs = {}
    for f in pmon.frames():
        for p in f.gpus[0].processes:
            theirs[(round(f.t), p.pid)] = p.sm_util or 0.0
    ours = {}
    records = [json.loads(line) for line in (fix / "two-jobs-samples.jsonl").read_text().splitlines()]
    for rec in records:
        for p in rec["gpus"][0]["processes"]:
            if p["sm_util"] is not None:
                ours[(round(rec["t"]), p["pid"])] = p["sm_util"]
    # pmon's times are wall-clock text read in this machine's time zone: both started together, so
    # their first seconds line them up
    offset = round(records[0]["t"]) - round(pmon.t_start)
    pairs = [(v, theirs.get((t - offset, pid))) for (t, pid), v in ours.items()]
    pairs = [(a, b) for a, b in pairs if b is not None]
    assert len(pairs) >= 20 and {pid for _, pid in ours} == {pid for _, pid in theirs}
    assert all(abs(a - b) <= 10 for a, b in pairs), pairs
    assert max(a for a, _ in pairs) >= 95 and min(a for a, _ in pairs) == 0  # the busy one and the light one
