//! Prefill GEMM: `out[t, r] = Σ_k W[r, k] · x[t, k]` for a whole prompt at once, on quantized
//! weights that are never dequantized into memory as a whole.
//!
//! # Design
//!
//! Each worker takes a *unit* (a block of weight rows × a range of token tiles), unpacks that
//! block's quantized rows into a small bf16 **panel** (L2 resident, reused by every token tile
//! of the unit), then runs a register-blocked micro-kernel over `2 × 16` tokens × `2 × 16`
//! rows:
//!
//! * **AMX** (`tdpbf16ps`, tiles driven by stable `asm!`, module `amx`): the *weights* are the
//!   A operand (row-major `[16 rows][32]` bf16 tiles, so the unpack writes rows as they come,
//!   no transpose) and the activations the B operand (`[16 pairs][16 tokens][2]`, interleaved
//!   once per matmul). C tiles `[16 rows, 16 tokens]` f32 accumulate across the whole `K` in
//!   the tile registers — no int32 store-and-rescale after every 32- or 16-element sub-block —
//!   and are transposed into `out` once. The K-quant sub-block scales and mins (and the Q6_K
//!   `-32`) are folded into the panel when it is unpacked, once per unit, instead of per token
//!   tile. That is why the operands are bf16 and not int8: the products `sc · q` of a Q4_K
//!   sub-block (up to 945) or a Q6_K one (up to ±4064 × scale) do not fit a byte, so an int8
//!   tile path has to leave the tile unit every sub-block (llama.cpp's AMX path does, and runs
//!   at ≈ 7 % of the tile peak).
//! * **Fallback** for CPUs without AMX: per slice of [`KC`] columns a transposed panel and an
//!   f32 FMA micro-kernel compiled for AVX-512F, AVX2+FMA or baseline x86-64 (one generic
//!   body, three `#[target_feature]` instantiations).
//!
//! Operand layouts (bf16 = the upper half of an f32, rounded to nearest even; two bf16 per
//! u32, the lower element in the low half):
//! * activations [`PackedActs`], [`ActLayout::Rows`] (fallback paths):
//!   `[t_pad / 16][k / 32][16 tokens][32]` bf16, `t_pad` a multiple of 32 with zero rows — one
//!   `16 × 32` tile is 1 KiB contiguous, so the micro-kernel streams tiles instead of 16 rows
//!   `2k` bytes apart;
//! * activations, [`ActLayout::Pairs`] (AMX): `[t_pad / 16][k / 32][16 pairs][16 tokens]` u32
//!   bf16 pairs `(x[t][2p], x[t][2p + 1])` — exactly an AMX B tile per token tile and k-step;
//! * fallback panel: `[groups][k / 32][16 pairs][16 rows]` u32 bf16 pairs of the weights;
//! * AMX panel: `[row tiles][k / 32][16 rows][32]` bf16.
//!
//! [`gemm_ref`] is the scalar twin (dequantize a row with `damascus_quant`, round both operands
//! to bf16, sum in f32) every path is tested against.

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
pub mod int8;
pub(crate) mod micro;
pub mod packed;
#[cfg(test)]
mod tests;
mod unpack;

use std::sync::atomic::{AtomicUsize, Ordering};

use damascus_quant::{GgmlType, can_dequantize, dequantize_row};

use crate::cpu::Isa;
use crate::pool::{ThreadPool, split_range};
use crate::quantdot::KernelError;

/// Tokens per A tile and weight rows per panel group.
pub const TILE: usize = 16;
/// `k` elements per tile step (16 bf16 pairs).
pub const KSTEP: usize = 32;
/// Weight rows per work unit (one panel).
pub const MC: usize = 128;
/// Columns per panel slice (a multiple of every block size). Measured on the 2-core AMX VM
/// (Q4_K, 512 tokens, 2 threads, GFLOP/s for 3072×3072 / 3072×8192 / 1024×3072): KC 256:
/// 664 / 612 / 835, 1024: 944 / 792 / 1362, 4096: 1148 / 908 / 1642 (fewer C tile reloads).
pub const KC: usize = 4096;

/// f32 → bf16 bits, round to nearest even; NaN stays NaN (quieted).
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if (b & 0x7fff_ffff) > 0x7f80_0000 {
        return ((b >> 16) | 0x40) as u16;
    }
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// bf16 bits → f32 (exact).
#[inline(always)]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// How [`PackedActs`] lays out its tiles (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActLayout {
    /// `[t_pad / 16][k / 32][16 tokens][32]` bf16: the f32 fallback micro-kernels.
    Rows,
    /// `[t_pad / 16][k / 32][16 pairs][16 tokens][2]` bf16: AMX B tiles.
    Pairs,
}

