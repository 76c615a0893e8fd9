//! The AMX-BF16 GEMM: its driver and its tile micro-kernel, driven with stable `asm!` (the AMX
//! intrinsics are unstable, rust-lang/rust#126622; LLVM's assembler knows the mnemonics).
//!
//! Roles: the **weights are the A operand** — a unit's rows unpacked once into a row-major
//! panel `[row tiles][k / 32][16 rows][32]` bf16 (no transpose: each dequantized row is
//! rounded and written in 64-byte pieces) — and the **activations the B operand**
//! ([`ActLayout::Pairs`], interleaved once per matmul, shared by every unit). One call of the
//! micro-kernel computes C `[16 rows, 16 tokens]` f32 for 2 row tiles × 2 token tiles over the
//! whole `k` in the tile registers, stores it to a 4 KiB buffer and the driver transposes it
//! into `out` (`[tokens, rows]`).
//!
//! Tile registers: `tmm0..tmm3` = C (token tile `i` × row tile `j` in `tmm(2i + j)`),
//! `tmm4`/`tmm5` = A (two row tiles, `[16 rows][32]` bf16), `tmm6`/`tmm7` = B (two token
//! tiles, `[16 pairs][16 tokens][2]` bf16). Every tile is 16 rows of 64 bytes.
//!
//! Blocking: a unit is at most [`PANEL_BYTES`] of panel (L2 resident with the B tiles of one
//! token pair, which every row pair of the unit reuses), sized so that the units split evenly
//! over the threads; tokens are split across units only when row blocks are too few. So each
//! unit unpacks its rows once and reads the activations once.
//!
//! The driver also runs on an emulated micro-kernel (`Step::Emulated`, tests only): the same
//! layouts and pointers, scalar arithmetic, so the blocking and layout logic is tested on any
//! CPU, and the real tiles on AMX machines.

use std::arch::asm;
use std::sync::atomic::{AtomicUsize, Ordering};

use damascus_quant::dequantize_row;

use super::int8::{Panel, ROWS};
use super::packed::PackedMatrix;
use super::{
    ActLayout, KSTEP, PackedActs, SendPtr, TILE, WeightRef, dequant_err, f32_to_bf16, micro, unpack,
};
use crate::pool::{ThreadPool, split_range};
use crate::quantdot::KernelError;

/// Most panel bytes per unit: with one token pair's B tiles (`2 · 16 · k` bf16) it stays in
/// a 2 MiB L2 (Sapphire Rapids and later) with room to spare. `DAMASCUS_AMX_PANEL_KIB`
/// overrides it (tuning). Measured on the 16-thread AMX host (GEMM micro-benchmark, Q4_K,
/// 512 tokens, GFLOP/s for 3072×3072 / 3072×8192): 384 KiB 3672 / 3945, 640 KiB 3953 / 4684,
/// 1280 KiB 3387 / 3951, 2048 KiB 3233 / 3396.
pub(super) const PANEL_BYTES: usize = 640 << 10;

/// Tuning knobs, fixed once per process from the installed
/// [`crate::settings::KernelSettings`]: panel bytes per unit (`amx_panel_kib`) and how many
/// of the pool's threads take AMX units (`amx_threads`, default all: on CPUs with two
/// hardware threads per core the siblings share one tile unit and one L2).
fn knobs() -> (usize, usize) {
    static K: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    *K.get_or_init(|| {
        let (kib, threads) = crate::settings::installed_amx();
        (
            kib.map_or(PANEL_BYTES, |v| v << 10),
            threads.unwrap_or(usize::MAX),
        )
    })
}

/// bf16 elements per tile (16 rows × 32).
const TILE_ELEMS: usize = TILE * KSTEP;

/// A 64-byte tile configuration (palette 1): per tile its rows and bytes per row (0 and 0:
/// unused). [`TileGuard`] loads one.
#[repr(C, align(64))]
pub(crate) struct TileConfig([u8; 64]);

impl TileConfig {
    /// Tile `t` of `shapes` is `(rows, colsb)` (rows ≤ 16, bytes per row ≤ 64).
    pub(crate) const fn new(shapes: [(u8, u8); 8]) -> TileConfig {
        let mut c = [0u8; 64];
        c[0] = 1; // palette
        let mut t = 0;
        while t < 8 {
            c[16 + 2 * t] = shapes[t].1; // colsb[t] (u16, little endian)
            c[48 + t] = shapes[t].0; // rows[t]
            t += 1;
        }
        TileConfig(c)
    }

