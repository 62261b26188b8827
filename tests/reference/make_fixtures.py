#!/usr/bin/python3
"""PyTorch reference for longhaul's CPU model.

Builds the same GPT as runtime/cpu/gpt_stage (pre-LayerNorm blocks, tanh GELU, learned
positions, optional tied head, causal or prefix-LM attention, per-position loss weights), runs it
in float64 and writes, per config, one safetensors file under fixtures/ with:
  the initial parameters under longhaul's names, their gradients as grad.<name>,
  the inputs (input.tokens/targets/loss_weight/prefix_len, shaped (M, B, T) or (M, B)),
  out.logits (M, B, T, V), out.loss (mean over micro-batches of the weighted mean loss),
  out.step_losses: losses of 10 AdamW steps (warmup + cosine schedule, global-norm clipping),
and the config in the metadata. Tests read these; CI does not need PyTorch.

Run with Debian's interpreter: /usr/bin/python3 tests/reference/make_fixtures.py
"""
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from hf_gpt2 import write_safetensors

torch.set_default_dtype(torch.float64)
HERE = os.path.dirname(os.path.abspath(__file__))

# The small configs the parity tests cover.
CONFIGS = [
    dict(name="causal_untied", attention="causal", tied_head=False, loss_mask=False),
    dict(name="causal_tied_lossmask", attention="causal", tied_head=True, loss_mask=True),
    dict(name="prefix_untied", attention="prefix_lm", tied_head=False, loss_mask=False),
    dict(name="prefix_tied_lossmask", attention="prefix_lm", tied_head=True, loss_mask=True),
]
SHAPE = dict(vocab_size=64, max_seq_len=24, n_layer=2, n_head=4, d_model=32, B=2, T=16, M=2)
OPT = dict(steps=10, lr=1e-2, min_lr=1e-3, warmup_steps=3, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8,
           grad_clip=1.0)


class Block(nn.Module):
    def __init__(self, C, nh):
        super().__init__()
        self.nh = nh
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x, allowed):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.nh)
        att = att.masked_fill(~allowed[:, None], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, maxT, L, nh, C, tied):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(maxT, C)
        self.h = nn.ModuleList(Block(C, nh) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.tied = tied
        self.lm_head = None if tied else nn.Linear(C, V, bias=False)
        for n, p in self.named_parameters():
            if n.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 1:
                nn.init.normal_(p, 1.0, 0.1)  # non-trivial LayerNorm gains exercise their gradients
            else:
                nn.init.normal_(p, 0.0, 0.1)

    def forward(self, tokens, prefix):
        B, T = tokens.shape
        i = torch.arange(T)
        last_visible = torch.maximum(i[None, :], prefix[:, None] - 1)  # (B, T)
        allowed = i[None, None, :] <= last_visible[:, :, None]  # (B, T, T)
        x = self.wte(tokens) + self.wpe(i)[None]
        for blk in self.h:
            x = blk(x, allowed)
        x = self.ln_f(x)
        return x @ (self.wte.weight if self.tied else self.lm_head.weight).T


def weighted_loss(logits, targets, weights):
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    w = weights.reshape(-1)
    return (nll * w).sum() / w.sum()


def longhaul_names(model):
    """torch parameter name -> longhaul's safetensors name."""
    out = {}
    for n, _ in model.named_parameters():
        m = n.replace("c_attn", "attn.c_attn").replace("attn_proj", "attn.c_proj")
        m = m.replace("c_fc", "mlp.c_fc").replace("mlp_proj", "mlp.c_proj")
        out[n] = m
    return out


def lr_at(step):
    o = OPT
    if step < o["warmup_steps"]:
        return o["lr"] * (step + 1) / o["warmup_steps"]
    progress = min(1.0, (step - o["warmup_steps"]) / max(1, o["steps"] - o["warmup_steps"]))
    return o["min_lr"] + 0.5 * (o["lr"] - o["min_lr"]) * (1 + math.cos(math.pi * progress))


def make(cfg, seed):
    s = SHAPE
    torch.manual_seed(seed)
    model = GPT(s["vocab_size"], s["max_seq_len"], s["n_layer"], s["n_head"], s["d_model"], cfg["tied_head"])
    M, B, T = s["M"], s["B"], s["T"]
    tokens = torch.randint(0, s["vocab_size"], (M, B, T + 1))
    inputs, targets = tokens[..., :-1], tokens[..., 1:]
    prefix = torch.zeros(M, B, dtype=torch.long)
    weights = torch.ones(M, B, T)
    if cfg["attention"] == "prefix_lm":
        prefix = torch.randint(1, T, (M, B))
        weights = (torch.arange(T)[None, None, :] >= prefix[..., None] - 1).double()
    if cfg["loss_mask"]:
        weights = weights * (torch.rand(M, B, T) < 0.6).double()
        weights[:, :, -1] = 1.0  # every micro-batch keeps at least one counted position

    names = longhaul_names(model)
    out = {names[n]: p.detach().clone() for n, p in model.named_parameters()}
    logits_all, loss = [], 0.0
    for m in range(M):
        logits = model(inputs[m], prefix[m])
        l = weighted_loss(logits, targets[m], weights[m]) / M
        l.backward()
        loss += l.item()
        logits_all.append(logits.detach())
    for n, p in model.named_parameters():
        out["grad." + names[n]] = p.grad.detach().clone()
    out["out.logits"] = torch.stack(logits_all)
    out["out.loss"] = torch.tensor([loss])

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": OPT["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=OPT["lr"], betas=(OPT["beta1"], OPT["beta2"]), eps=OPT["eps"])
    step_losses = []
    for step in range(OPT["steps"]):
        opt.zero_grad()
        total = 0.0
        for m in range(M):
            l = weighted_loss(model(inputs[m], prefix[m]), targets[m], weights[m]) / M
            l.backward()
            total += l.item()
        step_losses.append(total)
        torch.nn.utils.clip_grad_norm_(model.parameters(), OPT["grad_clip"])
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.step()
    out["out.step_losses"] = torch.tensor(step_losses)
    out["input.tokens"] = inputs.double()
    out["input.targets"] = targets.double()
    out["input.loss_weight"] = weights
    out["input.prefix_len"] = prefix.double()
    meta = {"config": json.dumps({**s, **OPT, "attention": cfg["attention"], "tied_head": cfg["tied_head"]}),
            "generator": "tests/reference/make_fixtures.py, torch " + torch.__version__}
    write_safetensors(os.path.join(HERE, "fixtures", cfg["name"] + ".safetensors"),
                      {k: v.to(torch.float32) for k, v in out.items()}, meta)
    print(f"{cfg['name']}: loss {loss:.6f}, after 10 steps {step_losses[-1]:.6f}")


if __name__ == "__main__":
    os.makedirs(os.path.join(HERE, "fixtures"), exist_ok=True)
    for i, cfg in enumerate(CONFIGS):
        make(cfg, 1000 + i)