/// Which micro-kernel a GEMM runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmPath {
    /// Portable f32 micro-kernel (baseline x86-64 or any target).
    Scalar,
    /// f32 FMA micro-kernel compiled for AVX2 + FMA.
    Avx2,
    /// f32 FMA micro-kernel compiled for AVX-512F.
    Avx512,
    /// AMX-BF16 tiles.
    Amx,
}

impl GemmPath {
    /// The path for a kernel ISA level (AMX tiles only when the OS granted them).
    pub fn for_isa(isa: Isa) -> GemmPath {
        match isa {
            Isa::Scalar => GemmPath::Scalar,
            Isa::Avx2 => GemmPath::Avx2,
            Isa::Avx512 | Isa::Vnni => GemmPath::Avx512,
            Isa::Amx => GemmPath::Amx,
        }
    }

    /// Whether this CPU can run the path.
    pub fn is_available(self) -> bool {
        let f = crate::cpu::CpuFeatures::get();
        match self {
            GemmPath::Scalar => true,
            GemmPath::Avx2 => f.avx2 && f.fma,
            GemmPath::Avx512 => f.avx512f,
            GemmPath::Amx => f.amx_bf16 && Isa::Amx.is_available(),
        }
    }

    /// Every path this CPU can run, slowest first.
    pub fn available() -> Vec<GemmPath> {
        [
            GemmPath::Scalar,
            GemmPath::Avx2,
            GemmPath::Avx512,
            GemmPath::Amx,
        ]
        .into_iter()
        .filter(|p| p.is_available())
        .collect()
    }

    /// The activation layout the path reads.
    pub fn act_layout(self) -> ActLayout {
        match self {
            GemmPath::Amx => ActLayout::Pairs,
            _ => ActLayout::Rows,
        }
    }

    /// Short name (`"amx-bf16"`).
    pub fn name(self) -> &'static str {
        match self {
            GemmPath::Scalar => "scalar",
            GemmPath::Avx2 => "avx2",
            GemmPath::Avx512 => "avx512",
            GemmPath::Amx => "amx-bf16",
        }
    }
}

/// Activations of a prompt in the GEMM's operand layout.
#[derive(Clone, Debug)]
pub struct PackedActs {
    n_tokens: usize,
    k: usize,
    layout: ActLayout,
    /// `t_pad * k / 2` u32 bf16 pairs in `layout`, tokens `n_tokens..t_pad` zero.
    data: Vec<u32>,
}

impl PackedActs {
    /// Packs `x` (`[n_tokens, k]` f32 row-major, `k` a multiple of 32) in the
    /// [`ActLayout::Rows`] layout.
    pub fn new(x: &[f32], n_tokens: usize, k: usize) -> Result<PackedActs, KernelError> {
        PackedActs::with_layout(ActLayout::Rows, x, n_tokens, k, None)
    }

    /// [`PackedActs::new`], split by token tiles over `pool`.
    pub fn new_with(
        x: &[f32],
        n_tokens: usize,
        k: usize,
        pool: Option<&ThreadPool>,
    ) -> Result<PackedActs, KernelError> {
        PackedActs::with_layout(ActLayout::Rows, x, n_tokens, k, pool)
    }

    /// Packs `x` in the layout `path` reads ([`GemmPath::act_layout`]).
    pub fn for_path(
        path: GemmPath,
        x: &[f32],
        n_tokens: usize,
        k: usize,
        pool: Option<&ThreadPool>,
    ) -> Result<PackedActs, KernelError> {
        PackedActs::with_layout(path.act_layout(), x, n_tokens, k, pool)
    }

    /// Packs `x` in `layout`, split by token tiles over `pool`.
    pub fn with_layout(
        layout: ActLayout,
        x: &[f32],
        n_tokens: usize,
        k: usize,
        pool: Option<&ThreadPool>,
    ) -> Result<PackedActs, KernelError> {
        let mut p = PackedActs {
            n_tokens: 0,
            k: 0,
            layout,
            data: Vec::new(),
        };
        p.repack(x, n_tokens, k, pool)?;
        Ok(p)
    }

    /// The layout of the tiles.
    pub fn layout(&self) -> ActLayout {
        self.layout
    }

