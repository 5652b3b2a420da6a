#!/usr/bin/env python3
"""Converts the NanoGuard wheel's assets (metatronnanoguard==0.1.0) into files loom-serve reads, without torch or
tiktoken and without executing anything from the files:

    nanoguard.py WHEEL_DIR OUT_DIR

WHEEL_DIR is where `pip install --target` put the wheel (it holds nanoguard/assets/model.pt and tokenizer.pkl).
Writes into OUT_DIR:

  model.safetensors  every tensor of the checkpoint's model_state_dict under its own name, as F32 (the BF16
                     linear/embedding weights widened exactly), plus `rope.cos` / `rope.sin` [512, 64]: the
                     rotary tables model.py builds (float32 angles, cos/sin rounded to bfloat16), widened to F32
  config.json        the checkpoint's `config` and `metrics` (the stored validation scores; not re-measured)
  tokenizer.json     a HuggingFace byte-level BPE tokenizer whose ids equal tiktoken's: the pickled encoding's
                     pattern (its possessive quantifiers kept: fancy-regex, the `tokenizers` crate's engine,
                     accepts them), its mergeable ranks as vocabulary and merges, its special tokens as added
                     tokens, and `<|reserved_0|>` (BOS) prepended by the post-processor

Both pickles are read by restricted unpicklers: `find_class` answers only the names listed below (the
tensor-rebuild function, the two storage types, OrderedDict; tiktoken's Encoding as a plain record of its
state) and raises for anything else, and no object's own code runs.
"""
import base64
import collections
import io
import json
import os
import pickle
import struct
import sys
import zipfile

import numpy as np

SEQUENCE_LEN = 512  # the model's window; model.py precomputes 2x this, of which the first 512 are ever used


class Refused(pickle.UnpicklingError):
    pass


# ---------------------------------------------------------------------------------------------------------------
# The checkpoint: a PyTorch zip (data.pkl + data/<key> storages)

class _Storage:
    def __init__(self, dtype):
        self.dtype = dtype


_STORAGES = {"FloatStorage": "f32", "BFloat16Storage": "bf16"}


def _rebuild_tensor_v2(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
    raw, dtype = storage
    itemsize = 4 if dtype == "f32" else 2
    base = np.frombuffer(raw, dtype="<f4" if dtype == "f32" else "<u2")
    n = int(np.prod(size)) if size else 1
    if n == 0:
        view = base[:0].reshape(size)
    else:
        end = offset + sum((s - 1) * st for s, st in zip(size, stride)) + 1
        if offset < 0 or end > len(base):
            raise Refused(f"tensor view outside its storage ({offset}, {size}, {stride})")
        view = np.lib.stride_tricks.as_strided(base[offset:], shape=size,
                                               strides=[st * itemsize for st in stride])
    a = np.array(view)  # a copy, contiguous
    if dtype == "bf16":
        a = (a.astype(np.uint32) << 16).view(np.float32)  # exact widening
    return a.astype(np.float32)


class _CheckpointUnpickler(pickle.Unpickler):
    def __init__(self, f, zf, prefix):
        super().__init__(f)
        self.zf, self.prefix = zf, prefix

    def find_class(self, module, name):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor_v2
        if module == "torch" and name in _STORAGES:
            return _Storage(_STORAGES[name])
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        raise Refused(f"the checkpoint names {module}.{name}, which this converter does not reconstruct")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _Storage)):
            raise Refused(f"unexpected persistent id {pid!r}")
        _, st, key, _location, numel = pid
        if not (isinstance(key, str) and key.isdigit()):
            raise Refused(f"storage key {key!r}")
        raw = self.zf.read(f"{self.prefix}data/{key}")
        itemsize = 4 if st.dtype == "f32" else 2
        if len(raw) != numel * itemsize:
            raise Refused(f"storage {key}: {len(raw)} bytes for {numel} elements")
        return (raw, st.dtype)


def read_checkpoint(path):
    zf = zipfile.ZipFile(path)
    pkl = [n for n in zf.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
    if len(pkl) != 1:
        raise Refused(f"{path}: expected one data.pkl, found {pkl}")
    prefix = pkl[0][: -len("data.pkl")]
    if zf.read(prefix + "byteorder").strip() != b"little":
        raise Refused("checkpoint is not little-endian")
    return _CheckpointUnpickler(io.BytesIO(zf.read(pkl[0])), zf, prefix).load()


# ---------------------------------------------------------------------------------------------------------------
# The tokenizer: a pickled tiktoken.core.Encoding (NEWOBJ with no arguments, then BUILD with its state dict)

class _EncodingState:
    """Stands in for tiktoken.core.Encoding: BUILD hands it the pickled state, which is only recorded."""

    def __setstate__(self, state):
        if not isinstance(state, dict):
            raise Refused("tiktoken state is not a dict")
        self.state = state


class _TokenizerUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) == ("tiktoken.core", "Encoding"):
            return _EncodingState
        raise Refused(f"the tokenizer pickle names {module}.{name}, which this converter does not reconstruct")

    def persistent_load(self, pid):
        raise Refused("persistent ids in the tokenizer pickle")


