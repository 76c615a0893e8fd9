//! Layer split across two backends (`--ngl N`): the last `N` decoder layers on backend `B`
//! (the GPU), everything else — token embeddings, the first layers, the final norm and the LM
//! head — on backend `A` (the CPU), as llama.cpp's `-ngl` does for models larger than VRAM.
//!
//! Weights go to a side at load by their tensor name (`blk.{i}.…` is layer `i`). Every op runs
//! on the side of its weight (matmuls, norms, embeddings) or its layer (attention); an
//! activation keeps one buffer per side plus which of them hold its current contents, and is
//! copied through the host ([`Backend::read`] / [`Backend::write`]) only when an op needs it on
//! the other side — in practice twice per forward pass, at the split and before the LM head.
//! Runs of ops on one side call that backend's fused ops ([`Backend::qkv`],
//! [`Backend::rope_attention`], …), so the GPU part keeps its fused kernels. Each side's KV cache
//! holds only its own layers.
//!
//! Generic over both sides, so the logic is tested on any machine with two CPU backends.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::backend::{AttnSpec, Backend, KvCacheType, KvShape, PagedBatch, RopeParams};
use crate::error::ModelError;
use crate::family::Activation;
use crate::tensor::FileTensor;

/// Which side a weight, an op or a copy belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The first backend (embeddings, leading layers, LM head).
    A,
    /// The second backend (the last `n_b_layers` layers).
    B,
}

const VALID_A: u8 = 1;
const VALID_B: u8 = 2;

/// Two backends splitting one model by layer.
pub struct Split<A: Backend, B: Backend> {
    a: A,
    b: B,
    /// First layer on `B` (`n_layer - n_b_layers`).
    first_b: usize,
    name: &'static str,
}

/// A weight on one side.
pub enum SplitMatrix<A: Backend, B: Backend> {
    /// On `A`.
    A(A::Matrix),
    /// On `B`.
    B(B::Matrix),
}

/// A norm weight on one side.
pub enum SplitVector<A: Backend, B: Backend> {
    /// On `A`.
    A(A::Vector),
    /// On `B`.
    B(B::Vector),
}

/// An activation `[n_tokens, width]` with a buffer on each side; `valid` says which hold the
/// current contents (an op writing on one side invalidates the other).
pub struct SplitAct<A: Backend, B: Backend> {
    a: Mutex<A::Act>,
    b: Mutex<B::Act>,
    valid: AtomicU8,
}

/// The KV cache: side A holds layers `0..first_b`, side B `first_b..n_layer` (either may hold
/// none).
pub struct SplitKv<A: Backend, B: Backend> {
    a: Option<A::KvCache>,
    b: Option<B::KvCache>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn own<T>(m: &mut Mutex<T>) -> &mut T {
    m.get_mut().unwrap_or_else(|p| p.into_inner())
}

/// The layer a tensor name belongs to (`blk.{i}.…`).
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

impl<A: Backend, B: Backend> Split<A, B> {
    /// `a` and `b` splitting a model of `n_layer` layers, the last `n_b_layers` on `b`
    /// (clamped to `n_layer`).
    pub fn new(a: A, b: B, n_layer: usize, n_b_layers: usize) -> Self {
        let n_b = n_b_layers.min(n_layer);
        // One short string per loaded model, for `Backend::name`'s `&'static str`.
        let name: &'static str = Box::leak(
            format!("{}+{} ({n_b}/{n_layer} layers)", a.name(), b.name()).into_boxed_str(),
        );
        Split {
            a,
            b,
            first_b: n_layer - n_b,
            name,
        }
    }

    /// The side that runs layer `layer`.
    pub fn side_of_layer(&self, layer: usize) -> Side {
        if layer >= self.first_b {
            Side::B
        } else {
            Side::A
        }
    }

    /// Makes `x` current on `side`, copying from the other side if needed.
    fn ensure(&self, x: &SplitAct<A, B>, side: Side) -> Result<(), ModelError> {
        let v = x.valid.load(Ordering::Acquire);
        let (want, other) = match side {
            Side::A => (VALID_A, VALID_B),
            Side::B => (VALID_B, VALID_A),
        };
        if v & want != 0 {
            return Ok(());
        }
        if v & other == 0 {
            // Never written: nothing to copy (the op overwrites it or reads garbage either way).
            return Ok(());
        }
        match side {
            Side::A => {
                let data = self.b.read(&lock(&x.b))?;
                self.a.write(&mut lock(&x.a), &data)?;
            }
            Side::B => {
                let data = self.a.read(&lock(&x.a))?;
                self.b.write(&mut lock(&x.b), &data)?;
            }
        }
        x.valid.fetch_or(want, Ordering::AcqRel);
        Ok(())
    }

