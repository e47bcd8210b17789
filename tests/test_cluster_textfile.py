"""`traintop agent --textfile DIR`: never written through a symlink, only into a directory that root or
the agent's user owns and nobody else can write (docs/SECURITY.md, "The agent")."""

import os
import stat
import subprocess
import sys

import pytest

from traintop.cluster.textfile import TextfileWriter, check_path
from traintop.errors import TraintopError

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
OTHER_UID = 65534  # nobody


def agent(directory, *extra):
    return subprocess.run([sys.executable, "-m", "traintop", "agent", "--simulate", "healthy", "--textfile",
                           str(directory), "--duration", "2.5", "--interval", "0.5", *extra],
                          capture_output=True, text=True, timeout=60)


def victim(tmp_path):
    """A root-only file elsewhere, the target of a planted link."""
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o700)
    f = secret / "shadow"
    f.write_text("root:do-not-touch\n")
    f.chmod(0o600)
    return f


def test_a_symlink_planted_at_the_files_name_is_replaced_not_written_through(tmp_path):
    target = victim(tmp_path)
    out = tmp_path / "textfile"
    out.mkdir(mode=0o755)
    (out / "traintop.prom").symlink_to(target)
    r = agent(out)
    assert r.returncode == 0, r.stderr
    assert target.read_text() == "root:do-not-touch\n" and stat.S_IMODE(target.stat().st_mode) == 0o600
    prom = out / "traintop.prom"
    assert not prom.is_symlink() and stat.S_IMODE(prom.stat().st_mode) == 0o644
    assert "traintop_gpu_power_watts" in prom.read_text()
    assert os.listdir(out) == ["traintop.prom"]  # no temporary file left


@root_only
def test_a_directory_of_another_user_is_refused_in_one_line_and_nothing_is_written(tmp_path):
    target = victim(tmp_path)
    out = tmp_path / "theirs"
    out.mkdir(mode=0o755)
    # what the owner of the directory could plant under the old, predictable temporary names
    for name in ("traintop.prom", f"traintop.prom.{os.getpid()}"):
        (out / name).symlink_to(target)
    os.chown(out, OTHER_UID, OTHER_UID)
    r = agent(out)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "owned by uid 65534" in r.stderr
    assert target.read_text() == "root:do-not-touch\n"


@pytest.mark.parametrize("mode", [0o775, 0o777, 0o1777])
def test_a_directory_others_can_write_is_refused_even_sticky(tmp_path, mode):
    out = tmp_path / "open"
    out.mkdir()
    out.chmod(mode)
    r = agent(out)
    assert r.returncode == 2 and "written by others" in r.stderr and "Traceback" not in r.stderr
    assert os.listdir(out) == []


def test_a_directory_under_an_open_parent_is_refused_and_a_sticky_one_accepted(tmp_path):
    parent = tmp_path / "open"
    (parent / "dir").mkdir(parents=True, mode=0o755)
    parent.chmod(0o777)
    assert "lies under" in check_path(str(parent / "dir"))
    parent.chmod(0o1777)  # as /tmp: others cannot rename or remove what is ours
    assert check_path(str(parent / "dir")) is None
    assert "not a directory" in check_path(__file__) and "cannot use it" in check_path(str(tmp_path / "none"))


def test_a_directory_made_writable_after_the_start_stops_the_writes(tmp_path):
    out = tmp_path / "out"
    out.mkdir(mode=0o755)
    w = TextfileWriter(str(out))
    try:
        w.write(b"a 1\n")
        assert (out / "traintop.prom").read_bytes() == b"a 1\n"
        out.chmod(0o777)
        with pytest.raises(TraintopError):
            w.write(b"a 2\n")
        assert (out / "traintop.prom").read_bytes() == b"a 1\n"
    finally:
        w.close()


def test_the_directory_swapped_for_a_symlink_after_the_start_is_not_followed(tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir(mode=0o755)
    elsewhere.mkdir(mode=0o755)
    w = TextfileWriter(str(out))
    try:
        out.rename(tmp_path / "moved")
        out.symlink_to(elsewhere)
        w.write(b"a 1\n")  # through the descriptor opened at the start
        assert os.listdir(elsewhere) == [] and (tmp_path / "moved" / "traintop.prom").read_bytes() == b"a 1\n"
    finally:
        w.close()
