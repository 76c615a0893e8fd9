//! `#[repr(C)]` block layouts of the GGML quantization formats.
//!
//! Every struct mirrors ggml's `block_*` byte for byte (sizes pinned by `const` asserts).
//! Half-precision scales are kept as raw little-endian `u16` bits (`d`, `dmin`, `m`, `s`)
//! so a block is plain old data; convert them with [`crate::fp::fp16_to_f32`].
//!
//! Parsing is done safely with [`Block::read`] (a byte-wise little-endian decode that works
//! at any alignment). [`cast_blocks`] offers a zero-copy view for kernels when the input is
//! suitably aligned (mmap'd GGUF tensor data is 32-byte aligned; arbitrary `&[u8]` may not
//! be, in which case it returns an error and callers fall back to `read`).

use crate::QuantError;

/// Elements per K-quant super-block.
pub const QK_K: usize = 256;
/// Elements per legacy block (Q4_0 .. Q8_1).
pub const QK: usize = 32;
/// Bytes of packed 6-bit scales/mins in Q4_K / Q5_K.
pub const K_SCALE_SIZE: usize = 12;

/// Q4_0: 32 weights, `w = d * (q - 8)`, q 4-bit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockQ4_0 {
    /// Scale, f16 bits.
    pub d: u16,
    /// Nibbles: low nibble of byte j is weight j, high nibble is weight j + 16.
    pub qs: [u8; QK / 2],
}

/// Q4_1: 32 weights, `w = d * q + m`, q 4-bit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockQ4_1 {
    /// Scale, f16 bits.
    pub d: u16,
    /// Minimum, f16 bits.
    pub m: u16,
    /// Nibbles, as in [`BlockQ4_0`].
    pub qs: [u8; QK / 2],
}

/// Q5_0: 32 weights, `w = d * (q - 16)`, q 5-bit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockQ5_0 {
    /// Scale, f16 bits.
    pub d: u16,
    /// Fifth bits: bit j of this little-endian u32 belongs to weight j.
    pub qh: [u8; 4],
    /// Low nibbles, as in [`BlockQ4_0`].
    pub qs: [u8; QK / 2],
}

/// Q5_1: 32 weights, `w = d * q + m`, q 5-bit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockQ5_1 {
    /// Scale, f16 bits.
    pub d: u16,
    /// Minimum, f16 bits.
    pub m: u16,
    /// Fifth bits, as in [`BlockQ5_0`].
    pub qh: [u8; 4],
    /// Low nibbles.
    pub qs: [u8; QK / 2],
}

/// Q8_0: 32 weights, `w = d * q`, q signed 8-bit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockQ8_0 {
    /// Scale, f16 bits.
    pub d: u16,
    /// Quants.
    pub qs: [i8; QK],
}

/// Q8_1: like Q8_0 plus `s = d * sum(q)` (an activation format for dot products).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockQ8_1 {
    /// Scale, f16 bits.
    pub d: u16,
    /// `d * sum(qs)`, f16 bits.
    pub s: u16,
    /// Quants.
    pub qs: [i8; QK],
}

/// Q2_K: 256 weights in 16 groups of 16; `w = d*sc*q - dmin*m`, q 2-bit, sc/m 4-bit.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ2_K {
    /// Per group: low nibble scale, high nibble min.
    pub scales: [u8; QK_K / 16],
    /// 2-bit quants; byte l of each 32-byte chunk holds 4 weights at stride 32.
    pub qs: [u8; QK_K / 4],
    /// Super-block scale for scales, f16 bits.
    pub d: u16,
    /// Super-block scale for mins, f16 bits.
    pub dmin: u16,
}

/// Q3_K: 256 weights in 16 groups of 16; `w = d * (sc - 32) * (q - 4*!hbit)`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ3_K {
    /// High bit of each quant: bit b of byte l is weight `32*b + l`.
    pub hmask: [u8; QK_K / 8],
    /// Low 2 bits of each quant, packed like [`BlockQ2_K::qs`].
    pub qs: [u8; QK_K / 4],
    /// Sixteen 6-bit scales: low nibbles in bytes 0..8, high 2-bit pairs in bytes 8..12.
    pub scales: [u8; 12],
    /// Super-block scale, f16 bits.
    pub d: u16,
}

