"""Whose a process is: its user, its container, its Kubernetes pod, its Slurm job, its torchrun run.

Read from ``/proc/PID`` only (status, cgroup, environ), bounded, and checked: an id that does
not have its kind's shape is dropped, never shown. What the cgroup path says was set up by root
(the container runtime, the kubelet, slurmd); what the environment says is the process owner's
word, so it is used only where the cgroup says nothing, and marked as such (``job_from``).

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
from dataclasses import dataclass

from traintop.samples import Owner  # the record this module fills in (also imported from here)

PROC = "/proc"
READ_MAX = 256 * 1024  # a /proc file read at most this far (environ can be megabytes)
FD_MAX = 4096  # descriptors looked at to tell whether a process holds a GPU device open

_HEX64 = r"[0-9a-f]{64}"
# (runtime, pattern on one cgroup path): systemd scope names first, then cgroupfs paths
_CONTAINER = [
    ("containerd", re.compile(rf"cri-containerd-({_HEX64})\.scope")),
    ("cri-o", re.compile(rf"crio-(?:conmon-)?({_HEX64})\.scope")),
    ("docker", re.compile(rf"docker-({_HEX64})\.scope")),
    ("podman", re.compile(rf"libpod-(?:conmon-)?({_HEX64})(?:\.scope|/|$)")),
    ("docker", re.compile(rf"/docker/({_HEX64})(?:/|$)")),
    ("kubernetes", re.compile(rf"/kubepods[^\n]*/pod[0-9a-f_-]{{36}}(?:\.slice)?/({_HEX64})(?:/|$)")),
]
_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice|/|$)")
_SLURM_JOB = re.compile(r"/job_(\d{1,12})(?:/|$)")
_SLURM_STEP = re.compile(r"/step_(\d{1,9}|batch|extern|interactive)(?:/|$)")
_DIGITS = re.compile(r"\d{1,12}")
_STEP = re.compile(r"\d{1,9}|batch|extern|interactive")
_DNS = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")  # Kubernetes names (RFC 1123)
_RUN_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
ENV_KEYS = ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID",
            "TORCHELASTIC_RUN_ID", "POD_NAME", "POD_NAMESPACE", "KUBERNETES_SERVICE_HOST", "HOSTNAME")


@dataclass(frozen=True, slots=True)
class CgroupFacts:
    runtime: str | None = None
    container: str | None = None
    pod_uid: str | None = None
    slurm_job: str | None = None
    slurm_step: str | None = None


def parse_cgroup(text: str) -> CgroupFacts:
    """What the cgroup paths of ``/proc/PID/cgroup`` (v1 or v2) say about a process."""
    paths = []
    for line in text.splitlines()[:64]:
        parts = line.split(":", 2)
        if len(parts) == 3:
            paths.append(parts[2][:4096])
    runtime = container = pod_uid = job = step = None
    for path in paths:
        if container is None:
            for name, pattern in _CONTAINER:
                m = pattern.search(path)
                if m:
                    runtime, container = name, m.group(1)
                    break
        if pod_uid is None and "kubepods" in path:
            m = _POD_UID.search(path)
            if m:
                pod_uid = m.group(1).replace("_", "-")
        if job is None:
            m = _SLURM_JOB.search(path)
            if m and ("slurm" in path or "/job_" in path):
                job = m.group(1)
                s = _SLURM_STEP.search(path)
                step = s.group(1) if s else None
    if pod_uid is not None and runtime in ("containerd", "cri-o", "docker"):
        runtime = "kubernetes" if runtime == "docker" else runtime
    return CgroupFacts(runtime, container, pod_uid, job, step)


def _read(path: str, limit: int = READ_MAX) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return None


def environment(pid: int, proc: str = PROC) -> dict[str, str]:
    """The few variables that name a job, from ``/proc/PID/environ`` (readable by its owner and
    root only; {} where not)."""
    raw = _read(f"{proc}/{pid}/environ")
    if not raw:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key.decode("ascii", "replace") in ENV_KEYS:
            out[key.decode()] = value[:256].decode("utf-8", "replace")
    return out


def _status(pid: int, proc: str) -> tuple[int | None, tuple[int, ...]]:
    raw = _read(f"{proc}/{pid}/status", 16384)
    uid, ns = None, ()
    for line in (raw or b"").decode("ascii", "replace").splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            uid = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
        elif line.startswith("NSpid:"):
            ns = tuple(int(x) for x in line.split()[1:9] if x.isdigit())
    return uid, ns


def _user(uid: int | None) -> str | None:
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


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


def whose(pid: int, gpu_process: bool = False, proc: str = PROC, nested: bool | None = None) -> Owner:
    """``pid``'s owner and job. ``gpu_process``: NVML reported it, so it holds a GPU; inside a
    nested PID namespace (``nested``; found out when None) a process here that holds no GPU is
    another process than the one NVML meant."""
    uid, ns = _status(pid, proc)
    if uid is None and not ns:
        return Owner(pid, visible=False)
    if gpu_process:
        if nested is None:
            nested = in_nested_pid_namespace()
        if nested and holds_gpu(pid, proc) is False:
            return Owner(pid, visible=False)
    cg = parse_cgroup((_read(f"{proc}/{pid}/cgroup", 65536) or b"").decode("utf-8", "replace"))
    env = environment(pid, proc)
    job, step, job_from = cg.slurm_job, cg.slurm_step, "cgroup" if cg.slurm_job else None
    if job is None and _DIGITS.fullmatch(env.get("SLURM_JOB_ID", "")):
        job, job_from = env["SLURM_JOB_ID"], "environment"
        step = env.get("SLURM_STEP_ID") if _STEP.fullmatch(env.get("SLURM_STEP_ID", "")) else None
    array, task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
    if job is not None and _DIGITS.fullmatch(array) and _DIGITS.fullmatch(task):
        job = f"{array}_{task}"  # Slurm's own name for an array task
    pod = namespace = None
    if cg.pod_uid or env.get("KUBERNETES_SERVICE_HOST"):
        pod = next((v for v in (env.get("POD_NAME"), env.get("HOSTNAME")) if v and _DNS.fullmatch(v)), None)
        ns_name = env.get("POD_NAMESPACE") or (_read(
            f"{proc}/{pid}/root/var/run/secrets/kubernetes.io/serviceaccount/namespace", 256) or b"").decode(
            "ascii", "replace").strip()
        namespace = ns_name if ns_name and len(ns_name) <= 63 and _DNS.fullmatch(ns_name) else None
        if pod:  # the pod's uid is in the cgroup; its name, only in the environment
            job_from = job_from or "environment"
    run_id = env.get("TORCHELASTIC_RUN_ID")
    run_id = run_id if run_id and _RUN_ID.fullmatch(run_id) else None
    if run_id and job_from is None:
        job_from = "environment"
    return Owner(pid, True, ns, uid, _user(uid), cg.runtime, cg.container, cg.pod_uid, pod, namespace,
                 job, step, run_id, job_from)
