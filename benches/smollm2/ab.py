#!/usr/bin/env python3
"""A/B of two versions of the SmolLM2 package in one loom-serve: `packages/smollm2` (A) and a copy with a change
(B, e.g. `packages/smollm2-b`, made with `cp -r` and `cp -al` for its `model/`; give it another `name`), both
registered with speculative verify off, alternating 200-token greedy decodes after a chat prompt. The same
binary serves both, so only the package differs; alternation spreads this machine's drifting speed over both.

    python3 benches/smollm2/ab.py packages/smollm2-b [rounds]

Prints each round's decode tokens/s (first to last streamed token) and the best and median of each side.
"""
import http.client
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import loomserve  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWrite a short story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n")


def main():
    other = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    proc, port = loomserve.start(os.path.join(ROOT, "target", "release", "loom-serve"),
                                 os.path.join(ROOT, "packages", "smollm2"), "smollm2-ab.log")
    with open(os.path.join(ROOT, "packages", "smollm2", "model.json")) as f:
        options = dict(json.load(f)["options"], speculative_tokens=0)
    for name, pkg in (("A", os.path.join(ROOT, "packages", "smollm2")), ("B", os.path.abspath(other))):
        loomserve.register(port, name, pkg, options)

    def decode(model, n, r):
        body = {"model": model, "prompt": f"{r} " + CHAT, "max_tokens": n, "temperature": 0, "ignore_eos": True,
                "stream": True}
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        ts = [time.perf_counter() for ev in loomserve.sse_events(c, "/v1/completions", body) if ev.get("choices")]
        c.close()
        return (len(ts) - 1) / (ts[-1] - ts[0])

    for m in "AB":  # warm: the decode epoch's shapes
        decode(m, 20, -1)
    res = {"A": [], "B": []}
    for r in range(rounds):
        for m in "AB":
            res[m].append(decode(m, 200, r))
        print(r, {m: round(v[-1], 1) for m, v in res.items()}, flush=True)
    print("best", {m: round(max(v), 1) for m, v in res.items()},
          "median", {m: round(sorted(v)[len(v) // 2], 1) for m, v in res.items()})
    proc.terminate()
    proc.wait()


if __name__ == "__main__":
    main()
