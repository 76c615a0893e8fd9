#!/usr/bin/env bash
# CUDA check + benchmark on the GPU machine (H100 or H200), run through the device tool from
# the repository root with `.dev` carried. Dev tool, not run in CI. One call: builds llama.cpp
# (CUDA, sm_90) in the background, runs the CUDA kernel, attention and backend tests (and the
# model-family tests where built), synthesizes the 3B model, checks a greedy generation, then
# benches Damascus and llama.cpp interleaved (tools/bench_cuda_compare.py), depths included.
#
# .dev/ (git-ignored) must hold:
#   cuda/damascus            `cargo build --release -p damascus-cli --features cuda`, stripped
#   cuda/test-*              test binaries (`cargo test --no-run --features
#                            damascus-model/cuda,damascus-cuda/cuda`): the damascus-cuda
#                            `kernels` and `attention` ones, the damascus-model `cuda_backend`
#                            one, and any `families*` ones, stripped
#   tools/                   copies of tools/device_cuda.sh and tools/bench_cuda_compare.py
#   home/tokenizers/llama3.2/tokenizer.json   the Llama 3.2 tokenizer (for `damascus synth`)
#   llama.tgz                a trimmed llama.cpp source tree (top directory `llama.cpp`)
# Environment: ROUNDS (default 5) x PER (default 2) runs per test; GROUPS_ (bench_cuda_compare
# groups, P,P/N,N/D,D); SKIP_LLAMA=1 skips llama.cpp (Damascus alone, -r 3);
# TESTS_ONLY=1 stops after the tests; PROFILE=1 also writes per-op profiles of a decode at
# depth and a pp2048 (DAMASCUS_CUDA_PROFILE).
set -uo pipefail
D=$PWD/.dev
ROUNDS=${ROUNDS:-5}
PER=${PER:-2}
GROUPS_=${GROUPS_:-"512,2048,8192/128/0 0/128/4096,16384"}
mkdir -p /tmp/dh && cp -r "$D/home/." /tmp/dh/
export DAMASCUS_HOME=/tmp/dh DAMASCUS_REQUIRE_CUDA=1
# NVRTC and cuBLAS: the toolkit's lib dir, or the pip wheels torch brought.
for d in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    $(python3 -c 'import glob, site; print(" ".join(d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/*/lib")))' 2>/dev/null); do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
{ nvidia-smi; echo; "$D/cuda/damascus" --device-info; } > "$OUT/device.txt" 2>&1
# Test binaries name their fixtures by the build machine's absolute path.
[ -d /work/wt/cuda ] || { mkdir -p /work/wt && ln -s "$PWD" /work/wt/cuda; }
export PATH=/usr/local/cuda/bin:$PATH
if [ "${SKIP_LLAMA:-0}" != 1 ] && [ "${TESTS_ONLY:-0}" != 1 ]; then
  (tar xzf "$D/llama.tgz" -C /tmp && cd /tmp/llama.cpp &&
    cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc >/tmp/cm.log 2>&1 &&
    cmake --build build -j16 --target llama-bench >/tmp/lb.log 2>&1; echo "llama build rc=$? at ${SECONDS}s" >> "$OUT/llama-build.txt"; tail -n 25 /tmp/cm.log /tmp/lb.log >> "$OUT/llama-build.txt" 2>&1) &
fi
cd /tmp
: > "$OUT/tests.txt"
for t in "$D"/cuda/test-*; do
  echo "== $(basename "$t")" >> "$OUT/tests.txt"
  ( timeout 240 "$t" --test-threads 1 2>&1; echo "rc=$?" ) >> "$OUT/tests.txt"
done
grep -h "^== \|test result\|panicked\|FAILED\|^rc=" "$OUT/tests.txt"
echo "tests done at ${SECONDS}s"
[ "${TESTS_ONLY:-0}" = 1 ] && exit 0
"$D/cuda/damascus" synth --shape llama-3.2-3b --type Q4_K_M /tmp/l3b.gguf 2>&1 | tail -1
"$D/cuda/damascus" generate --backend cuda -m /tmp/l3b.gguf -p "The capital of France is" -n 16 --temp 0 > /tmp/gen.txt 2>&1
DAMASCUS_CUDA_FLASH=0 "$D/cuda/damascus" generate --backend cuda -m /tmp/l3b.gguf -p "The capital of France is" -n 16 --temp 0 > /tmp/gen-noflash.txt 2>&1
"$D/cuda/damascus" generate -m /tmp/l3b.gguf -p "The capital of France is" -n 16 --temp 0 > /tmp/gen-cpu.txt 2>&1 &
if [ "${PROFILE:-0}" = 1 ]; then
  DAMASCUS_CUDA_PROFILE=1 "$D/cuda/damascus" bench --backend cuda -m /tmp/l3b.gguf -p 0 -n 16 -d 16384 -r 1 > "$OUT/profile.txt" 2>&1
  DAMASCUS_CUDA_PROFILE=1 "$D/cuda/damascus" bench --backend cuda -m /tmp/l3b.gguf -p 2048 -n 0 -r 1 >> "$OUT/profile.txt" 2>&1
  echo "profiles done at ${SECONDS}s"
fi
wait
for f in gen gen-noflash gen-cpu; do echo "== $f"; cat /tmp/$f.txt; done > "$OUT/gen.txt"
python3 "$D/tools/near_tie.py" "$D/cuda/damascus" /tmp/l3b.gguf "The capital of France is" /tmp/gen.txt /tmp/gen-cpu.txt >> "$OUT/gen.txt" 2>&1
LB=/tmp/llama.cpp/build/bin/llama-bench
cd "$OLDPWD"
if [ -x "$LB" ]; then
  timeout $((580 - SECONDS)) python3 "$D/tools/bench_cuda_compare.py" -m /tmp/l3b.gguf --damascus "$D/cuda/damascus" \
    --budget $((560 - SECONDS)) \
    --llama-bench "$LB" --groups "$GROUPS_" --rounds "$ROUNDS" --per "$PER" 2>&1 | tee "$OUT/compare.md"
else
  for t in $GROUPS_; do
    IFS=/ read -r p n d <<< "$t"
    [ "$SECONDS" -lt 540 ] && "$D/cuda/damascus" bench --backend cuda -m /tmp/l3b.gguf -p "$p" -n "$n" -d "$d" -r 3 2>&1 | grep "^| l3b" | tee -a "$OUT/damascus-only.md"
  done
fi
echo "done at ${SECONDS}s"
