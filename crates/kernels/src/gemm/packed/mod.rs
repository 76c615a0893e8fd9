//! Weights repacked at load for the int8 paths ([`super::int8`]): 32 rows interleaved per
//! panel, quants in the order `vpdpbusd` reads them, sub-block scales and mins pre-unpacked.
//! A [`PackedMatrix`] replaces the file's blocks for every use: prompt GEMMs expand a panel
//! with a few byte operations (no per-row shuffles, no 6-bit scale decoding), and decode
//! multiplies the packed bytes directly ([`PackedMatrix::gemv_panels`]), so the mapping is not
//! read again and memory is not doubled.
//!
//! # Layout
//!
//! Panel `p` holds rows `32 p .. 32 p + 32`, `k / B` chunks of `B` columns (`B` = 256 for the
//! K-quants, 32 for the legacy types). A chunk is a head (per-row f16 fields), then per
//! sub-block of `S` columns its per-row scales followed by its `S / 4` *quad records*, so a
//! kernel walks the bytes strictly forward (a layout with all of a chunk's scales first and the
//! records after measured half the DRAM bandwidth: the hardware prefetcher lost the stream). In a
//! record, value `P = 4 r + c` is row `r`'s column `4 kq + c`, exactly the byte order of the
//! expanded panel (`[k / 4][32 rows][4]`, two 64-byte vectors):
//!
//! | quants | record bytes | value `P` |
//! | --- | ---: | --- |
//! | 4-bit (Q4_K, Q4_0, Q4_1) | 64 | nibble `P >> 6` of byte `P & 63` |
//! | 5-bit (Q5_K, Q5_0, Q5_1) | 64 + 16 | the nibble, plus bit 4 from bit `P` of bytes 64..80 |
//! | 6-bit (Q6_K) | 64 + 32 | the nibble, plus bits 4-5 from bits `2 (P >> 5)` of byte `64 + (P & 31)` |
//! | 8-bit (Q8_0, biased by 128) | 128 | byte `P` |
//!
//! so one 64-byte load and an `and`/shift give both vectors of a quad, and the high bits come
//! from a mask (`vpaddb` under a 64-bit mask) or one variable shift. Scales are `[32 rows]`
//! per field, so a vector load takes them for 16 rows:
//!
//! | type | head | per sub-block `j` | `s`, `m` of sub-block `j` |
//! | --- | --- | --- | --- |
//! | Q4_K / Q5_K | `d`, `dmin` f16; `hi` u32 | `lo_j` u8 | `d · sc_j`, `dmin · mn_j` |
//! | Q6_K | `d` f16 | `sc_j` i8 | `d · sc_j`, `32 d · sc_j` |
//! | Q8_0 / Q4_0 / Q5_0 | `d` f16 | — | `d`, `128 d` / `8 d` / `16 d` |
//! | Q4_1 / Q5_1 | `d`, `m` f16 | — | `d`, `−m` |
//!
//! where Q4_K/Q5_K's 6-bit `sc_j` and `mn_j` are split: `lo_j = sc_j & 15 | (mn_j & 15) << 4`
//! in front of sub-block `j`, and the high two bits of all eight sub-blocks in the head's
//! `hi` (bits `2 j` for `sc_j >> 4`, `16 + 2 j` for `mn_j >> 4`), so one shift and two
//! `and`/`or`s rebuild them 16 rows at a time. Every packed matrix is exactly as large as the
//! file's blocks (decode reads no more bytes than from the mapping; a byte per 6-bit field
//! measured +2.8 % on the Q4_K tensors). `s` and `m` are the same f32
//! products [`super::int8`]'s unpacker forms, and every kernel here does the int8 GEMM's
//! arithmetic in the same order, so results equal [`super::int8::gemm_i8_ref`] on the file's
//! blocks (tested on every path).

use std::ops::Range;

use damascus_quant::GgmlType;
use damascus_quant::fp::fp16_to_f32;

use crate::hugebuf::HugeBuf;
use crate::pool::ThreadPool;
use crate::quantdot::KernelError;

use super::WeightRef;
use super::int8::{Int8Path, NT, Panel, QActs, ROWS, TileStep, gemm_panels};

/// Quant storage of a packed type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Quants {
    Nib,
    Nib1,
    Nib2,
    Byte,
}

/// Scale storage of a packed type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scales {
    /// Q4_K / Q5_K: d, dmin, 8 × (sc, mn) per 256.
    K4,
    /// Q6_K: d, 16 × sc per 256.
    K6,
    /// d per 32, `m = c · d`.
    D,
    /// d and m per 32, offset `−m`.
    Dm,
}

