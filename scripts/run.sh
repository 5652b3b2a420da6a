#!/usr/bin/env bash
# The main job, for now: build `loomc` and run the example Loom programs in the sandboxed VM.
# (The model server itself does not exist yet; see README.md "Status".)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p loomc
loomc=target/release/loomc
for f in packages/examples/*.loom; do
  echo "== loomc check $f"
  "$loomc" check "$f"
done
echo "== loomc run packages/examples/fib.loom --entry main 30"
"$loomc" run packages/examples/fib.loom --entry main 30
echo "== loomc run packages/examples/pack.loom --entry main"
"$loomc" run packages/examples/pack.loom --entry main
echo "== loomc build + dis (bytecode round trip)"
"$loomc" build packages/examples/pack.loom -o target/pack.loombc
"$loomc" dis target/pack.loombc | head -n 20
echo "== sandbox: an endless loop stops with out-of-fuel"
"$loomc" run packages/examples/spin.loom --entry main --fuel 1000000 || true
echo "== loomc report: specialize the motif GEMM stage and show its reflection"
"$loomc" report packages/motifs/gemm.loom --stage dense --config M=128 --config N=384 --config K=1536 --config ACT=gelu_erf
