//! `erf` and `exp` in f32 over tiles, written branch-free so that they vectorise, in blocks of 16 through a local
//! array (tiles may be transformed in place): the portable form. On AVX2 the same operations are written out
//! on eight lanes (`x86v3`, four vectors a step: the same bits, 1.2-1.6x faster than LLVM's vectorisation). GELU(erf)
//! evaluates `erf` once per element of a model's widest activation, and musl's scalar `erff` (`libm::erff`,
//! about 5 ns a call with its branches) was 12 % of an all-MiniLM-L6-v2 forward pass; `exp` is
//! [`crate::rows::exp_f32`] (1 ulp).
//!
//! `erf`, for `a = |x|`:
//! * `a < 0.875`: `erf(a) = a + a E(a^2)`, `E` of degree 6 fitted (least squares on Chebyshev nodes,
//!   coefficients rounded to f32) to `erf(a) / a - 1`: 7.5e-9 absolute error, and the product's rounding is
//!   relative to `E` (at most 0.13), not to the result;
//! * `0.875 <= a < 4`: `erf(a) = 1 - e^(-a^2) R(a)`, `R` of degree 12 in `a - 2.4375` fitted to
//!   `erfc(a) e^(a^2)` (2.2e-8 relative); `e^(-a^2)` from [`crate::rows::exp_f32`] (1 ulp). The rounding of
//!   `a^2` costs at most `a^2 2^-24` relative in `erfc`, which is at most 0.216 here: under 0.2 ulp of the result;
//! * `a >= 4`: 1 (erf(4) = 1 - 1.5e-8 rounds to 1 in f32);
//!
//! and the sign of `x`. NaN propagates. The unit test checks <= 2 ulp against f64 `erf` on a dense sample of
//! every binade (the bound the backend promises for transcendental functions); measured worst: 0.93 ulp with
//! FMA, 1.10 without.
//! The fit is reproducible with numpy: least squares on 4000 Chebyshev nodes of each interval (for `R`
//! weighted by the inverse of the target: relative error), in the variables named above.
//!
//! On AVX-512 the tiles take hand-written loops instead: `exp` in [`crate::rows`], and here the logistic
//! function on that `exp` (`x86::sigmoid_tile`) and `erf` (`x86::erf_tile`): the same small-argument
//! polynomial below 0.875, then from 0.875 to 4 `1 - erfc(a)`, `erfc` from a table `T` of 25 intervals of
//! 1/8, each a degree-5 polynomial in `t = 8 a - i - 1/2` (exact in f32), whose coefficients each lane picks
//! with `vpermt2ps`.
//! Neither `exp` nor the degree-12 polynomial is evaluated: the GELU epilogues of an all-MiniLM-L6-v2 cohort
//! of 32 went from ~7 % of the pass to ~4.7 %. `erfc` is known to a relative ~5e-7, so `1 - erfc` is almost
//! always the correctly rounded `erf` (98 % of the table's range, 99.96 % from 2 on, where GELU's
//! `1 + erf(x)` cancels). Measured worst: 0.88 ulp over the unit test's sample (in the small-argument
//! polynomial), 0.75 ulp in the table's range. `scripts/fit-erf-table.py` prints `T` as it stands here.

/// `erf(a)/a - 1` on [0, 0.875] in powers of `a^2`.
const S: [f32; 7] = [
    0.128_379_17,
    -0.376_126_38,
    0.112_837_44,
    -0.026_862_144,
    0.005_208_075_5,
    -0.000_822_587_35,
    8.737_628e-5,
];

/// `erfc(a) e^(a^2)` on [0.875, 4] in powers of `a - 2.4375`.
const R: [f32; 13] = [
    0.215_552_48,
    -0.077_560_81,
    0.026_497_975,
    -0.008_648_258,
    0.002_709_090_5,
    -0.000_817_070_6,
    0.000_238_672_1,
    -6.847_935e-5,
    1.858_804e-5,
    -4.280_663_7e-6,
    1.199_950_6e-6,
    -5.355_154e-7,
    1.212_920_5e-7,
];

