"""Whose a process is: its user, its container, its Kubernetes pod, its Slurm job, its torchrun run.

Read from ``/proc/PID`` (status, cgroup, environ), bounded, and checked: an id that does not
have its kind's shape is dropped, never shown. Who wrote what decides what it is worth:

- the kernel writes the uid and the cgroup path; a path is root's where root alone can make
  it. A Slurm job counts only where the path has Slurm's own shape from the hierarchy's root
  (``/system.slice/slurmstepd.scope/job_N/...`` on cgroup v2, ``/slurm/uid_U/job_N/...`` on v1,
  U the process's uid) and the job's directory, where this host shows it, is root's: a user can
  name a cgroup of their own ``job_4242`` under the subtree systemd delegates to them
  (``/user.slice/user-1000.slice/user@1000.service/...``), and that is no job. A pod's uid counts
  only under ``/kubepods``. These are ``job_from = "cgroup"``: what the host vouches for.
- the environment, and the files in the process's own root (the service account's namespace),
  are the process owner's word: used only where the cgroup says nothing, and marked as such
  (``job_from = "environment"``); the agent exports them under ``claimed_*`` labels. Its root
  is read through collectors/procread.py: never out of that root, never blocking, only what
  the process could read itself.

PIDs across namespaces: NVML reports PIDs as the host sees them. Seen from the host, a
containerised process's ``NSpid`` line gives its PID inside the container too. Seen from
inside a PID namespace, a host PID either does not exist here or names another process: such
a GPU process is reported as not visible from here (``visible=False``), never attributed to
whichever local process happens to carry that number.
"""

from __future__ import annotations

import os
import pwd
import re
import stat
from dataclasses import dataclass

from traintop.collectors.procread import Creds, bounded, read_file, read_in_root
from traintop.samples import Owner  # the record this module fills in (also imported from here)

PROC = "/proc"
CGROUPFS = "/sys/fs/cgroup"
READ_MAX = 256 * 1024  # a /proc file read at most this far (environ can be megabytes)
FD_MAX = 4096  # descriptors looked at to tell whether a process holds a GPU device open
NAMESPACE_FILE = "var/run/secrets/kubernetes.io/serviceaccount/namespace"  # in the pod's own root

_HEX64 = r"[0-9a-f]{64}"
# (runtime, pattern on one cgroup path): systemd scope names first, then cgroupfs paths
_CONTAINER = [
    ("containerd", re.compile(rf"cri-containerd-({_HEX64})\.scope")),
    ("cri-o", re.compile(rf"crio-(?:conmon-)?({_HEX64})\.scope")),
    ("docker", re.compile(rf"docker-({_HEX64})\.scope")),
    ("podman", re.compile(rf"libpod-(?:conmon-)?({_HEX64})(?:\.scope|/|$)")),
    ("docker", re.compile(rf"/docker/({_HEX64})(?:/|$)")),
    ("kubernetes", re.compile(rf"^/kubepods[^\n]*/pod[0-9a-f_-]{{36}}(?:\.slice)?/({_HEX64})(?:/|$)")),
]
_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice|/|$)")
_KUBEPODS = ("/kubepods/", "/kubepods.slice/")  # the kubelet's own hierarchy, from the root
_NODE = r"[A-Za-z0-9._-]{1,64}"  # a node name, where slurmd was built for several per host
_STEP_NAME = r"\d{1,9}|batch|extern|interactive"
# Slurm's own job cgroups, from the hierarchy's root: (the job's directory, its id[, uid]), the rest
_SLURM_V2 = re.compile(rf"(/system\.slice/(?:{_NODE}_)?slurmstepd\.scope/job_(\d{{1,12}}))(/.*)?")
_SLURM_V1 = re.compile(rf"(/slurm(?:_{_NODE})?/uid_(\d{{1,10}})/job_(\d{{1,12}}))(/.*)?")
_SLURM_STEP = re.compile(rf"/step_({_STEP_NAME})(?:/|$)")
_DIGITS = re.compile(r"\d{1,12}")
_STEP = re.compile(_STEP_NAME)
_DNS = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")  # Kubernetes names (RFC 1123)
_RUN_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
ENV_KEYS = ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID",
            "TORCHELASTIC_RUN_ID", "POD_NAME", "POD_NAMESPACE", "KUBERNETES_SERVICE_HOST", "HOSTNAME")


