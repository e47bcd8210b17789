"""Data starvation: the GPU waits for the input pipeline.

Signs: utilization that alternates between idle and busy (spiky), or low mean
utilization while loader workers or host cores are saturated. Point samples of
``utilization.gpu`` alias at low sampling rates, so where the source gives the
min/max of NVML's utilization sample buffer per tick, a tick that saw both idle
and busy counts as spiky on its own.
"""

from __future__ import annotations

from traintop.metrics import gpu_subject
from traintop.rules.collective import collective_waits, waits_for_another_host
from traintop.rules.declaration import HostRule
from traintop.rules.engine import HOLDS, LAPSED, REVERSED, WEAK, Verdict, RuleContext, Severity
from traintop.units import fmt_range
from traintop.attribution import WorkerLoad


def _idle_gaps(pairs: list[tuple[float, float]], idle: float) -> list[float]:
    """Durations of the runs of idle samples, bounded by busy ones."""
    gaps, start, prev_t = [], None, None
    for t, v in pairs:
        if v < idle:
            if start is None:
                start = prev_t if prev_t is not None else t
        elif start is not None:
            gaps.append(t - start)
            start = None
        prev_t = t
    return gaps


def _idle_to_busy(utils: list[float], idle: float, busy: float) -> int:
    """Idle-to-busy switches, passing through intermediate readings (0 -> 24 -> 100 counts once)."""
    state, n = None, 0
    for v in utils:
        if v < idle:
            state = "idle"
        elif v >= busy:
            if state == "idle":
                n += 1
            state = "busy"
    return n


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _quartiles(xs: list[float]) -> tuple[float, float]:
    s = sorted(xs)
    return s[len(s) // 4], s[(3 * len(s)) // 4]


class Starvation(HostRule):
    id = "starvation"
    title = "Data starvation"
    severity = Severity.WARNING
    defers_to = ("pcie", "stall")  # the copies to the GPU, or a hang, explain the gaps better than the loader
    explains = ("step_regression",)  # a starved job's steps are slower: the effect, said under its cause
    explains_all_gpus = True  # a rank's slower steps, whichever GPU starves (its ranks wait for each other)
    raise_after = 8.0
    clear_after = 15.0
    now_s = 12.0  # gaps of 1-2 s: a pattern needs a few of them
    WORKERS = "Raise DataLoader num_workers (try the number of free CPU cores per GPU)."
    remedies = (
        WORKERS,
        "Set pin_memory=True and persistent_workers=True; raise prefetch_factor.",
        "Move heavy CPU preprocessing out of the step: pre-process offline, or decode/augment on the GPU.",
        "Check the storage: local NVMe or a RAM cache instead of a network filesystem.",
        "Log, print and checkpoint less often inside the training loop.",
    )

    # The measured input wait over the last seconds: a job that is fed now ends the finding at once,
    # not when the 20 s mean has worn off (a starved loader makes the step wait every second or two).
    RECENT_WAIT_S = 5.0

    def evaluate(self, ctx: RuleContext):
        c = ctx.config
        w = c.starvation_window_s
        gpus_in_job = sum(1 for i in ctx.gpu_indices() if ctx.feed(i).pids)
        in_collective = collective_waits(ctx, c.straggler_window_s)
        for i in ctx.gpu_indices():
            subject = gpu_subject(i)
            pairs = ctx.gpu_pairs(i, "util", w, min_n=8, min_span=0.5)
            if not pairs or any(ctx.is_holding(r, subject) for r in self.defers_to):
                continue  # too little history, or the copies to the GPU explain the gaps better than the loader
            if (in_collective is not None and i in in_collective.waiting) or waits_for_another_host(ctx, i, w):
                continue  # it waits for another rank (the straggler rule, here or across hosts), not for its own input
            active = ctx.is_active(self.id, subject)
            utils = [v for _, v in pairs]
            n = len(utils)
            mu = sum(utils) / n
            idle_frac = sum(1 for v in utils if v < c.starvation_idle_util) / n
            busy_frac = sum(1 for v in utils if v >= c.starvation_busy_util) / n
            transitions = _idle_to_busy(utils, c.starvation_idle_util, c.starvation_busy_util)
            lows, highs = dict(ctx.gpu_pairs(i, "util_min", w)), ctx.gpu_pairs(i, "util_max", w)
            windowed = [(lows[t], hi) for t, hi in highs if t in lows]
            spiky_ticks = sum(1 for lo, hi in windowed
                              if lo < c.starvation_idle_util and hi >= c.starvation_busy_util)
            spiky_tick_frac = spiky_ticks / len(windowed) if windowed else 0.0

            def is_spiky(relax: float) -> bool:
                return (idle_frac >= c.starvation_min_idle_frac * relax and busy_frac >= c.starvation_min_busy_frac
                        and transitions >= 3) or spiky_tick_frac >= 0.3 * relax

            spiky = is_spiky(0.5 if active else 1.0)
            load = ctx.worker_load(i)
            # host-wide signs cannot say which GPU they starve: only for a job on one GPU
            cpu_note = load.sentence() if load.saturated else (
                self._host_evidence(ctx) if gpus_in_job <= 1 else None)
            wait = ctx.input_wait(i, w)
            recent_wait = ctx.input_wait(i, self.RECENT_WAIT_S)
            probe_says_fed = any(x is not None and x < c.starvation_fed_input_wait for x in (recent_wait, wait))
            low_util_cpu_bound = mu < 60.0 and cpu_note is not None and mu >= 1.0
            holds = mu <= 90.0 and (is_spiky(1.0) or low_util_cpu_bound)
            weak = mu <= 90.0 and spiky
            if probe_says_fed:
                # The probe says the loader keeps up: whatever the utilization and CPU say, this
                # GPU is not starved by it (underuse, PCIe or a straggler explain it better).
                holds = weak = False
            elif wait is not None and wait >= c.starvation_input_wait:
                holds = True  # the probe measured it: the job waits for its input
            if not (holds or weak):
                if active:
                    yield self._since(ctx, i, mu, recent_wait, wait, probe_says_fed)
                continue
            if spiky:
                gaps = _idle_gaps(pairs, c.starvation_idle_util)
                if idle_frac > 0 and len(gaps) >= 2:
                    lo, hi = _quartiles(gaps)
                    text = (f"GPU {i} idle {idle_frac * 100:.0f} % of the last {w:.0f} s "
                            f"in {fmt_range(lo, hi)} gaps (mean utilization {mu:.0f} %)")
                else:
                    # the chart shows each period's mean; NVML's own samples inside the periods swing
                    text = (f"GPU {i} swings between idle and busy inside {spiky_tick_frac * 100:.0f} % of its "
                            f"sampling periods over the last {w:.0f} s (NVML's utilization samples within each "
                            f"period; the chart shows their mean, {mu:.0f} %)")
            elif mu < 60.0:
                text = f"GPU {i} averages only {mu:.0f} % utilization over the last {w:.0f} s"
            else:
                text = f"GPU {i} reads {mu:.0f} % utilization over the last {w:.0f} s"
            if cpu_note:
                text += f" while {cpu_note}"
            if wait is not None:
                ranks = [r for _, r in ctx.feed(i).ranks]
                who = " and ".join(r.label for r in ranks) if any(r.rank is not None for r in ranks) else "the job"
                text += (f"; {who} waits for its next batch {wait * 100:.0f} % of the time over the last {w:.0f} s"
                         " (measured in the job)")
            yield Verdict(subject, text, state=HOLDS if holds else WEAK,
                          remedies=(self._workers(ctx, gpus_in_job),) + self.remedies[1:])
        yield from self._ranks_on_no_gpu(ctx)

    def _ranks_on_no_gpu(self, ctx: RuleContext):
        """A rank on no GPU (a CPU job, a host whose GPUs traintop cannot see): the input wait the probe
        measured in the job decides, as it does beside a GPU."""
        c = ctx.config
        w = c.starvation_window_s
        on_gpus = {subject for i in ctx.gpu_indices() for subject, _ in ctx.feed(i).ranks}
        process = ctx.store.latest.process if ctx.store.latest is not None else None
        load = WorkerLoad(process.loader_workers if process is not None else (), c.starvation_busy_worker_cpu)
        for subject, r in ctx.ranks():
            if subject in on_gpus or r.loader is False:
                continue
            waits = ctx.rank_window(subject, "input_wait", w)
            if len(waits) < 3:
                continue
            recent = ctx.rank_window(subject, "input_wait", self.RECENT_WAIT_S) or waits
            wait, now = sum(waits) / len(waits), sum(recent) / len(recent)
            measured = (f"waits for its next batch {wait * 100:.0f} % of the time over the last {w:.0f} s, "
                        f"{now * 100:.0f} % over the last {self.RECENT_WAIT_S:.0f} s (measured in the job)")
            if wait >= c.starvation_input_wait and now >= c.starvation_fed_input_wait:
                text = f"{r.label} (on no GPU) {measured}"
                yield Verdict(subject, text + (f", while {load.sentence()}" if load.saturated else ""),
                              remedies=(self._workers_on_cpu(ctx),) + self.remedies[1:])
            elif ctx.is_active(self.id, subject):
                fed = now < c.starvation_fed_input_wait
                yield Verdict(subject, f"{r.label} no longer starved: it {measured}", state=REVERSED if fed else LAPSED)

    def _since(self, ctx: RuleContext, i: int, mu: float, recent_wait: float | None, wait: float | None,
               probe_says_fed: bool) -> Verdict:
        """A raised alert whose condition no longer holds: plainly fed now (the measured wait far
        below the threshold, or the GPU busy without a gap for seconds) ends it at once."""
        c = ctx.config
        recent = ctx.gpu_window(i, "util", 5.0)
        fed = probe_says_fed or (
            len(recent) >= 3 and min(recent) >= c.starvation_busy_util and sum(recent) / len(recent) >= 90.0)
        text = f"GPU {i} no longer starved: mean utilization {mu:.0f} % over the last {c.starvation_window_s:.0f} s"
        x, span = (recent_wait, self.RECENT_WAIT_S) if recent_wait is not None else (wait, c.starvation_window_s)
        if x is not None:
            text += f"; the job waits for its next batch {x * 100:.0f} % of the time over the last {span:.0f} s (measured in the job)"
        return Verdict(gpu_subject(i), text, state=REVERSED if fed else LAPSED)

    @classmethod
    def _workers_on_cpu(cls, ctx: RuleContext) -> str:
        """The loader-worker advice for a job that computes on the CPU: its own threads need the
        cores its workers would take, so no count to try, only this machine's numbers."""
        host, job = ctx.host, ctx.process
        cores = len(host.per_core) if host is not None else 0
        if not cores:
            return "Raise DataLoader num_workers where CPU cores are free."
        workers = len(job.loader_workers) if job is not None and job.alive else None
        now = "" if workers is None else f"; {_count(workers, 'worker')} now" if workers else "; num_workers=0 now"
        return (f"Raise DataLoader num_workers only as far as CPU cores are free: this host has {cores}, and a job "
                f"that computes on the CPU needs them for its own threads too{now}.")

    @classmethod
    def _workers(cls, ctx: RuleContext, gpus: int) -> str:
        """The loader-worker advice with this machine's numbers where they are known: the host's
        cores, less one for each training process and one for the system, shared by the GPUs in
        use; the attached job's workers now. Without them, the advice as a rule of thumb."""
        host, job = ctx.host, ctx.process
        cores = len(host.per_core) if host is not None else 0
        if not cores or gpus < 1:
            return cls.WORKERS
        per_gpu = "per GPU" if gpus > 1 else ""
        if job is None or not job.alive:
            return (f"Raise DataLoader num_workers (try the number of free CPU cores per GPU: this host has "
                    f"{cores} for {_count(gpus, 'GPU')} in use).")
        workers = len(job.loader_workers)
        ranks = max(gpus, sum(len(ctx.feed(i).main) for i in ctx.gpu_indices()))
        room = (cores - ranks - 1) // gpus
        now = f"{_count(workers, 'worker')} {'in all ' if gpus > 1 else ''}now" if workers else "num_workers=0 now"
        training = "the training process" if ranks == 1 else f"{ranks} training processes"
        if room <= workers / gpus:
            return (f"Raise DataLoader num_workers only where CPU cores are free: this host's {cores} cores already run "
                    f"{training} and {_count(workers, 'loader worker') if workers else 'no loader worker'} "
                    f"(for {_count(gpus, 'GPU')}); else make each worker's work cheaper (below).")
        why = f"this host's {cores} CPU cores, less {ranks} for {training} and 1 for the system, over {_count(gpus, 'GPU')}"
        return f"Raise DataLoader num_workers (try {room}{' ' + per_gpu if per_gpu else ''}: {why}; {now})."

    @staticmethod
    def _host_evidence(ctx: RuleContext) -> str | None:
        w = ctx.config.starvation_window_s
        iowait = ctx.host_window("iowait", w)
        if iowait and (m := sum(iowait) / len(iowait)) >= 20:
            return f"the host waits on I/O {m:.0f} % of the time"
        cpu = ctx.host_window("cpu_percent", w)
        if cpu and (m := sum(cpu) / len(cpu)) >= 90:
            return f"host CPU is at {m:.0f} %"
        return None
