"""Another process's files, read by an agent that runs as root (issue 32): the service account's
namespace file in a pod's own root is the process's to lay out. A symlink out of that root, a
root-only file put there, a FIFO or a FUSE mount that never answers must neither leak a file into
/metrics nor hang the sampler. Each attack once on a fake /proc (the real code path: whose() takes
``proc=``) and, where it needs root, on a real process chrooted into the layout as nobody."""

import ctypes
import os
import subprocess
import sys
import threading

import pytest
from fakes import fake_proc
from waiting import until

from traintop.collectors import procread, whose

POD = "0d2a6b1e-5c7f-4e9a-9b3d-2f1e0c4d5a6b"
CID = "3f" * 32
SA = "var/run/secrets/kubernetes.io/serviceaccount"
K8S_ENV = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "trainer-0"}
SECRET = "topsecret"  # a root-only file's content, shaped like a namespace so nothing else would drop it
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the agent's view of another user's files")


def _pod(tmp_path, pid=20, uid=1000):
    """A pod's process on a fake /proc, and its service account folder in its own root."""
    d = fake_proc(tmp_path, pid, uid=uid, cgroup=f"4:memory:/kubepods/burstable/pod{POD}/{CID}\n", env=K8S_ENV)
    sa = d / "root" / SA
    sa.mkdir(parents=True)
    return sa


def _secret(tmp_path, mode=0o600):
    p = tmp_path / "outside" / "shadow"
    p.parent.mkdir(exist_ok=True)
    p.write_text(SECRET + "\n")
    os.chmod(p, mode)
    return p


