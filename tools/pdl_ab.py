#!/usr/bin/env python3
"""Interleaved A/B of `damascus bench --backend cuda` under several environments, for the GPU
machine: each variant is `VAR=value[,VAR=value...]` (default: plain launches; programmatic
dependent launch with the GEMV weight prefetch; PDL alone; PDL with the decode fusions).
Dev tool, not run in CI.

Each round runs every group once per variant (`-r PER` runs each, after the bench's own
warm-up), variants in a rotated order round by round, so drift hits all alike. Prints a
markdown table: median and p5/p95 tok/s per variant, and each variant's median over the first
variant's.

Usage:
    tools/pdl_ab.py --damascus BIN -m MODEL.gguf --groups "0/128/0,4096" \
        --variants "DAMASCUS_CUDA_PDL=0 DAMASCUS_CUDA_PDL=1 DAMASCUS_CUDA_PDL=1,DAMASCUS_CUDA_FUSE=1" \
        --rounds 5 --per 2
"""

from __future__ import annotations

import argparse
import json
import os
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


def bench(cmd: list[str], env: dict[str, str], timeout: float) -> list[dict]:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
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
    ap.add_argument("--variants", default="DAMASCUS_CUDA_PDL=0 DAMASCUS_CUDA_PDL=1 "
                    "DAMASCUS_CUDA_PDL=noprefetch DAMASCUS_CUDA_PDL=1,DAMASCUS_CUDA_FUSE=1",
                    help="space-separated VAR=value[,VAR=value...]")
    ap.add_argument("--groups", default="0/128/0", help="space-separated P,P/N,N/D,D")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--per", type=int, default=2, help="runs per bench invocation")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--budget", type=float, default=1e9,
                    help="seconds: start no round that would not end inside this")
    args = ap.parse_args()
    values = args.variants.split()
    groups = [g.split("/") for g in args.groups.split()]
    samples: dict[str, dict[str, list[float]]] = {v: {} for v in values}
    order: list[str] = []
    t_start, t_round, rounds_done = time.monotonic(), 0.0, 0
    for r in range(args.rounds):
        if time.monotonic() - t_start + t_round > args.budget:
            print(f"stopping after {r} rounds: out of time", file=sys.stderr)
            break
        t0 = time.monotonic()
        rotated = values[r % len(values):] + values[:r % len(values)]
        for p, n, d in groups:
            common = ["-m", args.model, "-p", p, "-n", n, "-d", d, "-r", str(args.per)]
            for v in rotated:
                env = dict(os.environ, **dict(kv.split("=", 1) for kv in v.split(",")))
                rows = bench([args.damascus, "bench", "--backend", "cuda", "--json", *common],
                             env, args.timeout)
                for t in rows:
                    k = key(t["n_prompt"], t["n_gen"], t.get("n_depth", 0))
                    if k not in order:
                        order.append(k)
                    samples[v].setdefault(k, []).extend(t["samples_ts"])
        t_round = time.monotonic() - t0
        rounds_done = r + 1
        print(f"round {r + 1}/{args.rounds} done in {t_round:.0f} s", file=sys.stderr, flush=True)
    head = " | ".join(f"{v} t/s median (p5–p95)" for v in values)
    ratios = " | ".join(f"{v} / {values[0]}" for v in values[1:])
    print(f"| test | {head} | {ratios} |")
    print("| --- |" + " ---: |" * (2 * len(values) - 1))
    for k in order:
        cells, meds = [], []
        for v in values:
            xs = samples[v].get(k, [])
            meds.append(quantile(xs, 0.5))
            cells.append(f"{meds[-1]:,.1f} ({quantile(xs, 0.05):,.1f}–{quantile(xs, 0.95):,.1f})"
                         if xs else "–")
        rel = [f"{m / meds[0]:.3f}×" if meds[0] == meds[0] and m == m else "–" for m in meds[1:]]
        print(f"| {k} | {' | '.join(cells)} | {' | '.join(rel)} |")
    print(f"\n{rounds_done} rounds x {args.per} runs per variant and test, variant order rotated "
          "each round.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
