"""Starting the release loom-serve for the Python benchmarks (benches/*/bench.py): a free port, the server
with one package (`--model`), and the wait until `/health` answers 200; registering more (`register`) and
reading an SSE stream (`sse_events`)."""
import http.client
import json
import os
import socket
import subprocess
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start(binary, package_dir, log_name):
    """Starts `binary` serving `package_dir` on a free port (its log in $TMPDIR/`log_name`, warnings only) and
    waits until it is healthy (at most two minutes). Returns (process, port)."""
    port = free_port()
    log = open(os.path.join(os.environ.get("TMPDIR", "/tmp"), log_name), "w")
    proc = subprocess.Popen([binary, "--port", str(port), "--log", "warn", "--model", package_dir],
                            stdout=subprocess.PIPE, stderr=log)
    proc.stdout.readline()
    wait_healthy(port)
    return proc, port


def register(port, name, base, options):
    """Registers the package at `base` as model `name` with `options` (replacing its `model.json` options) on
    the server at `port`; fails unless it is ready (201)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/models", json.dumps({"name": name, "base": base, "options": options}),
              {"content-type": "application/json"})
    r = c.getresponse()
    body = r.read()
    c.close()
    assert r.status == 201, body


def wait_healthy(port):
    """Waits (at most two minutes) until `GET /health` on `port` answers 200 (loom-serve's and llama-server's)."""
    for _ in range(1200):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            if r.status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)


def sse_events(conn, path, body):
    """POSTs `body` (JSON) to `path` and yields each `data:` event of the streamed answer, parsed, until
    `[DONE]` or the end of the stream."""
    conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, r.read()[:300]
    while True:
        line = r.readline()
        if not line:
            return
        line = line.strip()
        if line == b"data: [DONE]":
            return
        if line.startswith(b"data: "):
            yield json.loads(line[6:])