/// Q4_K: 256 weights in 8 groups of 32; `w = d*sc*q - dmin*m`, q 4-bit, sc/m 6-bit.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4_K {
    /// Super-block scale for scales, f16 bits.
    pub d: u16,
    /// Super-block scale for mins, f16 bits.
    pub dmin: u16,
    /// Eight 6-bit scales and eight 6-bit mins (see [`get_scale_min_k4`]).
    pub scales: [u8; K_SCALE_SIZE],
    /// Nibbles: 32-byte chunk c holds weights `64c + l` (low) and `64c + 32 + l` (high).
    pub qs: [u8; QK_K / 2],
}

/// Q5_K: like Q4_K with a fifth bit per weight.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5_K {
    /// Super-block scale for scales, f16 bits.
    pub d: u16,
    /// Super-block scale for mins, f16 bits.
    pub dmin: u16,
    /// Packed 6-bit scales and mins, as in [`BlockQ4_K`].
    pub scales: [u8; K_SCALE_SIZE],
    /// Fifth bits: bit b of byte l is weight `32*b + l`.
    pub qh: [u8; QK_K / 8],
    /// Low nibbles, as in [`BlockQ4_K`].
    pub qs: [u8; QK_K / 2],
}

/// Q6_K: 256 weights in 16 groups of 16; `w = d * sc * (q - 32)`, q 6-bit, sc signed 8-bit.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ6_K {
    /// Low 4 bits of quants.
    pub ql: [u8; QK_K / 2],
    /// High 2 bits of quants.
    pub qh: [u8; QK_K / 4],
    /// Group scales.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale, f16 bits.
    pub d: u16,
}

/// Q8_K: 256 weights, `w = d * q` with an f32 scale and per-16 sums (dot-product format).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_K {
    /// Scale (f32, not f16).
    pub d: f32,
    /// Quants.
    pub qs: [i8; QK_K],
    /// Sum of each group of 16 quants.
    pub bsums: [i16; QK_K / 16],
}

const _: () = assert!(size_of::<f32>() == 4);
const _: () = assert!(size_of::<half::f16>() == 2);
const _: () = assert!(size_of::<half::bf16>() == 2);
const _: () = assert!(size_of::<BlockQ4_0>() == 18);
const _: () = assert!(size_of::<BlockQ4_1>() == 20);
const _: () = assert!(size_of::<BlockQ5_0>() == 22);
const _: () = assert!(size_of::<BlockQ5_1>() == 24);
const _: () = assert!(size_of::<BlockQ8_0>() == 34);
const _: () = assert!(size_of::<BlockQ8_1>() == 36);
const _: () = assert!(size_of::<BlockQ2_K>() == 84);
const _: () = assert!(size_of::<BlockQ3_K>() == 110);
const _: () = assert!(size_of::<BlockQ4_K>() == 144);
const _: () = assert!(size_of::<BlockQ5_K>() == 176);
const _: () = assert!(size_of::<BlockQ6_K>() == 210);
const _: () = assert!(size_of::<BlockQ8_K>() == 292);

/// A GGML block: a fixed number of elements stored in `SIZE` bytes.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, exactly `SIZE` bytes with no padding, made only of
/// integer / float fields (every bit pattern valid), so that [`cast_blocks`] may
/// reinterpret suitably aligned little-endian bytes as `&[Self]`.
pub unsafe trait Block: Copy + 'static {
    /// Elements per block.
    const ELEMS: usize;
    /// Bytes per block (== `size_of::<Self>()`).
    const SIZE: usize;
    /// Decodes one block from exactly `SIZE` little-endian bytes (any alignment).
    fn read(bytes: &[u8]) -> Self;
    /// Encodes this block into exactly `SIZE` little-endian bytes.
    fn write(&self, out: &mut [u8]);
}

/// Little-endian u16 at `off`.
#[inline]
fn le16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

/// Copies `N` bytes at `off` into an array.
#[inline]
fn arr<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[off..off + N]);
    a
}

/// Copies `N` bytes at `off` into an `i8` array.
#[inline]
fn arr_i8<const N: usize>(b: &[u8], off: usize) -> [i8; N] {
    let mut a = [0i8; N];
    for (d, s) in a.iter_mut().zip(&b[off..off + N]) {
        *d = *s as i8;
    }
    a
}

