//! Typed metadata keys and tensor names, so no other crate spells a raw key string.
//!
//! Architecture-specific keys are built from a suffix constant: `keys::llm("llama",
//! keys::BLOCK_COUNT)` is `"llama.block_count"`. Names follow gguf-py's `constants.py`
//! (including its spelling `seperator_token_id`).

/// `general.architecture` (string), e.g. `"llama"`.
pub const GENERAL_ARCHITECTURE: &str = "general.architecture";
/// `general.quantization_version` (u32).
pub const GENERAL_QUANTIZATION_VERSION: &str = "general.quantization_version";
/// `general.alignment` (u32, power of two; default 32).
pub const GENERAL_ALIGNMENT: &str = "general.alignment";
/// `general.file_type` (u32, a [`crate::FileType`] id).
pub const GENERAL_FILE_TYPE: &str = "general.file_type";
/// `general.type` (string, e.g. `"model"`).
pub const GENERAL_TYPE: &str = "general.type";
/// `general.name` (string).
pub const GENERAL_NAME: &str = "general.name";
/// `general.basename` (string).
pub const GENERAL_BASENAME: &str = "general.basename";
/// `general.finetune` (string).
pub const GENERAL_FINETUNE: &str = "general.finetune";
/// `general.size_label` (string, e.g. `"135M"`).
pub const GENERAL_SIZE_LABEL: &str = "general.size_label";
/// `general.description` (string).
pub const GENERAL_DESCRIPTION: &str = "general.description";
/// `general.license` (string).
pub const GENERAL_LICENSE: &str = "general.license";
/// `general.author` (string).
pub const GENERAL_AUTHOR: &str = "general.author";
/// `general.organization` (string).
pub const GENERAL_ORGANIZATION: &str = "general.organization";
/// `general.quantized_by` (string).
pub const GENERAL_QUANTIZED_BY: &str = "general.quantized_by";

/// Builds an architecture-specific key: `llm("llama", BLOCK_COUNT)` -> `"llama.block_count"`.
pub fn llm(arch: &str, suffix: &str) -> String {
    format!("{arch}.{suffix}")
}

/// `{arch}.vocab_size` (u32).
pub const VOCAB_SIZE: &str = "vocab_size";
/// `{arch}.context_length` (u32): training context.
pub const CONTEXT_LENGTH: &str = "context_length";
/// `{arch}.embedding_length` (u32): hidden size.
pub const EMBEDDING_LENGTH: &str = "embedding_length";
/// `{arch}.block_count` (u32): layer count.
pub const BLOCK_COUNT: &str = "block_count";
/// `{arch}.feed_forward_length` (u32).
pub const FEED_FORWARD_LENGTH: &str = "feed_forward_length";
/// `{arch}.expert_count` (u32).
pub const EXPERT_COUNT: &str = "expert_count";
/// `{arch}.expert_used_count` (u32).
pub const EXPERT_USED_COUNT: &str = "expert_used_count";
/// `{arch}.logit_scale` (f32).
pub const LOGIT_SCALE: &str = "logit_scale";
/// `{arch}.attention.head_count` (u32).
pub const ATTENTION_HEAD_COUNT: &str = "attention.head_count";
/// `{arch}.attention.head_count_kv` (u32).
pub const ATTENTION_HEAD_COUNT_KV: &str = "attention.head_count_kv";
/// `{arch}.attention.key_length` (u32): head dim of K (default embedding / heads).
pub const ATTENTION_KEY_LENGTH: &str = "attention.key_length";
/// `{arch}.attention.value_length` (u32): head dim of V.
pub const ATTENTION_VALUE_LENGTH: &str = "attention.value_length";
/// `{arch}.attention.layer_norm_rms_epsilon` (f32).
pub const ATTENTION_LAYERNORM_RMS_EPS: &str = "attention.layer_norm_rms_epsilon";
/// `{arch}.attention.layer_norm_epsilon` (f32).
pub const ATTENTION_LAYERNORM_EPS: &str = "attention.layer_norm_epsilon";
/// `{arch}.attention.causal` (bool).
pub const ATTENTION_CAUSAL: &str = "attention.causal";
/// `{arch}.attention.sliding_window` (u32).
pub const ATTENTION_SLIDING_WINDOW: &str = "attention.sliding_window";
/// `{arch}.attention.sliding_window_pattern` (u32 period `n`: every `n`-th layer is global;
/// or a bool array, `true` = sliding-window layer).
pub const ATTENTION_SLIDING_WINDOW_PATTERN: &str = "attention.sliding_window_pattern";
/// `{arch}.attention.scale` (f32): the attention score scale, when not `1/sqrt(head_dim)`.
pub const ATTENTION_SCALE: &str = "attention.scale";
/// `{arch}.attn_logit_softcapping` (f32): `cap·tanh(score/cap)` on attention scores.
pub const ATTN_LOGIT_SOFTCAPPING: &str = "attn_logit_softcapping";
/// `{arch}.final_logit_softcapping` (f32): `cap·tanh(logit/cap)` on the output logits.
pub const FINAL_LOGIT_SOFTCAPPING: &str = "final_logit_softcapping";
/// `{arch}.rope.dimension_count` (u32).
pub const ROPE_DIMENSION_COUNT: &str = "rope.dimension_count";
/// `{arch}.rope.freq_base` (f32): rope theta.
pub const ROPE_FREQ_BASE: &str = "rope.freq_base";
/// `{arch}.rope.freq_base_swa` (f32): rope theta of the sliding-window layers.
pub const ROPE_FREQ_BASE_SWA: &str = "rope.freq_base_swa";
/// `{arch}.rope.scale_linear` (f32, legacy linear scaling).
pub const ROPE_SCALE_LINEAR: &str = "rope.scale_linear";
/// `{arch}.rope.scaling.type` (string: none, linear, yarn, longrope).
pub const ROPE_SCALING_TYPE: &str = "rope.scaling.type";
/// `{arch}.rope.scaling.factor` (f32).
pub const ROPE_SCALING_FACTOR: &str = "rope.scaling.factor";
/// `{arch}.rope.scaling.attn_factor` (f32).
pub const ROPE_SCALING_ATTN_FACTOR: &str = "rope.scaling.attn_factor";
/// `{arch}.rope.scaling.original_context_length` (u32).
pub const ROPE_SCALING_ORIG_CTX_LEN: &str = "rope.scaling.original_context_length";
/// `{arch}.rope.scaling.finetuned` (bool).
pub const ROPE_SCALING_FINETUNED: &str = "rope.scaling.finetuned";
/// `{arch}.rope.scaling.yarn_log_multiplier` (f32).
pub const ROPE_SCALING_YARN_LOG_MUL: &str = "rope.scaling.yarn_log_multiplier";

