"""Corpus workloads on the frameworks people train with, labelled from the frameworks' own hooks.

Each scenario is a job written the way its framework's users write it: a nanoGPT-style GPT-2 with and
without ``torch.compile`` (``estimate_loss()`` with ``model.eval()``/``torch.no_grad()``, ``torch.save``
checkpoints, gradient accumulation), transformers' ``Trainer`` with eval and save steps, Lightning in
fp32 and bf16-mixed, an Accelerate loop with gradient accumulation, and an image pipeline decoding
real JPEGs with too few and with enough DataLoader workers. The phases come from the framework's
own hooks (a ``Trainer`` subclass's ``evaluate``/``_save_checkpoint``, Lightning callbacks,
Accelerate's ``save_state``), written with ``corpus.Labels`` (same format: bench/workloads/corpus.py),
and each timed phase ends with a ``stats`` line: the FLOPs of one optimizer step counted by hand
(6·parameters·tokens plus attention, as nanoGPT and PaLM count; convolutions by the layer
formula), for the MFU score.

    python bench/workloads/frameworks.py nanogpt_compiled --labels run.labels.jsonl
    python bench/workloads/frameworks.py hf_trainer --cpu --labels /tmp/l.jsonl   # a dry run

Each scenario also prints its own figures at the end (its MFU estimate, eval and save seconds,
dynamo's counters), the way its users would read them.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import sys
import tempfile
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import Labels  # noqa: E402

H200_PEAK = {"bf16": 989.5e12, "fp16": 989.5e12, "tf32": 494.5e12, "fp32": 67e12}
CPU = False  # --cpu: tiny sizes on the CPU


def device() -> torch.device:
    return torch.device("cpu" if CPU else "cuda")


def n(gpu: int, cpu: int) -> int:
    return cpu if CPU else gpu


def report(**figures) -> None:
    """What the job says about itself, as its users would read it (one JSON line)."""
    print("JOB " + json.dumps(figures), flush=True)


def stats(L: Labels, steps: int, seconds: float, flops: float, matmul: str) -> None:
    L._write({"event": "stats", "phase": L.phase, "steps": steps, "seconds": seconds, "flops_hand": flops,
              "matmul": matmul})


# -- nanoGPT ------------------------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.h, self.c_attn, self.c_proj = h, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(d), CausalSelfAttention(d, h), nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, layers: int, heads: int, d: int, block: int, vocab: int) -> None:
        super().__init__()
        self.layers, self.heads, self.d, self.block = layers, heads, d, block
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f, self.lm_head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.wte.weight = self.lm_head.weight  # tied, as GPT-2

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))

    def flops_per_token(self, T: int) -> float:
        """nanoGPT's estimate_mfu: 6N + 12·L·H·Q·T (N without the position embeddings)."""
        params = sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()
        return 6 * params + 12 * self.layers * self.heads * (self.d // self.heads) * T


def _nanogpt(L: Labels, a, compiled: bool, accum: int) -> None:
    torch.manual_seed(0)
    layers, heads, d, T, vocab = (12, 12, 768, 1024, 50304) if not CPU else (2, 2, 64, 64, 512)
    B = n(16 // accum, 2)
    model = GPT(layers, heads, d, T, vocab).to(device())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=not CPU)
    run = torch.compile(model) if compiled else model
    data = torch.randint(0, vocab, (64, T + 1), device=device())

    def batch():
        i = torch.randint(0, 64, (B,), device=device())
        chunk = data[i]
        return chunk[:, :-1], chunk[:, 1:]

    ctx = torch.autocast(device().type, dtype=torch.bfloat16)

    @torch.no_grad()
    def estimate_loss(iters: int) -> float:
        run.eval()
        losses = []
        for _ in range(iters):
            x, y = batch()
            with ctx:
                losses.append(run(x, y).item())
        run.train()
        return sum(losses) / len(losses)

    flops_step = model.flops_per_token(T) * T * B * accum
    eval_s = save_s = 0.0
    steps = 0

    def train_for(seconds: float) -> None:
        nonlocal steps
        t0, k = time.time(), 0
        while time.time() - t0 < seconds:
            for _ in range(accum):
                x, y = batch()
                with ctx:
                    loss = run(x, y) / accum
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            k += 1
            if k % 10 == 0:
                loss.item()  # nanoGPT logs every log_interval: the one sync
        torch.cuda.synchronize() if not CPU else None
        stats(L, k, time.time() - t0, flops_step, "bf16")
        steps += k

    L("compile" if compiled else "train")
    t0 = time.time()
    for _ in range(3):  # the first steps compile (or warm the allocator)
        x, y = batch()
        with ctx:
            loss = run(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    loss.item()
    compile_s = time.time() - t0
    ckpt = os.path.join(os.environ.get("CORPUS_SCRATCH", tempfile.gettempdir()), f"nanogpt-{os.getpid()}.pt")
    try:
        for rnd in range(2):
            L("train")
            train_for(a.scale * 18)
            L("eval")
            t0 = time.time()
            estimate_loss(n(100, 5))
            eval_s += time.time() - t0
            L("checkpoint")
            t0 = time.time()
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, ckpt)
            save_s += time.time() - t0
        L("train")
        train_for(a.scale * 10)
    finally:
        if os.path.exists(ckpt):
            os.unlink(ckpt)
    figures = {"scenario": L.scenario, "steps": steps, "compile_s": round(compile_s, 1), "eval_s": round(eval_s, 2),
               "save_s": round(save_s, 2), "flops_per_step": flops_step}
    if compiled:
        from torch._dynamo.utils import counters
        figures.update(graphs=counters["stats"]["unique_graphs"], graph_breaks=sum(counters["graph_break"].values()),
                       recompiles=sum(counters["recompiles"].values()))
    report(**figures)


def nanogpt_compiled(L, a):
    _nanogpt(L, a, compiled=True, accum=1)


def nanogpt_eager_accum(L, a):
    _nanogpt(L, a, compiled=False, accum=4)


# -- transformers' Trainer ------------------------------------------------------------------------
def hf_trainer(L, a):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    T = n(512, 64)
    cfg = GPT2Config(n_layer=n(6, 2), n_head=n(8, 2), n_embd=n(512, 64), n_positions=T, vocab_size=n(32000, 512))
    model = GPT2LMHeadModel(cfg)

    class Tokens(torch.utils.data.Dataset):
        def __init__(self, count: int) -> None:
            g = torch.Generator().manual_seed(0)
            self.ids = torch.randint(0, cfg.vocab_size, (count, T), generator=g)

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    B = n(16, 2)
    params = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
    flops_step = (6 * params + 12 * cfg.n_layer * cfg.n_embd * T) * T * B
    times = {"eval": 0.0, "checkpoint": 0.0}

    class Labelled(Trainer):
        """Phases from Trainer's own methods: its evaluation and its checkpoint saving."""

        def evaluate(self, *args, **kwargs):
            L("eval")
            t0 = time.time()
            try:
                return super().evaluate(*args, **kwargs)
            finally:
                times["eval"] += time.time() - t0
                L("train")

        def _save_checkpoint(self, *args, **kwargs):
            L("checkpoint")
            t0 = time.time()
            try:
                return super()._save_checkpoint(*args, **kwargs)
            finally:
                times["checkpoint"] += time.time() - t0
                L("train")

    class FirstStep(TrainerCallback):
        """Trainer's set-up (its loaders, the model moved, the optimizer made) is start-up: training
        begins with the first optimizer step."""

        def on_step_end(self, args, state, control, **kwargs):
            if L.phase == "startup":
                L("train")
                times["first_step"] = time.time()

    out = tempfile.mkdtemp(prefix="hf-trainer-", dir=os.environ.get("CORPUS_SCRATCH"))
    args = TrainingArguments(
        output_dir=out, max_steps=n(400, 30), per_device_train_batch_size=B, per_device_eval_batch_size=B,
        eval_strategy="steps", eval_steps=n(80, 10), save_strategy="steps", save_steps=n(80, 10),
        save_total_limit=1, bf16=not CPU, use_cpu=CPU, logging_steps=10_000, report_to=[], dataloader_num_workers=2,
        learning_rate=3e-4, disable_tqdm=True)
    L("startup")
    trainer = Labelled(model=model, args=args, train_dataset=Tokens(n(8192, 128)), eval_dataset=Tokens(n(512, 16)),
                       callbacks=[FirstStep()])
    t0 = time.time()
    trainer.train()
    wall = time.time() - t0
    # its steps' time: from the first step's end (Trainer's set-up before it is start-up, as labelled)
    train_s = time.time() - times.get("first_step", t0) - times["eval"] - times["checkpoint"]
    stats(L, args.max_steps - 1 if "first_step" in times else args.max_steps, train_s, flops_step, "bf16" if not CPU else "fp32")
    peak = H200_PEAK["bf16"]
    report(scenario="hf_trainer", steps=args.max_steps, eval_s=round(times["eval"], 2),
           save_s=round(times["checkpoint"], 2), wall_s=round(wall, 1), flops_per_step=flops_step,
           mfu_of_steps=round(flops_step * args.max_steps / train_s / peak, 4))


# -- Lightning ---------------------------------------------------------------------------------------
def _lightning(L, a, precision: str) -> None:
    import lightning as pl

    d, B, T = n(1024, 32), n(64, 4), n(256, 16)

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.Sequential(*(nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
                                          for _ in range(4)))

        def forward(self, x):
            return self.layers(x)

        def training_step(self, batch, i):
            return self(batch).float().pow(2).mean()

        def validation_step(self, batch, i):
            self.log("val", self(batch).float().pow(2).mean())

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    class Phases(pl.Callback):
        def on_train_start(self, trainer, module):
            L("train_fp32" if precision == "32-true" else "train")

        def on_validation_start(self, trainer, module):
            if not trainer.sanity_checking:
                L("eval")

        def on_validation_end(self, trainer, module):
            if not trainer.sanity_checking:
                L("train_fp32" if precision == "32-true" else "train")

        def on_save_checkpoint(self, trainer, module, checkpoint):
            L("checkpoint")

        def on_train_batch_start(self, trainer, module, batch, i):
            if L.phase == "checkpoint":
                L("train_fp32" if precision == "32-true" else "train")

    # the batches already on the GPU: a job bound by nothing but its steps
    data = torch.randn(n(512, 16), T, d, device=device())
    loader = torch.utils.data.DataLoader(list(data), batch_size=B, num_workers=0)
    flops_step = 6 * B * T * 4 * 2 * d * 4 * d  # 4 blocks of two d x 4d matmuls, forward and backward
    from lightning.pytorch.callbacks import ModelCheckpoint

    ckpt = ModelCheckpoint(dirpath=tempfile.mkdtemp(prefix="pl-", dir=os.environ.get("CORPUS_SCRATCH")),
                           every_n_train_steps=n(300, 20), save_top_k=-1)
    trainer = pl.Trainer(accelerator="cpu" if CPU else "gpu", devices=1, precision=precision,
                         max_time={"seconds": a.scale * n(40, 8)}, max_epochs=10_000,
                         val_check_interval=n(300, 20), check_val_every_n_epoch=None, limit_val_batches=n(60, 4),
                         callbacks=[Phases(), ckpt],
                         logger=False, enable_progress_bar=False, num_sanity_val_steps=0)
    L("startup")
    trainer.fit(Net(), loader, loader)
    matmul = "fp32" if precision == "32-true" else "bf16"
    if torch.backends.cuda.matmul.allow_tf32 and matmul == "fp32":
        matmul = "tf32"
    report(scenario=f"lightning_{precision}", steps=trainer.global_step, flops_per_step=flops_step, matmul=matmul)


def lightning_fp32(L, a):
    _lightning(L, a, "32-true")


def lightning_bf16(L, a):
    _lightning(L, a, "bf16-mixed")


# -- Accelerate -------------------------------------------------------------------------------------
def accelerate_accum(L, a):
    from accelerate import Accelerator

    accum = 4
    acc = Accelerator(mixed_precision="no" if CPU else "bf16", gradient_accumulation_steps=accum, cpu=CPU)
    d, B = n(2048, 32), n(256, 4)
    model = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.GELU(), nn.Linear(d, d))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    xs = torch.randn(n(2048, 64), d)
    loader = torch.utils.data.DataLoader(xs, batch_size=B, shuffle=True, num_workers=2)
    model, opt, loader = acc.prepare(model, opt, loader)
    flops_step = 6 * B * (d * 4 * d * 2 + d * d) * accum
    out = tempfile.mkdtemp(prefix="accelerate-", dir=os.environ.get("CORPUS_SCRATCH"))
    L("train")
    end, steps, t_train, t0 = time.time() + a.scale * n(40, 8), 0, 0.0, time.time()
    # the job's own account: each 2 s, input-bound when it waited for its batches most of the time
    mark, waited = time.time(), 0.0
    while time.time() < end:
        it = iter(loader)
        while True:
            w0 = time.time()
            x = next(it, None)
            waited += time.time() - w0
            if x is None:
                break
            if time.time() - mark >= 2.0 and L.phase in ("train", "input_bound"):
                phase = "input_bound" if waited / (time.time() - mark) >= 0.5 else "train"
                if phase != L.phase:
                    L(phase)
                mark, waited = time.time(), 0.0
            with acc.accumulate(model):
                loss = model(x).float().pow(2).mean()
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
            if acc.sync_gradients:
                steps += 1
                if steps % n(150, 10) == 0:
                    t_train += time.time() - t0
                    L("eval")
                    model.eval()
                    with torch.no_grad():
                        for _ in range(n(60, 3)):
                            model(xs[:B].to(acc.device)).sum().item()
                    model.train()
                    L("checkpoint")
                    acc.save_state(out)
                    L("train")
                    t0, mark, waited = time.time(), time.time(), 0.0
            if time.time() >= end:
                break
    t_train += time.time() - t0
    stats(L, steps, t_train, flops_step, "bf16" if not CPU else "fp32")
    report(scenario="accelerate_accum", steps=steps, flops_per_step=flops_step)


