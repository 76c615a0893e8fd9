#!/usr/bin/env python3
"""Greedy-generation fixtures from Hugging Face transformers (the oracle for `damascus generate`).

Loads a GGUF model in transformers (float32, CPU; transformers dequantizes the GGUF itself via
gguf-py), runs greedy `generate` (do_sample=False) for each prompt and writes one JSON file:

    {"format": "damascus-generate-fixture/1", "model_file", "model_sha256", "max_new_tokens",
     "cases": [{"prompt", "prompt_ids", "ids" (new tokens only), "text", "eos_stopped"}]}

Prompts are tokenized without special tokens (the default model's metadata says add_bos=false,
which is what `damascus generate` follows). Generation stops early only at the model's EOS, as
`generate` does by default; `ids` then ends with that EOS id.

Example (the committed fixture):

    python3 tools/hf_generate_fixtures.py --model /tmp/dev/SmolLM2-135M-Instruct.Q4_1.gguf \
        --out tests/fixtures/generate/smollm2-q4_1-greedy.json

Run by developers only (needs torch + transformers); CI only reads the committed fixture.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile

DEFAULT_PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a little",
    "def fibonacci(n):",
    "The three primary colors are",
]


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="GGUF file")
    ap.add_argument("--out", required=True, help="output JSON file")
    ap.add_argument("--prompt", action="append", help="prompt text (repeatable); default: a built-in set")
    ap.add_argument("-n", "--max-new-tokens", type=int, default=32)
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model_path = os.path.abspath(args.model)
    # A private directory holding only a link to the GGUF, so no stray config.json is picked up.
    model_dir = tempfile.mkdtemp(prefix="hf_generate_")
    model_file = os.path.basename(model_path)
    os.symlink(model_path, os.path.join(model_dir, model_file))
    tokenizer = AutoTokenizer.from_pretrained(model_dir, gguf_file=model_file)
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=model_file, dtype=torch.float32)
    model.eval()
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])

    cases = []
    for prompt in args.prompt or DEFAULT_PROMPTS:
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt_ids]),
                attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                temperature=None,
                top_p=None,
                top_k=None,
                pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
            )
        ids = [int(t) for t in out[0, len(prompt_ids):]]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        cases.append({
            "prompt": prompt,
            "prompt_ids": prompt_ids,
            "ids": ids,
            "text": text,
            "eos_stopped": bool(ids) and ids[-1] in eos_ids,
        })
        print(f"{prompt!r} -> {text!r} ({len(ids)} tokens)", file=sys.stderr)

    fixture = {
        "format": "damascus-generate-fixture/1",
        "generator": "tools/hf_generate_fixtures.py",
        "model_file": model_file,
        "model_sha256": sha256_file(model_path),
        "max_new_tokens": args.max_new_tokens,
        "do_sample": False,
        "eos_ids": sorted(eos_ids),
        "cases": cases,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
