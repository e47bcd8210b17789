"""What each label of the diagnosis corpus expects of traintop, allows, and contradicts.

A label is what the job itself said it was doing (bench/workloads/corpus.py writes it, second by
second). For each one:

- ``expect``: the rules that name the situation (any of them counts; the first is the one the
  score table credits). Scored only where the source can carry the signal (``needs``).
- ``allow``: findings that are true or harmless beside it (the power cap at full load while
  training).
- ``wrong``: findings whose advice the label contradicts ("raise the batch size" on a job that
  waits for its input or for another rank; "more loader workers" for CPU work in the step; a
  stall on a job that evaluates). Each second one of them is up is a wrong-advice second, where
  the source carries what tells the two apart (``needs``); where it does not (an nvidia-smi log
  cannot see that two ranks share a GPU, nor PCIe traffic), the seconds are counted as *blind*.

Any other finding is a false one: it lowers that rule's precision.
"""

from __future__ import annotations

from dataclasses import dataclass

# what a source carries (where a label needs something no source of that kind has, its
# recall is not scored there: the table says why instead)
CAPS = {
    "probe-10Hz": {"probe", "process", "gpm", "pcie", "link", "memory", "power", "window"},
    "noprobe-10Hz": {"process", "gpm", "pcie", "link", "memory", "power", "window"},
    "noprobe-1Hz": {"process", "gpm", "pcie", "link", "memory", "power"},
    "smi-100ms": {"memory", "power"},
    "dmon-1s": {"pcie", "power"},
}
SOURCES = tuple(CAPS)

ANY_TRUE = frozenset()


@dataclass(frozen=True)
class Label:
    expect: tuple[str, ...] = ()
    allow: frozenset = frozenset()
    wrong: frozenset = frozenset()
    needs: tuple[frozenset, ...] = ()  # any one of these capability sets suffices
    ignore: bool = False  # not scored at all (start-up: the job imports, allocates, compiles)


def _n(*alternatives: str) -> tuple[frozenset, ...]:
    return tuple(frozenset(a.split("+")) for a in alternatives)


_HEALTHY_ALLOW = frozenset({"power_cap"})
_NOT_RUNNING = frozenset({"stall", "idle_gpu", "cpu_training"})  # a running job is none of these

