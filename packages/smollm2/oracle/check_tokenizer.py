#!/usr/bin/env python3
"""Checks packages/smollm2/tokenizer.json (written by scripts/convert/gguf_tokenizer.py) against an independent
reference encoder built here from the GGUF's own vocabulary and merges.

    PYTHONPATH=.models/smollm2 python3 packages/smollm2/oracle/check_tokenizer.py [--gguf G] [--tokenizer T] [--fuzz N]

The reference follows llama.cpp's BPE path for `tokenizer.ggml.pre = "smollm"` (src/llama-vocab.cpp,
LLAMA_VOCAB_PRE_TYPE_SMOLLM) without using `tokenizers` or the converter:
  1. control tokens (token_type 3) are cut out of the text first, longest first, and map to their own ids;
  2. each remaining stretch goes through llama.cpp's regex splits in sequence, `\\p{N}` and then the GPT-2 regex,
     each applied to every piece of the previous one, unmatched text kept as its own piece (llama.cpp's
     unicode_regex_split), with the `regex` module;
  3. each piece's UTF-8 bytes map to GPT-2's byte-to-unicode alphabet and are merged by rank (the position in
     `tokenizer.ggml.merges`), the lowest rank first, every occurrence left to right, until no pair has a rank;
  4. each merged symbol's id is its position in `tokenizer.ggml.tokens`; a byte with no token of its own is
     dropped, as llama.cpp does (and `tokenizers` with no unk token). This vocabulary lacks 21 of the 256 byte
     tokens: 0x04 0x06 0x13 0x14 0x16 0x1d, 0xc0 0xc1 and 0xf5-0xff (never in UTF-8), and 0xf1 0xf2 (lead bytes of
     planes 4-11, unassigned): so text with such a character does not decode back to itself, only to the text
     without it, which is what the decode check expects.
Asserted for every text of a fixed corpus (special tokens, digits, whitespace runs, tabs and newlines, accents, CJK,
emoji, code, contractions, Unicode numbers) and of a seeded random fuzz: `tokenizers` gives the same ids, and
decoding them (special tokens kept) gives the text back. Also renders chat_template.jinja with minijinja for a few
message lists and compares with hand-written ChatML. Exits 1 on any disagreement (the first 20 are listed).
"""
import argparse
import os
import random
import sys

import gguf
import regex
from tokenizers import Tokenizer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
GGUF = os.path.join(ROOT, "packages/smollm2/model/SmolLM2-135M-Instruct.Q4_1.gguf")
TOKENIZER = os.path.join(ROOT, "packages/smollm2/tokenizer.json")

# llama.cpp src/llama-vocab.cpp, case LLAMA_VOCAB_PRE_TYPE_SMOLLM (shared with STARCODER, REFACT, COMMAND_R, ...)
LLAMA_SPLITS = [
    r"\p{N}",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
]


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable code point table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


class Reference:
    def __init__(self, gguf_path):
        r = gguf.GGUFReader(gguf_path)
        pre = r.fields["tokenizer.ggml.pre"].contents()
        assert pre == "smollm", f"tokenizer.ggml.pre is {pre!r}: this reference knows only 'smollm'"
        assert r.fields["tokenizer.ggml.model"].contents() == "gpt2"
        self.tokens = r.fields["tokenizer.ggml.tokens"].contents()
        types = r.fields["tokenizer.ggml.token_type"].contents()
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.ranks = {}
        for rank, m in enumerate(r.fields["tokenizer.ggml.merges"].contents()):
            a, b = m.split(" ")
            self.ranks.setdefault((a, b), rank)
        self.special = sorted((t for t, ty in zip(self.tokens, types) if int(ty) == 3), key=len, reverse=True)
        self.special_re = regex.compile("|".join(regex.escape(s) for s in self.special))
        self.splits = [regex.compile(p) for p in LLAMA_SPLITS]
        self.byte_map = bytes_to_unicode()
        self.dropped = {b for b, c in self.byte_map.items() if c not in self.ids}
        self.cache = {}

    def pre_tokenize(self, text):
        pieces = [text]
        for rx in self.splits:
            out = []
            for p in pieces:
                at = 0
                for m in rx.finditer(p):
                    if m.start() > at:
                        out.append(p[at:m.start()])
                    if m.end() > m.start():
                        out.append(m.group())
                    at = m.end()
                if at < len(p):
                    out.append(p[at:])
            pieces = out
        return pieces

    def bpe(self, piece):
        if piece in self.cache:
            return self.cache[piece]
        word = [self.byte_map[b] for b in piece.encode("utf-8")]
        while len(word) > 1:
            best = min(range(len(word) - 1), key=lambda i: self.ranks.get((word[i], word[i + 1]), 1 << 60))
            pair = (word[best], word[best + 1])
            if pair not in self.ranks:
                break
            merged, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        ids = []
        for s in word:
            if s in self.ids:
                ids.append(self.ids[s])
            else:
                # llama.cpp: a symbol with no token goes out byte by byte, bytes with no token dropped.
                ids += [self.ids[c] for c in s if c in self.ids]
        self.cache[piece] = ids
        return ids

    def encode(self, text):
        ids, at = [], 0
        for m in self.special_re.finditer(text):
            for p in self.pre_tokenize(text[at:m.start()]):
                ids += self.bpe(p)
            ids.append(self.ids[m.group()])
            at = m.end()
        for p in self.pre_tokenize(text[at:]):
            ids += self.bpe(p)
        return ids