@dataclass(frozen=True, slots=True)
class CgroupFacts:
    runtime: str | None = None
    container: str | None = None
    pod_uid: str | None = None
    slurm_job: str | None = None  # of Slurm's shape; ``vouched_job`` says whether it counts
    slurm_step: str | None = None
    slurm_uid: int | None = None  # cgroup v1's uid_U: the job's owner, as slurmd named it
    slurm_at: tuple[str, str] | None = None  # (the hierarchy's controllers, the job's directory)


def parse_cgroup(text: str) -> CgroupFacts:
    """What the cgroup paths of ``/proc/PID/cgroup`` (v1 or v2) say about a process."""
    lines = []
    for line in text.splitlines()[:64]:
        parts = line.split(":", 2)
        if len(parts) == 3:
            lines.append((parts[1][:256], parts[2][:4096]))
    runtime = container = pod_uid = job = step = slurm_uid = at = None
    for controllers, path in lines:
        if container is None:
            for name, pattern in _CONTAINER:
                m = pattern.search(path)
                if m:
                    runtime, container = name, m.group(1)
                    break
        if pod_uid is None and path.startswith(_KUBEPODS):
            m = _POD_UID.search(path)
            if m:
                pod_uid = m.group(1).replace("_", "-")
        if job is None:
            if m := _SLURM_V2.fullmatch(path):
                (where, job), rest = m.group(1, 2), m.group(3)
            elif m := _SLURM_V1.fullmatch(path):
                where, slurm_uid, job, rest = m.group(1), int(m.group(2)), m.group(3), m.group(4)
            else:
                continue
            at = (controllers, where)
            s = _SLURM_STEP.match(rest or "")
            step = s.group(1) if s else None
    if pod_uid is not None and runtime in ("containerd", "cri-o", "docker"):
        runtime = "kubernetes" if runtime == "docker" else runtime
    return CgroupFacts(runtime, container, pod_uid, job, step, slurm_uid, at)


def _root_owned(cgroupfs: str, controllers: str, where: str) -> bool:
    """Whether the job's cgroup directory and each one above it are root's, where its hierarchy is
    mounted here (slurmd makes them so; a step's may be the user's). A hierarchy not mounted here
    cannot be looked at: the path's shape stands alone."""
    if controllers:  # cgroup v1: each hierarchy at its controllers' name ("cpu,cpuacct", "name=systemd")
        bases = [os.path.join(cgroupfs, ",".join(c.removeprefix("name=") for c in controllers.split(",")))]
    else:
        bases = [cgroupfs, os.path.join(cgroupfs, "unified")]
    for base in bases:
        if not os.path.isfile(os.path.join(base, "cgroup.procs")):
            continue
        d = base
        for part in where.strip("/").split("/"):
            d = os.path.join(d, part)
            try:
                st = os.lstat(d)
            except OSError:
                return False  # gone, or not this host's: nothing to vouch for
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
                return False
        return True
    return True


def vouched_job(cg: CgroupFacts, uid: int | None, cgroupfs: str = CGROUPFS) -> str | None:
    """The Slurm job the host vouches ``uid``'s process is in: of Slurm's shape, root's, and on
    cgroup v1 named for that very uid. None: none (or only a look-alike the user made)."""
    if cg.slurm_job is None or cg.slurm_at is None or uid is None:
        return None
    if cg.slurm_uid is not None and cg.slurm_uid != uid:
        return None
    return cg.slurm_job if _root_owned(cgroupfs, *cg.slurm_at) else None


def environment(pid: int, proc: str = PROC) -> dict[str, str]:
    """The few variables that name a job, from ``/proc/PID/environ`` (readable by its owner and
    root only; {} where not). Bounded in time: reading it takes the process's memory map."""
    raw = bounded("environ", read_file, f"{proc}/{pid}/environ", READ_MAX)
    if not raw:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key.decode("ascii", "replace") in ENV_KEYS:
            out[key.decode()] = value[:256].decode("utf-8", "replace")
    return out


def _ids(line: str) -> list[int]:
    return [int(x) for x in line.split()[1:] if x.isdigit()]


def _status(pid: int, proc: str) -> tuple[int | None, tuple[int, ...], Creds | None]:
    """(real uid, NSpid, what it reads files as) from ``/proc/PID/status``."""
    raw = read_file(f"{proc}/{pid}/status", 16384)
    uid, ns, fsuid, gids = None, (), None, set()
    for line in (raw or b"").decode("ascii", "replace").splitlines():
        if line.startswith("Uid:"):
            ids = _ids(line)
            uid = ids[0] if ids else None
            fsuid = ids[3] if len(ids) > 3 else None
        elif line.startswith("Gid:"):
            gids.update(_ids(line)[3:4])
        elif line.startswith("Groups:"):
            gids.update(_ids(line)[:1024])
        elif line.startswith("NSpid:"):
            ns = tuple(_ids(line)[:8])
    return uid, ns, Creds(fsuid, frozenset(gids)) if fsuid is not None else None


