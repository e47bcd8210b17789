"""Thresholds every rule reads, single-host and cross-host; all of them can be changed by the user."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace


@dataclass(frozen=True)
class Thresholds:
    # data starvation
    starvation_window_s: float = 20.0
    starvation_idle_util: float = 10.0  # a sample below this is "idle"
    starvation_busy_util: float = 50.0  # a sample at or above this is "busy"
    starvation_min_idle_frac: float = 0.20
    starvation_min_busy_frac: float = 0.10
    starvation_busy_worker_cpu: float = 85.0  # % of a core for a loader worker to count as saturated
    starvation_input_wait: float = 0.30  # share of wall time in DataLoader.__next__ (probe): starved
    starvation_fed_input_wait: float = 0.10  # below this measured share the loader keeps up: not starved
    # underuse
    underuse_window_s: float = 30.0
    underuse_power_frac: float = 0.35  # mean power below this share of the limit
    underuse_max_util: float = 60.0
    underuse_max_sm_active: float = 25.0  # GPM: SMs busy below this while "utilization" is high
    underuse_min_util_for_sm: float = 50.0
    # thermal and power
    thermal_window_s: float = 20.0
    thermal_min_frac: float = 0.25
    thermal_margin_c: float = 2.0  # within this of the slowdown threshold counts as hot
    power_cap_window_s: float = 20.0
    power_cap_min_util: float = 85.0
    # creeping memory
    creep_window_s: float = 120.0
    creep_min_rate_mib_s: float = 8.0
    creep_min_rise_frac: float = 0.02
    creep_min_r2: float = 0.8
    creep_critical_tto_s: float = 600.0
    # fragmentation (probe)
    frag_min_unused_frac: float = 0.30  # reserved but unallocated share of reserved
    frag_min_unused_gib: float = 2.0
    # training on the CPU
    cpu_training_min_cpu: float = 90.0  # % of a core, the whole process tree
    cpu_training_window_s: float = 30.0
    # step-time regression (probe)
    step_regression_ratio: float = 1.3
    step_regression_window_s: float = 30.0
    # optimizer steps a GradScaler skipped for inf or NaN gradients (probe); an overflow now and then
    # is how the scaler finds its scale (one in ~2000 steps), so only a large share counts, and only
    # from 20 skips: each halves the scale, and 20 take the default 65536 below 0.1, more than the
    # scale search at a job's start skips (a healthy job at 1 step/s skipped 8-12 there)
    skipped_steps_window_s: float = 30.0
    skipped_steps_min_frac: float = 0.2
    skipped_steps_min_n: float = 20
    # GPU idle while the job is alive
    idle_window_s: float = 30.0
    idle_max_util: float = 2.0
    # another process holding GPU memory
    other_process_min_gib: float = 1.0
    other_process_min_sm: float = 20.0  # % of the GPU's time another process computes (its NVML share)
    # training in full fp32: SMs busy, tensor cores idle (GPM), the probe's matmul precision
    precision_window_s: float = 30.0
    precision_min_sm_active: float = 40.0  # % of SMs busy on average
    precision_max_tensor_active: float = 3.0  # % tensor-core activity at most
    # pauses: the job's steps stop for something other than input (checkpoint, evaluation, ...)
    pause_window_s: float = 1800.0  # judged over up to this much (from 30 s of data on)
    pause_min_share: float = 0.08  # of the window's wall time spent in pauses
    pause_min_gaps: float = 2  # separate pauses in the window: repeated, not a one-off
    # host RAM and swap
    host_mem_frac: float = 0.95
    host_swap_rise_gib: float = 0.5
    # a slow rank (straggler) and a stalled job
    straggler_window_s: float = 20.0
    stall_min_s: float = 30.0  # no step (or GPUs spinning without work) for at least this long...
    stall_step_factor: float = 3.0  # ...or this many usual step times, if longer
    # underuse judged from utilization alone (a log without a power limit)
    underuse_util_only_window_s: float = 60.0
    underuse_util_only_max: float = 25.0
    # imbalance between the GPUs of one job
    imbalance_window_s: float = 60.0
    imbalance_gap: float = 25.0  # utilization points
    # clocks below maximum for no reason
    low_clocks_frac: float = 0.8
    low_clocks_min_util: float = 90.0
    # PCIe / host-to-device bottleneck
    pcie_window_s: float = 20.0
    pcie_min_link_frac: float = 0.6  # host-to-device traffic at or above this share of the link
    pcie_max_util: float = 90.0
    pcie_max_sm_active: float = 50.0  # or, with GPM, SMs active below this
    pcie_pageable_min_gbs: float = 1.0  # sustained GB/s to a waiting GPU below the link's speed: pageable copies
    pcie_pageable_max_util: float = 60.0
    # XID / ECC: corrected errors per minute that warrant a warning
    ecc_corrected_per_min: float = 10.0
    # across hosts (traintop cluster, analyze --prometheus), judged at each instant of Prometheus's grid
    cluster_hold_s: float = 10.0  # a verdict becomes a finding once it has held this long (gaps of 2 steps bridged)
    cluster_straggler_ratio: float = 1.25  # a rank's step time this many times the pace of the job's fastest third
    # Synchronous DDP: every rank steps at the straggler's pace; its loader takes this share of the step
    # more than the others' median (the share they wait for it in collectives), and this many times it.
    # An absolute gap, not only a ratio: on an H200 the others' own loader took 35 % of the step, the
    # straggler's 88 %.
    cluster_straggler_input_wait: float = 0.2  # the straggler's input wait is at least this share
    cluster_straggler_wait_gap: float = 0.2
    cluster_straggler_wait_ratio: float = 1.5
    cluster_node_starving_input_wait: float = 0.3  # a node's mean input wait...
    cluster_node_starving_ratio: float = 2.5  # ...at least this many times the other nodes' median
    cluster_slow_node_clock_frac: float = 0.85  # every busy GPU of a node below this share of its maximum SM clock...
    cluster_slow_node_others_clock_frac: float = 0.95  # ...while the other nodes' median stays at or above it
    cluster_slow_node_min_util: float = 50.0  # a GPU at or above this utilization is busy
    cluster_stall_min_s: float = 10.0  # no rank stepped for this long (10 steps of the grid if longer, up to 60 s)
    cluster_node_missing_s: float = 5.0  # a node's series stopped this long (3 steps if longer) while the others' go on

    def with_overrides(self, **overrides: float) -> "Thresholds":
        names = {f.name for f in fields(self)}
        unknown = set(overrides) - names
        if unknown:
            raise ValueError(f"unknown threshold(s): {', '.join(sorted(unknown))}")
        return replace(self, **{k: float(v) for k, v in overrides.items()})


DEFAULT = Thresholds()

CLUSTER_PREFIX = "cluster_"  # the cross-host rules' thresholds: they judge Prometheus's grid, never a recording


def host_values(t: Thresholds) -> dict[str, float]:
    """The thresholds the single-host rules read: what a recording says judged its alerts (a
    cross-host threshold changes nothing there)."""
    return {k: v for k, v in asdict(t).items() if not k.startswith(CLUSTER_PREFIX)}

# The values each threshold may take. Outside them a rule would silently never fire (a
# window longer than the 15 minutes of samples the dashboard keeps, a share above 1) or
# always fire: ``--set`` and the config file refuse them with one line naming the range.
_WINDOW = (1.0, 600.0)  # seconds
_PCT = (0.0, 100.0)  # utilization points, percent of the GPU
_FRAC = (0.0, 1.0)  # a share
_GIB = (0.0, 100_000.0)
RANGES: dict[str, tuple[float, float]] = {
    "starvation_window_s": _WINDOW, "starvation_idle_util": _PCT, "starvation_busy_util": _PCT,
    "starvation_min_idle_frac": _FRAC, "starvation_min_busy_frac": _FRAC,
    "starvation_busy_worker_cpu": (0.0, 1000.0), "starvation_input_wait": _FRAC, "starvation_fed_input_wait": _FRAC,
    "underuse_window_s": _WINDOW, "underuse_power_frac": _FRAC, "underuse_max_util": _PCT,
    "underuse_max_sm_active": _PCT, "underuse_min_util_for_sm": _PCT,
    "thermal_window_s": _WINDOW, "thermal_min_frac": _FRAC, "thermal_margin_c": (0.0, 50.0),
    "power_cap_window_s": _WINDOW, "power_cap_min_util": _PCT,
    "creep_window_s": _WINDOW, "creep_min_rate_mib_s": (0.0, 1_000_000.0), "creep_min_rise_frac": _FRAC,
    "creep_min_r2": _FRAC, "creep_critical_tto_s": (1.0, 86_400.0),
    "frag_min_unused_frac": _FRAC, "frag_min_unused_gib": _GIB,
    "cpu_training_min_cpu": (0.0, 100_000.0), "cpu_training_window_s": _WINDOW,
    "step_regression_ratio": (1.0, 100.0), "step_regression_window_s": _WINDOW,
    "skipped_steps_window_s": _WINDOW, "skipped_steps_min_frac": _FRAC, "skipped_steps_min_n": (1, 1_000_000),
    "idle_window_s": _WINDOW, "idle_max_util": _PCT,
    "other_process_min_gib": _GIB, "other_process_min_sm": _PCT,
    "host_mem_frac": _FRAC, "host_swap_rise_gib": _GIB,
    "precision_window_s": _WINDOW, "precision_min_sm_active": _PCT, "precision_max_tensor_active": _PCT,
    "pause_window_s": (60.0, 24 * 3600.0), "pause_min_share": _FRAC, "pause_min_gaps": (1, 1000),
    "imbalance_window_s": _WINDOW, "imbalance_gap": _PCT,
    "low_clocks_frac": _FRAC, "low_clocks_min_util": _PCT,
    "pcie_window_s": _WINDOW, "pcie_min_link_frac": _FRAC, "pcie_max_util": _PCT, "pcie_max_sm_active": _PCT,
    "ecc_corrected_per_min": (0.0, 1_000_000.0),
    "straggler_window_s": _WINDOW, "stall_min_s": _WINDOW, "stall_step_factor": (1.0, 100.0),
    "underuse_util_only_window_s": _WINDOW, "underuse_util_only_max": _PCT,
    "pcie_pageable_min_gbs": (0.0, 1000.0), "pcie_pageable_max_util": _PCT,
    "cluster_hold_s": _WINDOW, "cluster_straggler_ratio": (1.0, 100.0), "cluster_straggler_input_wait": _FRAC,
    "cluster_straggler_wait_gap": _FRAC, "cluster_straggler_wait_ratio": (1.0, 100.0),
    "cluster_node_starving_input_wait": _FRAC, "cluster_node_starving_ratio": (1.0, 100.0),
    "cluster_slow_node_clock_frac": _FRAC, "cluster_slow_node_others_clock_frac": _FRAC,
    "cluster_slow_node_min_util": _PCT, "cluster_stall_min_s": _WINDOW, "cluster_node_missing_s": _WINDOW,
}
