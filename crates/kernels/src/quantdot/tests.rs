//! Tests: every ISA variant against the scalar twin, the scalar twin against
//! f32 dequantization, and the activation quantizers against damascus-quant.

use super::dequant::dequantize;
use super::*;

/// xorshift64* — deterministic, dependency-free test data.
pub(crate) struct Rng(u64);
impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub(crate) fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

const K_SIZES: [usize; 4] = [1, 3, 7, 33];
const LEGACY_SIZES: [usize; 5] = [1, 3, 7, 33, 1023];

fn gg(t: WeightType) -> damascus_quant::GgmlType {
    damascus_quant::GgmlType::from_id(t.ggml_id()).expect("ggml id")
}

/// Activation vectors of several shapes: normal, spiky, zero blocks, constant.
fn make_x(rng: &mut Rng, k: usize, mode: usize) -> Vec<f32> {
    (0..k)
        .map(|i| match mode {
            0 => rng.f32(),
            1 => {
                if i % 97 == 5 {
                    1e4 * rng.f32()
                } else {
                    1e-3 * rng.f32()
                }
            }
            2 => {
                if (i / 256) % 2 == 0 {
                    0.0
                } else {
                    rng.f32() * 3.0
                }
            }
            _ => -2.5,
        })
        .collect()
}

/// A weight row of `nb` blocks: mode 0 = quantized from random f32 (real
/// blocks), 1 = random bytes with sane f16 scales, 2 = every quant bit set and
/// scales maxed, 3 = all-zero quants.
fn make_w(rng: &mut Rng, t: WeightType, nb: usize, mode: usize) -> Vec<u8> {
    let k = nb * t.block_elems();
    if mode == 0 {
        let x: Vec<f32> = (0..k).map(|_| rng.f32() * 0.1).collect();
        let mut w = vec![0u8; nb * t.block_bytes()];
        damascus_quant::quantize_row(gg(t), &x, &mut w).expect("quantize weights");
        return w;
    }
    let mut w: Vec<u8> = (0..nb * t.block_bytes())
        .map(|_| match mode {
            1 => rng.byte(),
            2 => 0xFF,
            _ => 0,
        })
        .collect();
    // f16 fields: overwrite with finite values (scale, and min for Q4_1 / K4).
    let f16_offsets: &[usize] = match t {
        WeightType::Q4_0 | WeightType::Q5_0 | WeightType::Q8_0 => &[0],
        WeightType::Q4_1 | WeightType::Q4_K | WeightType::Q5_K => &[0, 2],
        WeightType::Q6_K => &[208],
    };
    for b in w.chunks_exact_mut(t.block_bytes()) {
        for &o in f16_offsets {
            let v = if mode == 2 { -0.5 } else { rng.f32() * 0.05 };
            b[o..o + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes());
        }
    }
    w
}

fn quantize_acts(t: WeightType, x: &[f32]) -> ActBuf {
    let mut buf = ActBuf::new(t.act_type());
    buf.quantize(x).expect("quantize activations");
    buf
}

fn dequant_acts(a: &ActBuf) -> Vec<f64> {
    match a {
        ActBuf::Q8K(v) => v
            .iter()
            .flat_map(|b| b.qs.iter().map(move |&q| b.d as f64 * q as f64))
            .collect(),
        ActBuf::Q8_0(v) => v
            .iter()
            .flat_map(|b| b.qs.iter().map(move |&q| f16_to_f32(b.d) as f64 * q as f64))
            .collect(),
        ActBuf::Q8_1(v) => v
            .iter()
            .flat_map(|b| b.qs.iter().map(move |&q| f16_to_f32(b.d) as f64 * q as f64))
            .collect(),
    }
}

/// Per-element activation scale (error bound of the quantized activation).
fn act_scales(a: &ActBuf) -> Vec<f64> {
    match a {
        ActBuf::Q8K(v) => v.iter().flat_map(|b| [b.d.abs() as f64; QK_K]).collect(),
        ActBuf::Q8_0(v) => v
            .iter()
            .flat_map(|b| [f16_to_f32(b.d).abs() as f64; QK])
            .collect(),
        ActBuf::Q8_1(v) => v
            .iter()
            .flat_map(|b| [f16_to_f32(b.d).abs() as f64; QK])
            .collect(),
    }
}

