"""Train a small real SentencePiece BPE model and turn it into a GGUF fixture.

The model (BPE, byte fallback on, identity normalization, dummy prefix, ~2k pieces) is trained on
the deterministic mixed-language corpus of tools/tokenizer_corpus.py, then written with the `gguf`
package the way llama.cpp's convert_hf_to_gguf.py writes a SentencePiece vocabulary
(tokenizer.ggml.model = "llama", tokens / scores / token_type, bos / eos / unk ids, add_bos_token,
add_space_prefix). `sentencepiece` itself is the oracle: the ids of every corpus string are
written beside the GGUF.

Outputs (crates/tokenizer/tests/fixtures/): spm_bpe.gguf, spm_ids.json.
Usage: python3 tools/tokenizer_spm_fixture.py
"""

import json
import os
import sys
import tempfile

import gguf
import sentencepiece as spm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenizer_corpus import mixed_corpus  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "crates", "tokenizer", "tests", "fixtures")

# llama.cpp's SentencePiece token types.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def train(workdir):
    text = mixed_corpus(600_000, seed=1)
    path = os.path.join(workdir, "corpus.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    prefix = os.path.join(workdir, "spm")
    spm.SentencePieceTrainer.train(
        input=path,
        model_prefix=prefix,
        model_type="bpe",
        vocab_size=2000,
        byte_fallback=True,
        character_coverage=0.995,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        max_sentence_length=1 << 16,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=2,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_file=prefix + ".model")


def write_gguf(sp, path):
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i).encode("utf-8"))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(UNKNOWN)
        elif sp.is_control(i):
            types.append(CONTROL)
        elif sp.is_unused(i):
            types.append(UNUSED)
        elif sp.is_byte(i):
            types.append(BYTE)
        else:
            types.append(NORMAL)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("damascus-spm-bpe-test")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "corpus.json"), encoding="utf-8") as f:
        strings = json.load(f)["strings"]
    with tempfile.TemporaryDirectory() as d:
        sp = train(d)
    write_gguf(sp, os.path.join(OUT, "spm_bpe.gguf"))
    ids = [sp.encode(s) for s in strings]
    for s, i in zip(strings, ids):
        assert sp.decode(i) == s, (s, sp.decode(i))
    with open(os.path.join(OUT, "spm_ids.json"), "w") as f:
        json.dump({"plain": ids, "bos": [sp.bos_id()] + ids[0]}, f, separators=(",", ":"))
    print(f"vocab {sp.get_piece_size()}, {len(strings)} strings -> {OUT}")


if __name__ == "__main__":
    main()
