#!/usr/bin/env python3
"""An independent SmolLM2-135M-Instruct (GGUF `llama` architecture) forward in numpy float64, no torch.

    PYTHONPATH=.models/smollm2 python3 packages/smollm2/oracle/llama.py greedy  (--ids 1,2,3 | --text T | --chat Q) [-n 32]
    PYTHONPATH=.models/smollm2 python3 packages/smollm2/oracle/llama.py logits  (--ids ... | --text T | --chat Q)
    PYTHONPATH=.models/smollm2 python3 packages/smollm2/oracle/llama.py selfcheck   (dequantization by hand == gguf)
    PYTHONPATH=.models/smollm2 python3 packages/smollm2/oracle/llama.py validate    (greedy chats; norm vs neox rope)
    PYTHONPATH=.models/smollm2 python3 packages/smollm2/oracle/llama.py precompute  (prompts.jsonl into the cache)

Weights: every tensor of the GGUF dequantized by the `gguf` package (llama.cpp's reader: `gguf.quants.dequantize`,
Q4_1 / Q8_0 / F32 here) and widened to float64; one row of each quantized type is also dequantized from the raw
block bytes here and compared (selfcheck and at load).

The model as llama.cpp runs `general.architecture = llama` (src/llama-model.cpp, llm_build_llama), hyper-
parameters from the metadata: 30 blocks of
    h = x + Wo · attn(rope(Wq · rms(x)), rope(Wk · rms(x)), Wv · rms(x))      (causal, scale 1/sqrt(64))
    x' = h + Wdown · (silu(Wgate · rms(h)) * (Wup · rms(h)))
with rms(x) = x / sqrt(mean(x^2) + eps) * g (eps = llama.attention.layer_norm_rms_epsilon), 9 query heads sharing
3 KV heads in groups of 3 (query head h reads KV head h // 3, ggml's broadcast), then logits = Wout · rms(x) with
Wout = output.weight, or token_embd.weight when the file has none (tied: this one).

RoPE: llama.cpp gives LLM_ARCH_LLAMA LLAMA_ROPE_TYPE_NORM ("a normal RoPE, operating on pairs of consecutive head
values", llama_model_rope_type): the pair (x[2i], x[2i+1]) of each head is rotated by pos * base^(-2i/64), base =
llama.rope.freq_base (100000). convert_hf_to_gguf.py permutes HF's attn_q / attn_k rows so that this adjacent-pair
form equals HF's rotate_half (NEOX, halves) form; so GGUF weights + NEOX rope would be wrong. The `--rope neox`
option exists only to show that (the wrong mode gives worse text and a lower probability to the right answer).

Results are cached as JSON in .models/smollm2/oracle-cache/<key>.json, key = sha256 of (the GGUF's sha256 prefix,
kind, input ids, n); logits go beside it as <key>.logits.f32 (row-major [T, vocab] little-endian float32 of the
float64 result) with per-position top-1 id and top-1 - top-2 margin (float64) in the JSON; `seconds` is the
forward alone (not the ~8 s of loading and dequantizing). prompts.jsonl: 8 prompts of >= 64 tokens (4 ChatML chats,
prose, numbers, multilingual, code) that `precompute` puts in the cache (64-position logits, 32-token greedy).
Import: `from llama import Model; m = Model(path); m.logits(ids); m.greedy(ids, n)`, or `cached_greedy(...)`.
"""
import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
GGUF = os.path.join(ROOT, "packages/smollm2/model/SmolLM2-135M-Instruct.Q4_1.gguf")
TOKENIZER = os.path.join(ROOT, "packages/smollm2/tokenizer.json")
TEMPLATE = os.path.join(ROOT, "packages/smollm2/chat_template.jinja")
CACHE = os.path.join(ROOT, ".models/smollm2/oracle-cache")


def file_sha256(path, _memo={}):
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _memo:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        _memo[key] = h.hexdigest()
    return _memo[key]


