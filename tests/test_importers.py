"""nvidia-smi logs recorded beside a real H200 job: imported, analysed, replayed; bad input refused."""

import asyncio
import gzip
import json
import pathlib
import subprocess
import sys

import pytest

from traintop.sources import importers
from traintop.watch import sessions
from traintop.reports.analyze import analyze
from traintop.errors import TraintopError

FIX = pathlib.Path(__file__).parent / "fixtures" / "h200"
QUERY = FIX / "smi-query-100ms.csv.gz"


def query_lines():
    return gzip.decompress(QUERY.read_bytes()).decode().splitlines()


def rules_of(path, **kw):
    return {f.rule for f in analyze(importers.load(str(path), **kw)).findings}


def test_query_log_yields_the_same_findings_as_traintops_own_recording():
    # the idle phase too: the log lists no processes, but 16 GiB in use at 0 % is a GPU held idle
    assert rules_of(QUERY) == {"power_cap", "starvation", "underuse", "memory_creep", "idle_gpu"}


def test_query_log_at_1hz_still_finds_starvation_and_underuse(tmp_path):
    lines = query_lines()
    p = tmp_path / "1hz.csv"
    p.write_text("\n".join([lines[0]] + lines[1::10]))
    assert {"starvation", "underuse"} <= rules_of(p)


def test_nounits_subset_and_any_order(tmp_path):
    lines = query_lines()
    header = [h.strip() for h in lines[0].split(",")]
    want = ["power.draw [W]", "timestamp", "utilization.gpu [%]", "index", "power.limit [W]"]
    cols = [header.index(w) for w in want]
    rows = [", ".join(w.split(" [")[0] for w in want)]
    for line in lines[1:]:
        parts = [x.strip() for x in line.split(",")]
        rows.append(", ".join(parts[c].split(" ")[0] if c != header.index("timestamp") else parts[c] for c in cols))
    p = tmp_path / "nounits.csv"
    p.write_text("\n".join(rows))
    log = importers.load(str(p))
    full = importers.load(str(QUERY))
    assert len(log.frames_list) == len(full.frames_list)
    mid = len(log.frames_list) // 2
    assert log.frames_list[mid].gpus[0].power_w == full.frames_list[mid].gpus[0].power_w
    assert log.frames_list[mid].gpus[0].mem_used is None  # not in this subset: None, never 0
    assert "starvation" in rules_of(p)


def test_headerless_csv_gets_a_clear_error_and_fields_fix_it(tmp_path):
    lines = query_lines()
    p = tmp_path / "noheader.csv"
    p.write_text("\n".join(lines[1:]))
    with pytest.raises(TraintopError, match="no header line.*--fields"):
        importers.load(str(p))
    fields = [h.split(" [")[0].strip() for h in lines[0].split(",")]
    log = importers.load(str(p), fields=fields)
    assert len(log.frames_list) == len(lines) - 1


