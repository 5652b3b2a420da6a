#!/usr/bin/env bash
# Sets up and runs every check: formatting, lints, and the whole test suite (unit, golden, property, sandbox,
# and end-to-end CLI tests). Works on a fresh machine of this kind (Rust toolchain present); installs nothing
# else because nothing else is needed yet.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "cargo is required (rustup toolchain)" >&2; exit 1; }
rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt clippy 2>/dev/null || true
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
