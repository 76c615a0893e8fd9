//! The decoder, generic over a [`Backend`], for every family of [`crate::family`]:
//!
//! ```text
//! embed [× scale] → ×L (RMSNorm → Q/K/V [+ bias] [→ per-head Q/K RMSNorm] → RoPE → causal GQA
//! attention over the KV cache [window] → output projection [→ RMSNorm] → residual → RMSNorm →
//! gated FFN (SwiGLU | GeGLU) [→ RMSNorm] → residual) → final RMSNorm → LM head [→ soft-cap]
//! ```
//!
//! The bracketed steps are what a [`crate::family::FamilySpec`] turns on; the weights they
//! need are optional fields of [`LayerWeights`], loaded when the family asks for them (biases:
//! when the file has them). Fused tensors (Phi-3's `attn_qkv`, `ffn_up` holding gate and up)
//! are split into row ranges at load, so backends only ever see separate matrices.
//!
//! A forward pass takes a batch of sequences ([`Decoder::forward_batch`]), ragged: prompt chunks
//! and decode tokens mixed, each sequence with its own positions and block table over one
//! paged KV cache. The rows of the activations are the concatenated tokens, so every token of
//! the step goes through each weight once; attention runs per sequence over that sequence's
//! blocks ([`Backend::attention_batch`]); the LM head runs on the last row of each sequence
//! that wants logits. A single sequence ([`Decoder::forward`]) is a batch of one over a
//! private cache whose blocks are its positions in order.

use std::sync::Arc;

use damascus_gguf::GgufFile;
use damascus_gguf::keys::tensors as names;
use damascus_kernels::reference::AttnShape;

use crate::backend::{AttnSpec, Backend, KvCacheType, KvShape, PagedBatch, RopeParams, SeqSpan};
use crate::batch::{SeqInput, StepOut};
use crate::error::ModelError;
use crate::params::DecoderParams;
use crate::tensor::FileTensor;

/// The prepared weights of one decoder layer.
pub struct LayerWeights<B: Backend> {
    /// `[n_embd]` attention RMSNorm scale.
    pub attn_norm: B::Vector,
    /// `[n_head * head_dim, n_embd]` query projection.
    pub wq: B::Matrix,
    /// `[n_head_kv * head_dim, n_embd]` key projection.
    pub wk: B::Matrix,
    /// `[n_head_kv * head_dim, n_embd]` value projection.
    pub wv: B::Matrix,
    /// `[n_head * head_dim]`, `[n_head_kv * head_dim]` ×2: Q/K/V biases (Qwen 2), if any.
    pub qkv_bias: Option<[B::Vector; 3]>,
    /// `[head_dim]` ×2: per-head Q and K RMSNorm scales (Qwen 3, Gemma 3).
    pub qk_norm: Option<[B::Vector; 2]>,
    /// `[n_embd, n_head * head_dim]` attention output projection.
    pub wo: B::Matrix,
    /// `[n_embd]` RMSNorm of the attention output before the residual (Gemma 3).
    pub attn_post_norm: Option<B::Vector>,
    /// `[n_embd]` FFN RMSNorm scale.
    pub ffn_norm: B::Vector,
    /// `[n_ff, n_embd]` FFN gate projection.
    pub w_gate: B::Matrix,
    /// `[n_ff, n_embd]` FFN up projection.
    pub w_up: B::Matrix,
    /// `[n_embd, n_ff]` FFN down projection.
    pub w_down: B::Matrix,
    /// `[n_embd]` RMSNorm of the FFN output before the residual (Gemma 3).
    pub ffn_post_norm: Option<B::Vector>,
}

/// All prepared weights of the model.
pub struct Weights<B: Backend> {
    /// `[n_vocab, n_embd]` token embeddings (also the LM head when tied).
    pub token_embd: B::Matrix,
    /// One entry per layer.
    pub layers: Vec<LayerWeights<B>>,
    /// `[n_embd]` final RMSNorm scale.
    pub output_norm: B::Vector,
    /// `[n_vocab, n_embd]` LM head; `None` when tied to `token_embd`.
    pub output: Option<B::Matrix>,
}