def read_tiktoken(path):
    with open(path, "rb") as f:
        enc = _TokenizerUnpickler(f).load()
    if not isinstance(enc, _EncodingState):
        raise Refused("tokenizer.pkl does not hold a tiktoken Encoding")
    st = enc.state
    pat, ranks, special = st["pat_str"], st["mergeable_ranks"], st["special_tokens"]
    assert isinstance(pat, str)
    assert all(isinstance(k, bytes) and isinstance(v, int) for k, v in ranks.items())
    assert all(isinstance(k, str) and isinstance(v, int) for k, v in special.items())
    return st.get("name"), pat, ranks, special


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character map (what the ByteLevel pre-tokenizer uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) \
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def bpe_split(ranks, token):
    """tiktoken's own BPE of `token` with the ranks below `token`'s: the two parts it was merged from."""
    limit = ranks[token]
    parts = [bytes([b]) for b in token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < limit and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            break
        i = best[1]
        parts[i: i + 2] = [parts[i] + parts[i + 1]]
    return parts


def tokenizer_json(pat, ranks, special, bos):
    b2u = bytes_to_unicode()
    tok = lambda b: "".join(b2u[x] for x in b)
    vocab = {tok(b): r for b, r in ranks.items()}
    if len(vocab) != len(ranks):
        raise ValueError("two ranks map to one byte-level string")
    # One merge per multi-byte token, in rank order: the pair tiktoken's BPE merges into it. HF merges by pair
    # priority, tiktoken by the rank of the merged token; with one merge per token, ranked as the token, the two
    # agree (checked on a corpus by tests/test_nanoguard_tokenizer.py).
    merges = []
    for b, r in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(b) < 2:
            continue
        parts = bpe_split(ranks, b)
        if len(parts) != 2:
            raise ValueError(f"token {b!r} (rank {r}) is not one merge of two lower-ranked tokens: {parts}")
        merges.append([tok(parts[0]), tok(parts[1])])
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for s, i in sorted(special.items(), key=lambda kv: kv[1])]
    bos_id = special[bos]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pat}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        ]},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": merges},
    }


# ---------------------------------------------------------------------------------------------------------------

def rope_tables(head_dim, seq_len, base=10000.0):
    """model.py's _precompute_rotary in float32 (torch's order of operations), cos/sin rounded to bfloat16
    (round to nearest even), returned widened to float32 [seq_len, head_dim / 2]."""
    ch = np.arange(0, head_dim, 2, dtype=np.float32)
    inv = (np.float32(1.0) / np.power(np.float32(base), ch / np.float32(head_dim))).astype(np.float32)
    t = np.arange(seq_len, dtype=np.float32)
    freqs = np.outer(t, inv).astype(np.float32)
    return to_bf16(np.cos(freqs).astype(np.float32)), to_bf16(np.sin(freqs).astype(np.float32))


def to_bf16(a):
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def write_safetensors(path, tensors):
    header, blobs, at = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, dtype="<f4")
        b = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def write_text(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    wheel, out = sys.argv[1:]
    assets = os.path.join(wheel, "nanoguard", "assets")
    os.makedirs(out, exist_ok=True)
    ck = read_checkpoint(os.path.join(assets, "model.pt"))
    sd, cfg = ck["model_state_dict"], dict(ck["config"])
    head_dim = cfg["n_embd"] // cfg["n_head"]
    tensors = collections.OrderedDict((k, v) for k, v in sd.items())
    cos, sin = rope_tables(head_dim, cfg["sequence_len"])
    tensors["rope.cos"] = cos
    tensors["rope.sin"] = sin
    write_safetensors(os.path.join(out, "model.safetensors"), tensors)
    write_text(os.path.join(out, "config.json"),
               json.dumps({"config": cfg, "metrics": dict(ck.get("metrics", {})),
                           "source": "metatronnanoguard==0.1.0 nanoguard/assets/model.pt"}, indent=1))
    name, pat, ranks, special = read_tiktoken(os.path.join(assets, "tokenizer.pkl"))
    tj = tokenizer_json(pat, ranks, special, "<|reserved_0|>")
    write_text(os.path.join(out, "tokenizer.json"), json.dumps(tj, ensure_ascii=False))
    n = sum(int(np.prod(v.shape)) for k, v in sd.items())
    print(f"nanoguard.py: {len(sd)} tensors ({n / 1e6:.1f} M parameters), {len(ranks)} ranks + {len(special)} "
          f"special tokens (encoding {name!r}) -> {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
