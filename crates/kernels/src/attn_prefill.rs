//! Prefill attention: causal GQA attention of a block of new query tokens over a head-major
//! f16 KV cache, tiled flash-style.
//!
//! A unit is one KV head × one block of [`QB`] query tokens. The unit widens the keys and values
//! it can see to f32 once (keys transposed per block of [`KB`] positions, `[KB]` lanes per
//! head dimension, so scores are computed vectorized over keys without horizontal sums), then
//! every query of the unit (`QB` tokens × the query heads of the group) walks the key blocks
//! with an online softmax, its `head_dim` accumulator held in registers (`head_dim` is a const
//! generic: 64 and 128 have kernels; other sizes return `false` from [`attn_prefill_f16`] so the
//! caller falls back to per-token decode attention). Token `t` of the prompt sees positions
//! `0..=pos0 + t`.
//!
//! The scalar twin is the decode kernel run once per token
//! ([`crate::attn_decode::attn_decode_f16_scalar`]), which the tests compare against.

use crate::attn_decode::{DecodeShape, KvLayout};
use crate::pool::{ThreadPool, pieces};
use crate::quantdot::{KernelError, f16_to_f32};

/// Query tokens per unit.
pub const QB: usize = 16;
/// Key positions per block.
pub const KB: usize = 32;

/// Whether [`attn_prefill_f16`] has a kernel for `head_dim`.
pub fn supports_head_dim(head_dim: usize) -> bool {
    matches!(head_dim, 64 | 128 | 256)
}

/// Causal attention of `n_tokens` queries at positions `pos0..pos0 + n_tokens`.
///
/// * `q`: `[n_tokens, n_head, head_dim]` f32 (rotated)
/// * `k`, `v`: `[n_head_kv, n_ctx, head_dim]` f16 bits (`shape.layout` must be head-major),
///   positions `0..pos0 + n_tokens` written
/// * `out`: `[n_tokens, n_head, head_dim]` f32
///
/// Errors on inconsistent shapes, including a `head_dim` without a kernel
/// ([`supports_head_dim`]).
pub fn attn_prefill_f16(
    q: &[f32],
    k: &[u16],
    v: &[u16],
    shape: DecodeShape,
    pos0: usize,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), KernelError> {
    let (n_ctx, n_tokens) = check_shapes(
        q.len(),
        out.len(),
        k.len(),
        v.len(),
        shape,
        pos0,
        supports_head_dim(shape.head_dim),
        "head_dim 64 or 128",
    )?;
    let DecodeShape {
        n_head,
        n_head_kv,
        head_dim: hd,
        ..
    } = shape;
    let width = n_head * hd;
    if n_tokens == 0 {
        return Ok(());
    }
    let n_qb = n_tokens.div_ceil(QB);
    let n_units = n_head_kv * n_qb;
    let group = n_head / n_head_kv;
    let args = Args {
        q,
        k,
        v,
        n_ctx,
        group,
        width,
        pos0,
        n_tokens,
    };
    // Unit (query block, KV head) owns, for each of its tokens, the output columns of the
    // group's heads: rows of `out` cut into `[group * hd]` pieces, piece t·n_head_kv + hk.
    // Later query blocks see more keys: they come first, for balance.
    let mut rows = pieces(out, group * hd);
    let units: Vec<Unit<'_>> = (0..n_units)
        .map(|u| {
            let (qb, hk) = (n_qb - 1 - u / n_head_kv, u % n_head_kv);
            let t0 = qb * QB;
            let out = (t0..(t0 + QB).min(n_tokens))
                .filter_map(|t| rows[t * n_head_kv + hk].take())
                .collect();
            Unit { hk, qb, out }
        })
        .collect();
    let scratch = || Scratch {
        kt: vec![0f32; KB * hd], // [hd][KB] f32 keys of one block, transposed
        vb: vec![0f32; KB * hd], // [KB][hd] f32 values of one block
        st: Vec::new(),          // per query of a unit: [hd] q, [hd] acc, m, l
    };
    let work = |_: usize, mut unit: Unit<'_>, s: &mut Scratch| {
        let (a, kt, vb, st) = (&args, &mut s.kt, &mut s.vb, &mut s.st);
        match hd {
            64 => run_unit::<64>(a, &mut unit, kt, vb, st),
            128 => run_unit::<128>(a, &mut unit, kt, vb, st),
            _ => run_unit::<256>(a, &mut unit, kt, vb, st),
        }
    };
    match pool {
        Some(p) if p.n_threads() > 1 => p.for_each_task_with(units, &scratch, &work),
        _ => {
            let mut s = scratch();
            for (i, unit) in units.into_iter().enumerate() {
                work(i, unit, &mut s);
            }
        }
    }
    Ok(())
}

