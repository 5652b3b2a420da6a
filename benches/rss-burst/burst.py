#!/usr/bin/env python3
"""Resident memory of a loom-serve process around a burst of concurrent MiniLM embedding requests.

    target/release/loom-serve --port 18555 --log warn --model packages/minilm &
    python3 benches/rss-burst/burst.py 18555 $(pgrep -f "loom-serve --port 18555") 64 4

Arguments: port, the server's pid, clients, requests per client (8 corpus sentences each). Prints the RSS before,
right after and 5 s after the burst. `LOOM_TRIM=0` in the server's environment turns off the return of freed
memory (loom_cpu::trim) for an A/B run. Standard library only.
"""
import http.client, json, threading, time, sys, os, subprocess, re
port = int(sys.argv[1]); pid = int(sys.argv[2]); clients = int(sys.argv[3]); per = int(sys.argv[4])
corpus = [json.loads(l) for l in open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../packages/minilm/oracle/corpus.jsonl"))]
def rss():
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS"): return int(l.split()[1]) / 1024
def worker(i):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    for k in range(per):
        batch = [corpus[(i * 7 + k * 13 + j) % len(corpus)] for j in range(8)]
        c.request("POST", "/v1/embeddings", json.dumps({"model": "all-minilm-l6-v2", "input": batch}), {"content-type": "application/json"})
        r = c.getresponse(); r.read()
        assert r.status == 200, r.status
print(f"idle rss {rss():.1f} MiB")
t0 = time.time()
ts = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
[t.start() for t in ts]; [t.join() for t in ts]
print(f"burst {clients}x{per} in {time.time()-t0:.1f}s, rss right after {rss():.1f} MiB")
time.sleep(5); print(f"rss 5 s later {rss():.1f} MiB")
