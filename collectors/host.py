"""Host metrics through psutil: per-core CPU, iowait, RAM, swap, disk and network rates."""

from __future__ import annotations

import time

import psutil

from traintop.samples import HostSample


class HostCollector:
    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._last_cpu = psutil.cpu_times(percpu=True)  # one read of /proc/stat gives cores and iowait
        self._last_t = clock()
        self._last_disk = self._disk()
        self._last_net = self._net()

    @staticmethod
    def _disk():
        try:
            return psutil.disk_io_counters()
        except (RuntimeError, OSError):
            return None

    @staticmethod
    def _net():
        try:
            return psutil.net_io_counters()
        except (RuntimeError, OSError):
            return None

    def sample(self) -> HostSample:
        now = self._clock()
        dt = max(now - self._last_t, 1e-6)
        cpu = psutil.cpu_times(percpu=True)
        cores, iowait = _busy_and_iowait(self._last_cpu, cpu)
        self._last_cpu = cpu
        vm = psutil.virtual_memory()
        sw = psutil.swap_memory()
        disk, net = self._disk(), self._net()
        d_read = d_write = n_rx = n_tx = None
        if disk is not None and self._last_disk is not None:
            d_read = max(0.0, (disk.read_bytes - self._last_disk.read_bytes) / dt)
            d_write = max(0.0, (disk.write_bytes - self._last_disk.write_bytes) / dt)
        if net is not None and self._last_net is not None:
            n_rx = max(0.0, (net.bytes_recv - self._last_net.bytes_recv) / dt)
            n_tx = max(0.0, (net.bytes_sent - self._last_net.bytes_sent) / dt)
        self._last_t, self._last_disk, self._last_net = now, disk, net
        return HostSample(
            cpu_percent=sum(cores) / len(cores) if cores else None,
            per_core=cores,
            iowait=iowait,
            mem_used=vm.total - vm.available, mem_total=vm.total,
            swap_used=sw.used, swap_total=sw.total,
            disk_read=d_read, disk_write=d_write, net_rx=n_rx, net_tx=n_tx,
        )


def _busy_and_iowait(before, after) -> tuple[tuple[float, ...], float | None]:
    """Per-core busy percent and the host's iowait percent between two cpu_times(percpu=True)."""
    cores = []
    wait = total_all = 0.0
    has_iowait = False
    for a, b in zip(before, after):
        total = sum(b) - sum(a)
        idle = (b.idle - a.idle) + (getattr(b, "iowait", 0.0) - getattr(a, "iowait", 0.0))
        if hasattr(b, "iowait"):
            has_iowait = True
            wait += b.iowait - a.iowait
        total_all += total
        cores.append(min(100.0, max(0.0, 100.0 * (1.0 - idle / total))) if total > 0 else 0.0)
    iowait = max(0.0, 100.0 * wait / total_all) if has_iowait and total_all > 0 else (0.0 if has_iowait else None)
    return tuple(cores), iowait
