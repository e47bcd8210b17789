"""What a node's agent reads beyond one job: the probe of every training job here, and
whether NVIDIA hardware is present where NVML reads none (``sessions.agent_session``).

A node's agent is attached to no process: it reads every probe socket it may read. Run
as a user, that user's probe directory; run as root, every user's (each socket's peer
must be the owner of the directory it lies in). A probe that stops answering is dropped,
and its rank's series go with it.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import stat
import time
from typing import TYPE_CHECKING

from traintop.collectors.probe_limits import ProbeGuard, ProbeLimits
from traintop.samples import Frame, RankSample

if TYPE_CHECKING:
    from traintop.collectors.probe_client import ProbeClient

_SOCK = re.compile(r"probe-([1-9][0-9]{0,9})\.sock")
DIRS_EVERY_S = 5.0  # how often root looks again for users' probe directories
MAX_PROCS = 1 << 16  # processes looked at when finding them (a node has a few thousand)


def _users(proc: str = "/proc", run_user: str = "/run/user") -> set[int]:
    """Who may run a probe here: the owners of running processes (their /proc entries), and
    the users with a runtime directory. Bounded: /proc is the kernel's, /run/user root's."""
    uids: set[int] = set()
    for top, by_name in ((proc, False), (run_user, True)):
        try:
            with os.scandir(top) as it:
                for k, e in enumerate(it):
                    if k >= MAX_PROCS:
                        break
                    if not e.name.isdigit():
                        continue
                    if by_name:
                        uids.add(int(e.name))
                        continue
                    try:
                        uids.add(e.stat(follow_symlinks=False).st_uid)
                    except OSError:
                        pass
        except OSError:
            pass
    return uids


def _owned_dir(path: str, uid: int) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid


def probe_dirs(proc: str = "/proc", run_user: str = "/run/user", tmp: str = "/tmp") -> list[str]:
    """Ours, and run as root every user's: ``/run/user/UID/traintop`` and ``/tmp/traintop-UID``
    of each user with a process here, owned by that user. Never a listing of /tmp, which
    anyone can fill."""
    from traintop.injob.agent import probe_dir

    dirs = [probe_dir()]
    if os.geteuid() == 0:
        for uid in sorted(_users(proc, run_user)):
            dirs += [d for d in (os.path.join(run_user, str(uid), "traintop"), os.path.join(tmp, f"traintop-{uid}"))
                     if _owned_dir(d, uid)]
    seen, out = set(), []
    for d in dirs:
        real = os.path.realpath(d)
        if real not in seen and os.path.isdir(real):
            seen.add(real)
            out.append(real)
    return out


class AllProbes:
    """One probe client per probe directory, each asked about the sockets it holds now; all
    bounded together by one ProbeGuard (collectors/probe_limits.py)."""

    def __init__(self, dirs=None, limits: ProbeLimits | None = None) -> None:
        self._dirs = dirs or probe_dirs
        self._every = 0.0 if dirs else DIRS_EVERY_S
        self._dirs_at = -1e9
        self._known: list[str] = []
        self.guard = ProbeGuard(limits)
        self._clients: dict[str, ProbeClient] = {}
        self._pids: dict[str, set[int]] = {}  # a directory's sockets at its last scan
        self._kinds: dict[str, dict[str, tuple[int, bool]]] = {}  # directory -> name -> (inode, a socket)
        self._turn = 0

    def _directories(self) -> list[str]:
        now = time.monotonic()
        if now - self._dirs_at >= self._every:
            self._known, self._dirs_at = list(self._dirs()), now
        return self._known

    def ranks(self) -> tuple:
        from traintop.collectors.probe_client import ProbeClient

        dirs = self._directories()
        self.guard.new_tick()
        for d in [d for d in self._clients if d not in dirs]:  # gone: its connections go with it
            self._forget(d)
        self._turn = (self._turn + 1) % max(1, len(dirs))
        out: list[RankSample] = []
        for d in dirs[self._turn:] + dirs[:self._turn]:
            try:
                st = os.stat(d)
            except OSError:
                self._forget(d)
                continue
            client = self._clients.get(d)
            if client is not None and client.owner_uid != st.st_uid:
                self._forget(d)
                client = None
            if client is None:
                client = self._clients[d] = ProbeClient(d, owner_uid=st.st_uid, guard=self.guard)
            pids = self._scan(d, st.st_uid, client.connected()) if self.guard.scan_time_left() else self._pids.get(d)
            if pids is None:
                self._forget(d)
                continue
            self._pids[d] = pids
            out.extend(self._admitted(st.st_uid, client.sample(pids)))
        return tuple(out)

    def _scan(self, d: str, owner: int, connected: set[int]) -> set[int] | None:
        """The PIDs of the probe sockets in ``d`` (None: unreadable). At most ``scan_entries``
        entries are looked at, within the tick's time for scans; only sockets count (a plain file
        costs nothing: its type comes with its name; another kind is looked at once per inode).
        A scan cut short keeps the ``connected``."""
        lim = self.guard.limits
        pids: set[int] = set()
        known, kinds = self._kinds.get(d, {}), {}
        try:
            with os.scandir(d) as it:
                for k, e in enumerate(it):
                    if k >= lim.scan_entries or not self.guard.scan_time_left():
                        self.guard.refuse("scan_limit", note=f"traintop: the probe directory of uid {owner} holds more "
                                          f"than the agent looks at in one scan ({lim.scan_entries} entries): "
                                          "the sockets past them are not read", key=owner)
                        pids |= connected
                        break
                    m = _SOCK.fullmatch(e.name)
                    if m is None or e.is_file(follow_symlinks=False) or e.is_dir(follow_symlinks=False):
                        continue
                    kind = known.get(e.name)
                    if kind is None or kind[0] != e.inode():
                        try:
                            kind = (e.inode(), stat.S_ISSOCK(e.stat(follow_symlinks=False).st_mode))
                        except OSError:
                            continue
                    kinds[e.name] = kind
                    if kind[1]:
                        pids.add(int(m.group(1)))
        except OSError:
            return None
        self._kinds[d] = kinds
        return pids

    def _admitted(self, owner: int, ranks) -> list[RankSample]:
        """The ranks within their user's bound of ranks named lately (ProbeLimits.ranks_per_user)."""
        out = []
        for r in ranks:
            if r.rank is None or self.guard.admit_rank(owner, (r.job, r.rank, r.local_rank, r.world_size)):
                out.append(r)
            else:
                self.guard.refuse("rank_limit", note=f"traintop: the probes of uid {owner} named more than "
                                  f"{self.guard.limits.ranks_per_user} ranks within "
                                  f"{self.guard.limits.rank_ttl_s:g} s: the others are not exported", key=owner)
        return out

    def _forget(self, d: str) -> None:
        client = self._clients.pop(d, None)
        if client is not None:
            client.close()
        self._pids.pop(d, None)
        self._kinds.pop(d, None)

    def close(self) -> None:
        for d in list(self._clients):
            self._forget(d)