# -- an image pipeline decoding real JPEGs -------------------------------------------------------------
def _jpegs(count: int, size: int) -> list[bytes]:
    from PIL import Image

    rng = random.Random(0)
    out = []
    for k in range(count):
        img = Image.effect_noise((size, size), 64 + k % 64).convert("RGB")
        shifts = [rng.randint(0, 80) for _ in range(3)]
        img = Image.merge("RGB", [c.point([min(255, v + s) for v in range(256)]) for c, s in zip(img.split(), shifts)])
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


class JpegFolder(torch.utils.data.Dataset):
    """Decodes a JPEG, random-resized-crops it to 224, flips it, normalises it: all on the CPU."""

    def __init__(self, files: list[bytes], crop: int) -> None:
        self.files, self.crop = files, crop

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        from PIL import Image

        img = Image.open(io.BytesIO(self.files[i % len(self.files)])).convert("RGB")
        w, h = img.size
        s = random.uniform(0.35, 1.0)
        cw, ch = int(w * math.sqrt(s)), int(h * math.sqrt(s))
        x0, y0 = random.randint(0, w - cw), random.randint(0, h - ch)
        img = img.crop((x0, y0, x0 + cw, y0 + ch)).resize((self.crop, self.crop), Image.BILINEAR)
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        t = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(self.crop, self.crop, 3)
        return (t.permute(2, 0, 1).float() / 255 - 0.45) / 0.225, i % 1000


