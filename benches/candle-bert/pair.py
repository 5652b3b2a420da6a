"""Paired A/B of two loom-serve builds serving all-MiniLM-L6-v2, for hosts whose speed moves by 2x within
minutes (the shared Xeon of BENCHMARKS.md): both servers run at once, each idle while the other works, and
requests alternate between them one by one (the order flips every pair), so both meet the same phases of the
host. Prints, per request size, each side's median sentences/s and the paired ratio of request times A / B
(median and quartiles: above 1 means B is faster).

    python3 benches/candle-bert/pair.py BINARY_A:PACKAGE_A BINARY_B:PACKAGE_B [SIZES] [PAIRS]

SIZES is a comma-separated list of request sizes (default 1,8,32), PAIRS the pairs per size (default 120).
The corpus is `short.jsonl` (256 short mixed sentences), every batch posted once to each server first (so
every cohort extent is compiled). A package directory must sit beside `packages/motifs` (its model.json
names `../motifs/*.loom`): copy both to compare an edited package with the committed one.
"""
import http.client
import json
import os
import statistics as st
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import loomserve  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
MODEL = json.load(open(os.path.join(ROOT, "packages/minilm/model.json")))["name"]
CORPUS = [json.loads(line) for line in open(os.path.join(HERE, "short.jsonl"))]


def post(port, batch):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/embeddings", json.dumps({"model": MODEL, "input": batch}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    r.read()
    c.close()
    assert r.status == 200, r.status


def main():
    (ba, pa), (bb, pb) = (x.split(":", 1) for x in sys.argv[1:3])
    sizes = [int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "1,8,32").split(",")]
    pairs = int(sys.argv[4]) if len(sys.argv) > 4 else 120
    a = loomserve.start(ba, pa, "pair-a.log")
    b = loomserve.start(bb, pb, "pair-b.log")
    try:
        for n in sizes:
            batches = [CORPUS[i:i + n] for i in range(0, len(CORPUS), n)]
            for x in batches:
                post(a[1], x)
                post(b[1], x)
            ta, tb = [], []
            for r in range(pairs):
                x = batches[r % len(batches)]
                order = [(a, ta), (b, tb)] if r % 2 == 0 else [(b, tb), (a, ta)]
                for (srv, acc) in order:
                    t0 = time.perf_counter()
                    post(srv[1], x)
                    acc.append(time.perf_counter() - t0)
            ratios = [x / y for x, y in zip(ta, tb)]
            q = st.quantiles(ratios, n=4)
            print(f"requests of {n}: A {n / st.median(ta):.1f} sent/s, B {n / st.median(tb):.1f} sent/s; "
                  f"time A / B paired median {st.median(ratios):.3f} (quartiles {q[0]:.3f}, {q[2]:.3f}), "
                  f"{pairs} pairs", flush=True)
    finally:
        for p in (a[0], b[0]):
            p.terminate()
            p.wait()


if __name__ == "__main__":
    main()