const Q_NIB: u8 = 0;
const Q_NIB1: u8 = 1;
const Q_NIB2: u8 = 2;
const Q_BYTE: u8 = 3;
const S_K4: u8 = 0;
const S_K6: u8 = 1;
const S_D: u8 = 2;
const S_DM: u8 = 3;

impl Quants {
    const fn id(self) -> u8 {
        match self {
            Quants::Nib => Q_NIB,
            Quants::Nib1 => Q_NIB1,
            Quants::Nib2 => Q_NIB2,
            Quants::Byte => Q_BYTE,
        }
    }
}

impl Scales {
    const fn id(self) -> u8 {
        match self {
            Scales::K4 => S_K4,
            Scales::K6 => S_K6,
            Scales::D => S_D,
            Scales::Dm => S_DM,
        }
    }
}

/// Bytes of one quad record.
const fn rec_bytes(q: u8) -> usize {
    match q {
        Q_NIB => 64,
        Q_NIB1 => 80,
        Q_NIB2 => 96,
        _ => 128,
    }
}

/// Bytes of a chunk's head: the per-row f16 fields (`d`, and `dmin` or `m`), and for
/// Q4_K/Q5_K the per-row u32 of the scales' and mins' high bits ([`K4_HI`]).
const fn head_bytes(s: u8) -> usize {
    match s {
        S_K4 => 256,
        S_DM => 128,
        _ => 64,
    }
}

/// Offset in a Q4_K/Q5_K chunk of the `[32 rows]` u32 holding the high 2 bits of every
/// sub-block's 6-bit scale and min: bits `2 j .. 2 j + 2` are `sc_j >> 4`, bits
/// `16 + 2 j .. 18 + 2 j` are `mn_j >> 4`.
const K4_HI: usize = 128;

/// Bytes of the per-row sub-block scales in front of each sub-block's records (`[32]` u8 of
/// `sc & 15 | (mn & 15) << 4` for Q4_K/Q5_K, `sc` `[32]` i8 for Q6_K; none for the legacy
/// types, whose chunk is one sub-block scaled by the head).
const fn sub_head(s: u8) -> usize {
    match s {
        S_K4 | S_K6 => 32,
        _ => 0,
    }
}

/// Columns per chunk.
const fn chunk_cols(s: u8) -> usize {
    match s {
        S_K4 | S_K6 => 256,
        _ => 32,
    }
}

/// Columns per sub-block (one scale).
const fn sub_cols(s: u8) -> usize {
    if s == S_K6 { 16 } else { 32 }
}

/// Bytes of one sub-block: its scales, then its quad records.
const fn sub_bytes(q: u8, s: u8) -> usize {
    sub_head(s) + sub_cols(s) / 4 * rec_bytes(q)
}

/// Bytes of one chunk.
const fn chunk_bytes(q: u8, s: u8) -> usize {
    head_bytes(s) + chunk_cols(s) / sub_cols(s) * sub_bytes(q, s)
}

/// Offset in its chunk of sub-block `j`'s scales.
const fn sub_at(q: u8, s: u8, j: usize) -> usize {
    head_bytes(s) + j * sub_bytes(q, s)
}

/// Offset in its chunk of the quad record holding local column `li`.
const fn rec_at(q: u8, s: u8, li: usize) -> usize {
    let sz = sub_cols(s);
    sub_at(q, s, li / sz) + sub_head(s) + li % sz / 4 * rec_bytes(q)
}

/// How `dtype` is packed: quants, scales and the `m = c · d` factor of [`Scales::D`].
fn format(dtype: GgmlType) -> Option<(Quants, Scales, f32)> {
    Some(match dtype {
        GgmlType::Q4_K => (Quants::Nib, Scales::K4, 0.0),
        GgmlType::Q5_K => (Quants::Nib1, Scales::K4, 0.0),
        GgmlType::Q6_K => (Quants::Nib2, Scales::K6, 0.0),
        GgmlType::Q8_0 => (Quants::Byte, Scales::D, 128.0),
        GgmlType::Q4_0 => (Quants::Nib, Scales::D, 8.0),
        GgmlType::Q5_0 => (Quants::Nib1, Scales::D, 16.0),
        GgmlType::Q4_1 => (Quants::Nib, Scales::Dm, 0.0),
        GgmlType::Q5_1 => (Quants::Nib1, Scales::Dm, 0.0),
        _ => return None,
    })
}

