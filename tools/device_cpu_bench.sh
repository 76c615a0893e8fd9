#!/usr/bin/env bash
# CPU-only checks and benchmarks on the device host (16-core Xeon with AMX), run through the
# device tool from the repository root with `.dev` carried, in phases over warm calls (the
# carry limit is 64 MiB, a call at most 600 s, and a machine stays warm only ~30 s after a
# call: start the next phase at once; /tmp survives between warm calls).
# Dev tool, not run in CI.
#
#   setup   .dev/: damascus (stripped release build), llama.tgz (vendor/llama.cpp of the
#           llama-cpp-python==0.3.36 sdist without build/, tests/, examples/, docs/, models/,
#           media/, gguf-py/), tokenizer.json.gz (the Llama 3.2 tokenizer), roofline.c,
#           test-kernels-lib (stripped `cargo test --release -p damascus-kernels --lib` binary).
#           Builds llama-bench (CPU, -DGGML_NATIVE=ON: its AMX path), synthesizes the 3B
#           model, runs the kernel tests on the tiles, then the `ab` phase.
#   tests   .dev/: parts of the default model (`split -b 42000000 -d`, smol.00 … over as many
#           calls as the carry limit needs), test-cpu-backend (stripped `cargo test --release
#           -p damascus-model --test cpu_backend` binary). Once every part is there, joins and
#           checks the default model and runs the CPU-backend tests (fixtures via /work/main).
#   bench   The interleaved pp512 at 16 threads, then tg128 at 2 threads. Tables go to $OUT.
#   tg2     tg128 at 2 threads only, 10 interleaved rounds (issue 7's protocol).
#   ab      Repacked (the default, `DAMASCUS_REPACK=1`) against the file layout
#           (`DAMASCUS_REPACK=0`), pp512 + tg128 at 16 threads; then tg128 against llama.cpp.
set -euo pipefail
D=$PWD/.dev
export DAMASCUS_HOME=/tmp/dh
LB=/tmp/llama.cpp/build/bin/llama-bench
mkdir -p /tmp/dh/tokenizers/llama3.2 /tmp/dh/models /tmp/parts /tmp/bin
cp "$D"/smol.* /tmp/parts/ 2>/dev/null || true
for f in damascus test-kernels-lib test-cpu-backend roofline.c; do
    [ -e "$D/$f" ] && cp "$D/$f" /tmp/bin/
done
ab() {
    for i in 1 2 3; do
        for r in 1 0; do
            echo "DAMASCUS_REPACK=$r"
            DAMASCUS_REPACK=$r /tmp/bin/damascus bench -m /tmp/l3b.gguf -t 16 -p 512 -n 128 -r 2 2>&1 |
                grep -E "pp512|tg128|loaded"
        done
    done | tee "$OUT/ab.txt"
    python3 tools/bench_compare.py -m /tmp/l3b.gguf -t 16 -p 0 -n 128 --runs 5 \
        --damascus /tmp/bin/damascus --llama-bench "$LB" --roofline /tmp/bin/roofline.c 2>&1 |
        tee "$OUT/tg128-t16.md"
}
case "${1:?phase: setup | tests | bench | tg2 | ab}" in
setup)
    gunzip -c "$D/tokenizer.json.gz" > /tmp/dh/tokenizers/llama3.2/tokenizer.json
    (tar xzf "$D/llama.tgz" -C /tmp && cd /tmp/llama.cpp &&
        cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
            -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
            -DLLAMA_BUILD_SERVER=OFF >/tmp/cm.log 2>&1 &&
        cmake --build build -j12 --target llama-bench >/tmp/lb.log 2>&1) &
    /tmp/bin/damascus --device-info | tee "$OUT/device-info.txt"
    /tmp/bin/damascus synth --shape llama-3.2-3b --type Q4_K_M /tmp/l3b.gguf | tail -1
    /tmp/bin/test-kernels-lib 2>&1 | tail -4 | tee "$OUT/kernels.txt"
    /tmp/bin/test-kernels-lib amx --nocapture 2>&1 | grep -E "^test |result" | tee -a "$OUT/kernels.txt"
    wait
    ls -la "$LB"
    ab
    ;;
tests)
    ls -la /tmp/parts
    [ -e /tmp/parts/smol.02 ] || { echo "more parts to carry"; exit 0; }
    cat /tmp/parts/smol.* > /tmp/dh/models/SmolLM2-135M-Instruct.Q4_1.gguf
    sha256sum /tmp/dh/models/SmolLM2-135M-Instruct.Q4_1.gguf
    mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
    /tmp/bin/test-cpu-backend 2>&1 | tail -14 | tee "$OUT/cpu-backend.txt"
    # AMX prompts from the repacked panels (the default on AMX hosts; forced on here).
    DAMASCUS_REPACK=1 /tmp/bin/test-cpu-backend 2>&1 | tail -14 | tee -a "$OUT/cpu-backend.txt"
    ;;
bench)
    python3 tools/bench_compare.py -m /tmp/l3b.gguf -t 16 -p 512 -n 0 --runs 10 \
        --damascus /tmp/bin/damascus --llama-bench "$LB" --roofline /tmp/bin/roofline.c 2>&1 |
        tee "$OUT/pp512-t16.md"
    python3 tools/bench_compare.py -m /tmp/l3b.gguf -t 2 -p 0 -n 128 --runs 10 \
        --damascus /tmp/bin/damascus --llama-bench "$LB" --roofline /tmp/bin/roofline.c 2>&1 |
        tee "$OUT/tg128-t2.md"
    ;;
tg2)
    python3 tools/bench_compare.py -m /tmp/l3b.gguf -t 2 -p 0 -n 128 --runs 10 \
        --damascus /tmp/bin/damascus --llama-bench "$LB" --roofline /tmp/bin/roofline.c 2>&1 |
        tee "$OUT/tg128-t2.md"
    ;;
ab) ab
    ;;
*) echo "unknown phase $1" >&2; exit 2 ;;
esac