    /// Packs `x` (`[n_tokens, k]`) into this buffer in its layout, reusing its allocation (a
    /// prompt's matmuls pack every input: fresh pages would cost more than the packing).
    pub fn repack(
        &mut self,
        x: &[f32],
        n_tokens: usize,
        k: usize,
        pool: Option<&ThreadPool>,
    ) -> Result<(), KernelError> {
        if x.len() != n_tokens * k || !k.is_multiple_of(KSTEP) {
            return Err(KernelError::BadLength {
                what: "gemm activations (k a multiple of 32)",
                expected: n_tokens * k,
                found: x.len(),
                unit: "elements",
            });
        }
        let t_pad = n_tokens.div_ceil(2 * TILE) * 2 * TILE;
        self.n_tokens = n_tokens;
        self.k = k;
        // Every element is written below (padding tokens as zeros), so stale contents of a
        // reused buffer never leak.
        self.data.resize(t_pad * k / 2, 0);
        let data = &mut self.data[..t_pad * k / 2];
        let tile_words = k / 2 * TILE; // one token tile: [nks][16][16] u32
        let layout = self.layout;
        // Token tile `tt` owns data[tt * tile_words..][..tile_words].
        let pack = |tt: usize, dst: &mut [u32]| {
            let valid = n_tokens.saturating_sub(tt * TILE).min(TILE);
            let first = (tt * TILE).min(n_tokens);
            let src = &x[first * k..(first + valid) * k];
            match layout {
                ActLayout::Rows => {
                    let mut row = vec![0u16; k]; // [k] bf16 one token
                    for ti in 0..TILE {
                        if ti < valid {
                            micro::to_bf16(&src[ti * k..(ti + 1) * k], &mut row);
                        } else {
                            row.fill(0);
                        }
                        for (s, seg) in row.chunks_exact(KSTEP).enumerate() {
                            let at = (s * TILE + ti) * (KSTEP / 2);
                            for (d, pair) in
                                dst[at..at + KSTEP / 2].iter_mut().zip(seg.chunks_exact(2))
                            {
                                *d = u32::from(pair[0]) | (u32::from(pair[1]) << 16);
                            }
                        }
                    }
                }
                ActLayout::Pairs if valid == TILE => micro::pack_group(src, k, dst),
                ActLayout::Pairs => {
                    let mut rows = vec![0f32; TILE * k]; // [16, k] f32 zero-padded tail tile
                    rows[..src.len()].copy_from_slice(src);
                    micro::pack_group(&rows, k, dst);
                }
            }
        };
        let n_tt = t_pad / TILE;
        match pool {
            Some(p) if p.n_threads() > 1 && n_tt > 1 => {
                // One token tile per chunk, handed out over the pool.
                p.for_each_chunk_mut(&mut data[..n_tt * tile_words], tile_words, &|tt, tile| {
                    pack(tt, tile)
                });
            }
            _ => {
                for (tt, tile) in data.chunks_exact_mut(tile_words).enumerate() {
                    pack(tt, tile);
                }
            }
        }
        Ok(())
    }

    /// Tokens (rows of `x`).
    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    /// Elements per token.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Token tile pairs (`t_pad / 32`).
    fn n_tile_pairs(&self) -> usize {
        (self.data.len() * 2).checked_div(self.k).unwrap_or(0) / (2 * TILE)
    }

    /// Token `t`, element `i` (bf16 bits).
    pub fn get(&self, t: usize, i: usize) -> u16 {
        let tile = (t / TILE * (self.k / KSTEP) + i / KSTEP) * TILE * TILE; // u32 index
        let word = match self.layout {
            ActLayout::Rows => tile + (t % TILE) * TILE + (i % KSTEP) / 2,
            ActLayout::Pairs => tile + (i % KSTEP) / 2 * TILE + t % TILE,
        };
        (self.data[word] >> (16 * (i % 2))) as u16
    }

    /// Start of the tile of token tile `tt` (tokens `16 tt..16 tt + 16`) at k-step `s`:
    /// 1 KiB, `nks - s` such tiles follow contiguously.
    fn tile(&self, tt: usize, s: usize) -> *const u32 {
        self.data[(tt * (self.k / KSTEP) + s) * TILE * TILE..].as_ptr()
    }
}

/// A quantized weight matrix as the GEMM reads it.
#[derive(Clone, Copy, Debug)]
pub struct WeightRef<'a> {
    /// Block type.
    pub dtype: GgmlType,
    /// `[rows, row_bytes]` ggml blocks.
    pub bytes: &'a [u8],
    /// Rows (output features).
    pub rows: usize,
    /// Columns (`k`, input features).
    pub cols: usize,
}

