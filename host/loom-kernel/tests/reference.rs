//! End to end: specialize motif stages and run them in the reference interpreter (`loom-reference`), then
//! compare with a straightforward f64 computation in Rust, at shapes that are not tile multiples.

mod common;

use common::*;
use loom_ir::TValue;

/// A small deterministic generator (xorshift), values in [-1, 1).
struct Rng(u64);

impl Rng {
    fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                ((self.0 >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0) as f32
            })
            .collect()
    }
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn assert_close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (*g as f64 - w).abs();
        assert!(
            err <= tol * (1.0 + w.abs()),
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

#[test]
fn gemm_matches_f64() {
    let cat = motif_catalog();
    let (m, n, k) = (37usize, 45usize, 70usize);
    for act in ["none", "gelu_tanh", "silu"] {
        let cfg = cfg(&[
            ("M", int(m as i64)),
            ("N", int(n as i64)),
            ("K", int(k as i64)),
            ("ACT", TValue::Str(act.into())),
        ]);
        let stage = loom_kernel::specialize_stage(&cat, module(&cat, "motifs.gemm"), "dense", &cfg)
            .unwrap_or_else(|e| panic!("{}", e.join("")));
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let x = rng.f32s(m * k);
        let w = rng.f32s(k * n);
        let b = rng.f32s(n);
        let mut outs = loom_reference::alloc_outputs(&stage).unwrap();
        loom_reference::run_stage(&stage, &[&bytes(&x)], &[&bytes(&w), &bytes(&b)], &mut outs)
            .unwrap_or_else(|e| panic!("{act}: {e}"));
        let mut want = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = b[j] as f64;
                for t in 0..k {
                    s += x[i * k + t] as f64 * w[t * n + j] as f64;
                }
                want[i * n + j] = match act {
                    "gelu_tanh" => gelu_tanh(s),
                    "silu" => s / (1.0 + (-s).exp()),
                    _ => s,
                };
            }
        }
        assert_close(&floats(&outs[0]), &want, 1e-4, act);
    }
}

#[test]
fn softmax_matches_f64() {
    let cat = motif_catalog();
    let (r, c) = (13usize, 37usize);
    let cfg = cfg(&[("R", int(r as i64)), ("C", int(c as i64))]);
    let stage =
        loom_kernel::specialize_stage(&cat, module(&cat, "motifs.softmax"), "softmax", &cfg)
            .unwrap_or_else(|e| panic!("{}", e.join("")));
    let x: Vec<f32> = Rng(42).f32s(r * c).iter().map(|v| v * 8.0).collect();
    let mut outs = loom_reference::alloc_outputs(&stage).unwrap();
    loom_reference::run_stage(&stage, &[&bytes(&x)], &[], &mut outs).unwrap();
    let mut want = vec![0f64; r * c];
    for i in 0..r {
        let row = &x[i * c..(i + 1) * c];
        let mx = row.iter().fold(f64::MIN, |a, &v| a.max(v as f64));
        let s: f64 = row.iter().map(|&v| (v as f64 - mx).exp()).sum();
        for j in 0..c {
            want[i * c + j] = (row[j] as f64 - mx).exp() / s;
        }
    }
    assert_close(&floats(&outs[0]), &want, 1e-5, "softmax");
}

/// The gather's checked load turns an id >= vocabulary into an error of the dispatch.
#[test]
fn gather_rejects_out_of_range_ids() {
    let cat = motif_catalog();
    let cfg = cfg(&[("R", int(3)), ("H", int(8)), ("V", int(5))]);
    let stage = loom_kernel::specialize_stage(&cat, module(&cat, "motifs.embed"), "embed", &cfg)
        .unwrap_or_else(|e| panic!("{}", e.join("")));
    let table = Rng(7).f32s(5 * 8);
    let ok: Vec<u8> = [4i32, 0, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut outs = loom_reference::alloc_outputs(&stage).unwrap();
    loom_reference::run_stage(&stage, &[&ok], &[&bytes(&table)], &mut outs).unwrap();
    assert_eq!(floats(&outs[0])[..8], table[32..40]);
    let bad: Vec<u8> = [1i32, 5, 0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let e = loom_reference::run_stage(&stage, &[&bad], &[&bytes(&table)], &mut outs).unwrap_err();
    assert!(
        matches!(e, loom_reference::Error::IndexOutOfRange { .. }),
        "{e}"
    );
}