/// The shape checks every prompt-attention kernel makes: a head-major cache, whole GQA
/// groups, `head_dim_ok` (the kernel's own head sizes, described by `needs`), whole tokens in
/// `q`/`out` and cache room for the prompt. Returns `(n_ctx, n_tokens)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_shapes(
    q_len: usize,
    out_len: usize,
    k_len: usize,
    v_len: usize,
    shape: DecodeShape,
    pos0: usize,
    head_dim_ok: bool,
    needs: &str,
) -> Result<(usize, usize), KernelError> {
    let DecodeShape {
        n_head,
        n_head_kv,
        head_dim: hd,
        layout,
    } = shape;
    let KvLayout::HeadMajor { n_ctx } = layout else {
        return Err(KernelError::BadShape(
            "prefill attention needs a head-major cache".into(),
        ));
    };
    if n_head_kv == 0 || hd == 0 || !head_dim_ok || !n_head.is_multiple_of(n_head_kv) {
        return Err(KernelError::BadShape(format!(
            "prefill attention: n_head {n_head}, n_head_kv {n_head_kv}, head_dim {hd} \
             (needs a multiple and {needs})"
        )));
    }
    let width = n_head * hd;
    if q_len != out_len || !q_len.is_multiple_of(width) {
        return Err(KernelError::BadShape(format!(
            "q/out hold {q_len}/{out_len} floats, not a whole number of {width}-float tokens"
        )));
    }
    let n_tokens = q_len / width;
    let need = n_head_kv * n_ctx * hd;
    if pos0 + n_tokens > n_ctx || k_len < need || v_len < need {
        return Err(KernelError::BadShape(format!(
            "k/v caches hold {k_len}/{v_len} halves for {n_ctx} positions; need positions up to {}",
            pos0 + n_tokens
        )));
    }
    Ok((n_ctx, n_tokens))
}

struct Args<'a> {
    q: &'a [f32],
    k: &'a [u16],
    v: &'a [u16],
    n_ctx: usize,
    group: usize,
    width: usize,
    pos0: usize,
    n_tokens: usize,
}

/// One unit of work: KV head `hk` for the query block `qb` (tokens `qb·QB..`).
struct Unit<'a> {
    hk: usize,
    qb: usize,
    /// One `[group, head_dim]` output row per token of the block: its heads of the group.
    out: Vec<&'a mut [f32]>,
}

/// One thread's buffers, reused across its units.
struct Scratch {
    kt: Vec<f32>,
    vb: Vec<f32>,
    st: Vec<f32>,
}

fn run_unit<const HD: usize>(
    a: &Args<'_>,
    u: &mut Unit<'_>,
    kt: &mut [f32],
    vb: &mut [f32],
    st: &mut Vec<f32>,
) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::CpuFeatures::allowed().avx512f {
        // SAFETY: AVX-512F (and with it F16C) is present.
        return unsafe { unit_avx512::<HD>(a, u, kt, vb, st) };
    }
    #[cfg(target_arch = "x86_64")]
    {
        let f = crate::cpu::CpuFeatures::allowed();
        if f.avx2 && f.fma && f.f16c {
            // SAFETY: AVX2, FMA and F16C are present.
            return unsafe { unit_avx2::<HD>(a, u, kt, vb, st) };
        }
    }
    unit_body::<HD>(a, u, kt, vb, st, widen_scalar);
}

/// The same body compiled for AVX2 + FMA (CPUs without AVX-512).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unit_avx2<const HD: usize>(
    a: &Args<'_>,
    u: &mut Unit<'_>,
    kt: &mut [f32],
    vb: &mut [f32],
    st: &mut Vec<f32>,
) {
    unit_body::<HD>(a, u, kt, vb, st, widen_f16c);
}