    /// Marks `x` written on `side` (the other copy is stale).
    fn wrote(x: &SplitAct<A, B>, side: Side) {
        let v = if side == Side::A { VALID_A } else { VALID_B };
        x.valid.store(v, Ordering::Release);
    }

    /// The side holding `x`'s current contents (A when both or neither).
    fn side_of_act(x: &SplitAct<A, B>) -> Side {
        if x.valid.load(Ordering::Acquire) == VALID_B {
            Side::B
        } else {
            Side::A
        }
    }

    fn matrix_side(w: &SplitMatrix<A, B>) -> Side {
        match w {
            SplitMatrix::A(_) => Side::A,
            SplitMatrix::B(_) => Side::B,
        }
    }

    fn vector_side(v: &SplitVector<A, B>) -> Side {
        match v {
            SplitVector::A(_) => Side::A,
            SplitVector::B(_) => Side::B,
        }
    }

    fn mismatch(what: &str) -> ModelError {
        ModelError::Tensor {
            what: format!("split backend: {what} are on different sides"),
        }
    }
}

impl<A: Backend, B: Backend> Backend for Split<A, B> {
    type Act = SplitAct<A, B>;
    type Matrix = SplitMatrix<A, B>;
    type Vector = SplitVector<A, B>;
    type KvCache = SplitKv<A, B>;

