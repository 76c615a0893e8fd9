//! Dequantization must be bit-exact with gguf-py (`gguf.quants.dequantize`).
//!
//! Fixture: `tests/fixtures/dequant_golden.bin`, written by `tools/quant_golden.py` (format
//! documented there): random blocks with special f16 scales (zero, subnormal, max, Inf, quiet
//! and signalling NaN), plus a digest over all 65536 F16 / BF16 bit patterns.

use damascus_quant::{GgmlType, dequantize_row};
use sha2::{Digest, Sha256};

const FIXTURE: &[u8] = include_bytes!("fixtures/dequant_golden.bin");

/// Little-endian cursor over the fixture.
struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        s
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn dequant_matches_gguf_py_bit_for_bit() {
    let mut c = Cursor {
        data: FIXTURE,
        pos: 0,
    };
    assert_eq!(c.take(4), b"DQG1");
    let n_records = c.u32();
    let mut seen = Vec::new();
    for _ in 0..n_records {
        let dtype = GgmlType::from_id(c.u32()).unwrap();
        let (n_blocks, n_full) = (c.u32() as usize, c.u32() as usize);
        let (block_size, type_size) = (c.u32() as usize, c.u32() as usize);
        assert_eq!(
            (block_size, type_size),
            (dtype.block_size(), dtype.type_size())
        );
        let raw = c.take(n_blocks * type_size);
        let full = c.take(n_full * block_size * 4);
        let digests = c.take(n_blocks * 8);

        // Whole row at once: [n_blocks * block_size] f32.
        let mut out = vec![0f32; n_blocks * block_size];
        dequantize_row(dtype, raw, &mut out).unwrap();
        let got_full = f32_bytes(&out[..n_full * block_size]);
        for (i, (g, e)) in got_full.chunks(4).zip(full.chunks(4)).enumerate() {
            assert_eq!(g, e, "{dtype}: element {i} of the first blocks differs");
        }
        for b in 0..n_blocks {
            let bytes = f32_bytes(&out[b * block_size..(b + 1) * block_size]);
            let h = Sha256::digest(&bytes);
            assert_eq!(
                &h[..8],
                &digests[b * 8..b * 8 + 8],
                "{dtype}: block {b} differs from gguf-py (raw {:02x?})",
                &raw[b * type_size..(b + 1) * type_size]
            );
        }
        seen.push(dtype);
    }
    // F16 / BF16: every bit pattern.
    while c.pos < c.data.len() {
        let dtype = GgmlType::from_id(c.u32()).unwrap();
        let expected = c.take(32);
        let src: Vec<u8> = (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).collect();
        let mut out = vec![0f32; 65536];
        dequantize_row(dtype, &src, &mut out).unwrap();
        assert_eq!(
            &Sha256::digest(f32_bytes(&out))[..],
            expected,
            "{dtype}: all-patterns digest"
        );
        seen.push(dtype);
    }
    for t in [
        "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "F16",
        "BF16",
    ] {
        assert!(
            seen.contains(&GgmlType::from_name(t).unwrap()),
            "fixture lacks {t}"
        );
    }
}
