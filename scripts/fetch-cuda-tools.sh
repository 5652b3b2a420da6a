#!/usr/bin/env bash
# Fetches the two CUDA tools that need no GPU, by name from the Python package registry, into the project-local
# folder .models/cuda/ (gitignored), so that the tests compile every CUDA kernel loom-emit writes with NVRTC and
# assemble the PTX with ptxas on machines without an NVIDIA driver:
#
#   .models/cuda/lib/libnvrtc.so.12, libnvrtc-builtins.so.12.8   from nvidia-cuda-nvrtc-cu12==12.8.93
#   .models/cuda/bin/ptxas                                        from nvidia-cuda-nvcc-cu12==12.8.93
#   .models/cuda/VERSION                                          12.8.93 (another version is re-fetched)
#
# (12.8: the CUDA API cudarc is built for.) Only those files are unpacked (not the headers, the `.alt` builds,
# libnvvm or libdevice); the wheels are downloaded to a temporary folder and removed. Idempotent and quiet: a
# second run with the files present downloads nothing and prints nothing. A failed download or a wheel
# without the expected files is an error (exit status 1) naming what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
version=12.8.93
dest=.models/cuda
files=("$dest/lib/libnvrtc.so.12" "$dest/lib/libnvrtc-builtins.so.12.8" "$dest/bin/ptxas")
have=1
for f in "${files[@]}"; do [ -s "$f" ] || have=0; done
[ -x "$dest/bin/ptxas" ] || have=0
# .models/cuda/VERSION: a folder unpacked from other wheels is replaced.
[ "$(cat "$dest/VERSION" 2>/dev/null)" = "$version" ] || have=0
[ "$have" = 1 ] && exit 0

command -v "$py" >/dev/null || { echo "fetch-cuda-tools.sh: python3 is required" >&2; exit 1; }
echo "fetch-cuda-tools.sh: pip download nvidia-cuda-nvrtc-cu12==$version nvidia-cuda-nvcc-cu12==$version into $dest" >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! "$py" -m pip download --quiet --disable-pip-version-check --no-input --no-deps --only-binary=:all: \
        --dest "$tmp" "nvidia-cuda-nvrtc-cu12==$version" "nvidia-cuda-nvcc-cu12==$version" >"$tmp/pip.log" 2>&1; then
    cat "$tmp/pip.log" >&2
    echo "fetch-cuda-tools.sh: downloading the CUDA wheels failed (see above)" >&2
    exit 1
fi
mkdir -p "$dest/lib" "$dest/bin"
"$py" - "$tmp" "$dest" <<'PY'
import glob, os, stat, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
want = {
    "nvidia/cuda_nvrtc/lib/libnvrtc.so.12": "lib/libnvrtc.so.12",
    "nvidia/cuda_nvrtc/lib/libnvrtc-builtins.so.12.8": "lib/libnvrtc-builtins.so.12.8",
    "nvidia/cuda_nvcc/bin/ptxas": "bin/ptxas",
}
found = set()
for whl in sorted(glob.glob(os.path.join(tmp, "*.whl"))):
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            if name in want:
                out = os.path.join(dest, want[name])
                with z.open(name) as src, open(out + ".tmp", "wb") as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
                os.chmod(out + ".tmp", 0o755)
                os.replace(out + ".tmp", out)
                found.add(name)
missing = sorted(set(want) - found)
if missing:
    sys.exit("fetch-cuda-tools.sh: the wheels lack " + ", ".join(missing))
PY
"$dest/bin/ptxas" --version >/dev/null || { echo "fetch-cuda-tools.sh: $dest/bin/ptxas does not run" >&2; exit 1; }
echo "$version" >"$dest/VERSION"
echo "fetch-cuda-tools.sh: NVRTC and ptxas $version ready in $dest" >&2
