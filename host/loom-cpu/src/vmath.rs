//! `erf` and `exp` in f32 over tiles, written branch-free so that LLVM vectorises them (16 lanes under AVX-512,
//! 8 under AVX2), in blocks of 16 through a local array (tiles may be transformed in place). GELU(erf)
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
            // The hand-written 16-lane exp (`vscalefps` scaling, Estrin's polynomial), about half the
            // instructions of the vectorised portable one; the same 1 ulp bound (both unit-tested). The
            // logistic function is built on it the same way as `sigmoid_f32`.
            // SAFETY (both): the feature is present; the pointers as the caller promised.
            match f {
                Fun::Exp => return unsafe { crate::rows::exp_tile(src, dst, n) },
                Fun::Sigmoid => return unsafe { crate::rows::sigmoid_tile(src, dst, n) },
                Fun::Erf => {}
            }
            // SAFETY: the features are present; the pointers as the caller promised.
            return unsafe { tile_avx512(f, src, dst, n) };
        }
        if has!("avx2") && has!("fma") {
            // SAFETY: as above.
            return unsafe { tile_avx2(f, src, dst, n) };
        }
    }
    // SAFETY: as the caller promised.
    unsafe { dispatch::<false>(f, src, dst, n) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn tile_avx512(f: Fun, src: *const f32, dst: *mut f32, n: usize) {
    // SAFETY: as `tile`'s caller promised.
    unsafe { dispatch::<true>(f, src, dst, n) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2(f: Fun, src: *const f32, dst: *mut f32, n: usize) {
    // SAFETY: as `tile`'s caller promised.
    unsafe { dispatch::<true>(f, src, dst, n) }
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