    fn name(&self) -> &'static str {
        self.name
    }

    fn load_note(&self) -> Option<String> {
        match (self.a.load_note(), self.b.load_note()) {
            (Some(a), Some(b)) => Some(format!("{a}; {b}")),
            (a, b) => a.or(b),
        }
    }

    fn prepare_matrix(&self, w: &FileTensor) -> Result<Self::Matrix, ModelError> {
        Ok(match layer_of(w.name()).map(|l| self.side_of_layer(l)) {
            Some(Side::B) => SplitMatrix::B(self.b.prepare_matrix(w)?),
            _ => SplitMatrix::A(self.a.prepare_matrix(w)?),
        })
    }

    fn prepare_vector(&self, w: &FileTensor) -> Result<Self::Vector, ModelError> {
        Ok(match layer_of(w.name()).map(|l| self.side_of_layer(l)) {
            Some(Side::B) => SplitVector::B(self.b.prepare_vector(w)?),
            _ => SplitVector::A(self.a.prepare_vector(w)?),
        })
    }

    fn alloc(&self, n_tokens: usize, width: usize) -> Result<Self::Act, ModelError> {
        Ok(SplitAct {
            a: Mutex::new(self.a.alloc(n_tokens, width)?),
            b: Mutex::new(self.b.alloc(n_tokens, width)?),
            valid: AtomicU8::new(0),
        })
    }

    fn set_rows(&self, x: &mut Self::Act, n_tokens: usize) -> Result<bool, ModelError> {
        // Both sides or neither: a side left at the old size would mismatch its next op.
        let ok = self.a.set_rows(own(&mut x.a), n_tokens)?
            && self.b.set_rows(own(&mut x.b), n_tokens)?;
        x.valid.store(0, Ordering::Release);
        Ok(ok)
    }

    fn new_kv_cache(&self, shape: KvShape) -> Result<Self::KvCache, ModelError> {
        let first_b = self.first_b.min(shape.n_layer);
        let n_b = shape.n_layer - first_b;
        Ok(SplitKv {
            a: (first_b > 0)
                .then(|| {
                    self.a.new_kv_cache(KvShape {
                        n_layer: first_b,
                        ..shape
                    })
                })
                .transpose()?,
            b: (n_b > 0)
                .then(|| {
                    self.b.new_kv_cache(KvShape {
                        n_layer: n_b,
                        ..shape
                    })
                })
                .transpose()?,
        })
    }

    fn default_cache_type(&self) -> KvCacheType {
        self.b.default_cache_type()
    }

    fn begin_forward(&self, n_tokens: usize, pos0: usize) -> Result<(), ModelError> {
        self.a.begin_forward(n_tokens, pos0)?;
        if let Err(e) = self.b.begin_forward(n_tokens, pos0) {
            // Each begun side is ended, whatever happens.
            let _ = self.a.end_forward();
            return Err(e);
        }
        Ok(())
    }

    fn end_forward(&self) -> Result<(), ModelError> {
        let a = self.a.end_forward();
        let b = self.b.end_forward();
        a.and(b)
    }

    fn embed(
        &self,
        table: &Self::Matrix,
        ids: &[u32],
        out: &mut Self::Act,
    ) -> Result<(), ModelError> {
        match table {
            SplitMatrix::A(t) => self.a.embed(t, ids, own(&mut out.a))?,
            SplitMatrix::B(t) => self.b.embed(t, ids, own(&mut out.b))?,
        }
        Self::wrote(out, Self::matrix_side(table));
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &Self::Act,
        w: &Self::Vector,
        eps: f32,
        out: &mut Self::Act,
    ) -> Result<(), ModelError> {
        let side = Self::vector_side(w);
        self.ensure(x, side)?;
        match w {
            SplitVector::A(w) => self.a.rms_norm(&lock(&x.a), w, eps, own(&mut out.a))?,
            SplitVector::B(w) => self.b.rms_norm(&lock(&x.b), w, eps, own(&mut out.b))?,
        }
        Self::wrote(out, side);
        Ok(())
    }

    fn matmul(
        &self,
        w: &Self::Matrix,
        x: &Self::Act,
        out: &mut Self::Act,
    ) -> Result<(), ModelError> {
        let side = Self::matrix_side(w);
        self.ensure(x, side)?;
        match w {
            SplitMatrix::A(w) => self.a.matmul(w, &lock(&x.a), own(&mut out.a))?,
            SplitMatrix::B(w) => self.b.matmul(w, &lock(&x.b), own(&mut out.b))?,
        }
        Self::wrote(out, side);
        Ok(())
    }

    fn rope(
        &self,
        x: &mut Self::Act,
        n_head: usize,
        pos0: usize,
        rope: &RopeParams,
    ) -> Result<(), ModelError> {
        let side = Self::side_of_act(x);
        match side {
            Side::A => self.a.rope(own(&mut x.a), n_head, pos0, rope)?,
            Side::B => self.b.rope(own(&mut x.b), n_head, pos0, rope)?,
        }
        Self::wrote(x, side);
        Ok(())
    }

    fn attention(
        &self,
        cache: &mut Self::KvCache,
        layer: usize,
        shape: AttnSpec,
        pos0: usize,
        q: &Self::Act,
        k: &Self::Act,
        v: &Self::Act,
        out: &mut Self::Act,
    ) -> Result<(), ModelError> {
        let side = self.side_of_layer(layer);
        for x in [q, k, v] {
            self.ensure(x, side)?;
        }
        let missing = || ModelError::Tensor {
            what: format!("split backend: no KV cache for layer {layer}"),
        };
        match side {
            Side::A => {
                let c = cache.a.as_mut().ok_or_else(missing)?;
                let o = own(&mut out.a);
                self.a.attention(
                    c,
                    layer,
                    shape,
                    pos0,
                    &lock(&q.a),
                    &lock(&k.a),
                    &lock(&v.a),
                    o,
                )?;
            }
            Side::B => {
                let c = cache.b.as_mut().ok_or_else(missing)?;
                let o = own(&mut out.b);
                let l = layer - self.first_b;
                self.b
                    .attention(c, l, shape, pos0, &lock(&q.b), &lock(&k.b), &lock(&v.b), o)?;
            }
        }
        Self::wrote(out, side);
        Ok(())
    }

    fn swiglu(&self, gate: &mut Self::Act, up: &Self::Act) -> Result<(), ModelError> {
        let side = Self::side_of_act(gate);
        self.ensure(up, side)?;
        match side {
            Side::A => self.a.swiglu(own(&mut gate.a), &lock(&up.a))?,
            Side::B => self.b.swiglu(own(&mut gate.b), &lock(&up.b))?,
        }
        Self::wrote(gate, side);
        Ok(())
    }

    fn geglu(&self, gate: &mut Self::Act, up: &Self::Act) -> Result<(), ModelError> {
        let side = Self::side_of_act(gate);
        self.ensure(up, side)?;
        match side {
            Side::A => self.a.geglu(own(&mut gate.a), &lock(&up.a))?,
            Side::B => self.b.geglu(own(&mut gate.b), &lock(&up.b))?,
        }
        Self::wrote(gate, side);
        Ok(())
    }

    fn add_bias(&self, x: &mut Self::Act, b: &Self::Vector) -> Result<(), ModelError> {
        let side = Self::vector_side(b);
        self.ensure(x, side)?;
        match b {
            SplitVector::A(b) => self.a.add_bias(own(&mut x.a), b)?,
            SplitVector::B(b) => self.b.add_bias(own(&mut x.b), b)?,
        }
        Self::wrote(x, side);
        Ok(())
    }

    fn rms_norm_heads(
        &self,
        x: &mut Self::Act,
        w: &Self::Vector,
        eps: f32,
        head_dim: usize,
    ) -> Result<(), ModelError> {
        let side = Self::vector_side(w);
        self.ensure(x, side)?;
        match w {
            SplitVector::A(w) => self.a.rms_norm_heads(own(&mut x.a), w, eps, head_dim)?,
            SplitVector::B(w) => self.b.rms_norm_heads(own(&mut x.b), w, eps, head_dim)?,
        }
        Self::wrote(x, side);
        Ok(())
    }

    fn scale(&self, x: &mut Self::Act, s: f32) -> Result<(), ModelError> {
        let side = Self::side_of_act(x);
        match side {
            Side::A => self.a.scale(own(&mut x.a), s)?,
            Side::B => self.b.scale(own(&mut x.b), s)?,
        }
        Self::wrote(x, side);
        Ok(())
    }

    fn softcap(&self, x: &mut Self::Act, cap: f32) -> Result<(), ModelError> {
        let side = Self::side_of_act(x);
        match side {
            Side::A => self.a.softcap(own(&mut x.a), cap)?,
            Side::B => self.b.softcap(own(&mut x.b), cap)?,
        }
        Self::wrote(x, side);
        Ok(())
    }

    fn add(&self, x: &mut Self::Act, y: &Self::Act) -> Result<(), ModelError> {
        // Where the addend was just produced (a projection on its layer's side).
        let side = Self::side_of_act(y);
        self.ensure(x, side)?;
        match side {
            Side::A => self.a.add(own(&mut x.a), &lock(&y.a))?,
            Side::B => self.b.add(own(&mut x.b), &lock(&y.b))?,
        }
        Self::wrote(x, side);
        Ok(())
    }

    fn supports_batches(&self) -> bool {
        self.a.supports_batches() && self.b.supports_batches()
    }

    fn attention_batch(
        &self,
        cache: &mut Self::KvCache,
        layer: usize,
        attn: AttnSpec,
        rope: &RopeParams,
        batch: &PagedBatch<'_>,
        q: &mut Self::Act,
        k: &mut Self::Act,
        v: &Self::Act,
        out: &mut Self::Act,
    ) -> Result<(), ModelError> {
        let side = self.side_of_layer(layer);
        for x in [&*q, &*k, v] {
            self.ensure(x, side)?;
        }
        let missing = || ModelError::Tensor {
            what: format!("split backend: no KV cache for layer {layer}"),
        };
        match side {
            Side::A => self.a.attention_batch(
                cache.a.as_mut().ok_or_else(missing)?,
                layer,
                attn,
                rope,
                batch,
                own(&mut q.a),
                own(&mut k.a),
                &lock(&v.a),
                own(&mut out.a),
            )?,
            Side::B => self.b.attention_batch(
                cache.b.as_mut().ok_or_else(missing)?,
                layer - self.first_b,
                attn,
                rope,
                batch,
                own(&mut q.b),
                own(&mut k.b),
                &lock(&v.b),
                own(&mut out.b),
            )?,
        }
        for x in [q, k, out] {
            Self::wrote(x, side);
        }
        Ok(())
    }

    fn copy_rows(
        &self,
        src: &Self::Act,
        rows: &[usize],
        dst: &mut Self::Act,
    ) -> Result<(), ModelError> {
        let side = Self::side_of_act(src);
        match side {
            Side::A => self.a.copy_rows(&lock(&src.a), rows, own(&mut dst.a))?,
            Side::B => self.b.copy_rows(&lock(&src.b), rows, own(&mut dst.b))?,
        }
        Self::wrote(dst, side);
        Ok(())
    }

    fn copy_row(&self, src: &Self::Act, row: usize, dst: &mut Self::Act) -> Result<(), ModelError> {
        let side = Self::side_of_act(src);
        match side {
            Side::A => self.a.copy_row(&lock(&src.a), row, own(&mut dst.a))?,
            Side::B => self.b.copy_row(&lock(&src.b), row, own(&mut dst.b))?,
        }
        Self::wrote(dst, side);
        Ok(())
    }

    fn read(&self, x: &Self::Act) -> Result<Vec<f32>, ModelError> {
        match Self::side_of_act(x) {
            Side::A => self.a.read(&lock(&x.a)),
            Side::B => self.b.read(&lock(&x.b)),
        }
    }

    fn write(&self, x: &mut Self::Act, data: &[f32]) -> Result<(), ModelError> {
        self.a.write(own(&mut x.a), data)?;
        Self::wrote(x, Side::A);
        Ok(())
    }

    fn qkv(
        &self,
        x: &Self::Act,
        wq: &Self::Matrix,
        wk: &Self::Matrix,
        wv: &Self::Matrix,
        q: &mut Self::Act,
        k: &mut Self::Act,
        v: &mut Self::Act,
    ) -> Result<(), ModelError> {
        let side = Self::matrix_side(wq);
        self.ensure(x, side)?;
        match (wq, wk, wv) {
            (SplitMatrix::A(wq), SplitMatrix::A(wk), SplitMatrix::A(wv)) => self.a.qkv(
                &lock(&x.a),
                wq,
                wk,
                wv,
                own(&mut q.a),
                own(&mut k.a),
                own(&mut v.a),
            )?,
            (SplitMatrix::B(wq), SplitMatrix::B(wk), SplitMatrix::B(wv)) => self.b.qkv(
                &lock(&x.b),
                wq,
                wk,
                wv,
                own(&mut q.b),
                own(&mut k.b),
                own(&mut v.b),
            )?,
            _ => return Err(Self::mismatch("Q, K and V")),
        }
        for a in [q, k, v] {
            Self::wrote(a, side);
        }
        Ok(())
    }

    fn ffn_gate_up(
        &self,
        x: &Self::Act,
        w_gate: &Self::Matrix,
        w_up: &Self::Matrix,
        act: Activation,
        gate: &mut Self::Act,
        up: &mut Self::Act,
    ) -> Result<(), ModelError> {
        let side = Self::matrix_side(w_gate);
        self.ensure(x, side)?;
        match (w_gate, w_up) {
            (SplitMatrix::A(wg), SplitMatrix::A(wu)) => {
                self.a
                    .ffn_gate_up(&lock(&x.a), wg, wu, act, own(&mut gate.a), own(&mut up.a))?
            }
            (SplitMatrix::B(wg), SplitMatrix::B(wu)) => {
                self.b
                    .ffn_gate_up(&lock(&x.b), wg, wu, act, own(&mut gate.b), own(&mut up.b))?
            }
            _ => return Err(Self::mismatch("gate and up")),
        }
        Self::wrote(gate, side);
        Self::wrote(up, side);
        Ok(())
    }

    fn matmul_add(
        &self,
        w: &Self::Matrix,
        x: &Self::Act,
        acc: &mut Self::Act,
        scratch: &mut Self::Act,
    ) -> Result<(), ModelError> {
        let side = Self::matrix_side(w);
        self.ensure(x, side)?;
        self.ensure(acc, side)?;
        match w {
            SplitMatrix::A(w) => {
                self.a
                    .matmul_add(w, &lock(&x.a), own(&mut acc.a), own(&mut scratch.a))?
            }
            SplitMatrix::B(w) => {
                self.b
                    .matmul_add(w, &lock(&x.b), own(&mut acc.b), own(&mut scratch.b))?
            }
        }
        Self::wrote(acc, side);
        // The scratch buffer may hold the product now on `side`; nothing reads it.
        Self::wrote(scratch, side);
        Ok(())
    }

    fn rope_attention(
        &self,
        cache: &mut Self::KvCache,
        layer: usize,
        shape: AttnSpec,
        pos0: usize,
        rope: &RopeParams,
        q: &mut Self::Act,
        k: &mut Self::Act,
        v: &Self::Act,
        out: &mut Self::Act,
    ) -> Result<(), ModelError> {
        let side = self.side_of_layer(layer);
        for x in [&*q, &*k, v] {
            self.ensure(x, side)?;
        }
        let missing = || ModelError::Tensor {
            what: format!("split backend: no KV cache for layer {layer}"),
        };
        match side {
            Side::A => self.a.rope_attention(
                cache.a.as_mut().ok_or_else(missing)?,
                layer,
                shape,
                pos0,
                rope,
                own(&mut q.a),
                own(&mut k.a),
                &lock(&v.a),
                own(&mut out.a),
            )?,
            Side::B => self.b.rope_attention(
                cache.b.as_mut().ok_or_else(missing)?,
                layer - self.first_b,
                shape,
                pos0,
                rope,
                own(&mut q.b),
                own(&mut k.b),
                &lock(&v.b),
                own(&mut out.b),
            )?,
        }
        for x in [q, k, out] {
            Self::wrote(x, side);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::layer_of;

    #[test]
    fn layer_index_from_tensor_names() {
        assert_eq!(layer_of("blk.0.attn_q.weight"), Some(0));
        assert_eq!(layer_of("blk.27.ffn_down.weight"), Some(27));
        assert_eq!(layer_of("token_embd.weight"), None);
        assert_eq!(layer_of("output_norm.weight"), None);
        assert_eq!(layer_of("blk.x.attn_q.weight"), None);
    }
}
