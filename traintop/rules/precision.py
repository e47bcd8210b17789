"""Training in full fp32: the SMs are busy and the tensor cores idle.

An H100/H200's tensor cores do bf16 matmuls about 15 times faster than its fp32 units, and TF32
ones about 7 times (docs/GOODPUT.md's table). A job whose matmuls run in fp32 (TF32 off, no
autocast) reads 100 % utilization and full power while the tensor cores sit idle: the guide's
"high utilization but slow steps". GPM says the SMs are busy and the tensor cores idle; the probe
says what the job's matmuls run in (read on its training thread: autocast is thread-local). With
the probe it is stated; from GPM alone it is a likelihood. Never raised for a job in bf16, fp16
or TF32.
"""

from __future__ import annotations

from traintop.metrics import gpu_subject
from traintop.rules.declaration import HostRule
from traintop.rules.engine import Verdict, RuleContext, Severity


class FullPrecision(HostRule):
    id = "precision"
    title = "Training in full fp32"
    severity = Severity.WARNING  # a likelihood (no probe reading) is information
    raise_after = 5.0
    clear_after = 10.0
    remedies = (
        "Mixed precision: wrap the forward pass and the loss in torch.autocast('cuda', dtype=torch.bfloat16) "
        "(no GradScaler needed with bf16).",
        "Or allow TF32 for fp32 matmuls: torch.backends.cuda.matmul.fp32_precision = 'tf32' "
        "(older torch: torch.backends.cuda.matmul.allow_tf32 = True, or "
        "torch.set_float32_matmul_precision('high')).",
        "Check that the model's own code does not cast back to float32 inside autocast (.float() calls).",
    )

    def evaluate(self, ctx: RuleContext):
        c = ctx.config
        w = c.precision_window_s
        for g in ctx.gpus():
            i = g.index
            sm = ctx.gpu_pairs(i, "sm_active", w, min_n=3, min_span=0.33)
            tensor = ctx.gpu_window(i, "tensor_active", w)
            if not sm or not tensor:
                continue  # no GPM here: nothing to tell fp32 from a tensor-core job
            sm_mean = sum(v for _, v in sm) / len(sm)
            t_mean = sum(tensor) / len(tensor)
            if sm_mean < c.precision_min_sm_active or t_mean > c.precision_max_tensor_active:
                continue
            recent_t = ctx.gpu_window(i, "tensor_active", min(w, 5.0))
            if recent_t and max(recent_t) > c.precision_max_tensor_active:
                continue  # the tensor cores work now
            ranks = ctx.feed(i).ranks
            modes = {r.matmul_mode for _, r in ranks if r.matmul_mode is not None}
            if modes and modes != {"fp32"}:
                continue  # the probe says bf16, fp16 or TF32: the idle tensor cores are the job's own choice
            text = (f"GPU {i}: SMs busy {sm_mean:.0f} % but tensor cores {t_mean:.1f} % active over the last "
                    f"{w:.0f} s")
            if modes == {"fp32"}:
                who = ", ".join(r.label for _, r in ranks if r.matmul_mode == "fp32")
                text += f"; {who} runs its matmuls in fp32 (no autocast, TF32 off: read in the job)"
                text += self._achieved(ranks)
                yield Verdict(gpu_subject(i), text, Severity.WARNING)
            else:
                text += ("; likely fp32 matmuls with TF32 off (no probe in this job to read its precision: "
                         "traintop run -- CMD tells)")
                yield Verdict(gpu_subject(i), text, Severity.INFO)

    @staticmethod
    def _achieved(ranks) -> str:
        """'; its steps run 41.0 TFLOP/s' where the probe counted a step's FLOPs (the panel's MFU sets it
        against the GPU's peak)."""
        for _, r in ranks:
            if r.step_flops and r.steps_per_s:
                return f"; its steps run {r.step_flops * r.steps_per_s / 1e12:.1f} TFLOP/s"
        return ""