def _convnet(width: int) -> nn.Sequential:
    """A ResNet-ish stack of 3x3 convolutions (no torchvision needed)."""
    layers, c = [nn.Conv2d(3, width, 7, stride=2, padding=3), nn.BatchNorm2d(width), nn.ReLU()], width
    for k, out in enumerate((width, 2 * width, 4 * width, 8 * width)):
        layers += [nn.Conv2d(c, out, 3, stride=1 if k == 0 else 2, padding=1), nn.BatchNorm2d(out), nn.ReLU(),
                   nn.Conv2d(out, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU()]
        c = out
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 1000))


def conv_flops(model: nn.Module, shape) -> float:
    """FLOPs of one forward pass by the layer formula: 2·Cin·Cout·k²·Hout·Wout per convolution (and
    2·in·out per linear layer), from the output shapes a dry pass gives on the meta device."""
    total = 0.0

    def hook(m, inp, out):
        nonlocal total
        if isinstance(m, nn.Conv2d):
            kh, kw = m.kernel_size
            total += 2 * m.in_channels // m.groups * m.out_channels * kh * kw * out.shape[-2] * out.shape[-1] \
                * out.shape[0]
        elif isinstance(m, nn.Linear):
            total += 2 * m.in_features * m.out_features * out.shape[0]

    meta = _convnet(model[0].out_channels).to("meta")
    handles = [m.register_forward_hook(hook) for m in meta.modules()]
    meta(torch.empty(shape, device="meta"))
    for h in handles:
        h.remove()
    return total


