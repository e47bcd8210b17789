"""This stop's new inputs, attacked as whoever can write them: a pmon log someone hands over,
owner labels another host sends through Prometheus, /proc files another local user's process
fills (its environment). Bounded, one line, nothing forged, nothing shown as control codes."""

import os

import pytest

from traintop.sources import importers
from traintop.cluster.report import _owner_name
from traintop.collectors import whose
from traintop.errors import TraintopError

HEAD = "#Date Time gpu pid type sm mem enc dec fb command\n"


def _pmon(tmp_path, body: str):
    p = tmp_path / "pmon.txt"
    p.write_text(HEAD + body)
    return str(p)


def test_a_pmon_log_past_its_row_limit_is_refused_in_one_line(tmp_path, monkeypatch):
    import traintop.sources.import_pmon as P

    monkeypatch.setattr(P, "MAX_PMON_ROWS", 100)
    body = "".join(f"20261202 10:00:{k % 60:02d} 0 {1000 + k} C 50 10 - - 100 python\n" for k in range(500))
    with pytest.raises(TraintopError, match="more than 100 process lines"):
        importers.load(_pmon(tmp_path, body))


def test_a_pmon_log_of_ten_thousand_gpus_or_forged_numbers(tmp_path):
    many = "".join(f"20261202 10:00:00 {g} 1 C 50 10 - - 100 python\n" for g in range(10_000))
    with pytest.raises(TraintopError, match="unreadable"):
        importers.load(_pmon(tmp_path, many))
    body = ("20261202 10:00:00 0 123 C 99999 -5 1e400 nan 99999999999999999999 python\x1b]52;c;AAAA\x07 [bold]x\n"
            "20261202 10:00:01 0 123 C 50 10 - - 100 python\n")
    log = importers.load(_pmon(tmp_path, body))
    p = log.frames_list[0].gpus[0].processes[0]
    assert (p.sm_util, p.mem_util, p.enc_util, p.dec_util, p.used_bytes) == (None, None, None, None, None)
    assert log.frames_list[1].gpus[0].processes[0].sm_util == 50.0  # the command column is never kept


def test_owner_labels_from_another_host_are_shown_as_data():
    row = {"user": "eve\x1b[2J", "job": "1\x07" + "9" * 500, "pod": "[bold]p", "namespace": "ns\u202e", "container": ""}
    text = _owner_name(row)
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text and len(text) < 260  # cut to 200, then escapes shown


def test_a_huge_environment_is_read_only_so_far(tmp_path):
    d = tmp_path / "77"
    (d / "fd").mkdir(parents=True)
    (d / "status").write_text("Uid:\t1000\t1000\t1000\t1000\nNSpid:\t77\n")
    (d / "cgroup").write_text("0::/\n")
    (d / "environ").write_bytes(b"X=" + b"a" * (8 * 2**20) + b"\0SLURM_JOB_ID=55\0")
    o = whose.whose(77, proc=str(tmp_path))
    assert o.visible and o.slurm_job is None  # past the bound: not read, so not believed
    (d / "environ").write_bytes(b"SLURM_JOB_ID=55\0X=" + b"a" * (8 * 2**20))
    assert whose.whose(77, proc=str(tmp_path)).slurm_job == "55"


def test_a_probe_cannot_make_traintop_copy_a_file_outside_its_captures_folder():
    """A capture record is the probe's word: its path must be a capture's name in that probe's own
    captures folder, or the record is dropped (traintop run as root attached to another user's job
    would otherwise copy /etc/shadow beside its recording)."""
    from traintop.collectors.probe_client import capture_record

    folder = "/run/user/1000/traintop/captures"
    good = {"kind": "trace", "path": f"{folder}/capture-42-20261202-101010.pt.trace.json", "steps": 3}
    assert capture_record(good, {}, 42, folder).path == good["path"]
    old_name = f"{folder}/capture-42-20261202-101010-trace.json"  # an older probe's name
    assert capture_record(dict(good, path=old_name), {}, 42, folder).path == old_name
    for path in ("/etc/shadow", f"{folder}/../../../etc/shadow", f"{folder}/capture-42-x-trace.json",
                 f"{folder}/sub/capture-42-20261202-101010-trace.json", f"{folder}/capture-42-20261202-101010-trace.json\x00",
                 "relative/capture-42-20261202-101010-trace.json", f"{folder}/capture-42-20261202-101010.pt.trace.json.x",
                 f"{folder}/capture-42-20261202-101010..pt.trace.json", 7, ["x"]):
        assert capture_record(dict(good, path=path), {}, 42, folder) is None, path
    assert capture_record(dict(good, kind="core"), {}, 42, folder) is None
    # numbers out of their ranges are unknown, never believed
    odd = capture_record(dict(good, bytes=-5, steps=10**9, step_s_before=float("inf"), step_s_after="1"), {}, 42, folder)
    assert (odd.size, odd.steps, odd.step_s_before, odd.step_s_after) == (None, None, None, None)
    assert capture_record(dict(good, error="boom\x1b[2J" + "x" * 1000), {}, 42, folder).error.startswith("boom\\x1b[2J")


def test_a_fifo_or_a_link_in_place_of_a_capture_is_refused_at_once(tmp_path):
    """Copying beside the recording never blocks on a FIFO nor follows a symlink; the monitor keeps
    the record with the reason."""
    from traintop.record.evidence import Keeper, NotKept
    from traintop.samples import Capture

    keeper = Keeper(str(tmp_path / "run.ttrec"))
    fifo = tmp_path / "capture-1-20261202-101010-trace.json"
    os.mkfifo(fifo)
    with pytest.raises(NotKept, match="not a plain file"):
        keeper.copy(Capture(t=0.0, pid=1, kind="trace", path=str(fifo)))
    link = tmp_path / "capture-2-20261202-101010-trace.json"
    link.symlink_to("/etc/passwd")
    with pytest.raises(OSError):
        keeper.copy(Capture(t=0.0, pid=1, kind="trace", path=str(link)))
    assert os.listdir(tmp_path / "run.ttrec.captures") == []


def test_a_forged_ledger_precision_or_flop_count_from_a_probe_is_not_believed():
    """The probe's time ledger, precision and FLOPs are another process's word: a bucket that is not
    one, seconds out of range or not numbers drop the message; an unknown precision or FLOP count is
    read as unknown, never shown."""
    import json

    from traintop.collectors.probe_client import parse_message

    base = {"v": 1, "pid": 42, "t": 1.8e9, "window": 0.33, "steps": 3, "input_wait": 0.0}
    assert parse_message(json.dumps(dict(base, ledger={"train": 0.3})).encode()) is not None
    for ledger in ({"rm -rf": 0.1}, {"train": -1}, {"train": 1e12}, {"train": "0.3"}, {"train": True},
                   ["train"], {f"b{k}": 0.0 for k in range(100)}):
        assert parse_message(json.dumps(dict(base, ledger=ledger)).encode()) is None, ledger
    msg = parse_message(json.dumps(dict(base, precision={"matmul": "[bold]fp64\x1b"}, flops={"flops": 1e30},
                                        pause_stack=7)).encode())
    assert msg is not None and msg["precision"] is None and msg["flops"] is None and msg["pause_stack"] is None
    # the process group's backend: a name traintop knows, or "other"; never the text itself
    from traintop.samples import DIST_BACKENDS, backend_index
    assert [backend_index(b) for b in ("gloo", "NCCL", "cpu:gloo,cuda:nccl", "[bold]x\x1b", 7, "", None)] == \
        [1, 0, 0, DIST_BACKENDS.index("other"), None, None, None]