@pytest.mark.parametrize("name,gpus", [("dmon-1hz.txt", 1), ("dmon-csv-dt.csv", 2)])
def test_dmon_plain_and_csv(name, gpus):
    log = importers.load(str(FIX / name))
    assert log.kind == "nvidia-smi dmon" and len(log.info.gpus) == gpus
    assert log.info.interval == 1.0
    mid = log.frames_list[len(log.frames_list) // 2].gpus[0]
    assert mid.power_w and mid.sm_clock and mid.util is not None


def test_dmon_without_timestamps(tmp_path):
    lines = (FIX / "dmon-1hz.txt").read_text().splitlines()
    stripped = []
    for line in lines:
        parts = line.split()
        stripped.append(("# " if line.startswith("#") else " ") + " ".join(parts[2:] if not line.startswith("#")
                                                                           else parts[2:]))
    p = tmp_path / "dmon-nodt.txt"
    p.write_text("\n".join(stripped))
    log = importers.load(str(p))
    assert log.frames_list[0].t == 0.0 and log.frames_list[10].t == 10.0
    assert log.notes and "no timestamps" in log.notes[0]
    assert "starvation" in {f.rule for f in analyze(log).findings}


@pytest.mark.parametrize("content,needle", [
    (b"", "empty"),
    (b"\x00\x01\x02binary" * 100, "binary"),
    (b"hello world\nthis is not a log\n", "not a traintop recording"),
    (b"timestamp, index, utilization.gpu [%]\n" + b"garbage, x, y\n" * 50, "unreadable"),
    (b"index, utilization.gpu [%]\n0, 5 %\n", "no timestamp field"),
])
def test_bad_logs_are_refused_in_one_line(tmp_path, content, needle):
    p = tmp_path / "bad.csv"
    p.write_bytes(content)
    with pytest.raises(TraintopError, match=needle) as e:
        importers.load(str(p))
    assert "\n" not in str(e.value)


def test_analyze_cli_json_and_fail_on(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "traintop", "analyze", *args], capture_output=True, text=True,
                              timeout=120)
    r = run(str(QUERY), "--json", "--fail-on", "warning")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["gpu_hours_lost"] > 0 and {f["rule"] for f in doc["findings"]} >= {"starvation", "underuse"}
    starv = next(f for f in doc["findings"] if f["rule"] == "starvation")
    assert starv["gpu_hours_lost"] > 0 and starv["remedies"]
    assert run(str(QUERY), "--fail-on", "critical").returncode == 1  # the leak is critical
    healthy = tmp_path / "h.ttrec"
    subprocess.run([sys.executable, "-m", "traintop", "record", str(healthy), "--simulate", "healthy",
                    "--duration", "120", "--fast", "--quiet"], check=True, timeout=120)
    r = run(str(healthy), "--fail-on", "warning")
    assert r.returncode == 0 and "Power-capped" in r.stdout
    r = run(str(tmp_path / "missing.csv"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def test_an_imported_log_replays_in_the_dashboard():
    from traintop.app.factory import build_app
    from traintop.widgets.gpu_panel import GpuPanel

    monitor, feed = sessions.replay_session(str(QUERY))
    feed.playing = False
    feed.seek(feed.t_start + 110)

    async def go():
        app = build_app(monitor, feed, mode="replay", start_feed=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            assert len(app.query(GpuPanel)) == 1
            assert "Data starvation" in str(app.query_one("#alerts-body").render())
    asyncio.run(go())


@pytest.mark.parametrize("limit,value,needle", [("MAX_ROWS", 50, "more than 50 samples"),
                                                ("MAX_VALUES", 300, "more than 300 values")])
def test_logs_above_the_stated_limits_are_refused(monkeypatch, limit, value, needle):
    monkeypatch.setattr(importers, limit, value)
    with pytest.raises(TraintopError, match=needle) as e:
        importers.load(str(QUERY))
    assert "split it first" in str(e.value)


def test_a_line_longer_than_the_limit_is_skipped_not_held(tmp_path):
    lines = query_lines()[:200]
    lines[50] = lines[50] + "x" * (importers.MAX_LINE * 3)
    p = tmp_path / "long.csv"
    p.write_text("\n".join(lines))
    log = importers.load(str(p))
    assert log.skipped_lines == 1 and log.frame_count == 198


def test_import_keeps_columns_not_frames():
    """Memory follows the samples: one float per GPU and field, frames built only when read."""
    log = importers.load(str(QUERY))
    cols = log.columns
    per_sample = sum(c.itemsize for g in cols.gpus.values() for c in g.cols) / len(cols.gpus)
    assert per_sample <= 8 * len(importers.QUERY_FIELDS)
    assert not hasattr(log, "frames_list_cache") and log.frame_count == len(cols.t)
    first = next(log.frames())
    assert first.t == log.t_start and first.gpus[0].mem_total == 143771 * 1024 ** 2


def test_lines_out_of_time_order_play_sorted(tmp_path):
    lines = query_lines()
    body = lines[1:101]
    p = tmp_path / "shuffled.csv"
    p.write_text("\n".join([lines[0]] + body[50:] + body[:50]))
    frames = importers.load(str(p)).frames_list
    assert [f.t for f in frames] == sorted(f.t for f in frames) and len(frames) == 100


def test_a_field_read_again_and_again_gives_what_reading_it_once_gives(tmp_path, monkeypatch):
    """Each distinct text is converted once per field (a bounded memo): with no room in the memo,
    every sample is what the memo gave, and a damaged line is skipped either way."""
    lines = query_lines()
    parts = lines[40].split(",")
    parts[6] = " abc W"  # power.draw
    p = tmp_path / "log.csv"
    p.write_text("\n".join(lines[:40] + [",".join(parts)] + lines[41:]))
    remembered = importers.load(str(p))
    monkeypatch.setattr(importers, "MEMO_SIZE", 0)
    fresh = importers.load(str(p))
    assert remembered.frame_count == fresh.frame_count == len(lines) - 2
    assert [f.gpus for f in remembered.frames_list] == [f.gpus for f in fresh.frames_list]
    assert remembered.skipped_lines == fresh.skipped_lines == 1
