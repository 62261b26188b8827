#!/usr/bin/python3
"""PyTorch eager baseline for bench/cuda_step_bench: the same GPT (pre-LayerNorm blocks, tanh
GELU, untied head) written as a PyTorch user would (scaled_dot_product_attention with is_causal,
autocast to bf16 or plain fp32, AdamW), one training step timed on the GPU.
Prints: torch_tokens_per_s=<x>."""
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
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
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
        out = model(x)
    if a.whole:
        F.cross_entropy(out.float().view(-1, V), y.view(-1)).backward()
    else:
        out.float().backward(gout)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    torch.cuda.synchronize()
    if i >= 2:
        times.append(time.perf_counter() - t0)
print(f"torch_tokens_per_s={a.batch * T / statistics.median(times):.1f}")
