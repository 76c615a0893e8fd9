#!/usr/bin/env bash
# The GPU machine's checks of this tree in consecutive warm calls (the machine goes back 30 s
# after a call; a call carries at most 64 MiB). Run through the device tool from the repository
# root, after tools/device_pack.sh. Dev tool, not run in CI. Stages (one call each, in order):
#   setup   carry .dev/b.txz .dev/tok.txz [.dev/llama.tgz]: unpack, start `damascus synth`
#           of the 3B and (if carried) the llama.cpp CUDA build, each in its own session
#   piece N carry .dev/q/pN (N = 0..4): the Gemma pieces
#   gemma   (with piece 4 in the same call: `P=4`): Gemma 3 270M against HF on CUDA
#           (crates/model/tests/gemma3_270m.rs `cuda`, under DAMASCUS_TWO_LEVEL=all) and
#           tools/oracle_dp.py over the settings that move its accuracy
#   tests   every GPU test binary with DAMASCUS_REQUIRE_CUDA=1 (300 s each: the first may wait
#           on a host busy with the setup stage's builds)
#   ab      carry .dev/ab.txz (b/damascus-NAME, other builds of damascus): pp512/tg128 of each
#           against this tree's, interleaved
#   bench   the 3B against llama-bench (if built; tools/bench_cuda_compare.py, ROUNDS x PER
#           samples), then Damascus alone under the switchable paths (PDL, fusions, streamed
#           decode attention, two-level) at depths 0/4096/16384 and q8_0 KV; llama.cpp's Δp on Gemma
# e.g.  run(command="bash tools/device_validate.sh setup tests", carry=[".dev/b.txz", ".dev/tok.txz", ".dev/llama.tgz"])
#       run(command="P=0 bash tools/device_validate.sh piece", carry=[".dev/q/p0"]) ... P=3
#       run(command="P=4 bash tools/device_validate.sh piece gemma tests", carry=[".dev/q/p4"])
set -uo pipefail
export DAMASCUS_HOME=/tmp/dh
for d in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    $(python3 -c 'import glob, site; print(" ".join(d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/*/lib")))' 2>/dev/null); do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
D=/tmp/b/damascus; G=/tmp/dh/models/gemma-3-270m-q4_k_m.gguf; M=/tmp/l3b.gguf; L=/tmp/llama.cpp/build/bin
O=tests/fixtures/families/gemma3-270m-oracle.json
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /work && ln -sfn "$PWD" /work/main
for stage in "$@"; do case $stage in
setup)
  mkdir -p /tmp/g /tmp/dh/models && tar xJf .dev/tok.txz -C /tmp/dh && tar xJf .dev/b.txz -C /tmp
  setsid nohup bash -c "LD_LIBRARY_PATH=$LD_LIBRARY_PATH DAMASCUS_HOME=/tmp/dh $D synth --shape llama-3.2-3b --type Q4_K_M $M > /tmp/synth.log 2>&1; echo rc=\$? > /tmp/synth.done" > /dev/null 2>&1 < /dev/null &
  if [ -f .dev/llama.tgz ]; then
    tar xzf .dev/llama.tgz -C /tmp
    setsid nohup bash -c 'cd /tmp/llama.cpp && cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc > /tmp/cm.log 2>&1 && cmake --build build -j12 --target llama-server llama-bench > /tmp/lb.log 2>&1; echo rc=$? > /tmp/llama.done' > /dev/null 2>&1 < /dev/null &
  fi
  { nvidia-smi; $D --device-info; } > "$OUT/device.txt" 2>&1; nvidia-smi --query-gpu=name --format=csv,noheader ;;
piece)
  mkdir -p /tmp/g && cp ".dev/q/p$P" /tmp/g/ && ls /tmp/g | tr '\n' ' '; echo ;;