/// `erfc(a) = 1 - erf(a)` on `[i / 8, (i + 1) / 8)` for `i` in 7..32, in powers of `t = 8 a - i - 1/2`:
/// coefficient `j` of interval `i` at `T[j][i]` (entries 0-6 repeat entry 7; those `a` take the small-argument
/// polynomial). Printed by `scripts/fit-erf-table.py`.
#[rustfmt::skip]
const T: [[f32; 32]; 6] = [
    [
        0.1848976, 0.1848976, 0.1848976, 0.1848976, 0.1848976, 0.1848976, 0.1848976, 0.1848976, 0.13294174,
        0.09307828, 0.06343143, 0.042059395, 0.027125387, 0.017010283, 0.010369374, 0.0061431937, 0.003536249,
        0.0019774912, 0.0010740733, 0.00056654325, 0.00029016886, 0.00014428853, 6.9650756e-5, 3.263529e-5,
        1.4841412e-5, 6.5501513e-6, 2.805313e-6, 1.1658256e-6, 4.7008794e-7, 1.8390406e-7, 6.979843e-8,
        2.5699201e-8,
    ],
    [
        -0.058568075, -0.058568075, -0.058568075, -0.058568075, -0.058568075, -0.058568075, -0.058568075,
        -0.058568075, -0.045612868, -0.034430392, -0.025189815, -0.017862255, -0.012276536, -0.008177935,
        -0.0052800723, -0.0033041846, -0.002004089, -0.0011781433, -0.0006712857, -0.0003707192,
        -0.00019843168, -0.00010294501, -5.1763993e-5, -2.5227755e-5, -1.1916746e-5, -5.455883e-6,
        -2.4210333e-6, -1.0412733e-6, -4.3406718e-7, -1.7537896e-7, -6.8679356e-8, -2.6067735e-8,
    ],
    [
        0.0068634036, 0.0068634036, 0.0068634036, 0.0068634036, 0.0068634036, 0.0068634036, 0.0068634036,
        0.0068634036, 0.0060578436, 0.0051107993, 0.0041326806, 0.0032096014, 0.002397757, 0.0017250454,
        0.0011962636, 0.000800231, 0.0005166805, 0.00032214815, 0.00019404384, 0.00011295321, 6.355998e-5,
        3.4582754e-5, 1.8198118e-5, 9.26319e-6, 4.561803e-6, 2.173786e-6, 1.0024334e-6, 4.474083e-7,
        1.9328846e-7, 8.083521e-8, 3.2728423e-8, 1.2829458e-8,
    ],
    [
        -0.00023113444, -0.00023113444, -0.00023113444, -0.00023113444, -0.00023113444, -0.00023113444,
        -0.00023113444, -0.00023113444, -0.00029871537, -0.00032645866, -0.00032080515, -0.00029142902,
        -0.00024825733, -0.00019999486, -0.00015318011, -0.00011199393, -7.8369136e-5, -5.2588704e-5,
        -3.3898898e-5, -2.1013302e-5, -1.2539734e-5, -7.2091048e-6, -3.9957886e-6, -2.1362732e-6,
        -1.1022253e-6, -5.4904785e-7, -2.6413184e-7, -1.2275548e-7, -5.5130233e-8, -2.3930761e-8,
        -1.0042591e-8, -4.074909e-9,
    ],
    [
        -2.2063745e-5, -2.2063745e-5, -2.2063745e-5, -2.2063745e-5, -2.2063745e-5, -2.2063745e-5,
        -2.2063745e-5, -2.2063745e-5, -1.1352006e-5, -2.5317113e-6, 4.8452193e-6, 9.518722e-6, 1.1751585e-5,
        1.2057354e-5, 1.1124768e-5, 9.395768e-6, 7.4077902e-6, 5.515852e-6, 3.8907774e-6, 2.616858e-6,
        1.680292e-6, 1.0337918e-6, 6.09482e-7, 3.452788e-7, 1.8803163e-7, 9.853655e-8, 4.9739672e-8,
        2.4192927e-8, 1.1345828e-8, 5.1328395e-9, 2.2405462e-9, 9.443623e-10,
    ],
    [
        2.0267598e-6, 2.0267598e-6, 2.0267598e-6, 2.0267598e-6, 2.0267598e-6, 2.0267598e-6, 2.0267598e-6,
        2.0267598e-6, 1.7103238e-6, 1.7688108e-6, 1.1462378e-6, 6.0837135e-7, 2.1298523e-7, -6.446492e-8,
        -3.0638955e-7, -3.877771e-7, -3.87903e-7, -3.5654887e-7, -2.8640474e-7, -2.1858172e-7, -1.5463732e-7,
        -1.0447267e-7, -6.6240396e-8, -4.0290264e-8, -2.3343432e-8, -1.2950466e-8, -6.9034187e-9, -3.530897e-9,
        -1.7335142e-9, -8.1978313e-10, -3.7250658e-10, -1.633897e-10,
    ],
];