def _jpeg(L, a, workers: int) -> None:
    crop, B = n(224, 32), n(128, 4)
    files = _jpegs(n(512, 16), n(256, 64))
    model = _convnet(n(192, 8)).to(device(), memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = torch.utils.data.DataLoader(JpegFolder(files, crop), batch_size=B, num_workers=workers,
                                         pin_memory=not CPU, persistent_workers=workers > 0, prefetch_factor=2
                                         if workers else None)
    flops_step = 3 * conv_flops(model, (B, 3, crop, crop))
    ctx = torch.autocast(device().type, dtype=torch.bfloat16)
    it = iter(loader)
    L("startup")
    next(it)  # the workers start
    # the job's own account: each 2 s, input-bound when it waited for its batches most of the time
    L("train")
    t0, steps, end = time.time(), 0, time.time() + a.scale * n(35, 6)
    mark, waited, waited_all = time.time(), 0.0, 0.0
    while time.time() < end:
        w0 = time.time()
        x, y = next(it)
        waited += time.time() - w0
        waited_all += time.time() - w0
        if time.time() - mark >= 2.0:
            phase = "input_bound" if waited / (time.time() - mark) >= 0.5 else "train"
            if phase != L.phase:
                L(phase)
            mark, waited = time.time(), 0.0
        x = x.to(device(), non_blocking=True).to(memory_format=torch.channels_last)
        y = y.to(device(), non_blocking=True)
        with ctx:
            loss = nn.functional.cross_entropy(model(x).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps += 1
        if steps % 20 == 0:
            loss.item()
    torch.cuda.synchronize() if not CPU else None
    # its iterations' time, the waits for batches included (as nanoGPT times an iteration for its MFU)
    stats(L, steps, time.time() - t0, flops_step, "bf16" if not CPU else "fp32")
    report(scenario=f"jpeg_{workers}_workers", steps=steps, images_per_s=round(steps * B / (time.time() - t0), 1),
           flops_per_step=flops_step)


def jpeg_few_workers(L, a):
    _jpeg(L, a, workers=1)


def jpeg_enough_workers(L, a):
    _jpeg(L, a, workers=n(12, 2))


SCENARIOS = {f.__name__: f for f in (nanogpt_compiled, nanogpt_eager_accum, hf_trainer, lightning_fp32,
                                     lightning_bf16, accelerate_accum, jpeg_few_workers, jpeg_enough_workers)}


def main() -> int:
    global CPU
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--labels", help="append the job's own phase labels (JSON lines) here")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every phase's length")
    ap.add_argument("--cpu", action="store_true", help="a dry run on the CPU at tiny sizes")
    a = ap.parse_args()
    CPU = a.cpu
    rank = int(os.environ["RANK"]) if "RANK" in os.environ else None
    L = Labels(a.labels, rank)
    L.scenario = a.scenario
    SCENARIOS[a.scenario](L, a)
    L("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
