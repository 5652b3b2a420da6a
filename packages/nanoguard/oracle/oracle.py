#!/usr/bin/env python3
"""An independent NanoGuard (metatronnanoguard 0.1.0) in numpy, no torch.

    oracle.py MODEL_DIR WHEEL_DIR CORPUS.jsonl OUT.json [--dtype float64|float32] [--batch N]

MODEL_DIR holds the converted model.safetensors (scripts/convert/nanoguard.py); its `rope.*` tables are not
used: the oracle builds its own from model.py's recipe. WHEEL_DIR is the installed wheel: the texts are tokenised
with tiktoken itself, built from the fields of nanoguard/assets/tokenizer.pkl (read by the converter's restricted
unpickler). CORPUS.jsonl holds one JSON string per line. Writes OUT.json: a list of
{"n": tokens used, "total": tokens before truncation, "probs": [p_safe, p_injection]}.

Written from the wheel's model.py and scanner.py, not from the package's Loom code:
  - ids = [BOS] + encode_ordinary(text), truncated to the first 512 (tokenizer.py);
  - scanner.py pads every input to the 512-token window with PAD (<|reserved_1|>) and passes an attention mask
    that only the *pooling* uses: attention (F.scaled_dot_product_attention without a mask) sees the padding,
    so a text's probabilities are those of its 512-token padded window;
  - x = rms_norm(wte[ids]) (parameter-free, eps = float32 machine epsilon, F.rms_norm's default), x0 = x;
    per block i: x = resid_lambdas[i] x + x0_lambdas[i] x0; x += attn(rms(x)); x += mlp(rms(x));
  - attention: q, k, v = linear (no bias), 4 heads of 128; RoPE on q and k with model.py's convention
    (y1 = x1 cos + x2 sin, y2 = -x1 sin + x2 cos over the two halves), cos/sin computed in float32 from
    base 10000 and rounded to bfloat16; then rms_norm of q and k per head; softmax(q k^T / sqrt(128)) v;
  - mlp: relu(x W1^T)^2 W2^T (4x width);
  - rms_norm, masked mean over the real tokens, LayerNorm (eps 1e-5), Linear(512 -> 2), softmax.
"""
import importlib.util
import json
import os
import struct
import sys

import numpy as np

WINDOW = 512
BOS, PAD = "<|reserved_0|>", "<|reserved_1|>"
F32_EPS = float(np.finfo(np.float32).eps)


def load_safetensors(path, dtype):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        assert meta["dtype"] == "F32", (name, meta["dtype"])
        lo, hi = meta["data_offsets"]
        out[name] = np.frombuffer(data[lo:hi], dtype="<f4").reshape(meta["shape"]).astype(dtype)
    return out


