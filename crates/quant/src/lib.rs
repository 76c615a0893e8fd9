//! GGML block quantization formats: scalar reference dequantize/quantize per type,
//! bit-exact with gguf-py (dequant) and llama.cpp (quantize_row_*_ref).