#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// `erf(x)` in f32 (see the module doc).
#[inline(always)]
pub(crate) fn erf_f32<const FMA: bool>(x: f32) -> f32 {
    let a = x.abs();
    let z = a * a;
    let mut p = S[6];
    for &c in S[..6].iter().rev() {
        p = madd::<FMA>(p, z, c);
    }
    // a + a E: the rounding of the product is relative to E (at most 0.13), not to the result.
    let small = madd::<FMA>(a, p, a);
    let ac = a.clamp(0.875, 4.0);
    let t = ac - 2.4375;
    let mut r = R[12];
    for &c in R[..12].iter().rev() {
        r = madd::<FMA>(r, t, c);
    }
    let large = madd::<FMA>(-crate::rows::exp_f32::<FMA>(-(ac * ac)), r, 1.0);
    let y = if a < 0.875 {
        small
    } else if a < 4.0 {
        large
    } else {
        1.0
    };
    if x.is_nan() { x } else { y.copysign(x) }
}

/// The logistic function `1 / (1 + e^-x)` in f32 (SiLU's gate): with `e = e^-|x|` ([`crate::rows::exp_f32`],
/// 1 ulp), `1 / (1 + e)` for `x >= 0` and `e / (1 + e)` below (no overflow, and tiny results keep their
/// relative accuracy); e's error reaches the result scaled by at most 1, each rounding adds half an ulp: the
/// unit test checks <= 2 ulp against f64. NaN propagates; +-inf give 1 and 0.
#[inline(always)]
pub(crate) fn sigmoid_f32<const FMA: bool>(x: f32) -> f32 {
    let e = crate::rows::exp_f32::<FMA>(-x.abs());
    let num = if x >= 0.0 { 1.0 } else { e };
    let y = num / (1.0 + e);
    if x.is_nan() { x } else { y }
}

/// The functions the tile entry points apply.
#[derive(Clone, Copy)]
pub(crate) enum Fun {
    Erf,
    Exp,
    Sigmoid,
}

/// `dst[i] = f(src[i])` for `i < n`; `src` and `dst` may be the same region (each block of 16 is read before
/// it is written).
///
/// # Safety
/// `src` is readable and `dst` writable for `n` f32 values (either may be unaligned).
pub(crate) unsafe fn tile(f: Fun, src: *const f32, dst: *mut f32, n: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") && has!("fma") {
            // Hand-written 16-lane loops, about half the instructions of the vectorised portable forms: exp
            // (`vscalefps` scaling, Estrin's polynomial; the same 1 ulp bound), the logistic function built on
            // it as `sigmoid_f32` is, and erf by a table of polynomials (`x86::erf_tile`). All unit-tested
            // against f64 as the portable forms are.
            // SAFETY: the features are present; the pointers as the caller promised.
            unsafe {
                match f {
                    Fun::Exp => crate::rows::exp_tile(src, dst, n),
                    Fun::Sigmoid => x86::sigmoid_tile(src, dst, n),
                    Fun::Erf => x86::erf_tile(src, dst, n),
                }
            }
            return;
        }
        if has!("avx2") && has!("fma") {
            // SAFETY: the features are present; the pointers as the caller promised.
            return unsafe { tile_avx2(f, src, dst, n) };
        }
    }
    // SAFETY: as the caller promised.
    unsafe { dispatch::<false>(f, src, dst, n) }
}

/// [`tile`] on AVX2 and FMA: the portable forms' operations (`dispatch::<true>`), written out on eight lanes
/// (`x86v3`): the same bits, 1.2-1.6x faster than LLVM's vectorisation of the portable loops (BENCHMARKS.md
/// of this crate, Zen 3 section).
///
/// # Safety
/// AVX2 and FMA are present; the pointers as [`tile`]'s caller promised.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2(f: Fun, src: *const f32, dst: *mut f32, n: usize) {
    // SAFETY: as `tile`'s caller promised; the features are enabled here.
    unsafe {
        match f {
            Fun::Erf => x86v3::map(src, dst, n, |x| x86v3::erf(x), |x| x86v3::erf(x)),
            Fun::Exp => x86v3::map(src, dst, n, |x| x86v3::exp(x), |x| x86v3::exp(x)),
            Fun::Sigmoid => x86v3::map(src, dst, n, |x| x86v3::sigmoid(x), |x| x86v3::sigmoid(x)),
        }
    }
}

#[inline(always)]
unsafe fn dispatch<const FMA: bool>(f: Fun, src: *const f32, dst: *mut f32, n: usize) {
    // SAFETY: as `tile`'s caller promised.
    unsafe {
        match f {
            Fun::Erf => blocks(erf_f32::<FMA>, src, dst, n),
            Fun::Exp => blocks(crate::rows::exp_f32::<FMA>, src, dst, n),
            Fun::Sigmoid => blocks(sigmoid_f32::<FMA>, src, dst, n),
        }
    }
}