class AgentSampler:
    """``only``: serve these GPUs (NVML indices) and the ranks whose device is one of them —
    one agent per GPU posing as one node each, for tests on one machine."""

    def __init__(self, sampler, probes: AllProbes, only: frozenset[int] | None = None) -> None:
        self.sampler = sampler
        self.probes = probes
        self.only = only
        self.gpu_problem: str | None = None  # why NVML cannot read the GPUs (None: it can, or none are here)
        self.gpus_unreadable = False  # NVIDIA GPUs are here, and NVML cannot read them

    def next_frame(self) -> Frame:
        f = self.sampler.next_frame()
        ranks = self.probes.ranks()
        if self.only is None:
            return dataclasses.replace(f, ranks=ranks)
        return dataclasses.replace(f, gpus=tuple(g for g in f.gpus if g.index in self.only),
                                   stale_gpus=tuple(i for i in f.stale_gpus if i in self.only),
                                   ranks=tuple(r for r in ranks if r.device in self.only))

    def close(self) -> None:
        self.sampler.close()
        self.probes.close()


def nvidia_hardware_present(sys_root: str = "/") -> bool:
    """NVIDIA GPUs on this node whatever NVML says: a device node, the driver's /proc entry,
    or a display or 3D controller of NVIDIA's vendor id on the PCI bus."""
    root = os.path.join
    if glob.glob(root(sys_root, "dev", "nvidia[0-9]*")) or os.path.isdir(root(sys_root, "proc", "driver", "nvidia")):
        return True
    for dev in glob.glob(root(sys_root, "sys", "bus", "pci", "devices", "*")):
        try:
            with open(os.path.join(dev, "vendor")) as v, open(os.path.join(dev, "class")) as c:
                if v.read().strip() == "0x10de" and c.read().strip().startswith("0x03"):  # display/3D
                    return True
        except OSError:
            continue
    return False