impl WeightRef<'_> {
    /// Bytes per row.
    fn row_bytes(&self) -> usize {
        self.cols / self.dtype.block_size() * self.dtype.type_size()
    }

    /// Why this matrix cannot go through the GEMM, if it cannot.
    pub fn unsupported(&self) -> Option<String> {
        let bs = self.dtype.block_size();
        if !can_dequantize(self.dtype) || bs == 0 {
            return Some(format!("no dequantizer for {:?}", self.dtype));
        }
        if self.rows == 0 || !self.rows.is_multiple_of(TILE) {
            return Some(format!("{} rows is not a multiple of {TILE}", self.rows));
        }
        if self.cols == 0
            || !self.cols.is_multiple_of(KSTEP)
            || !self.cols.is_multiple_of(bs)
            || !KC.is_multiple_of(bs)
        {
            return Some(format!(
                "{} columns do not split into {KSTEP}-element steps of whole {:?} blocks",
                self.cols, self.dtype
            ));
        }
        let need = self.rows.checked_mul(self.row_bytes());
        if need != Some(self.bytes.len()) {
            return Some(format!(
                "{} bytes for [{}, {}] {:?}",
                self.bytes.len(),
                self.rows,
                self.cols,
                self.dtype
            ));
        }
        None
    }

    fn check(&self) -> Result<(), KernelError> {
        match self.unsupported() {
            Some(why) => Err(KernelError::BadShape(format!("gemm: {why}"))),
            None => Ok(()),
        }
    }
}

fn check_io(w: &WeightRef<'_>, x: &PackedActs, out: &[f32]) -> Result<(), KernelError> {
    w.check()?;
    if x.data.len() < x.n_tokens * x.k / 2 {
        return Err(KernelError::BadShape("gemm: activations not packed".into()));
    }
    if x.k != w.cols {
        return Err(KernelError::BadShape(format!(
            "gemm: activations have {} columns, the matrix {}",
            x.k, w.cols
        )));
    }
    if out.len() != x.n_tokens * w.rows {
        return Err(KernelError::BadLength {
            what: "gemm output",
            expected: x.n_tokens * w.rows,
            found: out.len(),
            unit: "elements",
        });
    }
    Ok(())
}

fn dequant_err(e: damascus_quant::QuantError) -> KernelError {
    KernelError::BadShape(format!("gemm: dequantize: {e}"))
}

/// Scalar twin: `out[t * rows + r] = Σ_k bf16(W[r, k]) · x[t, k]` (bf16 activations), summed
/// in f32 in `k` order. `out`: `[n_tokens, rows]` f32.
pub fn gemm_ref(w: WeightRef<'_>, x: &PackedActs, out: &mut [f32]) -> Result<(), KernelError> {
    check_io(&w, x, out)?;
    let rb = w.row_bytes();
    let mut row = vec![0f32; w.cols]; // [k] f32 one dequantized row
    for r in 0..w.rows {
        dequantize_row(w.dtype, &w.bytes[r * rb..(r + 1) * rb], &mut row).map_err(dequant_err)?;
        for v in row.iter_mut() {
            *v = bf16_to_f32(f32_to_bf16(*v));
        }
        for t in 0..x.n_tokens {
            let mut s = 0f32;
            for (i, &wv) in row.iter().enumerate() {
                s += wv * bf16_to_f32(x.get(t, i));
            }
            out[t * w.rows + r] = s;
        }
    }
    Ok(())
}

/// Unpacks rows `r0..r0 + 16 * ng`, columns `k0..k0 + kc` of `w` into `panel`
/// (`[ng][kc / 32][16][16]` u32 bf16 pairs). `scratch`: `[16, kc]` f32.
fn unpack_panel(
    w: &WeightRef<'_>,
    r0: usize,
    ng: usize,
    k0: usize,
    kc: usize,
    panel: &mut [u32],
    scratch: &mut [f32],
) -> Result<(), KernelError> {
    let (bs, ts, rb) = (w.dtype.block_size(), w.dtype.type_size(), w.row_bytes());
    let (b0, b1) = (k0 / bs * ts, (k0 + kc) / bs * ts);
    let nks = kc / KSTEP;
    for g in 0..ng {
        let tiles = &mut panel[g * nks * TILE * TILE..(g + 1) * nks * TILE * TILE];
        for n in 0..TILE {
            let r = r0 + g * TILE + n;
            let src = &w.bytes[r * rb + b0..r * rb + b1];
            let dst = &mut scratch[n * kc..(n + 1) * kc];
            if !unpack::dequant_fast(w.dtype, src, dst) {
                dequantize_row(w.dtype, src, dst).map_err(dequant_err)?;
            }
        }
        micro::pack_group(&scratch[..TILE * kc], kc, tiles);
    }
    Ok(())
}