    /// The 64 bytes `ldtilecfg` reads.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> &[u8; 64] {
        &self.0
    }
}

/// This driver's tiles (and [`crate::attn_amx`]'s): eight of 16 rows × 64 bytes.
static CONFIG: TileConfig = TileConfig::new([(TILE as u8, 64); 8]);

/// Configures this thread's tiles on creation and releases them on drop.
pub(crate) struct TileGuard(());

impl TileGuard {
    /// Loads this driver's configuration (eight full tiles). Only created on the AMX path,
    /// which [`super::GemmPath::is_available`] gates on AMX-BF16 and the OS permission.
    pub(crate) fn new() -> TileGuard {
        // SAFETY: AMX is available and permitted (the only callers are the AMX paths).
        unsafe { TileGuard::with(&CONFIG) }
    }

    /// Loads `cfg`.
    ///
    /// # Safety
    /// AMX must be available and permitted on this CPU, and `cfg` a valid palette-1 layout
    /// (rows ≤ 16, bytes per row ≤ 64).
    pub(crate) unsafe fn with(cfg: &TileConfig) -> TileGuard {
        // SAFETY: forwarded from the caller.
        unsafe { asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack)) };
        TileGuard(())
    }
}

impl Drop for TileGuard {
    fn drop(&mut self) {
        // SAFETY: tiles were configured by `new` or `with` on this thread.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// How the driver computes a 2 × 2 tile step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// AMX tiles (`tdpbf16ps`).
    Tiles,
    /// Scalar emulation of the same step on the same memory (tests).
    #[cfg(test)]
    Emulated,
}

/// One micro-kernel call (also used by [`crate::attn_amx`]).
pub(crate) struct TileArgs {
    /// A tiles (weight rows here): `nks` contiguous `[16 rows][32]` bf16 tiles each.
    pub a: [*const u16; 2],
    /// B tiles (tokens here): `nks` contiguous `[16 pairs][16 columns]` u32 tiles each.
    pub b: [*const u32; 2],
    pub nks: usize,
    /// `[4][16 A rows][16 B columns]` f32, tile `2 i + j` for B tile `i`, A tile `j`
    /// (overwritten).
    pub c: *mut f32,
}

/// Runs one 2 × 2 step on `step`.
///
/// # Safety
/// `args` describes valid memory (see [`TileArgs`]); for [`Step::Tiles`], AMX-BF16 is
/// available and this thread holds a [`TileGuard`].
pub(crate) unsafe fn run_step(step: Step, args: &TileArgs) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match step {
            Step::Tiles => micro_2x2(args),
            #[cfg(test)]
            Step::Emulated => emulate_2x2(args),
        }
    }
}

/// `C = Σ_s A_j[s] · B_i[s]` for the four (i, j) pairs, on the tiles.
///
/// # Safety
/// AMX-BF16 is available, this thread holds a [`TileGuard`], and `args` describes valid
/// memory (see [`TileArgs`]).
unsafe fn micro_2x2(args: &TileArgs) {
    let c = args.c.cast::<u8>();
    // SAFETY: (all blocks) pointers as documented; tiles configured.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        );
        let (mut a0, mut a1) = (args.a[0].cast::<u8>(), args.a[1].cast::<u8>());
        let (mut b0, mut b1) = (args.b[0].cast::<u8>(), args.b[1].cast::<u8>());
        for _ in 0..args.nks {
            asm!(
                "tileloadd tmm4, [{a0} + {s}]",
                "tileloadd tmm6, [{b0} + {s}]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tileloadd tmm7, [{b1} + {s}]",
                "tdpbf16ps tmm2, tmm4, tmm7",
                "tileloadd tmm5, [{a1} + {s}]",
                "tdpbf16ps tmm1, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                a0 = in(reg) a0, a1 = in(reg) a1,
                b0 = in(reg) b0, b1 = in(reg) b1, s = in(reg) 64usize,
                options(nostack, readonly),
            );
            a0 = a0.add(1024);
            a1 = a1.add(1024);
            b0 = b0.add(1024);
            b1 = b1.add(1024);
        }
        asm!(
            "tilestored [{c} + {s}], tmm0",
            "tilestored [{c1} + {s}], tmm1",
            "tilestored [{c2} + {s}], tmm2",
            "tilestored [{c3} + {s}], tmm3",
            c = in(reg) c, c1 = in(reg) c.add(1024), c2 = in(reg) c.add(2048),
            c3 = in(reg) c.add(3072), s = in(reg) 64usize,
            options(nostack),
        );
    }
}

