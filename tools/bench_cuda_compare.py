#!/usr/bin/env python3
"""Interleaved `damascus bench --backend cuda` vs `llama-bench -ngl 99 -fa 1` on one GGUF file,
with context depths (llama-bench's `-d`), for the GPU machine (tools/device_cuda.sh).

Each round runs every test once per engine (`-r PER` runs after each engine's own warm-up),
alternating engines round by round, so drift hits both alike; `--rounds R` rounds give
R * PER samples per test. Prints a markdown table: median and p5/p95 tok/s per engine, the
ratio of the medians, and whether the p5..p95 intervals overlap.

Usage:
    tools/bench_cuda_compare.py -m MODEL.gguf --damascus BIN --llama-bench BIN \
        --groups "512,2048/128/0 0/128/4096,16384" --rounds 5 --per 2

Each group is one invocation per engine, `n_prompt list/n_gen list/depth list` (both engines
take the cross product, as llama-bench does). Dev tool: not run in CI.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = q * (len(s) - 1)
    lo, hi = int(pos), min(int(pos) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def key(n_prompt: int, n_gen: int, depth: int) -> str:
    base = f"pp{n_prompt}" if n_gen == 0 else f"tg{n_gen}"
    return f"{base} @ d{depth}" if depth else base


def run(cmd: list[str], timeout: float) -> list[dict]:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.stderr.write(f"FAILED ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}\n")
        return []
    text = p.stdout
    doc = json.loads(text[text.index("[") if text.lstrip().startswith("[") else text.index("{"):])
    return doc if isinstance(doc, list) else doc["tests"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--damascus", required=True)
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--groups", required=True, help="space-separated P,P/N,N/D,D")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--per", type=int, default=2, help="runs per engine invocation")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--budget", type=float, default=1e9,
                    help="seconds: start no round that would not end inside this")
    args = ap.parse_args()
    groups = [g.split("/") for g in args.groups.split()]
    tests = []
    for p, n, d in groups:
        for dd in d.split(","):
            tests += [(int(pp), 0, int(dd)) for pp in p.split(",") if int(pp) > 0]
            tests += [(0, int(nn), int(dd)) for nn in n.split(",") if int(nn) > 0]
    samples: dict[str, dict[str, list[float]]] = {"damascus": {}, "llama.cpp": {}}
    build = "?"
    t_start = time.monotonic()
    t_round = 0.0
    rounds_done = 0
    for r in range(args.rounds):
        if time.monotonic() - t_start + t_round > args.budget:
            print(f"stopping after {r} rounds: out of time", file=sys.stderr)
            break
        t0 = time.monotonic()
        for p, n, d in groups:
            common = ["-m", args.model, "-p", p, "-n", n, "-d", d, "-r", str(args.per)]
            d = run([args.damascus, "bench", "--backend", "cuda", "--json", *common], args.timeout)
            ll = run([args.llama_bench, "-ngl", "99", "-fa", "1", "-o", "json", *common],
                     args.timeout)
            for t in ll[:1]:
                build = f"{t.get('build_commit', '?')} (build {t.get('build_number', '?')})"
            for eng, rows in (("damascus", d), ("llama.cpp", ll)):
                for t in rows:
                    k = key(t["n_prompt"], t["n_gen"], t.get("n_depth", 0))
                    samples[eng].setdefault(k, []).extend(t["samples_ts"])
        t_round = time.monotonic() - t0
        rounds_done = r + 1
        print(f"round {r + 1}/{args.rounds} done in {t_round:.0f} s", file=sys.stderr, flush=True)
    print("| test | Damascus t/s median (p5–p95) | llama.cpp t/s median (p5–p95) | ratio | p5–p95 apart |")
    print("| --- | ---: | ---: | ---: | --- |")
    for n_prompt, n_gen, depth in tests:
        k = key(n_prompt, n_gen, depth)
        a, b = samples["damascus"].get(k, []), samples["llama.cpp"].get(k, [])
        if not a or not b:
            print(f"| {k} | {len(a)} samples | {len(b)} samples | – | – |")
            continue
        ma, mb = quantile(a, 0.5), quantile(b, 0.5)
        apart = quantile(a, 0.05) > quantile(b, 0.95) or quantile(b, 0.05) > quantile(a, 0.95)
        print(f"| {k} | {ma:,.1f} ({quantile(a, 0.05):,.1f}–{quantile(a, 0.95):,.1f}) "
              f"| {mb:,.1f} ({quantile(b, 0.05):,.1f}–{quantile(b, 0.95):,.1f}) "
              f"| {ma / mb:.2f}× | {'yes' if apart else 'no'} |")
    print(f"\n{rounds_done} rounds x {args.per} runs per engine and test, engines alternating; "
          f"llama.cpp {build}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
