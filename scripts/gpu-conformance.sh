#!/usr/bin/env bash
# Runs the HAL conformance suite (tests/integration/hal_conformance.rs) with the CUDA plugin required, on a
# machine with an NVIDIA GPU and its driver (libcuda.so; cudarc is built for the CUDA 12.8 API, which every
# 12.8+ driver provides). NVRTC is $LOOM_NVRTC, else the CUDA toolkit's libnvrtc.so, else fetched from PyPI by
# scripts/fetch-cuda-tools.sh. Without a driver it stops with the reason instead of reporting a pass that never
# touched a GPU.
#
#   bash scripts/gpu-conformance.sh            # the suite, all HAL plugins (cpu, vulkan, cuda)
#   bash scripts/gpu-conformance.sh hal_fences # a filter, as for cargo test
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "cargo is required (rustup toolchain)" >&2; exit 1; }
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so'; then
    echo "gpu-conformance: no libcuda.so (NVIDIA driver) on this machine; nothing to run" >&2
    exit 2
fi
if [ -z "${LOOM_NVRTC:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so' \
    && ! ls /usr/local/cuda*/lib64/libnvrtc.so* >/dev/null 2>&1; then
    # No CUDA toolkit: NVRTC (and ptxas, for hal-cuda's NVRTC test) from PyPI into .models/cuda/.
    bash scripts/fetch-cuda-tools.sh
    export LOOM_NVRTC="$PWD/.models/cuda/lib"
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
# The suite also loads the Vulkan plugin; on a GPU machine it may find the NVIDIA Vulkan driver or lavapipe.
export LOOM_REQUIRE_CUDA=1
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$(ls -d /usr/local/cuda*/lib64 2>/dev/null | tr '\n' ':')"
cargo test -p loom-tests --test integration --locked -- "${1:-hal_}" --test-threads=1
cargo test -p hal-cuda --locked
