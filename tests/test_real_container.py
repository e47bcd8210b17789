"""Whose a process is, with a real container: Debian's podman starts it, and traintop's own lookup
(collectors/whose.py, through the dashboard's OwnerCache and the snapshot's owners) names it.

The container's root file system is the host's own, read through an overlay (``--rootfs /:O``):
no image is pulled. Its podman store lives in a temporary directory, so the system's store is
never touched, and every container is removed (``podman rm -f``) whatever happens.

Two things of podman 4.3 on a machine whose root lacks CAP_SYS_RESOURCE (a VM's sandbox, a
container): podman asks for RLIMIT_NOFILE 1048576 in the container by default, above the hard
limit, which the runtime may then not set ("setrlimit `RLIMIT_NOFILE`: Operation not
permitted"); podman itself lowers its own RLIMIT_NPROC to 32768, and a container's may not be
higher. So the limits are given: open files at this process's hard limit, processes at most
32768. And crun (podman's default runtime) refuses a cgroup v1 host whose cgroup2 hierarchy holds
a controller ("cgroups in hybrid mode not supported"): runc, where installed, is tried next.
"""

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import uuid
from types import SimpleNamespace

import pytest

import traintop
from traintop.collectors import whose
from traintop.collectors.owner_cache import OwnerCache
from traintop.reports.export_commands import _owners
from traintop.samples import GpuProcess, GpuSample
from traintop.widgets.owner_text import NOT_VISIBLE, owner_text

TIMEOUT_S = 60  # each podman command


def _limits() -> list[str]:
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = 1048576 if nofile == resource.RLIM_INFINITY else min(nofile, 1048576)
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nproc = 32768 if nproc == resource.RLIM_INFINITY else min(nproc, 32768)
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


class Podman:
    """podman with a store of its own and the runtime that can start a container here."""

    def __init__(self, store: str, runtime: str | None) -> None:
        self.base = ["podman", "--root", f"{store}/root", "--runroot", f"{store}/run", "--tmpdir", f"{store}/tmp"]
        self.runtime = runtime or "podman's default"
        if runtime:
            self.base += ["--runtime", runtime]
        # options of `podman run` for every container here. `--rootfs` is a switch: the first word
        # after the options is the root, and every word after it, options too, is the command
        self.run_opts = ["--network", "none", "--pid", "private", *_limits()]

    def __call__(self, *args: str, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
        return subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=timeout)

    def run(self, *args: str, rootfs_and_command: list[str], timeout: float = TIMEOUT_S):
        return self("run", *self.run_opts, *args, "--rootfs", "/:O", *rootfs_and_command, timeout=timeout)

    def remove(self, name: str) -> None:
        try:
            self("rm", "--force", "--time", "0", name)
        except subprocess.TimeoutExpired:
            pass


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(nothing said)"


def _mounts_under(store: str) -> list[str]:
    try:
        with open("/proc/self/mounts") as fh:
            points = [line.split()[1] for line in fh]
    except OSError:
        return []
    return [m for m in points if m == store or m.startswith(store + "/")]