/// Blocks of 16 through a local array: a fixed-length loop without aliasing that LLVM vectorises.
#[inline(always)]
unsafe fn blocks(f: impl Fn(f32) -> f32, src: *const f32, dst: *mut f32, n: usize) {
    let mut i = 0;
    // Whole blocks: copies of a constant length, which compile to vector moves (a variable-length copy is a
    // `memmove` call per block).
    while i + 16 <= n {
        let mut b = [0f32; 16];
        // SAFETY: i + 16 <= n: inside both regions; the copies tolerate src == dst.
        unsafe { std::ptr::copy_nonoverlapping(src.add(i), b.as_mut_ptr(), 16) };
        for v in &mut b {
            *v = f(*v);
        }
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), dst.add(i), 16) };
        i += 16;
    }
    while i < n {
        let k = (n - i).min(16);
        let mut b = [0f32; 16];
        // SAFETY: i + k <= n: inside both regions; the copies tolerate src == dst.
        unsafe { std::ptr::copy_nonoverlapping(src.add(i), b.as_mut_ptr(), k) };
        for v in &mut b {
            *v = f(*v);
        }
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), dst.add(i), k) };
        i += k;
    }
}

/// The portable forms with fused multiply-adds (`erf_f32::<true>`, `exp_f32::<true>`, `sigmoid_f32::<true>`)
/// on eight AVX2 lanes, operation for operation: the same roundings in the same order, so the same bits (the
/// tests compare them over every binade and the special values). Both arms of `erf` are evaluated and
/// selected per lane, as LLVM's vectorisation of the branch-free portable form did.
#[cfg(target_arch = "x86_64")]
mod x86v3 {
    use super::{R, S};
    use std::arch::x86_64::*;

    /// Vectors a step of the loops' bulk works on together: each operation below is applied to all `W`
    /// vectors of a `V<W>` before the next, so `W` independent chains (one vector's `erf` is ~40 dependent
    /// operations) interleave in program order and each constant, loaded once, serves `W` vectors. Measured
    /// on Zen 3 (`erf`, ns an element): 1.64 at one vector a step (as LLVM's loops), 1.60 at two, 1.65 at
    /// three, 1.37 at four and five. What is left of a tile after the bulk goes one vector at a time.
    const BULK: usize = 4;
    pub(super) type V<const W: usize> = [__m256; W];

    #[inline(always)]
    fn each<const W: usize>(f: impl Fn(usize) -> __m256) -> V<W> {
        std::array::from_fn(f)
    }

    #[inline(always)]
    fn c<const W: usize>(v: f32) -> V<W> {
        // SAFETY: AVX is implied by every caller's AVX2 target feature.
        [unsafe { _mm256_set1_ps(v) }; W]
    }

    /// `x` where `x` is NaN (the portable forms return the argument itself), `y` elsewhere.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn nan_passes<const W: usize>(x: V<W>, y: V<W>) -> V<W> {
        each(|i| _mm256_blendv_ps(y[i], x[i], _mm256_cmp_ps::<_CMP_UNORD_Q>(x[i], x[i])))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn fma<const W: usize>(a: V<W>, b: V<W>, c: V<W>) -> V<W> {
        each(|i| _mm256_fmadd_ps(a[i], b[i], c[i]))
    }