gemma)
  cat /tmp/g/p? > "$G" && sha256sum "$G" | cut -c1-16
  ( cd /tmp && DAMASCUS_TWO_LEVEL=all DAMASCUS_REQUIRE_CUDA=1 timeout 150 /tmp/b/test-m-gemma3_270m cuda --test-threads 1 --nocapture 2>&1 ) > "$OUT/t-gemma.txt"
  grep -E 'Δp cuda|test result|panicked' "$OUT/t-gemma.txt" | cut -c1-160
  timeout 240 python3 tools/oracle_dp.py --damascus $D -m "$G" --oracle $O --backend cuda --variant default= \
    --variant all=DAMASCUS_TWO_LEVEL=all --variant noflash=DAMASCUS_CUDA_FLASH=0 \
    --variant all_noflash=DAMASCUS_TWO_LEVEL=all,DAMASCUS_CUDA_FLASH=0 --variant tl0=DAMASCUS_TWO_LEVEL=0 2>&1 | tee "$OUT/dp-cuda.txt" ;;
tests)
  for b in /tmp/b/test-*; do
    ( cd /tmp && DAMASCUS_REQUIRE_CUDA=1 timeout 300 "$b" --test-threads 1 2>&1 ) > "$OUT/$(basename "$b").txt"
    echo "$(basename "$b"): $(grep -E 'test result|panicked' "$OUT/$(basename "$b").txt" | tail -2 | cut -c1-160 | tr '\n' ' ') t=${SECONDS}s"
  done ;;
bench)
  for i in $(seq 240); do [ -f /tmp/synth.done ] && break; sleep 1; done
  cat /tmp/synth.done /tmp/llama.done 2>/dev/null
  if [ -x $L/llama-bench ]; then
    timeout 420 python3 tools/bench_cuda_compare.py -m $M --damascus $D --llama-bench $L/llama-bench \
      --groups "${GROUPS_:-512/128/0 0/128/4096,16384}" --rounds "${ROUNDS:-5}" --per "${PER:-2}" 2>&1 | tee "$OUT/compare.md"
  fi
  bm() { echo "$1 ${*:2}: $(env ${1//,/ } $D bench --backend cuda -m $M "${@:2}" -r 3 --json 2>/dev/null | tr -d ' \n' | grep -o '"median_ts":[0-9.]*' | tr '\n' ' ')"; }
  for r in 1 2; do
    for e in X=0 DAMASCUS_CUDA_PDL=0 DAMASCUS_CUDA_FUSE=1 DAMASCUS_TWO_LEVEL=all DAMASCUS_CUDA_ATTN_V2=0; do bm $e -p 0 -n 128; done
    for e in X=0 DAMASCUS_CUDA_ATTN_V2=0 DAMASCUS_CUDA_PDL=0; do bm $e -p 0 -n 128 -d 4096,16384; done
    bm X=0 -p 0 -n 128 -d 4096,16384 -ctk q8_0 -ctv q8_0
  done | tee "$OUT/variants.txt"
  if [ -x $L/llama-server ]; then
    $L/llama-server -m "$G" --port 8190 -ngl 99 -fa on > "$OUT/ls-gemma.log" 2>&1 &
    for i in $(seq 60); do curl -sf localhost:8190/health > /dev/null && break; sleep 1; done
    timeout 60 python3 tools/llama_dp.py --url http://127.0.0.1:8190 --oracle $O 2>&1 | tee "$OUT/llama-cuda-dp.txt"
    pkill -f "llama-server -m $G"
  fi ;;
ab)
  # Carry .dev/ab.txz (b/damascus-NAME: other builds): tg128 and pp512 of each build against this
  # one, interleaved, ROUNDS rounds of `-r 3`.
  tar xJf .dev/ab.txz -C /tmp
  for i in $(seq 240); do [ -f /tmp/synth.done ] && break; sleep 1; done
  for r in $(seq "${ROUNDS:-3}"); do
    for bin in $D /tmp/b/damascus-*; do
      echo "$(basename $bin): $(LD_LIBRARY_PATH=$LD_LIBRARY_PATH $bin bench --backend cuda -m $M -p 512 -n 128 -r 3 --json 2>/dev/null | tr -d ' \n' | grep -o '"median_ts":[0-9.]*' | tr '\n' ' ')"
    done
  done | tee "$OUT/ab.txt" ;;
*) echo "unknown stage $stage" >&2; exit 2 ;;
esac; done