def _clear(store: str) -> None:
    """Remove what podman left in ``store``: its containers, its mounts (the overlay driver keeps
    its home mounted on itself), then the folder, unless something there is still mounted."""
    try:
        Podman(store, None)("rm", "--all", "--force", "--time", "0")
    except (OSError, subprocess.TimeoutExpired):
        pass
    for point in sorted(_mounts_under(store), key=len, reverse=True):
        try:
            subprocess.run(["umount", point], capture_output=True, timeout=TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            pass
    if not _mounts_under(store):
        shutil.rmtree(store, ignore_errors=True)


@pytest.fixture(scope="session")
def podman():
    """A Podman that has started a container here (probed once a session), else a skip."""
    if os.geteuid() != 0:
        pytest.skip("needs root: podman's rootless mode needs subordinate ids and is not what is tested here")
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (Debian: apt-get install podman runc)")
    if whose.in_nested_pid_namespace():
        pytest.skip("this test runs in a nested PID namespace itself; it checks what the host sees")
    store = tempfile.mkdtemp(prefix="tt-podman-")  # short: podman's socket paths are under it
    found, tried = None, []
    try:
        for runtime in [None] + (["runc"] if shutil.which("runc") else []):
            p = Podman(store, runtime)
            try:
                got = p.run("--rm", rootfs_and_command=["true"])
            except (OSError, subprocess.TimeoutExpired) as e:
                tried.append(f"{p.runtime}: {e}")
                continue
            if got.returncode == 0:
                found = p
                break
            tried.append(f"{p.runtime}: {_last_line(got.stderr)}")
        if found is None:
            pytest.skip("podman cannot start a container here: " + "; ".join(tried))
        yield found
    finally:
        _clear(store)


def _started(podman: Podman, name: str, *command: str) -> tuple[str, int]:
    """Start ``command`` in a container named ``name``: (its id, its host PID)."""
    got = podman.run("--detach", "--name", name, rootfs_and_command=list(command))
    assert got.returncode == 0, got.stderr[-1000:]
    got = podman("inspect", "--format", "{{.Id}} {{.State.Pid}} {{.Name}}", name)
    assert got.returncode == 0, got.stderr[-1000:]
    cid, pid, said_name = got.stdout.split()
    assert said_name == name
    return cid, int(pid)


def test_a_process_in_a_real_container_seen_from_the_host(podman):
    name = f"traintop-test-{uuid.uuid4().hex[:12]}"
    try:
        cid, pid = _started(podman, name, "sleep", "60")
        assert len(cid) == 64 and pid > 1
        o = whose.whose(pid, gpu_process=True)
        assert o.visible, o
        assert (o.runtime, o.container) == ("podman", cid), o
        assert o.ns_pids == (pid, 1) and o.inner_pid == 1  # the container's first process
        assert (o.uid, o.user) == (0, "root") and o.job is None
        # the dashboard's path: NVML's PID, the owner cache, and the words on the screen
        gpus = OwnerCache().attach((GpuSample(0, processes=(GpuProcess(pid, 2**30),)),))
        shown = gpus[0].processes[0].owner
        assert shown == o
        assert owner_text(shown) == f"root · podman {cid[:12]}"
        # the snapshot's path (`traintop snapshot --json`)
        said = _owners(SimpleNamespace(gpus=gpus))[pid]
        assert (said["visible"], said["inner_pid"], said["runtime"], said["container"]) == (True, 1, "podman", cid)
    finally:
        podman.remove(name)
    assert podman("container", "exists", name).returncode == 1  # removed


def _python_dirs() -> list[str]:
    """The folders this python and traintop are read from: the package, collectors/ as installed,
    the environment and its interpreter (bind-mounted, so none is missed where it is on another
    file system than /, which the overlay holds alone)."""
    pkg = os.path.dirname(os.path.abspath(traintop.__file__))
    dirs = {os.path.dirname(pkg), os.path.dirname(os.path.dirname(os.path.abspath(whose.__file__)))}
    dirs |= {os.path.realpath(d) for d in (sys.prefix, sys.base_prefix)} - {"/", "/usr"}
    return sorted(dirs)


def test_traintop_in_a_real_container_does_not_claim_a_host_pid(podman):
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    name = f"traintop-test-{uuid.uuid4().hex[:12]}"
    code = (
        "import json, os; from traintop.collectors import whose; "
        "from traintop.collectors.owner_cache import OwnerCache; "
        "from traintop.samples import GpuProcess, GpuSample; "
        "from traintop.widgets.owner_text import owner_text; "
        f"g = OwnerCache().attach((GpuSample(0, processes=(GpuProcess({host.pid}, 2**30),)),))[0]; "
        "o = g.processes[0].owner; one = whose.whose(1, gpu_process=True); "
        "print(json.dumps({'file': whose.__file__, 'me': os.getpid(), 'nested': whose.in_nested_pid_namespace(), "
        "'host_visible': o.visible, 'host_text': owner_text(o), 'one_visible': one.visible}))"
    )
    mounts = [a for d in _python_dirs() for a in ("--volume", f"{d}:{d}:ro")]
    where = os.path.dirname(os.path.dirname(os.path.abspath(traintop.__file__)))
    try:
        got = podman.run("--rm", "--name", name, *mounts, "--workdir", where,
                         "--env", f"PYTHONPATH={where}", "--env", "PYTHONDONTWRITEBYTECODE=1",
                         rootfs_and_command=[sys.executable, "-c", code])
        assert got.returncode == 0, got.stderr[-1000:]
        said = json.loads(got.stdout.strip().splitlines()[-1])
        assert said["file"] == whose.__file__  # the same traintop ran inside, from the bind mount
        # inside, the python is the container's first process, in a PID namespace below the host's:
        # the host's PID names nothing there (or another process), and PID 1 holds no GPU
        assert (said["me"], said["nested"]) == (1, True)
        assert said["host_visible"] is False and said["host_text"] == NOT_VISIBLE
        assert said["one_visible"] is False
    finally:
        podman.remove(name)
        host.kill()
        host.wait()
