#!/usr/bin/env python3
"""Where two greedy generations (damascus `generate` outputs) part, the next-token
distribution of both backends at that point (`damascus predict --top 3`): a difference at a
near-tie shows as two candidates within a hair of each other. Dev tool for
tools/device_cuda.sh: `near_tie.py DAMASCUS MODEL PROMPT GEN_A GEN_B`."""

import subprocess
import sys

damascus, model, prompt, a_path, b_path = sys.argv[1:6]


def text(path: str) -> str:
    return open(path, encoding="utf-8", errors="replace").read().split("\n\n[stopped")[0]


a, b = text(a_path), text(b_path)
n = 0
while n < min(len(a), len(b)) and a[n] == b[n]:
    n += 1
if n == len(a) == len(b):
    print("identical generations")
    sys.exit(0)
prefix = a[:n]
print(f"first difference after {n - len(prompt)} generated characters: {a[n:n+20]!r} vs {b[n:n+20]!r}")
for backend in ("cuda", "cpu"):
    p = subprocess.run([damascus, "predict", "--backend", backend, "-m", model, "--top", "3", prefix],
                       capture_output=True, text=True)
    print(f"--- {backend} predict at the prefix\n{p.stdout}{p.stderr[-300:]}")
