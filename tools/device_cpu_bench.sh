#!/usr/bin/env bash
# CPU-only benchmark on the device host (16-core Xeon with AMX), run through the device tool
# from the repository root with `.dev` carried. Dev tool, not run in CI.
#
# .dev/ (git-ignored through .git/info/exclude) must hold:
#   damascus        a stripped release build from this machine
#   llama.tgz       vendor/llama.cpp from the llama-cpp-python==0.3.36 sdist, without build/,
#                   tests/, examples/, docs/, models/, media/, gguf-py/ (≈ 9 MB)
#   tokenizer.json  the Llama 3.2 tokenizer (from `damascus pull`'s cache), for `damascus synth`
#   roofline.c      ../shared/tools/roofline.c
# Results go to $OUT (amx16.md: the interleaved pp512 table; scaling.txt; pp2048 of both).
set -euo pipefail
D=$PWD/.dev
mkdir -p /tmp/dh/tokenizers/llama3.2 && cp "$D/tokenizer.json" /tmp/dh/tokenizers/llama3.2/
export DAMASCUS_HOME=/tmp/dh
(tar xzf "$D/llama.tgz" -C /tmp && cd /tmp/llama.cpp &&
  cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >/tmp/cm.log 2>&1 &&
  cmake --build build -j14 --target llama-bench >/tmp/lb.log 2>&1) &
"$D/damascus" synth --shape llama-3.2-3b --type Q4_K_M /tmp/l3b.gguf | tail -1
wait
LB=/tmp/llama.cpp/build/bin/llama-bench
python3 tools/bench_compare.py -m /tmp/l3b.gguf -t 16 -p 512 -n 0 --runs 10 --damascus "$D/damascus" \
  --llama-bench "$LB" --roofline "$D/roofline.c" 2>&1 | tee "$OUT/amx16.md"
for t in 1 2 4 8 16; do "$D/damascus" bench -m /tmp/l3b.gguf -t $t -p 512 -n 0 -r 2 2>&1 | grep pp512; done |
  tee "$OUT/scaling.txt"
"$LB" -m /tmp/l3b.gguf -t 16 -p 2048 -n 0 -r 2 2>&1 | grep pp2048 | tee "$OUT/llama2k.txt"
"$D/damascus" bench -m /tmp/l3b.gguf -t 16 -p 2048 -n 0 -r 2 2>&1 | grep pp2048 | tee "$OUT/dam2k.txt"