def dequant_row_by_hand(raw_row, qtype):
    """One row from the raw GGML blocks (ggml-quants.c dequantize_row_q4_1 / _q8_0), to check the gguf package."""
    raw_row = np.asarray(raw_row, dtype=np.uint8)
    if qtype == QT.Q4_1:  # block of 32: f16 d, f16 m, 16 bytes; element j = low nibble, j + 16 = high nibble
        b = raw_row.reshape(-1, 20)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
        m = b[:, 2:4].copy().view(np.float16).astype(np.float32)
        q = b[:, 4:20]
        vals = np.concatenate([q & 0x0F, q >> 4], axis=1).astype(np.float32)
        return (vals * d + m).reshape(-1)
    if qtype == QT.Q8_0:  # block of 32: f16 d, 32 int8
        b = raw_row.reshape(-1, 34)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
        q = b[:, 2:34].copy().view(np.int8).astype(np.float32)
        return (q * d).reshape(-1)
    raise ValueError(qtype)


class Model:
    def __init__(self, path=GGUF):
        self.path = path
        r = gguf.GGUFReader(path)
        f = lambda k: r.fields[k].contents()
        assert f("general.architecture") == "llama", f("general.architecture")
        self.n_layer = int(f("llama.block_count"))
        self.d = int(f("llama.embedding_length"))
        self.n_ff = int(f("llama.feed_forward_length"))
        self.n_head = int(f("llama.attention.head_count"))
        self.n_kv = int(f("llama.attention.head_count_kv"))
        self.hd = self.d // self.n_head
        self.n_rot = int(f("llama.rope.dimension_count"))
        assert self.n_rot == self.hd, "partial rotary not handled"
        self.rope_base = float(f("llama.rope.freq_base"))
        self.eps = float(f("llama.attention.layer_norm_rms_epsilon"))
        for k in ("llama.rope.scaling.type", "llama.rope.scaling.factor", "llama.attention.key_length"):
            assert k not in r.fields, f"{k} present: not handled"
        self.eos = int(f("tokenizer.ggml.eos_token_id"))
        self.w = {}
        checked = set()
        for t in r.tensors:
            qt = QT(t.tensor_type)
            if qt not in (QT.F32, QT.Q4_1, QT.Q8_0):
                raise SystemExit(f"llama.py: {t.name} is {qt.name}: not handled")
            a = gguf.quants.dequantize(t.data, qt)
            shape = tuple(int(x) for x in reversed(t.shape))  # GGUF ne0 (the input dim) is the fastest: [rows, cols]
            a = a.reshape(shape)
            if qt != QT.F32 and qt not in checked:
                row = dequant_row_by_hand(t.data[0], qt)
                assert np.array_equal(row, a[0] if a.ndim == 2 else a), f"{t.name}: gguf dequant differs from the blocks"
                checked.add(qt)
            self.w[t.name] = a.astype(np.float64)
        self.vocab = self.w["token_embd.weight"].shape[0]
        self.out = self.w.get("output.weight", self.w["token_embd.weight"])
        self.tied = "output.weight" not in self.w
        inv = self.rope_base ** (-np.arange(0, self.hd, 2, dtype=np.float64) / self.hd)  # [hd/2]
        self.inv_freq = inv
        self.rope_mode = "norm"

    # ---- pieces
    def rms(self, x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * g

    def rope(self, x, pos):
        """x [T, H, hd], pos [T]."""
        ang = pos[:, None].astype(np.float64) * self.inv_freq[None, :]  # [T, hd/2]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        out = np.empty_like(x)
        if self.rope_mode == "norm":  # adjacent pairs (x[2i], x[2i+1])
            x0, x1 = x[..., 0::2], x[..., 1::2]
            out[..., 0::2] = x0 * cos - x1 * sin
            out[..., 1::2] = x0 * sin + x1 * cos
        else:  # neox: halves (x[i], x[i + hd/2]) -- wrong for GGUF llama weights, kept to show it
            h = self.hd // 2
            x0, x1 = x[..., :h], x[..., h:]
            out[..., :h] = x0 * cos - x1 * sin
            out[..., h:] = x0 * sin + x1 * cos
        return out

    def new_cache(self):
        return [[np.zeros((0, self.n_kv, self.hd)), np.zeros((0, self.n_kv, self.hd))] for _ in range(self.n_layer)]

    def forward(self, ids, cache, last_only=False):
        """Runs ids after the cache's tokens (appending to it); returns logits [T, vocab] (or [1, vocab])."""
        ids = np.asarray(ids, dtype=np.int64)
        T = len(ids)
        p0 = cache[0][0].shape[0]
        pos = np.arange(p0, p0 + T)
        x = self.w["token_embd.weight"][ids]  # [T, d]
        group = self.n_head // self.n_kv
        # causal mask over [T, p0 + T]
        mask = np.where(np.arange(p0 + T)[None, :] <= pos[:, None], 0.0, -np.inf)
        for l in range(self.n_layer):
            w = lambda n: self.w[f"blk.{l}.{n}.weight"]
            h = self.rms(x, w("attn_norm"))
            q = (h @ w("attn_q").T).reshape(T, self.n_head, self.hd)
            k = (h @ w("attn_k").T).reshape(T, self.n_kv, self.hd)
            v = (h @ w("attn_v").T).reshape(T, self.n_kv, self.hd)
            q, k = self.rope(q, pos), self.rope(k, pos)
            cache[l][0] = K = np.concatenate([cache[l][0], k], axis=0)
            cache[l][1] = V = np.concatenate([cache[l][1], v], axis=0)
            Kh = np.repeat(K, group, axis=1)  # [S, n_head, hd], head h -> kv head h // group
            Vh = np.repeat(V, group, axis=1)
            s = np.einsum("thd,shd->hts", q, Kh) / np.sqrt(self.hd) + mask[None]
            s = s - s.max(axis=-1, keepdims=True)
            p = np.exp(s)
            p /= p.sum(axis=-1, keepdims=True)
            o = np.einsum("hts,shd->thd", p, Vh).reshape(T, self.d)
            x = x + o @ w("attn_output").T
            h = self.rms(x, w("ffn_norm"))
            g = h @ w("ffn_gate").T
            u = h @ w("ffn_up").T
            x = x + ((g / (1.0 + np.exp(-g))) * u) @ w("ffn_down").T
        if last_only:
            x = x[-1:]
        return self.rms(x, self.w["output_norm.weight"]) @ self.out.T

    # ---- API
    def logits(self, ids):
        """Teacher-forced causal logits [T, vocab] (float64) for ids from position 0."""
        return self.forward(ids, self.new_cache())

    def greedy(self, ids, n):
        """n greedy (argmax, lowest id on ties) continuation ids; EOS is not a stop here (callers cut at it)."""
        cache = self.new_cache()
        lg = self.forward(ids, cache, last_only=True)[-1]
        out = []
        for i in range(n):
            t = int(np.argmax(lg))
            out.append(t)
            if i + 1 < n:
                lg = self.forward([t], cache)[-1]
        return out


# ---- text helpers (tokenizers + minijinja, only for the CLI and the checks)
def tokenizer():
    from tokenizers import Tokenizer
    return Tokenizer.from_file(TOKENIZER)


def chat_text(question, system=None):
    from minijinja import Environment
    env = Environment(templates={"chat": open(TEMPLATE, encoding="utf-8").read()})
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return env.render_template("chat", messages=msgs, add_generation_prompt=True)


# ---- cache
def cache_key(model_path, kind, ids, n=None):
    spec = {"model": file_sha256(model_path)[:16], "kind": kind, "ids": [int(i) for i in ids], "n": n}
    return spec, hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:24]


