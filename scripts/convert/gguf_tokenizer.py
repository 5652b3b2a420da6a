#!/usr/bin/env python3
"""Writes a HuggingFace tokenizer.json from the tokenizer metadata of a GGUF file (torch-free).

    gguf_tokenizer.py MODEL.gguf OUT/tokenizer.json [--chat-template OUT/chat_template.jinja]

Only the byte-level BPE form llama.cpp calls `gpt2` (`tokenizer.ggml.model`) is handled, with the pre-tokenizers
whose regex splits are known below (`tokenizer.ggml.pre`); anything else is refused rather than guessed.

- model: BPE over `tokenizer.ggml.tokens` (ids are the positions; the strings are already in the GPT-2 byte-to-
  unicode alphabet, `Ġ` for a space) and `tokenizer.ggml.merges` (`"a b"`, rank = position), no unk, no dropout.
- added tokens: every token whose `tokenizer.ggml.token_type` is CONTROL (3) as special=true, USER_DEFINED (4) as
  special=false; both not normalized, matched whole in the input text as llama.cpp does.
- pre-tokenizer for `smollm` (llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM, src/llama-vocab.cpp): llama.cpp applies two
  regex splits in sequence, `\\p{N}` (every number code point alone) and then the GPT-2 regex
  `'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)` on each piece. That is the
  `tokenizers` Sequence [Digits(individual_digits), ByteLevel(use_regex)] (Digits isolates chars with Unicode
  category N, as `\\p{N}` does), which is also what SmolLM2's own tokenizer.json declares.
- post-processor / decoder: ByteLevel (no BOS or EOS added: `tokenizer.ggml.add_bos_token` must be false).
- bos / eos / unk / pad ids from `tokenizer.ggml.*_token_id` are range-checked and printed (a tokenizer.json has no
  field for them, and `tokenizers` refuses unknown top-level keys; the package declares them itself).
- the chat template (`tokenizer.chat_template`) is written byte-for-byte to --chat-template if given.
"""
import argparse
import json
import os
import sys

import gguf

CONTROL, USER_DEFINED = 3, 4

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"

# tokenizer.ggml.pre -> (list of regexes llama.cpp applies in sequence, tokenizers pre_tokenizer)
PRE_TOKENIZERS = {
    "smollm": (
        [r"\p{N}", GPT2_REGEX],
        {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            ],
        },
    ),
}


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def convert(path):
    r = gguf.GGUFReader(path)
    model = field(r, "tokenizer.ggml.model")
    if model != "gpt2":
        raise SystemExit(f"gguf_tokenizer.py: tokenizer.ggml.model is {model!r}; only 'gpt2' (byte-level BPE) is handled")
    pre = field(r, "tokenizer.ggml.pre")
    if pre not in PRE_TOKENIZERS:
        raise SystemExit(f"gguf_tokenizer.py: tokenizer.ggml.pre {pre!r} has no known split (known: {sorted(PRE_TOKENIZERS)})")
    if field(r, "tokenizer.ggml.add_bos_token", False) or field(r, "tokenizer.ggml.add_eos_token", False):
        raise SystemExit("gguf_tokenizer.py: add_bos_token / add_eos_token set; a post-processor for them is not written")
    if field(r, "tokenizer.ggml.add_space_prefix", False):
        raise SystemExit("gguf_tokenizer.py: add_space_prefix set; not handled")
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    merges = field(r, "tokenizer.ggml.merges")
    if len(tokens) != len(types):
        raise SystemExit("gguf_tokenizer.py: tokens and token_type differ in length")
    vocab = {}
    for i, t in enumerate(tokens):
        if t in vocab:
            raise SystemExit(f"gguf_tokenizer.py: token {t!r} appears twice ({vocab[t]} and {i})")
        vocab[t] = i
    pairs = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if not sep or " " in b or a + b not in vocab or a not in vocab or b not in vocab:
            raise SystemExit(f"gguf_tokenizer.py: bad merge {m!r}")
        pairs.append([a, b])
    added = []
    for i, (t, ty) in enumerate(zip(tokens, types)):
        ty = int(ty)
        if ty in (CONTROL, USER_DEFINED):
            added.append({"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": ty == CONTROL})
        elif ty != 1:
            raise SystemExit(f"gguf_tokenizer.py: token {i} {t!r} has token_type {ty}; not handled")
    special_ids = {}
    for name in ("bos", "eos", "unknown", "padding"):
        v = field(r, f"tokenizer.ggml.{name}_token_id")
        if v is None:
            continue
        v = int(v)
        if not 0 <= v < len(tokens):
            raise SystemExit(f"gguf_tokenizer.py: {name}_token_id {v} out of range")
        special_ids[name] = {"id": v, "token": tokens[v]}
    _, pre_tok = PRE_TOKENIZERS[pre]
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": pre_tok,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": pairs,
        },
    }
    return tok, pre, special_ids, field(r, "tokenizer.chat_template")


def write(path, data, binary=False):
    tmp = path + ".tmp"
    with open(tmp, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8", "newline": ""})) as f:
        f.write(data)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf")
    ap.add_argument("out")
    ap.add_argument("--chat-template")
    a = ap.parse_args()
    tok, pre, special_ids, template = convert(a.gguf)
    write(a.out, json.dumps(tok, ensure_ascii=False, indent=None))
    n_special = sum(t["special"] for t in tok["added_tokens"])
    print(f"gguf_tokenizer.py: {a.out}: {len(tok['model']['vocab'])} tokens, {len(tok['model']['merges'])} merges, "
          f"{n_special} special, pre {pre!r}, "
          + ", ".join(f"{k} {v['id']} {v['token']}" for k, v in special_ids.items()), file=sys.stderr)
    if a.chat_template:
        if template is None:
            raise SystemExit("gguf_tokenizer.py: the GGUF has no tokenizer.chat_template")
        write(a.chat_template, template.encode("utf-8"), binary=True)
        print(f"gguf_tokenizer.py: {a.chat_template}: {len(template)} characters", file=sys.stderr)


if __name__ == "__main__":
    main()
