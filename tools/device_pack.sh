#!/usr/bin/env bash
# Packs what tools/device_validate.sh needs into .dev/ (git-ignored), on this machine (which has
# Rust; the GPU machine does not). Dev tool, not run in CI.
#   .dev/b.txz      damascus (--features cuda) and the GPU test binaries, stripped, as b/test-<c|m>-NAME
#                   (c: damascus-cuda's tests, m: damascus-model's)
#   .dev/tok.txz    tokenizers/llama3.2/tokenizer.json (for `damascus synth` and the HF fixtures),
#                   and cuda/damascus-compute_90-*.ptx (the kernels, compiled here by the
#                   cuda_precompile example)
#   .dev/q/p0..p4   the real Gemma 3 270M file in pieces that fit one call's 64 MiB carry with the
#                   tree (p0 travels with b.txz and tok.txz)
#   .dev/llama.tgz  a trimmed llama.cpp tree (top directory `llama.cpp`), if LLAMA_SRC is given
# Environment: GEMMA (the .gguf; default ~/.cache/damascus/models/gemma-3-270m-q4_k_m.gguf),
# TOK (the tokenizer.json), LLAMA_SRC (a llama.cpp checkout; optional), NVRTC_LIB (NVRTC 13.0's
# lib directory, default /work/nvrtc; where missing, the device compiles the kernels itself).
set -euo pipefail
cd "$(dirname "$0")/.."
GEMMA=${GEMMA:-$HOME/.cache/damascus/models/gemma-3-270m-q4_k_m.gguf}
TOK=${TOK:-$HOME/.cache/damascus/tokenizers/llama3.2/tokenizer.json}
NVRTC_LIB=${NVRTC_LIB:-/work/nvrtc}
F=damascus-model/cuda,damascus-cuda/cuda
cargo build --release -q -p damascus-cli --features cuda
W=$(mktemp -d); mkdir -p "$W/b" .dev/q
cp target/release/damascus "$W/b/"
cargo test --release -q -p damascus-model -p damascus-cuda --features "$F" --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys, shutil
want = {"c": {"attention", "attn_decode", "kernels", "kv_q8", "pdl", "rows", "family_ops"},
        "m": {"gemma3_270m", "cuda_backend", "cuda_batch", "batch_picks", "cuda_kv_q8", "cuda_pdl",
              "family_forward", "split_backend"}}
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or m["target"]["kind"] != ["test"]:
        continue
    p = "c" if "/cuda#" in m["package_id"] or "damascus-cuda" in m["package_id"] else "m"
    if m["target"]["name"] in want[p]:
        shutil.copy(m["executable"], sys.argv[1] + "/b/test-" + p + "-" + m["target"]["name"])
' "$W"
strip "$W"/b/*
tar cJf .dev/b.txz -C "$W" b
mkdir -p "$W/t/tokenizers/llama3.2" && cp "$TOK" "$W/t/tokenizers/llama3.2/"
# The kernels' PTX for compute_90 where Gpu::open looks for it under DAMASCUS_HOME (the name
# hashes the source, the arch, NVRTC 13.0 and the program cut), so a fresh machine skips that
# compile.
T=tokenizers
if [ -d "$NVRTC_LIB" ]; then
  LD_LIBRARY_PATH="$NVRTC_LIB" DAMASCUS_HOME="$W/t" cargo run -q --release -p damascus-cuda \
    --features cuda --example cuda_precompile -- compute_90
  T="tokenizers cuda"
fi
tar cJf .dev/tok.txz -C "$W/t" $T
rm -f .dev/q/p*
head -c 43000000 "$GEMMA" > .dev/q/p0
tail -c +43000001 "$GEMMA" > "$W/rest" && split -n 4 -d -a 1 "$W/rest" .dev/q/x
for i in 0 1 2 3; do mv ".dev/q/x$i" ".dev/q/p$((i + 1))"; done
if [ -n "${LLAMA_SRC:-}" ]; then
  SRC=$(realpath "$LLAMA_SRC") # a symlinked checkout (the sdist's vendor/llama.cpp) packs its target
  B=$(basename "$SRC")
  # Only the top-level build/, models/ and docs/ go: sources named models/ or build-info.* exist
  # deeper (src/models, tools/mtmd/models, common/build-info.h) and the build needs them.
  tar czf .dev/llama.tgz --exclude=.git --anchored --exclude="$B/build" --exclude="$B/models" \
    --exclude="$B/docs" -C "$(dirname "$SRC")" --transform "s,^$B,llama.cpp," "$B"
fi
rm -rf "$W"; ls -la .dev .dev/q
