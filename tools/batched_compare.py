#!/usr/bin/env python3
"""Batched throughput of `damascus bench --npl N` against llama.cpp's `llama-batched-bench`
on one GGUF file: N sequences, each a prompt of P tokens and then T greedy decode steps.

llama-batched-bench runs the N prompts together (`S_PP`, tokens of all prompts per second),
then T steps of all N sequences after them (`S_TG`, N·T tokens per second, at depth P).
Damascus measures the same two phases: `ppP xN` (N prompts of P tokens) and `tgT xN @ dP` (T
steps of all N after P tokens each). One invocation of each engine per round and N (each
warms up first), the engines alternating, for `--runs` rounds, as ../shared/BENCHMARKS.md
asks; per test the median and p5/p95 of each engine, the ratio and whether the p5..p95
intervals are apart.

  tools/batched_compare.py -m SmolLM2-135M-Instruct.Q4_1.gguf -t 2 --npp 512 --ntg 128 \
      --npl 1,8 --runs 10 --llama-batched-bench /path/to/build/bin/llama-batched-bench

Dev tool: not run in CI.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compare import quantile, run_measured  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def llama_round(exe: str, model: str, t: int, npp: int, ntg: int, npl: int) -> dict[str, float]:
    ctx = npl * (npp + ntg) + 16
    text, _ = run_measured([exe, "-m", model, "-t", str(t), "-c", str(ctx), "-b", "2048",
                            "-ub", "512", "-npp", str(npp), "-ntg", str(ntg), "-npl", str(npl),
                            "--output-format", "jsonl"])
    for line in text.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            return {"pp": r["speed_pp"], "tg": r["speed_tg"]}
    sys.exit(f"no result line from llama-batched-bench:\n{text[-2000:]}")


def damascus_round(exe: str, model: str, t: int, npp: int, ntg: int, npl: int) -> dict[str, float]:
    base = [exe, "bench", "-m", model, "-t", str(t), "-r", "1", "--npl", str(npl), "--json"]
    pp, _ = run_measured(base + ["-p", str(npp), "-n", "0"])
    tg, _ = run_measured(base + ["-p", "0", "-n", str(ntg), "-d", str(npp)])
    first = lambda text: json.loads(text)["tests"][0]["samples_ts"][0]  # noqa: E731
    return {"pp": first(pp), "tg": first(tg)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--npp", type=int, default=512)
    ap.add_argument("--ntg", type=int, default=128)
    ap.add_argument("--npl", default="1,8")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--damascus", default=str(REPO / "target" / "release" / "damascus"))
    ap.add_argument("--llama-batched-bench", required=True)
    a = ap.parse_args()
    npls = [int(x) for x in a.npl.split(",")]
    got: dict[tuple[str, int, str], list[float]] = {}
    for r in range(a.runs):
        for npl in npls:
            engines = [("damascus", damascus_round, a.damascus),
                       ("llama.cpp", llama_round, a.llama_batched_bench)]
            if r % 2:
                engines.reverse()
            for name, fn, exe in engines:
                for test, v in fn(exe, a.model, a.threads, a.npp, a.ntg, npl).items():
                    got.setdefault((name, npl, test), []).append(v)
        print(f"round {r + 1}/{a.runs} done", file=sys.stderr, flush=True)
    print(f"\n{a.model}, -t {a.threads}, {a.npp}-token prompts, {a.ntg} steps, {a.runs} rounds\n")
    print("| test | Damascus t/s median (p5–p95) | llama.cpp t/s median (p5–p95) | ratio | p5–p95 apart |")
    print("| --- | ---: | ---: | ---: | --- |")
    for npl in npls:
        for test in ("pp", "tg"):
            d, l = got[("damascus", npl, test)], got[("llama.cpp", npl, test)]
            dm, lm = quantile(d, 0.5), quantile(l, 0.5)
            d5, d95, l5, l95 = quantile(d, 0.05), quantile(d, 0.95), quantile(l, 0.05), quantile(l, 0.95)
            apart = "yes" if d5 > l95 or l5 > d95 else "no"
            name = f"pp{a.npp} x{npl}" if test == "pp" else f"tg{a.ntg} x{npl} @ d{a.npp}"
            print(f"| {name} | {dm:,.1f} ({d5:,.1f}–{d95:,.1f}) | {lm:,.1f} ({l5:,.1f}–{l95:,.1f}) "
                  f"| {dm / lm:.2f}× | {apart} |")


if __name__ == "__main__":
    main()
