"""GPU Performance Monitoring (GPM) metrics of Hopper-class GPUs, through NVML.

GPM counts what the SMs actually did between two samples, so its figures are means over
the window, not the point sample that ``utilization.gpu`` is: SM activity, tensor-core
activity, DRAM bandwidth, PCIe and NVLink traffic. ``nvidia-smi``'s "utilization" says only that
*some* kernel was running; a kernel on 3 SMs of 132 reads 100 %. GPM is how we tell.

One ``GpmReader`` per collector; ``poll()`` runs on the slow thread about once a second.
Devices without GPM (pre-Hopper, or bindings without the API) read ``None``. A MIG GPU's
instances each have a reader of their own (``GpmReader.for_instances``): the same metrics,
from ``nvmlGpmMigSampleGet(parent, gpuInstanceId, sample)``, without PCIe and NVLink, which
belong to the whole GPU.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable, Sequence

# metric name -> NVML metric id (stable numbers from nvml.h; bindings may lack the names)
METRICS = {
    "sm_active": 2,       # NVML_GPM_METRIC_SM_UTIL: share of SMs busy, averaged over time
    "sm_occupancy": 3,    # NVML_GPM_METRIC_SM_OCCUPANCY: resident warps vs the maximum
    "tensor_active": 5,   # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    "dram_active": 10,    # NVML_GPM_METRIC_DRAM_BW_UTIL: DRAM bandwidth vs the maximum
    "pcie_tx": 20,        # NVML_GPM_METRIC_PCIE_TX_PER_SEC, MiB/s from the GPU
    "pcie_rx": 21,        # NVML_GPM_METRIC_PCIE_RX_PER_SEC, MiB/s to the GPU
    "nvlink_rx": 60,      # NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, MiB/s read over all links
    "nvlink_tx": 61,      # NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, MiB/s written over all links
}
# What one GPU instance of a MIG GPU measures: its SMs and memory (PCIe and NVLink are the GPU's).
INSTANCE_METRICS = ("sm_active", "sm_occupancy", "tensor_active", "dram_active")
_RATES = ("pcie_tx", "pcie_rx", "nvlink_rx", "nvlink_tx")
_UNSUPPORTED = {3, 13}  # NVML_ERROR_NOT_SUPPORTED, FUNCTION_NOT_FOUND: asking again answers the same
_MIB = 1024.0 * 1024.0


class GpmReader:
    def __init__(self, nv, handles: list[Any], *, metrics: tuple[str, ...] = tuple(METRICS),
                 getters: Sequence[Callable[[Any], Any]] | None = None,
                 supported: list[bool] | None = None) -> None:
        """``getters``: one call per stream that fills a sample (default: ``nvmlGpmSampleGet`` of
        each handle); ``supported``: whether each stream can be read (default: asked of NVML)."""
        self.nv = nv
        self.handles = handles
        self.metrics = metrics
        self.supported = supported if supported is not None else [self._supported(h) for h in handles]
        self._get: list[Callable[[Any], Any]] = list(getters) if getters is not None \
            else [partial(self._device_sample, h) for h in handles]
        self._prev: list[Any] = [None] * len(handles)
        self._spare: list[Any] = [None] * len(handles)
        self.errors = 0

    @classmethod
    def for_instances(cls, nv, instances: list[tuple[Any, int]], parent_supported: list[bool]) -> "GpmReader":
        """One stream per (parent GPU handle, GPU instance id) of a MIG GPU; readable where the
        parent GPU supports GPM and the bindings have ``nvmlGpmMigSampleGet``."""
        fn = getattr(nv, "nvmlGpmMigSampleGet", None)
        getters = [partial(cls._instance_sample, nv, h, gi) for h, gi in instances]
        supported = [fn is not None and ok for ok in parent_supported]
        return cls(nv, [h for h, _ in instances], metrics=INSTANCE_METRICS, getters=getters, supported=supported)

    def _device_sample(self, h, sample):
        return self.nv.nvmlGpmSampleGet(h, sample)

    @staticmethod
    def _instance_sample(nv, h, gi: int, sample):
        return nv.nvmlGpmMigSampleGet(h, gi, sample)

    @property
    def any(self) -> bool:
        return any(self.supported)

    def _supported(self, h) -> bool:
        nv = self.nv
        if not all(hasattr(nv, f) for f in ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc",
                                            "nvmlGpmSampleGet", "nvmlGpmMetricsGet")):
            return False
        try:
            return bool(nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
        except Exception:  # NVMLError of any kind, or a binding that cannot call it
            return False

    def poll(self, i: int) -> dict[str, float | None] | None:
        """Metrics over the window since the previous poll of device ``i`` (None on the first)."""
        if not self.supported[i]:
            return None
        nv = self.nv
        try:
            if self._spare[i] is None:
                self._spare[i] = nv.nvmlGpmSampleAlloc()
            cur = self._get[i](self._spare[i])
            prev = self._prev[i]
            self._prev[i], self._spare[i] = cur, prev
            if prev is None:
                return None
            return self._metrics(prev, cur)
        except nv.NVMLError as e:
            if getattr(e, "value", None) in _UNSUPPORTED:
                self.supported[i] = False  # e.g. a GPU in MIG mode that measures per instance only
            else:
                self.errors += 1
            self._prev[i] = None
            return None
        except Exception:  # a binding's or driver's odd answer (a wrong type): never into the sampler
            self.errors += 1
            self._prev[i] = None
            return None

    def _metrics(self, prev, cur) -> dict[str, float | None]:
        nv = self.nv
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = getattr(nv, "NVML_GPM_METRICS_GET_VERSION", 1)
        req.numMetrics = len(self.metrics)
        req.sample1, req.sample2 = prev, cur
        for j, name in enumerate(self.metrics):
            req.metrics[j].metricId = METRICS[name]
        nv.nvmlGpmMetricsGet(req)
        out: dict[str, float | None] = {}
        for j, name in enumerate(self.metrics):
            m = req.metrics[j]
            v = float(m.value) if m.nvmlReturn == 0 and isinstance(m.value, (int, float)) else None
            if v is not None and not math.isfinite(v):
                v = None
            elif v is not None and name in _RATES:
                v = max(v, 0.0) * _MIB
            elif v is not None:
                v = min(max(v, 0.0), 100.0)
            out[name] = v
        return out

    def close(self) -> None:
        free = getattr(self.nv, "nvmlGpmSampleFree", None)
        if free is None:
            return
        for s in self._prev + self._spare:
            if s is not None:
                try:
                    free(s)
                except Exception:  # freeing at shutdown: nothing to report
                    pass
        self._prev = [None] * len(self.handles)
        self._spare = [None] * len(self.handles)
