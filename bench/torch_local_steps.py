#!/usr/bin/python3
"""Local steps in PyTorch, apart from longhaul: the convergence bench's model and tokens budget
(configs/convergence.toml: a byte-level GPT of 7 layers, d_model 256, 4 heads; 2 replicas x 8
sequences of 128 bytes, 256 steps, AdamW at 1e-3 to 1e-4 after 32 steps of warm-up, clipping at 1)
trained synchronously and with local steps, each replica its own AdamW, plainly averaged every H
steps (`longhaul convergence`'s train.outer_lr = 1, train.outer_momentum = 0), and optionally with
the replicas' AdamW moments averaged too (Local Adam). It shows whether what local steps cost on
the bench is theirs or longhaul's, and tries what longhaul does not do yet.

Its data order and validation windows are its own, so its losses are not longhaul's; compare its
settings with each other. Averaging the first moment without the second diverges: a rare byte's
embedding row then carries one replica's moment over the other's small second moment.

Usage: /usr/bin/python3 bench/torch_local_steps.py [--settings sync,local:16,moments:16] [--seed 1]
       [--threads 2] [--corpus build/corpus/python-docs]   (about 15 minutes a setting on one thread)
Prints the validation loss every 32 steps, then each setting's final gap to the synchronous run.
Needs Debian's python3-torch (bash deploy/setup.sh --with-torch) and the corpus bench/convergence.sh
makes.
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
from make_fixtures import GPT  # noqa: E402

V, T, L, NH, C = 256, 128, 7, 4, 256
STEPS, WARMUP, LR, MIN_LR, WD, CLIP = 256, 32, 1e-3, 1e-4, 0.1, 1.0
REPLICAS, BATCH, EVAL_EVERY, EVAL_BATCHES = 2, 8, 32, 16

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--settings", default="sync,local:16,moments:16",
               help="comma-separated: sync, local:H (parameters averaged every H steps), moments:H (and both moments)")
p.add_argument("--seed", type=int, default=1)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--corpus", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "corpus",
                                                 "python-docs"))
a = p.parse_args()
torch.set_num_threads(a.threads)


def load(name):
    path = os.path.join(a.corpus, name)
    if not os.path.exists(path):
        sys.exit(f"torch_local_steps.py: no {path}: run python3 bench/make_corpus.py --out {a.corpus}")
    return torch.frombuffer(bytearray(open(path, "rb").read()), dtype=torch.uint8)


train, val = load("train.txt"), load("val.txt")


def lr_at(step):
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    progress = (step - WARMUP) / (STEPS - WARMUP)
    return MIN_LR + 0.5 * (LR - MIN_LR) * (1 + math.cos(math.pi * progress))


def model():
    """GPT-2's initialisation, as longhaul's: weights N(0, 0.02), residual projections / sqrt(2L)."""
    torch.manual_seed(a.seed)
    m = GPT(V, T, L, NH, C, False)  # an LM head of its own (model.tied_head = false)
    for n, w in m.named_parameters():
        if n.endswith("bias"):
            torch.nn.init.zeros_(w)
        elif w.dim() == 1:
            torch.nn.init.ones_(w)
        else:
            torch.nn.init.normal_(w, 0.0, 0.02 / (math.sqrt(2 * L) if n.endswith("proj.weight") else 1.0))
    return m


def optimizer(m):
    """AdamW decaying the matrices only, as longhaul's."""
    decay = [w for w in m.parameters() if w.dim() >= 2]
    rest = [w for w in m.parameters() if w.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": rest, "weight_decay": 0.0}],
                             lr=LR, betas=(0.9, 0.95), eps=1e-8)


def batch(gen, data):
    starts = torch.randint(0, len(data) - T - 1, (BATCH,), generator=gen).tolist()
    x = torch.stack([data[s:s + T + 1] for s in starts]).long()
    return x[:, :-1], x[:, 1:]


PREFIX = torch.zeros(BATCH, dtype=torch.long)  # causal attention throughout


def loss_of(m, x, y):
    return F.cross_entropy(m(x, PREFIX).reshape(-1, V), y.reshape(-1))


def average(tensors):
    mean = sum(tensors) / len(tensors)
    for t in tensors:
        t.copy_(mean)


def parse(setting):
    kind, _, h = setting.partition(":")
    if kind not in ("sync", "local", "moments") or (kind != "sync" and not (h.isdigit() and int(h) > 0)):
        sys.exit(f"torch_local_steps.py: unknown setting {setting!r}: sync, local:H or moments:H (H > 0)")
    if kind != "sync" and EVAL_EVERY % int(h):
        sys.exit(f"torch_local_steps.py: {setting}: H must divide {EVAL_EVERY}, so the replicas agree when evaluated")
    return kind, int(h) if h else 1


def run(setting):
    kind, H = parse(setting)
    replicas = [model() for _ in range(1 if kind == "sync" else REPLICAS)]
    opts = [optimizer(m) for m in replicas]
    gens = [torch.Generator().manual_seed(1000 * a.seed + r) for r in range(REPLICAS)]
    val_gen = torch.Generator().manual_seed(99)
    val_batches = [batch(val_gen, val) for _ in range(EVAL_BATCHES)]
    curve, t0 = [], time.time()
    for step in range(STEPS):
        for o in opts:
            for group in o.param_groups:
                group["lr"] = lr_at(step)
        if kind == "sync":  # one step on both replicas' sequences: the exact path
            opts[0].zero_grad()
            for r in range(REPLICAS):
                (loss_of(replicas[0], *batch(gens[r], train)) / REPLICAS).backward()
            torch.nn.utils.clip_grad_norm_(replicas[0].parameters(), CLIP)
            opts[0].step()
        else:
            for m, o, g in zip(replicas, opts, gens):
                o.zero_grad()
                loss_of(m, *batch(g, train)).backward()
                torch.nn.utils.clip_grad_norm_(m.parameters(), CLIP)
                o.step()
            if (step + 1) % H == 0:
                with torch.no_grad():
                    for ws in zip(*[m.parameters() for m in replicas]):
                        average(ws)
                        if kind == "moments":
                            for moment in ("exp_avg", "exp_avg_sq"):
                                average([o.state[w][moment] for o, w in zip(opts, ws)])
        if (step + 1) % EVAL_EVERY == 0:  # a multiple of every H: the replicas agree here
            with torch.no_grad():
                curve.append(sum(loss_of(replicas[0], x, y).item() for x, y in val_batches) / EVAL_BATCHES)
            print(f"  {setting} step {step + 1}: val {curve[-1]:.4f} ({time.time() - t0:.0f} s)", flush=True)
    return curve


settings = a.settings.split(",")
for s in settings:
    parse(s)
results = {s: run(s) for s in settings}
print(f"\nvalidation loss every {EVAL_EVERY} steps (seed {a.seed}, torch {torch.__version__}):")
for s, curve in results.items():
    print(f"{s:14s}" + "".join(f"{v:8.4f}" for v in curve))
if "sync" in results:
    for s, curve in results.items():
        print(f"{s:14s} final gap to sync {curve[-1] - results['sync'][-1]:+.4f}")
