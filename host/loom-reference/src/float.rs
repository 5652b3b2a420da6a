//! Floating-point formats and functions the reference defines itself, so that the oracle does not depend on a
//! platform library for anything backends are compared on: f16/bf16 conversions, rounding to a value's dtype,
//! integer-to-float conversion and `erf`.
//!
//! Every rounding here is IEEE 754 round-to-nearest-even, performed **once** from the exact (or f64) input: an
//! `f64 -> f16` conversion never goes through `f32` (that would round twice and can differ in the last bit).

use loom_ir::kernel::DType;

/// Largest finite f16 (65504).
pub const F16_MAX: f64 = 65504.0;
/// Largest finite bf16 ((2 - 2^-7) * 2^127).
pub const BF16_MAX: f64 = 3.389_531_389_251_535_5e38;

/// `2^k` for `-1022 <= k <= 1023`, exactly.
fn pow2(k: i32) -> f64 {
    debug_assert!((-1022..=1023).contains(&k), "pow2({k})");
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// Rounds `x` to the nearest value of a binary format with `p` significand bits (implicit bit included),
/// minimum normal exponent `emin` (subnormals below it) and largest finite value `max`, ties to even; values
/// that round beyond `max` become infinities. NaN, infinities and zeros pass through (sign kept).
fn round_to_format(x: f64, p: i32, emin: i32, max: f64) -> f64 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    let a = x.abs();
    // floor(log2(a)); an f64 subnormal (biased exponent 0) is far below every narrow format and rounds to 0.
    let e = ((a.to_bits() >> 52) as i32) - 1023;
    // The spacing of representable values around `a` is 2^q.
    let q = e.max(emin) - (p - 1);
    // Scaling by a power of two is exact here, so the only rounding is `round_ties_even`.
    let r = (a * pow2(-q)).round_ties_even() * pow2(q);
    let r = if r > max { f64::INFINITY } else { r };
    r.copysign(x)
}

/// Rounds `x` to the nearest f16 value (ties to even), returned as the (exactly representable) f64.
pub fn round_f16(x: f64) -> f64 {
    round_to_format(x, 11, -14, F16_MAX)
}

/// Rounds `x` to the nearest bf16 value (ties to even), returned as the (exactly representable) f64.
pub fn round_bf16(x: f64) -> f64 {
    round_to_format(x, 8, -126, BF16_MAX)
}

/// Rounds a float value to what `dtype` can hold (identity for f64; integer dtypes are not float values and
/// are returned unchanged).
pub fn round_to(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::F32 => x as f32 as f64,
        DType::F16 => round_f16(x),
        DType::BF16 => round_bf16(x),
        _ => x,
    }
}

/// The f16 with bit pattern `h`, exactly.
pub fn f16_to_f64(h: u16) -> f64 {
    let exp = i32::from((h >> 10) & 0x1f);
    let man = f64::from(h & 0x3ff);
    let mag = match exp {
        0 => man * pow2(-24),
        31 if man == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        _ => (1024.0 + man) * pow2(exp - 25),
    };
    if h & 0x8000 != 0 { -mag } else { mag }
}

/// The f16 with bit pattern `h` as f32 (exact: every f16 is an f32).
pub fn f16_to_f32(h: u16) -> f32 {
    f16_to_f64(h) as f32
}

/// `x` rounded to f16 (ties to even; overflow to infinity; NaN becomes the quiet NaN `0x7e00` with `x`'s sign).
pub fn f64_to_f16(x: f64) -> u16 {
    let sign: u16 = if x.is_sign_negative() { 0x8000 } else { 0 };
    if x.is_nan() {
        return sign | 0x7e00;
    }
    let r = round_f16(x).abs();
    if r.is_infinite() {
        sign | 0x7c00
    } else if r < pow2(-14) {
        // Subnormal (or zero): an exact multiple of 2^-24 below 2^10.
        sign | (r * pow2(24)) as u16
    } else {
        let e = ((r.to_bits() >> 52) as i32) - 1023;
        let man = (r * pow2(10 - e)) as u16 - 1024;
        sign | (((e + 15) as u16) << 10) | man
    }
}