/// `$go!(Q, S)` with the const format ids of `($quants, $scales)` (the pairs [`format`]
/// makes), for the kernels generic over the format.
macro_rules! with_format {
    ($quants:expr, $scales:expr, $go:ident) => {
        match ($quants, $scales) {
            (Quants::Nib, Scales::K4) => $go!(Q_NIB, S_K4),
            (Quants::Nib1, Scales::K4) => $go!(Q_NIB1, S_K4),
            (Quants::Nib2, Scales::K6) => $go!(Q_NIB2, S_K6),
            (Quants::Byte, Scales::D) => $go!(Q_BYTE, S_D),
            (Quants::Nib, Scales::D) => $go!(Q_NIB, S_D),
            (Quants::Nib1, Scales::D) => $go!(Q_NIB1, S_D),
            (Quants::Nib, Scales::Dm) => $go!(Q_NIB, S_DM),
            (Quants::Nib1, Scales::Dm) => $go!(Q_NIB1, S_DM),
            _ => unreachable!("format() pairs"),
        }
    };
}

/// Whether `dtype` has a packed layout.
pub fn can_pack(dtype: GgmlType) -> bool {
    format(dtype).is_some()
}

/// `f(first_row_or_panel, bytes)`: fills a buffer, or fails with `E`.
type ReadPanel<'a, E> = dyn Fn(usize, &mut [u8]) -> Result<(), E> + Sync + 'a;

/// A weight matrix in the packed layout (see the module docs).
pub struct PackedMatrix {
    dtype: GgmlType,
    rows: usize,
    cols: usize,
    quants: Quants,
    scales: Scales,
    /// `m = mmul · d` for [`Scales::D`].
    mmul: f32,
    /// Bytes per panel (a multiple of 64).
    panel_bytes: usize,
    /// `[rows / 32][panel_bytes]`, in a huge-page mapping ([`crate::hugebuf`]): fresh pages
    /// are faulted in (and cleared by the kernel) by the threads that pack into them, in
    /// parallel, and 2 MiB pages make both that and decode's streaming cheaper in TLB misses
    /// (with 4 KiB pages the page clearing alone took 30 % of the load on a VM).
    data: HugeBuf<u8>,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedMatrix")
            .field("dtype", &self.dtype)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("bytes", &self.n_bytes())
            .finish()
    }
}

