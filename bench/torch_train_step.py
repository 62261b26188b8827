#!/usr/bin/python3
"""PyTorch CPU baseline for bench/train_step_bench: the same GPT (tests/reference/make_fixtures.py),
float32, one training step = forward + backward over the batch + clip + AdamW, timed.
Prints one line: torch_tokens_per_s=<x> torch_step_s=<median seconds> torch_version=<v>."""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
from make_fixtures import GPT, weighted_loss  # noqa: E402

p = argparse.ArgumentParser()
for k, v in dict(vocab=256, d_model=256, n_layer=4, n_head=4, seq=256, batch=8, threads=2, steps=5, warmup=2).items():
    p.add_argument("--" + k, type=int, default=v)
a = p.parse_args()

torch.set_default_dtype(torch.float32)
torch.set_num_threads(a.threads)
torch.manual_seed(0)
model = GPT(a.vocab, a.seq, a.n_layer, a.n_head, a.d_model, False)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
x = torch.randint(0, a.vocab, (a.batch, a.seq))
y = torch.randint(0, a.vocab, (a.batch, a.seq))
w = torch.ones(a.batch, a.seq)
prefix = torch.zeros(a.batch, dtype=torch.long)

times = []
for i in range(a.warmup + a.steps):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    weighted_loss(model(x, prefix), y, w).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if i >= a.warmup:
        times.append(time.perf_counter() - t0)
t = statistics.median(times)
print(f"torch_tokens_per_s={a.batch * a.seq / t:.1f} torch_step_s={t:.5f} torch_version={torch.__version__}")
