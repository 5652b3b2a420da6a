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

/// Index notation against its hand-written desugaring: a gemm and a row mean, each written both ways.
const INDEX_SRC: &str = r#"
module @e2e.index {
  kernel @gemm_ix<M: i64, N: i64, K: i64, BM: i64 = 16, BN: i64 = 32, BK: i64 = 16>
      grid(cdiv(M, BM), cdiv(N, BN))
      (%x: buffer<f32, [M, K]> read, %w: buffer<f32, [K, N]> read, %y: buffer<f32, [M, N]> write)
  {
    %rm = tile.range program_id(0) * BM, BM
    %rn = tile.range program_id(1) * BN, BN
    %z = tile.zeros : tile<[BM, BN], f32>
    %acc = for %k0 = 0 to K step BK iter(%a = %z : tile<[BM, BN], f32>) -> tile<[BM, BN], f32> {
      %rk = tile.range %k0, BK
      %xt = tile.load %x[%rm, %rk], 0.0
      %wt = tile.load %w[%rk, %rn], 0.0
      %next[m, n] = %a[m, n] + sum(%xt[m, k] * %wt[k, n])
      yield %next
    }
    tile.store %y[%rm, %rn], %acc
  }

  kernel @gemm_hand<M: i64, N: i64, K: i64, BM: i64 = 16, BN: i64 = 32, BK: i64 = 16>
      grid(cdiv(M, BM), cdiv(N, BN))
      (%x: buffer<f32, [M, K]> read, %w: buffer<f32, [K, N]> read, %y: buffer<f32, [M, N]> write)
  {
    %rm = tile.range program_id(0) * BM, BM
    %rn = tile.range program_id(1) * BN, BN
    %z = tile.zeros : tile<[BM, BN], f32>
    %acc = for %k0 = 0 to K step BK iter(%a = %z : tile<[BM, BN], f32>) -> tile<[BM, BN], f32> {
      %rk = tile.range %k0, BK
      %xt = tile.load %x[%rm, %rk], 0.0
      %wt = tile.load %w[%rk, %rn], 0.0
      %next = tile.dot %xt, %wt, %a
      yield %next
    }
    tile.store %y[%rm, %rn], %acc
  }

  kernel @mean_ix<R: i64, C: i64, BR: i64 = 4>
      grid(cdiv(R, BR))
      (%h: buffer<f32, [R, C]> read, %mean: buffer<f32, [R]> write)
  {
    %rr = tile.range program_id(0) * BR, BR
    %rc = tile.range 0, C
    %t = tile.load %h[%rr, %rc], 0.0
    %m[r] = sum(%t[r, c]) / C
    tile.store %mean[%rr], %m
  }

  kernel @mean_hand<R: i64, C: i64, BR: i64 = 4>
      grid(cdiv(R, BR))
      (%h: buffer<f32, [R, C]> read, %mean: buffer<f32, [R]> write)
  {
    %rr = tile.range program_id(0) * BR, BR
    %rc = tile.range 0, C
    %t = tile.load %h[%rr, %rc], 0.0
    %s = tile.sum %t, 1
    %m = div %s, C
    tile.store %mean[%rr], %m
  }

  export stage @both<M: i64 = 8, N: i64 = 8, K: i64 = 8>
      (%x: buffer<f32, [M, K]> input, %w: buffer<f32, [K, N]> input,
       %y_ix: buffer<f32, [M, N]> output, %y_hand: buffer<f32, [M, N]> output,
       %m_ix: buffer<f32, [M]> output, %m_hand: buffer<f32, [M]> output)
  {
    dispatch @gemm_ix<M = M, N = N, K = K>(%x, %w, %y_ix)
    dispatch @gemm_hand<M = M, N = N, K = K>(%x, %w, %y_hand)
    dispatch @mean_ix<R = M, C = K>(%x, %m_ix)
    dispatch @mean_hand<R = M, C = K>(%x, %m_hand)
  }
}
"#;

#[test]
fn index_notation_matches_f64_and_its_desugaring() {
    let mut cat = motif_catalog();
    let (idx, _) = cat
        .add_source("e2e_index.loom", INDEX_SRC)
        .unwrap_or_else(|e| panic!("{e}"));
    let (m, n, k) = (37usize, 45usize, 70usize);
    let cfg = cfg(&[
        ("M", int(m as i64)),
        ("N", int(n as i64)),
        ("K", int(k as i64)),
    ]);
    let stage = loom_kernel::specialize_stage(&cat, idx, "both", &cfg)
        .unwrap_or_else(|e| panic!("{}", e.join("")));
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let x = rng.f32s(m * k);
    let w = rng.f32s(k * n);
    let mut outs = loom_reference::alloc_outputs(&stage).unwrap();
    loom_reference::run_stage(&stage, &[&bytes(&x), &bytes(&w)], &[], &mut outs).unwrap();
    let mut want = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            want[i * n + j] = (0..k)
                .map(|t| x[i * k + t] as f64 * w[t * n + j] as f64)
                .sum();
        }
    }
    let mean: Vec<f64> = (0..m)
        .map(|i| x[i * k..(i + 1) * k].iter().map(|&v| v as f64).sum::<f64>() / k as f64)
        .collect();
    assert_close(&floats(&outs[0]), &want, 1e-4, "gemm (index notation)");
    assert_close(&floats(&outs[2]), &mean, 1e-5, "row mean (index notation)");
    // the sugar is its desugaring: the same IR, so the same bits
    assert_eq!(outs[0], outs[1], "gemm: index notation and tile.dot differ");
    assert_eq!(
        outs[2], outs[3],
        "row mean: index notation and tile.sum differ"
    );
}
