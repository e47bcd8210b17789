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
from typing import TYPE_CHECKING

from traintop.samples import Frame, RankSample

if TYPE_CHECKING:
    from traintop.collectors.probe_client import ProbeClient

_SOCK = re.compile(r"probe-(\d+)\.sock$")


def probe_dirs() -> list[str]:
    from traintop.probe_agent import probe_dir

    dirs = [probe_dir()]
    if os.geteuid() == 0:
        dirs += sorted(glob.glob("/run/user/*/traintop")) + sorted(glob.glob("/tmp/traintop-*"))
    seen, out = set(), []
    for d in dirs:
        real = os.path.realpath(d)
        if real not in seen and os.path.isdir(real):
            seen.add(real)
            out.append(real)
    return out


class AllProbes:
    """One probe client per probe directory, each asked about the sockets it holds now."""

    def __init__(self, dirs=None) -> None:
        self._dirs = dirs or probe_dirs
        self._clients: dict[str, ProbeClient] = {}

    def ranks(self) -> tuple:
        from traintop.collectors.probe_client import ProbeClient

        out: list[RankSample] = []
        for d in self._dirs():
            try:
                st = os.stat(d)
                names = os.listdir(d)
            except OSError:
                continue
            client = self._clients.get(d)
            if client is None:
                client = self._clients[d] = ProbeClient(d, owner_uid=st.st_uid)
            pids = {int(m.group(1)) for n in names if (m := _SOCK.match(n))}
            out.extend(client.sample(pids))
        return tuple(out)

    def close(self) -> None:
        for c in self._clients.values():
            c.close()


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
