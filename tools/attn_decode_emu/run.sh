#!/usr/bin/env bash
# Checks kernels/attn_decode.cu on the CPU (no GPU needed): the kernel's device code up to its
# launch wrappers, compiled by g++ against shim.h, run on small problems by main.cpp. Dev
# tool, not run in CI; ~15 s.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed -e '/^\/\/ `group` (1..=MAX_GROUP/,$d' \
    -e 's|^extern __shared__ uint4 ad_smem\[\];|alignas(16) static uint4 ad_smem[80000 / 16];|' \
    "$here/../../crates/cuda/kernels/attn_decode.cu" > "$tmp/kernel.inc"
g++ -std=c++20 -O2 -pthread -Wno-unknown-pragmas -I"$tmp" -I"$here" -o "$tmp/emu" "$here/main.cpp"
"$tmp/emu"