_models = {}


def _model(path):
    if path not in _models:
        _models[path] = Model(path)
    return _models[path]


def cached_greedy(ids, n, model_path=GGUF, cache_dir=CACHE):
    spec, key = cache_key(model_path, "greedy", ids, n)
    p = os.path.join(cache_dir, key + ".json")
    if os.path.exists(p):
        return json.load(open(p))
    m = _model(model_path)
    t0 = time.time()
    out = m.greedy(ids, n)
    rec = dict(spec, greedy=out, seconds=round(time.time() - t0, 3))
    _store(p, rec)
    return rec


def cached_logits(ids, model_path=GGUF, cache_dir=CACHE):
    """The JSON record; the logits themselves are np.fromfile(rec['logits_file'], '<f4').reshape(rec['shape'])."""
    spec, key = cache_key(model_path, "logits", ids)
    p = os.path.join(cache_dir, key + ".json")
    lf = os.path.join(cache_dir, key + ".logits.f32")
    if os.path.exists(p) and os.path.exists(lf):
        rec = json.load(open(p))
        rec["logits_file"] = lf
        return rec
    m = _model(model_path)
    t0 = time.time()
    lg = m.logits(ids)
    secs = time.time() - t0
    top2 = np.sort(lg, axis=-1)[:, -2:]
    os.makedirs(cache_dir, exist_ok=True)
    lg.astype("<f4").tofile(lf + ".tmp")
    os.replace(lf + ".tmp", lf)
    rec = dict(spec, shape=list(lg.shape), logits_file=os.path.basename(lf), top1=[int(i) for i in lg.argmax(-1)],
               margin=[float(m) for m in top2[:, 1] - top2[:, 0]], seconds=round(secs, 3))
    _store(p, rec)
    rec["logits_file"] = lf
    return rec