def _namespace(tmp_path, pid=20, timeout=30.0):
    """whose()'s namespace for the fake process, on a thread: a hang fails the test instead of stopping it."""
    got = []
    t = threading.Thread(target=lambda: got.append(whose.whose(pid, proc=str(tmp_path))), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "whose() hung on the namespace file"
    return got[0].namespace


def test_the_kubelets_own_layout_is_read(tmp_path):
    """The kubelet writes the file behind two relative symlinks (``namespace -> ..data/namespace``,
    ``..data -> ..2026_...``): followed, inside the pod's root."""
    sa = _pod(tmp_path)
    (sa / "..2026_01_01_00_00_00.1").mkdir()
    (sa / "..2026_01_01_00_00_00.1" / "namespace").write_text("ml")
    os.symlink("..2026_01_01_00_00_00.1", sa / "..data")
    os.symlink("..data/namespace", sa / "namespace")
    assert _namespace(tmp_path) == "ml"


def test_a_symlink_out_of_the_pods_root_is_followed_inside_it(tmp_path):
    secret = _secret(tmp_path, 0o644)  # readable by anyone: only staying inside the root keeps it out
    os.symlink(str(secret), _pod(tmp_path) / "namespace")
    assert _namespace(tmp_path) is None
    # the same text inside the root names the pod's own file
    inside = tmp_path / "20" / "root" / str(secret).lstrip("/")
    inside.parent.mkdir(parents=True)
    inside.write_text("ml\n")
    assert _namespace(tmp_path) == "ml"


def test_dotdot_and_a_symlinked_folder_do_not_climb_out(tmp_path):
    secret = _secret(tmp_path, 0o644)
    sa = _pod(tmp_path)
    os.symlink("../" * 40 + str(secret).lstrip("/"), sa / "namespace")
    assert _namespace(tmp_path) is None
    os.unlink(sa / "namespace")
    # a component on the way is the symlink: var/run -> the outside folder holding a look-alike tree
    (secret.parent / SA).mkdir(parents=True)
    (secret.parent / SA / "namespace").symlink_to(secret)
    run = tmp_path / "20" / "root" / "var" / "run"
    os.rename(run, tmp_path / "old-run")
    os.symlink(str(secret.parent / "var" / "run"), run)
    assert _namespace(tmp_path) is None


@needs_root
def test_a_root_only_file_in_the_pods_root_is_not_read_for_it(tmp_path):
    """What a bind mount of /etc/shadow onto the namespace file looks like from here: a root-only
    file the process itself could not read. The agent reads no more than the process could."""
    sa = _pod(tmp_path, uid=1000)
    (sa / "namespace").write_text(SECRET)
    os.chmod(sa / "namespace", 0o600)
    assert _namespace(tmp_path) is None
    os.chmod(sa / "namespace", 0o644)
    assert _namespace(tmp_path) == SECRET  # a file it may read is its word, as before
    os.chown(sa / "namespace", 1000, 1000)
    os.chmod(sa / "namespace", 0o600)
    assert _namespace(tmp_path) == SECRET  # its own


def test_a_fifo_a_folder_a_loop_and_a_huge_file_are_no_namespace(tmp_path):
    sa = _pod(tmp_path)
    os.mkfifo(sa / "namespace")
    assert _namespace(tmp_path) is None  # never opened: an O_PATH look first
    os.unlink(sa / "namespace")
    (sa / "namespace").mkdir()
    assert _namespace(tmp_path) is None
    (sa / "namespace").rmdir()
    os.symlink("a", sa / "namespace")
    os.symlink("namespace", sa / "a")
    assert _namespace(tmp_path) is None
    os.unlink(sa / "namespace")
    with open(sa / "namespace", "wb") as f:
        f.write(b"ml")
        f.truncate(1 << 30)  # a sparse GiB: read 256 bytes of it, which are not a name
    assert _namespace(tmp_path) is None


def test_read_in_root_bounds(tmp_path):
    root = tmp_path / "r"
    (root / "a").mkdir(parents=True)
    (root / "a" / "f").write_text("x")
    creds = procread.Creds(0, frozenset())
    assert procread.read_in_root(str(root), "a/f", 10, creds) == b"x"
    assert procread.read_in_root(str(root), "/a/./f", 10, creds) == b"x"
    assert procread.read_in_root(str(root), "a/../../../a/f", 10, creds) == b"x"
    assert procread.read_in_root(str(root), "a/" * 3000 + "f", 10, creds) is None  # past PATH_MAX
    assert procread.read_in_root(str(root), "a", 10, creds) is None  # a folder
    assert procread.read_in_root(str(root), "", 10, creds) is None
    for k in range(procread.SYMLINKS_MAX + 1):  # a chain one longer than the kernel follows
        os.symlink(f"l{k + 1}" if k < procread.SYMLINKS_MAX else "a/f", root / f"l{k}")
    assert procread.read_in_root(str(root), f"l{procread.SYMLINKS_MAX}", 10, creds) == b"x"
    assert procread.read_in_root(str(root), "l0", 10, creds) is None


# -- real processes (root: CI runs as root) -----------------------------------------------------------

def _chrooted(root, env=K8S_ENV):
    """A real process of nobody whose root is ``root``, with a pod's environment."""
    code = ("import os, sys, time; os.chroot(sys.argv[1]); os.chdir('/'); os.setgid(65534); os.setuid(65534); "
            "print('ready', flush=True); time.sleep(120)")
    p = subprocess.Popen([sys.executable, "-c", code, str(root)], env=dict(os.environ, **env),
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def _real_namespace(pid, timeout=30.0):
    got = []
    t = threading.Thread(target=lambda: got.append(whose.whose(pid)), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "whose() hung on a real process's namespace file"
    return got[0]


@needs_root
def test_a_real_chrooted_process_of_nobody_cannot_make_root_read_a_file_for_it(tmp_path):
    secret = _secret(tmp_path, 0o600)
    root = tmp_path / "chroot"
    (root / SA).mkdir(parents=True)
    os.symlink(str(secret), root / SA / "namespace")
    p = _chrooted(root)
    try:
        o = _real_namespace(p.pid)
        assert o.visible and o.uid == 65534 and o.namespace is None
        os.unlink(root / SA / "namespace")
        os.mkfifo(root / SA / "namespace")
        assert _real_namespace(p.pid).namespace is None  # and it did not hang
        os.unlink(root / SA / "namespace")
        (root / SA / "namespace").write_text("ml")
        os.chmod(root / SA / "namespace", 0o644)
        assert _real_namespace(p.pid).namespace == "ml"
    finally:
        p.kill()
        p.wait()


def _fuse_that_never_answers(at):
    """A FUSE mount at ``at`` whose server never reads a request: every look inside it waits until
    the returned descriptor is closed. None where this machine cannot mount one."""
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open("/dev/fuse", os.O_RDWR)
    opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0".encode()
    if libc.mount(b"traintop-test", str(at).encode(), b"fuse", 0, opts) != 0:
        os.close(fd)
        return None
    return fd


@needs_root
def test_a_fuse_mount_that_never_answers_costs_one_deadline_and_no_hang(tmp_path, monkeypatch):
    sa = _pod(tmp_path)
    fd = _fuse_that_never_answers(sa.parent.parent)  # .../var/run/secrets
    if fd is None:
        pytest.skip("cannot mount FUSE here")
    try:
        assert _namespace(tmp_path, timeout=30) is None
        assert procread.stuck() == 1  # its reader waits on the server, apart from the sampler
        monkeypatch.setattr(procread, "MAX_STUCK", 1)  # as many hung roots as it takes to stop trying
        o = whose.whose(20, proc=str(tmp_path))  # the environment and cgroup are still read
        assert o.pod == "trainer-0" and o.pod_uid == POD and o.namespace is None
        assert procread.stuck() == 1  # no reader more was sent into the mount
    finally:
        os.close(fd)  # the server is gone: the waiting reader gets ENOTCONN and ends
        ctypes.CDLL(None).umount2(str(sa.parent.parent).encode(), 2)
    assert until(lambda: procread.stuck() == 0, 30)
