#!/usr/bin/env python3
"""Dump forward-pass fixtures from Hugging Face transformers (the oracle for `damascus verify`).

Loads a GGUF model in transformers (float32, CPU; transformers dequantizes the GGUF itself via
gguf-py), runs each prompt once and writes, per prompt, a pair of files:

    <out>/<name>.json   metadata: model file, prompt, token ids, layout of the binary, top-k logits
    <out>/<name>.bin    little-endian f32 hidden states

Hidden states are captured with forward hooks so the meaning of every slot is explicit:

    slot 0            token embeddings (input of layer 0)
    slot i (1..=L)    output of decoder layer i-1 (residual stream, before the final norm)
    slot L+1          output of the final RMSNorm

For each slot only a few positions are stored (by default the first and the last) to keep the
fixture small. Final logits of the last position: the top-k (id, logit) pairs plus the
log-sum-exp over the whole vocabulary, which is enough to compare probabilities exactly.

Examples:

    python3 tools/hf_fixtures.py --model /tmp/dev/SmolLM2-135M-Instruct.Q4_1.gguf \
        --out tests/fixtures/forward --name smollm2-q4_1 \
        --prompt "The capital of France is"

    # llama3-scaled models: transformers ignores GGUF's rope_freqs tensor, so pass the scaling.
    python3 tools/hf_fixtures.py --model tiny-llama3.Q4_K_M.gguf --llama3-scaling 32,1,4,8192 ...

Run by developers only (needs torch + transformers); CI only reads the committed fixtures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import struct
import sys
import tempfile


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="GGUF file")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--name", required=True, help="fixture base name; '-<i>' is appended per prompt when several")
    ap.add_argument("--prompt", action="append", required=True, help="prompt text (repeatable)")
    ap.add_argument("--ids", action="append", help="comma-separated token ids instead of tokenizing (one per --prompt)")
    ap.add_argument("--add-bos", action="store_true", help="prepend the BOS token when tokenizing")
    ap.add_argument("--positions", default="first,last", help="positions to store: 'first', 'last', or integers")
    ap.add_argument("--top-k", type=int, default=64, help="number of top logits to store")
    ap.add_argument("--llama3-scaling", default=None,
                    help="factor,low_freq_factor,high_freq_factor,original_max_position_embeddings")
    args = ap.parse_args()

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model_path = os.path.abspath(args.model)
    # Load from a private directory holding only a link to the GGUF: transformers would otherwise
    # pick up any tokenizer.json / config.json lying next to the model file.
    model_dir = tempfile.mkdtemp(prefix="hf_fixtures_")
    model_file = os.path.basename(model_path)
    os.symlink(model_path, os.path.join(model_dir, model_file))

    config = AutoConfig.from_pretrained(model_dir, gguf_file=model_file)
    if args.llama3_scaling:
        factor, low, high, orig = args.llama3_scaling.split(",")
        llama3 = {
            "rope_type": "llama3",
            "factor": float(factor),
            "low_freq_factor": float(low),
            "high_freq_factor": float(high),
            "original_max_position_embeddings": int(orig),
        }
        # transformers >= 5 keeps rope settings (including rope_theta) in `rope_parameters`,
        # aliased as `rope_scaling`; older versions keep rope_theta separately.
        params = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
        if "rope_theta" not in params and getattr(config, "rope_theta", None) is not None:
            params["rope_theta"] = config.rope_theta
        params.update(llama3)
        if hasattr(config, "rope_parameters"):
            config.rope_parameters = params
        else:
            config.rope_scaling = params
        print(f"rope parameters: {params}", file=sys.stderr)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, gguf_file=model_file, config=config, dtype=torch.float32
    )
    model.eval()
    tokenizer = None

    # Forward hooks: embeddings, every decoder layer, the final norm.
    captured: dict[int, torch.Tensor] = {}
    inner = model.model
    n_layer = len(inner.layers)

    def hook(slot: int):
        def f(_module, _inputs, output):
            out = output[0] if isinstance(output, tuple) else output
            captured[slot] = out.detach()[0].to(torch.float32)  # [n_tokens, n_embd]

        return f

    inner.embed_tokens.register_forward_hook(hook(0))
    for i, layer in enumerate(inner.layers):
        layer.register_forward_hook(hook(i + 1))
    inner.norm.register_forward_hook(hook(n_layer + 1))

    os.makedirs(args.out, exist_ok=True)
    digest = sha256_file(model_path)
    for idx, prompt in enumerate(args.prompt):
        if args.ids and idx < len(args.ids):
            ids = [int(x) for x in args.ids[idx].split(",")]
        else:
            if tokenizer is None:
                tokenizer = AutoTokenizer.from_pretrained(model_dir, gguf_file=model_file)
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            if args.add_bos:
                ids = [tokenizer.bos_token_id] + ids
        n_tokens = len(ids)
        positions = []
        for p in args.positions.split(","):
            p = p.strip()
            pos = 0 if p == "first" else n_tokens - 1 if p == "last" else int(p)
            if pos not in positions and 0 <= pos < n_tokens:
                positions.append(pos)

        captured.clear()
        with torch.no_grad():
            out = model(torch.tensor([ids]), use_cache=False)
        logits = out.logits[0, -1].to(torch.float64)  # [n_vocab]
        lse = float(torch.logsumexp(logits, dim=0))
        top = torch.topk(logits, args.top_k)
        top_ids = [int(i) for i in top.indices]
        top_logits = [float(v) for v in top.values]

        name = args.name if len(args.prompt) == 1 else f"{args.name}-{idx}"
        bin_path = os.path.join(args.out, name + ".bin")
        n_embd = captured[0].shape[-1]
        with open(bin_path, "wb") as f:
            for slot in range(n_layer + 2):
                h = captured[slot]
                for pos in positions:
                    f.write(struct.pack(f"<{n_embd}f", *h[pos].tolist()))
        meta = {
            "format": "damascus-forward-fixture/1",
            "generator": "tools/hf_fixtures.py",
            "model_file": model_file,
            "model_sha256": digest,
            "prompt": prompt,
            "ids": ids,
            "n_layer": n_layer,
            "n_embd": n_embd,
            "n_vocab": int(out.logits.shape[-1]),
            "positions": positions,
            "hidden_bin": name + ".bin",
            "hidden_layout": "[n_layer + 2 slots][positions][n_embd] f32 LE; slot 0 = embeddings, "
            "slot i = output of layer i-1, slot n_layer+1 = final norm output",
            "logits_lse": lse,
            "top_ids": top_ids,
            "top_logits": top_logits,
            "llama3_scaling": args.llama3_scaling,
        }
        with open(os.path.join(args.out, name + ".json"), "w") as f:
            json.dump(meta, f, indent=1)
            f.write("\n")
        probs = [math.exp(v - lse) for v in top_logits[:5]]
        shown = ", ".join(f"{i}:{p * 100:.2f}%" for i, p in zip(top_ids[:5], probs))
        print(f"{name}: {n_tokens} tokens, top-5 {shown}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
