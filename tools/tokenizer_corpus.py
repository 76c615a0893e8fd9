"""Text corpora for the tokenizer fixtures and benchmark (deterministic, no downloads).

- `edge_cases()`: the hand-written strings every tokenizer test runs (prose, code, numbers,
  contractions, CJK, emoji with skin tones and flags, Arabic, Cyrillic, combining marks,
  NBSP/ZWSP, CRLF, very long words, special-token strings).
- `mixed_corpus(n_bytes, seed)`: pseudo-random mixed-language text built from those pieces and
  word lists, used to train the SentencePiece fixture and as the ~1 MB benchmark input.

Usage: python3 tools/tokenizer_corpus.py OUT.txt [N_BYTES] [SEED]
"""

import random
import sys

EN = """The quick brown fox jumps over the lazy dog. It's a truth universally acknowledged
that a single man in possession of a good fortune must be in want of a wife. I'M SURE WE'LL
be fine, they'd said; you're right, it's what we've DONE. Tokenizers split text into pieces
before the model sees it, and every byte must survive the round trip unchanged.""".split()
CODE = [
    "def main(argv):\n\tif len(argv) > 1:\n\t\treturn 0\n    return  1\n\n\n",
    "fn add(a: u32, b: u32) -> u32 {\n    a.wrapping_add(b) // sum\n}\n",
    "for (int i = 0; i < n; ++i) {  x[i] += y[i] * 2.5e-3;  }\r\n",
    "    \t  \n  \n\n\n    ",
    "SELECT id, name FROM users WHERE age >= 21 AND name LIKE '%smith%';\n",
    "<div class=\"x\">&nbsp;</div>\n",
]
WORDS = {
    "de": "Größe Straße über schön Mädchen Äpfel Fußgängerübergänge Donaudampfschifffahrt".split(),
    "fr": "déjà vu élève façon naïve cœur où garçon l'été c'est".split(),
    "ru": "Привет мир съешь же ещё этих мягких французских булок да выпей чаю".split(),
    "ar": "مرحبا بالعالم اللغة العربية جميلة جدا كتاب مدرسة".split(),
    "zh": "我们 今天 天气 很好 中文 分词 测试 你好 世界 机器 学习".split(),
    "ja": "こんにちは 世界 カタカナ ひらがな 日本語 東京 テスト".split(),
    "ko": "안녕하세요 세계 한국어 테스트 토크나이저".split(),
    "hi": "नमस्ते दुनिया हिंदी भाषा परीक्षण".split(),
    "el": "Γειά σου κόσμε ελληνικά αλφάβητο".split(),
}
EMOJI = ["😀", "👍🏽", "👩🏿‍💻", "🇫🇷", "🇯🇵", "❤️", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🤖"]
NUMBERS = ["0", "7", "42", "123", "1234", "12345", "3.14159", "1,000,000", "2024-07-26", "0x1F", "١٢٣", "½"]


def edge_cases():
    """Hand-written strings covering the cases the issue lists."""
    return [
        "Hello world",
        "Hello, world! How are you today?",
        " leading space and trailing space ",
        "  two leading spaces",
        "The quick brown fox jumps over the lazy dog.",
        "I'm you're he's we've they'd she'll it'S I'M YOU'RE WE'VE THEY'D SHE'LL DON'T",
        "don't Don't DON'T 'tis 'S 's",
        "Numbers: 1 12 123 1234 12345 123456 3.14159 1,000,000 007",
        "def f(x):\n\treturn x  *  2\n\n\n\tpass    \n",
        "if (a && b) {\n        c = d;\t// tabs\there\n    }\n",
        "line1\r\nline2\r\n\r\nline3\n\r\n",
        "trailing newlines\n\n\n",
        "   \n\t  \n",
        "\n",
        " ",
        "",
        "中文分词测试，我们今天天气很好。",
        "日本語のテキスト、カタカナとひらがな。",
        "한국어 텍스트입니다.",
        "Emoji: 😀 👍🏽 👩🏿‍💻 🇫🇷🇯🇵 ❤️ 👨‍👩‍👧‍👦 🏳️‍🌈",
        "مرحبا بالعالم، هذه جملة عربية.",
        "Привет, мир! Съешь же ещё этих мягких французских булок.",
        "Combining: e\u0301 a\u0300 n\u0303 Z\u0351\u0352\u0353 \u0915\u093f",
        "NBSP:\u00a0here, NNBSP\u202fthere, ZWSP:\u200bhere, ZWJ\u200d, BOM\ufeff, ideographic\u3000space",
        "Supercalifragilisticexpialidocious" * 8,
        "a" * 300,
        "🤖" * 40,
        "x" + "1234567890" * 10,
        "Special strings: <|im_start|>user\nhi<|im_end|> <|begin_of_text|><|eot_id|> <s></s>",
        "<|endoftext|><|endoftext|> <|start_header_id|>system<|end_header_id|>",
        "mixed 中English混合 текст ελληνικά 123abc abc123 a1b2c3",
        "punctuation!!! ??? ... --- ''' \"\"\" ``` ~~~ @@@ ### $$$ %%% ^^^ &&& ***",
        "Tab\tseparated\tvalues\t\t\tend",
        "\u00c5ngstr\u00f6m \u212bngstr\u00f6m Kelvin \u212a ﬁﬂ ligatures ſ long s 'ſ",
        "control chars \x00\x01\x07\x1b[0m\x7f",
        "URL https://example.com/path?q=1&r=two#frag and email a.b@c.de",
    ]


def mixed_corpus(n_bytes, seed=0):
    """Deterministic pseudo-random mixed-language text of about `n_bytes` UTF-8 bytes."""
    rng = random.Random(seed)
    langs = list(WORDS)
    parts = []
    size = 0
    while size < n_bytes:
        r = rng.random()
        if r < 0.35:
            s = " ".join(rng.choice(EN) for _ in range(rng.randint(5, 25))) + ". "
        elif r < 0.45:
            s = rng.choice(CODE)
        elif r < 0.80:
            words = WORDS[rng.choice(langs)]
            s = " ".join(rng.choice(words) for _ in range(rng.randint(3, 15))) + rng.choice([". ", "。", "\n", "! "])
        elif r < 0.88:
            s = " ".join(rng.choice(NUMBERS) for _ in range(rng.randint(2, 8))) + " "
        elif r < 0.93:
            s = "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 4))) + " "
        else:
            s = rng.choice(edge_cases()) + "\n"
        parts.append(s)
        size += len(s.encode())
    return "".join(parts)


if __name__ == "__main__":
    out = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 20
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    with open(out, "w", encoding="utf-8", newline="") as f:
        f.write(mixed_corpus(n, seed))