/// `tokenizer.ggml.model` (string: `gpt2`, `llama`, ...).
pub const TOKENIZER_MODEL: &str = "tokenizer.ggml.model";
/// `tokenizer.ggml.pre` (string: pre-tokenizer name, e.g. `smollm`, `llama-bpe`).
pub const TOKENIZER_PRE: &str = "tokenizer.ggml.pre";
/// `tokenizer.ggml.tokens` (array of strings).
pub const TOKENIZER_TOKENS: &str = "tokenizer.ggml.tokens";
/// `tokenizer.ggml.token_type` (array of i32).
pub const TOKENIZER_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
/// `tokenizer.ggml.scores` (array of f32).
pub const TOKENIZER_SCORES: &str = "tokenizer.ggml.scores";
/// `tokenizer.ggml.merges` (array of strings, `"a b"`).
pub const TOKENIZER_MERGES: &str = "tokenizer.ggml.merges";
/// `tokenizer.ggml.bos_token_id` (u32).
pub const TOKENIZER_BOS_ID: &str = "tokenizer.ggml.bos_token_id";
/// `tokenizer.ggml.eos_token_id` (u32).
pub const TOKENIZER_EOS_ID: &str = "tokenizer.ggml.eos_token_id";
/// `tokenizer.ggml.eot_token_id` (u32).
pub const TOKENIZER_EOT_ID: &str = "tokenizer.ggml.eot_token_id";
/// `tokenizer.ggml.eom_token_id` (u32).
pub const TOKENIZER_EOM_ID: &str = "tokenizer.ggml.eom_token_id";
/// `tokenizer.ggml.unknown_token_id` (u32).
pub const TOKENIZER_UNK_ID: &str = "tokenizer.ggml.unknown_token_id";
/// `tokenizer.ggml.seperator_token_id` (u32; the misspelling is the format's).
pub const TOKENIZER_SEP_ID: &str = "tokenizer.ggml.seperator_token_id";
/// `tokenizer.ggml.padding_token_id` (u32).
pub const TOKENIZER_PAD_ID: &str = "tokenizer.ggml.padding_token_id";
/// `tokenizer.ggml.mask_token_id` (u32).
pub const TOKENIZER_MASK_ID: &str = "tokenizer.ggml.mask_token_id";
/// `tokenizer.ggml.add_bos_token` (bool).
pub const TOKENIZER_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
/// `tokenizer.ggml.add_eos_token` (bool).
pub const TOKENIZER_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
/// `tokenizer.ggml.add_space_prefix` (bool).
pub const TOKENIZER_ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
/// `tokenizer.ggml.remove_extra_whitespaces` (bool).
pub const TOKENIZER_REMOVE_EXTRA_WS: &str = "tokenizer.ggml.remove_extra_whitespaces";
/// `tokenizer.ggml.precompiled_charsmap` (array of u8).
pub const TOKENIZER_PRECOMPILED_CHARSMAP: &str = "tokenizer.ggml.precompiled_charsmap";
/// `tokenizer.huggingface.json` (string: a whole tokenizer.json).
pub const TOKENIZER_HF_JSON: &str = "tokenizer.huggingface.json";
/// `tokenizer.chat_template` (string, Jinja).
pub const TOKENIZER_CHAT_TEMPLATE: &str = "tokenizer.chat_template";