/// One hidden state handed to a [`Decoder::forward`] hook.
#[derive(Debug)]
pub struct Hidden<'h> {
    /// 0 = token embeddings, `i` in `1..=n_layer` = output of layer `i - 1` (residual stream),
    /// `n_layer + 1` = output of the final RMSNorm.
    pub slot: usize,
    /// Rows in `data`.
    pub n_tokens: usize,
    /// `[n_tokens, n_embd]` f32.
    pub data: &'h [f32],
}

/// A hook observing every hidden state of a forward pass (used by `verify`).
pub type HiddenHook<'a> = &'a mut dyn FnMut(&Hidden<'_>);

/// A decoder: hyper-parameters, prepared weights and the backend that runs them.
pub struct Decoder<B: Backend> {
    backend: B,
    params: DecoderParams,
    /// RoPE of every layer (the global layers' when the sliding-window ones differ).
    rope: RopeParams,
    /// RoPE of the sliding-window layers, when it differs from `rope` (Gemma 3: θ = 10k).
    rope_swa: Option<RopeParams>,
    weights: Weights<B>,
}

/// Blocks of a single sequence's private cache (its positions in order).
const SINGLE_BLOCK: usize = 16;

/// Activation buffers for one forward pass of `n_tokens` tokens, `n_out` of them wanting
/// logits. Kept across passes: a pass that fits resizes them in place ([`Backend::set_rows`]),
/// so steady serving allocates nothing per step and the buffers keep their addresses (a CUDA
/// graph captured for one batch size replays on every later step of that size).
struct Scratch<B: Backend> {
    n_tokens: usize,
    n_out: usize,
    /// Rows every token-sized buffer can hold (the most tokens of any pass so far).
    cap_tokens: usize,
    /// Rows `last` and `logits` can hold.
    cap_out: usize,
    x: B::Act,      // [n_tokens, n_embd] residual stream
    xn: B::Act,     // [n_tokens, n_embd] normed input of a sub-block
    q: B::Act,      // [n_tokens, n_head * head_dim]
    k: B::Act,      // [n_tokens, n_head_kv * head_dim]
    v: B::Act,      // [n_tokens, n_head_kv * head_dim]
    attn: B::Act,   // [n_tokens, n_head * head_dim] attention output
    proj: B::Act,   // [n_tokens, n_embd] output of attn_output / ffn_down
    gate: B::Act,   // [n_tokens, n_ff]
    up: B::Act,     // [n_tokens, n_ff]
    last: B::Act,   // [n_out, n_embd] final-normed rows that want logits
    logits: B::Act, // [n_out, n_vocab]
    /// `[n_sel, n_vocab]` the rows of `logits` read back when only some rows of a pass want
    /// their logits (the others take their argmax on the backend), with `n_sel`.
    sel: Option<(usize, B::Act)>,
}

/// Per-sequence state: the KV cache, the number of positions already in it, and reusable
/// activation buffers.
pub struct DecoderState<B: Backend> {
    kv: PagedKv<B>,
    /// `[n_blocks]` the identity block table of the private cache.
    table: Vec<u32>,
    n_ctx: usize,
    n_past: usize,
}

/// The KV memory of batched passes: one backend cache of `n_blocks * block_size` positions
/// in blocks, and reusable activation buffers.
pub struct PagedKv<B: Backend> {
    kv: B::KvCache,
    n_blocks: usize,
    block_size: usize,
    scratch: Option<Scratch<B>>,
}

impl<B: Backend> PagedKv<B> {
    /// Blocks of the cache.
    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }
}

impl<B: Backend> DecoderState<B> {
    /// Positions held in the KV cache.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Capacity of the KV cache in positions.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Forgets every position from `n` on (the cache contents beyond are simply overwritten
    /// later). `n` larger than [`DecoderState::n_past`] is clamped.
    pub fn truncate(&mut self, n: usize) {
        self.n_past = self.n_past.min(n);
    }
}

/// The tensor `name`, if the file has it.
fn find(file: &Arc<GgufFile>, name: &str) -> Option<Result<FileTensor, ModelError>> {
    file.tensor(name).map(|_| FileTensor::new(file, name))
}