/// `x` rounded to f16; see [`f64_to_f16`].
pub fn f32_to_f16(x: f32) -> u16 {
    f64_to_f16(f64::from(x))
}

/// The bf16 with bit pattern `h` as f32 (bf16 is the top half of an f32).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// `x` rounded to bf16 (ties to even; overflow to infinity; NaN becomes the quiet NaN `0x7fc0` with `x`'s sign).
pub fn f64_to_bf16(x: f64) -> u16 {
    if x.is_nan() {
        return if x.is_sign_negative() { 0xffc0 } else { 0x7fc0 };
    }
    // The rounded value is an f32 whose low 16 bits are zero.
    ((round_bf16(x) as f32).to_bits() >> 16) as u16
}

/// `x` rounded to bf16; see [`f64_to_bf16`].
pub fn f32_to_bf16(x: f32) -> u16 {
    f64_to_bf16(f64::from(x))
}

/// Converts an integer to the float `dtype` with a single round-to-nearest-even (going through f64 first would
/// round twice for |x| > 2^53).
pub(crate) fn int_to_float(dtype: DType, x: i64) -> f64 {
    match dtype {
        DType::F32 => x as f32 as f64,
        DType::F16 => {
            let r = round_int(x, 11);
            if r.abs() > F16_MAX {
                f64::INFINITY.copysign(r)
            } else {
                r
            }
        }
        // |x| < 2^63 is far below BF16_MAX.
        DType::BF16 => round_int(x, 8),
        _ => x as f64,
    }
}

/// `x` rounded to `p` significant bits (ties to even), exactly, with no exponent limit.
fn round_int(x: i64, p: u32) -> f64 {
    let a = x.unsigned_abs();
    let bits = 64 - a.leading_zeros();
    let mag = if bits <= p {
        a as f64
    } else {
        let shift = bits - p;
        let mut q = a >> shift;
        let rem = a & ((1u64 << shift) - 1);
        let half = 1u64 << (shift - 1);
        if rem > half || (rem == half && q & 1 == 1) {
            q += 1;
        }
        // q <= 2^p and shift < 64: both factors and the product are exact in f64.
        q as f64 * pow2(shift as i32)
    };
    if x < 0 { -mag } else { mag }
}

/// The error function, within about 2 ulps of f64 (relative error < 5e-16 in a dense sweep against 40-digit
/// values).
///
/// Written here rather than taken from the platform `libm` so that the oracle is the same everywhere:
/// * `|x| < 3`: the everywhere-convergent series with positive terms (Abramowitz & Stegun 7.1.6)
///   `erf(x) = 2/sqrt(pi) * exp(-x^2) * sum_n 2^n x^(2n+1) / (1*3*...*(2n+1))`, which has no cancellation,
///   summed in double-double; `x^2` is split exactly (`hi + lo`, by FMA) so neither the series nor
///   `exp(-x^2)` inherits the rounding of `x^2`.
/// * `3 <= |x| < 6`: `1 - erfc(x)`, with `erfc` from its continued fraction
///   `erfc(x) = exp(-x^2)/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...))))` (modified Lentz);
///   `erfc(3) < 2.3e-5`, so its small relative error is negligible in `erf`.
/// * `|x| >= 6`: `1` (`erfc(6) < 2.2e-17`, below half an ulp of 1).
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    let r = if a < 3.0 {
        erf_series(a)
    } else if a < 6.0 {
        1.0 - erfc_fraction(a)
    } else {
        1.0
    };
    r.copysign(x)
}

/// `exp(-a^2)` with `a^2` taken exactly as `hi + lo`.
fn exp_neg_square(a: f64) -> f64 {
    let hi = a * a;
    let lo = a.mul_add(a, -hi);
    // exp(-hi - lo) = exp(-hi) * exp(-lo), and |lo| <= ulp(hi)/2 makes exp(-lo) = 1 - lo to f64 accuracy.
    (-hi).exp() * (1.0 - lo)
}