CORPUS = [
    "",
    "a",
    "Hello",
    " Hello",
    "Hello world",
    "The capital of France is Paris.",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n",
    "a<|im_start|>b<|im_end|>c<|im_end|><|im_end|>",
    "<|im_start |> <im_start> <|im_start|",
    "<repo_name>loom<file_sep>src/main.rs<filename>x.py<gh_stars>100<issue_start>",
    "<jupyter_start><jupyter_text>t<jupyter_code>print(1)<jupyter_output>1<empty_output><jupyter_script>",
    "12345",
    "0",
    " 2026",
    "3.14159",
    "1,000,000 and 1e-9 and 0x1F and -42",
    "Call 555-0199 before 23:59 on 2026-12-02.",
    "٣٤٥ ²³ ½ Ⅻ ① ０１２ 𝟙𝟚",
    "  ",
    "    leading spaces",
    "trailing spaces    ",
    "a  b   c    d",
    "\t",
    "\ttab\tseparated\tvalues\t",
    "\n",
    "\n\n\n",
    "line one\nline two\r\nline three\rline four",
    " \n \n  \n\t \t",
    "word\n\n    indented after blank line",
    "\u00a0non-breaking\u00a0space\u2009thin\u3000ideographic",
    "café naïve résumé Zürich façade São Ελλάδα Москва",
    "Ünïcödé ÀÉÎÕÜ ßẞ ǅ ﬁ",
    "東京 北京大学 日本語のテキストです。",
    "한국어 텍스트",
    "مرحبا بالعالم",
    "हिन्दी पाठ",
    "🙂 🚀 😀😃😄 👩‍💻 🇫🇷 ❤️ 👍🏽",
    "e\u0301 combining acute, a\u0308 combining diaeresis",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "don't won't it's I'm you're we've they'll he'd",
    "DON'T IT'S I'M YOU'RE",
    "'s 't 're 've 'm 'll 'd",
    "rock 'n' roll, 'quoted', \"double\", `tick`",
    "def f(x):\n    return x ** 2  # square\n",
    "fn main() {\n\tlet v: Vec<u8> = vec![1, 2, 3];\n\tprintln!(\"{:?}\", v);\n}\n",
    "<div class=\"a\">&amp; &lt;tag&gt;</div>",
    "SELECT * FROM t WHERE id = 7 AND name LIKE '%x%';",
    "https://example.com/path?q=1&r=two#frag",
    "user@example.org #hashtag @mention $100 50% a+b=c a^b~c|d",
    "!!!??? ... --- *** ___ ===",
    "(((nested))) [[brackets]] {{braces}}",
    "a" * 200,
    "ab" * 100,
    " " * 64,
    "x\x00y\x01z\x7f",
    "\x1c\x1d\x1e\x1f\x85 control-ish whitespace",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
]