impl<B: Backend> Decoder<B> {
    /// Prepares every weight of `file` on `backend`.
    pub fn load(
        backend: B,
        file: &Arc<GgufFile>,
        params: DecoderParams,
    ) -> Result<Self, ModelError> {
        let tensor = |name: &str| FileTensor::new(file, name);
        let matrix = |t: FileTensor| backend.prepare_matrix(&t);
        let vector = |name: &str| backend.prepare_vector(&tensor(name)?);
        let opt_vector = |name: &str| {
            find(file, name)
                .map(|t| backend.prepare_vector(&t?))
                .transpose()
        };
        let p = &params;
        let (q_rows, kv_rows) = (p.n_head * p.head_dim, p.n_head_kv * p.head_dim);
        let mut layers = Vec::with_capacity(p.n_layer);
        for l in 0..p.n_layer {
            let blk = |suffix: &str| names::blk(l, suffix);
            let (wq, wk, wv) = if p.fused_qkv {
                // Phi-3: rows [Q; K; V] of one tensor.
                let qkv = tensor(&blk(names::ATTN_QKV))?;
                (
                    matrix(qkv.slice_rows(0..q_rows)?)?,
                    matrix(qkv.slice_rows(q_rows..q_rows + kv_rows)?)?,
                    matrix(qkv.slice_rows(q_rows + kv_rows..q_rows + 2 * kv_rows)?)?,
                )
            } else {
                (
                    matrix(tensor(&blk(names::ATTN_Q))?)?,
                    matrix(tensor(&blk(names::ATTN_K))?)?,
                    matrix(tensor(&blk(names::ATTN_V))?)?,
                )
            };
            let bias = |suffix: &str| opt_vector(&names::blk_bias(l, suffix));
            let qkv_bias = match (
                bias(names::ATTN_Q)?,
                bias(names::ATTN_K)?,
                bias(names::ATTN_V)?,
            ) {
                (Some(bq), Some(bk), Some(bv)) => Some([bq, bk, bv]),
                (None, None, None) => None,
                _ => {
                    return Err(ModelError::MissingTensor {
                        name: format!(
                            "{} (the layer has only some of the Q/K/V biases)",
                            names::blk_bias(l, "attn_{q,k,v}")
                        ),
                    });
                }
            };
            let (w_gate, w_up) = if p.spec.fused_gate_up {
                // Phi-3: rows [gate; up] of `ffn_up`.
                let up = tensor(&blk(names::FFN_UP))?;
                (
                    matrix(up.slice_rows(0..p.n_ff)?)?,
                    matrix(up.slice_rows(p.n_ff..2 * p.n_ff)?)?,
                )
            } else {
                (
                    matrix(tensor(&blk(names::FFN_GATE))?)?,
                    matrix(tensor(&blk(names::FFN_UP))?)?,
                )
            };
            let norm = |want: bool, suffix: &str| want.then(|| vector(&blk(suffix))).transpose();
            let qk_norm = match (
                norm(p.spec.qk_norm, names::ATTN_Q_NORM)?,
                norm(p.spec.qk_norm, names::ATTN_K_NORM)?,
            ) {
                (Some(q), Some(k)) => Some([q, k]),
                _ => None,
            };
            layers.push(LayerWeights {
                attn_norm: vector(&blk(names::ATTN_NORM))?,
                wq,
                wk,
                wv,
                qkv_bias,
                qk_norm,
                wo: matrix(tensor(&blk(names::ATTN_OUTPUT))?)?,
                attn_post_norm: norm(p.spec.post_norms, names::ATTN_POST_NORM)?,
                ffn_norm: vector(&blk(names::FFN_NORM))?,
                w_gate,
                w_up,
                w_down: matrix(tensor(&blk(names::FFN_DOWN))?)?,
                ffn_post_norm: norm(p.spec.post_norms, names::FFN_POST_NORM)?,
            });
        }
        let output = match find(file, names::OUTPUT) {
            Some(t) => Some(backend.prepare_matrix(&t?)?),
            None => None,
        };
        let weights = Weights {
            token_embd: matrix(tensor(names::TOKEN_EMBD)?)?,
            layers,
            output_norm: vector(names::OUTPUT_NORM)?,
            output,
        };
        let freq_factors = match find(file, names::ROPE_FREQS) {
            Some(t) => Some(t?.view()?.to_f32_vec()?),
            None => None,
        };
        let rope = params.rope_params(freq_factors.as_deref())?;
        let rope_swa = params.rope_params_swa();
        Ok(Self {
            backend,
            params,
            rope,
            rope_swa,
            weights,
        })
    }

