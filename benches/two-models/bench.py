"""Two models on one CPU device: all-MiniLM-L6-v2 embeddings and SmolLM2-135M chat decoding served by one
loom-serve, each alone and both at once.

Usage: python3 benches/two-models/bench.py [target/release/loom-serve] [SECONDS]   (default 20 s a phase)

Workload: 8 clients posting one sentence each to /v1/embeddings (benches/candle-bert/short.jsonl, in order), and
4 clients streaming /v1/chat/completions (a short chat prompt, 48 tokens, temperature 0, ignore_eos), each for
SECONDS. Three phases: embeddings alone, chat alone, both. During the shared phase /metrics is sampled every
25 ms: the share of samples in which both models have work running (`loom_requests_running` for MiniLM,
`loom_text_running` for SmolLM2) shows their cohorts in flight at once (each invocation submits on a timeline
of its own, and the CPU device runs timelines in lanes side by side). The peer is each model alone in the same
run: the shared phase's rates as a fraction of the solo rates, summed, say how much of one model's machine the
pair gets (1.0: the cores are shared without loss; below: interference).
"""
import http.client
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import loomserve  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/loom-serve")
SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 20.0
EMBED_CLIENTS, CHAT_CLIENTS, CHAT_TOKENS = 8, 4, 48
TEXTS = [json.loads(line) for line in open(os.path.join(ROOT, "benches/candle-bert/short.jsonl"))]


def post(port, path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"{path}: {r.status} {data[:300]!r}")
    return json.loads(data)


def post_status(port, path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    r.read()
    c.close()
    return r.status


def embed_client(port, k, stop, out):
    i = k
    n = 0
    while not stop.is_set():
        post(port, "/v1/embeddings", {"model": "all-minilm-l6-v2", "input": TEXTS[i % len(TEXTS)]})
        i += EMBED_CLIENTS
        n += 1
    out.append(n)


def chat_client(port, k, stop, out):
    n = 0
    while not stop.is_set():
        v = post(port, "/v1/chat/completions", {
            "model": "smollm2", "max_tokens": CHAT_TOKENS, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"Write a short story about lighthouse number {k}."}]})
        n += v["usage"]["completion_tokens"]
    out.append(n)


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    vals = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            vals[k] = float(v)
    return vals


def phase(port, embed, chat):
    stop = threading.Event()
    e_out, c_out = [], []
    ts = []
    if embed:
        ts += [threading.Thread(target=embed_client, args=(port, k, stop, e_out)) for k in range(EMBED_CLIENTS)]
    if chat:
        ts += [threading.Thread(target=chat_client, args=(port, k, stop, c_out)) for k in range(CHAT_CLIENTS)]
    t0 = time.time()
    for t in ts:
        t.start()
    samples = both = 0
    while time.time() - t0 < SECONDS:
        m = metrics(port)
        e = m.get('loom_requests_running{model="all-minilm-l6-v2"}', 0) > 0
        c = m.get('loom_text_running{model="smollm2"}', 0) > 0
        samples += 1
        both += e and c
        time.sleep(0.025)
    stop.set()
    for t in ts:
        t.join()
    el = time.time() - t0
    return sum(e_out) / el, sum(c_out) / el, (both / samples if samples else 0.0)


def main():
    proc, port = loomserve.start(BIN, os.path.join(ROOT, "packages/minilm"), "two-models.log")
    try:
        v = post_status(port, "/v1/models", {"base": os.path.join(ROOT, "packages/smollm2")})
        assert v == 201, v
        # Warm both (compile the shapes the phases use).
        ph = phase
        global SECONDS
        s = SECONDS
        SECONDS = 3.0
        ph(port, True, True)
        SECONDS = s
        e_alone, _, _ = phase(port, True, False)
        _, c_alone, _ = phase(port, False, True)
        e_both, c_both, overlap = phase(port, True, True)
        print(f"two models on one 2-thread CPU device, {SECONDS:.0f} s a phase "
              f"({EMBED_CLIENTS} embedding clients x 1 sentence, {CHAT_CLIENTS} chat streams x {CHAT_TOKENS} tokens)")
        print()
        print("| model | alone | both at once | both / alone |")
        print("|---|---:|---:|---:|")
        print(f"| all-MiniLM-L6-v2, sentences/s | {e_alone:.1f} | {e_both:.1f} | {e_both / e_alone:.2f} |")
        print(f"| SmolLM2-135M, tokens/s | {c_alone:.1f} | {c_both:.1f} | {c_both / c_alone:.2f} |")
        print(f"| sum of the shares | | | {e_both / e_alone + c_both / c_alone:.2f} |")
        print()
        print(f"samples of /metrics during the shared phase with both models running: {100 * overlap:.0f} %")
        m = metrics(port)
        print("work timelines held:", {k: v for k, v in m.items() if k.startswith("loom_work_timelines")})
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
