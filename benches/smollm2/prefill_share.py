#!/usr/bin/env python3
"""The prompt share of decoding epochs (`options.prefill_chunk_tokens`) on SmolLM2-135M-Instruct: one loom-serve
with `packages/smollm2` registered once per value (`c<N>`), the values alternating within each round.

    bash scripts/fetch-smollm2.sh && cargo build --release -p loom-serve
    python3 benches/smollm2/prefill_share.py [256,64,32] [rounds]

Two workloads, greedy with `ignore_eos`:
- `join`: 8 streams of 160 tokens decoding when a 1,300-token prompt arrives (2 s after them): the decoders'
  inter-token latency (p50 / p99 / max) and the long prompt's time to first token;
- `burst`: 16 short chat prompts at once, 128 tokens each: aggregate tokens/s, inter-token p50 / p99.
"""
import http.client
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import loomserve  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PACKAGE = os.path.join(ROOT, "packages", "smollm2")
PROSE = ("The history of the lighthouse is a history of light, of glass and of the people who kept the lamps "
         "burning through long winter nights. ")
CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWrite a short story about a lighthouse keeper number {i}.<|im_end|>\n"
        "<|im_start|>assistant\n")


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    values = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "256,64,32").split(",")]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    proc, port = loomserve.start(os.path.join(ROOT, "target", "release", "loom-serve"), PACKAGE,
                                 "smollm2-prefill-share.log")
    with open(os.path.join(PACKAGE, "model.json")) as f:
        options = json.load(f)["options"]
    names = []
    for v in values:
        names.append(f"c{v}")
        loomserve.register(port, names[-1], PACKAGE, dict(options, prefill_chunk_tokens=v))

    def stream(model, prompt, n):
        body = {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True,
                "stream": True}
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        t0 = time.perf_counter()
        times = [time.perf_counter() for ev in loomserve.sse_events(c, "/v1/completions", body)
                 if ev.get("choices")]
        c.close()
        return t0, times

    for name in names:  # warm: the epoch shapes of short and long prompts
        stream(name, CHAT.format(i=name), 8)
        stream(name, f"{name} " + PROSE * 60, 1)
    for r in range(rounds):
        for name in names:
            gaps, res, lock = [], {}, threading.Lock()

            def decoder(i):
                _, ts = stream(name, f"Story {r} {i}: once upon a time", 160)
                with lock:
                    gaps.extend(b - a for a, b in zip(ts, ts[1:]))

            def long_prompt():
                time.sleep(2.0)
                t0, ts = stream(name, f"{r}{name} " + PROSE * 55, 4)
                res["ttft"] = ts[0] - t0

            ths = [threading.Thread(target=decoder, args=(i,)) for i in range(8)]
            ths.append(threading.Thread(target=long_prompt))
            for t in ths:
                t.start()
            for t in ths:
                t.join()
            print(f"join  {name} round {r}: 8 decoders ITL p50 {pct(gaps, .5) * 1000:.0f} p99 "
                  f"{pct(gaps, .99) * 1000:.0f} max {max(gaps) * 1000:.0f} ms; 1,300-token prompt TTFT "
                  f"{res['ttft'] * 1000:.0f} ms", flush=True)
        for name in names:
            gaps, count, lock = [], [0], threading.Lock()

            def burst(i):
                _, ts = stream(name, CHAT.format(i=f"{r}-{name}-{i}"), 128)
                with lock:
                    gaps.extend(b - a for a, b in zip(ts, ts[1:]))
                    count[0] += 128

            ths = [threading.Thread(target=burst, args=(i,)) for i in range(16)]
            t0 = time.perf_counter()
            for t in ths:
                t.start()
            for t in ths:
                t.join()
            print(f"burst {name} round {r}: {count[0] / (time.perf_counter() - t0):.1f} tokens/s, ITL p50 "
                  f"{pct(gaps, .5) * 1000:.0f} p99 {pct(gaps, .99) * 1000:.0f} ms", flush=True)
    proc.terminate()
    proc.wait()


if __name__ == "__main__":
    main()