    /// The backend running this decoder.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The hyper-parameters.
    pub fn params(&self) -> &DecoderParams {
        &self.params
    }

    /// A fresh sequence with a KV cache for `n_ctx` positions of the backend's default type.
    pub fn new_state(&self, n_ctx: usize) -> Result<DecoderState<B>, ModelError> {
        self.new_state_with(n_ctx, None)
    }

    /// A fresh sequence with a KV cache for `n_ctx` positions of `cache_type` (`None`: the
    /// backend's default, [`Backend::default_cache_type`]).
    pub fn new_state_with(
        &self,
        n_ctx: usize,
        cache_type: Option<KvCacheType>,
    ) -> Result<DecoderState<B>, ModelError> {
        let n_blocks = n_ctx.div_ceil(SINGLE_BLOCK);
        let kv = self.new_paged_kv(n_blocks, SINGLE_BLOCK, cache_type)?;
        let table = (0..n_blocks as u32).collect();
        Ok(DecoderState {
            kv,
            table,
            n_ctx,
            n_past: 0,
        })
    }

    /// A KV cache of `n_blocks` blocks of `block_size` positions for batched passes
    /// ([`Decoder::forward_batch`]) of `cache_type` (`None`: the backend's default).
    pub fn new_paged_kv(
        &self,
        n_blocks: usize,
        block_size: usize,
        cache_type: Option<KvCacheType>,
    ) -> Result<PagedKv<B>, ModelError> {
        let p = &self.params;
        let kv = self.backend.new_kv_cache(KvShape {
            n_layer: p.n_layer,
            n_ctx: n_blocks * block_size,
            n_head_kv: p.n_head_kv,
            head_dim: p.head_dim,
            cache_type: cache_type.unwrap_or_else(|| self.backend.default_cache_type()),
        })?;
        Ok(PagedKv {
            kv,
            n_blocks,
            block_size,
            scratch: None,
        })
    }

    /// Buffers for a pass of `n_tokens` tokens and `n_out` output rows: `old` resized in place
    /// when it can hold them, else new ones sized for the larger of the two passes (so the
    /// set grows to the largest pass seen and then stays).
    fn scratch_for(
        &self,
        old: Option<Scratch<B>>,
        n_tokens: usize,
        n_out: usize,
    ) -> Result<Scratch<B>, ModelError> {
        let (cap_tokens, cap_out) = match old {
            Some(mut s) => {
                if n_tokens <= s.cap_tokens
                    && n_out <= s.cap_out
                    && self.resize(&mut s, n_tokens, n_out)?
                {
                    return Ok(s);
                }
                (s.cap_tokens.max(n_tokens), s.cap_out.max(n_out))
                // `s` is dropped here, before the larger set is allocated.
            }
            None => (n_tokens, n_out),
        };
        let mut s = self.scratch(cap_tokens, cap_out)?;
        if (cap_tokens, cap_out) != (n_tokens, n_out) && !self.resize(&mut s, n_tokens, n_out)? {
            // A backend that cannot resize: exactly this pass's size.
            s = self.scratch(n_tokens, n_out)?;
        }
        Ok(s)
    }

    /// Sets every buffer of `s` to `n_tokens` (`n_out`) rows in place; false when the backend
    /// cannot ([`Backend::set_rows`]).
    fn resize(
        &self,
        s: &mut Scratch<B>,
        n_tokens: usize,
        n_out: usize,
    ) -> Result<bool, ModelError> {
        if (s.n_tokens, s.n_out) == (n_tokens, n_out) {
            return Ok(true);
        }
        let b = &self.backend;
        for x in [
            &mut s.x,
            &mut s.xn,
            &mut s.q,
            &mut s.k,
            &mut s.v,
            &mut s.attn,
            &mut s.proj,
            &mut s.gate,
            &mut s.up,
        ] {
            if !b.set_rows(x, n_tokens)? {
                return Ok(false);
            }
        }
        for x in [&mut s.last, &mut s.logits] {
            if !b.set_rows(x, n_out)? {
                return Ok(false);
            }
        }
        s.n_tokens = n_tokens;
        s.n_out = n_out;
        Ok(true)
    }

