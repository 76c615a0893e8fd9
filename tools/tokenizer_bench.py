"""HF `tokenizers` single-threaded encode throughput on the same corpus and vocabularies as
`cargo run --release -p damascus-tokenizer --example encode_bench`.

Usage: RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false \
       python3 tools/tokenizer_bench.py CORPUS [--smollm2 GGUF] [--llama3 tokenizer.json]
Prints ids count and MB/s (best of 3, fresh tokenizer each run so HF's word cache starts cold).
"""

import argparse
import os
import tempfile
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def checksum(ids):
    return sum((i + 1) * x for i, x in enumerate(ids)) % (1 << 61)


def bench(name, make, text):
    """Whole corpus as one string, then line by line; special-token strings are plain text."""
    lines = text.splitlines(keepends=True)
    mb = len(text.encode()) / 1e6
    for mode in ("whole", "lines"):
        best = float("inf")
        ids = []
        for _ in range(3):
            tok = make()
            tok.encode_special_tokens = True
            t = time.perf_counter()
            if mode == "whole":
                ids = tok.encode(text, add_special_tokens=False).ids
            else:
                ids = [i for line in lines for i in tok.encode(line, add_special_tokens=False).ids]
            best = min(best, time.perf_counter() - t)
        print(f"{name} [{mode}]: {len(ids)} ids, checksum {checksum(ids)}, best {best:.4f} s = {mb / best:.2f} MB/s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("--smollm2", default="/tmp/dev/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--llama3", default="/tmp/dev/tokenizer.json")
    a = ap.parse_args()
    with open(a.corpus, encoding="utf-8", newline="") as f:
        text = f.read()
    from tokenizers import Tokenizer, pre_tokenizers
    from transformers import AutoTokenizer

    bench("llama3 (HF tokenizers)", lambda: Tokenizer.from_file(a.llama3), text)
    with tempfile.TemporaryDirectory() as d:
        os.symlink(os.path.abspath(a.smollm2), os.path.join(d, "model.gguf"))
        smol_json = AutoTokenizer.from_pretrained(d, gguf_file="model.gguf").backend_tokenizer.to_str()

    def smol():
        t = Tokenizer.from_str(smol_json)
        t.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        )
        return t

    bench("smollm2 (HF tokenizers)", smol, text)


if __name__ == "__main__":
    main()
