//! Element formats: f16/bf16 conversions (exhaustively), `erf`, and GGUF block dequantisation.

mod common;

use common::*;
use loom_ir::kernel::DType;
use loom_reference::float::{
    BF16_MAX, bf16_to_f32, erf, f16_to_f32, f16_to_f64, f32_to_bf16, f32_to_f16, f64_to_bf16,
    f64_to_f16, round_f16,
};
use loom_reference::{Error, dequantize, run_kernel};

/// A straightforward bit-level f16 decoder, independent of the library's arithmetic one.
fn ref_f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match exp {
        0 if man == 0 => sign,
        0 => {
            // Subnormal: shift the significand up until its leading bit is the implicit one.
            let (mut e, mut m) = (127 - 14, man);
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | (e << 23) | ((m & 0x3ff) << 13)
        }
        31 => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

#[test]
fn f16_decoding_is_exact_for_all_bit_patterns() {
    for h in 0..=u16::MAX {
        let want = ref_f16_to_f32(h);
        let got = f16_to_f32(h);
        if want.is_nan() {
            assert!(got.is_nan() && f16_to_f64(h).is_nan(), "{h:#06x}");
        } else {
            assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
            assert_eq!(f16_to_f64(h), f64::from(want), "{h:#06x}");
        }
    }
}

#[test]
fn f16_encoding_round_trips_and_rounds_to_nearest_even() {
    for h in 0..=u16::MAX {
        let x = f16_to_f32(h);
        if x.is_nan() {
            let back = f32_to_f16(x);
            assert!(
                back & 0x7c00 == 0x7c00 && back & 0x3ff != 0,
                "NaN {h:#06x} -> {back:#06x}"
            );
            assert_eq!(back & 0x8000, h & 0x8000, "NaN sign");
        } else {
            assert_eq!(f32_to_f16(x), h, "{h:#06x}");
            assert_eq!(f64_to_f16(f64::from(x)), h, "{h:#06x}");
        }
    }
    // Between every two adjacent positive finite f16 values: the midpoint goes to the even pattern, anything
    // off the midpoint (even by far less than an f32 ulp: no double rounding) to the nearer one.
    for h in 0..0x7bffu16 {
        let (a, b) = (f16_to_f64(h), f16_to_f64(h + 1));
        let mid = (a + b) / 2.0;
        let even = if h % 2 == 0 { h } else { h + 1 };
        assert_eq!(f64_to_f16(mid), even, "mid {h:#06x}");
        assert_eq!(f32_to_f16(mid as f32), even, "mid as f32 {h:#06x}");
        assert_eq!(f64_to_f16(mid * (1.0 + 1e-12)), h + 1, "above mid {h:#06x}");
        assert_eq!(f64_to_f16(mid * (1.0 - 1e-12)), h, "below mid {h:#06x}");
        assert_eq!(
            f64_to_f16(-mid * (1.0 + 1e-12)),
            (h + 1) | 0x8000,
            "negative {h:#06x}"
        );
        assert_eq!(round_f16(mid * (1.0 + 1e-12)), b);
    }
    assert_eq!(f64_to_f16(65519.999), 0x7bff);
    assert_eq!(f64_to_f16(65520.0), 0x7c00);
    assert_eq!(f64_to_f16(-1e10), 0xfc00);
    assert_eq!(f64_to_f16(f64::INFINITY), 0x7c00);
    assert_eq!(f64_to_f16(-0.0), 0x8000);
    assert_eq!(
        f64_to_f16(2f64.powi(-25)),
        0,
        "half the smallest subnormal is a tie to even (zero)"
    );
    assert_eq!(f64_to_f16(2f64.powi(-25) * 1.5), 1);
    assert_eq!(f64_to_f16(1e-30), 0);
}

#[test]
fn bf16_conversions() {
    for h in 0..=u16::MAX {
        let x = bf16_to_f32(h);
        assert_eq!(x.to_bits(), u32::from(h) << 16);
        if x.is_nan() {
            let back = f32_to_bf16(x);
            assert!(f32::from_bits(u32::from(back) << 16).is_nan());
            assert_eq!(back & 0x8000, h & 0x8000);
        } else {
            assert_eq!(f32_to_bf16(x), h, "{h:#06x}");
        }
    }
    for h in 0..0x7f7fu16 {
        let (a, b) = (f64::from(bf16_to_f32(h)), f64::from(bf16_to_f32(h + 1)));
        let mid = (a + b) / 2.0;
        let even = if h % 2 == 0 { h } else { h + 1 };
        assert_eq!(f64_to_bf16(mid), even, "mid {h:#06x}");
        assert_eq!(f32_to_bf16(mid as f32), even, "mid as f32 {h:#06x}");
        assert_eq!(
            f64_to_bf16(mid * (1.0 + 1e-12)),
            h + 1,
            "above mid {h:#06x}"
        );
        assert_eq!(f64_to_bf16(mid * (1.0 - 1e-12)), h, "below mid {h:#06x}");
    }
    // The f32 bit trick agrees on random f32s.
    let mut rng = Rng::new(11);
    for _ in 0..100_000 {
        let x = f32::from_bits(rng.next_u64() as u32);
        if x.is_nan() {
            continue;
        }
        let bits = x.to_bits();
        let trick = ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16;
        assert_eq!(f32_to_bf16(x), trick, "{x:e}");
    }
    assert_eq!(f64_to_bf16(BF16_MAX), 0x7f7f);
    assert_eq!(
        f64_to_bf16(f64::from(f32::MAX)),
        0x7f80,
        "f32::MAX rounds past the largest bf16"
    );
}

const ERF_TABLE: &[(f64, f64)] = &[
    (1e-300, 1.1283791670955126e-300),
    (1e-10, 1.1283791670955126e-10),
    (0.001, 0.0011283787909692365),
    (0.84375, 0.7672256612323416),
    (2.999, 0.9999777698314002),
    (3.001, 0.9999780483390822),
    (5.9, 0.9999999999999999),
    (-0.3, -0.3286267594591274),
    (-1.7, -0.9837904585907745),
    (-3.3, -0.9999969422902035),
    (0.0, 0.0),
    (0.0625, 0.07043197772238707),
    (0.125, 0.1403162048013338),
    (0.1875, 0.20911767705937584),
    (0.25, 0.27632639016823696),
    (0.3125, 0.341468633501595),
    (0.375, 0.4041169094348223),
    (0.4375, 0.463898135749933),
    (0.5, 0.5204998778130465),
    (0.5625, 0.5736744566155919),
    (0.625, 0.623240882188418),
    (0.6875, 0.6690846628860813),
    (0.75, 0.7111556336535151),
    (0.8125, 0.749464025586362),
    (0.875, 0.7840750610598597),
    (0.9375, 0.8151024010343998),
    (1.0, 0.8427007929497149),
    (1.0625, 0.8670582694349528),
    (1.125, 0.8883882317017078),
    (1.1875, 0.9069217197816865),
    (1.25, 0.9229001282564583),
    (1.3125, 0.9365685747113888),
    (1.375, 0.9481700727820903),
    (1.4375, 0.95794060605646),
    (1.5, 0.9661051464753108),
    (1.5625, 0.9728746138209335),
    (1.625, 0.9784437332399837),
    (1.6875, 0.982989716601978),
    (1.75, 0.9866716712191824),
    (1.8125, 0.9896306257947752),
    (1.875, 0.9919900576701199),
    (1.9375, 0.9938568063952132),
    (2.0, 0.9953222650189527),
    (2.0625, 0.9964637508747902),
    (2.125, 0.9973459706405177),
    (2.1875, 0.9980225088163892),
    (2.25, 0.9985372834133188),
    (2.3125, 0.9989259267092776),
    (2.375, 0.9992170617821089),
    (2.4375, 0.9994334567454198),
    (2.5, 0.999593047982555),
    (2.5625, 0.9997098311383266),
    (2.625, 0.9997946242638588),
    (2.6875, 0.9998557114825746),
    (2.75, 0.9998993780778803),
    (2.8125, 0.9999303492456073),
    (2.875, 0.9999521451602562),
    (2.9375, 0.9999673647128524),
    (3.0, 0.9999779095030014),
    (3.0625, 0.9999851585892071),
    (3.125, 0.9999901032653747),
    (3.1875, 0.999993449849224),
    (3.25, 0.9999956972205363),
    (3.3125, 0.9999971946873958),
    (3.375, 0.9999981847185726),
    (3.4375, 0.9999988341746511),
    (3.5, 0.9999992569016276),
    (3.5625, 0.999999529912161),
    (3.625, 0.9999997048598075),
    (3.6875, 0.9999998160959875),
    (3.75, 0.9999998862727434),
    (3.8125, 0.9999999302015868),
    (3.875, 0.999999957486056),
    (3.9375, 0.9999999743008093),
    (4.0, 0.9999999845827421),
    (4.0625, 0.9999999908210709),
    (4.125, 0.9999999945765992),
    (4.1875, 0.999999996819877),
    (4.25, 0.9999999981494259),
    (4.3125, 0.9999999989312964),
    (4.375, 0.9999999993875167),
    (4.4375, 0.9999999996516503),
    (4.5, 0.9999999998033839),
    (4.5625, 0.9999999998898706),
    (4.625, 0.9999999999387839),
    (4.6875, 0.999999999966232),
    (4.75, 0.9999999999815149),
    (4.8125, 0.9999999999899583),
    (4.875, 0.9999999999945866),
    (4.9375, 0.999999999997104),
    (5.0, 0.9999999999984626),
    (5.0625, 0.99999999999919),
    (5.125, 0.9999999999995766),
    (5.1875, 0.9999999999997803),
    (5.25, 0.9999999999998869),
    (5.3125, 0.9999999999999423),
    (5.375, 0.9999999999999707),
    (5.4375, 0.9999999999999852),
    (5.5, 0.9999999999999927),
    (5.5625, 0.9999999999999963),
    (5.625, 0.9999999999999982),
    (5.6875, 0.9999999999999991),
    (5.75, 0.9999999999999996),
    (5.8125, 0.9999999999999998),
    (5.875, 0.9999999999999999),
    (5.9375, 1.0),
    (6.0, 1.0),
    (6.0625, 1.0),
    (6.125, 1.0),
    (6.1875, 1.0),
    (6.25, 1.0),
];

#[test]
fn erf_matches_high_precision_values() {
    // ERF_TABLE holds erf(x) computed with 40 significant digits (mpmath) and rounded to f64.
    let mut worst = 0f64;
    for &(x, want) in ERF_TABLE {
        let got = erf(x);
        let rel = if want == 0.0 {
            got.abs()
        } else {
            ((got - want) / want).abs()
        };
        worst = worst.max(rel);
        assert!(
            rel <= 1e-15,
            "erf({x}) = {got:e}, want {want:e} (relative error {rel:e})"
        );
        assert_eq!(erf(-x), -got, "erf is odd");
    }
    eprintln!("worst relative error of erf over the table: {worst:e}");
    assert!(erf(f64::NAN).is_nan());
    assert_eq!(erf(f64::INFINITY), 1.0);
    assert_eq!(erf(f64::NEG_INFINITY), -1.0);
    assert_eq!(erf(-0.0).to_bits(), (-0.0f64).to_bits());
    // Monotone across the method switches at 3 and 6.
    for &s in &[3.0, 6.0] {
        let (a, b, c) = (erf(s - 1e-12), erf(s), erf(s + 1e-12));
        assert!(a <= b && b <= c, "around {s}");
    }
}

// ---- GGUF block dequantisation ----

/// Loads the whole `[rows, cols]` quantised buffer with a checked load (one program per row) and returns the
/// f32 result.
fn load_all(dtype: DType, rows: u64, cols: u64, bytes: &[u8]) -> Vec<f32> {
    let mut kb = KB::new("load_q", [rows, 1, 1]);
    let q = kb.param("q", dtype, &[rows, cols], READ);
    let o = kb.param("o", DType::F32, &[rows, cols], WRITE);
    let r = kb.pid(0);
    let c = kb.range(i(0), cols as u32);
    let t = kb.load(q, vec![r.clone(), c.clone()], None);
    kb.store(o, vec![r, c], t);
    let k = kb.finish();
    let mut bufs = vec![bytes.to_vec(), vec![0; (rows * cols * 4) as usize]];
    run_kernel(&k, &mut bufs).unwrap();
    f32s(&bufs[1])
}

/// A masked load of columns `start..start + len` of row `row` (past the end: fill -100).
fn load_cols(
    dtype: DType,
    rows: u64,
    cols: u64,
    bytes: &[u8],
    row: i64,
    start: i64,
    len: u32,
) -> Vec<f32> {
    let mut kb = KB::new("load_cols", [1, 1, 1]);
    let q = kb.param("q", dtype, &[rows, cols], READ);
    let o = kb.param("o", DType::F32, &[len as u64], WRITE);
    let c = kb.range(i(start), len);
    let t = kb.load(q, vec![i(row), c], Some(f(-100.0)));
    let z = kb.range(i(0), len);
    kb.store(o, vec![z], t);
    let k = kb.finish();
    let mut bufs = vec![bytes.to_vec(), vec![0; len as usize * 4]];
    run_kernel(&k, &mut bufs).unwrap();
    f32s(&bufs[1])
}

fn h(x: f32) -> [u8; 2] {
    f32_to_f16(x).to_le_bytes()
}

/// Checks a quantised `[rows, cols]` buffer three ways: `dequantize`, a full checked load and a masked
/// column window crossing block boundaries, against `want` (row-major).
fn check_quant(dtype: DType, rows: u64, cols: u64, bytes: &[u8], want: &[f32]) {
    assert_eq!(dtype.bytes_for(&[rows, cols]), Some(bytes.len() as u64));
    let deq = dequantize(dtype, bytes).unwrap();
    assert_eq!(deq.len(), want.len());
    for (j, (g, w)) in deq.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{dtype} element {j}: {g} vs {w}");
    }
    assert_eq!(load_all(dtype, rows, cols, bytes), deq);
    let last = rows as i64 - 1;
    let (start, len) = (cols as i64 - 40, 48u32);
    let win = load_cols(dtype, rows, cols, bytes, last, start, len);
    for (j, &g) in win.iter().enumerate() {
        let col = start + j as i64;
        let w = if col < cols as i64 {
            want[(last as u64 * cols) as usize + col as usize]
        } else {
            -100.0
        };
        assert_eq!(g, w, "{dtype} window column {col}");
    }
}