/// Scalar emulation of [`micro_2x2`] (pair products summed in f32).
///
/// # Safety
/// `args` describes valid memory (see [`TileArgs`]).
#[cfg(test)]
unsafe fn emulate_2x2(args: &TileArgs) {
    use super::bf16_to_f32;
    for i in 0..2 {
        for j in 0..2 {
            // SAFETY: C holds four [16][16] tiles.
            let c = unsafe { std::slice::from_raw_parts_mut(args.c.add((2 * i + j) * 256), 256) };
            c.fill(0.0);
            for s in 0..args.nks {
                // SAFETY: `nks` tiles per operand.
                let (a, b) = unsafe {
                    (
                        std::slice::from_raw_parts(args.a[j].add(s * TILE_ELEMS), TILE_ELEMS),
                        std::slice::from_raw_parts(args.b[i].add(s * TILE * TILE), TILE * TILE),
                    )
                };
                for m in 0..TILE {
                    for n in 0..TILE {
                        let mut acc = c[m * TILE + n];
                        for p in 0..TILE {
                            let pair = b[p * TILE + n];
                            acc += bf16_to_f32(a[m * KSTEP + 2 * p]) * bf16_to_f32(pair as u16)
                                + bf16_to_f32(a[m * KSTEP + 2 * p + 1])
                                    * bf16_to_f32((pair >> 16) as u16);
                        }
                        c[m * TILE + n] = acc;
                    }
                }
            }
        }
    }
}

thread_local! {
    /// A worker's panel (`[row tiles][k / 32][16][32]` bf16) and one dequantized row (`[k]`
    /// f32), kept between calls: the pool's threads live as long as the backend, and fresh
    /// pages for every matmul would cost more than the unpack.
    static BUFS: std::cell::RefCell<(Vec<u16>, Vec<f32>)> = const {
        std::cell::RefCell::new((Vec::new(), Vec::new()))
    };
    /// A worker's expanded 32-row panel of a repacked matrix (kept for the same reason).
    static EXPANDED: std::cell::RefCell<Option<Panel>> = const { std::cell::RefCell::new(None) };
}

/// Where the driver's weight rows come from.
#[derive(Clone, Copy)]
pub(super) enum Weights<'a> {
    /// The file's blocks, dequantized row by row.
    File(WeightRef<'a>),
    /// A repacked matrix: each 32-row panel expanded ([`PackedMatrix::expand`]) and turned
    /// into two bf16 row tiles by [`panel_to_bf16`].
    Packed(&'a PackedMatrix),
}

impl Weights<'_> {
    fn shape(&self) -> (usize, usize) {
        match self {
            Weights::File(w) => (w.rows, w.cols),
            Weights::Packed(m) => (m.rows(), m.cols()),
        }
    }
}

/// An expanded int8 panel (`p`: 32 rows, `[k / 4][32][4]` u8 quants, `[k / sz][32]` scales
/// `s` and offsets `m`) as two bf16 row tiles of the AMX panel: `dst` `[2][k / 32][16][32]`
/// bf16, value `bf16(fma(q, s, −m))` (the value [`PackedMatrix::dequant_row`] gives, up to
/// the fused rounding).
pub(super) fn panel_to_bf16(p: &Panel, sz: usize, k: usize, dst: &mut [u16]) {
    assert!(
        k.is_multiple_of(KSTEP)
            && sz.is_power_of_two()
            && p.q.len() >= k / 4 * ROWS
            && p.s.len() >= k / sz * ROWS
            && p.m.len() >= k / sz * ROWS
            && dst.len() >= 2 * k * TILE
    );
    let f = crate::cpu::CpuFeatures::allowed();
    if f.avx512bf16 && f.avx512bw {
        // SAFETY: AVX-512F/BW and AVX512-BF16 are present (every AMX CPU has them); sizes
        // asserted above.
        return unsafe { panel_to_bf16_avx512bf16(p, sz, k, dst) };
    }
    if f.avx512bw {
        // SAFETY: AVX-512F/BW are present; sizes asserted above.
        return unsafe { panel_to_bf16_avx512(p, sz, k, dst) };
    }
    panel_to_bf16_scalar(p, sz, k, dst);
}

