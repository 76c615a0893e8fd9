//! Tokenizers built from GGUF metadata: byte-level BPE (gpt2), SentencePiece-style
//! BPE (llama), special tokens, streaming decode and chat templates.
#![forbid(unsafe_code)]