#[test]
fn q8_0_q4_0_q4_1_hand_built_blocks() {
    // Q8_0: [2 rows, 64 cols] = 4 blocks of {f16 d, 32 x i8}; x = d * q.
    let ds = [0.5f32, 0.25, 3.0, -0.125];
    let mut bytes = vec![];
    let mut want = vec![];
    for (bi, &d) in ds.iter().enumerate() {
        bytes.extend(h(d));
        for j in 0..32 {
            // The extremes first, then a spread of values.
            let q = if j < 5 {
                [-128i32, -1, 0, 1, 127][j]
            } else {
                (j as i32 * 7 + bi as i32 * 13) % 256 - 128
            };
            bytes.push(q as i8 as u8);
            want.push(d * q as f32);
        }
    }
    check_quant(DType::Q8_0, 2, 64, &bytes, &want);

    // Q4_0: {f16 d, 16 bytes}; byte j holds element j (low nibble) and element j + 16 (high); x = (q - 8) * d.
    let mut bytes = vec![];
    let mut want = vec![0f32; 128];
    for (bi, &d) in ds.iter().enumerate() {
        bytes.extend(h(d));
        for j in 0..16 {
            let (lo, hi) = ((j + bi) % 16, 15 - (j + 2 * bi) % 16);
            bytes.push((lo | (hi << 4)) as u8);
            want[bi * 32 + j] = (lo as f32 - 8.0) * d;
            want[bi * 32 + 16 + j] = (hi as f32 - 8.0) * d;
        }
    }
    check_quant(DType::Q4_0, 2, 64, &bytes, &want);

    // Q4_1: {f16 d, f16 m, 16 bytes}; x = q * d + m.
    let ms = [-1.0f32, 0.5, -8.0, 0.0];
    let mut bytes = vec![];
    let mut want = vec![0f32; 128];
    for (bi, (&d, &m)) in ds.iter().zip(&ms).enumerate() {
        bytes.extend(h(d));
        bytes.extend(h(m));
        for j in 0..16 {
            let (lo, hi) = ((3 * j + bi) % 16, (5 * j + 1) % 16);
            bytes.push((lo | (hi << 4)) as u8);
            want[bi * 32 + j] = lo as f32 * d + m;
            want[bi * 32 + 16 + j] = hi as f32 * d + m;
        }
    }
    check_quant(DType::Q4_1, 2, 64, &bytes, &want);
    assert_eq!(want[32 + 16], 0.25 * 1.0 + 0.5, "spot value");
}