fn isas() -> Vec<&'static DotKernels> {
    let mut v = Vec::new();
    for isa in [Isa::Avx2, Isa::Avx512, Isa::Vnni] {
        match kernels_for(isa) {
            Some(k) => v.push(k),
            None => eprintln!("note: skipping {} kernels: this CPU lacks them", isa.name()),
        }
    }
    v
}

fn check_type(t: WeightType) {
    let scalar = kernels_for(Isa::Scalar).expect("scalar");
    let simd = isas();
    let sizes: &[usize] = if t.block_elems() == QK_K {
        &K_SIZES
    } else {
        &LEGACY_SIZES
    };
    let mut rng = Rng::new(t.ggml_id() as u64 + 17);
    for &nb in sizes {
        let k = nb * t.block_elems();
        for wmode in 0..4 {
            for xmode in 0..4 {
                let w = make_w(&mut rng, t, nb, wmode);
                let x = make_x(&mut rng, k, xmode);
                let a = quantize_acts(t, &x);
                let acts = a.as_acts();
                let ctx = format!("{} nb={nb} wmode={wmode} xmode={xmode}", t.name());

                let s = scalar.dot(t, &w, acts).expect("scalar dot");
                let wd = dequantize(t, &w);
                // Cross-check our test dequantizer against damascus-quant's.
                let mut wq = vec![0f32; k];
                damascus_quant::dequantize_row(gg(t), &w, &mut wq).expect("dequantize");
                assert_eq!(wd, wq, "{ctx}: dequantizers disagree");

                let ad = dequant_acts(&a);
                let exact: f64 = wd.iter().zip(&ad).map(|(&w, &a)| w as f64 * a).sum();
                let mag: f64 = wd
                    .iter()
                    .zip(&ad)
                    .map(|(&w, &a)| (w as f64 * a).abs())
                    .sum();
                let mut tol = 2e-5 * mag + 1e-30;
                if let ActBuf::Q8_1(blocks) = &a {
                    // Q8_1 stores s = d·Σq rounded to f16: allow that rounding.
                    for (b, y) in w.chunks_exact(20).zip(blocks) {
                        let m = f16_to_f32(u16::from_le_bytes([b[2], b[3]])) as f64;
                        tol += (m * f16_to_f32(y.s) as f64).abs() * 1e-3;
                    }
                }
                assert!(
                    (s as f64 - exact).abs() <= tol,
                    "{ctx}: scalar {s} vs dequant {exact} (tol {tol})"
                );

                // Against the unquantized activations: bounded by the activation rounding.
                let sc = act_scales(&a);
                let xf: f64 = wd.iter().zip(&x).map(|(&w, &x)| w as f64 * x as f64).sum();
                let bound: f64 = wd
                    .iter()
                    .zip(&sc)
                    .map(|(&w, &d)| (w as f64).abs() * 0.6 * d)
                    .sum::<f64>()
                    + 2e-3 * mag
                    + 1e-6;
                assert!(
                    (s as f64 - xf).abs() <= bound,
                    "{ctx}: scalar {s} vs f32 dot {xf} (bound {bound})"
                );

                for kern in &simd {
                    let v = kern.dot(t, &w, acts).expect("simd dot");
                    assert!(
                        (v as f64 - s as f64).abs() <= tol,
                        "{ctx}: {} gives {v}, scalar {s} (tol {tol})",
                        kern.isa().name()
                    );
                }
            }
        }
    }
}

#[test]
fn dot_q4_0() {
    check_type(WeightType::Q4_0);
}
#[test]
fn dot_q4_1() {
    check_type(WeightType::Q4_1);
}
#[test]
fn dot_q5_0() {
    check_type(WeightType::Q5_0);
}
#[test]
fn dot_q8_0() {
    check_type(WeightType::Q8_0);
}
#[test]
fn dot_q4_k() {
    check_type(WeightType::Q4_K);
}
#[test]
fn dot_q5_k() {
    check_type(WeightType::Q5_K);
}
#[test]
fn dot_q6_k() {
    check_type(WeightType::Q6_K);
}