def _user(uid: int | None) -> str | None:
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


def _namespace(pid: int, proc: str, creds: Creds | None) -> str | None:
    """The pod's namespace from its service account's file, in its own root (its word too)."""
    if creds is None:
        return None
    raw = bounded("root", read_in_root, f"{proc}/{pid}/root", NAMESPACE_FILE, 256, creds)
    return (raw or b"").decode("ascii", "replace").strip() or None


def holds_gpu(pid: int, proc: str = PROC) -> bool | None:
    """Whether the process has an NVIDIA device open (None: its descriptors cannot be read here)."""
    try:
        with os.scandir(f"{proc}/{pid}/fd") as it:
            for k, entry in enumerate(it):
                if k >= FD_MAX:
                    return None
                try:
                    if os.readlink(entry.path).startswith("/dev/nvidia"):
                        return True
                except OSError:
                    continue
    except OSError:
        return None
    return False


INIT_PID_NS = "pid:[4026531836]"  # the kernel's fixed inode for the first PID namespace (PROC_PID_INIT_INO)


def in_nested_pid_namespace() -> bool:
    """Whether this process runs in a PID namespace below the host's (a container, ``unshare``).
    Its own NSpid cannot tell: /proc shows the PIDs of the namespace it was mounted in."""
    try:
        return os.readlink("/proc/self/ns/pid") != INIT_PID_NS
    except OSError:
        return False


def whose(pid: int, gpu_process: bool = False, proc: str = PROC, nested: bool | None = None,
          cgroupfs: str = CGROUPFS) -> Owner:
    """``pid``'s owner and job. ``gpu_process``: NVML reported it, so it holds a GPU; inside a
    nested PID namespace (``nested``; found out when None) a process here that holds no GPU is
    another process than the one NVML meant."""
    uid, ns, creds = _status(pid, proc)
    if uid is None and not ns:
        return Owner(pid, visible=False)
    if gpu_process:
        if nested is None:
            nested = in_nested_pid_namespace()
        if nested and holds_gpu(pid, proc) is False:
            return Owner(pid, visible=False)
    cg = parse_cgroup((read_file(f"{proc}/{pid}/cgroup", 65536) or b"").decode("utf-8", "replace"))
    env = environment(pid, proc)
    job = vouched_job(cg, uid, cgroupfs)
    step, job_from = (cg.slurm_step, "cgroup") if job else (None, None)
    if job is None and _DIGITS.fullmatch(env.get("SLURM_JOB_ID", "")):
        job, job_from = env["SLURM_JOB_ID"], "environment"
        step = env.get("SLURM_STEP_ID") if _STEP.fullmatch(env.get("SLURM_STEP_ID", "")) else None
        array, task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
        if _DIGITS.fullmatch(array) and _DIGITS.fullmatch(task):
            job = f"{array}_{task}"  # Slurm's own name for an array task (the environment's word, as the id)
    pod = namespace = None
    if cg.pod_uid or env.get("KUBERNETES_SERVICE_HOST"):
        pod = next((v for v in (env.get("POD_NAME"), env.get("HOSTNAME")) if v and _DNS.fullmatch(v)), None)
        ns_name = env.get("POD_NAMESPACE") or _namespace(pid, proc, creds)
        namespace = ns_name if ns_name and len(ns_name) <= 63 and _DNS.fullmatch(ns_name) else None
        if pod:  # the pod's uid is in the cgroup; its name, only in the environment
            job_from = job_from or "environment"
    run_id = env.get("TORCHELASTIC_RUN_ID")
    run_id = run_id if run_id and _RUN_ID.fullmatch(run_id) else None
    if run_id and job_from is None:
        job_from = "environment"
    return Owner(pid, True, ns, uid, _user(uid), cg.runtime, cg.container, cg.pod_uid, pod, namespace,
                 job, step, run_id, job_from)


def slurm_job_of(pid: int, uid: int, proc: str = PROC, cgroupfs: str = CGROUPFS) -> str | None:
    """The Slurm job this host vouches that process ``pid`` of user ``uid`` is in (``vouched_job``);
    None where it does not, or ``pid`` now runs as another user (a PID taken again)."""
    got, _, _ = _status(pid, proc)
    if got != uid:
        return None
    return vouched_job(parse_cgroup((read_file(f"{proc}/{pid}/cgroup", 65536) or b"").decode("utf-8", "replace")),
                       uid, cgroupfs)
