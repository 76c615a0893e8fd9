#!/usr/bin/env python3
"""Serving benchmark: N concurrent streaming clients against OpenAI-compatible servers.

Each client sends one /v1/completions request with a prompt of --prompt-tokens token ids
(distinct per client, round and concurrency level, so no request reuses another's prefix),
greedy, ignore_eos, and reads --gen-tokens streamed tokens. Per concurrency level it reports aggregate generated tok/s
(all tokens / wall time from the first request sent to the last token received), time to
first token p50/p95 and inter-token latency p50/p95 (gaps between streamed tokens).

Several servers are measured interleaved: round r runs every concurrency level on every
server before round r+1, so drift (thermal, other load) hits them alike. Numbers are the
medians over rounds (latency percentiles pooled over the rounds' requests).

    # against damascus serve and llama-server on the same model file, 3 rounds:
    damascus serve -m M.gguf --parallel 8 -c 8192 --port 8081 &
    llama-server -m M.gguf -np 8 -cb -c 8192 -t 2 --port 8082 &
    python3 tools/serve_bench.py --server damascus=http://127.0.0.1:8081 \\
        --server llama=http://127.0.0.1:8082 --streams 1,8 --rounds 3

`--long-prompt 2048` adds one client that sends a 2048-token prompt once every stream is
decoding, and reports the streams' inter-token latency p50/p95 over the gaps that end while it
is prefilled (chunked prefill keeps them bounded; issue 26 asks p95 < 2x single-stream ITL):

    python3 tools/serve_bench.py --server damascus=http://127.0.0.1:8081 --streams 1,16 \
        --long-prompt 2048

Standard library only. `--json` prints the results as JSON for scripts.
"""

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def prompt_ids(client, n, vocab_lo, vocab_hi):
    span = vocab_hi - vocab_lo
    return [vocab_lo + (client * 7919 + i * 104729 + i * i * 31) % span for i in range(n)]


