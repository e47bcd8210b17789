"""Training on the CPU: a busy job that holds no GPU memory."""

from __future__ import annotations

from traintop.rules.engine import Finding, RuleContext, Severity


class TrainingOnCpu:
    id = "cpu_training"
    title = "Training on the CPU?"
    severity = Severity.WARNING
    raise_after = 15.0
    clear_after = 20.0
    remedies = (
        "Check torch.cuda.is_available() in the job's environment (a CPU-only torch build, a driver problem, "
        "or CUDA_VISIBLE_DEVICES hiding the GPUs).",
        "Move the model and every batch to the GPU: model.to('cuda'), x = x.to('cuda', non_blocking=True).",
        "Run `traintop doctor` for the whole preflight.",
    )

    def evaluate(self, ctx: RuleContext):
        c = ctx.config
        frame, proc = ctx.frame, ctx.process
        if proc is None or not proc.alive:
            return
        cpu = ctx.proc_window("cpu_percent", c.cpu_training_window_s)
        if len(cpu) < 5 or sum(cpu) / len(cpu) < c.cpu_training_min_cpu:
            return
        pids = {m.pid for m in proc.members} | {proc.pid}
        on_gpu = any(p.pid in pids and (p.used_bytes or 1) > 0 for g in frame.gpus for p in g.processes)
        probed_cuda = any(r.cuda for r in frame.ranks)
        if on_gpu or probed_cuda:
            return
        if not frame.ranks and not frame.gpus:
            return  # no GPU visible and no probe: nothing to compare with
        mean_cpu = sum(cpu) / len(cpu)
        text = f"PID {proc.pid} ({proc.name}) uses {mean_cpu:.0f} % CPU"
        if frame.ranks:
            steps = max((r.steps or 0) for r in frame.ranks)
            text += f" and has taken {steps} optimizer steps, but its probe reports no CUDA use"
        else:
            text += f" but holds no memory on any of the {len(frame.gpus)} GPU(s)"
        yield Finding("process", text)