/// Scalar twin of [`panel_to_bf16`].
pub(super) fn panel_to_bf16_scalar(p: &Panel, sz: usize, k: usize, dst: &mut [u16]) {
    let nks = k / KSTEP;
    for r in 0..ROWS {
        for col in 0..k {
            let q = p.q[col / 4 * ROWS + r].to_le_bytes()[col % 4];
            let i = col / sz * ROWS + r;
            let v = f32::from(q).mul_add(p.s[i], -p.m[i]);
            let at = (r / TILE * nks + col / KSTEP) * TILE_ELEMS + r % TILE * KSTEP + col % KSTEP;
            dst[at] = f32_to_bf16(v);
        }
    }
}

/// [`panel_to_bf16`] on AVX-512: per row pair and 32-column step one gather of the two rows'
/// eight quads, widened and scaled, then rounded with [`f32_to_bf16`]'s integer rounding
/// (with AVX512-BF16, [`panel_to_bf16_avx512bf16`]: `vcvtne2ps2bf16`, the same bits — the
/// values are never subnormal, the one case where the instruction differs).
///
/// # Safety
/// AVX-512F/BW are available; sizes as asserted by [`panel_to_bf16`].
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn panel_to_bf16_avx512(p: &Panel, sz: usize, k: usize, dst: &mut [u16]) {
    // SAFETY: forwarded.
    unsafe {
        panel_to_bf16_body(p, sz, k, dst, |v0, v1| {
            use std::arch::x86_64::*;
            let round = |v: __m512| {
                let bits = _mm512_castps_si512(v);
                let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(1));
                let bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff));
                let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(bits, bias));
                let abs = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fff_ffff));
                let nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f80_0000));
                let quiet = _mm512_or_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(0x40));
                _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet))
            };
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(round(v0)), round(v1))
        })
    }
}

/// [`panel_to_bf16_avx512`] with `vcvtne2ps2bf16`.
///
/// # Safety
/// AVX-512F/BW and AVX512-BF16 are available; sizes as asserted by [`panel_to_bf16`].
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn panel_to_bf16_avx512bf16(p: &Panel, sz: usize, k: usize, dst: &mut [u16]) {
    use std::arch::x86_64::*;
    // SAFETY: forwarded.
    unsafe {
        panel_to_bf16_body(p, sz, k, dst, |v0, v1| {
            // bf16 pairs: lanes 0..16 from `v0`, 16..32 from `v1`.
            std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(v1, v0))
        })
    }
}

