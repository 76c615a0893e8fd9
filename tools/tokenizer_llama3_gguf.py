"""Embed the Llama 3.2 tokenizer.json into a Llama-3.2-shaped GGUF (tokenizer metadata only),
the way llama.cpp's converter writes a gpt2/llama-bpe vocabulary.

The result is several MB (128k tokens, 280k merges), so it is not committed: the Rust test
`llama3_gguf_matches_tokenizers` uses it when DAMASCUS_LLAMA3_GGUF points at it (or it exists
at /tmp/llama3_tokenizer.gguf).

Usage: python3 tools/tokenizer_llama3_gguf.py [tokenizer.json] [tokenizer_config.json] [OUT.gguf]
"""

import json
import os
import sys

import gguf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATE = os.path.join(ROOT, "crates", "tokenizer", "tests", "fixtures", "llama3.2_chat_template.jinja")
NORMAL, CONTROL, USER_DEFINED = 1, 3, 4


def main():
    tj = sys.argv[1] if len(sys.argv) > 1 else "/tmp/dev/tokenizer.json"
    cfg_path = sys.argv[2] if len(sys.argv) > 2 else "/tmp/dev/tokenizer_config.json"
    out = sys.argv[3] if len(sys.argv) > 3 else "/tmp/llama3_tokenizer.gguf"
    j = json.load(open(tj, encoding="utf-8"))
    cfg = json.load(open(cfg_path, encoding="utf-8"))
    vocab = j["model"]["vocab"]
    n = max(max(vocab.values()), max(a["id"] for a in j["added_tokens"])) + 1
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [NORMAL] * n
    for s, i in vocab.items():
        tokens[i] = s
    for a in j["added_tokens"]:
        tokens[a["id"]] = a["content"]
        types[a["id"]] = CONTROL if a["special"] else USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    ids = {t: i for i, t in enumerate(tokens)}

    def tok_id(v):
        return ids[v["content"] if isinstance(v, dict) else v]

    w = gguf.GGUFWriter(out, "llama")
    w.add_name("Llama 3.2 tokenizer")
    w.add_vocab_size(n)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tok_id(cfg["bos_token"]))
    w.add_eos_token_id(tok_id(cfg["eos_token"]))
    w.add_add_bos_token(True)
    w.add_chat_template(open(TEMPLATE, encoding="utf-8").read())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{n} tokens, {len(merges)} merges -> {out}")


if __name__ == "__main__":
    main()
