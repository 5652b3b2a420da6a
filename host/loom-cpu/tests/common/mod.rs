//! The shared kernel builder and helpers (`loom-testkit`), and the differential harness: run a one-kernel
//! stage on the reference and on the CPU backend with the same inputs and poisoned outputs, and compare.

#![allow(dead_code, unused_imports, unreachable_pub)] // each test binary uses a subset

use loom_ir::kernel::{Access, BufRef, DType, Kernel, Stage};
pub use loom_testkit::*;

// ---- differential harness ----

/// How an output is compared with the reference.
#[derive(Clone, Copy, Debug)]
pub enum Tol {
    /// Bit for bit (NaNs compare by bits too).
    Exact,
    /// `|got - want| <= rel * |want| + abs`, NaN only where the reference has NaN.
    Rel(f64, f64),
    /// At most this many units in the last place of the f32 result.
    Ulp(u32),
}

/// A stage with one dispatch of `k`: read parameters become inputs, the others outputs.
pub fn one_kernel_stage(k: Kernel) -> Stage {
    let mut inputs = vec![];
    let mut outputs = vec![];
    let mut args = vec![];
    for p in &k.params {
        let b = buf(&p.name, p.dtype, &p.shape);
        if p.access == Access::Read {
            args.push(BufRef::Input(inputs.len() as u32));
            inputs.push(b);
        } else {
            args.push(BufRef::Output(outputs.len() as u32));
            outputs.push(b);
        }
    }
    stage("s", inputs, outputs, vec![], vec![k], vec![(0, args)])
}

/// Runs `stage` on the reference and on the CPU backend (1 and 2 threads; with and without the GEMM
/// pattern match), compares every output with `tol` and returns the reference outputs. Both sides start from
/// poisoned (0xff) outputs, and the reference's outputs are required to have no poisoned f32/i32 word left,
/// so an element the backend fails to write cannot pass.
pub fn diff(stage: &Stage, inputs: &[Vec<u8>], tol: Tol) -> Vec<Vec<u8>> {
    let ins: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    let mut want = loom_reference::alloc_outputs(stage).unwrap();
    loom_reference::run_stage(stage, &ins, &[], &mut want).expect("reference run");
    for (o, b) in stage.outputs.iter().zip(&want) {
        if o.dtype == DType::F32 {
            assert!(
                !b.chunks_exact(4).any(|c| c == [0xff; 4]),
                "reference left poison in `{}`: the test does not cover every element",
                o.name
            );
        }
    }
    for match_gemm in [true, false] {
        let opts = loom_cpu::Options {
            match_gemm,
            ..Default::default()
        };
        let cs = loom_cpu::compile_stage_with(stage, opts).expect("compile");
        for threads in [1, 2] {
            let mut got = loom_reference::alloc_outputs(stage).unwrap();
            cs.run(&ins, &[], &mut got, threads).expect("cpu run");
            for ((o, g), w) in stage.outputs.iter().zip(&got).zip(&want) {
                compare(
                    &format!("{} ({threads} threads, gemm {match_gemm})", o.name),
                    o.dtype,
                    g,
                    w,
                    tol,
                );
            }
        }
    }
    want
}

pub fn compare(what: &str, dtype: DType, got: &[u8], want: &[u8], tol: Tol) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let size = dtype.size().unwrap_or(1) as usize;
    match (dtype, tol) {
        (DType::F32, Tol::Rel(..) | Tol::Ulp(_)) => {
            let (g, w) = (f32s(got), f32s(want));
            for (i, (&g, &w)) in g.iter().zip(&w).enumerate() {
                let ok = if w.is_nan() {
                    g.is_nan()
                } else {
                    match tol {
                        Tol::Rel(rel, abs) => rel_close(g as f64, w as f64, rel, abs),
                        Tol::Ulp(n) => {
                            let d = (g.to_bits() as i64 - w.to_bits() as i64).unsigned_abs();
                            (g.is_sign_negative() == w.is_sign_negative() && d <= n as u64)
                                || g == w
                        }
                        Tol::Exact => unreachable!(),
                    }
                };
                assert!(
                    ok,
                    "{what}[{i}]: got {g} ({:#x}), want {w} ({:#x}), tolerance {tol:?}",
                    g.to_bits(),
                    w.to_bits()
                );
            }
        }
        _ => {
            for (i, (g, w)) in got.chunks(size).zip(want.chunks(size)).enumerate() {
                assert_eq!(g, w, "{what}: element {i} differs bitwise");
            }
        }
    }
}

pub fn rand_f32(rng: &mut Rng, n: usize, lo: f64, hi: f64) -> Vec<u8> {
    f32_bytes(&rng.f32s(n, lo, hi))
}

/// `y = W x` with a GGUF weight `w: [n, k]` (blocks along k, as GGUF stores a linear layer's weight) and
/// `x: [k]`: `bn` outputs per program, a `for` over `k` in steps of `bk` with `tile.dot` at M = 1
/// (`[1, bk] x [bk, bn]`, the weight tile transposed). Parameters: `w, x, y`.
pub fn matvec_kernel(wdt: DType, n: u64, k: u64, bn: u32, bk: u32) -> Kernel {
    let mut kb = KB::new("matvec", [cdiv(n, bn as u64), 1, 1]);
    let w = kb.param("w", wdt, &[n, k], READ);
    let x = kb.param("x", DType::F32, &[k], READ);
    let y = kb.param("y", DType::F32, &[n], WRITE);
    let p = kb.pid(0);
    let n0 = kb.mul(p, i(bn as i64));
    let rn = kb.range(n0, bn);
    let acc0 = kb.full(f(0.0), &[1, bn], DType::F32);
    let rn2 = rn.clone();
    let res = kb.for_(
        i(0),
        i(k as i64),
        i(bk as i64),
        vec![acc0],
        move |kb, k0, it| {
            let rk = kb.range(k0, bk);
            let xt = kb.load(x, vec![rk.clone()], Some(f(0.0)));
            let xa = kb.expand_dims(xt, 0);
            let wt = kb.load(w, vec![rn2, rk], Some(f(0.0)));
            let wt = kb.transpose(wt);
            vec![kb.dot(xa, wt, it[0].clone())]
        },
    );
    let out = kb.reshape(res[0].clone(), &[bn]);
    kb.store(y, vec![rn], out);
    kb.finish()
}

/// Random quantised blocks with sane f16 scales (0.01..1, Q4_1 minimums too) so that no value is NaN or
/// infinite.
pub fn random_blocks(rng: &mut Rng, dtype: DType, blocks: usize) -> Vec<u8> {
    let (_, size) = dtype.block().unwrap();
    let mut b: Vec<u8> = (0..blocks * size as usize)
        .map(|_| rng.next_u64() as u8)
        .collect();
    let half = |x: f64| loom_reference::float::f32_to_f16(x as f32).to_le_bytes();
    for blk in b.chunks_mut(size as usize) {
        match dtype {
            DType::Q8_0 | DType::Q4_0 => blk[0..2].copy_from_slice(&half(rng.uniform(0.01, 1.0))),
            DType::Q4_1 | DType::Q4K => {
                blk[0..2].copy_from_slice(&half(rng.uniform(0.01, 1.0)));
                blk[2..4].copy_from_slice(&half(rng.uniform(0.01, 1.0)));
            }
            _ => blk[208..210].copy_from_slice(&half(rng.uniform(0.01, 1.0))),
        }
    }
    b
}
