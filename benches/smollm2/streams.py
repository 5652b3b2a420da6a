#!/usr/bin/env python3
"""16 concurrent greedy streams of 128 tokens on one loom-serve (SmolLM2, speculative verify off), for A/B runs of
two release binaries: aggregate tokens/s and the p50 time to first token of each round.

    .models/bench/venv/bin/python benches/smollm2/streams.py OLD_BINARY NEW_BINARY [rounds]

Each round starts one server per binary in turn (alternating, never both at once); prompts are the chat prompt of
`bench.py` behind a per-stream prefix ("Story i: "), different in every round, so the prefix cache serves none.
A first round per server warms it up and is not counted.
"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402


def one_server(binary, round_no):
    loom = bench.Loom(binary)
    results = []
    lock = threading.Lock()

    def one(i):
        t0, ts, n = loom.stream(f"Story {i}: " + bench.CHAT, 128)
        with lock:
            results.append((n, ts[0] - t0))

    def burst(r):
        threads = [threading.Thread(target=one, args=(100 * r + i,)) for i in range(16)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0

    burst(2 * round_no)  # warm-up
    results.clear()
    wall = burst(2 * round_no + 1)
    loom.stop()
    tokens = sum(n for n, _ in results)
    ttft = sorted(f for _, f in results)[len(results) // 2]
    return tokens / wall, ttft


def main():
    binaries = sys.argv[1:3]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    print("| round | binary | aggregate tok/s | TTFT p50 s |\n|---:|---|---:|---:|")
    for r in range(rounds):
        for b in binaries:
            rate, ttft = one_server(b, r)
            print(f"| {r + 1} | {b} | {rate:.1f} | {ttft:.2f} |")


if __name__ == "__main__":
    main()