/// Tensor names (llama.cpp's `LLM_TENSOR_*` names for the llama family).
pub mod tensors {
    /// `token_embd.weight`: `[n_embd, n_vocab]` token embeddings.
    pub const TOKEN_EMBD: &str = "token_embd.weight";
    /// `output_norm.weight`: `[n_embd]` final RMSNorm.
    pub const OUTPUT_NORM: &str = "output_norm.weight";
    /// `output.weight`: `[n_embd, n_vocab]` LM head (absent when tied to `token_embd`).
    pub const OUTPUT: &str = "output.weight";
    /// `rope_freqs.weight`: `[head_dim / 2]` llama3 rope frequency factors.
    pub const ROPE_FREQS: &str = "rope_freqs.weight";

    /// Per-block suffix: attention RMSNorm `[n_embd]`.
    pub const ATTN_NORM: &str = "attn_norm";
    /// Per-block suffix: Q projection `[n_embd, n_head * head_dim]`.
    pub const ATTN_Q: &str = "attn_q";
    /// Per-block suffix: K projection `[n_embd, n_head_kv * head_dim]`.
    pub const ATTN_K: &str = "attn_k";
    /// Per-block suffix: V projection `[n_embd, n_head_kv * head_dim]`.
    pub const ATTN_V: &str = "attn_v";
    /// Per-block suffix: attention output projection `[n_head * head_dim, n_embd]`.
    pub const ATTN_OUTPUT: &str = "attn_output";
    /// Per-block suffix: FFN RMSNorm `[n_embd]`.
    pub const FFN_NORM: &str = "ffn_norm";
    /// Per-block suffix: FFN gate `[n_embd, n_ff]`.
    pub const FFN_GATE: &str = "ffn_gate";
    /// Per-block suffix: FFN up `[n_embd, n_ff]`.
    pub const FFN_UP: &str = "ffn_up";
    /// Per-block suffix: FFN down `[n_ff, n_embd]`.
    pub const FFN_DOWN: &str = "ffn_down";
    /// Per-block suffix: fused Q/K/V projection `[n_embd, (n_head + 2·n_head_kv) * head_dim]`
    /// (Phi-3).
    pub const ATTN_QKV: &str = "attn_qkv";
    /// Per-block suffix: per-head query RMSNorm `[head_dim]` (Qwen 3, Gemma 3).
    pub const ATTN_Q_NORM: &str = "attn_q_norm";
    /// Per-block suffix: per-head key RMSNorm `[head_dim]` (Qwen 3, Gemma 3).
    pub const ATTN_K_NORM: &str = "attn_k_norm";
    /// Per-block suffix: RMSNorm of the attention output before the residual `[n_embd]`
    /// (Gemma 2/3).
    pub const ATTN_POST_NORM: &str = "post_attention_norm";
    /// Per-block suffix: RMSNorm of the FFN output before the residual `[n_embd]` (Gemma 2/3).
    pub const FFN_POST_NORM: &str = "post_ffw_norm";

    /// Weight name of a per-block tensor: `blk(3, ATTN_Q)` -> `"blk.3.attn_q.weight"`.
    pub fn blk(layer: usize, suffix: &str) -> String {
        format!("blk.{layer}.{suffix}.weight")
    }

    /// Bias name of a per-block tensor: `blk_bias(3, ATTN_Q)` -> `"blk.3.attn_q.bias"`.
    pub fn blk_bias(layer: usize, suffix: &str) -> String {
        format!("blk.{layer}.{suffix}.bias")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders() {
        assert_eq!(llm("llama", BLOCK_COUNT), "llama.block_count");
        assert_eq!(
            llm("llama", ATTENTION_HEAD_COUNT_KV),
            "llama.attention.head_count_kv"
        );
        assert_eq!(tensors::blk(3, tensors::ATTN_Q), "blk.3.attn_q.weight");
    }
}
