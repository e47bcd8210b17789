"""Whose a process is: cgroup layouts, the environment, and real PID namespaces."""

import os
import pathlib
import subprocess
import sys
import uuid

import pytest
from fakes import fake_proc
from waiting import until

from traintop.collectors import whose
from traintop.collectors.whose import Owner, parse_cgroup

CID = "3f" * 32
POD = "0d2a6b1e-5c7f-4e9a-9b3d-2f1e0c4d5a6b"


@pytest.mark.parametrize("text, runtime, container, pod_uid, job, step", [
    (f"12:memory:/docker/{CID}\n0::/\n", "docker", CID, None, None, None),
    (f"0::/system.slice/docker-{CID}.scope\n", "docker", CID, None, None, None),
    (f"4:memory:/kubepods/burstable/pod{POD}/{CID}\n", "kubernetes", CID, POD, None, None),
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice/"
     f"cri-containerd-{CID}.scope\n", "containerd", CID, POD, None, None),
    (f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/crio-{CID}.scope\n", "cri-o", CID, POD, None, None),
    (f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope/container\n",
     "podman", CID, None, None, None),
    # podman as root with cgroupfs on cgroup v1 (copied from a real container: tests/test_real_container.py),
    # with the systemd manager, and its conmon, which is in no container's cgroup
    ("".join(f"{n}:{c}:/libpod_parent/libpod-{CID}\n" for n, c in enumerate(
        ["cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "name=systemd"], 1))
     + f"0::/libpod_parent/libpod-{CID}\n", "podman", CID, None, None, None),
    (f"1:name=systemd:/machine.slice/libpod-{CID}.scope\n4:memory:/machine.slice/libpod-{CID}.scope\n",
     "podman", CID, None, None, None),
    ("9:name=systemd:/\n8:pids:/libpod_parent/conmon\n4:memory:/libpod_parent/conmon\n0::/\n",
     None, None, None, None, None),
    ("8:pids:/slurm/uid_1000/job_4242/step_0\n", None, None, None, "4242", "0"),
    ("0::/system.slice/slurmstepd.scope/job_4242/step_batch/user/task_0\n", None, None, None, "4242", "batch"),
    # Slurm built for several slurmd per host names its top cgroup after the node
    ("0::/system.slice/node-1_slurmstepd.scope/job_77/step_extern/user/task_0\n", None, None, None, "77", "extern"),
    ("4:memory:/slurm_node1/uid_1000/job_4242/step_batch/task_0\n", None, None, None, "4242", "batch"),
    # a cgroup the user made inside their own step is still that job
    ("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0/job_9999\n", None, None, None, "4242", "0"),
    # Slurm's names anywhere but from the hierarchy's root: a user's delegated subtree, another cgroup namespace
    ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/job_4242\n", None, None, None, None, None),
    ("8:pids:/user.slice/user-1000.slice/slurm/uid_1000/job_4242/step_0\n", None, None, None, None, None),
    ("0::/../../system.slice/slurmstepd.scope/job_4242/step_0\n", None, None, None, None, None),
    (f"0::/user.slice/user-1000.slice/user@1000.service/kubepods/burstable/pod{POD}/{CID}\n",
     None, None, None, None, None),
    ("0::/\n", None, None, None, None, None),
    # damage and forgeries: ids without their kind's shape are not ids
    ("0::/docker/not-a-container-id\n", None, None, None, None, None),
    (f"0::/kubepods/pod{POD}\x1b[2J/{CID[:-1]}\n", None, None, None, None, None),
    ("0::/slurm/job_12345678901234567890\n", None, None, None, None, None),
    ("garbage without colons\n" * 100, None, None, None, None, None),
])
def test_cgroup_layouts(text, runtime, container, pod_uid, job, step):
    got = parse_cgroup(text)
    assert (got.runtime, got.container, got.pod_uid, got.slurm_job, got.slurm_step) == \
        (runtime, container, pod_uid, job, step)


def test_slurm_from_the_cgroup_beats_the_environment(tmp_path):
    fake_proc(tmp_path, 10, cgroup="8:pids:/slurm/uid_1000/job_4242/step_3\n",
               env={"SLURM_JOB_ID": "9999", "SLURM_ARRAY_JOB_ID": "4240", "SLURM_ARRAY_TASK_ID": "2"})
    o = whose.whose(10, proc=str(tmp_path), cgroupfs=str(tmp_path / "not-mounted"))
    # the array's name is the environment's word: the job the host vouches for is Slurm's own id
    assert (o.slurm_job, o.slurm_step, o.job_from, o.job) == ("4242", "3", "cgroup", "4242")


def test_the_environment_alone_is_the_processs_word_and_checked(tmp_path):
    fake_proc(tmp_path, 11, env={"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "TORCHELASTIC_RUN_ID": "run-1"})
    o = whose.whose(11, proc=str(tmp_path))
    assert (o.slurm_job, o.slurm_step, o.run_id, o.job_from) == ("77", "0", "run-1", "environment")
    fake_proc(tmp_path, 12, env={"SLURM_JOB_ID": "77; rm -rf /", "TORCHELASTIC_RUN_ID": "\x1b]52;c;AAAA\x07",
                                  "KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "Pod[bold]",
                                  "POD_NAMESPACE": "x" * 300})
    o = whose.whose(12, proc=str(tmp_path))
    assert (o.slurm_job, o.run_id, o.pod, o.namespace, o.job, o.job_from) == (None,) * 6


def test_a_kubernetes_pod(tmp_path):
    fake_proc(tmp_path, 13, cgroup=f"4:memory:/kubepods/burstable/pod{POD}/{CID}\n",
               env={"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "trainer-0", "POD_NAMESPACE": "ml"})
    o = whose.whose(13, proc=str(tmp_path))
    assert (o.runtime, o.container, o.pod_uid, o.pod, o.namespace, o.job) == \
        ("kubernetes", CID, POD, "trainer-0", "ml", "ml/trainer-0")


def test_inside_a_pid_namespace_a_gpu_pid_held_by_another_process_is_not_visible(tmp_path):
    fake_proc(tmp_path, 14, fds=("/dev/null", "pipe:[1]"))
    fake_proc(tmp_path, 15, fds=("/dev/nvidiactl", "/dev/nvidia0"))
    assert not whose.whose(14, gpu_process=True, proc=str(tmp_path), nested=True).visible
    assert whose.whose(15, gpu_process=True, proc=str(tmp_path), nested=True).visible
    assert whose.whose(14, gpu_process=True, proc=str(tmp_path), nested=False).visible  # on the host: it is
    assert whose.whose(16, proc=str(tmp_path)) == Owner(16, visible=False)


def test_this_process_has_a_user():
    o = whose.whose(os.getpid())
    assert o.visible and o.uid == os.getuid() and o.user


# -- real namespaces and cgroups (root: CI runs as root) ------------------------------------------

def _can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], timeout=20,
                              capture_output=True).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_unshare = pytest.mark.skipif(os.geteuid() != 0 or not _can_unshare(),
                                   reason="needs root and unshare(1) for a real PID namespace")


def _children(pid: int) -> list[int]:
    try:
        text = pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


@needs_unshare
def test_a_job_in_a_pid_namespace_seen_from_the_host():
    p = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
                          "import time; time.sleep(60)"])
    try:
        inner = until(lambda: _children(p.pid))
        assert inner, "the namespaced process did not start"
        o = whose.whose(inner[0])
        assert o.visible and o.ns_pids == (inner[0], 1) and o.inner_pid == 1
    finally:
        p.kill()
        p.wait()
        for c in _children(p.pid):
            os.kill(c, 9)


@needs_unshare
def test_traintop_in_a_pid_namespace_does_not_claim_a_host_pid():
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        code = ("import json, sys; from traintop.collectors import whose; "
                f"o = whose.whose({host.pid}, gpu_process=True); one = whose.whose(1, gpu_process=True); "
                "print(json.dumps([whose.in_nested_pid_namespace(), o.visible, one.visible]))")
        out = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr[-500:]
        nested, host_visible, one_visible = __import__("json").loads(out.stdout)
        # inside, this host PID names nothing (or another process), and PID 1 is the python itself,
        # which holds no GPU: neither is the process NVML would have meant
        assert nested is True and host_visible is False and one_visible is False
    finally:
        host.kill()
        host.wait()


def _cgroup_dir(*parts: str) -> pathlib.Path | None:
    base = pathlib.Path("/sys/fs/cgroup/pids")
    if not base.is_dir():
        base = pathlib.Path("/sys/fs/cgroup")
    d = base.joinpath(*parts)
    try:
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup.procs").stat()
    except OSError:
        return None
    return d


def _remove(d: pathlib.Path, levels: int) -> None:
    for _ in range(levels):
        try:
            d.rmdir()
        except OSError:
            return
        d = d.parent


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make cgroups")
@pytest.mark.parametrize("layout, check", [
    (lambda tag: ("slurm_" + tag, f"uid_{os.getuid()}", "job_31337", "step_0"),
     lambda o: (o.slurm_job, o.slurm_step, o.job_from) == ("31337", "0", "cgroup")),
    (lambda tag: ("kubepods", "burstable-" + tag, f"pod{POD}", CID),
     lambda o: (o.runtime, o.container, o.pod_uid) == ("kubernetes", CID, POD)),
])
def test_a_real_cgroup_layout(layout, check):
    tag = uuid.uuid4().hex[:8]
    parts = layout(tag)
    d = _cgroup_dir(*parts)
    if d is None:
        pytest.skip("this kernel does not let us make cgroups here")
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        try:
            (d / "cgroup.procs").write_text(str(p.pid))
        except OSError as e:
            pytest.skip(f"cannot move a process into a cgroup here: {e}")
        o = whose.whose(p.pid)
        assert check(o), o
    finally:
        p.kill()
        p.wait()
        _remove(d, len(parts))


# -- a Slurm job is what slurmd made: root's, of Slurm's shape, named for the process's uid -----------

def _cgroupfs(tmp_path, hierarchy, path, owner=0):
    """A cgroup hierarchy mounted at tmp/cgroup/<hierarchy> holding ``path`` (each folder root's, the
    last one ``owner``'s)."""
    base = tmp_path / "cgroup" / hierarchy
    d = base / path.strip("/")
    d.mkdir(parents=True)
    (base / "cgroup.procs").write_text("")
    if owner:
        os.chown(d, owner, owner)
    return str(tmp_path / "cgroup")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make folders of another owner")
@pytest.mark.parametrize("line, hierarchy, job_dir, uid, owner, vouched", [
    ("8:pids:/slurm/uid_1000/job_4242/step_0/task_0", "pids", "/slurm/uid_1000/job_4242", 1000, 0, True),
    ("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0", "", "/system.slice/slurmstepd.scope/job_4242",
     1001, 0, True),
    # a job folder the user owns: not slurmd's (slurmd makes uid_U and job_N root's; a step may be the user's)
    ("8:pids:/slurm/uid_1000/job_4242/step_0", "pids", "/slurm/uid_1000/job_4242", 1000, 1000, False),
    ("0::/system.slice/slurmstepd.scope/job_4242", "", "/system.slice/slurmstepd.scope/job_4242", 1001, 1001, False),
    # cgroup v1 names the job's owner: another uid's process in it is no rank of that job here
    ("8:pids:/slurm/uid_1000/job_4242/step_0", "pids", "/slurm/uid_1000/job_4242", 1001, 0, False),
    # shown by this host's /proc, yet not in its hierarchy: nothing to vouch for
    ("8:pids:/slurm/uid_1000/job_4242/step_0", "pids", "/slurm/uid_1000/job_4343", 1000, 0, False),
])
def test_a_slurm_job_counts_only_where_slurmd_made_it(tmp_path, line, hierarchy, job_dir, uid, owner, vouched):
    fs = _cgroupfs(tmp_path, hierarchy, job_dir, owner)
    fake_proc(tmp_path, 30, uid=uid, cgroup=line + "\n", env={"SLURM_JOB_ID": "4242"})
    o = whose.whose(30, proc=str(tmp_path), cgroupfs=fs)
    assert o.slurm_job == "4242" and o.job_from == ("cgroup" if vouched else "environment")
    assert (whose.slurm_job_of(30, uid, proc=str(tmp_path), cgroupfs=fs) == "4242") is vouched
    assert whose.slurm_job_of(30, uid + 1, proc=str(tmp_path), cgroupfs=fs) is None  # the PID is another user's now


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to delegate a cgroup subtree to nobody")
def test_a_cgroup_a_user_names_job_4242_in_their_own_subtree_is_no_job():
    """What systemd does for every user session (a delegated subtree under user@UID.service), made
    here by hand: nobody creates job_4242 in it and moves its own process there."""
    tag = uuid.uuid4().hex[:8]
    parts = ("user.slice", "user-65534.slice", f"user@65534-{tag}.service")
    deleg = _cgroup_dir(*parts)
    if deleg is None:
        pytest.skip("this kernel does not let us make cgroups here")
    os.chown(deleg, 65534, 65534)
    job = deleg / "job_4242"
    p = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c",
                          f"mkdir {job} && echo $$ > {job}/cgroup.procs && echo ready && exec sleep 60"],
                         stdout=subprocess.PIPE, text=True, env=dict(os.environ, SLURM_JOB_ID="4242"))
    try:
        if p.stdout.readline().strip() != "ready":
            pytest.skip("nobody cannot make a cgroup of its own here")
        assert f"{'/'.join(parts)}/job_4242" in pathlib.Path(f"/proc/{p.pid}/cgroup").read_text()
        o = whose.whose(p.pid)
        assert o.uid == 65534 and o.slurm_job == "4242" and o.job_from == "environment"  # its word, marked so
        assert whose.slurm_job_of(p.pid, 65534) is None
    finally:
        p.kill()
        p.wait()
        _remove(job, 1 + len(parts))