    fn scratch(&self, n_tokens: usize, n_out: usize) -> Result<Scratch<B>, ModelError> {
        let p = &self.params;
        let b = &self.backend;
        Ok(Scratch {
            n_tokens,
            n_out,
            cap_tokens: n_tokens,
            cap_out: n_out,
            x: b.alloc(n_tokens, p.n_embd)?,
            xn: b.alloc(n_tokens, p.n_embd)?,
            q: b.alloc(n_tokens, p.n_head * p.head_dim)?,
            k: b.alloc(n_tokens, p.n_head_kv * p.head_dim)?,
            v: b.alloc(n_tokens, p.n_head_kv * p.head_dim)?,
            attn: b.alloc(n_tokens, p.n_head * p.head_dim)?,
            proj: b.alloc(n_tokens, p.n_embd)?,
            gate: b.alloc(n_tokens, p.n_ff)?,
            up: b.alloc(n_tokens, p.n_ff)?,
            last: b.alloc(n_out, p.n_embd)?,
            logits: b.alloc(n_out, p.n_vocab)?,
            sel: None,
        })
    }

    /// Runs `ids` at positions `n_past..n_past + ids.len()`, appending them to the KV cache,
    /// and returns the `[n_vocab]` logits of the last one. `hook` sees every hidden state.
    pub fn forward(
        &self,
        state: &mut DecoderState<B>,
        ids: &[u32],
        hook: Option<HiddenHook<'_>>,
    ) -> Result<Vec<f32>, ModelError> {
        match self
            .forward_as(state, ids, hook, Want::Logits, Rows::Last)?
            .pop()
        {
            Some(StepOut::Logits(l)) => Ok(l),
            _ => unreachable!("asked for the logits of one row"),
        }
    }

    /// Like [`Decoder::forward`], returning only the greedy pick of the last position
    /// ([`Backend::argmax`]: on a device backend the logits never leave it).
    pub fn forward_argmax(
        &self,
        state: &mut DecoderState<B>,
        ids: &[u32],
    ) -> Result<u32, ModelError> {
        match self
            .forward_as(state, ids, None, Want::Argmax, Rows::Last)?
            .pop()
        {
            Some(StepOut::Token(t)) => Ok(t),
            _ => unreachable!("asked for the argmax of one row"),
        }
    }

    /// Like [`Decoder::forward`], returning the `[n_vocab]` logits of every one of `ids`
    /// (row `i`: the prediction after `ids[i]`), as a speculative verify pass needs. Each row
    /// goes through the same kernels as in a pass of its own where the backend is
    /// row-invariant ([`Backend::supports_batches`]).
    pub fn forward_all(
        &self,
        state: &mut DecoderState<B>,
        ids: &[u32],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        self.forward_as(state, ids, None, Want::Logits, Rows::All)?
            .into_iter()
            .map(|o| match o {
                StepOut::Logits(l) => Ok(l),
                StepOut::Token(_) => unreachable!("asked for logits"),
            })
            .collect()
    }

    /// Like [`Decoder::forward_all`], returning the greedy pick after every one of `ids`.
    pub fn forward_all_argmax(
        &self,
        state: &mut DecoderState<B>,
        ids: &[u32],
    ) -> Result<Vec<u32>, ModelError> {
        self.forward_as(state, ids, None, Want::Argmax, Rows::All)?
            .into_iter()
            .map(|o| match o {
                StepOut::Token(t) => Ok(t),
                StepOut::Logits(_) => unreachable!("asked for the argmax"),
            })
            .collect()
    }