def one_request(url, model, ids, gen, out, start_barrier, timeout, times=None):
    u = urllib.parse.urlparse(url)
    body = json.dumps({
        "model": model,
        "prompt": ids,
        "max_tokens": gen,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
    })
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    if start_barrier is not None:
        start_barrier.wait()
    t0 = time.perf_counter()
    times = [] if times is None else times
    err = None
    try:
        conn.request("POST", "/v1/completions", body=body,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            err = f"HTTP {resp.status}: {resp.read()[:200]!r}"
        else:
            buf = b""
            done = False
            while not done:
                chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(1)
                if not chunk:
                    break
                buf += chunk
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    for line in event.split(b"\n"):
                        if not line.startswith(b"data:"):
                            continue
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            done = True
                            break
                        try:
                            j = json.loads(data)
                        except ValueError:
                            continue
                        choices = j.get("choices") or []
                        if choices and (choices[0].get("text") is not None
                                        or choices[0].get("delta")):
                            # One streamed chunk per token (both servers stream that way).
                            if choices[0].get("finish_reason") is None or choices[0].get("text"):
                                times.append(time.perf_counter())
    except Exception as e:  # noqa: BLE001 — report any failure of this client
        err = str(e)
    finally:
        conn.close()
    out.append({"t0": t0, "times": times, "err": err})


def run_level(url, model, n, args):
    out = []
    barrier = threading.Barrier(n)
    progress = [[] for _ in range(n)]  # each stream's token times, filled as they arrive
    threads = [
        threading.Thread(target=one_request, args=(
            # Distinct per client, round (seed) and level (n): no request of the run finds
            # another's prompt in a prefix cache.
            url, model, prompt_ids(c + args.seed * 1000 + n * 1_000_000, args.prompt_tokens,
                                   args.vocab_lo, args.vocab_hi),
            args.gen_tokens, out, barrier, args.timeout, progress[c]))
        for c in range(n)
    ]
    long_out = []
    if args.long_prompt:
        # One more client: once every stream decodes (4 tokens each), a long prompt arrives
        # (one token asked for); the streams' gaps while it is prefilled are reported apart.
        def long_client():
            while any(len(t) < 4 for t in progress):
                time.sleep(0.005)
            ids = prompt_ids(77_777 + 100 * args.seed + n, args.long_prompt, args.vocab_lo,
                             args.vocab_hi)  # distinct per level: no prefix-cache hit
            one_request(url, model, ids, 1, long_out, None, args.timeout)
        threads.append(threading.Thread(target=long_client))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errs = [r["err"] for r in out + long_out if r["err"]]
    if errs:
        raise RuntimeError(f"{url}: {len(errs)} of {n} requests failed: {errs[0]}")
    first = min(r["t0"] for r in out)
    last = max(r["times"][-1] for r in out if r["times"])
    tokens = sum(len(r["times"]) for r in out)
    ttft = [(r["times"][0] - r["t0"]) * 1000 for r in out if r["times"]]
    itl = [(b - a) * 1000 for r in out for a, b in zip(r["times"], r["times"][1:])]
    itl_long = []
    if long_out and long_out[0]["times"]:
        lo, hi = long_out[0]["t0"], long_out[0]["times"][0]
        # Gaps that end while the long prompt is in flight (sent .. its first token).
        itl_long = [(b - a) * 1000 for r in out for a, b in zip(r["times"], r["times"][1:])
                    if lo < b <= hi]
    return {"tok_s": tokens / (last - first), "tokens": tokens, "ttft": ttft, "itl": itl,
            "itl_long": itl_long}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", action="append", required=True,
                    help="NAME=URL (repeatable; measured interleaved)")
    ap.add_argument("--streams", default="1,4,8,16,32", help="concurrency levels")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default="default", help="model field of the requests")
    ap.add_argument("--vocab-lo", type=int, default=1000)
    ap.add_argument("--vocab-hi", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0, help="varies the prompts")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured 1-stream requests")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--long-prompt", type=int, default=0,
                    help="also send one prompt of this many tokens once every stream decodes, "
                         "and report the streams' inter-token latency while it is prefilled")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    servers = []
    for s in args.server:
        name, _, url = s.partition("=")
        if not url:
            ap.error(f"--server wants NAME=URL, got {s!r}")
        servers.append((name, url.rstrip("/")))
    levels = [int(x) for x in args.streams.split(",") if x]
    for name, url in servers:
        for _ in range(args.warmup):
            run_level(url, args.model, 1,
                      argparse.Namespace(**{**vars(args), "seed": 999, "long_prompt": 0}))
    res = {(name, n): [] for name, _ in servers for n in levels}
    for r in range(args.rounds):
        for n in levels:
            for name, url in servers:
                a = argparse.Namespace(**{**vars(args), "seed": args.seed + r + 1})
                m = run_level(url, args.model, n, a)
                res[(name, n)].append(m)
                if not args.json:
                    print(f"# round {r + 1} {name} {n} streams: {m['tok_s']:.1f} tok/s",
                          file=sys.stderr)
    rows = []
    for n in levels:
        for name, _ in servers:
            ms = res[(name, n)]
            ttft = [x for m in ms for x in m["ttft"]]
            itl = [x for m in ms for x in m["itl"]]
            itl_long = [x for m in ms for x in m["itl_long"]]
            rows.append({
                "server": name, "streams": n,
                "tok_s_median": statistics.median(m["tok_s"] for m in ms),
                "tok_s_min": min(m["tok_s"] for m in ms),
                "tok_s_max": max(m["tok_s"] for m in ms),
                "ttft_p50_ms": percentile(ttft, 50), "ttft_p95_ms": percentile(ttft, 95),
                "itl_p50_ms": percentile(itl, 50), "itl_p95_ms": percentile(itl, 95),
                "itl_long_p50_ms": percentile(itl_long, 50),
                "itl_long_p95_ms": percentile(itl_long, 95), "itl_long_n": len(itl_long),
                "rounds": len(ms),
            })
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("| server | streams | gen tok/s (median, min–max) | TTFT p50 / p95 ms | ITL p50 / p95 ms |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['server']} | {r['streams']} | {r['tok_s_median']:.1f} "
              f"({r['tok_s_min']:.1f}–{r['tok_s_max']:.1f}) | "
              f"{r['ttft_p50_ms']:.0f} / {r['ttft_p95_ms']:.0f} | "
              f"{r['itl_p50_ms']:.1f} / {r['itl_p95_ms']:.1f} |")
    if args.long_prompt:
        print(f"\nInter-token latency while a {args.long_prompt}-token prompt is prefilled:")
        print("| server | streams | ITL p50 / p95 ms | gaps |")
        print("| --- | ---: | ---: | ---: |")
        for r in rows:
            print(f"| {r['server']} | {r['streams']} | {r['itl_long_p50_ms']:.1f} / "
                  f"{r['itl_long_p95_ms']:.1f} | {r['itl_long_n']} |")


if __name__ == "__main__":
    main()
