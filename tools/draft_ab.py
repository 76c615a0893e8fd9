#!/usr/bin/env python3
"""Prompt-lookup speculative decoding A/B: `damascus run --temp 0` without and with
`--draft-ngram`, interleaved (every variant once per prompt per round), medians of the
generation tokens/s, the acceptance rate (accepted drafted / drafted) and the verify passes.
Checks that every variant generates the same ids as plain greedy decoding.

Prompts: a Python rename (code edit, short reply), a Rust rename (code edit, long reply) and
a short story (free text, little to copy), each through the model's chat template.

Usage:
    tools/draft_ab.py [--bin target/release/damascus] [-m MODEL] [-t 2] [-n 256] [--rounds 7]
                      [--variant 'ngram4=--draft-ngram 4']...

Dev tool: not run in CI.
"""

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

PROMPTS = {
    "edit-py": '''Rewrite this function with the variable `x` renamed to `value`. Reply with the full code only.

```python
def normalize(x, lo, hi):
    if hi <= lo:
        raise ValueError("empty range")
    x = max(lo, min(hi, x))
    span = hi - lo
    x = (x - lo) / span
    return round(x, 6)

def normalize_all(items, lo, hi):
    out = []
    for x in items:
        out.append(normalize(x, lo, hi))
    return out
```''',
    "edit-rs": '''Rename the variable `buf` to `buffer` everywhere in this Rust function. Reply with the whole function and nothing else.

```rust
fn read_records(path: &Path, limit: usize) -> io::Result<Vec<Record>> {
    let mut file = File::open(path)?;
    let mut buf = Vec::with_capacity(4096);
    file.read_to_end(&mut buf)?;
    let mut records = Vec::new();
    let mut offset = 0;
    while offset + 8 <= buf.len() && records.len() < limit {
        let len = u32::from_le_bytes(buf[offset..offset + 4].try_into().unwrap()) as usize;
        let kind = u32::from_le_bytes(buf[offset + 4..offset + 8].try_into().unwrap());
        offset += 8;
        if offset + len > buf.len() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "truncated record"));
        }
        let payload = buf[offset..offset + len].to_vec();
        records.push(Record { kind, payload });
        offset += len;
    }
    Ok(records)
}
```''',
    "free": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="target/release/damascus")
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("-t", "--threads", default="2")
    ap.add_argument("-n", "--n-predict", default="256")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--variant", action="append", default=None,
                    help="NAME=FLAGS, e.g. 'ngram4=--draft-ngram 4' (repeatable)")
    a = ap.parse_args()
    variants = [("off", [])] + [
        (v.split("=", 1)[0], v.split("=", 1)[1].split())
        for v in (a.variant or ["ngram4=--draft-ngram 4"])
    ]
    tmp = Path(tempfile.mkdtemp(prefix="draft_ab"))
    files = {}
    for name, text in PROMPTS.items():
        files[name] = tmp / f"{name}.txt"
        files[name].write_text(text)
    res, ids = {}, {}
    for _ in range(a.rounds):
        for name, path in files.items():
            for vname, flags in variants:
                cmd = [a.bin, "run", "-f", str(path), "--temp", "0", "-n", a.n_predict,
                       "-t", a.threads, "--json"] + flags
                if a.model:
                    cmd += ["-m", a.model]
                out = json.loads(subprocess.run(cmd, capture_output=True, text=True,
                                                check=True).stdout)
                t = out["timings"]
                tps = t["generated_tokens"] * 1000 / t["generation_ms"]
                res.setdefault((name, vname), []).append((tps, t.get("draft") or {}))
                first = ids.setdefault(name, out["ids"])
                if out["ids"] != first:
                    raise SystemExit(f"{name} {vname}: the ids differ from plain decoding")
    print("| prompt | variant | tok/s (median) | vs off | accepted/drafted | verify passes | generated |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for name in PROMPTS:
        base = statistics.median(x[0] for x in res[(name, "off")])
        for vname, _ in variants:
            runs = res[(name, vname)]
            med = statistics.median(x[0] for x in runs)
            d = runs[0][1]
            acc = (f"{d['accepted']}/{d['drafted']} ({100 * d['accepted'] / max(d['drafted'], 1):.0f}%)"
                   if d else "-")
            print(f"| {name} | {vname} | {med:.1f} | {med / base:.2f}x | {acc} | "
                  f"{d.get('passes', '-') if d else '-'} | {len(ids[name])} |")


if __name__ == "__main__":
    main()
