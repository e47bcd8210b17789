"""A GPT training loop in the manner of nanoGPT (bf16 autocast, AdamW, gradient clipping), on
synthetic tokens: the load the monitors are measured under (bench/peer_cost.py --load nanogpt).

    python bench/workloads/nanogpt.py --seconds 120            # GPT-2 small (124M), batch 16 x 1024, on cuda
    python bench/workloads/nanogpt.py --device cpu --seconds 60  # a tiny one on one CPU thread

Batches are cut from a fixed random token stream in pinned memory and copied to the GPU as
nanoGPT's get_batch does; no data set, no download. Prints one line every ``--log-every`` steps.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, block: int, layers: int, heads: int, d: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--log-every", type=int, default=50)
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    if cuda:
        vocab, block, layers, heads, d, batch = 50304, 1024, 12, 12, 768, 16
        torch.backends.cuda.matmul.allow_tf32 = True
    else:
        torch.set_num_threads(1)
        vocab, block, layers, heads, d, batch = 512, 64, 2, 4, 64, 4
    torch.manual_seed(0)
    model = GPT(vocab, block, layers, heads, d).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=cuda)
    data = torch.randint(vocab, (block * batch * 64 + 1,), dtype=torch.int64)
    if cuda:
        data = data.pin_memory()
    ctx = torch.autocast(device_type="cuda" if cuda else "cpu", dtype=torch.bfloat16)
    start = time.monotonic()
    step = 0
    while time.monotonic() - start < args.seconds:
        at = torch.randint(len(data) - block - 1, (batch,))
        x = torch.stack([data[i:i + block] for i in at]).to(args.device, non_blocking=True)
        y = torch.stack([data[i + 1:i + 1 + block] for i in at]).to(args.device, non_blocking=True)
        lr = 6e-4 * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step, 5000) / 5000)))
        for g in opt.param_groups:
            g["lr"] = lr
        with ctx:
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step % args.log_every == 0:
            print(f"step {step} loss {loss.item():.3f} {step / (time.monotonic() - start):.1f} steps/s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