def bf16(a):
    """float32 -> bfloat16 (round to nearest even), widened back to float32."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def rotary(head_dim, seq_len):
    ch = np.arange(0, head_dim, 2, dtype=np.float32)
    inv = np.float32(1.0) / np.power(np.float32(10000.0), ch / np.float32(head_dim))
    freqs = np.outer(np.arange(seq_len, dtype=np.float32), inv.astype(np.float32)).astype(np.float32)
    return bf16(np.cos(freqs)), bf16(np.sin(freqs))


def rms(x):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + x.dtype.type(F32_EPS))


def forward(w, ids, mask, cos, sin, dtype):
    """ids, mask: [B, T] (T = WINDOW); returns softmax probabilities [B, 2]."""
    b, t = ids.shape
    nh, hd = 4, 128
    x = rms(w["transformer.wte.weight"][ids])
    x0 = x
    c = cos[:t].astype(dtype)[None, :, None, :]
    s = sin[:t].astype(dtype)[None, :, None, :]

    def rope(v):
        v1, v2 = v[..., : hd // 2], v[..., hd // 2:]
        return np.concatenate([v1 * c + v2 * s, -v1 * s + v2 * c], axis=-1)

    for i in range(4):
        p = f"transformer.h.{i}."
        x = w["resid_lambdas"][i] * x + w["x0_lambdas"][i] * x0
        h = rms(x)
        q = (h @ w[p + "attn.c_q.weight"].T).reshape(b, t, nh, hd)
        k = (h @ w[p + "attn.c_k.weight"].T).reshape(b, t, nh, hd)
        v = (h @ w[p + "attn.c_v.weight"].T).reshape(b, t, nh, hd)
        q, k = rms(rope(q)), rms(rope(k))
        q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
        sc = q @ k.transpose(0, 1, 3, 2) / dtype(np.sqrt(hd))
        sc = np.exp(sc - sc.max(axis=-1, keepdims=True))
        sc /= sc.sum(axis=-1, keepdims=True)
        y = (sc @ v).transpose(0, 2, 1, 3).reshape(b, t, nh * hd)
        x = x + y @ w[p + "attn.c_proj.weight"].T
        f = np.maximum(rms(x) @ w[p + "mlp.c_fc.weight"].T, 0)
        x = x + (f * f) @ w[p + "mlp.c_proj.weight"].T
    x = rms(x)
    m = mask[..., None].astype(dtype)
    pooled = (x * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1)
    mu = pooled.mean(axis=-1, keepdims=True)
    var = ((pooled - mu) ** 2).mean(axis=-1, keepdims=True)
    pooled = (pooled - mu) / np.sqrt(var + dtype(1e-5)) * w["cls_norm.weight"] + w["cls_norm.bias"]
    logits = pooled @ w["cls_head.weight"].T + w["cls_head.bias"]
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def load_converter():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "..", "..", "scripts", "convert", "nanoguard.py")
    spec = importlib.util.spec_from_file_location("nanoguard_convert", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tiktoken_encoding(wheel_dir):
    """tiktoken's Encoding from the pickled fields (never through pickle's own class lookup)."""
    import tiktoken

    name, pat, ranks, special = load_converter().read_tiktoken(
        os.path.join(wheel_dir, "nanoguard", "assets", "tokenizer.pkl"))
    return tiktoken.Encoding(name, pat_str=pat, mergeable_ranks=ranks, special_tokens=special)


def tokenize(enc, texts):
    bos, pad = enc.encode_single_token(BOS), enc.encode_single_token(PAD)
    out = []
    for s in texts:
        ids = [bos] + enc.encode_ordinary(s)
        out.append((ids[:WINDOW], len(ids)))
    return out, pad


def main():
    args = sys.argv[1:]
    dtype, batch = np.float64, 8
    if "--dtype" in args:
        i = args.index("--dtype")
        dtype = {"float64": np.float64, "float32": np.float32}[args[i + 1]]
        del args[i: i + 2]
    if "--batch" in args:
        i = args.index("--batch")
        batch = int(args[i + 1])
        del args[i: i + 2]
    if len(args) != 4:
        sys.exit(__doc__)
    model_dir, wheel_dir, corpus, out_path = args
    w = load_safetensors(os.path.join(model_dir, "model.safetensors"), dtype)
    cos, sin = rotary(128, WINDOW)
    texts = [json.loads(line) for line in open(corpus, encoding="utf-8") if line.strip()]
    toks, pad = tokenize(tiktoken_encoding(wheel_dir), texts)
    rows = []
    for at in range(0, len(toks), batch):
        chunk = toks[at: at + batch]
        ids = np.full((len(chunk), WINDOW), pad, dtype=np.int64)
        mask = np.zeros((len(chunk), WINDOW), dtype=bool)
        for j, (t, _) in enumerate(chunk):
            ids[j, : len(t)] = t
            mask[j, : len(t)] = True
        p = forward(w, ids, mask, cos, sin, dtype)
        for (t, total), pr in zip(chunk, p):
            rows.append({"n": len(t), "total": total, "ids": t, "probs": [float(v) for v in pr]})
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(rows, f)
    os.replace(tmp, out_path)
    print(f"oracle: {len(rows)} texts, {sum(r['n'] for r in rows)} tokens, "
          f"{sum(r['total'] > WINDOW for r in rows)} truncated", file=sys.stderr)


if __name__ == "__main__":
    main()
