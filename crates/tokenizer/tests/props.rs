//! Property tests: random Unicode strings round-trip through every tokenizer and never panic;
//! the streaming decoder reproduces the text and never splits a character.

use std::path::PathBuf;
use std::sync::OnceLock;

use damascus_gguf::GgufFile;
use damascus_tokenizer::{StreamDecoder, Tokenizer, TokenizerSpec};

/// xorshift64*: tiny, seeded, deterministic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn char(&mut self) -> char {
        const POOL: &[char] = &[
            ' ', ' ', '\n', '\r', '\t', '\'', 's', 'S', '1', '\u{a0}', '\u{200b}', '\u{301}',
            '\u{2581}', '<', '|', '>', '😀', '🏽', '\u{200d}', '🇫',
        ];
        let c = match self.below(6) {
            0 => Some(POOL[self.below(POOL.len() as u64) as usize]),
            1 | 2 => char::from_u32(0x20 + self.below(0x5f) as u32),
            3 => char::from_u32(self.below(0x3000) as u32),
            4 => char::from_u32(self.below(0x11_0000) as u32),
            _ => char::from_u32(0x4e00 + self.below(0x5000) as u32),
        };
        c.unwrap_or('?')
    }

    fn string(&mut self) -> String {
        let n = self.below(48);
        let mut s: String = (0..n).map(|_| self.char()).collect();
        if self.below(10) == 0 {
            s.push_str("<|im_start|><|eot_id|><s>");
        }
        s
    }
}

fn spm() -> Tokenizer {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/spm_bpe.gguf");
    Tokenizer::from_gguf(&GgufFile::open(p).unwrap()).unwrap()
}

/// The byte-level tokenizers, loaded once per test binary (the Llama 3 JSON takes seconds).
fn byte_level() -> &'static [(&'static str, Tokenizer)] {
    static CELL: OnceLock<Vec<(&'static str, Tokenizer)>> = OnceLock::new();
    CELL.get_or_init(load_byte_level)
}

fn load_byte_level() -> Vec<(&'static str, Tokenizer)> {
    let mut out = Vec::new();
    let smol = std::env::var("DAMASCUS_SMOLLM2")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from("/tmp/dev/SmolLM2-135M-Instruct.Q4_1.gguf"));
    let smol = if smol.exists() {
        Some(smol)
    } else {
        damascus_hub::default_model_path().ok()
    };
    match smol {
        Some(p) => out.push((
            "smollm2",
            Tokenizer::from_gguf(&GgufFile::open(p).unwrap()).unwrap(),
        )),
        None => eprintln!("SKIP smollm2: GGUF not found"),
    }
    let l3 = std::env::var("DAMASCUS_LLAMA3_TOKENIZER")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from("/tmp/dev/tokenizer.json"));
    let l3 = if l3.exists() {
        Some(l3)
    } else {
        damascus_hub::llama3_tokenizer_json().ok()
    };
    match l3 {
        Some(p) => {
            let spec =
                TokenizerSpec::from_hf_json(&std::fs::read_to_string(p).unwrap(), None).unwrap();
            out.push(("llama3", Tokenizer::from_spec(spec).unwrap()));
        }
        None => eprintln!("SKIP llama3: tokenizer.json not found"),
    }
    out
}

fn stream(tok: &Tokenizer, ids: &[u32], show_special: bool) -> String {
    let mut d = StreamDecoder::from_start(tok, show_special);
    let mut s = String::new();
    for &id in ids {
        s.push_str(&d.push(id).unwrap());
    }
    s.push_str(&d.finish());
    s
}

#[test]
fn random_strings_round_trip() {
    let spm = spm();
    let all = byte_level()
        .iter()
        .map(|(n, t)| (*n, t))
        .chain([("spm", &spm)]);
    for (name, tok) in all {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for _ in 0..400 {
            // Characters with a byte the vocabulary cannot express cannot round-trip (HF drops
            // them too): replace them.
            let s: String = rng
                .string()
                .chars()
                .map(|c| {
                    let mut buf = [0; 4];
                    let ok = c
                        .encode_utf8(&mut buf)
                        .bytes()
                        .all(|b| tok.byte_token(b).is_some());
                    if ok { c } else { '?' }
                })
                .collect();
            // SentencePiece cannot tell a literal `▁` from a space (sentencepiece neither).
            let s = if name == "spm" {
                s.replace('\u{2581}', " ")
            } else {
                s
            };
            let ids = tok.encode(&s, false, false);
            assert_eq!(
                tok.decode(&ids, false).unwrap(),
                s,
                "{name}: {s:?} -> {ids:?}"
            );
            assert_eq!(stream(tok, &ids, false), s, "{name} stream: {s:?}");
            // With special parsing on, showing specials must still give the text back.
            let ids = tok.encode(&s, true, true);
            let shown = tok.decode(&ids, true).unwrap();
            let bos = tok.bos_text();
            let back = if tok.add_bos() {
                shown.strip_prefix(bos).unwrap_or(&shown)
            } else {
                &shown
            };
            assert_eq!(back, s, "{name} special: {s:?}");
        }
    }
}

#[test]
fn stream_decoder_holds_partial_characters() {
    for (name, tok) in byte_level() {
        let name = *name;
        let text = "a😀b中";
        let ids = tok.encode(text, false, false);
        let mut d = tok.stream_decoder(false);
        let mut pieces = Vec::new();
        for &id in &ids {
            let p = d.push(id).unwrap();
            if !p.is_empty() {
                pieces.push(p);
            }
        }
        assert!(d.pending().is_empty(), "{name}");
        assert_eq!(pieces.concat(), text, "{name}");
        // Feeding a lone continuation byte token never yields broken UTF-8, only U+FFFD at the end.
        let lead = tok.encode("😀", false, false)[0];
        let mut d = tok.stream_decoder(false);
        let first = d.push(lead).unwrap();
        if tok.token_bytes(lead).unwrap().len() < 4 {
            assert_eq!(first, "", "{name}: partial emoji must be held back");
            assert_eq!(d.finish(), "\u{FFFD}", "{name}");
        }
    }
}

#[test]
fn invalid_ids_are_errors_not_panics() {
    let tok = spm();
    assert!(tok.decode(&[u32::MAX], false).is_err());
    assert!(
        tok.stream_decoder(false)
            .push(tok.n_vocab() as u32)
            .is_err()
    );
}

#[test]
fn long_pathological_inputs_are_fast_and_exact() {
    let spm = spm();
    let inputs = [
        "a".repeat(200_000),
        " ".repeat(100_000),
        "1".repeat(100_000),
        "\r\n".repeat(50_000),
        "😀".repeat(30_000),
        "ab ".repeat(50_000),
    ];
    let all = byte_level()
        .iter()
        .map(|(n, t)| (*n, t))
        .chain([("spm", &spm)]);
    for (name, tok) in all {
        for s in &inputs {
            let t = std::time::Instant::now();
            let ids = tok.encode(s, false, false);
            let took = t.elapsed();
            assert_eq!(&tok.decode(&ids, false).unwrap(), s, "{name}");
            // Generous bound for a loaded 2-core CI box; quadratic merging would take minutes.
            assert!(
                took.as_secs() < 10,
                "{name}: {} bytes took {took:?}",
                s.len()
            );
        }
    }
}