/// Our activation quantizers are bit-identical to damascus-quant's
/// (llama.cpp `quantize_row_q8_*_ref`).
#[test]
fn activation_quantizers_match_reference() {
    use damascus_quant::GgmlType;
    let mut rng = Rng::new(5);
    for mode in 0..4 {
        let x = make_x(&mut rng, 256 * 7, mode);
        let mut ours = vec![BlockQ8K::ZERO; 7];
        quantize_q8_k(&x, &mut ours).expect("q8_k");
        let mut theirs = vec![0u8; 7 * 292];
        if damascus_quant::quantize_row(GgmlType::Q8_K, &x, &mut theirs).is_ok() {
            for (i, b) in ours.iter().enumerate() {
                let t = &theirs[i * 292..(i + 1) * 292];
                if b.d == 0.0 {
                    continue; // ggml leaves bsums of an all-zero block unset
                }
                assert_eq!(b.d.to_le_bytes(), t[0..4], "mode {mode} block {i} d");
                assert!(
                    b.qs.iter().zip(&t[4..260]).all(|(&q, &r)| q as u8 == r),
                    "mode {mode} block {i} qs"
                );
                for j in 0..16 {
                    assert_eq!(
                        b.bsums[j].to_le_bytes(),
                        t[260 + 2 * j..262 + 2 * j],
                        "mode {mode} bsums"
                    );
                }
            }
        } else {
            eprintln!("note: damascus-quant cannot quantize Q8_K; skipping that comparison");
        }

        let mut o0 = vec![BlockQ8_0::ZERO; 56];
        quantize_q8_0(&x, &mut o0).expect("q8_0");
        let mut t0 = vec![0u8; 56 * 34];
        damascus_quant::quantize_row(GgmlType::Q8_0, &x, &mut t0).expect("ref q8_0");
        for (b, t) in o0.iter().zip(t0.chunks_exact(34)) {
            assert_eq!(b.d.to_le_bytes(), t[0..2]);
            assert!(b.qs.iter().zip(&t[2..]).all(|(&q, &r)| q as u8 == r));
        }

        let mut o1 = vec![BlockQ8_1::ZERO; 56];
        quantize_q8_1(&x, &mut o1).expect("q8_1");
        let mut t1 = vec![0u8; 56 * 36];
        if damascus_quant::quantize_row(GgmlType::Q8_1, &x, &mut t1).is_ok() {
            for (b, t) in o1.iter().zip(t1.chunks_exact(36)) {
                assert_eq!(b.d.to_le_bytes(), t[0..2]);
                assert_eq!(b.s.to_le_bytes(), t[2..4]);
                assert!(b.qs.iter().zip(&t[4..]).all(|(&q, &r)| q as u8 == r));
            }
        } else {
            eprintln!("note: damascus-quant cannot quantize Q8_1; skipping that comparison");
        }
    }
}

#[test]
fn q8_k_properties() {
    let mut rng = Rng::new(9);
    let x = make_x(&mut rng, 512, 0);
    let mut q = vec![BlockQ8K::ZERO; 2];
    quantize_q8_k(&x, &mut q).expect("q8_k");
    for (b, xb) in q.iter().zip(x.chunks_exact(256)) {
        for (j, g) in b.qs.chunks_exact(16).enumerate() {
            assert_eq!(b.bsums[j], g.iter().map(|&v| v as i16).sum::<i16>());
        }
        for (&v, &xv) in b.qs.iter().zip(xb) {
            assert!((b.d * v as f32 - xv).abs() <= b.d.abs() * 0.5001);
        }
        assert!(b.qs.contains(&-127), "max maps to -127");
    }
    assert!(quantize_q8_k(&x[..300], &mut q).is_err());
}

