#!/usr/bin/env bash
# CUDA check + benchmark on the H200 machine, run through the device tool from the repository
# root with `.dev` carried. Dev tool, not run in CI. One call: builds llama.cpp (CUDA, sm_90) in
# the background, runs the CUDA kernel and backend tests, synthesizes the 3B model, then benches
# Damascus and llama.cpp interleaved.
#
# .dev/ (git-ignored) must hold:
#   cuda/damascus            `cargo build --release -p damascus-cli --features cuda`, stripped
#   cuda/test-kernels        the damascus-cuda `kernels` test binary (`cargo test --no-run
#   cuda/test-cuda-backend   --features damascus-model/cuda,damascus-cuda/cuda`), and the
#                            damascus-model `cuda_backend` one, stripped
#   home/tokenizers/llama3.2/tokenizer.json   the Llama 3.2 tokenizer (for `damascus synth`)
#   llama.tgz                trimmed vendor/llama.cpp of llama-cpp-python==0.3.36
# Environment: RUNS (default 10), SKIP_LLAMA=1 to skip the llama.cpp build, TESTS_ONLY=1 to stop
# after the tests, PROFILE=1 to skip llama.cpp and write per-op GPU profiles
# (DAMASCUS_CUDA_PROFILE) of a decode and a pp512 instead (PROFILE_TESTS=1 runs the tests
# first; NGL="14 27" also benches those CPU + GPU layer splits).
set -uo pipefail
D=$PWD/.dev
RUNS=${RUNS:-10}
mkdir -p /tmp/dh && cp -r "$D/home/." /tmp/dh/
export DAMASCUS_HOME=/tmp/dh DAMASCUS_REQUIRE_CUDA=1
# NVRTC and cuBLAS: the toolkit's lib dir, or the pip wheels torch brought.
for d in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    $(python3 -c 'import glob, site; print(" ".join(d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/*/lib")))' 2>/dev/null); do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
{ nvidia-smi; echo; "$D/cuda/damascus" --device-info; } > "$OUT/device.txt" 2>&1
if [ "${PROFILE:-0}" = 1 ]; then
  cd /tmp
  if [ "${PROFILE_TESTS:-0}" = 1 ]; then
    ( "$D/cuda/test-kernels" --test-threads 1 2>&1; echo "rc=$?" ) > "$OUT/test-kernels.txt"
    ( "$D/cuda/test-cuda-backend" --test-threads 1 --nocapture 2>&1; echo "rc=$?" ) > "$OUT/test-backend.txt"
    grep -h "test result\|panicked\|FAILED" "$OUT/test-kernels.txt" "$OUT/test-backend.txt"
  fi
  { which nsys ncu; ls /usr/local/cuda/bin 2>/dev/null | tr '\n' ' '; } > "$OUT/tools.txt" 2>&1
  "$D/cuda/damascus" synth --shape llama-3.2-3b --type Q4_K_M /tmp/l3b.gguf 2>&1 | tail -1
  "$D/cuda/damascus" bench --backend cuda -m /tmp/l3b.gguf -p 0 -n 128 -r 3 2>&1 | grep "tg128" | tee -a "$OUT/bench.md"
  DAMASCUS_CUDA_PROFILE=1 "$D/cuda/damascus" bench --backend cuda -m /tmp/l3b.gguf -p 0 -n 64 -r 1 > "$OUT/profile-tg.txt" 2>&1
  grep -A14 "us/flush" "$OUT/profile-tg.txt"
  for n in ${NGL:-}; do  # the CPU + GPU layer split
    "$D/cuda/damascus" bench --backend cuda --ngl "$n" -m /tmp/l3b.gguf -p 512 -n 32 -r 2 2>&1 | grep -E "pp512|tg32" | tee -a "$OUT/bench.md"
  done
  "$D/cuda/damascus" bench --backend cuda -m /tmp/l3b.gguf -p 512,2048 -n 0 -r 3 2>&1 | grep "pp" | tee -a "$OUT/bench.md"
  DAMASCUS_CUDA_PROFILE=1 "$D/cuda/damascus" bench --backend cuda -m /tmp/l3b.gguf -p 512 -n 0 -r 1 > "$OUT/profile-pp.txt" 2>&1
  if [ -n "${NCU_KERNELS:-}" ]; then
    timeout 240 /usr/local/cuda/bin/ncu -k "regex:${NCU_KERNELS}" -s 400 -c "${NCU_COUNT:-8}" \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section MemoryWorkloadAnalysis \
      "$D/cuda/damascus" bench --backend cuda -m /tmp/l3b.gguf -p 0 -n 16 -r 1 > "$OUT/ncu.txt" 2>&1
    echo "ncu rc=$?"; grep -E "^  [a-z_0-9]+|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Stall" "$OUT/ncu.txt" | head -80
  fi
  echo "done at ${SECONDS}s"
  exit 0
fi
if [ "${SKIP_LLAMA:-0}" != 1 ]; then
  (tar xzf "$D/llama.tgz" -C /tmp && cd /tmp/llama.cpp &&
    cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=OFF >/tmp/cm.log 2>&1 &&
    cmake --build build -j12 --target llama-bench >/tmp/lb.log 2>&1; echo "llama build rc=$?" >> "$OUT/llama-build.txt") &
fi
cd /tmp
( "$D/cuda/test-kernels" --test-threads 1 2>&1; echo "rc=$?" ) > "$OUT/test-kernels.txt"
( "$D/cuda/test-cuda-backend" --test-threads 1 --nocapture 2>&1; echo "rc=$?" ) > "$OUT/test-backend.txt"
grep -h "test result" "$OUT/test-kernels.txt" "$OUT/test-backend.txt"
[ "${TESTS_ONLY:-0}" = 1 ] && exit 0
"$D/cuda/damascus" synth --shape llama-3.2-3b --type Q4_K_M /tmp/l3b.gguf 2>&1 | tail -1
"$D/cuda/damascus" generate --backend cuda -m /tmp/l3b.gguf -p "The capital of France is" -n 16 --temp 0 > "$OUT/gen.txt" 2>&1
wait
LB=/tmp/llama.cpp/build/bin/llama-bench
cd "$OLDPWD"
if [ -x "$LB" ]; then
  python3 tools/bench_compare.py -m /tmp/l3b.gguf -p 512 -n 128 --runs "$RUNS" --damascus "$D/cuda/damascus" \
    --damascus-args="--backend cuda" --llama-bench "$LB" --llama-args="-ngl 99 -fa 1" --bandwidth 4300 \
    --note "H200; bandwidth = the issue's 4.3 TB/s device copy" 2>&1 | tee "$OUT/compare.md"
else
  tail -20 /tmp/lb.log > "$OUT/llama-build-log.txt" 2>/dev/null
fi
# Extras while time is left (the device tool stops a call at 600 s).
if [ "$SECONDS" -lt 470 ]; then
  "$D/cuda/damascus" bench --backend cuda -m /tmp/l3b.gguf -p 2048 -n 0 -r 3 2>&1 | grep pp2048 | tee "$OUT/dam-2k.md"
  [ -x "$LB" ] && "$LB" -m /tmp/l3b.gguf -ngl 99 -fa 1 -p 2048 -n 0 -r 3 2>&1 | grep pp2048 | tee "$OUT/llama-2k.md"
fi
if [ "$SECONDS" -lt 540 ]; then
  DAMASCUS_CUDA_GRAPHS=0 "$D/cuda/damascus" bench --backend cuda -m /tmp/l3b.gguf -p 0 -n 128 -r 2 2>&1 | grep tg128 | tee "$OUT/dam-nograph.md"
fi
echo "done at ${SECONDS}s"
