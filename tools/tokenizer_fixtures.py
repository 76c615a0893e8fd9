"""Oracle fixtures for damascus-tokenizer, from Hugging Face `tokenizers` / `transformers`.

Run once by a developer (not in CI); writes small JSON files to
crates/tokenizer/tests/fixtures/:
  corpus.json        the strings (edge cases + mixed-language chunks)
  smollm2_ids.json   SmolLM2 ids: transformers' tokenizer loaded from the GGUF (gguf_file=), with
                     SmolLM's Digits pre-tokenizer restored (see below)
  llama3_ids.json    Llama 3.2 ids: tokenizers.Tokenizer.from_file(tokenizer.json)
  pretok_splits.json GPT-2 / Qwen2 regex splits (tokenizers' Split pre-tokenizer)
  templates.json     apply_chat_template renders (SmolLM2's template and Llama 3.2's)

For each vocabulary: "special" = encode(add_special_tokens=False) with special-token strings
matched (HF default), "plain" = the same with encode_special_tokens=True (specials as text),
"bos" = ids of corpus[0] with add_special_tokens=True.

Usage: python3 tools/tokenizer_fixtures.py [--smollm2 GGUF] [--llama3 tokenizer.json]
                                           [--llama3-config tokenizer_config.json]
"""

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenizer_corpus import edge_cases, mixed_corpus  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "crates", "tokenizer", "tests", "fixtures")
LLAMA32_TEMPLATE = os.path.join(OUT, "llama3.2_chat_template.jinja")


def corpus():
    text = mixed_corpus(12_000, seed=7)
    chunks = []
    i = 0
    while i < len(text):
        n = 200 + (i * 7919) % 400
        chunks.append(text[i:i + n])
        i += n
    return edge_cases() + chunks


def ids_for(backend, strings):
    backend.encode_special_tokens = False
    special = [backend.encode(s, add_special_tokens=False).ids for s in strings]
    backend.encode_special_tokens = True
    plain = [backend.encode(s, add_special_tokens=False).ids for s in strings]
    backend.encode_special_tokens = False
    bos = backend.encode(strings[0], add_special_tokens=True).ids
    for s, ids in zip(strings, plain):
        back = backend.decode(ids, skip_special_tokens=False)
        assert back == s, (s, back)
    return {"special": special, "plain": plain, "bos": bos}


def conversations():
    sys_msg = {"role": "system", "content": "You are a terse assistant. Answer in one line."}
    turns = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "  Paris.  "},
        {"role": "user", "content": "And of Japan? 日本の首都は？\nThanks!"},
        {"role": "assistant", "content": "Tokyo 🗼"},
        {"role": "user", "content": "<|im_end|> is just text here."},
    ]
    convs = []
    for n_user in (1, 2, 3):
        msgs = turns[: 2 * n_user - 1]
        convs.append(msgs)
        convs.append([sys_msg] + msgs)
    return convs


def render_cases(tok, template, name, extra):
    cases = []
    for msgs in conversations():
        for agp in (False, True):
            out = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=agp, chat_template=template, **extra)
            cases.append({"template": name, "messages": msgs, "add_generation_prompt": agp, "extra": extra, "expected": out})
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smollm2", default="/tmp/dev/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--llama3", default="/tmp/dev/tokenizer.json")
    ap.add_argument("--llama3-config", default="/tmp/dev/tokenizer_config.json")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    strings = corpus()
    with open(os.path.join(OUT, "corpus.json"), "w", encoding="utf-8") as f:
        json.dump({"strings": strings}, f, ensure_ascii=False, indent=0)

    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    # SmolLM2: transformers' own GGUF loader, from a directory holding only the GGUF.
    with tempfile.TemporaryDirectory() as d:
        os.symlink(os.path.abspath(args.smollm2), os.path.join(d, "model.gguf"))
        smol = AutoTokenizer.from_pretrained(d, gguf_file="model.gguf")
    # transformers' GGUF loader rebuilds the pre-tokenizer as plain ByteLevel (GPT-2 regex) and
    # drops SmolLM's `Digits(individual_digits=True)` step, which the upstream SmolLM2
    # tokenizer.json has and llama.cpp's `smollm` pre-tokenizer implements. Restore it so the
    # oracle is the real SmolLM2 tokenizer; record how many strings the raw loader gets differently.
    from tokenizers import pre_tokenizers

    raw_ids = ids_for(smol.backend_tokenizer, strings)
    smol.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    smol_ids = ids_for(smol.backend_tokenizer, strings)
    smol_ids["raw_transformers_gguf_differs"] = sum(a != b for a, b in zip(raw_ids["plain"], smol_ids["plain"]))
    with open(os.path.join(OUT, "smollm2_ids.json"), "w") as f:
        json.dump(smol_ids, f, separators=(",", ":"))

    llama = Tokenizer.from_file(args.llama3)
    with open(os.path.join(OUT, "llama3_ids.json"), "w") as f:
        json.dump(ids_for(llama, strings), f, separators=(",", ":"))

    # Pre-tokenizer splits for the regexes without a real vocabulary in the tests (GPT-2, Qwen2).
    from tokenizers import Regex

    regexes = {
        "gpt2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
        "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    }
    splits = {}
    for name, rx in regexes.items():
        split = pre_tokenizers.Split(Regex(rx), behavior="isolated")
        splits[name] = [[w for w, _ in split.pre_tokenize_str(s)] for s in strings]
    with open(os.path.join(OUT, "pretok_splits.json"), "w", encoding="utf-8") as f:
        json.dump(splits, f, ensure_ascii=False, separators=(",", ":"))

    # Chat templates.
    llama_tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(args.llama3_config)))
    with open(LLAMA32_TEMPLATE, encoding="utf-8") as f:
        llama_template = f.read()
    cases = render_cases(smol, smol.chat_template, "smollm2", {})
    cases += render_cases(llama_tok, llama_template, "llama3.2", {"date_string": "26 Jul 2024"})
    with open(os.path.join(OUT, "templates.json"), "w", encoding="utf-8") as f:
        json.dump(
            {
                "smollm2": {"bos_token": smol.bos_token, "eos_token": smol.eos_token},
                "llama3.2": {"bos_token": llama_tok.bos_token, "eos_token": llama_tok.eos_token},
                "cases": cases,
            },
            f,
            ensure_ascii=False,
            indent=1,
        )
    print(f"{len(strings)} strings, {len(cases)} template cases -> {OUT}")


if __name__ == "__main__":
    main()