/// `a + b` as an unevaluated double-double `(sum, error)` (Knuth's two-sum).
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    (s, (a - (s - bb)) + (b - bb))
}

/// Renormalises `a + b` with `|a| >= |b|` (Dekker's fast two-sum).
fn fast_two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    (s, b - (s - a))
}

fn erf_series(a: f64) -> f64 {
    // The terms and their sum are carried in double-double: in plain f64 the ~2 roundings per term compound
    // through the recurrence to several ulps near |x| = 3. f = 2a^2 is exact as `2hi + 2lo`.
    let hi = a * a;
    let (fh, fl) = (2.0 * hi, 2.0 * a.mul_add(a, -hi));
    let (mut th, mut tl) = (a, 0.0);
    let (mut sh, mut sl) = (a, 0.0);
    let mut d = 3.0;
    // Terms grow until n ~ a^2 and then fall geometrically; 200 terms are far more than |a| < 3 needs.
    for _ in 0..200 {
        // t *= f / (2n + 3)
        let ph = th * fh;
        let pl = th.mul_add(fh, -ph) + (th * fl + tl * fh);
        let qh = ph / d;
        let ql = ((-qh).mul_add(d, ph) + pl) / d;
        (th, tl) = fast_two_sum(qh, ql);
        let (s, e) = two_sum(sh, th);
        (sh, sl) = fast_two_sum(s, e + sl + tl);
        d += 2.0;
        if th <= sh * 1e-17 {
            break;
        }
    }
    std::f64::consts::FRAC_2_SQRT_PI * exp_neg_square(a) * (sh + sl)
}

fn erfc_fraction(a: f64) -> f64 {
    // Modified Lentz evaluation of b0 + a1/(b1 + a2/(b2 + ...)) with b_n = a and a_n = n/2.
    const TINY: f64 = 1e-300;
    let mut f = a;
    let mut c = a;
    let mut d = 0.0;
    for n in 1..2000 {
        let an = f64::from(n) * 0.5;
        d = a + an * d;
        if d == 0.0 {
            d = TINY;
        }
        d = 1.0 / d;
        c = a + an / c;
        if c == 0.0 {
            c = TINY;
        }
        let delta = c * d;
        f *= delta;
        if (delta - 1.0).abs() < 1e-16 {
            break;
        }
    }
    exp_neg_square(a) / (std::f64::consts::PI.sqrt() * f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_to_float_rounds_once() {
        // 2^53 + 1 is not an f64; to f32 it must round to 2^53 (nearest), not via a double rounding.
        assert_eq!(int_to_float(DType::F32, (1 << 53) + 1), 9007199254740992.0);
        // 2049 = 0b1000_0000_0001 has 12 bits: a tie between 2048 and 2050 -> even significand (2048).
        assert_eq!(int_to_float(DType::F16, 2049), 2048.0);
        assert_eq!(int_to_float(DType::F16, 2051), 2052.0);
        assert_eq!(int_to_float(DType::F16, 65519), 65504.0);
        assert_eq!(int_to_float(DType::F16, 65520), f64::INFINITY);
        assert_eq!(int_to_float(DType::F16, -70000), f64::NEG_INFINITY);
        assert_eq!(int_to_float(DType::BF16, 257), 256.0);
        assert_eq!(int_to_float(DType::BF16, 259), 260.0);
        assert_eq!(int_to_float(DType::BF16, i64::MIN), -(2f64.powi(63)));
        assert_eq!(int_to_float(DType::F64, -3), -3.0);
    }

    #[test]
    fn rounding_to_f32_matches_hardware() {
        for &x in &[
            0.1,
            1.0 / 3.0,
            1e-40,
            -1e-45,
            3.5e38,
            1e39,
            -0.0,
            16777217.0,
        ] {
            let r = round_to_format(x, 24, -126, f32::MAX as f64);
            assert_eq!(r.to_bits(), (x as f32 as f64).to_bits(), "{x}");
        }
    }
}
