#!/usr/bin/env bash
# Fetches NanoGuard (metatronnanoguard==0.1.0, a prompt-injection classifier) from the Python package registry
# into .models/nanoguard/ (gitignored) and converts it for packages/nanoguard with scripts/convert/nanoguard.py
# (torch-free; the pickles are read by restricted unpicklers, nothing in them is executed).
# Called by scripts/fetch-models.sh. Idempotent: a second run installs and converts nothing.
#
#   .models/nanoguard/            the wheel (--no-deps: not its torch) and what the oracle and the tokenizer
#                                 check need: numpy, tiktoken and its regex (importable with
#                                 PYTHONPATH=.models/nanoguard)
#   .models/nanoguard/converted/  model.safetensors (F32), config.json, tokenizer.json, and a stamp naming the
#                                 converter's hash
#   packages/nanoguard/model/     hard links to converted/model.safetensors and config.json
#   packages/nanoguard/tokenizer.json   a copy of converted/tokenizer.json
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
dest=.models/nanoguard
assets="$dest/nanoguard/assets"
if ! [ -f "$assets/model.pt" ] || ! [ -f "$assets/tokenizer.pkl" ] \
    || ! PYTHONPATH="$dest" "$py" -c 'import numpy, tiktoken' 2>/dev/null; then
    echo "fetch-nanoguard.sh: pip install metatronnanoguard==0.1.0 numpy tiktoken regex into $dest" >&2
    mkdir -p "$dest"
    "$py" -m pip install --quiet --disable-pip-version-check --no-input --upgrade --no-deps --target "$dest" \
        'metatronnanoguard==0.1.0' 'numpy>=1.24' 'tiktoken==0.14.0' 'regex'
fi
[ -f "$assets/model.pt" ] || { echo "fetch-nanoguard.sh: $assets/model.pt missing after install" >&2; exit 1; }
conv="$dest/converted"
stamp="$(sha256sum scripts/convert/nanoguard.py "$assets/model.pt" "$assets/tokenizer.pkl" | sha256sum | cut -c1-16)"
if ! [ -f "$conv/stamp" ] || [ "$(cat "$conv/stamp")" != "$stamp" ]; then
    rm -f "$conv/stamp"
    PYTHONPATH="$dest" "$py" scripts/convert/nanoguard.py "$dest" "$conv"
    echo "$stamp" > "$conv/stamp"
fi
pkg=packages/nanoguard
mkdir -p "$pkg/model"
for f in model.safetensors config.json; do
    if ! [ "$conv/$f" -ef "$pkg/model/$f" ]; then
        ln -f "$conv/$f" "$pkg/model/$f" 2>/dev/null || cp -f "$conv/$f" "$pkg/model/$f"
    fi
done
cmp -s "$conv/tokenizer.json" "$pkg/tokenizer.json" || cp -f "$conv/tokenizer.json" "$pkg/tokenizer.json"
echo "fetch-nanoguard.sh: NanoGuard ready ($pkg/model: $conv)" >&2