/// [`widen_scalar`] with the 256-bit `vcvtph2ps`; only handed out by [`run_unit`] after
/// detecting F16C.
#[cfg(target_arch = "x86_64")]
fn widen_f16c(src: &[u16], dst: &mut [f32]) {
    #[target_feature(enable = "avx,f16c")]
    unsafe fn imp(src: &[u16], dst: &mut [f32]) {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm256_cvtph_ps, _mm256_storeu_ps};
        let n = src.len().min(dst.len());
        let n8 = n / 8 * 8;
        let mut i = 0;
        while i < n8 {
            // SAFETY: i + 8 <= n8 <= both lengths.
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(i).cast::<__m128i>());
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
            i += 8;
        }
        widen_scalar(&src[n8..n], &mut dst[n8..n]);
    }
    // SAFETY: only reachable through `unit_avx2`, entered after detecting F16C.
    unsafe { imp(src, dst) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn unit_avx512<const HD: usize>(
    a: &Args<'_>,
    u: &mut Unit<'_>,
    kt: &mut [f32],
    vb: &mut [f32],
    st: &mut Vec<f32>,
) {
    unit_body::<HD>(a, u, kt, vb, st, widen_avx512);
}

/// `dst[i] = f32(src[i])`.
fn widen_scalar(src: &[u16], dst: &mut [f32]) {
    for (d, &h) in dst.iter_mut().zip(src) {
        *d = f16_to_f32(h);
    }
}

/// [`widen_scalar`] with `vcvtph2ps`; only handed out by [`run_unit`] after detecting
/// AVX-512F.
#[cfg(target_arch = "x86_64")]
fn widen_avx512(src: &[u16], dst: &mut [f32]) {
    #[target_feature(enable = "avx512f,f16c")]
    unsafe fn imp(src: &[u16], dst: &mut [f32]) {
        use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm512_cvtph_ps, _mm512_storeu_ps};
        let n = src.len().min(dst.len());
        let n16 = n / 16 * 16;
        let mut i = 0;
        while i < n16 {
            // SAFETY: i + 16 <= n16 <= both lengths.
            unsafe {
                let h = _mm256_loadu_si256(src.as_ptr().add(i).cast::<__m256i>());
                _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
            }
            i += 16;
        }
        widen_scalar(&src[n16..n], &mut dst[n16..n]);
    }
    // SAFETY: only reachable through `unit_avx512`, entered after detecting AVX-512F.
    unsafe { imp(src, dst) }
}

/// One unit: key blocks outer, the unit's queries inner, so each widened block of [`KB`] keys
/// and values (2 × `KB × HD` f32, L1-resident) meets every query of the unit before the next
/// is read; each query's online-softmax state (`m`, `l`, `acc[HD]`) lives in `st`.
#[inline(always)]
fn unit_body<const HD: usize>(
    a: &Args<'_>,
    u: &mut Unit<'_>,
    kt: &mut [f32],
    vb: &mut [f32],
    st: &mut Vec<f32>,
    widen: fn(&[u16], &mut [f32]),
) {
    let t0 = u.qb * QB;
    let nt = (a.n_tokens - t0).min(QB);
    let n_vis = a.pos0 + t0 + nt; // keys seen by the unit's last token
    let base = u.hk * a.n_ctx * HD;
    let nq = nt * a.group;
    // Per query (token-major, then head of the group): [HD] scaled q, [HD] acc, m, l.
    let stride = 2 * HD + 2;
    st.clear();
    st.resize(nq * stride, 0.0);
    let scale = 1.0 / (HD as f32).sqrt();
    for ti in 0..nt {
        for g in 0..a.group {
            let off = (t0 + ti) * a.width + (u.hk * a.group + g) * HD;
            let s0 = (ti * a.group + g) * stride;
            for (d, &x) in st[s0..s0 + HD].iter_mut().zip(&a.q[off..off + HD]) {
                *d = x * scale;
            }
            st[s0 + 2 * HD] = f32::NEG_INFINITY;
        }
    }
    if kt.len() < HD * KB || vb.len() < KB * HD {
        return;
    }
    let (kt, vb) = (&mut kt[..HD * KB], &mut vb[..KB * HD]);
    let mut krow = [0f32; HD];
    let mut kb0 = 0;
    while kb0 < n_vis {
        let nb = (n_vis - kb0).min(KB);
        // Widen this block: keys transposed ([HD][KB]), values row-major ([KB][HD]).
        for j in 0..nb {
            let p = kb0 + j;
            widen(&a.k[base + p * HD..][..HD], &mut krow);
            for (d, &x) in krow.iter().enumerate() {
                kt[d * KB + j] = x;
            }
            widen(&a.v[base + p * HD..][..HD], &mut vb[j * HD..(j + 1) * HD]);
        }
        // Queries that see at least one key of the block (later tokens see more).
        let first_ti = kb0.saturating_sub(a.pos0 + t0);
        for ti in first_ti..nt {
            let limit = a.pos0 + t0 + ti + 1; // positions visible to this token
            let nv = (limit - kb0).min(nb);
            // The group's queries of this token see the same keys: up to 4 at a time share
            // every key and value load.
            let mut g = 0;
            while g < a.group {
                let n = (a.group - g).min(4);
                let s0 = (ti * a.group + g) * stride;
                let chunk = &mut st[s0..s0 + n * stride];
                match n {
                    4 => queries_block::<HD, 4>(chunk, kt, vb, nv),
                    3 => queries_block::<HD, 3>(chunk, kt, vb, nv),
                    2 => queries_block::<HD, 2>(chunk, kt, vb, nv),
                    _ => queries_block::<HD, 1>(chunk, kt, vb, nv),
                }
                g += n;
            }
        }
        kb0 += nb;
    }
    for ti in 0..nt {
        for g in 0..a.group {
            let s0 = (ti * a.group + g) * stride;
            let inv = 1.0 / st[s0 + 2 * HD + 1];
            let Some(dst) = u
                .out
                .get_mut(ti)
                .and_then(|r| r.get_mut(g * HD..(g + 1) * HD))
            else {
                continue;
            };
            for (o, &x) in dst.iter_mut().zip(&st[s0 + HD..s0 + 2 * HD]) {
                *o = x * inv;
            }
        }
    }
}