/// The loop of [`panel_to_bf16_avx512`]: `round(v0, v1)` turns a row's 32 values (columns
/// 0..16, 16..32 of a step) into its 64 bytes of bf16.
///
/// # Safety
/// AVX-512F/BW are available; sizes as asserted by [`panel_to_bf16`].
#[inline(always)]
unsafe fn panel_to_bf16_body(
    p: &Panel,
    sz: usize,
    k: usize,
    dst: &mut [u16],
    round: impl Fn(std::arch::x86_64::__m512, std::arch::x86_64::__m512) -> std::arch::x86_64::__m512i,
) {
    use std::arch::x86_64::*;
    let nks = k / KSTEP;
    // Lane i < 8: quad i of row r; lane 8 + i: quad i of row r + 1 (u32 units).
    // SAFETY: AVX-512F is available (caller).
    let idx = unsafe {
        _mm512_setr_epi32(
            0, 32, 64, 96, 128, 160, 192, 224, 1, 33, 65, 97, 129, 161, 193, 225,
        )
    };
    let q = p.q.as_ptr().cast::<i32>();
    let out = dst.as_mut_ptr();
    for ks in 0..nks {
        for r in (0..ROWS).step_by(2) {
            // SAFETY (block): quads 8 ks .. 8 ks + 8 of rows r, r + 1 lie in `p.q`, scale
            // indices below `k / sz · 32`, and each row's 32 bf16 at `at` inside `dst`
            // (`at + 32 ≤ 2 k · 16`), all as asserted by `panel_to_bf16`.
            unsafe {
                let g = _mm512_i32gather_epi32::<4>(idx, q.add(ks * 8 * ROWS + r));
                let parts = [
                    _mm512_extracti32x4_epi32::<0>(g),
                    _mm512_extracti32x4_epi32::<1>(g),
                    _mm512_extracti32x4_epi32::<2>(g),
                    _mm512_extracti32x4_epi32::<3>(g),
                ];
                let v = |h: usize| {
                    let (row, c0) = (r + h / 2, h % 2 * 16);
                    let i = (ks * KSTEP + c0) / sz * ROWS + row;
                    let qf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(parts[h]));
                    _mm512_fmsub_ps(qf, _mm512_set1_ps(p.s[i]), _mm512_set1_ps(p.m[i]))
                };
                for (j, row) in [r, r + 1].into_iter().enumerate() {
                    let at = (row / TILE * nks + ks) * TILE_ELEMS + row % TILE * KSTEP;
                    _mm512_storeu_si512(out.add(at).cast(), round(v(2 * j), v(2 * j + 1)));
                }
            }
        }
    }
}

/// Rows per unit for `rows × k` on `nt` threads: whole row-tile pairs, at most
/// [`PANEL_BYTES`] of panel, chosen so the busiest thread has the fewest rows (then the
/// largest unit: fewer passes over the activations).
fn unit_rows(rows: usize, k: usize, nt: usize, panel_bytes: usize) -> usize {
    let pairs = rows.div_ceil(2 * TILE);
    let cap = (panel_bytes / (2 * k) / (2 * TILE)).clamp(1, pairs.max(1));
    let busiest = |ppu: usize| pairs.div_ceil(ppu).div_ceil(nt.max(1)) * ppu;
    let ppu = (1..=cap).rev().min_by_key(|&p| busiest(p)).unwrap_or(1);
    (ppu * 2 * TILE).min(rows.next_multiple_of(TILE))
}

/// Unpacks the unit's `nrt` row tiles from row `r0` into `panel` (`[nrt][k / 32][16][32]`
/// bf16); `row` is `[k]` f32 scratch.
fn unpack_unit(
    w: &Weights<'_>,
    r0: usize,
    nrt: usize,
    panel: &mut [u16],
    row: &mut [f32],
) -> Result<(), KernelError> {
    let k = row.len();
    let nks = k / KSTEP;
    match w {
        Weights::File(w) => {
            let rb = w.row_bytes();
            for r in 0..nrt * TILE {
                let src = &w.bytes[(r0 + r) * rb..(r0 + r + 1) * rb];
                if !unpack::dequant_fast(w.dtype, src, row) {
                    dequantize_row(w.dtype, src, row).map_err(dequant_err)?;
                }
                let at = r / TILE * nks * TILE_ELEMS + (r % TILE) * KSTEP;
                micro::to_bf16_strided(row, &mut panel[at..], TILE_ELEMS);
            }
        }
        Weights::Packed(m) => {
            let sz = m.sub_cols();
            EXPANDED.with_borrow_mut(|slot| {
                let p = match slot {
                    Some(p) if p.fits(k, sz) => p,
                    _ => slot.insert(Panel::new(k, sz)),
                };
                for pl in 0..nrt / 2 {
                    m.expand(r0 / ROWS + pl, p);
                    let tiles = 2 * pl * nks * TILE_ELEMS;
                    panel_to_bf16(p, sz, k, &mut panel[tiles..tiles + 2 * nks * TILE_ELEMS]);
                }
            });
        }
    }
    Ok(())
}

