#!/usr/bin/env python3
"""Throughput cost of grammar-constrained decoding (issue 29 A1): `damascus generate` with a
JSON schema against the same generation unconstrained, interleaved, per-token decode time.

Each round runs, for each sampling setting (greedy; temperature 0.8 with a seed), the
constrained generation first, then the plain one with `--ignore-eos -n <tokens the constrained
one produced>`, so both decode the same number of tokens from the same prompt. Reports the
median and p95 of ms per generated token and the constrained/plain ratio of the medians.

    python3 tools/grammar_bench.py [--damascus target/release/damascus] [-m MODEL] [--rounds 10]
"""
import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROMPT = "Describe a movie as a JSON object with title, year and tags:"
SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 300},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 20},
                 "minItems": 1, "maxItems": 4},
    },
    "required": ["title", "year", "tags"],
}


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    d = json.loads(out)
    t = d["timings"]
    return t["generated_tokens"], t["generation_ms"], d["text"], d["stop_reason"]


def p95(v):
    s = sorted(v)
    return s[min(len(s) - 1, int(round(0.95 * (len(s) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--damascus", default=str(REPO / "target" / "release" / "damascus"))
    ap.add_argument("-m", "--model", help="model path (default: the default model)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=128, help="token budget of the constrained run")
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(SCHEMA, f)
        schema = f.name
    base = [a.damascus, "generate", "-t", str(a.threads), "-p", PROMPT, "--json"]
    if a.model:
        base += ["-m", a.model]
    settings = {"greedy": ["--temp", "0"], "temp 0.8": ["--temp", "0.8", "--seed", "7"]}
    res = {k: {"c": [], "p": [], "n": []} for k in settings}
    for r in range(a.rounds):
        for name, s in settings.items():
            n, ms, text, why = run(base + s + ["-n", str(a.n), "--json-schema-file", schema])
            if why != "length":
                json.loads(text)  # a finished constrained reply parses
            n2, ms2, _, _ = run(base + s + ["-n", str(n), "--ignore-eos"])
            res[name]["c"].append(ms / n)
            res[name]["p"].append(ms2 / n2)
            res[name]["n"].append(n)
        print(f"round {r + 1}/{a.rounds} done", flush=True)
    print("| sampling | tokens (median) | constrained ms/token median (p95) "
          "| plain ms/token median (p95) | cost |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, v in res.items():
        mc, mp = statistics.median(v["c"]), statistics.median(v["p"])
        print(f"| {name} | {statistics.median(v['n']):.0f} | {mc:.2f} ({p95(v['c']):.2f}) "
              f"| {mp:.2f} ({p95(v['p']):.2f}) | {100 * (mc / mp - 1):+.1f}% |")


if __name__ == "__main__":
    main()
