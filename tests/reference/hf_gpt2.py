#!/usr/bin/python3
"""A reference loader of Hugging Face GPT-2 checkpoint directories (model.safetensors and
config.json), in PyTorch, written from GPT-2's definition as transformers implements it: Conv1D
weights stored (in, out), the tanh GELU, LayerNorm epsilon from the config, the head tied to wte
unless tie_word_embeddings is false. Where transformers is installed, its GPT2LMHeadModel loads
the directory instead.

  hf_gpt2.py make-fixture OUT_DIR
      a small random GPT-2 saved as the Hub's gpt2 is (no "transformer." prefix, the attention
      mask buffers included, tied head), and reference.safetensors with tokens and the logits
      this loader computes for them in float64 (both stored as F32, which longhaul reads);
      tests/unit/hf_gpt2_test.cc reads them.
  hf_gpt2.py greedy MODEL_DIR --prompt TEXT --tokens N
      the greedy continuation of TEXT's bytes, printed as text (byte-level vocabularies).
  hf_gpt2.py logits MODEL_DIR --tokens 1,2,3
      the logits (T, V) of the tokens as JSON, {"loader": ..., "logits": [[...], ...]}.

Run with Debian's interpreter: /usr/bin/python3 tests/reference/hf_gpt2.py ...
"""
import argparse
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64}
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        blob = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        t = torch.frombuffer(bytearray(blob[a:b]), dtype=DTYPES[e["dtype"]]) if b > a else torch.zeros(0)
        out[name] = t.reshape(e["shape"]).clone()
    return out


def write_safetensors(path, tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        t = t.detach().contiguous()
        dtype = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64"}[t.dtype]
        data = t.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    js = json.dumps(header).encode()
    js += b" " * ((8 - len(js) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js + b"".join(blobs))


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def reference_logits(model_dir, tokens, dtype=torch.float64):
    """Logits (T, V) of the token list, by this file's GPT-2."""
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    raw = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    w = {(k[len("transformer."):] if k.startswith("transformer.") else k): v.to(dtype) for k, v in raw.items()}
    C, nh, eps = cfg["n_embd"], cfg["n_head"], cfg.get("layer_norm_epsilon", 1e-5)
    idx = torch.tensor(tokens)
    T = len(tokens)
    x = w["wte.weight"][idx] + w["wpe.weight"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(cfg["n_layer"]):
        p = f"h.{i}."
        h = F.layer_norm(x, (C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(T, nh, C // nh).transpose(0, 1) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(C // nh)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(0, 1).reshape(T, C)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        h = gelu_new(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), w["ln_f.weight"], w["ln_f.bias"], eps)
    head = w["wte.weight"] if cfg.get("tie_word_embeddings", True) else w["lm_head.weight"]
    return x @ head.T


def logits(model_dir, tokens):
    """(logits (T, V), which loader): transformers' GPT2LMHeadModel where installed."""
    try:
        from transformers import GPT2LMHeadModel
    except ImportError:
        return reference_logits(model_dir, tokens, torch.float32), "tests/reference/hf_gpt2.py's GPT-2"
    model = GPT2LMHeadModel.from_pretrained(model_dir).eval()
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0], "transformers.GPT2LMHeadModel"


def make_fixture(out_dir):
    torch.manual_seed(5)
    V, P, L, H, C = 64, 24, 2, 4, 32
    os.makedirs(out_dir, exist_ok=True)
    w = {"wte.weight": torch.randn(V, C) * 0.3, "wpe.weight": torch.randn(P, C) * 0.1}
    for i in range(L):
        p = f"h.{i}."
        w[p + "ln_1.weight"] = 1 + 0.1 * torch.randn(C)
        w[p + "ln_1.bias"] = 0.1 * torch.randn(C)
        w[p + "attn.bias"] = torch.tril(torch.ones(P, P)).view(1, 1, P, P)  # a buffer, not a parameter
        w[p + "attn.c_attn.weight"] = 0.2 * torch.randn(C, 3 * C)
        w[p + "attn.c_attn.bias"] = 0.1 * torch.randn(3 * C)
        w[p + "attn.c_proj.weight"] = 0.2 * torch.randn(C, C)
        w[p + "attn.c_proj.bias"] = 0.1 * torch.randn(C)
        w[p + "ln_2.weight"] = 1 + 0.1 * torch.randn(C)
        w[p + "ln_2.bias"] = 0.1 * torch.randn(C)
        w[p + "mlp.c_fc.weight"] = 0.2 * torch.randn(C, 4 * C)
        w[p + "mlp.c_fc.bias"] = 0.1 * torch.randn(4 * C)
        w[p + "mlp.c_proj.weight"] = 0.1 * torch.randn(4 * C, C)
        w[p + "mlp.c_proj.bias"] = 0.1 * torch.randn(C)
    w["ln_f.weight"] = 1 + 0.1 * torch.randn(C)
    w["ln_f.bias"] = 0.1 * torch.randn(C)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), {k: v.float() for k, v in w.items()},
                      {"format": "pt"})
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V, "n_positions": P,
              "n_ctx": P, "n_embd": C, "n_layer": L, "n_head": H, "n_inner": None, "activation_function": "gelu_new",
              "layer_norm_epsilon": 1e-5}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    tokens = torch.randint(0, V, (20,))
    out = reference_logits(out_dir, tokens.tolist())
    write_safetensors(os.path.join(out_dir, "reference.safetensors"),
                      {"tokens": tokens.to(torch.float32), "logits": out.to(torch.float32)},
                      {"made_by": "tests/reference/hf_gpt2.py make-fixture"})


def greedy(model_dir, prompt, n):
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    tokens = list(prompt.encode())
    for _ in range(n):
        window = tokens[-cfg["n_positions"]:]
        out, _ = logits(model_dir, window)
        tokens.append(int(out[-1].argmax()))
    return bytes(tokens).decode("latin-1")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make-fixture")
    m.add_argument("out_dir")
    gr = sub.add_parser("greedy")
    gr.add_argument("model_dir")
    gr.add_argument("--prompt", required=True)
    gr.add_argument("--tokens", type=int, default=40)
    lg = sub.add_parser("logits")
    lg.add_argument("model_dir")
    lg.add_argument("--tokens", required=True)
    a = ap.parse_args()
    if a.cmd == "make-fixture":
        make_fixture(a.out_dir)
    elif a.cmd == "logits":
        out, loader = logits(a.model_dir, [int(t) for t in a.tokens.split(",")])
        print(json.dumps({"loader": loader, "logits": out.double().tolist()}))
    else:
        print(greedy(a.model_dir, a.prompt, a.tokens))
        print("loader:", logits(a.model_dir, [0])[1], file=sys.stderr)


if __name__ == "__main__":
    main()