/// `out = x · Wᵀ` on AMX tiles (or their emulation): see the module docs.
pub(super) fn gemm_tiles(
    step: Step,
    w: Weights<'_>,
    x: &PackedActs,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), KernelError> {
    debug_assert_eq!(x.layout, ActLayout::Pairs);
    let (rows, k) = w.shape();
    if let Weights::Packed(_) = w {
        // Units are whole 32-row panels.
        debug_assert!(rows.is_multiple_of(ROWS));
    }
    let nks = k / KSTEP;
    let n_tp = x.n_tile_pairs();
    if n_tp == 0 {
        return Ok(());
    }
    let (panel_bytes, max_threads) = knobs();
    let nt = pool.map_or(1, |p| p.n_threads()).min(max_threads);
    let mc = unit_rows(rows, k, nt, panel_bytes);
    let n_rb = rows.div_ceil(mc);
    // Tokens split only when row blocks are fewer than the threads.
    let tc = nt.div_ceil(n_rb).clamp(1, n_tp);
    let n_units = n_rb * tc;
    let next = AtomicUsize::new(0);
    let first_err: std::sync::Mutex<Option<KernelError>> = std::sync::Mutex::new(None);
    let out_ptr = SendPtr(out.as_mut_ptr());
    let work = |t: usize, _nt: usize| {
        if t >= nt {
            return; // threads beyond DAMASCUS_AMX_THREADS
        }
        let out_ptr = &out_ptr;
        let _tiles = (step == Step::Tiles).then(TileGuard::new);
        let mut cbuf = [0f32; 4 * TILE * TILE]; // [4][16 rows][16 tokens] f32
        BUFS.with_borrow_mut(|(panel, row)| {
            panel.resize(mc * k, 0);
            row.resize(k, 0.0);
            loop {
                let u = next.fetch_add(1, Ordering::Relaxed);
                if u >= n_units {
                    break;
                }
                let (rb, tcx) = (u / tc, u % tc);
                let r0 = rb * mc;
                let nrt = (rows - r0).min(mc) / TILE; // row tiles of this unit
                if let Err(e) = unpack_unit(&w, r0, nrt, panel, row) {
                    first_err
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(e);
                    return;
                }
                for tp in split_range(n_tp, 1, tcx, tc) {
                    for rp in 0..nrt.div_ceil(2) {
                        let rt = [2 * rp, (2 * rp + 1).min(nrt - 1)];
                        let args = TileArgs {
                            a: rt.map(|j| panel[j * nks * TILE_ELEMS..].as_ptr()),
                            b: [x.tile(2 * tp, 0), x.tile(2 * tp + 1, 0)],
                            nks,
                            c: cbuf.as_mut_ptr(),
                        };
                        // SAFETY: the panel holds `nks` tiles per row tile, the activations
                        // `nks` tiles per token tile (t_pad covers tile 2 tp + 1), C is 4 KiB;
                        // the tiles are configured for `Step::Tiles`, which `gemm` only takes
                        // where AMX-BF16 is available.
                        unsafe { run_step(step, &args) };
                        for i in 0..2 {
                            let t0 = (2 * tp + i) * TILE;
                            let valid = x.n_tokens.saturating_sub(t0).min(TILE);
                            for j in 0..2 {
                                if valid == 0 || (j == 1 && rt[1] == rt[0]) {
                                    continue; // padding tokens, or the duplicate of an odd tile
                                }
                                let col = r0 + rt[j] * TILE;
                                // SAFETY: tokens t0..t0+valid and columns col..col+16 lie in
                                // `out` ([n_tokens, rows]); units own disjoint (row block,
                                // token range) rectangles.
                                let dst = unsafe { out_ptr.0.add(t0 * rows + col) };
                                let tile = &cbuf[(2 * i + j) * TILE * TILE..][..TILE * TILE];
                                // SAFETY: as above, `valid` rows of 16 floats at stride `rows`.
                                unsafe { micro::store_transposed(tile, dst, rows, valid) };
                            }
                        }
                    }
                }
            }
        });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::int8::tests::{TYPES, cols_for};
    use crate::gemm::tests::{quantized, rand_vec};
    use crate::gemm::{GemmPath, GgmlType, gemm_ref};

    fn check(dtype: GgmlType, rows: usize, k: usize, n_tokens: usize, pool: Option<&ThreadPool>) {
        check_on(false, dtype, rows, k, n_tokens, pool);
    }

    /// The driver on a repacked matrix against the reference on the same file blocks.
    fn check_packed(
        dtype: GgmlType,
        rows: usize,
        k: usize,
        n_tokens: usize,
        pool: Option<&ThreadPool>,
    ) {
        check_on(true, dtype, rows, k, n_tokens, pool);
    }

    /// The emulated driver (and, where AMX exists, the tiles) on the file's blocks or on the
    /// repacked matrix, against `gemm_ref` on the file's blocks.
    fn check_on(
        packed: bool,
        dtype: GgmlType,
        rows: usize,
        k: usize,
        n_tokens: usize,
        pool: Option<&ThreadPool>,
    ) {
        let bytes = quantized(dtype, rows, k, (rows * 17 + k) as u64);
        let w = WeightRef {
            dtype,
            bytes: &bytes,
            rows,
            cols: k,
        };
        let m = packed.then(|| PackedMatrix::pack(w, pool).unwrap());
        let src = m.as_ref().map_or(Weights::File(w), Weights::Packed);
        let xs = rand_vec(n_tokens * k, 3 + n_tokens as u64);
        let xr = PackedActs::new(&xs, n_tokens, k).unwrap();
        let xp = PackedActs::with_layout(ActLayout::Pairs, &xs, n_tokens, k, pool).unwrap();
        let mut want = vec![0f32; n_tokens * rows];
        gemm_ref(w, &xr, &mut want).unwrap();
        let mut got = vec![f32::NAN; n_tokens * rows];
        gemm_tiles(Step::Emulated, src, &xp, &mut got, pool).unwrap();
        let mut runs = vec![("emulated", got)];
        if GemmPath::Amx.is_available() {
            let mut got = vec![f32::NAN; n_tokens * rows];
            match &m {
                Some(m) => m.gemm_amx(&xp, &mut got, pool).unwrap(),
                None => gemm_tiles(Step::Tiles, src, &xp, &mut got, pool).unwrap(),
            }
            runs.push(("tiles", got));
        }
        let scale = (k as f32).sqrt();
        for (how, got) in runs {
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - e).abs() <= 2e-5 * scale * (1.0 + e.abs()),
                    "{how} packed={packed} {dtype:?} rows={rows} k={k} T={n_tokens} at \
                     [{}, {}]: {g} vs {e}",
                    i / rows,
                    i % rows
                );
            }
        }
    }

    #[test]
    fn the_tile_configuration_is_palette_1_with_eight_full_tiles() {
        let b = CONFIG.bytes();
        assert_eq!((b[0], b[1]), (1, 0), "palette 1, start row 0");
        for t in 0..8 {
            assert_eq!(
                u16::from_le_bytes([b[16 + 2 * t], b[17 + 2 * t]]),
                64,
                "colsb[{t}]"
            );
            assert_eq!(b[48 + t], 16, "rows[{t}]");
        }
        assert!(
            b[2..16]
                .iter()
                .chain(&b[32..48])
                .chain(&b[56..])
                .all(|&v| v == 0)
        );
    }

    #[test]
    fn emulated_driver_matches_reference_on_awkward_shapes() {
        for &t in &[1, 3, 7, 16, 33, 47] {
            check(GgmlType::Q4_K, 48, 512, t, None);
        }
        check(GgmlType::Q6_K, 16, 256, 5, None); // one row tile: the duplicate pair
        check(GgmlType::Q8_0, 80, 96, 17, None);
        check(GgmlType::Q4_1, 16 * 7, 32 * 3, 2, None);
        let pool = ThreadPool::new(3);
        check(GgmlType::Q4_K, 16 * 11, 768, 65, Some(&pool));
        check(GgmlType::Q6_K, 16, 256, 100, Some(&pool)); // one row block, tokens split
        check(GgmlType::Q5_0, 16 * 9, 64, 33, Some(&pool));
    }

    #[test]
    fn emulated_driver_on_repacked_weights_matches_reference() {
        for dtype in TYPES {
            for k in cols_for(dtype) {
                for &t in &[1, 3, 7, 33] {
                    check_packed(dtype, 64, k, t, None);
                }
            }
        }
        check_packed(GgmlType::Q4_K, 32, 256, 17, None); // one panel: one row-tile pair
        let pool = ThreadPool::new(3);
        check_packed(GgmlType::Q4_K, 32 * 7, 768, 65, Some(&pool));
        check_packed(GgmlType::Q6_K, 32, 256, 100, Some(&pool)); // one row block, tokens split
        check_packed(GgmlType::Q5_0, 32 * 5, 32, 47, Some(&pool));
        // Shape errors are errors.
        let bytes = quantized(GgmlType::Q4_K, 32, 256, 1);
        let w = WeightRef {
            dtype: GgmlType::Q4_K,
            bytes: &bytes,
            rows: 32,
            cols: 256,
        };
        let m = PackedMatrix::pack(w, None).unwrap();
        let xs = rand_vec(3 * 512, 2);
        let x = PackedActs::with_layout(ActLayout::Pairs, &xs, 3, 512, None).unwrap();
        assert!(m.check_amx(&x, &[0.0; 96]).is_err());
        assert!(m.gemm_amx(&x, &mut [0.0; 96], None).is_err());
    }

    #[test]
    fn panel_to_bf16_matches_its_scalar_twin_bit_for_bit() {
        for dtype in TYPES {
            for k in cols_for(dtype) {
                let bytes = quantized(dtype, 64, k, k as u64 + 11);
                let w = WeightRef {
                    dtype,
                    bytes: &bytes,
                    rows: 64,
                    cols: k,
                };
                let m = PackedMatrix::pack(w, None).unwrap();
                let sz = m.sub_cols();
                let mut p = Panel::new(k, sz);
                for panel in 0..2 {
                    m.expand(panel, &mut p);
                    let mut want = vec![0u16; 2 * k * TILE];
                    panel_to_bf16_scalar(&p, sz, k, &mut want);
                    let mut got = vec![0xFFFFu16; 2 * k * TILE];
                    panel_to_bf16(&p, sz, k, &mut got);
                    assert_eq!(got, want, "{dtype:?} k={k} panel {panel}");
                    let f = crate::cpu::CpuFeatures::allowed();
                    if f.avx512bw {
                        let mut v = vec![0xFFFFu16; 2 * k * TILE];
                        // SAFETY: AVX-512F/BW present; sizes as `panel_to_bf16` asserts.
                        unsafe { panel_to_bf16_avx512(&p, sz, k, &mut v) };
                        assert_eq!(v, want, "avx512 {dtype:?} k={k} panel {panel}");
                    }
                    if f.avx512bw && f.avx512bf16 {
                        let mut v = vec![0xFFFFu16; 2 * k * TILE];
                        // SAFETY: as above, and AVX512-BF16 present.
                        unsafe { panel_to_bf16_avx512bf16(&p, sz, k, &mut v) };
                        assert_eq!(v, want, "avx512bf16 {dtype:?} k={k} panel {panel}");
                    }
                    // And the values are the packed matrix's rows.
                    let mut row = vec![0f32; k];
                    for r in [0, 15, 16, 31] {
                        m.dequant_row(panel * ROWS + r, &mut row).unwrap();
                        for (c, &v) in row.iter().enumerate() {
                            let at = (r / TILE * (k / KSTEP) + c / KSTEP) * TILE_ELEMS
                                + r % TILE * KSTEP
                                + c % KSTEP;
                            let g = crate::gemm::bf16_to_f32(got[at]);
                            assert!(
                                (g - v).abs() <= v.abs() / 128.0 + 1e-6,
                                "{dtype:?} k={k} row {r} col {c}: {g} vs {v}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn units_split_rows_evenly_within_the_panel_budget() {
        assert_eq!(unit_rows(3072, 3072, 16, PANEL_BYTES), 96); // 32 units: 2 per thread
        assert_eq!(unit_rows(1024, 3072, 16, PANEL_BYTES), 64);
        assert_eq!(unit_rows(3072, 8192, 16, PANEL_BYTES), 32); // 512 KiB of panel at k = 8192
        assert_eq!(unit_rows(8192, 3072, 16, PANEL_BYTES), 64); // 128 units: 8 per thread
        assert_eq!(unit_rows(3072, 3072, 16, 1280 << 10), 192);
        assert_eq!(unit_rows(16, 256, 4, PANEL_BYTES), 16);
        assert_eq!(unit_rows(48, 256, 1, PANEL_BYTES), 48);
        assert_eq!(unit_rows(64, 1 << 20, 1, PANEL_BYTES), 32); // at least one row-tile pair
    }
}
