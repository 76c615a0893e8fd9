#!/usr/bin/env python3
"""Next-token distance from the f32 reference, per prompt and per kernel setting (issue 28:
one or two q8 levels for the Q/K/V activations). Dev tool, not run in CI.

The oracle is `damascus predict --reference` on the same file: the scalar f32 path, which the
HF fixtures hold to Hugging Face on the same weights (`damascus verify`), so it stands in for
HF here without torch. Each variant runs `damascus predict` (the fast path) with its environment;
`--llama URL` adds a running `llama-server` on the same file (`/completion`, `n_probs`), the
accuracy users of llama.cpp accept.

  python3 tools/level_ab.py --damascus target/release/damascus -m smollm2.gguf \
      --variant two=DAMASCUS_TWO_LEVEL=1 --variant one=DAMASCUS_TWO_LEVEL=0 \
      [--llama http://127.0.0.1:8190] [--json out.json]

Per variant: max |Δp| over the reference's top-10, mean and max over the prompts, the KL
divergence of the reference's top-64 against the variant (ids the variant does not list get
p = 1e-9), and how often the top-1 agrees.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import urllib.request

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "The three primary colors are red, blue and",
    "Question: What is 17 times 3?\nAnswer:",
    "import numpy as np\nx = np.arange(10)\nprint(x.",
    "Dear Sir or Madam,\n\nI am writing to",
    "The mitochondria is the powerhouse of the",
    "In 1969, Neil Armstrong became the first person to",
    "SELECT name, age FROM users WHERE",
    "Le chat est sur la",
    "Die Hauptstadt von Deutschland ist",
    "The following is a list of fruits: apple, banana, cherry,",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    "What is the boiling point of water?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWrite a haiku about autumn.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nTranslate 'good morning' to Spanish.<|im_end|>\n<|im_start|>assistant\n",
    "1, 2, 3, 5, 8, 13, 21,",
    "The theory of relativity was developed by",
    "To make a cup of tea, first boil the",
    "for i in range(10):\n    print(",
    "Water is made of hydrogen and",
    "The largest planet in our solar system is",
    "She opened the door and saw",
    "Photosynthesis converts sunlight, water and carbon dioxide into",
    "#include <stdio.h>\n\nint main(void) {\n    printf(",
    "The stock market fell sharply on Monday after",
    "My favourite book is",
    "The quick brown fox jumps over the lazy",
    "Rust is a systems programming language that",
    "The recipe calls for two cups of flour, one cup of sugar and",
    # A longer context: errors that build up over positions.
    "The history of the printing press begins in the fifteenth century, when Johannes "
    "Gutenberg, a goldsmith from Mainz, combined movable metal type, oil-based ink and a "
    "wooden press adapted from those used to make wine. Before his invention, books were "
    "copied by hand, usually by monks, and a single volume could take months to finish. "
    "The press made books cheaper and faster to produce, and within fifty years printing "
    "shops had opened in more than two hundred cities across Europe. Historians often say "
    "that the printing press helped to spread the ideas of the Renaissance and the "
    "Reformation, because",
    "Step 1: Preheat the oven to 180 degrees. Step 2: Mix the butter and sugar. Step 3:",
]


def predict(exe, model, ids, env, reference=False):
    cmd = [exe, "predict", "-m", model, "--no-bos", "--json", "--top", "64",
           "--ids", ",".join(map(str, ids))]
    if reference:
        cmd.append("--reference")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return {t["id"]: t["p"] for t in json.loads(out.stdout)["top"]}


def llama(url, ids):
    body = {"prompt": ids, "n_predict": 1, "n_probs": 64, "temperature": 0,
            "cache_prompt": False}
    req = urllib.request.Request(url + "/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    r = json.load(urllib.request.urlopen(req, timeout=120))
    first = r["completion_probabilities"][0]
    got = {}
    for t in first.get("top_logprobs") or first.get("probs") or []:
        p = math.exp(t["logprob"]) if "logprob" in t else t.get("prob", 0.0)
        got[t.get("id", t.get("tok"))] = p
    return got


def distances(ref, got):
    top10 = sorted(ref.items(), key=lambda kv: -kv[1])[:10]
    dp = max(abs(got.get(i, 0.0) - p) for i, p in top10)
    kl = sum(p * math.log(p / max(got.get(i, 0.0), 1e-9)) for i, p in ref.items() if p > 0)
    top1 = max(got, key=got.get) == top10[0][0]
    return dp, kl, top1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--damascus", required=True)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=VAR=VALUE[,VAR=VALUE] (environment of that run); NAME= for none")
    ap.add_argument("--llama", help="URL of a llama-server on the same file")
    ap.add_argument("--json", help="write every distance here")
    a = ap.parse_args()
    variants = []
    for v in a.variant or ["default="]:
        name, _, envs = v.partition("=")
        env = dict(os.environ)
        for kv in filter(None, envs.split(",")):
            k, _, val = kv.partition("=")
            env[k] = val
        variants.append((name, env))
    names = [n for n, _ in variants] + (["llama.cpp"] if a.llama else [])
    rows = []
    for prompt in PROMPTS:
        tok = subprocess.run([a.damascus, "tokenize", "-m", a.model, "--json", prompt],
                             capture_output=True, text=True, check=True)
        ids = json.loads(tok.stdout)["ids"]
        ref = predict(a.damascus, a.model, ids, dict(os.environ), reference=True)
        got = [predict(a.damascus, a.model, ids, env) for _, env in variants]
        if a.llama:
            got.append(llama(a.llama, ids))
        rows.append({"prompt": prompt[:40], "n": len(ids),
                     "d": {n: distances(ref, g) for n, g in zip(names, got)}})
        cells = "  ".join(f"{n} {d[0]:.4f}{'' if d[2] else '*'}" for n, d in rows[-1]["d"].items())
        print(f"{len(ids):4} {prompt[:32]!r:36} {cells}", flush=True)
    print("\n| setting | mean max|Δp| | median | max | mean KL (top-64) | top-1 agrees |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for n in names:
        dps = [r["d"][n][0] for r in rows]
        kls = [r["d"][n][1] for r in rows]
        agree = sum(r["d"][n][2] for r in rows)
        print(f"| {n} | {statistics.mean(dps):.4f} | {statistics.median(dps):.4f} | "
              f"{max(dps):.4f} | {statistics.mean(kls):.5f} | {agree}/{len(rows)} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