FUZZ_POOL = (
    list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") * 4
    + list("0123456789") * 3
    + list(" ") * 12
    + list("\t\n\r") * 2
    + list(".,;:!?'\"-()[]{}<>/\\|_*&^%$#@~`+=")
    + list("éüñçøåßÀÉ東京日本語한국🙂🚀😀٣²½Ⅻ\u00a0\u3000\u200b\u0301")
    + ["'s", "'t", "'re", "'ll", " the", " and", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "\n\n", "    "]
)


def fuzz(n, seed=16):
    rng = random.Random(seed)
    return ["".join(rng.choice(FUZZ_POOL) for _ in range(rng.randint(1, 40))) for _ in range(n)]


TEMPLATE = os.path.join(ROOT, "packages/smollm2/chat_template.jinja")
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def check_template():
    """chat_template.jinja (the GGUF's, byte for byte: scripts/fetch-smollm2.sh checks) rendered by minijinja is
    ChatML, with SmolLM's default system turn when the first message is not a system message."""
    from minijinja import Environment
    env = Environment(templates={"chat": open(TEMPLATE, encoding="utf-8").read()})
    turn = lambda role, content: f"<|im_start|>{role}\n{content}<|im_end|>\n"
    cases = [
        ([("user", "Hi")], True, turn("system", DEFAULT_SYSTEM) + turn("user", "Hi") + "<|im_start|>assistant\n"),
        ([("user", "Hi")], False, turn("system", DEFAULT_SYSTEM) + turn("user", "Hi")),
        ([("system", "Be brief."), ("user", "2+2?"), ("assistant", "4"), ("user", "And 3+3?")], True,
         turn("system", "Be brief.") + turn("user", "2+2?") + turn("assistant", "4") + turn("user", "And 3+3?")
         + "<|im_start|>assistant\n"),
        ([("user", "{{ 7*7 }} {% if true %}x{% endif %}")], True,  # content is data, not template code
         turn("system", DEFAULT_SYSTEM) + turn("user", "{{ 7*7 }} {% if true %}x{% endif %}") + "<|im_start|>assistant\n"),
    ]
    bad = 0
    for msgs, gen, want in cases:
        got = env.render_template("chat", messages=[{"role": r, "content": c} for r, c in msgs],
                                  add_generation_prompt=gen)
        if got != want:
            bad += 1
            print(f"TEMPLATE MISMATCH {msgs!r} add_generation_prompt={gen}\n  want {want!r}\n  got  {got!r}",
                  file=sys.stderr)
    print(f"check_tokenizer.py: chat template: {len(cases) - bad}/{len(cases)} renderings are the expected ChatML",
          file=sys.stderr)
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", default=GGUF)
    ap.add_argument("--tokenizer", default=TOKENIZER)
    ap.add_argument("--fuzz", type=int, default=2000, help="seeded random texts besides the fixed corpus")
    a = ap.parse_args()
    ref = Reference(a.gguf)
    tok = Tokenizer.from_file(a.tokenizer)
    texts = CORPUS + fuzz(a.fuzz)
    bad, n_ids, n_dropped = [], 0, 0
    for text in texts:
        want = ref.encode(text)
        got = tok.encode(text).ids
        n_ids += len(want)
        back = tok.decode(got, skip_special_tokens=False)
        kept = "".join(ch for ch in text if not ref.dropped.intersection(ch.encode("utf-8")))
        n_dropped += kept != text
        if got != want or back != kept:
            bad.append((text, want, got, back))
    # The control tokens are single ids in both directions.
    for s in ref.special:
        if tok.encode(s).ids != [ref.ids[s]] or tok.token_to_id(s) != ref.ids[s]:
            bad.append((s, [ref.ids[s]], tok.encode(s).ids, None))
    for text, want, got, back in bad[:20]:
        print(f"MISMATCH {text!r}\n  reference  {want}\n  tokenizers {got}\n  decoded    {back!r}", file=sys.stderr)
    print(f"check_tokenizer.py: {len(texts)} texts ({len(CORPUS)} fixed + {a.fuzz} fuzz), {n_ids} reference ids, "
          f"{len(ref.special)} control tokens: {len(texts) + len(ref.special) - len(bad)} agree, {len(bad)} differ "
          f"({n_dropped} texts hold characters whose bytes have no token)",
          file=sys.stderr)
    bad_template = check_template()
    sys.exit(1 if bad or bad_template else 0)


if __name__ == "__main__":
    main()