/// The C tiles of one micro-kernel call: token tiles `i` (0, 1) × row groups `j` (0, 1),
/// `c[2 * i + j]` pointing at `[16, 16]` f32 with a row stride of `stride` floats.
struct CTiles {
    c: [*mut f32; 4],
    stride: [usize; 4],
}

/// One f32 micro-kernel call: 2 token tiles × 2 row groups over `nks` k-steps.
struct MicroArgs {
    /// Token tiles: `nks` contiguous `[16 tokens][32]` bf16 tiles each.
    a: [*const u16; 2],
    /// Row groups: `[nks][16][16]` u32 panel tiles.
    b: [*const u32; 2],
    nks: usize,
    c: CTiles,
    /// Accumulate into C (else overwrite).
    load_c: bool,
}

/// `out = x · Wᵀ` (`out`: `[n_tokens, rows]` f32) on `path`, split over `pool` (or the calling
/// thread).
// `i`/`j` index the token tiles and row groups of four parallel arrays at once.
#[allow(clippy::needless_range_loop)]
pub fn gemm(
    path: GemmPath,
    w: WeightRef<'_>,
    x: &PackedActs,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), KernelError> {
    check_io(&w, x, out)?;
    if !path.is_available() {
        return Err(KernelError::BadShape(format!(
            "gemm: path {} is not available on this CPU",
            path.name()
        )));
    }
    if x.layout != path.act_layout() {
        return Err(KernelError::BadShape(format!(
            "gemm: path {} reads {:?} activations, these are packed as {:?}",
            path.name(),
            path.act_layout(),
            x.layout
        )));
    }
    #[cfg(target_arch = "x86_64")]
    if path == GemmPath::Amx {
        return amx::gemm_tiles(amx::Step::Tiles, amx::Weights::File(w), x, out, pool);
    }
    let nt = pool.map_or(1, |p| p.n_threads());
    let n_rb = w.rows.div_ceil(MC);
    let n_tp = x.n_tile_pairs();
    if n_tp == 0 {
        return Ok(());
    }
    // Enough units for every thread, splitting tokens only when row blocks are scarce.
    let tc = (2 * nt).div_ceil(n_rb).clamp(1, n_tp);
    let n_units = n_rb * tc;
    let next = AtomicUsize::new(0);
    let first_err: std::sync::Mutex<Option<KernelError>> = std::sync::Mutex::new(None);
    let out_ptr = SendPtr(out.as_mut_ptr());
    let work = |_t: usize, _nt: usize| {
        let out_ptr = &out_ptr;
        let kc_max = KC.min(w.cols);
        let mut panel = vec![0u32; (MC / TILE) * (kc_max / KSTEP) * TILE * TILE]; // [MC/16][kc/32][16][16]
        let mut scratch = vec![0f32; TILE * kc_max]; // [16, kc] f32 dequantized rows
        let mut ctile = [[0f32; TILE * TILE]; 4]; // [4][16 tokens][16 rows] edge C tiles
        loop {
            let u = next.fetch_add(1, Ordering::Relaxed);
            if u >= n_units {
                break;
            }
            let (rb, tcx) = (u / tc, u % tc);
            let r0 = rb * MC;
            let ng = (w.rows - r0).min(MC) / TILE;
            let tps = split_range(n_tp, 1, tcx, tc);
            let mut k0 = 0;
            while k0 < w.cols {
                let kc = (w.cols - k0).min(KC);
                let nks = kc / KSTEP;
                if let Err(e) = unpack_panel(&w, r0, ng, k0, kc, &mut panel, &mut scratch) {
                    first_err
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(e);
                    return;
                }
                for tp in tps.clone() {
                    let t0 = tp * 2 * TILE;
                    for gp in 0..ng.div_ceil(2) {
                        let g = [2 * gp, (2 * gp + 1).min(ng - 1)];
                        let dup = g[0] == g[1];
                        let mut c = CTiles {
                            c: [std::ptr::null_mut(); 4],
                            stride: [w.rows; 4],
                        };
                        let mut edge = [false; 4];
                        for i in 0..2 {
                            let tt = t0 + i * TILE;
                            let valid = x.n_tokens.saturating_sub(tt).min(TILE);
                            for j in 0..2 {
                                let idx = 2 * i + j;
                                let col = r0 + g[j] * TILE;
                                if valid == TILE && !(dup && j == 1) {
                                    // SAFETY: rows tt..tt+16 < n_tokens and columns
                                    // col..col+16 <= rows lie inside `out`; units own disjoint
                                    // (row block, token range) rectangles.
                                    c.c[idx] = unsafe { out_ptr.0.add(tt * w.rows + col) };
                                } else {
                                    edge[idx] = true;
                                    let ct = &mut ctile[idx];
                                    ct.fill(0.0);
                                    if k0 > 0 && !(dup && j == 1) {
                                        for tok in 0..valid {
                                            // SAFETY: as above, for the valid rows only.
                                            let src = unsafe {
                                                std::slice::from_raw_parts(
                                                    out_ptr.0.add((tt + tok) * w.rows + col),
                                                    TILE,
                                                )
                                            };
                                            ct[tok * TILE..(tok + 1) * TILE].copy_from_slice(src);
                                        }
                                    }
                                    c.c[idx] = ct.as_mut_ptr();
                                    c.stride[idx] = TILE;
                                }
                            }
                        }
                        let a_base = |i: usize| x.tile(t0 / TILE + i, k0 / KSTEP).cast::<u16>();
                        let b_base = |j: usize| panel[g[j] * nks * TILE * TILE..].as_ptr();
                        let args = MicroArgs {
                            a: [a_base(0), a_base(1)],
                            b: [b_base(0), b_base(1)],
                            nks,
                            c,
                            load_c: k0 > 0,
                        };
                        // SAFETY: `path` is available (checked above); A rows t0..t0+32 lie in
                        // the padded activations, B tiles in the panel (nks tiles per group),
                        // and every C pointer covers 16 rows of `stride` floats.
                        unsafe { run_micro(path, &args) };
                        for i in 0..2 {
                            let tt = t0 + i * TILE;
                            let valid = x.n_tokens.saturating_sub(tt).min(TILE);
                            for j in 0..2 {
                                let idx = 2 * i + j;
                                if !edge[idx] || (dup && j == 1) {
                                    continue;
                                }
                                let col = r0 + g[j] * TILE;
                                for tok in 0..valid {
                                    // SAFETY: as above, for the valid rows only.
                                    let dst = unsafe {
                                        std::slice::from_raw_parts_mut(
                                            out_ptr.0.add((tt + tok) * w.rows + col),
                                            TILE,
                                        )
                                    };
                                    dst.copy_from_slice(&ctile[idx][tok * TILE..(tok + 1) * TILE]);
                                }
                            }
                        }
                    }
                }
                k0 += kc;
            }
        }
    };
    match pool {
        Some(p) if nt > 1 => p.run(&work),
        _ => work(0, 1),
    }
    match first_err.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// A raw output pointer shared by the workers (each writes its own rectangles).
///
/// This one stays a raw pointer (the attention kernels hand out `&mut` rows through
/// [`crate::pool::pieces`] instead): a unit's rectangle is 16-token × 16-row C tiles that the
/// micro-kernels (here and in `amx::gemm_tiles`) load and store through one pointer at a
/// stride of `rows` floats, across token rows of `out` that other units' columns interleave.
/// Per-row `&mut` pieces cannot give such a pointer the provenance of the whole tile.
struct SendPtr(*mut f32);
// SAFETY: the workers write disjoint regions (see `gemm`), and the pointer outlives the run.
unsafe impl Sync for SendPtr {}
// SAFETY: as above.
unsafe impl Send for SendPtr {}

/// Dispatches one f32 micro-kernel call (the AMX path has its own driver, `amx`).
///
/// # Safety
/// `path` must be available on this CPU, and `args` must describe valid memory (see
/// [`MicroArgs`]).
unsafe fn run_micro(path: GemmPath, args: &MicroArgs) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match path {
            #[cfg(target_arch = "x86_64")]
            GemmPath::Avx512 => micro::micro_avx512(args),
            #[cfg(target_arch = "x86_64")]
            GemmPath::Avx2 => micro::micro_avx2(args),
            _ => micro::micro_scalar(args),
        }
    }
}