/// Writes an `i8` slice as bytes at `off`.
#[inline]
fn put_i8(out: &mut [u8], off: usize, v: &[i8]) {
    for (d, s) in out[off..off + v.len()].iter_mut().zip(v) {
        *d = *s as u8;
    }
}

macro_rules! assert_block_size {
    ($t:ty) => {
        const _: () = assert!(<$t as Block>::SIZE == size_of::<$t>());
    };
}

// SAFETY: repr(C), u16 + u8 arrays, 18 bytes, no padding (asserted above).
unsafe impl Block for BlockQ4_0 {
    const ELEMS: usize = QK;
    const SIZE: usize = 18;
    fn read(b: &[u8]) -> Self {
        Self {
            d: le16(b, 0),
            qs: arr(b, 2),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..18].copy_from_slice(&self.qs);
    }
}
assert_block_size!(BlockQ4_0);

// SAFETY: repr(C), u16/u8 fields only, 20 bytes, no padding.
unsafe impl Block for BlockQ4_1 {
    const ELEMS: usize = QK;
    const SIZE: usize = 20;
    fn read(b: &[u8]) -> Self {
        Self {
            d: le16(b, 0),
            m: le16(b, 2),
            qs: arr(b, 4),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..4].copy_from_slice(&self.m.to_le_bytes());
        out[4..20].copy_from_slice(&self.qs);
    }
}
assert_block_size!(BlockQ4_1);

// SAFETY: repr(C), u16/u8 fields only, 22 bytes, no padding.
unsafe impl Block for BlockQ5_0 {
    const ELEMS: usize = QK;
    const SIZE: usize = 22;
    fn read(b: &[u8]) -> Self {
        Self {
            d: le16(b, 0),
            qh: arr(b, 2),
            qs: arr(b, 6),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..6].copy_from_slice(&self.qh);
        out[6..22].copy_from_slice(&self.qs);
    }
}
assert_block_size!(BlockQ5_0);

// SAFETY: repr(C), u16/u8 fields only, 24 bytes, no padding.
unsafe impl Block for BlockQ5_1 {
    const ELEMS: usize = QK;
    const SIZE: usize = 24;
    fn read(b: &[u8]) -> Self {
        Self {
            d: le16(b, 0),
            m: le16(b, 2),
            qh: arr(b, 4),
            qs: arr(b, 8),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..4].copy_from_slice(&self.m.to_le_bytes());
        out[4..8].copy_from_slice(&self.qh);
        out[8..24].copy_from_slice(&self.qs);
    }
}
assert_block_size!(BlockQ5_1);

// SAFETY: repr(C), u16/i8 fields only, 34 bytes, no padding.
unsafe impl Block for BlockQ8_0 {
    const ELEMS: usize = QK;
    const SIZE: usize = 34;
    fn read(b: &[u8]) -> Self {
        Self {
            d: le16(b, 0),
            qs: arr_i8(b, 2),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.d.to_le_bytes());
        put_i8(out, 2, &self.qs);
    }
}
assert_block_size!(BlockQ8_0);

// SAFETY: repr(C), u16/i8 fields only, 36 bytes, no padding.
unsafe impl Block for BlockQ8_1 {
    const ELEMS: usize = QK;
    const SIZE: usize = 36;
    fn read(b: &[u8]) -> Self {
        Self {
            d: le16(b, 0),
            s: le16(b, 2),
            qs: arr_i8(b, 4),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..4].copy_from_slice(&self.s.to_le_bytes());
        put_i8(out, 4, &self.qs);
    }
}
assert_block_size!(BlockQ8_1);