LABELS: dict[str, Label] = {
    "startup": Label(ignore=True),
    # between a job's pauses its pause finding stays up (it judges minutes): true, not a false finding
    "train": Label(allow=_HEALTHY_ALLOW | {"pause"}, wrong=_NOT_RUNNING | {"precision"}),
    # training over gloo with large gradients: each step copies them GPU -> host -> GPU, and the GPU
    # waits for those copies (on an H200, 3.8 GiB/s at 21 % utilization): the PCIe finding is true
    "train_gloo": Label(allow=_HEALTHY_ALLOW | {"pause", "pcie"}, wrong=_NOT_RUNNING | {"precision"}),
    # SMs busy, tensor cores idle: GPM tells it; the probe's reading makes it certain
    "train_fp32": Label(("precision",), allow=_HEALTHY_ALLOW, wrong=_NOT_RUNNING, needs=_n("gpm")),
    "eval": Label(allow=_HEALTHY_ALLOW | {"pause"}, wrong=_NOT_RUNNING),
    "checkpoint": Label(("pause",), allow=frozenset({"power_cap", "idle_gpu"}),
                        wrong=frozenset({"starvation", "underuse", "stall", "cpu_training"}), needs=_n("probe")),
    # another rank checkpoints alone and this one waits for it at a barrier: a pause, no idle batch
    "barrier_wait": Label(("pause",), allow=frozenset({"power_cap", "idle_gpu"}),
                          wrong=frozenset({"starvation", "underuse", "stall", "cpu_training"}), needs=_n("probe")),
    # torch.compile's warm-up: the GPU waits for the compiler; nothing is wrong yet
    "compile": Label(allow=frozenset({"power_cap", "pause", "idle_gpu"}),
                     wrong=frozenset({"stall", "starvation", "underuse", "cpu_training"})),
    # a loader so slow that the GPU is rarely busy is no spiky trace: only the loader workers' CPU
    # (the process tree) or the probe's input wait tell it from a small batch
    "input_bound": Label(("starvation",), allow=frozenset({"straggler"}),
                         wrong=frozenset({"underuse", "stall", "cpu_training", "power_cap"}),
                         needs=_n("process", "probe")),
    "underused": Label(("underuse",), wrong=frozenset({"starvation", "stall", "power_cap"}), needs=_n("power")),
    "leak": Label(("memory_creep",), allow=frozenset({"power_cap", "fragmentation", "underuse"}),
                  wrong=_NOT_RUNNING, needs=_n("memory")),
    "oom": Label(("oom",), allow=frozenset({"power_cap", "fragmentation"}), wrong=_NOT_RUNNING, needs=_n("probe")),
    "after_oom": Label(("oom",), allow=frozenset({"power_cap", "fragmentation"}), wrong=_NOT_RUNNING,
                       needs=_n("probe")),
    "fragmented": Label(("fragmentation",), allow=frozenset({"power_cap", "underuse"}), wrong=_NOT_RUNNING,
                        needs=_n("probe")),
    "tiny_kernels": Label(("underuse",), wrong=frozenset({"starvation", "stall", "power_cap"}), needs=_n("gpm")),
    "pageable_copy": Label(("pcie",), wrong=frozenset({"underuse", "stall", "power_cap"}), needs=_n("pcie")),
    # a full link reads as "utilization": only its speed (or GPM) tells copies from compute
    "pinned_copy": Label(("pcie",), wrong=frozenset({"underuse", "starvation", "stall", "power_cap"}),
                         needs=_n("pcie+link")),
    "hung_collective": Label(("stall",), allow=frozenset({"idle_gpu"}),
                             wrong=frozenset({"underuse", "starvation", "pcie", "power_cap", "cpu_training"}),
                             needs=_n("probe", "process")),
    "hung_loader": Label(("stall",), allow=frozenset({"idle_gpu", "starvation"}),
                         wrong=frozenset({"underuse", "pcie", "power_cap", "cpu_training"}),
                         needs=_n("probe", "process")),
    "hung_loader_timeout": Label(("stall",), allow=frozenset({"idle_gpu", "starvation"}),
                                 wrong=frozenset({"underuse", "pcie", "power_cap", "cpu_training"}),
                                 needs=_n("probe", "process")),
    "idle": Label(("idle_gpu", "stall"), wrong=frozenset({"underuse", "starvation", "power_cap", "cpu_training"}),
                  needs=_n("process", "memory")),
    "cpu_train": Label(("cpu_training",), wrong=frozenset({"underuse", "starvation", "stall"}),
                       needs=_n("process")),
    "train_other": Label(("other_process",), allow=_HEALTHY_ALLOW, wrong=_NOT_RUNNING, needs=_n("process")),
    # two ranks on one GPU: only the probe tells them apart
    "straggler_input": Label(("straggler", "starvation"), wrong=frozenset({"underuse", "stall", "power_cap"}),
                             needs=_n("probe")),
    "straggler_cpu": Label(("straggler",), wrong=frozenset({"underuse", "starvation", "stall", "power_cap"}),
                           needs=_n("probe")),
    "straggler_sleep": Label(("straggler",), wrong=frozenset({"underuse", "starvation", "stall", "power_cap"}),
                             needs=_n("probe")),
    # the job finished its work (done) or is gone (ended): every finding about it must end
    "done": Label(),
    "ended": Label(),
}


def label(name: str) -> Label:
    try:
        return LABELS[name]
    except KeyError:
        raise KeyError(f"label {name!r} is not in bench/corpus_labels.py: say what it expects") from None


def carried(lab: Label, source: str) -> bool:
    """Whether ``source`` can carry the signal ``lab``'s expected finding needs."""
    caps = CAPS[source]
    return not lab.needs or any(n <= caps for n in lab.needs)
