#!/usr/bin/env python3
"""Side-by-side throughput of `damascus bench` and llama.cpp's `llama-bench` on one GGUF file.

Follows ../shared/BENCHMARKS.md: same file, threads and sizes; each engine runs `-r 1` per
invocation (each invocation warms up first), interleaved A B A B ... for `--runs` rounds, so
drift hits both alike. Reports per test the median and p5/p95 of each engine, the ratio of the
medians, whether the p5..p95 intervals overlap, bytes read per generated token and the percent
of measured memory bandwidth that reaches (tg), linear-layer ops per prompt token and the
percent of the measured int8 `vpdpbusd` peak that reaches (pp; tools/compute_peak.c, where the
CPU has AVX-512 VNNI), and each engine's peak RSS.

Bandwidth comes from ../shared/tools/roofline.c compiled to a temporary binary (it needs
AVX-512); where it cannot run, a numpy single-pass read is used instead and labelled as such.
`--bandwidth GBPS` skips the measurement.

Usage:
    tools/bench_compare.py -m MODEL.gguf -t 2 -p 512 -n 128 --runs 10 [--append BENCHMARKS.md]

Dev tool: not run in CI. Needs python3; bytes/token and ops/token come from `damascus bench
--json` (else from the `gguf` pip package); numpy for the bandwidth fallback.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_LLAMA_BENCH = Path(
    "/opt/llama/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-bench"
)
ROOFLINE_C = REPO.parent / "shared" / "tools" / "roofline.c"


def quantile(xs: list[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default)."""
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = q * (len(s) - 1)
    lo, hi = int(pos), min(int(pos) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def run_measured(cmd: list[str]) -> tuple[str, int]:
    """Runs `cmd`; returns (stdout, peak RSS in bytes of that child alone)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text = out.read().decode()
        if p.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{err.read().decode()[-2000:]}")
    return text, ru.ru_maxrss * 1024  # Linux reports KiB


def damascus_samples(text: str) -> dict[str, list[float]]:
    doc = json.loads(text)
    return {t["name"]: list(t["samples_ts"]) for t in doc["tests"]}


def damascus_work(text: str) -> tuple[int | None, int | None]:
    """Decode bytes/token and prompt ops/token as `damascus bench --json` reports them."""
    doc = json.loads(text)
    return doc.get("decode_bytes_per_token"), doc.get("prompt_ops_per_token")


def llama_samples(text: str) -> dict[str, list[float]]:
    doc = json.loads(text)
    out = {}
    for t in doc:
        name = f"pp{t['n_prompt']}" if t["n_gen"] == 0 else f"tg{t['n_gen']}"
        out[name] = list(t["samples_ts"])
    return out


def bytes_per_token(model: Path) -> int | None:
    """Weight bytes one decode step reads: every tensor except the embedding table, which is
    only gathered from unless it doubles as the LM head (tied embeddings)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        return None
    r = GGUFReader(str(model))
    names = {t.name for t in r.tensors}
    tied = "output.weight" not in names
    total = 0
    for t in r.tensors:
        if t.name == "token_embd.weight" and not tied:
            continue
        if t.name == "rope_freqs.weight":
            continue
        total += int(t.n_bytes)
    return total


def ops_per_token(model: Path) -> int | None:
    """Integer ops one prompt token costs in the linear layers: 2 · Σ rows · cols over the
    decoder's 2-D weights (`blk.*`); the LM head runs for the last position only."""
    try:
        from gguf import GGUFReader
    except ImportError:
        return None
    r = GGUFReader(str(model))
    macs = 0
    for t in r.tensors:
        dims = [int(d) for d in t.shape]
        if t.name.startswith("blk.") and len(dims) == 2:
            macs += dims[0] * dims[1]
    return 2 * macs


def c_tool_column(src: Path, threads: int) -> float | None:
    """Builds the C measuring tool `src` (`cc -O2 -march=native`) in a temporary directory,
    runs it with `threads` and returns the first figure of its row for that thread count
    (roofline.c: read GB/s; compute_peak.c: int8 TOPS), or None where it cannot build or run."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc or not src.exists():
        return None
    with tempfile.TemporaryDirectory() as d:
        exe = Path(d) / src.stem
        ok = subprocess.run(
            [cc, "-O2", "-march=native", "-pthread", str(src), "-o", str(exe)], capture_output=True
        )
        if ok.returncode != 0:
            return None
        run = subprocess.run([str(exe), str(threads)], capture_output=True, text=True)
        if run.returncode != 0:
            return None
        for line in run.stdout.splitlines():
            f = line.split()
            if f and f[0] == str(threads):
                return float(f[1])
    return None


def measure_int8_peak(threads: int) -> tuple[float | None, str]:
    """AVX-512 VNNI int8 peak in TOPS at `threads` threads, from tools/compute_peak.c (ten
    independent `vpdpbusd` chains; roofline.c's VNNI figure is not used: its identical chains
    are merged by the compiler, see compute_peak.c)."""
    peak = c_tool_column(REPO / "tools" / "compute_peak.c", threads)
    if peak is None:
        return None, "not measured (needs a C compiler and AVX-512 VNNI)"
    return peak, f"tools/compute_peak.c, {threads} threads"


def measure_bandwidth(threads: int, roofline_c: Path) -> tuple[float | None, str]:
    """Read bandwidth in GB/s at `threads` threads and where it came from."""
    bw = c_tool_column(roofline_c, threads)
    if bw is not None:
        return bw, f"roofline.c, {threads} threads"
    try:
        import time

        import numpy as np

        a = np.ones(1 << 27, dtype=np.int64)  # 1 GiB
        a.sum()
        best = 0.0
        for _ in range(3):
            t0 = time.perf_counter()
            a.sum()
            best = max(best, a.nbytes / (time.perf_counter() - t0) / 1e9)
        return best, "numpy 1-thread read (roofline.c needs AVX-512; this CPU lacks it)"
    except Exception as e:  # noqa: BLE001 - a dev tool: report and go on
        return None, f"not measured ({e})"


def device_info(damascus: str) -> str:
    r = subprocess.run([damascus, "--device-info"], capture_output=True, text=True)
    return r.stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("-m", "--model", required=True, type=Path)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", "--n-prompt", default="512")
    ap.add_argument("-n", "--n-gen", default="128")
    ap.add_argument("--runs", type=int, default=10, help="interleaved rounds (A B per round)")
    ap.add_argument("--damascus", default=str(REPO / "target" / "release" / "damascus"))
    ap.add_argument("--llama-bench", default=str(DEFAULT_LLAMA_BENCH))
    ap.add_argument("--bandwidth", type=float, help="GB/s; skips the measurement")
    ap.add_argument("--roofline", type=Path, default=ROOFLINE_C, help="path of roofline.c")
    ap.add_argument("--append", type=Path, help="append the section to this markdown file")
    ap.add_argument("--note", default="", help="a line printed under the heading")
    ap.add_argument("--damascus-args", default="",
                    help="extra `damascus bench` flags, e.g. \"--backend cuda\"")
    ap.add_argument("--llama-args", default="", help="extra llama-bench flags, e.g. \"-ngl 99 -fa 1\"")
    args = ap.parse_args()

    sizes = ["-p", args.n_prompt, "-n", args.n_gen]
    a_cmd = [args.damascus, "bench", "-m", str(args.model), "-t", str(args.threads), *sizes,
             "-r", "1", "--json", *args.damascus_args.split()]
    b_cmd = [args.llama_bench, "-m", str(args.model), "-t", str(args.threads), *sizes,
             "-r", "1", "-o", "json", *args.llama_args.split()]
    a: dict[str, list[float]] = {}
    b: dict[str, list[float]] = {}
    rss_a = rss_b = 0
    work: tuple[int | None, int | None] = (None, None)
    for i in range(args.runs):
        print(f"round {i + 1}/{args.runs}", file=sys.stderr, flush=True)
        for cmd, store, which in ((a_cmd, a, "a"), (b_cmd, b, "b")):
            text, rss = run_measured(cmd)
            parsed = damascus_samples(text) if which == "a" else llama_samples(text)
            for name, s in parsed.items():
                store.setdefault(name, []).extend(s)
            if which == "a":
                work = damascus_work(text)
                rss_a = max(rss_a, rss)
            else:
                rss_b = max(rss_b, rss)

    bpt = work[0] or bytes_per_token(args.model)
    if args.bandwidth:
        bw, bw_src = args.bandwidth, "given with --bandwidth"
    else:
        bw, bw_src = measure_bandwidth(args.threads, args.roofline)

    opt = work[1] or ops_per_token(args.model)
    peak, peak_src = measure_int8_peak(args.threads)

    def fmt(xs: list[float]) -> str:
        return f"{quantile(xs, 0.5):.2f} ({quantile(xs, 0.05):.2f}–{quantile(xs, 0.95):.2f})"

    rows = [
        "| test | damascus t/s median (p5–p95) | llama.cpp t/s median (p5–p95) | ratio | p95 overlap "
        "| work/token | % of roofline damascus | % of roofline llama.cpp |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for name in sorted(set(a) | set(b), key=lambda n: (n[:2], int(n[2:]))):
        xa, xb = a.get(name, []), b.get(name, [])
        if not xa or not xb:
            continue
        ma, mb = quantile(xa, 0.5), quantile(xb, 0.5)
        overlap = max(quantile(xa, 0.05), quantile(xb, 0.05)) <= min(
            quantile(xa, 0.95), quantile(xb, 0.95)
        )
        if name.startswith("tg") and bpt:
            per_tok = f"{bpt / 1e6:.1f} MB"
            pa = f"{100 * ma * bpt / (bw * 1e9):.0f}%" if bw else "—"
            pb = f"{100 * mb * bpt / (bw * 1e9):.0f}%" if bw else "—"
        elif name.startswith("pp") and opt:
            per_tok = f"{opt / 1e9:.2f} GOP"
            pa = f"{100 * ma * opt / (peak * 1e12):.0f}%" if peak else "—"
            pb = f"{100 * mb * opt / (peak * 1e12):.0f}%" if peak else "—"
        else:
            per_tok, pa, pb = "—", "—", "—"
        rows.append(
            f"| {name} | {fmt(xa)} | {fmt(xb)} | {ma / mb:.2f}× | {'yes' if overlap else 'no'} "
            f"| {per_tok} | {pa} | {pb} |"
        )
    isa = os.environ.get("DAMASCUS_ISA")
    cmd_line = (
        (f"DAMASCUS_ISA={isa} " if isa else "")
        + f"tools/bench_compare.py -m {args.model} -t {args.threads} -p {args.n_prompt} "
        f"-n {args.n_gen} --runs {args.runs}"
    )
    load = os.getloadavg()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"### {args.model.name}, -t {args.threads} ({now})",
        "",
        *( [args.note, ""] if args.note else [] ),
        f"Command: `{cmd_line}` — {args.runs} interleaved rounds, each engine `-r 1` per round "
        f"(after its own warm-up). Load average at the end: {load[0]:.1f} / {load[1]:.1f} / "
        f"{load[2]:.1f}.",
        "",
        *rows,
        "",
        f"Peak RSS: damascus {rss_a / 2**20:.0f} MiB, llama.cpp {rss_b / 2**20:.0f} MiB. "
        + (f"Bandwidth {bw:.1f} GB/s ({bw_src})." if bw else f"Bandwidth {bw_src}.")
        + (f" Int8 peak {peak:.2f} TOPS ({peak_src})." if peak else f" Int8 peak {peak_src}."),
        "Roofline: tg — bytes/token at the measured read bandwidth; pp — linear-layer ops/token "
        "at the measured int8 (`vpdpbusd`) peak.",
        "",
        "`damascus --device-info`:",
        "",
        "```",
        device_info(args.damascus),
        "```",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.append:
        with open(args.append, "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
