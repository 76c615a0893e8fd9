#!/usr/bin/env python3
"""Bounded load test of `damascus serve` (stdlib only).

Usage: python3 tools/server_load.py [--url http://127.0.0.1:8080] [--clients 8] [--requests 20]
           [--max-tokens 16] [--api-key KEY]
Each client sends its requests back to back, alternating streamed and whole chat completions.
Reports requests/s, generated tokens/s, p50/p95 latency and time to first token (TTFT, streamed
requests: time to the first content chunk), and fails (exit 1) if any request fails.
"""
import argparse
import http.client
import json
import threading
import time
import urllib.parse


def one(url, key, i, j, max_tokens, stream):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": f"Tell me fact number {j} about the number {i}."},
        ],
        "max_tokens": max_tokens,
        "stream": stream,
        "stream_options": {"include_usage": True},
        "seed": i * 1000 + j,
    }
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    ttft, tokens = None, 0
    if stream:
        buf = b""
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            ev = json.loads(data)
            if ttft is None and ev.get("choices") and ev["choices"][0].get("delta", {}).get("content"):
                ttft = time.perf_counter() - t0
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
        del buf
    else:
        v = json.loads(r.read())
        tokens = v["usage"]["completion_tokens"]
    conn.close()
    return time.perf_counter() - t0, ttft, tokens


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--api-key", default=None)
    a = ap.parse_args()
    lat, ttfts, toks, errors = [], [], [], []
    lock = threading.Lock()

    def client(i):
        for j in range(a.requests):
            try:
                l, t, n = one(a.url, a.api_key, i, j, a.max_tokens, (i + j) % 2 == 0)
                with lock:
                    lat.append(l)
                    toks.append(n)
                    if t is not None:
                        ttfts.append(t)
            except Exception as e:  # noqa: BLE001
                with lock:
                    errors.append(repr(e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    n = len(lat)
    print(f"{a.clients} clients x {a.requests} requests, max_tokens {a.max_tokens}: "
          f"{n} ok, {len(errors)} failed in {wall:.1f} s")
    print(f"throughput: {n / wall:.2f} requests/s, {sum(toks) / wall:.1f} generated tokens/s")
    print(f"latency: p50 {pct(lat, 50) * 1000:.0f} ms, p95 {pct(lat, 95) * 1000:.0f} ms")
    print(f"TTFT (streamed): p50 {pct(ttfts, 50) * 1000:.0f} ms, p95 {pct(ttfts, 95) * 1000:.0f} ms")
    for e in errors[:5]:
        print("error:", e)
    raise SystemExit(1 if errors else 0)


if __name__ == "__main__":
    main()