/// A small Q4_K quantiser (not ggml's optimising one): 8 sub-blocks of 32 with a 6-bit scale and min each,
/// packed as ggml's `block_q4_K`. Returns the block and the reconstruction ggml's formula gives.
fn quantize_q4_k(x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    assert_eq!(x.len(), 256);
    let mut scale = [0f32; 8];
    let mut minv = [0f32; 8];
    for j in 0..8 {
        let s = &x[32 * j..32 * j + 32];
        let lo = s.iter().fold(0f32, |a, &b| a.min(b)); // the min is <= 0 and stored negated
        let hi = s.iter().fold(f32::MIN, |a, &b| a.max(b));
        scale[j] = (hi - lo) / 15.0;
        minv[j] = -lo;
    }
    let d = f16_to_f32(f32_to_f16(scale.iter().fold(0f32, |a, &b| a.max(b)) / 63.0));
    let dmin = f16_to_f32(f32_to_f16(minv.iter().fold(0f32, |a, &b| a.max(b)) / 63.0));
    let sc: Vec<u8> = scale
        .iter()
        .map(|&s| {
            if d > 0.0 {
                (s / d).round().clamp(0.0, 63.0) as u8
            } else {
                0
            }
        })
        .collect();
    let mn: Vec<u8> = minv
        .iter()
        .map(|&m| {
            if dmin > 0.0 {
                (m / dmin).round().clamp(0.0, 63.0) as u8
            } else {
                0
            }
        })
        .collect();
    let mut q = [0u8; 256];
    let mut recon = vec![0f32; 256];
    for j in 0..8 {
        let (d1, m1) = (d * sc[j] as f32, dmin * mn[j] as f32);
        for l in 0..32 {
            let e = 32 * j + l;
            q[e] = if d1 > 0.0 {
                ((x[e] + m1) / d1).round().clamp(0.0, 15.0) as u8
            } else {
                0
            };
            recon[e] = d1 * q[e] as f32 - m1;
        }
    }
    let mut b = vec![];
    b.extend(f32_to_f16(d).to_le_bytes());
    b.extend(f32_to_f16(dmin).to_le_bytes());
    // scales[12]: 0..4 low 6 bits of sc[0..4] (top 2 bits: sc[4..8] >> 4), 4..8 the same for the mins,
    // 8..12 the low nibbles of sc[4..8] | mn[4..8] << 4.
    let mut scales = [0u8; 12];
    for j in 0..4 {
        scales[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        scales[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        scales[j + 8] = (sc[j + 4] & 0x0f) | ((mn[j + 4] & 0x0f) << 4);
    }
    b.extend(scales);
    // qs[128]: chunk c of 64 elements -> bytes 32c..32c+32, low nibble element 64c + l, high 64c + 32 + l.
    for c in 0..4 {
        for l in 0..32 {
            b.push(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
        }
    }
    assert_eq!(b.len(), 144);
    (b, recon)
}

/// A small Q6_K quantiser: 16 sub-blocks of 16 with an i8 scale each, 6-bit quants, packed as ggml's
/// `block_q6_K`.
fn quantize_q6_k(x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    assert_eq!(x.len(), 256);
    let scale: Vec<f32> = (0..16)
        .map(|j| {
            x[16 * j..16 * j + 16]
                .iter()
                .fold(0f32, |a, &b| a.max(b.abs()))
                / 31.0
        })
        .collect();
    let d = f16_to_f32(f32_to_f16(
        scale.iter().fold(0f32, |a, &b| a.max(b)) / 127.0,
    ));
    // Alternate signs of the sub-block scales (a negative scale flips the quants) to cover the i8 decoding.
    let sc: Vec<i8> = scale
        .iter()
        .enumerate()
        .map(|(j, &s)| {
            let v = if d > 0.0 {
                (s / d).round().clamp(0.0, 127.0)
            } else {
                0.0
            };
            if j % 3 == 1 { -(v as i8) } else { v as i8 }
        })
        .collect();
    let mut big_l = [0u8; 256];
    let mut recon = vec![0f32; 256];
    for (j, &s) in sc.iter().enumerate() {
        let ds = d * s as f32;
        for l in 0..16 {
            let e = 16 * j + l;
            let q = if ds != 0.0 {
                (x[e] / ds).round().clamp(-32.0, 31.0) as i32
            } else {
                0
            };
            big_l[e] = (q + 32) as u8;
            recon[e] = ds * q as f32;
        }
    }
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for h in 0..2 {
        let lq = &big_l[128 * h..128 * h + 128];
        for l in 0..32 {
            ql[64 * h + l] = (lq[l] & 0x0f) | ((lq[l + 64] & 0x0f) << 4);
            ql[64 * h + l + 32] = (lq[l + 32] & 0x0f) | ((lq[l + 96] & 0x0f) << 4);
            qh[32 * h + l] = (lq[l] >> 4)
                | ((lq[l + 32] >> 4) << 2)
                | ((lq[l + 64] >> 4) << 4)
                | ((lq[l + 96] >> 4) << 6);
        }
    }
    let mut b = vec![];
    b.extend(ql);
    b.extend(qh);
    b.extend(sc.iter().map(|&s| s as u8));
    b.extend(f32_to_f16(d).to_le_bytes());
    assert_eq!(b.len(), 210);
    (b, recon)
}

/// A test quantiser: one block's bytes and its expected reconstruction.
type Quantiser = fn(&[f32]) -> (Vec<u8>, Vec<f32>);

fn check_k_quant(dtype: DType, quantize: Quantiser, tolerance: f32) {
    let (rows, cols) = (3u64, 512u64);
    let mut rng = Rng::new(dtype as u64 + 100);
    let x = rng.f32s((rows * cols) as usize, -2.0, 1.5);
    let mut bytes = vec![];
    let mut want = vec![];
    for blk in x.chunks_exact(256) {
        let (b, r) = quantize(blk);
        bytes.extend(b);
        want.extend(r);
    }
    check_quant(dtype, rows, cols, &bytes, &want);
    // The reconstruction is close to the input (the layout really is what the quantiser meant).
    let worst = x
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        worst < tolerance,
        "{dtype}: worst reconstruction error {worst}"
    );
}

#[test]
fn q4_k_blocks_from_a_test_quantiser() {
    check_k_quant(DType::Q4K, quantize_q4_k, 0.2);
}

#[test]
fn q6_k_blocks_from_a_test_quantiser() {
    check_k_quant(DType::Q6K, quantize_q6_k, 0.05);
}

#[test]
fn quantised_buffers_are_read_only_and_sized_in_blocks() {
    let mut kb = KB::new("store_q", [1, 1, 1]);
    let q = kb.param("q", DType::Q8_0, &[1, 32], RW);
    let c = kb.range(i(0), 32);
    let t = kb.load(q, vec![i(0), c.clone()], None);
    kb.store(q, vec![i(0), c], t);
    let k = kb.finish();
    let err = run_kernel(&k, &mut [vec![0; 34]]).unwrap_err();
    assert!(
        matches!(&err, Error::Malformed { message, .. } if message.contains("quantised")),
        "{err}"
    );
    assert!(dequantize(DType::Q4_0, &[0; 17]).is_err());
    assert!(dequantize(DType::F32, &[0; 4]).is_err());
    // A buffer whose last dimension is not a whole number of blocks has no size.
    let mut kb = KB::new("misaligned", [1, 1, 1]);
    kb.param("q", DType::Q4K, &[2, 100], READ);
    let err = run_kernel(&kb.finish(), &mut [vec![0; 144]]).unwrap_err();
    assert!(matches!(err, Error::Malformed { .. }), "{err}");
}
