#!/usr/bin/env python3
"""llama.cpp's next-token probabilities against an HF oracle (the JSON of
tools/hf_gemma_oracle.py): for each case, a running `llama-server` gets the prompt ids on
`/completion` (`n_predict: 1`, `n_probs: 10`, `temperature: 0`) and the largest |Δp| over HF's
top-10 is printed (an id llama.cpp does not list counts as p = 0). Where the numbers in
`crates/model/tests/gemma3_270m.rs` (`LLAMA_CPP_DP`, `LLAMA_CPP_CUDA_DP`) come from.
Dev tool, not run in CI.

  llama-server -m gemma-3-270m-q4_k_m.gguf --port 8190 [-ngl 99 -fa on] &
  python3 tools/llama_dp.py --url http://127.0.0.1:8190 \
      --oracle tests/fixtures/families/gemma3-270m-oracle.json [--json]
"""
import argparse
import json
import math
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--url", required=True)
ap.add_argument("--oracle", required=True)
ap.add_argument("--json", action="store_true")
a = ap.parse_args()
rows = []
for c in json.load(open(a.oracle))["cases"]:
    body = {"prompt": c["ids"], "n_predict": 1, "n_probs": 10, "temperature": 0,
            "cache_prompt": False}
    req = urllib.request.Request(a.url + "/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    r = json.load(urllib.request.urlopen(req, timeout=60))
    first = r["completion_probabilities"][0]
    top = first.get("top_logprobs") or first.get("probs") or []
    got = {}
    for t in top:
        p = math.exp(t["logprob"]) if "logprob" in t else t.get("prob", 0.0)
        got[t.get("id", t.get("tok"))] = p
    d = max(abs(got.get(i, 0.0) - p) for i, p in c["top"])
    top1 = max(got, key=got.get) == c["top"][0][0]
    rows.append({"prompt": c["prompt"], "dp": round(d, 4), "top1": top1})
if a.json:
    print(json.dumps(rows, ensure_ascii=False))
else:
    print("| prompt | max Δp | top-1 equal |\n| --- | ---: | --- |")
    for r in rows:
        print(f"| {r['prompt']!r} | {r['dp']:.4f} | {r['top1']} |")