    /// `-(a b) + c`, which is `fma(-a, b, c)` (the negation is exact).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn fnma<const W: usize>(a: V<W>, b: V<W>, c: V<W>) -> V<W> {
        each(|i| _mm256_fnmadd_ps(a[i], b[i], c[i]))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn mul<const W: usize>(a: V<W>, b: V<W>) -> V<W> {
        each(|i| _mm256_mul_ps(a[i], b[i]))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn clamp<const W: usize>(x: V<W>, lo: f32, hi: f32) -> V<W> {
        let (lo, hi) = (_mm256_set1_ps(lo), _mm256_set1_ps(hi));
        each(|i| _mm256_min_ps(_mm256_max_ps(x[i], lo), hi))
    }

    /// `lt` where `a < b`, `ge` elsewhere.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn select_lt<const W: usize>(a: V<W>, b: f32, lt: V<W>, ge: V<W>) -> V<W> {
        let b = _mm256_set1_ps(b);
        each(|i| _mm256_blendv_ps(ge[i], lt[i], _mm256_cmp_ps::<_CMP_LT_OQ>(a[i], b)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn sign<const W: usize>() -> V<W> {
        // SAFETY: AVX2 is enabled here.
        each(|_| _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN)))
    }

    /// `crate::rows::exp_f32::<true>`, lane for lane: the clamp to [-105, 89], `n` by the 1.5 * 2^23 rounding
    /// constant, the two-part reduction, Horner's polynomial, and the scale as two powers of two.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn exp<const W: usize>(x: V<W>) -> V<W> {
        const MAGIC: f32 = 12_582_912.0;
        let xc = clamp(x, -105.0, 89.0);
        let t = fma(xc, c(std::f32::consts::LOG2_E), c(MAGIC));
        let magic = _mm256_set1_ps(MAGIC);
        let n: V<W> = each(|i| _mm256_sub_ps(t[i], magic));
        let bias = _mm256_set1_epi32(0x4B40_0000);
        let ni: [__m256i; W] =
            std::array::from_fn(|i| _mm256_sub_epi32(_mm256_castps_si256(t[i]), bias));
        let r = fnma(n, c(-2.121_944_4e-4), fnma(n, c(0.693_359_4), xc));
        let mut p = c(1.987_569_1e-4);
        for k in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            1.666_666_5e-1,
            0.5,
        ] {
            p = fma(p, r, c(k));
        }
        let y = fma(p, mul(r, r), r);
        let one = _mm256_set1_ps(1.0);
        let y: V<W> = each(|i| _mm256_add_ps(y[i], one));
        let (lo, hi) = (_mm256_set1_epi32(-126), _mm256_set1_epi32(127));
        let pow2 =
            |k: __m256i| _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(k, hi)));
        let e: V<W> = each(|i| {
            let n1 = _mm256_min_epi32(_mm256_max_epi32(ni[i], lo), hi);
            let n2 = _mm256_sub_epi32(ni[i], n1);
            _mm256_mul_ps(_mm256_mul_ps(y[i], pow2(n1)), pow2(n2))
        });
        nan_passes(x, e)
    }

    /// `super::erf_f32::<true>`, lane for lane.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn erf<const W: usize>(x: V<W>) -> V<W> {
        let sign: V<W> = sign();
        let a: V<W> = each(|i| _mm256_andnot_ps(sign[i], x[i]));
        let z = mul(a, a);
        let mut p = c(S[6]);
        for &k in S[..6].iter().rev() {
            p = fma(p, z, c(k));
        }
        let small = fma(a, p, a);
        let ac = clamp(a, 0.875, 4.0);
        let mid = _mm256_set1_ps(2.4375);
        let t: V<W> = each(|i| _mm256_sub_ps(ac[i], mid));
        let mut r = c(R[12]);
        for &k in R[..12].iter().rev() {
            r = fma(r, t, c(k));
        }
        // -(ac * ac): the product rounded, then negated (exact).
        let sq = mul(ac, ac);
        let e = exp::<W>(each(|i| _mm256_xor_ps(sq[i], sign[i])));
        let large = fnma(e, r, c(1.0));
        let y = select_lt(a, 0.875, small, select_lt(a, 4.0, large, c(1.0)));
        // copysign(y, x): y is non-negative here.
        nan_passes(
            x,
            each(|i| _mm256_or_ps(y[i], _mm256_and_ps(x[i], sign[i]))),
        )
    }

    /// `super::sigmoid_f32::<true>`, lane for lane.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn sigmoid<const W: usize>(x: V<W>) -> V<W> {
        let sign: V<W> = sign();
        let e = exp::<W>(each(|i| _mm256_or_ps(x[i], sign[i])));
        let one = _mm256_set1_ps(1.0);
        let y: V<W> = each(|i| {
            let ge = _mm256_cmp_ps::<_CMP_GE_OQ>(x[i], _mm256_setzero_ps());
            _mm256_div_ps(_mm256_blendv_ps(e[i], one, ge), _mm256_add_ps(one, e[i]))
        });
        nan_passes(x, y)
    }

    /// `dst[i] = f(src[i])` for `i < n`: `8 BULK` lanes at a time by `bulk`, then eight at a time by `one`,
    /// the last `n % 8` by masked loads and stores (the lanes past the end read 0 and are not stored). `bulk` and `one` are the
    /// same function at two widths, so every element gets the same bits. `src` and `dst` may be the same
    /// region.
    ///
    /// # Safety
    /// AVX2 and FMA are present; `src` is readable and `dst` writable for `n` f32 values.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn map(
        src: *const f32,
        dst: *mut f32,
        n: usize,
        bulk: impl Fn(V<BULK>) -> V<BULK>,
        one: impl Fn(V<1>) -> V<1>,
    ) {
        let mut i = 0;
        // SAFETY: each load and store covers elements below `n` (the loop conditions; the masked tail touches
        // only its `n - i` lanes): inside both regions (the caller's contract).
        unsafe {
            while i + 8 * BULK <= n {
                let x: V<BULK> = std::array::from_fn(|j| _mm256_loadu_ps(src.add(i + 8 * j)));
                for (j, y) in bulk(x).iter().enumerate() {
                    _mm256_storeu_ps(dst.add(i + 8 * j), *y);
                }
                i += 8 * BULK;
            }
            while i + 8 <= n {
                let [y] = one([_mm256_loadu_ps(src.add(i))]);
                _mm256_storeu_ps(dst.add(i), y);
                i += 8;
            }
            if i < n {
                let lanes = _mm256_cmpgt_epi32(
                    _mm256_set1_epi32((n - i) as i32),
                    _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                );
                let [y] = one([_mm256_maskload_ps(src.add(i), lanes)]);
                _mm256_maskstore_ps(dst.add(i), lanes, y);
            }
        }
    }
}