def _store(p, rec):
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p + ".tmp", "w") as f:
        json.dump(rec, f)
    os.replace(p + ".tmp", p)


def selfcheck(path=GGUF):
    """Dequantization by hand vs gguf for every row of one tensor of each quantized type."""
    r = gguf.GGUFReader(path)
    seen = set()
    for t in r.tensors:
        qt = QT(t.tensor_type)
        if qt in (QT.Q4_1, QT.Q8_0) and qt not in seen:
            a = gguf.quants.dequantize(t.data, qt)
            b = np.stack([dequant_row_by_hand(row, qt) for row in t.data])
            assert np.array_equal(a, b), t.name
            print(f"selfcheck: {t.name} {qt.name} {a.shape}: gguf dequantize == by-hand blocks", file=sys.stderr)
            seen.add(qt)


VALIDATE_CHATS = ["What is the capital of France?", "Name three primary colors.", "Write a haiku about the sea."]
VALIDATE_PROSE = ("The bicycle was invented in the nineteenth century. Early designs had no pedals, and riders pushed "
                  "themselves along with their feet. Later, pedals were attached to the front wheel, and by the end of "
                  "the century the safety bicycle, with two wheels of equal size and a chain drive, had become popular "
                  "across Europe and North America.")


def validate(path=GGUF, n=32):
    """The oracle's sanity evidence: greedy chat answers, and the rope mode by likelihood (norm vs neox)."""
    tok = tokenizer()
    m = Model(path)
    for q in VALIDATE_CHATS:
        t0 = time.time()
        out = m.greedy(tok.encode(chat_text(q)).ids, n)
        print(f"greedy {n} ({time.time() - t0:.1f}s) {q!r} -> {tok.decode(out, skip_special_tokens=False)!r}")
    raw = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    out = m.greedy(tok.encode(raw).ids, n)
    print(f"greedy {n} {raw!r} (no system turn) -> {tok.decode(out, skip_special_tokens=False)!r}")
    # The KV-cache path against the whole-sequence path: teacher-forcing the greedy output gives it back.
    ids = tok.encode(raw).ids
    lg = m.logits(ids + out[:-1])
    again = [int(t) for t in lg[len(ids) - 1:].argmax(-1)]
    assert again == out, (again, out)
    print(f"teacher-forced argmax over prompt + greedy[:-1] == greedy ({len(out)} tokens)")
    prompt = tok.encode(chat_text(VALIDATE_CHATS[0])).ids
    ans = tok.encode("The capital of France is Paris.<|im_end|>").ids
    prose = tok.encode(VALIDATE_PROSE).ids
    for mode in ("norm", "neox"):
        m.rope_mode = mode
        lg = m.logits(prompt + ans)
        lp = lg - lg.max(-1, keepdims=True)
        lp -= np.log(np.exp(lp).sum(-1, keepdims=True))
        a = sum(lp[len(prompt) - 1 + i, t] for i, t in enumerate(ans))
        lg = m.logits(prose)
        lp = lg - lg.max(-1, keepdims=True)
        lp -= np.log(np.exp(lp).sum(-1, keepdims=True))
        nll = -np.mean([lp[i, prose[i + 1]] for i in range(len(prose) - 1)])
        print(f"rope {mode}: log p('The capital of France is Paris.<|im_end|>' | chat) = {a:.3f}; "
              f"prose perplexity over {len(prose) - 1} tokens = {np.exp(nll):.2f}")
    m.rope_mode = "norm"


PROMPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prompts.jsonl")


def precompute(path=GGUF, cache_dir=CACHE, positions=64, n=32):
    """Fills the cache for prompts.jsonl: logits over each prompt's first `positions` ids, and for the chat prompts
    (ending in the generation prompt) the greedy `n`-token continuation of the whole prompt."""
    tok = tokenizer()
    for line in open(PROMPTS, encoding="utf-8"):
        p = json.loads(line)
        ids = tok.encode(p["text"]).ids
        assert len(ids) >= positions, (p["name"], len(ids))
        rec = cached_logits(ids[:positions], path, cache_dir)
        small = sum(m <= 1e-2 for m in rec["margin"])
        msg = f"{p['name']:13s} {len(ids):3d} ids  logits[{positions}] {rec['seconds']:6.2f}s ({small} margins <= 1e-2)"
        if p["chat"]:
            g = cached_greedy(ids, n, path, cache_dir)
            msg += f"  greedy[{n}] {g['seconds']:6.2f}s {tok.decode(g['greedy'], skip_special_tokens=False)!r}"
        print(msg)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=["greedy", "logits", "selfcheck", "validate", "precompute"])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--ids", help="comma-separated token ids")
    src.add_argument("--text", help="raw text (special tokens recognised), tokenized with tokenizer.json")
    src.add_argument("--chat", help="a user message rendered with chat_template.jinja (generation prompt added)")
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--gguf", default=GGUF)
    ap.add_argument("--cache-dir", default=CACHE)
    ap.add_argument("--no-cache", action="store_true")
    ap.add_argument("--rope", choices=["norm", "neox"], default="norm", help="neox only to show it is wrong")
    a = ap.parse_args()
    if a.kind == "selfcheck":
        selfcheck(a.gguf)
        return
    if a.kind == "validate":
        validate(a.gguf, a.n)
        return
    if a.kind == "precompute":
        precompute(a.gguf, a.cache_dir, 64, a.n)
        return
    if a.ids:
        ids = [int(x) for x in a.ids.split(",")]
    elif a.text is not None or a.chat is not None:
        text = a.text if a.text is not None else chat_text(a.chat)
        ids = tokenizer().encode(text).ids
    else:
        ap.error("one of --ids, --text, --chat")
    if a.no_cache or a.rope != "norm":
        t0 = time.time()
        m = Model(a.gguf)
        m.rope_mode = a.rope
        t1 = time.time()
        print(f"llama.py: load + dequantize {t1 - t0:.2f}s", file=sys.stderr)
        if a.kind == "greedy":
            rec = {"ids": ids, "n": a.n, "greedy": m.greedy(ids, a.n)}
        else:
            lg = m.logits(ids)
            rec = {"ids": ids, "shape": list(lg.shape), "top1": [int(i) for i in lg.argmax(-1)]}
        rec["seconds"] = round(time.time() - t1, 3)
    elif a.kind == "greedy":
        rec = cached_greedy(ids, a.n, a.gguf, a.cache_dir)
    else:
        rec = cached_logits(ids, a.gguf, a.cache_dir)
    if a.kind == "greedy":
        try:
            rec["text"] = tokenizer().decode(rec["greedy"], skip_special_tokens=False)
        except Exception as e:  # the tokenizer is optional for the oracle itself
            rec["text"] = f"(no tokenizer: {e})"
    json.dump(rec, sys.stdout, ensure_ascii=False)
    print()


if __name__ == "__main__":
    main()
