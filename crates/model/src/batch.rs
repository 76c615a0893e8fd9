//! Batched forward passes over a paged KV cache, the façade the server's engine uses.
//!
//! A [`PagedCache`] is the KV memory of a whole server: one backend cache of
//! `n_blocks * block_size` positions, cut into blocks that [`crate::kv_pool::BlockPool`] hands
//! to sequences. [`PagedCache::forward`] runs one step for many sequences at once (ragged:
//! prompt chunks and decode tokens mixed, each with its own positions and block table): every
//! token of the step goes through each weight once, attention runs per sequence over that
//! sequence's blocks ([`crate::backend::Backend::attention_batch`]), and the logits of each
//! sequence's last token come back where asked for.
//!
//! The result of a token does not depend on the batch around it: a greedy request gives the
//! same tokens alone, inside a batch, or over a prefix another request computed.

use crate::error::ModelError;

/// One sequence's share of a step.
#[derive(Clone, Copy, Debug)]
pub struct SeqInput<'a> {
    /// New token ids, at positions `pos0..pos0 + ids.len()`.
    pub ids: &'a [u32],
    /// Position of `ids[0]` (positions `0..pos0` are already in the cache).
    pub pos0: usize,
    /// The sequence's block table: position `p` in block `table[p / block_size]`; covers
    /// `pos0 + ids.len()` positions.
    pub table: &'a [u32],
    /// Whether to return the logits of the last of `ids`.
    pub logits: bool,
}

/// What a step hands back for one sequence that asked for output.
#[derive(Clone, Debug, PartialEq)]
pub enum StepOut {
    /// `[n_vocab]` the logits of its last token.
    Logits(Vec<f32>),
    /// The greedy pick after its last token (the argmax of those logits, NaN never winning,
    /// ties to the lowest id: [`crate::backend::host_argmax`]).
    Token(u32),
}

/// Backend-erased paged state: what a [`PagedCache`] holds.
pub(crate) trait PagedState: Send {
    fn forward(&mut self, seqs: &[SeqInput<'_>]) -> Result<Vec<Vec<f32>>, ModelError>;
    fn forward_picks(
        &mut self,
        seqs: &[SeqInput<'_>],
        greedy: &[bool],
    ) -> Result<Vec<StepOut>, ModelError>;
}

/// The KV memory of many sequences, and batched forward passes over it.
pub struct PagedCache {
    pub(crate) inner: Box<dyn PagedState>,
    pub(crate) n_blocks: usize,
    pub(crate) block_size: usize,
}

impl std::fmt::Debug for PagedCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagedCache")
            .field("n_blocks", &self.n_blocks)
            .field("block_size", &self.block_size)
            .finish()
    }
}

impl PagedCache {
    /// Runs one step: every sequence's `ids` appended at its positions. Returns the
    /// `[n_vocab]` logits of the last token of each sequence that asked for them, in order.
    pub fn forward(&mut self, seqs: &[SeqInput<'_>]) -> Result<Vec<Vec<f32>>, ModelError> {
        self.check(seqs)?;
        self.inner.forward(seqs)
    }

    /// Like [`PagedCache::forward`], but each sequence `i` that asks for output and has
    /// `greedy[i]` set gets only its greedy pick ([`StepOut::Token`]) — on a device backend
    /// its logits never leave the device —, the others their logits ([`StepOut::Logits`],
    /// only those rows read back). `greedy` has one entry per sequence.
    pub fn forward_picks(
        &mut self,
        seqs: &[SeqInput<'_>],
        greedy: &[bool],
    ) -> Result<Vec<StepOut>, ModelError> {
        if greedy.len() != seqs.len() {
            return Err(ModelError::Tensor {
                what: format!(
                    "batch: {} greedy flags for {} sequences",
                    greedy.len(),
                    seqs.len()
                ),
            });
        }
        self.check(seqs)?;
        self.inner.forward_picks(seqs, greedy)
    }

    fn check(&self, seqs: &[SeqInput<'_>]) -> Result<(), ModelError> {
        for (i, s) in seqs.iter().enumerate() {
            let end = s.pos0 + s.ids.len();
            if s.ids.is_empty() {
                return Err(ModelError::EmptyInput);
            }
            if end.div_ceil(self.block_size) > s.table.len() {
                return Err(ModelError::Tensor {
                    what: format!(
                        "batch: sequence {i} reaches position {end} with {} blocks of {}",
                        s.table.len(),
                        self.block_size
                    ),
                });
            }
            if let Some(&b) = s.table.iter().find(|&&b| b as usize >= self.n_blocks) {
                return Err(ModelError::Tensor {
                    what: format!("batch: sequence {i} names block {b} of {}", self.n_blocks),
                });
            }
        }
        Ok(())
    }

    /// Blocks in the cache.
    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }
}