// SAFETY: repr(C), u8 arrays then two u16 at even offsets 80/82, 84 bytes, no padding.
unsafe impl Block for BlockQ2_K {
    const ELEMS: usize = QK_K;
    const SIZE: usize = 84;
    fn read(b: &[u8]) -> Self {
        Self {
            scales: arr(b, 0),
            qs: arr(b, 16),
            d: le16(b, 80),
            dmin: le16(b, 82),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[0..16].copy_from_slice(&self.scales);
        out[16..80].copy_from_slice(&self.qs);
        out[80..82].copy_from_slice(&self.d.to_le_bytes());
        out[82..84].copy_from_slice(&self.dmin.to_le_bytes());
    }
}
assert_block_size!(BlockQ2_K);

// SAFETY: repr(C), u8 arrays then a u16 at offset 108, 110 bytes, no padding.
unsafe impl Block for BlockQ3_K {
    const ELEMS: usize = QK_K;
    const SIZE: usize = 110;
    fn read(b: &[u8]) -> Self {
        Self {
            hmask: arr(b, 0),
            qs: arr(b, 32),
            scales: arr(b, 96),
            d: le16(b, 108),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[0..32].copy_from_slice(&self.hmask);
        out[32..96].copy_from_slice(&self.qs);
        out[96..108].copy_from_slice(&self.scales);
        out[108..110].copy_from_slice(&self.d.to_le_bytes());
    }
}
assert_block_size!(BlockQ3_K);

// SAFETY: repr(C), two u16 then u8 arrays, 144 bytes, no padding.
unsafe impl Block for BlockQ4_K {
    const ELEMS: usize = QK_K;
    const SIZE: usize = 144;
    fn read(b: &[u8]) -> Self {
        Self {
            d: le16(b, 0),
            dmin: le16(b, 2),
            scales: arr(b, 4),
            qs: arr(b, 16),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..4].copy_from_slice(&self.dmin.to_le_bytes());
        out[4..16].copy_from_slice(&self.scales);
        out[16..144].copy_from_slice(&self.qs);
    }
}
assert_block_size!(BlockQ4_K);

// SAFETY: repr(C), two u16 then u8 arrays, 176 bytes, no padding.
unsafe impl Block for BlockQ5_K {
    const ELEMS: usize = QK_K;
    const SIZE: usize = 176;
    fn read(b: &[u8]) -> Self {
        Self {
            d: le16(b, 0),
            dmin: le16(b, 2),
            scales: arr(b, 4),
            qh: arr(b, 16),
            qs: arr(b, 48),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..4].copy_from_slice(&self.dmin.to_le_bytes());
        out[4..16].copy_from_slice(&self.scales);
        out[16..48].copy_from_slice(&self.qh);
        out[48..176].copy_from_slice(&self.qs);
    }
}
assert_block_size!(BlockQ5_K);

// SAFETY: repr(C), u8/i8 arrays then a u16 at offset 208, 210 bytes, no padding.
unsafe impl Block for BlockQ6_K {
    const ELEMS: usize = QK_K;
    const SIZE: usize = 210;
    fn read(b: &[u8]) -> Self {
        Self {
            ql: arr(b, 0),
            qh: arr(b, 128),
            scales: arr_i8(b, 192),
            d: le16(b, 208),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[0..128].copy_from_slice(&self.ql);
        out[128..192].copy_from_slice(&self.qh);
        put_i8(out, 192, &self.scales);
        out[208..210].copy_from_slice(&self.d.to_le_bytes());
    }
}
assert_block_size!(BlockQ6_K);

// SAFETY: repr(C), f32 at 0, i8 array, i16 array at offset 260 (4-aligned), 292 bytes,
// no padding; every bit pattern is a valid f32/i8/i16.
unsafe impl Block for BlockQ8_K {
    const ELEMS: usize = QK_K;
    const SIZE: usize = 292;
    fn read(b: &[u8]) -> Self {
        let mut bsums = [0i16; QK_K / 16];
        for (i, s) in bsums.iter_mut().enumerate() {
            *s = le16(b, 260 + 2 * i) as i16;
        }
        Self {
            d: f32::from_le_bytes(arr(b, 0)),
            qs: arr_i8(b, 4),
            bsums,
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[0..4].copy_from_slice(&self.d.to_le_bytes());
        put_i8(out, 4, &self.qs);
        for (i, s) in self.bsums.iter().enumerate() {
            out[260 + 2 * i..262 + 2 * i].copy_from_slice(&s.to_le_bytes());
        }
    }
}
assert_block_size!(BlockQ8_K);

/// Decodes 6-bit scale and min number `j` (0..8) of a Q4_K/Q5_K block's packed `scales`.
///
/// Bytes 0..4 hold scales 0..3 in their low 6 bits, bytes 4..8 mins 0..3; scales/mins 4..7
/// keep their low nibbles in bytes 8..12 and their top 2 bits in the top bits of bytes 0..8.
#[inline]
pub fn get_scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Decodes a byte slice holding whole blocks into owned blocks (any alignment).
pub fn read_blocks<B: Block>(bytes: &[u8]) -> Result<Vec<B>, QuantError> {
    if !bytes.len().is_multiple_of(B::SIZE) {
        return Err(QuantError::SrcLen {
            expected: bytes.len() / B::SIZE * B::SIZE,
            found: bytes.len(),
        });
    }
    Ok(bytes.chunks_exact(B::SIZE).map(B::read).collect())
}

/// Zero-copy view of `bytes` as blocks. Fails (never panics) when the length is not a whole
/// number of blocks or the pointer is not aligned for `B` (use [`Block::read`] then).
#[cfg(target_endian = "little")]
pub fn cast_blocks<B: Block>(bytes: &[u8]) -> Result<&[B], QuantError> {
    if !bytes.len().is_multiple_of(B::SIZE) {
        return Err(QuantError::SrcLen {
            expected: bytes.len() / B::SIZE * B::SIZE,
            found: bytes.len(),
        });
    }
    let align = align_of::<B>();
    if bytes.as_ptr().align_offset(align) != 0 {
        return Err(QuantError::Misaligned {
            align,
            addr: bytes.as_ptr() as usize,
        });
    }
    // SAFETY: the pointer is aligned for B (checked above), the length is an exact multiple
    // of size_of::<B>() == B::SIZE (Block contract + asserts), B has no padding and every
    // bit pattern is valid (Block contract), the target is little-endian so the in-memory
    // layout equals the GGUF byte layout, and the returned slice borrows `bytes`.
    Ok(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / B::SIZE) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip<B: Block + PartialEq + std::fmt::Debug>() {
        let bytes: Vec<u8> = (0..B::SIZE * 3).map(|i| (i * 37 + 11) as u8).collect();
        let blocks = read_blocks::<B>(&bytes).unwrap();
        let mut out = vec![0u8; bytes.len()];
        for (b, o) in blocks.iter().zip(out.chunks_exact_mut(B::SIZE)) {
            b.write(o);
        }
        assert_eq!(out, bytes);
        // Aligned zero-copy view agrees with the decoded copy.
        let mut aligned = vec![0u64; bytes.len().div_ceil(8) + 1];
        // SAFETY: u64 storage reinterpreted as bytes, within bounds; test-only.
        let buf: &mut [u8] = unsafe {
            std::slice::from_raw_parts_mut(aligned.as_mut_ptr().cast::<u8>(), aligned.len() * 8)
        };
        buf[..bytes.len()].copy_from_slice(&bytes);
        let view = cast_blocks::<B>(&buf[..bytes.len()]).unwrap();
        assert_eq!(view, &blocks[..]);
        if align_of::<B>() > 1 {
            buf[1..=bytes.len()].copy_from_slice(&bytes);
            assert!(cast_blocks::<B>(&buf[1..=bytes.len()]).is_err());
        }
    }

    #[test]
    fn read_write_roundtrip_all_blocks() {
        roundtrip::<BlockQ4_0>();
        roundtrip::<BlockQ4_1>();
        roundtrip::<BlockQ5_0>();
        roundtrip::<BlockQ5_1>();
        roundtrip::<BlockQ8_0>();
        roundtrip::<BlockQ8_1>();
        roundtrip::<BlockQ2_K>();
        roundtrip::<BlockQ3_K>();
        roundtrip::<BlockQ4_K>();
        roundtrip::<BlockQ5_K>();
        roundtrip::<BlockQ6_K>();
        // Q8_K's f32 field: compare via bytes because NaN != NaN in PartialEq.
        let bytes: Vec<u8> = (0..BlockQ8_K::SIZE).map(|i| (i * 5 + 64) as u8).collect();
        let b = BlockQ8_K::read(&bytes);
        let mut out = vec![0u8; bytes.len()];
        b.write(&mut out);
        assert_eq!(out, bytes);
    }
}
