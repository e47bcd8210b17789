"""This stop's new inputs, attacked as whoever can write them: a pmon log someone hands over,
owner labels another host sends through Prometheus, /proc files another local user's process
fills (its environment). Bounded, one line, nothing forged, nothing shown as control codes."""

import pytest

from traintop import importers
from traintop.cluster.report import _owner_name
from traintop.collectors import whose
from traintop.errors import TraintopError

HEAD = "#Date Time gpu pid type sm mem enc dec fb command\n"


def _pmon(tmp_path, body: str):
    p = tmp_path / "pmon.txt"
    p.write_text(HEAD + body)
    return str(p)


def test_a_pmon_log_past_its_row_limit_is_refused_in_one_line(tmp_path, monkeypatch):
    import traintop.import_pmon as P

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