    fn forward_as(
        &self,
        state: &mut DecoderState<B>,
        ids: &[u32],
        mut hook: Option<HiddenHook<'_>>,
        want: Want,
        rows: Rows,
    ) -> Result<Vec<StepOut>, ModelError> {
        let n_tokens = ids.len();
        if n_tokens == 0 {
            return Err(ModelError::EmptyInput);
        }
        let pos0 = state.n_past;
        if pos0 + n_tokens > state.n_ctx {
            return Err(ModelError::ContextFull {
                n_ctx: state.n_ctx,
                n_past: pos0,
                n_tokens,
            });
        }
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.params.n_vocab) {
            return Err(ModelError::TokenOutOfRange {
                id,
                n_vocab: self.params.n_vocab,
            });
        }
        let seq = [SeqInput {
            ids,
            pos0,
            table: &state.table,
            logits: true,
        }];
        let out = self.forward_paged(&mut state.kv, &seq, &mut hook, want, rows)?;
        state.n_past += n_tokens;
        Ok(out)
    }

    /// One step of many sequences over `kv`: each sequence's `ids` appended at its positions
    /// through its block table. Returns the `[n_vocab]` logits of the last token of every
    /// sequence that asks for them, in order. The caller owns the block tables
    /// ([`crate::kv_pool::BlockPool`]); positions must fit them.
    pub fn forward_batch(
        &self,
        kv: &mut PagedKv<B>,
        seqs: &[SeqInput<'_>],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        self.forward_paged(kv, seqs, &mut None, Want::Logits, Rows::Last)?
            .into_iter()
            .map(|o| match o {
                StepOut::Logits(l) => Ok(l),
                StepOut::Token(_) => unreachable!("asked for logits"),
            })
            .collect()
    }

    /// Like [`Decoder::forward_batch`], but a sequence with `greedy[i]` set gets only its
    /// greedy pick ([`StepOut::Token`], computed by [`Backend::argmax`]: on a device backend
    /// its logits never leave it) and the others their logits ([`StepOut::Logits`]; only
    /// those rows are read back). A missing `greedy[i]` counts as false.
    pub fn forward_batch_picks(
        &self,
        kv: &mut PagedKv<B>,
        seqs: &[SeqInput<'_>],
        greedy: &[bool],
    ) -> Result<Vec<StepOut>, ModelError> {
        self.forward_paged(kv, seqs, &mut None, Want::PerSeq(greedy), Rows::Last)
    }

    fn forward_paged(
        &self,
        kv: &mut PagedKv<B>,
        seqs: &[SeqInput<'_>],
        hook: &mut Option<HiddenHook<'_>>,
        want: Want,
        rows_out: Rows,
    ) -> Result<Vec<StepOut>, ModelError> {
        let n_vocab = self.params.n_vocab;
        let mut ids = Vec::new(); // [n_tokens] the step's tokens, sequence after sequence
        let mut spans = Vec::with_capacity(seqs.len());
        let mut out_rows = Vec::new(); // rows whose logits are wanted
        let mut picks = Vec::new(); // [out_rows.len()] the row wants only its argmax
        for (i, s) in seqs.iter().enumerate() {
            if s.ids.is_empty() {
                return Err(ModelError::EmptyInput);
            }
            if let Some(&id) = s.ids.iter().find(|&&id| id as usize >= n_vocab) {
                return Err(ModelError::TokenOutOfRange { id, n_vocab });
            }
            let end = s.pos0 + s.ids.len();
            if end.div_ceil(kv.block_size) > s.table.len()
                || s.table.iter().any(|&b| b as usize >= kv.n_blocks)
            {
                return Err(ModelError::ContextFull {
                    n_ctx: s.table.len().min(kv.n_blocks) * kv.block_size,
                    n_past: s.pos0,
                    n_tokens: s.ids.len(),
                });
            }
            let rows = ids.len()..ids.len() + s.ids.len();
            ids.extend_from_slice(s.ids);
            if s.logits {
                match rows_out {
                    Rows::Last => out_rows.push(rows.end - 1),
                    Rows::All => out_rows.extend(rows.clone()),
                }
                let pick = match want {
                    Want::Logits => false,
                    Want::Argmax => true,
                    Want::PerSeq(greedy) => greedy.get(i).copied().unwrap_or(false),
                };
                picks.resize(out_rows.len(), pick);
            }
            spans.push(SeqSpan {
                rows,
                pos0: s.pos0,
                table: s.table,
            });
        }
        if ids.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        if out_rows.is_empty() {
            // Prompt chunks only: the LM head still runs on one row (discarded; its argmax
            // is the cheapest thing to hand back).
            out_rows.push(ids.len() - 1);
            picks.push(true);
        }
        let n_out = out_rows.len();
        let mut s = self.scratch_for(kv.scratch.take(), ids.len(), n_out)?;
        let batch = PagedBatch {
            block_size: kv.block_size,
            seqs: &spans,
        };
        let result = self.run(&mut s, &mut kv.kv, &batch, &ids, &out_rows, hook);
        let out = result.and_then(|()| self.outputs(&mut s, &picks));
        kv.scratch = Some(s);
        let mut out: Vec<StepOut> = out?;
        let wanted: usize = match rows_out {
            Rows::Last => seqs.iter().filter(|s| s.logits).count(),
            Rows::All => seqs.iter().filter(|s| s.logits).map(|s| s.ids.len()).sum(),
        };
        out.truncate(wanted);
        Ok(out)
    }

    /// What the output rows of a finished pass hand back: the argmax of the rows that want
    /// only that ([`Backend::argmax`]: one id per row leaves a device), the logits of the
    /// others (only those rows are read back).
    fn outputs(&self, s: &mut Scratch<B>, picks: &[bool]) -> Result<Vec<StepOut>, ModelError> {
        let b = &self.backend;
        let n_vocab = self.params.n_vocab;
        let n_pick = picks.iter().filter(|&&p| p).count();
        if n_pick == 0 {
            let all = b.read(&s.logits)?;
            return Ok(all
                .chunks_exact(n_vocab)
                .map(|r| StepOut::Logits(r.to_vec()))
                .collect());
        }
        let ids = b.argmax(&s.logits, n_vocab)?;
        if n_pick == picks.len() {
            return Ok(ids.into_iter().map(StepOut::Token).collect());
        }
        // Mixed: gather the rows that want logits into `sel` and read only those.
        let rows: Vec<usize> = (0..picks.len()).filter(|&r| !picks[r]).collect();
        let mut sel = match s.sel.take() {
            Some((n, a)) if n == rows.len() => a,
            Some((_, mut a)) => match b.set_rows(&mut a, rows.len())? {
                true => a,
                false => b.alloc(rows.len(), n_vocab)?,
            },
            None => b.alloc(rows.len(), n_vocab)?,
        };
        let read = b
            .copy_rows(&s.logits, &rows, &mut sel)
            .and_then(|()| b.read(&sel));
        s.sel = Some((rows.len(), sel));
        let read = read?;
        let mut logits = read.chunks_exact(n_vocab);
        Ok(picks
            .iter()
            .zip(ids)
            .map(|(&pick, id)| match pick {
                true => StepOut::Token(id),
                false => StepOut::Logits(logits.next().map(<[f32]>::to_vec).unwrap_or_default()),
            })
            .collect())
    }

    fn run(
        &self,
        s: &mut Scratch<B>,
        kv: &mut B::KvCache,
        batch: &PagedBatch<'_>,
        ids: &[u32],
        out_rows: &[usize],
        hook: &mut Option<HiddenHook<'_>>,
    ) -> Result<(), ModelError> {
        let b = &self.backend;
        let p = &self.params;
        let w = &self.weights;
        let n_tokens = ids.len();
        let attn_shape = AttnShape {
            n_head: p.n_head,
            n_head_kv: p.n_head_kv,
            head_dim: p.head_dim,
        };
        // The attention kernels scale scores by 1/√head_dim; a family that wants another
        // scale has Q pre-multiplied by the ratio.
        let q_scale = p.attn_scale.map(|a| a * (p.head_dim as f32).sqrt());
        let mut emit = |slot: usize, act: &B::Act| -> Result<(), ModelError> {
            if let Some(h) = hook.as_mut() {
                let data = b.read(act)?;
                h(&Hidden {
                    slot,
                    n_tokens,
                    data: &data,
                });
            }
            Ok(())
        };

        let pos0 = batch.seqs.first().map_or(0, |s| s.pos0);
        b.begin_forward(n_tokens, pos0)?;
        // end_forward runs even when an op fails: a backend may hold the device from
        // begin_forward to end_forward.
        let body = (|| -> Result<(), ModelError> {
            b.embed(&w.token_embd, ids, &mut s.x)?;
            if let Some(scale) = p.embed_scale {
                b.scale(&mut s.x, scale)?;
            }
            emit(0, &s.x)?;
            for (l, lw) in w.layers.iter().enumerate() {
                // Attention block.
                b.rms_norm(&s.x, &lw.attn_norm, p.rms_eps, &mut s.xn)?;
                b.qkv(&s.xn, &lw.wq, &lw.wk, &lw.wv, &mut s.q, &mut s.k, &mut s.v)?;
                if let Some([bq, bk, bv]) = &lw.qkv_bias {
                    b.add_bias(&mut s.q, bq)?;
                    b.add_bias(&mut s.k, bk)?;
                    b.add_bias(&mut s.v, bv)?;
                }
                if let Some([qn, kn]) = &lw.qk_norm {
                    b.rms_norm_heads(&mut s.q, qn, p.rms_eps, p.head_dim)?;
                    b.rms_norm_heads(&mut s.k, kn, p.rms_eps, p.head_dim)?;
                }
                if let Some(q_scale) = q_scale {
                    b.scale(&mut s.q, q_scale)?;
                }
                let window = p.windows[l];
                let rope = match (&self.rope_swa, window) {
                    (Some(r), Some(_)) => r,
                    _ => &self.rope,
                };
                let attn = AttnSpec {
                    shape: attn_shape,
                    window,
                };
                b.attention_batch(
                    kv,
                    l,
                    attn,
                    rope,
                    batch,
                    &mut s.q,
                    &mut s.k,
                    &s.v,
                    &mut s.attn,
                )?;
                let post = lw.attn_post_norm.as_ref();
                s.residual(b, p.rms_eps, &lw.wo, ResidualInput::Attn, post)?;
                // Feed-forward block.
                b.rms_norm(&s.x, &lw.ffn_norm, p.rms_eps, &mut s.xn)?;
                let act = p.spec.activation;
                b.ffn_gate_up(&s.xn, &lw.w_gate, &lw.w_up, act, &mut s.gate, &mut s.up)?;
                let post = lw.ffn_post_norm.as_ref();
                s.residual(b, p.rms_eps, &lw.w_down, ResidualInput::Gate, post)?;
                emit(l + 1, &s.x)?;
            }
            b.rms_norm(&s.x, &w.output_norm, p.rms_eps, &mut s.xn)?;
            emit(p.n_layer + 1, &s.xn)?;
            // LM head on the rows that want logits only.
            b.copy_rows(&s.xn, out_rows, &mut s.last)?;
            let head = w.output.as_ref().unwrap_or(&w.token_embd);
            b.matmul(head, &s.last, &mut s.logits)?;
            if let Some(cap) = p.final_logit_softcap {
                b.softcap(&mut s.logits, cap)?;
            }
            Ok(())
        })();
        let ended = b.end_forward();
        body?;
        ended
    }
}

/// Which activation feeds a residual projection.
#[derive(Clone, Copy)]
enum ResidualInput {
    /// The attention output (into `attn_output`).
    Attn,
    /// The gated FFN activation (into `ffn_down`).
    Gate,
}

impl<B: Backend> Scratch<B> {
    /// `x += post_norm(W · input)`: an output projection and its residual add, the product
    /// RMS-normed first where the family has a post-norm (product in `proj`, norm in `xn`).
    fn residual(
        &mut self,
        b: &B,
        eps: f32,
        w: &B::Matrix,
        input: ResidualInput,
        post_norm: Option<&B::Vector>,
    ) -> Result<(), ModelError> {
        let input = match input {
            ResidualInput::Attn => &self.attn,
            ResidualInput::Gate => &self.gate,
        };
        match post_norm {
            None => b.matmul_add(w, input, &mut self.x, &mut self.proj),
            Some(norm) => {
                b.matmul(w, input, &mut self.proj)?;
                b.rms_norm(&self.proj, norm, eps, &mut self.xn)?;
                b.add(&mut self.x, &self.xn)
            }
        }
    }
}

/// What a forward pass hands back.
#[derive(Clone, Copy)]
enum Want<'a> {
    Logits,
    Argmax,
    /// Per sequence: its argmax when true, else its logits.
    PerSeq(&'a [bool]),
}

/// Which rows of a sequence that wants logits get them.
#[derive(Clone, Copy)]
enum Rows {
    /// The last row only (prompts, decode steps).
    Last,
    /// Every row (a speculative verify pass).
    All,
}