/// One row's fields for [`PackedMatrix::pack_panel`]: the file's block `blk` of a chunk into
/// the chunk `dst`, quants stored as `q`.
fn put_scales(dtype: GgmlType, q: u8, blk: &[u8], r: usize, dst: &mut [u8]) {
    let sk = format(dtype).map_or(S_D, |f| f.1.id());
    let at = |j: usize| sub_at(q, sk, j);
    let mut f16_at = |at: usize, lo: u8, hi: u8| {
        dst[at + 2 * r] = lo;
        dst[at + 2 * r + 1] = hi;
    };
    match dtype {
        GgmlType::Q4_K | GgmlType::Q5_K => {
            f16_at(0, blk[0], blk[1]);
            f16_at(64, blk[2], blk[3]);
            let sc = &blk[4..16];
            let mut hi = 0u32;
            for j in 0..8 {
                let (s, m) = if j < 4 {
                    (sc[j] & 63, sc[j + 4] & 63)
                } else {
                    (
                        (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4),
                        (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4),
                    )
                };
                dst[at(j) + r] = (s & 15) | ((m & 15) << 4);
                hi |= u32::from(s >> 4) << (2 * j) | u32::from(m >> 4) << (16 + 2 * j);
            }
            dst[K4_HI + 4 * r..K4_HI + 4 * r + 4].copy_from_slice(&hi.to_le_bytes());
        }
        GgmlType::Q6_K => {
            f16_at(0, blk[208], blk[209]);
            for j in 0..16 {
                dst[at(j) + r] = blk[192 + j];
            }
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 => {
            f16_at(0, blk[0], blk[1]);
            f16_at(64, blk[2], blk[3]);
        }
        _ => f16_at(0, blk[0], blk[1]),
    }
}

#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    fp16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// `(s, m)` of row `r` in the chunk `sc` (quants stored as `q`), for its sub-block `j`.
#[inline(always)]
fn scale_of(s: Scales, q: u8, mmul: f32, sc: &[u8], j: usize, r: usize) -> (f32, f32) {
    let so = sub_at(q, s.id(), j);
    match s {
        Scales::K4 => {
            let hi = u32::from_le_bytes([0, 1, 2, 3].map(|i| sc[K4_HI + 4 * r + i]));
            let lo = sc[so + r];
            let scv = u32::from(lo & 15) | ((hi >> (2 * j)) & 3) << 4;
            let mnv = u32::from(lo >> 4) | ((hi >> (16 + 2 * j)) & 3) << 4;
            (
                f16_at(sc, 2 * r) * scv as f32,
                f16_at(sc, 64 + 2 * r) * mnv as f32,
            )
        }
        Scales::K6 => {
            let v = f16_at(sc, 2 * r) * f32::from(sc[so + r] as i8);
            (v, 32.0 * v)
        }
        Scales::D => {
            let d = f16_at(sc, 2 * r);
            (d, mmul * d)
        }
        Scales::Dm => (f16_at(sc, 2 * r), -f16_at(sc, 64 + 2 * r)),
    }
}

/// Value `p` (`4 r + c`) of a quad record.
#[inline(always)]
fn value_of(q: Quants, rec: &[u8], p: usize) -> u8 {
    let lo = |rec: &[u8]| (rec[p & 63] >> (4 * (p >> 6))) & 0xF;
    match q {
        Quants::Nib => lo(rec),
        Quants::Nib1 => lo(rec) | (((rec[64 + (p >> 3)] >> (p & 7)) & 1) << 4),
        Quants::Nib2 => lo(rec) | (((rec[64 + (p & 31)] >> (2 * (p >> 5))) & 3) << 4),
        Quants::Byte => rec[p],
    }
}

/// The 128 expanded bytes of a quad (`[32 rows][4]`) into its zeroed record.
fn compress_record(q: Quants, src: &[u8], rec: &mut [u8]) {
    if q == Quants::Byte {
        rec.copy_from_slice(&src[..128]);
        return;
    }
    let (lo, hi) = src.split_at(64);
    for ((o, &a), &b) in rec[..64].iter_mut().zip(lo).zip(hi) {
        *o = (a & 0xF) | (b << 4);
    }
    match q {
        Quants::Nib1 => {
            for (p, &v) in src.iter().enumerate() {
                rec[64 + (p >> 3)] |= ((v >> 4) & 1) << (p & 7);
            }
        }
        Quants::Nib2 => {
            for (g, part) in src.chunks_exact(32).enumerate() {
                for (o, &v) in rec[64..96].iter_mut().zip(part) {
                    *o |= ((v >> 4) & 3) << (2 * g);
                }
            }
        }
        _ => {}
    }
}

impl PackedMatrix {
    /// Why `w` cannot be packed, if it cannot (type, shape, byte count).
    pub fn unsupported(w: &WeightRef<'_>) -> Option<String> {
        if format(w.dtype).is_none() {
            return Some(format!("no packed layout for {:?}", w.dtype));
        }
        super::int8::unsupported(w)
    }

    /// Packs `w` (the file's blocks), panels split over `pool`.
    pub fn pack(w: WeightRef<'_>, pool: Option<&ThreadPool>) -> Result<PackedMatrix, KernelError> {
        if let Some(why) = Self::unsupported(&w) {
            return Err(KernelError::BadShape(format!("repack: {why}")));
        }
        let mut m = Self::zeroed(w.dtype, w.rows, w.cols)?;
        let rb = w.row_bytes();
        let mut data = std::mem::replace(&mut m.data, HugeBuf::zeroed(0)?);
        let r = fill_panels(&mut data, m.panel_bytes, pool, &|p, dst| {
            m.pack_panel(&w.bytes[p * ROWS * rb..(p + 1) * ROWS * rb], dst);
            Ok(())
        });
        m.data = data;
        r.map_err(|()| KernelError::BadShape("repack failed".into()))?;
        Ok(m)
    }

    /// Packs a `[rows, cols]` `dtype` matrix whose file blocks `read(row0, buf)` copies, 32
    /// rows at a time (`buf` is `[32, row_bytes]`); panels split over `pool`. This is how a
    /// backend packs from the file without touching the mapping.
    pub fn pack_from<E: Send>(
        dtype: GgmlType,
        rows: usize,
        cols: usize,
        pool: Option<&ThreadPool>,
        read: &ReadPanel<'_, E>,
    ) -> Result<Result<PackedMatrix, E>, KernelError> {
        let rb = cols / dtype.block_size().max(1) * dtype.type_size();
        if rows == 0 {
            return Err(KernelError::BadShape(format!(
                "repack: [{rows}, {cols}] {dtype:?}"
            )));
        }
        let mut m = Self::zeroed(dtype, rows, cols)?;
        let first = std::sync::Mutex::new(None);
        let mut data = std::mem::replace(&mut m.data, HugeBuf::zeroed(0)?);
        let res = fill_panels(&mut data, m.panel_bytes, pool, &|p, dst| {
            let mut buf = vec![0u8; ROWS * rb]; // [32, row_bytes] file blocks
            match read(p * ROWS, &mut buf) {
                Ok(()) => {
                    m.pack_panel(&buf, dst);
                    Ok(())
                }
                Err(e) => {
                    let mut g = first.lock().unwrap_or_else(|p| p.into_inner());
                    g.get_or_insert(e);
                    Err(())
                }
            }
        });
        m.data = data;
        if res.is_err()
            && let Some(e) = first.into_inner().unwrap_or_else(|p| p.into_inner())
        {
            return Ok(Err(e));
        }
        Ok(Ok(m))
    }

    /// A zero matrix of the right size (checked against the type's geometry).
    fn zeroed(dtype: GgmlType, rows: usize, cols: usize) -> Result<PackedMatrix, KernelError> {
        let (quants, scales, mmul) = format(dtype)
            .ok_or_else(|| KernelError::BadShape(format!("repack: no layout for {dtype:?}")))?;
        let cc = chunk_cols(scales.id());
        if cols == 0 || !cols.is_multiple_of(cc) || !rows.is_multiple_of(ROWS) {
            return Err(KernelError::BadShape(format!(
                "repack: [{rows}, {cols}] {dtype:?}"
            )));
        }
        let panel_bytes = cols / cc * chunk_bytes(quants.id(), scales.id());
        let bytes = (rows / ROWS)
            .checked_mul(panel_bytes)
            .filter(|&b| b <= isize::MAX as usize - 64)
            .ok_or_else(|| KernelError::BadShape(format!("repack: [{rows}, {cols}] overflows")))?;
        Ok(PackedMatrix {
            dtype,
            rows,
            cols,
            quants,
            scales,
            mmul,
            panel_bytes,
            data: HugeBuf::zeroed(bytes)?,
        })
    }

    /// Packs 32 rows of file blocks (`[32, row_bytes]`) into one zeroed panel: the int8
    /// GEMM's unpacker makes the expanded panel, whose quad records are then compressed (and
    /// the integer scales copied from the blocks).
    fn pack_panel(&self, raw: &[u8], dst: &mut [u8]) {
        let (k, dtype) = (self.cols, self.dtype);
        let (q, s) = (self.quants.id(), self.scales.id());
        let (cc, cb) = (chunk_cols(s), chunk_bytes(q, s));
        let ts = dtype.type_size();
        let rb = k / dtype.block_size() * ts;
        let mut p = Panel::new(k, sub_cols(s));
        let w = WeightRef {
            dtype,
            bytes: raw,
            rows: ROWS,
            cols: k,
        };
        p.fill(&w, 0);
        for r in 0..ROWS {
            let row = &raw[r * rb..(r + 1) * rb];
            for c in 0..k / cc {
                // A chunk is one file block (B = the type's block size).
                let chunk = &mut dst[c * cb..(c + 1) * cb];
                put_scales(dtype, q, &row[c * ts..(c + 1) * ts], r, chunk);
            }
        }
        let quads = quads_as_bytes(&p.q);
        for (kq, src) in quads.chunks_exact(128).enumerate() {
            let (c, lkq) = (kq / (cc / 4), kq % (cc / 4));
            let at = c * cb + rec_at(q, s, 4 * lkq);
            compress_record(self.quants, src, &mut dst[at..at + rec_bytes(q)]);
        }
    }

    /// Block type.
    pub fn dtype(&self) -> GgmlType {
        self.dtype
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held.
    pub fn n_bytes(&self) -> usize {
        self.data.len()
    }

    /// Panel `p`'s bytes.
    fn panel(&self, p: usize) -> &[u8] {
        let l = self.panel_bytes;
        &self.data[p * l..(p + 1) * l]
    }

    /// Row `r` as `s · q − m` (the values every kernel here multiplies), into `out` `[cols]`.
    pub fn dequant_row(&self, r: usize, out: &mut [f32]) -> Result<(), KernelError> {
        if r >= self.rows || out.len() != self.cols {
            return Err(KernelError::BadShape(format!(
                "packed row {r} of [{}, {}] into {} values",
                self.rows,
                self.cols,
                out.len()
            )));
        }
        let (q, s) = (self.quants.id(), self.scales.id());
        let (cc, cb, sz) = (chunk_cols(s), chunk_bytes(q, s), sub_cols(s));
        let panel = self.panel(r / ROWS);
        let rr = r % ROWS;
        for (c, o) in out.chunks_exact_mut(cc).enumerate() {
            let chunk = &panel[c * cb..(c + 1) * cb];
            for (li, v) in o.iter_mut().enumerate() {
                let rec = &chunk[rec_at(q, s, li)..];
                let qv = value_of(self.quants, rec, 4 * rr + li % 4);
                let (sv, mv) = scale_of(self.scales, q, self.mmul, chunk, li / sz, rr);
                *v = sv * f32::from(qv) - mv;
            }
        }
        Ok(())
    }

    /// Columns per sub-block (one scale): `S` of the expanded panel.
    pub(super) fn sub_cols(&self) -> usize {
        sub_cols(self.scales.id())
    }

    /// Expands panel `p` into the int8 GEMM's panel (`[k / 4][32][4]` u8, `[k / S][32]` f32):
    /// with AVX-512BW two vector `and`/shifts per record (the high bits through a byte mask
    /// or a variable shift) and the scales sixteen rows per multiply; else
    /// [`PackedMatrix::expand_scalar`], its twin (the same values bit for bit).
    pub(super) fn expand(&self, p: usize, dst: &mut Panel) {
        let (k, sz) = (self.cols, sub_cols(self.scales.id()));
        assert!(
            p < self.rows / ROWS
                && dst.q.len() >= k / 4 * ROWS
                && dst.s.len() >= k / sz * ROWS
                && dst.m.len() >= k / sz * ROWS
        );
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::CpuFeatures::allowed().avx512bw {
            let panel = self.panel(p);
            macro_rules! go {
                ($q:ident, $s:ident) => {
                    // SAFETY: AVX-512F/BW are present (BW implies F here); `panel` is a whole
                    // panel of this format, `dst` as asserted above.
                    unsafe { vnni::expand::<$q, $s>(panel, self.cols, self.mmul, dst) }
                };
            }
            return with_format!(self.quants, self.scales, go);
        }
        self.expand_scalar(p, dst)
    }

    /// Scalar twin of [`PackedMatrix::expand`].
    pub(super) fn expand_scalar(&self, p: usize, dst: &mut Panel) {
        let (q, s) = (self.quants.id(), self.scales.id());
        let (cc, cb, sz) = (chunk_cols(s), chunk_bytes(q, s), sub_cols(s));
        let rbq = rec_bytes(q);
        let panel = self.panel(p);
        let nsub = cc / sz;
        let dq = quads_as_bytes_mut(&mut dst.q);
        for c in 0..self.cols / cc {
            let chunk = &panel[c * cb..(c + 1) * cb];
            for j in 0..nsub {
                for r in 0..ROWS {
                    let (sv, mv) = scale_of(self.scales, q, self.mmul, chunk, j, r);
                    dst.s[(c * nsub + j) * ROWS + r] = sv;
                    dst.m[(c * nsub + j) * ROWS + r] = mv;
                }
            }
            for kq in 0..cc / 4 {
                let rec: &[u8] = &chunk[rec_at(q, s, 4 * kq)..][..rbq];
                let out: &mut [u8] = &mut dq[(c * cc / 4 + kq) * 128..][..128];
                expand_record(self.quants, rec, out);
            }
        }
    }

    /// `out = x · Wᵀ` (`out` `[n_tokens, rows]`) for a prompt: units of 32 rows × a token
    /// range over `pool`, each panel expanded once per unit and multiplied by `path`'s
    /// micro-kernel.
    pub fn gemm(
        &self,
        path: Int8Path,
        x: &QActs,
        out: &mut [f32],
        pool: Option<&ThreadPool>,
    ) -> Result<(), KernelError> {
        self.check(path, x, out.len(), x.n_tokens * self.rows)?;
        if x.n_tokens == 0 {
            return Ok(());
        }
        let sz = sub_cols(self.scales.id());
        gemm_panels(
            path,
            TileStep::Tiles,
            self.rows,
            self.cols,
            sz,
            x,
            out,
            pool,
            &|p, r0| self.expand(r0 / ROWS, p),
            true,
        );
        Ok(())
    }

    /// `out = x · Wᵀ` (`out` `[n_tokens, rows]`) for a prompt on AMX-BF16 tiles
    /// ([`super::GemmPath::Amx`], activations packed for it as [`super::ActLayout::Pairs`]):
    /// the AMX driver's units expand each 32-row panel and round it to bf16 row tiles, so
    /// AMX hosts keep one copy of the weights, the repacked one, for prompts and decode.
    pub fn gemm_amx(
        &self,
        x: &super::PackedActs,
        out: &mut [f32],
        pool: Option<&ThreadPool>,
    ) -> Result<(), KernelError> {
        use super::GemmPath;
        if !GemmPath::Amx.is_available() || x.layout != GemmPath::Amx.act_layout() {
            return Err(KernelError::BadShape(format!(
                "packed amx gemm: AMX unavailable or activations packed as {:?}",
                x.layout
            )));
        }
        self.check_amx(x, out)?;
        #[cfg(target_arch = "x86_64")]
        return super::amx::gemm_tiles(
            super::amx::Step::Tiles,
            super::amx::Weights::Packed(self),
            x,
            out,
            pool,
        );
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = pool;
            unreachable!("AMX is x86-64 only")
        }
    }

    /// Shape checks of [`PackedMatrix::gemm_amx`].
    pub(super) fn check_amx(&self, x: &super::PackedActs, out: &[f32]) -> Result<(), KernelError> {
        if x.k != self.cols || out.len() != x.n_tokens * self.rows {
            return Err(KernelError::BadShape(format!(
                "packed amx gemm: [{}, {}] activations, [{}, {}] weights, {} outputs",
                x.n_tokens,
                x.k,
                self.rows,
                self.cols,
                out.len()
            )));
        }
        Ok(())
    }

    /// Panels `panels` (rows `32 · panels`) times every token of `x`, straight from the
    /// packed bytes (no expansion: decode's path): `out[t · stride + (r − 32 · panels.start)]`.
    pub fn gemv_panels(
        &self,
        path: Int8Path,
        x: &QActs,
        panels: Range<usize>,
        out: &mut [f32],
        stride: usize,
    ) -> Result<(), KernelError> {
        let n_rows = panels.len() * ROWS;
        let need = if x.n_tokens == 0 {
            0
        } else {
            (x.n_tokens - 1) * stride + n_rows
        };
        if panels.end > self.rows / ROWS || stride < n_rows {
            return Err(KernelError::BadShape(format!(
                "packed gemv: panels {panels:?} of {} with stride {stride}",
                self.rows / ROWS
            )));
        }
        self.check(path, x, out.len().min(need), need)?;
        for (i, p) in panels.enumerate() {
            let panel = self.panel(p);
            let mut t = 0;
            while t < x.n_tokens {
                let n = (x.n_tokens - t).min(NT);
                let o = &mut out[t * stride + i * ROWS..];
                // SAFETY: the path is available (checked); tokens t..t + n < n_tokens, and
                // `o` holds rows 0..32 of token j at j · stride (`need` ≤ out.len()).
                unsafe { self.micro(path, panel, x, t, n, o.as_mut_ptr(), stride) };
                t += n;
            }
        }
        Ok(())
    }

    fn check(
        &self,
        path: Int8Path,
        x: &QActs,
        out_len: usize,
        need: usize,
    ) -> Result<(), KernelError> {
        if !path.is_available() || !path.supports(self.dtype) {
            return Err(KernelError::BadShape(format!(
                "packed int8: {} cannot run {:?} on this CPU",
                path.name(),
                self.dtype
            )));
        }
        if x.k != self.cols || out_len != need {
            return Err(KernelError::BadShape(format!(
                "packed int8: [{}, {}] activations, [{}, {}] weights, {out_len} outputs \
                 ({need} expected)",
                x.n_tokens, x.k, self.rows, self.cols
            )));
        }
        Ok(())
    }

    /// `n` (≤ 4) tokens from `t0` times one panel into `out[j · stride + r]`.
    ///
    /// # Safety
    /// `path` is available; tokens `t0..t0 + n` lie in `x`; `out` holds `(n − 1) · stride + 32`
    /// values.
    #[allow(clippy::too_many_arguments)]
    unsafe fn micro(
        &self,
        path: Int8Path,
        panel: &[u8],
        x: &QActs,
        t0: usize,
        n: usize,
        out: *mut f32,
        stride: usize,
    ) {
        #[cfg(target_arch = "x86_64")]
        {
            let pf = crate::quantdot::prefetch_distance();
            macro_rules! by_tokens {
                ($m:ident, $q:ident, $s:ident) => {
                    match n {
                        1 => by_tokens!(@ $m, $q, $s, 1),
                        2 => by_tokens!(@ $m, $q, $s, 2),
                        3 => by_tokens!(@ $m, $q, $s, 3),
                        4 => by_tokens!(@ $m, $q, $s, 4),
                        _ => unreachable!("n ≤ 4"),
                    }
                };
                (@ $m:ident, $q:ident, $s:ident, $n:literal) => {
                    // SAFETY: forwarded from the caller.
                    unsafe {
                        $m::micro::<$n, $q, $s>(
                            panel, self.cols, self.mmul, x, t0, out, stride, pf,
                        )
                    }
                };
            }
            macro_rules! on_vnni {
                ($q:ident, $s:ident) => {
                    by_tokens!(vnni, $q, $s)
                };
            }
            macro_rules! on_avx2 {
                ($q:ident, $s:ident) => {
                    by_tokens!(avx2, $q, $s)
                };
            }
            match path {
                Int8Path::Vnni | Int8Path::Amx => {
                    return with_format!(self.quants, self.scales, on_vnni);
                }
                Int8Path::Avx2 => return with_format!(self.quants, self.scales, on_avx2),
                Int8Path::Scalar => {}
            }
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.micro_scalar(panel, x, t0, n, out, stride) }
    }

    /// Scalar twin of the packed micro-kernels (and, value for value, of the int8 GEMM's):
    /// per sub-block an exact integer dot, then `acc = fma(idot, s · dx, acc)` and
    /// `acc = fma(−m, xsum, acc)`.
    ///
    /// # Safety
    /// As [`PackedMatrix::micro`].
    unsafe fn micro_scalar(
        &self,
        panel: &[u8],
        x: &QActs,
        t0: usize,
        n: usize,
        out: *mut f32,
        stride: usize,
    ) {
        let k = self.cols;
        let (q, s) = (self.quants.id(), self.scales.id());
        let (cc, cb, sz) = (chunk_cols(s), chunk_bytes(q, s), sub_cols(s));
        let sums = x.sums(sz);
        let nsub = k / sz;
        for t in t0..t0 + n {
            let xq = &x.q[t * k..(t + 1) * k];
            for r in 0..ROWS {
                let mut acc = 0f32;
                for b in 0..nsub {
                    let c = b * sz / cc;
                    let chunk = &panel[c * cb..(c + 1) * cb];
                    let mut dot = 0i32;
                    for (i, &xv) in xq.iter().enumerate().skip(b * sz).take(sz) {
                        let li = i - c * cc;
                        let rec = &chunk[rec_at(q, s, li)..];
                        let v = value_of(self.quants, rec, 4 * r + li % 4);
                        dot += i32::from(v) * i32::from(xv);
                    }
                    let (sv, mv) = scale_of(self.scales, q, self.mmul, chunk, b % (cc / sz), r);
                    let dx = x.d[t * (k / 32) + b * sz / 32];
                    acc = (dot as f32).mul_add(sv * dx, acc);
                    acc = (-mv).mul_add(sums[t * nsub + b], acc);
                }
                // SAFETY: inside the caller's `out`.
                unsafe { *out.add((t - t0) * stride + r) = acc };
            }
        }
    }
}

/// One quad record into its 128 expanded bytes (`[32 rows][4]`).
#[inline(always)]
fn expand_record(q: Quants, rec: &[u8], out: &mut [u8]) {
    let (lo, hi) = out.split_at_mut(64);
    if q == Quants::Byte {
        out.copy_from_slice(&rec[..128]);
        return;
    }
    for ((a, b), &v) in lo.iter_mut().zip(hi.iter_mut()).zip(&rec[..64]) {
        *a = v & 0xF;
        *b = v >> 4;
    }
    match q {
        Quants::Nib1 => {
            let bits = &rec[64..80];
            for (p, o) in out.iter_mut().enumerate() {
                *o |= ((bits[p >> 3] >> (p & 7)) & 1) << 4;
            }
        }
        Quants::Nib2 => {
            let h = &rec[64..96];
            for (g, part) in out.chunks_exact_mut(32).enumerate() {
                for (o, &b) in part.iter_mut().zip(h) {
                    *o |= ((b >> (2 * g)) & 3) << 4;
                }
            }
        }
        _ => {}
    }
}

/// Runs `f(panel, bytes)` on every `pb`-byte panel of `data`, split over `pool`; stops at
/// the first error.
fn fill_panels(
    data: &mut [u8],
    pb: usize,
    pool: Option<&ThreadPool>,
    f: &ReadPanel<'_, ()>,
) -> Result<(), ()> {
    let n_panels = data.len() / pb;
    let failed = std::sync::atomic::AtomicBool::new(false);
    let work = |p: usize, dst: &mut [u8]| {
        if failed.load(std::sync::atomic::Ordering::Relaxed) || f(p, dst).is_err() {
            failed.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    };
    match pool {
        // One panel per chunk, handed out over the pool.
        Some(p) if p.n_threads() > 1 => p.for_each_chunk_mut(&mut data[..n_panels * pb], pb, &work),
        _ => data
            .chunks_exact_mut(pb)
            .enumerate()
            .for_each(|(p, dst)| work(p, dst)),
    }
    if failed.into_inner() { Err(()) } else { Ok(()) }
}

/// Software prefetch of the lines of a `len`-byte record `dist` bytes ahead of `p` (decode
/// streams weights from DRAM; the distance is `DAMASCUS_PREFETCH`, as for the dot products).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch(p: *const u8, dist: usize, len: usize) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    if dist == 0 {
        return;
    }
    let q = p.wrapping_add(dist);
    // SAFETY: a prefetch is a hint; it never faults, whatever the address.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(q.cast()) };
    if len > 64 && (q as usize & 63) + len > 64 {
        // SAFETY: as above.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(64).cast()) };
    }
}

fn quads_as_bytes(q: &[u32]) -> &[u8] {
    // SAFETY: u32 has no padding; the same memory viewed as 4× as many bytes.
    unsafe { std::slice::from_raw_parts(q.as_ptr().cast::<u8>(), q.len() * 4) }
}

fn quads_as_bytes_mut(q: &mut [u32]) -> &mut [u8] {
    // SAFETY: u32 has no padding and any byte pattern is a valid u32; same memory, 4× length.
    unsafe { std::slice::from_raw_parts_mut(q.as_mut_ptr().cast::<u8>(), q.len() * 4) }
}

#[cfg(target_arch = "x86_64")]
mod vnni;

#[cfg(target_arch = "x86_64")]
mod avx2;

#[cfg(test)]
mod tests;
