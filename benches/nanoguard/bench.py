#!/usr/bin/env python3
"""NanoGuard classifications per second: loom-serve (`POST /classify`) against the numpy implementation
(packages/nanoguard/oracle/oracle.py) in float32, in one run, at batch 1 and batch 32.

    bash scripts/fetch-models.sh && cargo build --release -p loom-serve
    PYTHONPATH=.models/nanoguard python3 benches/nanoguard/bench.py [target/release/loom-serve] [rounds]

Starts the server itself (`--model packages/nanoguard`, the package's options: cohorts of at most 4
sequences, so a request of 32 texts is eight cohorts) on a free port. Texts: the test corpus
(packages/nanoguard/oracle/corpus.jsonl), taken in order, so both sides see the same mix of lengths; every text
costs one 512-token window on both sides (the wheel's scanner pads to the window, and so do both). Each side is
warmed up first (loom-serve compiles a stage per cohort size); numpy runs with the BLAS threads it finds (two on
this machine: OPENBLAS_NUM_THREADS is left alone), loom-serve with its 2-thread CPU device. numpy's time
includes tokenisation (tiktoken) and loom-serve's the HTTP round trip, JSON and tokenisation. Besides wall-clock
rates it prints CPU seconds per text (the server process's, from /proc; numpy's process time), which move less
when the machine is shared. The two are also checked against each other (max |p_loom - p_numpy32|).
"""
import http.client
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "packages", "nanoguard", "oracle"))
import oracle  # noqa: E402

sys.path.insert(0, os.path.dirname(HERE))
import loomserve  # noqa: E402


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target", "release", "loom-serve")
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    texts = [json.loads(l) for l in open(os.path.join(ROOT, "packages/nanoguard/oracle/corpus.jsonl"), encoding="utf-8")]
    server, port = loomserve.start(binary, os.path.join(ROOT, "packages", "nanoguard"),
                                   "nanoguard-bench-server.log")

    def loom(batch):
        # A connection per request (loopback: far below the model's time), so no keep-alive timer matters.
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        c.request("POST", "/classify", json.dumps({"model": "nanoguard", "input": batch}),
                  {"content-type": "application/json"})
        r = c.getresponse()
        body = r.read()
        c.close()
        assert r.status == 200, body[:300]
        return [d["probs"] for d in json.loads(body)["data"]]

    w = oracle.load_safetensors(os.path.join(ROOT, ".models/nanoguard/converted/model.safetensors"), np.float32)
    cos, sin = oracle.rotary(128, oracle.WINDOW)
    enc = oracle.tiktoken_encoding(os.path.join(ROOT, ".models/nanoguard"))

    def numpy32(batch):
        toks, pad = oracle.tokenize(enc, batch)
        ids = np.full((len(toks), oracle.WINDOW), pad, dtype=np.int64)
        mask = np.zeros((len(toks), oracle.WINDOW), dtype=bool)
        for j, (t, _) in enumerate(toks):
            ids[j, : len(t)] = t
            mask[j, : len(t)] = True
        return oracle.forward(w, ids, mask, cos, sin, np.float32).tolist()

    def cpu(side):
        if side == "numpy f32":
            return time.process_time()  # this process, BLAS threads included
        with open(f"/proc/{server.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    worst = 0.0
    print(f"{'batch':>5} {'side':>10} {'texts':>6} {'seconds':>8} {'class/s':>8} {'p50 ms':>8} {'cpu-s/text':>10}")
    for bsize, n in ((1, 16), (32, 64)):
        chunks = [texts[i: i + bsize] for i in range(0, n, bsize)]
        loom(texts[:bsize])  # warm: compile this cohort size
        for b in range(2, min(bsize, 4) + 1):
            loom(texts[:b])  # and the smaller cohort sizes a batch may be split into
        numpy32(texts[:bsize])
        res = {}
        for side, fn in (("loom-serve", loom), ("numpy f32", numpy32)):
            lat, t_all, c0 = [], 0.0, cpu(side)
            for _ in range(rounds):
                for c in chunks:
                    t0 = time.perf_counter()
                    fn(c)
                    dt = time.perf_counter() - t0
                    lat.append(dt)
                    t_all += dt
            res[side] = (n * rounds, t_all, sorted(lat)[len(lat) // 2], (cpu(side) - c0) / (n * rounds))
        for c in chunks[:2]:
            a, b = np.array(loom(c)), np.array(numpy32(c))
            worst = max(worst, float(np.abs(a - b).max()))
        for side, (cnt, t, p50, c) in res.items():
            print(f"{bsize:>5} {side:>10} {cnt:>6} {t:>8.2f} {cnt / t:>8.2f} {p50 * 1000:>8.1f} {c:>10.3f}")
        print(f"      ratio loom-serve / numpy f32: {res['numpy f32'][1] / res['loom-serve'][1]:.2f}x")
    print(f"max |p_loom - p_numpy_f32| {worst:.2e}")
    server.terminate()
    server.wait()


if __name__ == "__main__":
    main()
