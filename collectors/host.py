"""Host metrics through psutil: per-core CPU, iowait, RAM, swap, disk and network rates."""

from __future__ import annotations

import time

import psutil

from traintop.samples import HostSample


class HostCollector:
    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        psutil.cpu_percent(percpu=True)  # prime: the first call has no interval
        psutil.cpu_times_percent()
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
        cores = tuple(psutil.cpu_percent(percpu=True))
        times = psutil.cpu_times_percent()
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
            iowait=getattr(times, "iowait", None),
            mem_used=vm.total - vm.available, mem_total=vm.total,
            swap_used=sw.used, swap_total=sw.total,
            disk_read=d_read, disk_write=d_write, net_rx=n_rx, net_tx=n_tx,
        )
