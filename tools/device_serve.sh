#!/usr/bin/env bash
# CUDA serving benchmark on the GPU machine (issue 26): Damascus `serve --backend cuda` against
# `llama-server -np N -cb -ngl 99 -fa on` on the same synthetic 3B Q4_K_M, interleaved
# (tools/serve_bench.py), plus single-stream tg128 of this build against a baseline build.
# Dev tool, not run in CI. Run through the device tool from the repository root with `.dev`
# carried; .dev/ (git-ignored) holds:
#   b.txz        tar.xz of b/: damascus (this build, --features cuda), damascus-base (the
#                baseline build), optional test-* binaries (run first, DAMASCUS_REQUIRE_CUDA=1)
#   llama.tgz    a trimmed llama.cpp source tree (top directory `llama.cpp`)
#   tok.txz      tar.xz of tokenizers/llama3.2/tokenizer.json (for `damascus synth`)
# Environment: STREAMS (default 1,8,32), ROUNDS (default 2), NP (llama-server -np, default 32).
# Pack with tools/device_pack.sh where NVRTC 13.0 is unpacked (PyPI `nvidia-cuda-nvrtc==13.0.88`,
# its nvidia/cu13/lib as NVRTC_LIB): tok.txz then carries the kernels' PTX, and a fresh machine
# skips the ~90 s kernel compile in its first process.
set -uo pipefail
STREAMS=${STREAMS:-1,8,32}
ROUNDS=${ROUNDS:-2}
NP=${NP:-32}
D=$PWD/.dev
mkdir -p /tmp/dh && tar xJf "$D/tok.txz" -C /tmp/dh && tar xJf "$D/b.txz" -C /tmp
export DAMASCUS_HOME=/tmp/dh
for d in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    $(python3 -c 'import glob, site; print(" ".join(d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/*/lib")))' 2>/dev/null); do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
{ nvidia-smi; /tmp/b/damascus --device-info; } > "$OUT/device.txt" 2>&1
(tar xzf "$D/llama.tgz" -C /tmp && cd /tmp/llama.cpp &&
  cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc >/tmp/cm.log 2>&1 &&
  cmake --build build -j16 --target llama-server >/tmp/lb.log 2>&1
  echo "llama build rc=$? at ${SECONDS}s" > "$OUT/llama-build.txt"; tail -n 20 /tmp/cm.log /tmp/lb.log >> "$OUT/llama-build.txt") &
BUILD=$!
mkdir -p /work && ln -sfn "$PWD" /work/main
if ls /tmp/b/test-* >/dev/null 2>&1; then
  for t in /tmp/b/test-*; do
    echo "== $t"; ( cd /tmp && DAMASCUS_REQUIRE_CUDA=1 timeout 200 "$t" --test-threads 1 2>&1 ) > "$OUT/$(basename "$t").txt"
    grep -E 'test result|panicked|FAILED' "$OUT/$(basename "$t").txt"
  done
fi
/tmp/b/damascus synth --shape llama-3.2-3b --type Q4_K_M /tmp/l3b.gguf 2>&1 | tail -1
M=/tmp/l3b.gguf
for r in 1 2 3; do for b in damascus-base damascus; do
  echo "$b round $r: $(/tmp/b/$b bench --backend cuda -m $M -p 0 -n 128 -r 3 --json 2>/dev/null | tr -d ' \n' | grep -o '"median_ts":[0-9.]*')"
done; done | tee "$OUT/tg128.txt"
# The batched step alone, per batch size (no HTTP): every sequence at depth 512.
/tmp/b/damascus bench --backend cuda -m $M -p 0 -n 64 -d 512 --npl 1,8,16,32 -r 3 2>/dev/null | tee "$OUT/npl.txt"
wait $BUILD; cat "$OUT/llama-build.txt" | head -1
CTX=$((NP * 768))
/tmp/b/damascus serve --backend cuda -m $M --alias default --port 8181 --parallel "$NP" -c "$CTX" > "$OUT/damascus-serve.log" 2>&1 &
/tmp/llama.cpp/build/bin/llama-server -m $M --port 8182 -np "$NP" -cb -ngl 99 -fa on -c "$CTX" > "$OUT/llama-server.log" 2>&1 &
for p in 8181 8182; do for i in $(seq 120); do curl -sf localhost:$p/health >/dev/null && break; sleep 1; done; done
PYTHONUNBUFFERED=1 python3 tools/serve_bench.py --server damascus=http://127.0.0.1:8181 \
  --server llama=http://127.0.0.1:8182 --model default --streams "$STREAMS" --rounds "$ROUNDS" \
  --prompt-tokens 512 --gen-tokens 128 2>&1 | tee "$OUT/serve.txt"
echo "done at ${SECONDS}s"
