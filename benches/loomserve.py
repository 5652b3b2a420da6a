"""Starting the release loom-serve for the Python benchmarks (benches/*/bench.py): a free port, the server
with one package (`--model`), and the wait until `/health` answers 200."""
import http.client
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
    for _ in range(1200):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            if r.status == 200:
                break
        except OSError:
            pass
        time.sleep(0.1)
    return proc, port
