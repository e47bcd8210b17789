"""Host metrics: per-core CPU, iowait, RAM, swap, disk and network rates.

Read from /proc (psutil where a file is missing: another OS, an odd container), with the same
figures as psutil gives: memory used = total - available, swap used = total - free, the disk
bytes of whole disks only (what /sys/block lists), the network bytes of every interface. Each
/proc file is opened once and read again from its start every sample (psutil's readers cost
~0.7 ms a sample on 2 slow cores: swap_memory reads /proc/vmstat too, disk_io_counters checks
/sys/block for every disk, every file is opened and closed each time).
"""

from __future__ import annotations

import os
import time
from io import FileIO

import psutil

from traintop.samples import HostSample

READ_MAX = 65536  # a /proc file read in one call; a longer one is read whole the usual way

# one core's CPU time: (all of it, idle including iowait, iowait or None), in any unit
Core = tuple[float, float, float | None]


class ProcFile:
    """A /proc file kept open and read from its start on each ``read()`` (None: unreadable)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._f: FileIO | None
        try:
            self._f = open(path, "rb", buffering=0)  # closed when the collector goes
        except OSError:
            self._f = None

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def read(self) -> str | None:
        if self._f is None:
            return None
        try:
            raw = os.pread(self._f.fileno(), READ_MAX, 0)
            if len(raw) >= READ_MAX:
                with open(self.path, "rb") as f:
                    raw = f.read()
        except OSError:
            return None
        return raw.decode("ascii", "replace")


class HostCollector:
    def __init__(self, clock=time.monotonic, proc: str = "/proc", sys_block: str = "/sys/block") -> None:
        self._clock = clock
        self._sys_block = sys_block
        self._whole_disk: dict[str, bool] = {}
        self._stat, self._meminfo, self._diskstats, self._netdev = (
            ProcFile(f"{proc}/{name}") for name in ("stat", "meminfo", "diskstats", "net/dev"))
        self._last_cpu = self._cpu()  # one read of /proc/stat gives cores and iowait
        self._last_t = clock()
        self._last_disk = self._disk()
        self._last_net = self._net()

    def close(self) -> None:
        for f in (self._stat, self._meminfo, self._diskstats, self._netdev):
            f.close()

    def _cpu(self) -> list[Core]:
        text = self._stat.read()
        out: list[Core] = []
        for line in (text or "").splitlines():
            if not (line.startswith("cpu") and line[3:4].isdigit()):
                continue
            vals = [int(v) for v in line.split()[1:] if v.isdigit()]
            if len(vals) >= 5:  # user nice system idle iowait ...: sums as psutil's per-core times do
                out.append((sum(vals), vals[3] + vals[4], vals[4]))
        if out:
            return out
        return [(sum(c), c.idle + getattr(c, "iowait", 0.0), getattr(c, "iowait", None))
                for c in psutil.cpu_times(percpu=True)]

    def _memory(self) -> tuple[int, int, int, int]:
        """(total, available, swap total, swap free), in bytes."""
        got: dict[str, int] = {}
        for line in (self._meminfo.read() or "").splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable", "SwapTotal", "SwapFree"):
                parts = rest.split()
                if parts and parts[0].isdigit():
                    got[key] = int(parts[0]) * 1024
        if "MemTotal" in got and "MemAvailable" in got:
            return got["MemTotal"], got["MemAvailable"], got.get("SwapTotal", 0), got.get("SwapFree", 0)
        vm, sw = psutil.virtual_memory(), psutil.swap_memory()  # not Linux, or a kernel before 3.14
        return vm.total, vm.available, sw.total, sw.total - sw.used

    def _is_whole_disk(self, name: str) -> bool:
        """A disk, not a partition of one (as psutil counts them: what /sys/block lists)."""
        got = self._whole_disk.get(name)
        if got is None:
            if len(self._whole_disk) > 4096:
                self._whole_disk.clear()
            got = self._whole_disk[name] = os.access(f"{self._sys_block}/{name.replace('/', '!')}", os.F_OK)
        return got

    def _disk(self) -> tuple[int, int] | None:
        """Bytes read and written by the whole disks so far."""
        text = self._diskstats.read()
        if text is None:
            try:
                d = psutil.disk_io_counters()
            except (RuntimeError, OSError):
                return None
            return (d.read_bytes, d.write_bytes) if d is not None else None
        read = write = 0
        for line in text.splitlines():
            f = line.split()
            if len(f) >= 14:
                name, r, w = f[2], f[5], f[9]
            elif len(f) == 7:  # a partition on kernels before 2.6.25
                name, r, w = f[2], f[4], f[6]
            else:
                continue
            if r.isdigit() and w.isdigit() and self._is_whole_disk(name):
                read += int(r) * 512  # the kernel counts 512-byte sectors, whatever the device's own
                write += int(w) * 512
        return read, write

    def _net(self) -> tuple[int, int] | None:
        """Bytes received and sent on every interface so far."""
        text = self._netdev.read()
        if text is None:
            try:
                n = psutil.net_io_counters()
            except (RuntimeError, OSError):
                return None
            return (n.bytes_recv, n.bytes_sent) if n is not None else None
        rx = tx = 0
        for line in text.splitlines()[2:]:
            _, sep, rest = line.partition(":")
            f = rest.split()
            if sep and len(f) >= 9 and f[0].isdigit() and f[8].isdigit():
                rx += int(f[0])
                tx += int(f[8])
        return rx, tx

    def sample(self) -> HostSample:
        now = self._clock()
        dt = max(now - self._last_t, 1e-6)
        cpu = self._cpu()
        cores, iowait = _busy_and_iowait(self._last_cpu, cpu)
        self._last_cpu = cpu
        total, available, swap_total, swap_free = self._memory()
        disk, net = self._disk(), self._net()
        d_read = d_write = n_rx = n_tx = None
        if disk is not None and self._last_disk is not None:
            d_read = max(0.0, (disk[0] - self._last_disk[0]) / dt)
            d_write = max(0.0, (disk[1] - self._last_disk[1]) / dt)
        if net is not None and self._last_net is not None:
            n_rx = max(0.0, (net[0] - self._last_net[0]) / dt)
            n_tx = max(0.0, (net[1] - self._last_net[1]) / dt)
        self._last_t, self._last_disk, self._last_net = now, disk, net
        return HostSample(
            cpu_percent=sum(cores) / len(cores) if cores else None,
            per_core=cores,
            iowait=iowait,
            mem_used=total - available, mem_total=total,
            swap_used=swap_total - swap_free, swap_total=swap_total,
            disk_read=d_read, disk_write=d_write, net_rx=n_rx, net_tx=n_tx,
        )


def _busy_and_iowait(before: list[Core], after: list[Core]) -> tuple[tuple[float, ...], float | None]:
    """Per-core busy percent and the host's iowait percent between two readings of every core."""
    cores = []
    wait = total_all = 0.0
    has_iowait = False
    for (a_total, a_idle, a_wait), (b_total, b_idle, b_wait) in zip(before, after):
        total = b_total - a_total
        idle = b_idle - a_idle
        if b_wait is not None and a_wait is not None:
            has_iowait = True
            wait += b_wait - a_wait
        total_all += total
        cores.append(min(100.0, max(0.0, 100.0 * (1.0 - idle / total))) if total > 0 else 0.0)
    iowait = max(0.0, 100.0 * wait / total_all) if has_iowait and total_all > 0 else (0.0 if has_iowait else None)
    return tuple(cores), iowait
