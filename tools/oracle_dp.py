#!/usr/bin/env python3
"""Next-token probabilities of `damascus predict` against an HF oracle (the JSON of
tools/hf_gemma_oracle.py: cases with ids and HF's top-10), per prompt and per setting.
Dev tool (accuracy experiments on the GPU machine), not run in CI.

  python3 tools/oracle_dp.py --damascus target/release/damascus -m gemma-3-270m-q4_k_m.gguf \
      --oracle tests/fixtures/families/gemma3-270m-oracle.json --backend cuda \
      --variant default= --variant noflash=DAMASCUS_CUDA_FLASH=0
Prints, per variant, each prompt's max |Δp| over HF's top-10 and the top-1 agreement.
"""
import argparse
import json
import os
import subprocess

ap = argparse.ArgumentParser()
ap.add_argument("--damascus", required=True)
ap.add_argument("-m", "--model", required=True)
ap.add_argument("--oracle", required=True)
ap.add_argument("--backend", default="cpu")
ap.add_argument("--variant", action="append", default=[],
                help="NAME=VAR=VALUE[,VAR=VALUE] (environment for that run); NAME= for none")
a = ap.parse_args()
cases = json.load(open(a.oracle))["cases"]
variants = a.variant or ["default="]
rows = []
for v in variants:
    name, _, envs = v.partition("=")
    env = dict(os.environ)
    for kv in filter(None, envs.split(",")):
        k, _, val = kv.partition("=")
        env[k] = val
    ds = []
    for c in cases:
        out = subprocess.run(
            [a.damascus, "predict", "-m", a.model, "--backend", a.backend, "--no-bos", "--json",
             "--top", "64", "--ids", ",".join(map(str, c["ids"]))],
            env=env, capture_output=True, text=True)
        if out.returncode != 0:
            ds.append(("err", out.stderr.strip()[-200:]))
            continue
        got = {t["id"]: t["p"] for t in json.loads(out.stdout)["top"]}
        d = max(abs(got.get(i, 0.0) - p) for i, p in c["top"])
        top1 = max(got, key=got.get) == c["top"][0][0]
        ds.append((d, top1))
    rows.append((name, ds))
print("| prompt | " + " | ".join(n for n, _ in rows) + " |")
print("| --- |" + " ---: |" * len(rows))
for i, c in enumerate(cases):
    cells = []
    for _, ds in rows:
        d, t = ds[i]
        cells.append(f"{d:.4f}{'' if t else ' (top-1 differs)'}" if d != "err" else f"error: {t}")
    print(f"| {c['prompt']!r} | " + " | ".join(cells) + " |")
for n, ds in rows:
    vals = [d for d, _ in ds if d != "err"]
    if vals:
        print(f"{n}: mean {sum(vals) / len(vals):.4f} max {max(vals):.4f}")