/// The AVX-512 tile loops of `erf` and the logistic function (sixteen lanes at a time, [`crate::rows::map16`]).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{S, T};
    use crate::rows::{exp16, map16};
    use std::arch::x86_64::*;

    /// `erf` on 16 lanes: the portable form's small-argument polynomial below 0.875, and from there to 4
    /// `1 - erfc(a)`, `erfc` from a table of 25 intervals of 1/8 (`T`), each a degree-5 polynomial in
    /// `t = 8 a - i - 1/2` (`u = 8 a`, its floor and `t` are exact), its coefficients picked per lane by
    /// `vpermt2ps`. No `exp` and no second polynomial: about half the instructions of the portable form, for
    /// GELU's epilogue.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn erf16(x: __m512) -> __m512 {
        let sign = _mm512_set1_epi32(i32::MIN);
        let a = _mm512_castsi512_ps(_mm512_andnot_si512(sign, _mm512_castps_si512(x)));
        // a + a E(a^2) below 0.875, as `erf_f32`.
        let z = _mm512_mul_ps(a, a);
        let mut e = _mm512_set1_ps(S[6]);
        for &c in S[..6].iter().rev() {
            e = _mm512_fmadd_ps(e, z, _mm512_set1_ps(c));
        }
        let small = _mm512_fmadd_ps(a, e, a);
        // The table from 0.875 to 4 (other lanes compute garbage that the selects below drop).
        let u = _mm512_mul_ps(a, _mm512_set1_ps(8.0));
        let fl = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(u);
        let i = _mm512_cvttps_epi32(fl);
        let t = _mm512_sub_ps(_mm512_sub_ps(u, fl), _mm512_set1_ps(0.5));
        let coef = |j: usize| {
            // SAFETY: T[j] holds 32 f32: two unaligned loads of 16.
            let (lo, hi) = unsafe {
                (
                    _mm512_loadu_ps(T[j].as_ptr()),
                    _mm512_loadu_ps(T[j].as_ptr().add(16)),
                )
            };
            _mm512_permutex2var_ps(lo, i, hi)
        };
        let mut q = coef(5);
        for j in (0..5).rev() {
            q = _mm512_fmadd_ps(q, t, coef(j));
        }
        // 1 - erfc: one rounding of a value known to a relative ~5e-7, so almost always the correctly rounded
        // erf, also within a few ulps of 1 (where GELU's 1 + erf(x) cancels).
        let p = _mm512_sub_ps(_mm512_set1_ps(1.0), q);
        let big = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(a, _mm512_set1_ps(0.875));
        let one = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(a, _mm512_set1_ps(4.0));
        let y = _mm512_mask_blend_ps(big, small, p);
        let y = _mm512_mask_blend_ps(one, y, _mm512_set1_ps(1.0));
        // The sign of x; NaN returned as it is.
        let y = _mm512_castsi512_ps(_mm512_or_si512(
            _mm512_castps_si512(y),
            _mm512_and_si512(_mm512_castps_si512(x), sign),
        ));
        _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x), y, x)
    }

    /// `dst[i] = erf(src[i])` for `i < n` by [`erf16`]; `src` and `dst` may be the same region.
    ///
    /// # Safety
    /// AVX-512F; `src` is readable and `dst` writable for `n` f32 values.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn erf_tile(src: *const f32, dst: *mut f32, n: usize) {
        // SAFETY: the caller's contract.
        unsafe { map16(src, dst, n, |x| erf16(x)) }
    }

    /// `dst[i] = 1 / (1 + e^-src[i])` for `i < n`: the logistic function as [`super::sigmoid_f32`] computes it
    /// (`e = e^-|x|`, then `1 / (1 + e)` for `x >= 0` and `e / (1 + e)` below, NaN returned as it is), with
    /// `e` from [`exp16`] (the same 1 ulp bound, about half the instructions of the vectorised portable
    /// `exp`). SiLU's gate, once per element of an FFN's widest row. `src` and `dst` may be the same region.
    ///
    /// # Safety
    /// AVX-512F; `src` is readable and `dst` writable for `n` f32 values.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn sigmoid_tile(src: *const f32, dst: *mut f32, n: usize) {
        let f = |x: __m512| {
            let one = _mm512_set1_ps(1.0);
            // -|x|: the sign bit set.
            let neg = _mm512_castsi512_ps(_mm512_or_si512(
                _mm512_castps_si512(x),
                _mm512_set1_epi32(i32::MIN),
            ));
            let e = exp16::<false>(neg);
            let pos = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_setzero_ps());
            let y = _mm512_div_ps(_mm512_mask_blend_ps(pos, e, one), _mm512_add_ps(one, e));
            _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x), y, x)
        };
        // SAFETY: the caller's contract.
        unsafe { map16(src, dst, n, f) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place between an f32 and the correctly rounded f64 value.
    fn ulps(got: f32, want: f64) -> f64 {
        let w = want as f32;
        if got == w {
            return 0.0;
        }
        let ulp = (f32::from_bits(w.abs().to_bits() + 1) - w.abs()) as f64;
        (got as f64 - want).abs() / ulp
    }

    fn check<const FMA: bool>() -> f64 {
        let mut worst = (0.0, 0.0f32);
        // Every 61st bit pattern from the smallest subnormal to 5.0, both signs.
        let top = 5.0f32.to_bits();
        let mut b = 1u32;
        while b <= top {
            for x in [f32::from_bits(b), -f32::from_bits(b)] {
                let got = erf_f32::<FMA>(x);
                let want = libm::erf(x as f64);
                let u = ulps(got, want);
                if u > worst.0 {
                    worst = (u, x);
                }
            }
            b += 61;
        }
        assert!(worst.0 <= 2.0, "FMA={FMA}: {} ulp at {}", worst.0, worst.1);
        worst.0
    }

    #[test]
    fn within_two_ulp_of_f64_erf_with_and_without_fma() {
        let (a, b) = (check::<true>(), check::<false>());
        println!("worst: {a:.3} ulp fused, {b:.3} ulp unfused");
    }

    /// The tile path (on AVX-512 its own table form, `x86::erf_tile`) over the same sweep as `check`, a million
    /// values a call, and its edges: signed zeros, infinities, NaN, a subnormal, the table's ends.
    #[test]
    fn the_tile_erf_is_within_two_ulp_of_f64_erf() {
        let top = 5.0f32.to_bits();
        let mut worst = (0.0, 0.0f32);
        let mut b = 1u32;
        while b <= top {
            let mut src = Vec::with_capacity(1 << 20);
            while b <= top && src.len() < (1 << 20) {
                src.extend([f32::from_bits(b), -f32::from_bits(b)]);
                b += 61;
            }
            let mut out = src.clone();
            // SAFETY: the region holds src.len() values.
            unsafe { tile(Fun::Erf, out.as_ptr(), out.as_mut_ptr(), out.len()) };
            for (&x, &y) in src.iter().zip(&out) {
                let u = ulps(y, libm::erf(x as f64));
                if u > worst.0 {
                    worst = (u, x);
                }
            }
        }
        assert!(worst.0 <= 2.0, "tile erf: {} ulp at {}", worst.0, worst.1);
        println!("tile erf worst: {:.3} ulp at {}", worst.0, worst.1);
        let edges = [
            0.0f32,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e30,
            f32::MIN_POSITIVE / 4.0,
            0.875,
            f32::from_bits(0.875f32.to_bits() - 1),
            4.0,
            f32::from_bits(4.0f32.to_bits() - 1),
            -3.9999998,
            f32::NAN,
        ];
        let mut out = edges;
        // SAFETY: the array holds 12 values.
        unsafe { tile(Fun::Erf, out.as_ptr(), out.as_mut_ptr(), out.len()) };
        assert_eq!(out[0].to_bits(), 0.0f32.to_bits());
        assert_eq!(out[1].to_bits(), (-0.0f32).to_bits());
        assert_eq!(out[2..5], [1.0, -1.0, 1.0]);
        assert!(out[5] > 0.0);
        for (&x, &y) in edges[6..11].iter().zip(&out[6..11]) {
            assert!(ulps(y, libm::erf(x as f64)) <= 2.0, "erf({x}) = {y}");
        }
        assert!(out[11].is_nan());
    }

    /// The AVX2 tile loops give the portable fused forms' bits, over every 4099th bit pattern (both signs,
    /// subnormals, infinities and NaNs among them) and lengths that leave a scalar tail.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_avx2_tiles_give_the_portable_bits() {
        if !(std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma"))
        {
            return;
        }
        let src: Vec<f32> = (0..=u32::MAX / 4099)
            .map(|i| f32::from_bits(i * 4099))
            .collect();
        type Scalar = fn(f32) -> f32;
        let scalar: [(Fun, Scalar); 3] = [
            (Fun::Erf, erf_f32::<true>),
            (Fun::Exp, crate::rows::exp_f32::<true>),
            (Fun::Sigmoid, sigmoid_f32::<true>),
        ];
        for (f, s) in scalar {
            for len in [src.len(), 13, 7] {
                let mut out = vec![0f32; len];
                // SAFETY: the features were detected; both regions hold `len` values.
                unsafe { tile_avx2(f, src.as_ptr(), out.as_mut_ptr(), len) };
                for (&x, &y) in src.iter().zip(&out) {
                    assert_eq!(y.to_bits(), s(x).to_bits(), "at {x:e} ({:#x})", x.to_bits());
                }
            }
        }
    }

    #[test]
    fn sigmoid_is_within_two_ulp() {
        let f64s = |x: f32| 1.0 / (1.0 + (-(x as f64)).exp());
        let mut worst = (0.0f64, 0.0f32);
        // Every binade of both signs, densely, out to where the result is 1 or underflows.
        let mut x = 1e-30f32;
        while x < 120.0 {
            for v in [x, -x] {
                for f in [sigmoid_f32::<true>, sigmoid_f32::<false>] {
                    let u = ulps(f(v), f64s(v));
                    if u > worst.0 {
                        worst = (u, v);
                    }
                }
            }
            x *= 1.0007;
        }
        assert!(
            worst.0 <= 2.0,
            "sigmoid max error {} ulp at {}",
            worst.0,
            worst.1
        );
        for f in [sigmoid_f32::<true>, sigmoid_f32::<false>] {
            assert_eq!(f(0.0), 0.5);
            assert_eq!(f(f32::INFINITY), 1.0);
            assert_eq!(f(f32::NEG_INFINITY), 0.0);
            assert!(f(f32::NAN).is_nan());
        }
        // The tile path (16 lanes and a tail, in place; AVX-512's own loop where the CPU has it): the same
        // bound over the same sweep, and the same edges.
        let mut src = vec![
            0.0f32,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
        ];
        let mut x = 1e-30f32;
        while x < 120.0 {
            src.extend([x, -x]);
            x *= 1.0007;
        }
        src.extend((0..37).map(|i| (i as f32 - 18.0) * 1.7));
        let mut out = src.clone();
        // SAFETY: the region holds src.len() values.
        unsafe { tile(Fun::Sigmoid, out.as_ptr(), out.as_mut_ptr(), out.len()) };
        assert_eq!(out[..4], [0.5, 0.5, 1.0, 0.0]);
        assert!(out[4].is_nan() && out[5].is_nan());
        for (o, s) in out.iter().zip(&src).skip(6) {
            assert!(ulps(*o, f64s(*s)) <= 2.0, "tile sigmoid({s}) = {o}");
        }
    }

    #[test]
    fn edges_and_the_tile_path() {
        for f in [erf_f32::<true>, erf_f32::<false>] {
            assert_eq!(f(0.0).to_bits(), 0.0f32.to_bits());
            assert_eq!(f(-0.0).to_bits(), (-0.0f32).to_bits());
            assert_eq!(f(f32::INFINITY), 1.0);
            assert_eq!(f(f32::NEG_INFINITY), -1.0);
            assert_eq!(f(1e30), 1.0);
            assert!(f(f32::NAN).is_nan());
            assert!(f(f32::MIN_POSITIVE / 4.0) > 0.0);
        }
        // Every length around the block size, in place and out of place, against the scalar function.
        for n in [0usize, 1, 15, 16, 17, 33, 100] {
            let src: Vec<f32> = (0..n).map(|i| (i as f32 - 50.0) * 0.09).collect();
            let mut out = vec![f32::NAN; n];
            // SAFETY: both regions hold n values.
            unsafe { tile(Fun::Erf, src.as_ptr(), out.as_mut_ptr(), n) };
            let mut inplace = src.clone();
            // SAFETY: as above, the same region.
            unsafe { tile(Fun::Erf, inplace.as_ptr(), inplace.as_mut_ptr(), n) };
            let mut exp = vec![f32::NAN; n];
            // SAFETY: as above.
            unsafe { tile(Fun::Exp, src.as_ptr(), exp.as_mut_ptr(), n) };
            for i in 0..n {
                assert!(ulps(out[i], libm::erf(src[i] as f64)) <= 2.0, "{}", src[i]);
                assert_eq!(out[i].to_bits(), inplace[i].to_bits());
                assert!(ulps(exp[i], (src[i] as f64).exp()) <= 1.0, "exp {}", src[i]);
            }
        }
    }
}