/// `G` queries (their states laid end to end in `st`: `[HD]` scaled q, `[HD]` acc, m, l each)
/// against one widened key block: `kt` `[HD][KB]` transposed keys, `vb` `[KB][HD]` values, the
/// first `nv` keys visible. Scores, online-softmax update and `acc += p · v`; each key-block
/// row and value row is loaded once for all `G` queries.
#[inline(always)]
fn queries_block<const HD: usize, const G: usize>(
    st: &mut [f32],
    kt: &[f32],
    vb: &[f32],
    nv: usize,
) {
    let stride = 2 * HD + 2;
    if st.len() < G * stride || kt.len() < HD * KB || vb.len() < KB * HD || nv > KB {
        return;
    }
    // Scores: two partial sums (even / odd dimensions) per query, so even `G = 1` has four
    // independent FMA chains.
    let mut sp = [[[0f32; KB]; 2]; G];
    for d in (0..HD).step_by(2) {
        for h in 0..2 {
            let kr = &kt[(d + h) * KB..(d + h + 1) * KB];
            for (qi, spq) in sp.iter_mut().enumerate() {
                let qd = st[qi * stride + d + h];
                for j in 0..KB {
                    spq[h][j] += qd * kr[j];
                }
            }
        }
    }
    let mut p = [[0f32; KB]; G];
    let mut acc = [[0f32; HD]; G];
    for qi in 0..G {
        let sq = &mut st[qi * stride..(qi + 1) * stride];
        let mut mx = sq[2 * HD];
        for j in 0..KB {
            p[qi][j] = sp[qi][0][j] + sp[qi][1][j];
        }
        for &sj in &p[qi][..nv] {
            mx = mx.max(sj);
        }
        let corr = crate::elementwise::exp_fast(sq[2 * HD] - mx);
        for sj in p[qi].iter_mut() {
            *sj = crate::elementwise::exp_fast(*sj - mx);
        }
        let mut sum = 0f32;
        for &sj in &p[qi][..nv] {
            sum += sj;
        }
        sq[2 * HD] = mx;
        sq[2 * HD + 1] = sq[2 * HD + 1] * corr + sum;
        for (a, &x) in acc[qi].iter_mut().zip(&sq[HD..2 * HD]) {
            *a = x * corr;
        }
    }
    for j in 0..nv {
        let vr: &[f32; HD] = match vb[j * HD..(j + 1) * HD].try_into() {
            Ok(r) => r,
            Err(_) => return,
        };
        for qi in 0..G {
            let pj = p[qi][j];
            for d in 0..HD {
                acc[qi][d] += pj * vr[d];
            }
        }
    }
    for (qi, a) in acc.iter().enumerate() {
        st[qi * stride + HD..qi * stride + 2 * HD].copy_from_slice(a);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::attn_decode::attn_decode_f16_scalar;
    use crate::attn_decode::tests::data;
    use crate::quantdot::f32_to_f16;

    /// Runs `run` (a prompt-attention kernel: `q, k, v, shape, pos0, out`) on random data and
    /// compares every token with the scalar per-token decode kernel within `tol` relative.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn check_against_decode(
        n_head: usize,
        n_head_kv: usize,
        hd: usize,
        pos0: usize,
        n_tokens: usize,
        tol: f32,
        what: &str,
        run: impl Fn(&[f32], &[u16], &[u16], DecodeShape, usize, &mut [f32]),
    ) {
        let n_ctx = pos0 + n_tokens + 5;
        let kv: Vec<u16> = data(3, n_head_kv * n_ctx * hd, 2.0)
            .into_iter()
            .map(f32_to_f16)
            .collect();
        let vv: Vec<u16> = data(4, n_head_kv * n_ctx * hd, 1.0)
            .into_iter()
            .map(f32_to_f16)
            .collect();
        let width = n_head * hd;
        let q = data(5, n_tokens * width, 2.0);
        let shape = DecodeShape {
            n_head,
            n_head_kv,
            head_dim: hd,
            layout: KvLayout::HeadMajor { n_ctx },
        };
        let mut got = vec![f32::NAN; q.len()];
        run(&q, &kv, &vv, shape, pos0, &mut got);
        for t in 0..n_tokens {
            let mut want = vec![0f32; width];
            let qt = &q[t * width..(t + 1) * width];
            attn_decode_f16_scalar(qt, &kv, &vv, shape, pos0 + t + 1, &mut want).unwrap();
            for (i, (g, w)) in got[t * width..(t + 1) * width]
                .iter()
                .zip(&want)
                .enumerate()
            {
                assert!(
                    (g - w).abs() <= tol * (1.0 + w.abs()),
                    "{what} t={t} i={i}: {g} vs {w}"
                );
            }
        }
    }

    fn check(
        n_head: usize,
        n_head_kv: usize,
        hd: usize,
        pos0: usize,
        n_tokens: usize,
        threads: usize,
    ) {
        let pool = ThreadPool::new(threads);
        check_against_decode(
            n_head,
            n_head_kv,
            hd,
            pos0,
            n_tokens,
            1e-4,
            "f32 flash",
            |q, k, v, shape, pos0, out| {
                attn_prefill_f16(q, k, v, shape, pos0, out, Some(&pool)).unwrap()
            },
        );
    }

    #[test]
    fn matches_per_token_decode_on_awkward_sizes() {
        for &(nt, pos0) in &[(1, 0), (3, 0), (7, 5), (33, 0), (17, 70), (130, 3)] {
            check(6, 2, 64, pos0, nt, 1);
        }
        check(4, 4, 64, 0, 33, 3);
        check(9, 3, 128, 60, 100, 2);
        check(3, 1, 128, 1023, 7, 2);
        // Gemma 3's head size (MQA: one KV head for four query heads).
        check(4, 1, 256, 0, 33, 2);
        check(4, 1, 256, 9, 7, 1);
    }

    #[test]
    fn rejects_bad_shapes() {
        let shape = DecodeShape {
            n_head: 2,
            n_head_kv: 1,
            head_dim: 64,
            layout: KvLayout::HeadMajor { n_ctx: 4 },
        };
        let (k, v) = (vec![0u16; 4 * 64], vec![0u16; 4 * 64]);
        let q = vec![0f32; 128 * 3];
        let mut out = vec![0f32; 128 * 3];
        assert!(attn_prefill_f16(&q, &k, &v, shape, 2, &mut out, None).is_err()); // past n_ctx
        assert!(attn_prefill_f16(&q[..7], &k, &v, shape, 0, &mut out[..7], None).is_err());
        let pm = DecodeShape {
            layout: KvLayout::PosMajor,
            ..shape
        };
        assert!(attn_prefill_f16(&q, &k, &v, pm, 0, &mut out, None).is_err());
        let odd = DecodeShape {
            head_dim: 8,
            ..shape
        };
        assert!(attn_prefill_f16(&q, &k, &v, odd, 0, &mut out, None).is_err());
        assert!(!supports_head_dim(8) && supports_head_dim(128) && supports_head_dim(256));
    }
}