#[test]
fn bad_inputs_are_errors() {
    let k = kernels();
    let x = vec![0.5f32; 256];
    let a = quantize_acts(WeightType::Q4_K, &x);
    let w = vec![0u8; 143];
    assert!(matches!(
        k.dot(WeightType::Q4_K, &w, a.as_acts()),
        Err(KernelError::BadLength { .. })
    ));
    assert!(matches!(
        k.dot(WeightType::Q8_0, &w, a.as_acts()),
        Err(KernelError::WrongActType { .. })
    ));
    let mut out = vec![0f32; 2];
    assert!(gemv(WeightType::Q4_K, &w, a.as_acts(), &mut out, None).is_err());
}

#[test]
fn gemv_matches_rowwise_dot_with_threads() {
    let mut rng = Rng::new(3);
    let pool = crate::pool::ThreadPool::new(3);
    for t in [WeightType::Q4_K, WeightType::Q6_K, WeightType::Q4_1] {
        let (n, k) = (37, 2 * 256);
        let w = make_w(&mut rng, t, n * k / t.block_elems(), 1);
        let x = make_x(&mut rng, k, 0);
        let a = quantize_acts(t, &x);
        let rb = t.row_bytes(k).expect("row bytes");
        let want: Vec<f32> = (0..n)
            .map(|r| {
                kernels()
                    .dot(t, &w[r * rb..(r + 1) * rb], a.as_acts())
                    .expect("dot")
            })
            .collect();
        let mut got = vec![0f32; n];
        gemv(t, &w, a.as_acts(), &mut got, Some(&pool)).expect("gemv");
        assert_eq!(got, want);
        let mut got1 = vec![0f32; n];
        gemv(t, &w, a.as_acts(), &mut got1, None).expect("gemv");
        assert_eq!(got1, want);
        let mut part = vec![0f32; 5];
        gemv_rows(kernels(), t, &w, a.as_acts(), 30..35, &mut part).expect("rows");
        assert_eq!(part, want[30..35]);
    }
}

#[test]
fn chosen_isa_is_available() {
    assert!(kernels().isa() <= Isa::best());
    assert!(kernels_for(Isa::Scalar).is_some());
    eprintln!("dot kernels: {}", kernels().isa().name());
}

/// The dispatched (SIMD) quantizers give the same bits as the scalar twins,
/// including exact rounding ties.
#[test]
fn quantizers_simd_equal_scalar_twins() {
    let mut rng = Rng::new(21);
    let mut inputs: Vec<Vec<f32>> = (0..4).map(|m| make_x(&mut rng, 256 * 5, m)).collect();
    // Ties: with max |x| = 127 the scales are exactly ±1, so x.5 values tie.
    let mut ties: Vec<f32> = (0..256).map(|i| (i as f32 - 128.0) + 0.5).collect();
    ties[7] = -127.0;
    ties[0] = 127.0; // same |x| later at index 7 must not win
    ties.extend((0..256).map(|i| {
        if i == 3 {
            127.0
        } else {
            ((i % 50) as f32) - 24.5
        }
    }));
    inputs.push(ties);
    for x in &inputs {
        let nb = x.len() / 256;
        let (mut a, mut b) = (vec![BlockQ8K::ZERO; nb], vec![BlockQ8K::ZERO; nb]);
        quantize_q8_k(x, &mut a).expect("q8_k");
        quantize_q8_k_ref(x, &mut b).expect("q8_k ref");
        assert_eq!(a, b);
        let (mut a, mut b) = (vec![BlockQ8_0::ZERO; nb * 8], vec![BlockQ8_0::ZERO; nb * 8]);
        quantize_q8_0(x, &mut a).expect("q8_0");
        quantize_q8_0_ref(x, &mut b).expect("q8_0 ref");
        assert_eq!(a, b);
        let (mut a, mut b) = (vec![BlockQ8_1::ZERO; nb * 8], vec![BlockQ8_1::ZERO; nb * 8]);
        quantize_q8_1(x, &mut a).expect("q8_1");
        quantize_q8_1_ref(x, &mut b).expect("q8_1 ref");
        assert_eq!(a, b);
    }
}
