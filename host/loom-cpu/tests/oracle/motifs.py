#!/usr/bin/env python3
"""Independent float64 oracle for the motif library (`packages/motifs/*.loom`), used by `tests/motifs.rs`.

Usage: motifs.py DIR. Every subdirectory of DIR holding a `case.txt` is one case:

    stage MODULE.STAGE          e.g. `stage motifs.norm.layernorm`
    cfg KEY VALUE               template values the formulas need (ACT, BASE); dims come from the shapes
    in NAME DTYPE D0,D1,...     an input or parameter binding: NAME.bin, raw little-endian (f32 or i32)
    out NAME D0,D1,...          an output to write: out_NAME.f64, raw little-endian float64

The formulas are written from the motif files' header comments with numpy in float64, independently of the
kernels (no tiling, no online softmax, no Taylor series). numpy only: erf is `math.erf`, vectorised.
"""

import math
import os
import sys

import numpy as np

ERF = np.vectorize(math.erf, otypes=[np.float64])
DTYPES = {"f32": "<f4", "i32": "<i4"}


def gelu_erf(x):
    return 0.5 * x * (1.0 + ERF(x / math.sqrt(2.0)))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def silu(x):
    return x / (1.0 + np.exp(-x))


ACTS = {"none": lambda x: x, "gelu_erf": gelu_erf, "gelu_tanh": gelu_tanh, "silu": silu}


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def rope(x, pos, base):
    d = x.shape[-1]
    half = d // 2
    inv = float(base) ** (-2.0 * np.arange(half, dtype=np.float64) / d)
    ang = pos.astype(np.float64)[:, None] * inv[None, :]  # [N, half]
    c = np.cos(ang)[:, None, :]
    s = np.sin(ang)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def attention(q, k, v, visible):
    """q [B,S,H,D], k/v [B,T,KV,D]; visible(b) -> bool [S, T]. A row with no visible key gives 0."""
    b_, s_, h_, d = q.shape
    kv = k.shape[2]
    out = np.zeros_like(q)
    for b in range(b_):
        vis = visible(b)
        for h in range(h_):
            g = h // (h_ // kv)
            sc = q[b, :, h, :] @ k[b, :, g, :].T / math.sqrt(d)
            sc = np.where(vis, sc, -np.inf)
            rowmax = sc.max(axis=1, keepdims=True)
            rowmax = np.where(np.isfinite(rowmax), rowmax, 0.0)
            p = np.where(vis, np.exp(sc - rowmax), 0.0)
            den = p.sum(axis=1, keepdims=True)
            out[b, :, h, :] = np.where(den > 0, (p @ v[b, :, g, :]) / np.where(den > 0, den, 1.0), 0.0)
    return out


def run(stage, cfg, a):
    """Returns {output name: float64 array}."""
    if stage == "motifs.gemm.dense":
        return {"y": ACTS[cfg["ACT"]](a["x"] @ a["w"] + a["b"])}
    if stage == "motifs.gemm.dense_nt":
        return {"y": ACTS[cfg["ACT"]](a["x"] @ a["w"].T + a["b"])}
    if stage == "motifs.gemm.dense_nt_add":
        return {"y": a["x"] @ a["w"].T + a["b"] + a["r"]}
    if stage == "motifs.gemm.dense_add":
        return {"y": a["x"] @ a["w"] + a["b"] + a["r"]}
    if stage == "motifs.norm.layernorm":
        x = a["x"]
        mu = x.mean(axis=1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
        return {"y": (x - mu) / np.sqrt(var + 1e-5) * a["gamma"] + a["beta"]}
    if stage == "motifs.norm.rmsnorm":
        x = a["x"]
        return {"y": x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6) * a["gamma"]}
    if stage == "motifs.norm.l2norm":
        x = a["x"]
        return {"y": x / np.maximum(np.sqrt((x * x).sum(axis=1, keepdims=True)), 1e-12)}
    if stage == "motifs.softmax.softmax":
        return {"y": softmax(a["x"])}
    if stage == "motifs.embed.embed":
        return {"out": a["table"][a["ids"]]}
    if stage == "motifs.pool.mean_pooling":
        m = a["mask"].astype(np.float64)
        s = (a["x"] * m[:, :, None]).sum(axis=1)
        return {"out": s / np.maximum(m.sum(axis=1), 1e-9)[:, None]}
    if stage == "motifs.act.gelu_erf":
        return {"y": gelu_erf(a["x"])}
    if stage == "motifs.act.gelu_tanh":
        return {"y": gelu_tanh(a["x"])}
    if stage == "motifs.act.silu":
        return {"y": silu(a["x"])}
    if stage == "motifs.act.silu_mul":
        return {"y": silu(a["gate"]) * a["up"]}
    if stage == "motifs.rope.rope":
        return {"y": rope(a["x"], a["pos"], cfg["BASE"])}
    if stage == "motifs.rope.rope_qk":
        return {
            "q_out": rope(a["q"], a["pos"], cfg["BASE"]),
            "k_out": rope(a["k"], a["pos"], cfg["BASE"]),
        }
    if stage == "motifs.attention.attention_padded":
        q, k = a["q"], a["k"]
        s_, t_ = q.shape[1], k.shape[1]
        lens = np.clip(a["lens"], 0, t_)

        def vis(b):
            return np.broadcast_to(np.arange(t_)[None, :] < lens[b], (s_, t_))

        return {"out": attention(q, k, a["v"], vis)}
    if stage == "motifs.attention.attention_causal":
        q, k = a["q"], a["k"]
        s_, t_ = q.shape[1], k.shape[1]

        def vis(_b):
            return np.arange(t_)[None, :] <= np.arange(s_)[:, None] + (t_ - s_)

        return {"out": attention(q, k, a["v"], vis)}
    raise SystemExit(f"motifs.py: no oracle for stage {stage}")


def case(d):
    stage, cfg, arrays, outs = None, {}, {}, []
    with open(os.path.join(d, "case.txt")) as f:
        for line in f:
            w = line.split()
            if not w:
                continue
            if w[0] == "stage":
                stage = w[1]
            elif w[0] == "cfg":
                cfg[w[1]] = int(w[2]) if w[2].lstrip("-").isdigit() else w[2]
            elif w[0] == "in":
                shape = [int(s) for s in w[3].split(",")]
                raw = np.fromfile(os.path.join(d, w[1] + ".bin"), dtype=DTYPES[w[2]])
                arr = raw.reshape(shape)
                arrays[w[1]] = arr.astype(np.float64) if w[2] == "f32" else arr.astype(np.int64)
            elif w[0] == "out":
                outs.append((w[1], tuple(int(s) for s in w[2].split(","))))
            else:
                raise SystemExit(f"{d}/case.txt: unknown line {line!r}")
    res = run(stage, cfg, arrays)
    for name, shape in outs:
        y = np.asarray(res[name], dtype=np.float64)
        if y.shape != shape:
            raise SystemExit(f"{d}: {stage} output {name} has shape {y.shape}, expected {shape}")
        y.astype("<f8").tofile(os.path.join(d, "out_" + name + ".f64"))


def main():
    root = sys.argv[1]
    n = 0
    for e in sorted(os.listdir(root)):
        d = os.path.join(root, e)
        if os.path.isfile(os.path.join(d, "case.txt")):
            case(d)
            n += 1
    print(f"motifs.py: {n} case(s)")


if __name__ == "__main__":
    main()
