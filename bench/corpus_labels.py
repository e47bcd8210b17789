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

Any other finding is a false one: it lowers that rule's precision. Every rule of the default engine
is contradicted by some label (a test checks it): a finding that fires always costs wrong-advice
seconds somewhere.

``BUCKET`` maps each label to the bucket of the probe's time ledger it is (traintop/injob/goodput.py),
for bench/ledger_score.py; a label that does not say how its time splits maps to None.
"""

from __future__ import annotations

from dataclasses import dataclass

# what a source carries (where a label needs something no source of that kind has, its
# recall is not scored there: the table says why instead)
CAPS = {
    "probe-10Hz": {"probe", "process", "gpm", "pcie", "link", "memory", "power", "window", "host"},
    "noprobe-10Hz": {"process", "gpm", "pcie", "link", "memory", "power", "window", "host"},
    "noprobe-1Hz": {"process", "gpm", "pcie", "link", "memory", "power", "host"},
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
    # a wrong finding that only these capabilities tell from the truth: blind (not wrong) without them
    wrong_needs: tuple[tuple[str, tuple[frozenset, ...]], ...] = ()
    ignore: bool = False  # not scored at all (start-up: the job imports, allocates, compiles)


def _n(*alternatives: str) -> tuple[frozenset, ...]:
    return tuple(frozenset(a.split("+")) for a in alternatives)


_HEALTHY_ALLOW = frozenset({"power_cap"})
_NOT_RUNNING = frozenset({"stall", "idle_gpu", "cpu_training"})  # a running job is none of these
# What the steady healthy phase (``train``: big_model, its data on the GPU, alone on its one GPU, at
# full pace) contradicts, each by the job's own account (its label lines carry the allocator's figures):
# - memory_creep, fragmentation, oom: its allocated memory swings within each step and returns (1-6 GiB),
#   no allocation retries, no OOM (``alloc_retries``, ``ooms`` 0 in every train line of the corpus);
# - other_process: it runs alone (the one phase with a second process is ``train_other``);
# - underuse ("raise the batch size"): batch 8192 of 8192-wide matmuls at the power cap. gloo_hang's
#   train moves 268 MB of gradients through the host each step (as train_gloo does), its GPU waiting
#   at low power: only PCIe traffic or the process list (two ranks) tells that from a small batch, so
#   a source with neither is blind to it there (an nvidia-smi query log);
#   not starvation: loader_hang's train reads its batches from a DataLoader that may keep it waiting;
# - straggler, imbalance: its ranks (torchrun_healthy, gloo_hang before the hang) share one GPU and
#   step together; no job of the corpus has a second GPU to be unequal on;
# - step_regression: its pace is steady (the job's own steps/s, ``stats``);
# - thermal, low_clocks, host_memory, gpu_errors: it runs at the pace the other runs do on this H200
#   (the recordings' clock-event reasons are only "idle" and the power cap, host RAM at most 4 %, no
#   XID or ECC event); an application XID would have ended its CUDA context.
_HEALTHY_WRONG = _NOT_RUNNING | frozenset({
    "memory_creep", "fragmentation", "oom", "other_process", "underuse", "straggler",
    "imbalance", "step_regression", "thermal", "low_clocks", "host_memory", "gpu_errors", "skipped_steps"})

LABELS: dict[str, Label] = {
    "startup": Label(ignore=True),
    # between a job's pauses its pause finding stays up (it judges minutes): true, not a false finding
    "train": Label(allow=_HEALTHY_ALLOW | {"pause"}, wrong=_HEALTHY_WRONG | {"precision"},
                   wrong_needs=(("underuse", _n("pcie", "process")),)),
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
    # its steps wait in the DataLoader: no pause of another kind (the pause finding says "no input wait")
    "input_bound": Label(("starvation",), allow=frozenset({"straggler"}),
                         wrong=frozenset({"underuse", "stall", "cpu_training", "power_cap", "pause"}),
                         needs=_n("process", "probe")),
    "underused": Label(("underuse",), wrong=frozenset({"starvation", "stall", "power_cap"}), needs=_n("power")),
    # the leaking jobs sync every step (the leak's allocation needs it): their steps really are slower
    "leak": Label(("memory_creep",), allow=frozenset({"power_cap", "fragmentation", "underuse", "step_regression"}),
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
    # a hang: no checkpoint, evaluation or compile holds it (a pause finding's advice is wrong beside it)
    "hung_collective": Label(("stall",), allow=frozenset({"idle_gpu"}),
                             wrong=frozenset({"underuse", "starvation", "pcie", "power_cap", "cpu_training", "pause"}),
                             needs=_n("probe", "process")),
    "hung_loader": Label(("stall",), allow=frozenset({"idle_gpu", "starvation"}),
                         wrong=frozenset({"underuse", "pcie", "power_cap", "cpu_training", "pause"}),
                         needs=_n("probe", "process")),
    "hung_loader_timeout": Label(("stall",), allow=frozenset({"idle_gpu", "starvation"}),
                                 wrong=frozenset({"underuse", "pcie", "power_cap", "cpu_training", "pause"}),
                                 needs=_n("probe", "process")),
    "idle": Label(("idle_gpu", "stall"), wrong=frozenset({"underuse", "starvation", "power_cap", "cpu_training"}),
                  needs=_n("process", "memory")),
    "cpu_train": Label(("cpu_training",), wrong=frozenset({"underuse", "starvation", "stall"}),
                       needs=_n("process")),
    "train_other": Label(("other_process",), allow=_HEALTHY_ALLOW, wrong=_NOT_RUNNING, needs=_n("process")),
    # another job computes on the same GPU: the job's steps are slower (the probe's step times say by
    # how much); the process list names the other job. Not underuse: the GPU is full, of two jobs.
    "train_contended": Label(("step_regression", "other_process"), allow=_HEALTHY_ALLOW | {"pause"},
                             wrong=_NOT_RUNNING | {"underuse", "memory_creep", "fragmentation", "oom"},
                             needs=_n("process")),
    # fp16 overflow: an inf loss every step, so the GradScaler skips every optimizer step while the GPU
    # computes at full pace. Not a stall (the loop runs: only the optimizer does not step), nor any
    # remedy for a slow or starved job; only the probe sees the scaler's decisions.
    "overflow": Label(("skipped_steps",), allow=_HEALTHY_ALLOW | {"pause"},
                      wrong=_NOT_RUNNING | {"underuse", "starvation", "memory_creep", "fragmentation", "oom",
                                            "other_process", "step_regression", "precision"},
                      needs=_n("probe")),
    # two ranks on one GPU: only the probe tells them apart
    "straggler_input": Label(("straggler", "starvation"), wrong=frozenset({"underuse", "stall", "power_cap"}),
                             needs=_n("probe")),
    "straggler_cpu": Label(("straggler",), wrong=frozenset({"underuse", "starvation", "stall", "power_cap"}),
                           needs=_n("probe")),
    "straggler_sleep": Label(("straggler",), wrong=frozenset({"underuse", "starvation", "stall", "power_cap"}),
                             needs=_n("probe")),
    # host RAM 96.5 % used (the job's own reading of /proc/meminfo, labelled from 95 % on) while it
    # trains at full pace: its GPU is busy, so nothing about the GPU is wrong; only the host's RAM is
    "host_memory": Label(("host_memory",), allow=_HEALTHY_ALLOW | {"pause"},
                         wrong=_NOT_RUNNING | {"underuse", "starvation", "memory_creep", "fragmentation", "oom",
                                               "other_process", "step_regression", "cpu_training"},
                         needs=_n("host")),
    # bf16 matmuls back to back, no optimizer: the GPU at full load, held at its power limit (the card's
    # clock-event reasons say so in every recording of it); the normal, informational finding
    "full_load": Label(("power_cap",), allow=frozenset({"pause"}),
                       wrong=_NOT_RUNNING | {"underuse", "starvation", "memory_creep", "fragmentation", "oom",
                                             "other_process", "thermal", "low_clocks", "host_memory", "gpu_errors"},
                       needs=_n("power")),
    # the job finished its work (done) or is gone (ended): every finding about it must end
    "done": Label(),
    "ended": Label(),
}


# The ledger bucket each label is (None: its time splits in a way the label does not say: a straggler
# phase's ranks wait for each other inside DDP's backward, copies and tiny kernels are steps of their own).
# A label whose job steps at its own pace is "train" (a leak, split blocks, a small batch, fp32: the
# ledger says where the time goes, not whether it is well spent). A hang is "stalled" from its start:
# the probe says so only after the stall threshold (max(30 s, 3x the usual step)), and what it says
# before (input, collective, other) counts against it; the score says so rather than hiding it.
BUCKET: dict[str, str | None] = {
    "startup": "startup", "train": "train", "train_gloo": "train", "train_fp32": "train", "train_other": "train", "train_contended": "train",
    "overflow": "train", "host_memory": "train", "full_load": None,
    "leak": "train", "fragmented": "train", "underused": "train", "oom": "train", "after_oom": "train",
    "eval": "eval", "checkpoint": "checkpoint", "barrier_wait": "collective", "compile": "compile",
    "input_bound": "input", "hung_collective": "stalled", "hung_loader": "stalled", "hung_loader_timeout": "stalled",
    "tiny_kernels": None, "pageable_copy": None, "pinned_copy": None, "idle": None, "cpu_train": "train",
    "straggler_input": None, "straggler_cpu": None, "straggler_sleep": None, "done": None, "ended": None,
}


def label(name: str) -> Label:
    try:
        return LABELS[name]
    except KeyError:
        raise KeyError(f"label {name!r} is not in bench/corpus_labels.py: say what it expects") from None


def carried(lab: Label, source: str, rule: str | None = None) -> bool:
    """Whether ``source`` can carry the signal ``lab``'s expected finding needs (with ``rule``: what
    tells that wrong finding from the truth)."""
    caps = CAPS[source]
    needs = dict(lab.wrong_needs).get(rule, lab.needs) if rule is not None else lab.needs
    return not needs or any(n <= caps for n in needs)
