#!/usr/bin/python3
"""PyTorch eager baseline for bench/cuda_step_bench: the same GPT (pre-LayerNorm blocks, tanh
GELU, untied head) written as a PyTorch user would (scaled_dot_product_attention with is_causal,
autocast to bf16/fp16 or plain fp32, fused AdamW), one training step timed on the GPU, eager or
with --compile (torch.compile of the model).
Prints: torch_tokens_per_s=<x> and torch_peak_gib=<peak allocated>."""
import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--layers", type=int, default=2)
p.add_argument("--batch", type=int, default=1)
p.add_argument("--precision", default="bf16")
p.add_argument("--steps", type=int, default=5)
p.add_argument("--whole", action="store_true", help="with embeddings and head (else a middle stage)")
p.add_argument("--compile", action="store_true", help="torch.compile the model")
a = p.parse_args()
C, H, T, V = 2048, 16, 2048, 50257
dev = "cuda"
torch.backends.cuda.matmul.allow_tf32 = False


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B = x.shape[0]
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(a.layers))
        if a.whole:
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            self.ln_f, self.head = nn.LayerNorm(C), nn.Linear(C, V, bias=False)

    def forward(self, x):
        if a.whole:
            x = self.wte(x) + self.wpe(torch.arange(T, device=dev))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x)) if a.whole else x


model = Model().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
step_model = torch.compile(model) if a.compile else model
dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision, torch.float32)
scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
if a.whole:
    x = torch.randint(0, V, (a.batch, T), device=dev)
    y = torch.randint(0, V, (a.batch, T), device=dev)
else:
    x = torch.randn(a.batch, T, C, device=dev, requires_grad=True)
    gout = torch.randn(a.batch, T, C, device=dev)
times = []
for i in range(a.steps + 2):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        out = step_model(x)
    if a.whole:
        scaler.scale(F.cross_entropy(out.float().view(-1, V), y.view(-1))).backward()
    else:
        scaler.scale(out.float()).backward(gout)
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    torch.cuda.synchronize()
    if i >= 2:
        times.append(time.perf_counter() - t0)
print(f"torch_tokens_per_s={a.batch * T / statistics.median(times):.1f}")
print(f"torch_peak_gib={torch.cuda.max_memory_allocated() / 2**30:.2f}")
