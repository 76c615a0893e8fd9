#!/usr/bin/env bash
# PDL check + A/B on the GPU machine (H100 or H200), run through the device tool from the
# repository root with `.dev` carried. Dev tool, not run in CI. One call: the PDL test binaries
# (same bits with DAMASCUS_CUDA_PDL / DAMASCUS_CUDA_FUSE on and off), a greedy generation on
# the synthetic 3B under each variant (the texts must be equal), then tools/pdl_ab.py: tg128
# and tg128 at depth 4096, interleaved over the variants.
#
# .dev/ (git-ignored) as for tools/device_cuda.sh:
#   cuda/damascus            `cargo build --release -p damascus-cli --features cuda`, stripped
#   cuda/test-*              test binaries (`cargo test --no-run --release --features
#                            damascus-model/cuda,damascus-cuda/cuda`): at least damascus-cuda's
#                            `pdl` and damascus-model's `cuda_pdl`, stripped
#   tools/                   copies of tools/device_pdl.sh and tools/pdl_ab.py
#   home/tokenizers/llama3.2/tokenizer.json   the Llama 3.2 tokenizer
# Environment: BUILD_ROOT (above); ROUNDS (default 5) x PER (default 2) runs per variant; GROUPS_ (pdl_ab groups,
# default "0/128/0,4096"); VARIANTS (space-separated VAR=value[,VAR=value...], default: PDL
# 0, 1, noprefetch, and 1 with DAMASCUS_CUDA_FUSE=1); PROFILE=1 also writes per-op profiles
# of one decode (PDL is off under the profiler: a baseline for where time goes).
set -uo pipefail
D=$PWD/.dev
ROUNDS=${ROUNDS:-5}
PER=${PER:-2}
GROUPS_=${GROUPS_:-"0/128/0,4096"}
VARIANTS=${VARIANTS:-"DAMASCUS_CUDA_PDL=0 DAMASCUS_CUDA_PDL=1 DAMASCUS_CUDA_PDL=noprefetch DAMASCUS_CUDA_PDL=1,DAMASCUS_CUDA_FUSE=1"}
mkdir -p /tmp/dh && cp -r "$D/home/." /tmp/dh/
export DAMASCUS_HOME=/tmp/dh DAMASCUS_REQUIRE_CUDA=1
for d in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    $(python3 -c 'import glob, site; print(" ".join(d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/*/lib")))' 2>/dev/null); do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
{ nvidia-smi; echo; "$D/cuda/damascus" --device-info; } > "$OUT/device.txt" 2>&1
# Test binaries name their fixtures by the build machine's absolute path (BUILD_ROOT: the
# checkout they were built in, default /work/main).
BUILD_ROOT=${BUILD_ROOT:-/work/main}
[ -d "$BUILD_ROOT" ] || { mkdir -p "$(dirname "$BUILD_ROOT")" && ln -s "$PWD" "$BUILD_ROOT"; }
cd /tmp
: > "$OUT/tests.txt"
for t in "$D"/cuda/test-*; do
  echo "== $(basename "$t")" >> "$OUT/tests.txt"
  ( timeout 240 "$t" --test-threads 1 2>&1; echo "rc=$?" ) >> "$OUT/tests.txt"
done
grep -h "^== \|test result\|panicked\|FAILED\|PDL\|^rc=" "$OUT/tests.txt"
echo "tests done at ${SECONDS}s"
"$D/cuda/damascus" synth --shape llama-3.2-3b --type Q4_K_M /tmp/l3b.gguf 2>&1 | tail -1
i=0
for v in $VARIANTS; do
  env ${v//,/ } "$D/cuda/damascus" generate --backend cuda -m /tmp/l3b.gguf \
    -p "The capital of France is" -n 32 --temp 0 2>/dev/null > "/tmp/gen-$i.txt"
  i=$((i + 1))
done
i=0
for v in $VARIANTS; do
  if cmp -s /tmp/gen-0.txt "/tmp/gen-$i.txt"; then echo "greedy 32 tokens, $v: same text"
  else echo "greedy 32 tokens, $v: DIFFERS"; diff /tmp/gen-0.txt "/tmp/gen-$i.txt"; fi
  i=$((i + 1))
done | tee "$OUT/gen.txt"
if [ "${PROFILE:-0}" = 1 ]; then
  DAMASCUS_CUDA_PROFILE=1 "$D/cuda/damascus" bench --backend cuda -m /tmp/l3b.gguf -p 0 -n 16 -r 1 > "$OUT/profile.txt" 2>&1
fi
cd "$OLDPWD"
timeout $((580 - SECONDS)) python3 "$D/tools/pdl_ab.py" -m /tmp/l3b.gguf --damascus "$D/cuda/damascus" \
  --budget $((560 - SECONDS)) --groups "$GROUPS_" --variants "$VARIANTS" --rounds "$ROUNDS" --per "$PER" \
  2>&1 | tee "$OUT/pdl_ab.md"
echo "done at ${SECONDS}s"
