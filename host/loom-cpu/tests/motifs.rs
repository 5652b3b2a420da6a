//! Differential tests of every motif stage in `packages/motifs/`: each stage is specialized by `loom-kernel` at
//! several shapes (including ones that are not multiples of the tile sizes) and run on fresh deterministic random
//! inputs by
//!
//! * (a) the reference interpreter (`loom-reference`, the oracle of the rounding model),
//! * (b) the CPU JIT (`loom-cpu`) on 1 and 2 threads, outputs poisoned with 0xff beforehand (an element nobody
//!   writes stays NaN and fails every comparison),
//! * (c) an independent float64 numpy oracle, `tests/oracle/motifs.py`, which reads the same inputs from raw
//!   little-endian files in a temporary directory and writes float64 outputs.
//!
//! JIT vs reference uses a tight tolerance derived from the reference's rounding model (stated per case, `jit`);
//! both are compared with numpy at a looser tolerance (`np`) that covers f32 rounding of the whole computation.
//! A tolerance is `|got - want| <= rel * |want| + abs`. numpy is installed with pip when missing; if that fails
//! the tests fail (they never skip).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use loom_compiler::Catalog;
use loom_ir::TValue;
use loom_ir::kernel::{DType, Stage};

// ---- helpers ------------------------------------------------------------------------------------------------

/// Every motif module, compiled once per test binary.
fn catalog() -> &'static Catalog {
    loom_testkit::motif_catalog()
}

fn specialize(stage: &str, cfg: &[(String, TValue)]) -> Stage {
    let (module, name) = stage.rsplit_once('.').expect("MODULE.STAGE");
    let cat = catalog();
    let mi = cat
        .find(module)
        .unwrap_or_else(|| panic!("no module @{module}"));
    loom_kernel::specialize_stage(cat, mi, name, cfg)
        .unwrap_or_else(|e| panic!("{stage} {cfg:?}:\n{}", e.join("")))
}

/// A small deterministic generator (xorshift64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [lo, hi).
    fn f32(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next() >> 40) as f64 / (1u64 << 24) as f64;
        (lo as f64 + u * (hi - lo) as f64) as f32
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn int(v: i64) -> TValue {
    TValue::I64(v)
}
fn s(v: &str) -> TValue {
    TValue::Str(v.into())
}

/// `|got - want| <= rel * |want| + abs`; NaN (e.g. an unwritten poisoned element) always fails.
#[derive(Clone, Copy, Debug)]
struct Tol {
    rel: f64,
    abs: f64,
}

const EXACT: Tol = Tol { rel: 0.0, abs: 0.0 };

fn tol(rel: f64, abs: f64) -> Tol {
    Tol { rel, abs }
}

fn assert_close(got: &[f32], want: &[f64], t: Tol, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0.0f64, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(
            err <= t.rel * w.abs() + t.abs,
            "{what}[{i}]: got {g:e}, want {w:e} (error {err:e}, tolerance rel {:e} abs {:e})",
            t.rel,
            t.abs
        );
        let scaled = err / (t.rel * w.abs() + t.abs).max(f64::MIN_POSITIVE);
        if scaled > worst.0 {
            worst = (scaled, i);
        }
    }
    if std::env::var_os("MOTIFS_VERBOSE").is_some() {
        eprintln!(
            "{what}: worst error {:.3} of tolerance at {}",
            worst.0, worst.1
        );
    }
}

// ---- numpy ----------------------------------------------------------------------------------------------------

/// Makes sure `python3 -c "import numpy"` works, installing numpy with pip when it does not; panics otherwise.
fn ensure_numpy() {
    static OK: OnceLock<Result<(), String>> = OnceLock::new();
    let r = OK.get_or_init(|| {
        let has = || {
            Command::new("python3")
                .args(["-c", "import numpy"])
                .status()
                .is_ok_and(|s| s.success())
        };
        if has() {
            return Ok(());
        }
        let st = Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "numpy"])
            .status();
        match st {
            Ok(s) if s.success() && has() => Ok(()),
            Ok(s) => Err(format!(
                "`python3 -m pip install --quiet numpy` exited with {s}, numpy still missing"
            )),
            Err(e) => Err(format!("cannot run python3: {e}")),
        }
    });
    if let Err(e) = r {
        panic!("the numpy oracle is required and unavailable: {e}");
    }
}

/// A fresh, empty temporary directory for one test function's cases.
fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("loom-motifs-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create temp dir");
    d
}

fn run_oracle(dir: &Path) {
    ensure_numpy();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/motifs.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(dir)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "numpy oracle failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---- the differential harness ----------------------------------------------------------------------------------

/// One motif run: stage and config, special buffer contents by name (everything else is uniform random f32
/// in [-range, range)), and the two tolerances.
struct Case {
    stage: &'static str,
    cfg: Vec<(String, TValue)>,
    special: Vec<(&'static str, Vec<u8>)>,
    range: f32,
    /// JIT vs reference.
    jit: Tol,
    /// JIT and reference vs numpy float64.
    np: Tol,
}

fn case(stage: &'static str, cfg: &[(&str, TValue)], jit: Tol, np: Tol) -> Case {
    Case {
        stage,
        cfg: cfg
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        special: vec![],
        range: 1.0,
        jit,
        np,
    }
}

impl Case {
    fn with(mut self, name: &'static str, bytes: Vec<u8>) -> Case {
        self.special.push((name, bytes));
        self
    }
    fn range(mut self, r: f32) -> Case {
        self.range = r;
        self
    }
    fn label(&self) -> String {
        let cfg: Vec<String> = self
            .cfg
            .iter()
            .map(|(k, v)| match v {
                TValue::I64(i) => format!("{k}={i}"),
                TValue::Str(s) => format!("{k}={s}"),
                other => format!("{k}={other:?}"),
            })
            .collect();
        format!("{}<{}>", self.stage, cfg.join(","))
    }
}

fn dims(shape: &[u64]) -> String {
    shape
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn dtype_word(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::I32 => "i32",
        other => panic!("no oracle encoding for {other}"),
    }
}

/// Runs every case on the reference and the JIT (compared right away), writes inputs for numpy, runs the numpy
/// oracle once for all cases, then compares both with it.
fn check_cases(tag: &str, cases: Vec<Case>, seed: u64) {
    let dir = temp_dir(tag);
    let mut rng = Rng(seed);
    let mut results = Vec::new();
    for (ci, c) in cases.iter().enumerate() {
        let label = c.label();
        let stage = specialize(c.stage, &c.cfg);
        let cdir = dir.join(format!("case{ci:03}"));
        std::fs::create_dir_all(&cdir).expect("case dir");
        let mut manifest = format!("stage {}\n", c.stage);
        for (k, v) in &c.cfg {
            match v {
                TValue::I64(i) => manifest += &format!("cfg {k} {i}\n"),
                TValue::Str(s) => manifest += &format!("cfg {k} {s}\n"),
                _ => {}
            }
        }
        let mut data =
            |name: &str, dtype: DType, shape: &[u64], manifest: &mut String| -> Vec<u8> {
                let n: u64 = shape.iter().product();
                let bytes = match c.special.iter().find(|(s, _)| *s == name) {
                    Some((_, b)) => b.clone(),
                    None => {
                        assert_eq!(
                            dtype,
                            DType::F32,
                            "{label}: `{name}` ({dtype}) needs special contents"
                        );
                        let v: Vec<f32> = (0..n).map(|_| rng.f32(-c.range, c.range)).collect();
                        f32_bytes(&v)
                    }
                };
                std::fs::write(cdir.join(format!("{name}.bin")), &bytes).expect("write input");
                *manifest += &format!("in {name} {} {}\n", dtype_word(dtype), dims(shape));
                bytes
            };
        let inputs: Vec<Vec<u8>> = stage
            .inputs
            .iter()
            .map(|b| data(&b.name, b.dtype, &b.shape, &mut manifest))
            .collect();
        let params: Vec<Vec<u8>> = stage
            .params
            .iter()
            .map(|b| data(&b.name, b.dtype, &b.shape, &mut manifest))
            .collect();
        for b in &stage.outputs {
            manifest += &format!("out {} {}\n", b.name, dims(&b.shape));
        }
        std::fs::write(cdir.join("case.txt"), manifest).expect("write manifest");
        let ins: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let ps: Vec<&[u8]> = params.iter().map(Vec::as_slice).collect();

        // (a) reference
        let mut want = loom_reference::alloc_outputs(&stage).unwrap();
        loom_reference::run_stage(&stage, &ins, &ps, &mut want)
            .unwrap_or_else(|e| panic!("{label}: reference: {e}"));
        // (b) JIT, 1 and 2 threads, poisoned outputs; GEMM-shaped kernels also without the whole-GEMM match
        let mut jits = vec![];
        // Native GEMM epilogues (the default) must equal the JIT epilogue bit for bit.
        let mut native_runs: Vec<Vec<Vec<u8>>> = vec![];
        let mut jit_epilogue_runs: Vec<Vec<Vec<u8>>> = vec![];
        for (match_gemm, native_epilogues) in [(true, true), (true, false), (false, true)] {
            let cs = loom_cpu::compile_stage_with(
                &stage,
                loom_cpu::Options {
                    match_gemm,
                    native_epilogues,
                },
            )
            .unwrap_or_else(|e| panic!("{label}: compile: {e}"));
            let gemm_path = cs.compile_report().kernels.iter().any(|k| k.path != "jit");
            let native = cs
                .compile_report()
                .kernels
                .iter()
                .any(|k| k.path == "gemm+native-epilogue");
            if match_gemm && !native_epilogues && native_runs.is_empty() {
                // No native epilogue in this stage: the JIT-epilogue run would repeat the first one.
                continue;
            }
            if match_gemm {
                // The per-stage compile times BENCHMARKS.md records (`--nocapture` shows them).
                let r = cs.compile_report();
                let ks: Vec<String> = r
                    .kernels
                    .iter()
                    .map(|k| {
                        format!(
                            "{} {} {:.2} ms",
                            k.name,
                            k.path,
                            k.compile_time.as_secs_f64() * 1e3
                        )
                    })
                    .collect();
                eprintln!(
                    "compile-report | {label} | {} | {:.2} ms | {} |",
                    r.kernels.len(),
                    r.total.as_secs_f64() * 1e3,
                    ks.join("; ")
                );
            }
            for threads in [1, 2] {
                let mut got = loom_reference::alloc_outputs(&stage).unwrap();
                assert!(got.iter().all(|o| o.iter().all(|&b| b == 0xff)), "poisoned");
                cs.run(&ins, &ps, &mut got, threads).unwrap_or_else(|e| {
                    panic!("{label}: jit ({threads} threads, match_gemm {match_gemm}): {e}")
                });
                for (oi, b) in stage.outputs.iter().enumerate() {
                    let w: Vec<f64> = floats(&want[oi]).iter().map(|&x| x as f64).collect();
                    let what = format!(
                        "{label} {} jit(threads {threads}, match_gemm {match_gemm}) vs reference",
                        b.name
                    );
                    assert_close(&floats(&got[oi]), &w, c.jit, &what);
                }
                if match_gemm && native_epilogues && native {
                    native_runs.push(got.clone());
                } else if match_gemm && !native_epilogues {
                    jit_epilogue_runs.push(got.clone());
                }
                jits.push(got);
            }
            if !gemm_path {
                break; // match_gemm = false would compile the same code
            }
        }
        assert_eq!(native_runs.len(), jit_epilogue_runs.len(), "{label}");
        assert!(
            native_runs == jit_epilogue_runs,
            "{label}: the native GEMM epilogue differs from the JIT epilogue"
        );
        results.push((label, stage, cdir, want, jits.swap_remove(0)));
    }
    // (c) numpy
    run_oracle(&dir);
    for ((label, stage, cdir, want, jit), c) in results.iter().zip(&cases) {
        for (oi, b) in stage.outputs.iter().enumerate() {
            let raw = std::fs::read(cdir.join(format!("out_{}.f64", b.name)))
                .unwrap_or_else(|e| panic!("{label}: numpy output {}: {e}", b.name));
            let np: Vec<f64> = raw
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect();
            assert_close(
                &floats(&want[oi]),
                &np,
                c.np,
                &format!("{label} {} reference vs numpy", b.name),
            );
            assert_close(
                &floats(&jit[oi]),
                &np,
                c.np,
                &format!("{label} {} jit vs numpy", b.name),
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- the motifs ------------------------------------------------------------------------------------------------

#[test]
fn gemm_bias_epilogues() {
    let mut cases = vec![];
    // Tile 32 x 32 x 32: 64^3 is tile-aligned, the others are not; 1 x 3 x 129 has a single ragged row;
    // 5 x 600 x 16 rows wider than the native epilogue's column chunk (256), the last chunk ragged.
    for (m, n, k) in [(64, 64, 64), (37, 45, 70), (1, 3, 129), (5, 600, 16)] {
        for act in ["none", "gelu_erf", "gelu_tanh", "silu"] {
            cases.push(case(
                "motifs.gemm.dense",
                &[("M", int(m)), ("N", int(n)), ("K", int(k)), ("ACT", s(act))],
                // f32 dot products of length <= 129 over values in [-1, 1): the JIT accumulates in f32 (gemm
                // blocking, FMA), the reference in f64 rounded once: relative 1e-5, absolute 1e-5 (a few ulps of
                // sum |x w| <= K).
                tol(1e-5, 1e-5),
                // vs float64: the same plus f32 rounding of the epilogue: relative 1e-5, absolute 1e-5.
                tol(1e-5, 1e-5),
            ));
        }
    }
    check_cases("gemm", cases, 0x9e37_79b9_7f4a_7c15);
}

/// The PyTorch-layout variants (`w: [N, K]`, read transposed): the whole-GEMM path reads `w` through the
/// `gemm` call's strides, so the kernel must still match it (checked on the compile report).
#[test]
fn gemm_nt_bias_epilogues() {
    let mut cases = vec![];
    for (m, n, k) in [(64, 64, 64), (37, 45, 70), (1, 3, 129)] {
        for act in ["none", "gelu_erf"] {
            cases.push(case(
                "motifs.gemm.dense_nt",
                &[("M", int(m)), ("N", int(n)), ("K", int(k)), ("ACT", s(act))],
                tol(1e-5, 1e-5),
                tol(1e-5, 1e-5),
            ));
        }
        cases.push(case(
            "motifs.gemm.dense_nt_add",
            &[("M", int(m)), ("N", int(n)), ("K", int(k))],
            tol(1e-5, 1e-5),
            tol(1e-5, 1e-5),
        ));
        // The row-major residual variant (weights placed with `layout(transpose)` from PyTorch checkpoints).
        cases.push(case(
            "motifs.gemm.dense_add",
            &[("M", int(m)), ("N", int(n)), ("K", int(k))],
            tol(1e-5, 1e-5),
            tol(1e-5, 1e-5),
        ));
    }
    for c in &cases {
        let stage = specialize(c.stage, &c.cfg);
        let cs = loom_cpu::compile_stage(&stage).unwrap();
        let paths: Vec<&str> = cs.compile_report().kernels.iter().map(|k| k.path).collect();
        assert_eq!(paths, ["gemm+native-epilogue"], "{} {:?}", c.stage, c.cfg);
    }
    check_cases("gemm_nt", cases, 0x51ed_270b_2716_8f3d);
}

#[test]
fn norms_and_softmax() {
    let mut cases = vec![];
    // BR = 4 rows per program: 16 is a multiple, 13 and 1 are not; the row is one tile of C columns.
    for (r, c) in [(16, 64), (13, 37), (1, 1000), (5, 4096)] {
        for stage in [
            "motifs.norm.layernorm",
            "motifs.norm.rmsnorm",
            "motifs.norm.l2norm",
        ] {
            // JIT vs reference: sums in f64 either way, rsqrt as an f64 function rounded once, then a few f32
            // multiplies: relative 1e-6, absolute 1e-7 (a couple of ulps).
            // vs numpy (rows of length <= 4096 in f32): relative 1e-5, absolute 1e-6.
            cases.push(
                case(
                    stage,
                    &[("R", int(r)), ("C", int(c))],
                    tol(1e-6, 1e-7),
                    tol(1e-5, 1e-6),
                )
                .range(3.0),
            );
        }
        // softmax of values in [-8, 8): exp and a division per element: relative 1e-6 vs the reference,
        // relative 1e-5 / absolute 1e-7 vs numpy (outputs as small as e^-16 / C).
        cases.push(
            case(
                "motifs.softmax.softmax",
                &[("R", int(r)), ("C", int(c))],
                tol(1e-6, 0.0),
                tol(1e-5, 1e-7),
            )
            .range(8.0),
        );
    }
    check_cases("norm", cases, 11);
}

#[test]
fn embed_and_pooling() {
    let mut rng = Rng(5);
    let mut cases = vec![];
    for (r, h, v) in [(16, 64, 1000), (7, 33, 50), (1, 1, 1)] {
        let ids: Vec<i32> = (0..r).map(|_| rng.below(v) as i32).collect();
        // A gather copies: bit-exact everywhere.
        cases.push(
            case(
                "motifs.embed.embed",
                &[("R", int(r as i64)), ("H", int(h)), ("V", int(v as i64))],
                EXACT,
                EXACT,
            )
            .with("ids", i32_bytes(&ids)),
        );
    }
    // BT = 32 time steps per loop iteration: 16, 45 and 70 are not multiples; a row of mask zeros included.
    for (b, t, h) in [(2, 16, 64), (3, 45, 20), (2, 70, 128)] {
        let mut mask: Vec<i32> = (0..b * t).map(|_| (rng.below(4) != 0) as i32).collect();
        if b == 3 {
            mask[..t].fill(0); // an all-padding row: sum 0 / max(0, 1e-9) = 0
        }
        // Sums of <= 70 f32 products with a 0/1 mask: the JIT's f32 tile sums vs the reference's f64 sums per
        // tile, then one division: relative 1e-6, absolute 1e-7; vs numpy relative 1e-5, absolute 1e-6.
        cases.push(
            case(
                "motifs.pool.mean_pooling",
                &[("B", int(b as i64)), ("T", int(t as i64)), ("H", int(h))],
                tol(1e-6, 1e-7),
                tol(1e-5, 1e-6),
            )
            .with("mask", i32_bytes(&mask)),
        );
    }
    check_cases("embed", cases, 23);
}

#[test]
fn elementwise_activations() {
    let mut cases = vec![];
    // BN = 1024 elements per program: 1024 and 2048 are multiples, 1 and 3000 are not; 77 with BN = 32.
    for (n, bn) in [(1, 1024), (1024, 1024), (3000, 1024), (77, 32)] {
        for stage in [
            "motifs.act.gelu_erf",
            "motifs.act.gelu_tanh",
            "motifs.act.silu",
            "motifs.act.silu_mul",
        ] {
            // Inputs in [-6, 6). erf/tanh/sigmoid are f64 functions rounded once in both (the JIT calls the same
            // helpers), the rest is IEEE f32: relative 1e-6, absolute 1e-7 vs the reference (a few ulps);
            // vs numpy relative 1e-5, absolute 1e-6 (gelu(x) ~ 0 for x ~ -6 has cancellation in 1 + erf).
            cases.push(
                case(
                    stage,
                    &[("N", int(n)), ("BN", int(bn))],
                    tol(1e-6, 1e-7),
                    tol(1e-5, 1e-6),
                )
                .range(6.0),
            );
        }
    }
    check_cases("act", cases, 31);
}

#[test]
fn rope_rotate_half() {
    let mut rng = Rng(77);
    let mut cases = vec![];
    // (N tokens, H heads, KV heads, D head dim, BASE, max position)
    for (n, h, kv, d, base, maxpos) in [
        (5, 3, 3, 8, 10000, 16),
        (16, 9, 3, 64, 100000, 2048), // SmolLM2-135M: 9 query heads, 3 KV heads, head dim 64, theta 1e5
        (3, 4, 1, 128, 500000, 131072),
        (1, 1, 1, 2, 10000, 3),
    ] {
        let pos: Vec<i32> = (0..n).map(|_| rng.below(maxpos) as i32).collect();
        let cfg = [
            ("N", int(n as i64)),
            ("H", int(h)),
            ("D", int(d)),
            ("BASE", int(base)),
        ];
        // The frequency table is f64 exp/log (the same in both), the angle exact wrapping i32 arithmetic and
        // sin/cos IEEE f32 polynomials: bit-exact JIT vs reference.
        // vs numpy: the angle modulo a turn is exact up to the 48-bit table (|pos| 2^-49 turns), sin/cos are
        // within about 2 f32 ulps, then two f32 products and a sum per element of |x| < 1: relative 1e-6,
        // absolute 3e-7 (a few f32 ulps).
        cases.push(
            case("motifs.rope.rope", &cfg, EXACT, tol(1e-6, 3e-7)).with("pos", i32_bytes(&pos)),
        );
        let mut cfg2 = cfg.to_vec();
        cfg2.push(("KV", int(kv)));
        cases.push(
            case("motifs.rope.rope_qk", &cfg2, EXACT, tol(1e-6, 3e-7)).with("pos", i32_bytes(&pos)),
        );
    }
    // Heads split over programs (BH = 2 of H = 5: a ragged last block).
    cases.push(
        case(
            "motifs.rope.rope",
            &[
                ("N", int(4)),
                ("H", int(5)),
                ("D", int(16)),
                ("BASE", int(10000)),
                ("BH", int(2)),
            ],
            EXACT,
            tol(1e-6, 3e-7),
        )
        .with("pos", i32_bytes(&[0, 1, 7, 4095])),
    );
    check_cases("rope", cases, 41);
}

/// Attention tolerances: scores are f32 dot products of length D <= 64 (JIT: f32 accumulation in gemm
/// microkernels; reference: f64 rounded once), then exp, a running rescale and a second dot product of length
/// <= T; outputs are convex combinations of v in [-1, 1). JIT vs reference: relative 2e-6, absolute 5e-7;
/// vs numpy float64: relative 1e-5, absolute 1e-6.
const ATT_JIT: Tol = Tol {
    rel: 2e-6,
    abs: 5e-7,
};
const ATT_NP: Tol = Tol {
    rel: 1e-5,
    abs: 1e-6,
};

#[test]
fn attention_padded_bidirectional() {
    let mut rng = Rng(99);
    let mut cases = vec![];
    // (B, S, H, KV, D, BQ, BK): BQ = BK = 32 by default; S = 40 and 7 are not multiples, D = 24 and 5 are not
    // powers of two; KV < H is grouped-query.
    for (b, sq, h, kv, d, bq, bk) in [
        (2, 32, 2, 2, 16, 32, 32),
        (3, 40, 4, 2, 24, 32, 32),
        (2, 7, 3, 1, 5, 4, 4),
        (1, 33, 6, 3, 64, 16, 8),
    ] {
        let mut lens: Vec<i32> = (0..b).map(|_| 1 + rng.below(sq as u64) as i32).collect();
        lens[0] = sq; // one unpadded sequence
        if b == 3 {
            lens[2] = 0; // no visible key: zeros
            lens[1] = sq + 5; // more than S: clamped
        }
        cases.push(
            case(
                "motifs.attention.attention_padded",
                &[
                    ("B", int(b as i64)),
                    ("S", int(sq as i64)),
                    ("H", int(h)),
                    ("KV", int(kv)),
                    ("D", int(d)),
                    ("BQ", int(bq)),
                    ("BK", int(bk)),
                ],
                ATT_JIT,
                ATT_NP,
            )
            .with("lens", i32_bytes(&lens)),
        );
    }
    check_cases("attn_pad", cases, 101);
}

#[test]
fn attention_causal_and_grouped() {
    let mut cases = vec![];
    // (B, S, T, H, KV, D, BQ, BK): T > S is a chunk after cached keys; S = 1 is one decode step.
    for (b, sq, t, h, kv, d, bq, bk) in [
        (1, 32, 32, 2, 2, 16, 32, 32),
        (2, 37, 37, 4, 2, 24, 32, 32),
        (1, 9, 40, 6, 2, 8, 4, 16),
        (2, 1, 19, 4, 1, 32, 32, 32),
        (1, 45, 45, 9, 3, 64, 16, 16),
    ] {
        cases.push(case(
            "motifs.attention.attention_causal",
            &[
                ("B", int(b)),
                ("S", int(sq)),
                ("T", int(t)),
                ("H", int(h)),
                ("KV", int(kv)),
                ("D", int(d)),
                ("BQ", int(bq)),
                ("BK", int(bk)),
            ],
            ATT_JIT,
            ATT_NP,
        ));
    }
    // A padded head dim (BD = 8 > D = 5): the extra columns read 0 and are not stored.
    cases.push(case(
        "motifs.attention.attention_causal",
        &[
            ("B", int(1)),
            ("S", int(6)),
            ("T", int(6)),
            ("H", int(2)),
            ("D", int(5)),
            ("BD", int(8)),
        ],
        ATT_JIT,
        ATT_NP,
    ));
    // Stability: q, k, v in [-8, 8) with D = 64 give scores up to ~500, far past exp's f32 range without the
    // max subtraction. A score's f32 rounding (about 500 * 2^-24 = 3e-5) moves softmax weights by the same
    // relative amount: relative 1e-4, absolute 3e-4 (outputs up to 8) vs the reference and vs numpy.
    cases.push(
        case(
            "motifs.attention.attention_causal",
            &[
                ("B", int(1)),
                ("S", int(20)),
                ("T", int(20)),
                ("H", int(2)),
                ("KV", int(1)),
                ("D", int(64)),
            ],
            tol(1e-4, 3e-4),
            tol(1e-4, 3e-4),
        )
        .range(8.0),
    );
    check_cases("attn_causal", cases, 202);
}

// ---- errors ----------------------------------------------------------------------------------------------------

/// An embedding id >= vocabulary (or negative) is the checked-load error in both the reference and the JIT; the
/// output gets no garbage (every row is either still poisoned or the right table row) and nothing is written
/// past its end (a guard region right after the buffer, in the same allocation, stays intact).
#[test]
fn embed_out_of_range_id_is_a_checked_load_error() {
    let (r, h, v) = (9usize, 37usize, 50usize);
    let stage = specialize(
        "motifs.embed.embed",
        &[
            ("R".into(), int(r as i64)),
            ("H".into(), int(h as i64)),
            ("V".into(), int(v as i64)),
        ],
    );
    let mut rng = Rng(3);
    let table: Vec<f32> = (0..v * h).map(|_| rng.f32(-1.0, 1.0)).collect();
    let tb = f32_bytes(&table);
    let cs = loom_cpu::compile_stage(&stage).unwrap();
    let row = h * 4;
    for (bad_at, bad_id) in [
        (3usize, v as i32),
        (0, v as i32 + 1000),
        (8, -1),
        (5, i32::MAX),
    ] {
        let mut ids: Vec<i32> = (0..r).map(|_| rng.below(v as u64) as i32).collect();
        ids[bad_at] = bad_id;
        let idb = i32_bytes(&ids);
        let mut want = loom_reference::alloc_outputs(&stage).unwrap();
        let we = loom_reference::run_stage(&stage, &[&idb], &[&tb], &mut want).unwrap_err();
        assert!(
            matches!(we, loom_reference::Error::IndexOutOfRange { index, dim: 0, extent, .. }
                if index == bad_id as i64 && extent == v as u64),
            "reference: {we}"
        );
        for threads in [1, 2] {
            const GUARD: usize = 4096;
            let len = r * row;
            let mut buf = Vec::with_capacity(len + GUARD);
            buf.resize(len + GUARD, 0xa5u8);
            buf[..len].fill(0xff);
            buf.truncate(len);
            let mut outs = vec![buf];
            let ge = cs.run(&[&idb], &[&tb], &mut outs, threads).unwrap_err();
            assert!(
                matches!(ge, loom_cpu::Error::IndexOutOfRange { index, dim: 0, extent, .. }
                    if index == bad_id as i64 && extent == v as u64),
                "jit ({threads} threads): {ge}"
            );
            assert_eq!(
                ge.to_string(),
                we.to_string(),
                "jit and reference report the same error"
            );
            let out = &mut outs[0];
            assert_eq!(out.len(), len);
            for (ri, chunk) in out.chunks(row).enumerate() {
                let poisoned = chunk.iter().all(|&b| b == 0xff);
                let good = ri != bad_at
                    && (0..v as i32).contains(&ids[ri])
                    && floats(chunk)[..] == table[ids[ri] as usize * h..][..h];
                assert!(
                    poisoned || good,
                    "threads {threads}: row {ri} holds garbage"
                );
                if ri == bad_at {
                    assert!(poisoned, "threads {threads}: the failing row was written");
                }
            }
            // The guard bytes were initialised above and the vector never reallocated (same capacity).
            assert!(out.capacity() >= len + GUARD);
            // SAFETY: the `len + GUARD` bytes were initialised by `resize` before `truncate`, which does not
            // touch them, and the allocation is unchanged.
            unsafe { out.set_len(len + GUARD) };
            assert!(
                out[len..].iter().all(|&b| b == 0xa5),
                "threads {threads}: bytes written past the output"
            );
        }
    }
}

/// The motifs' documented shape preconditions fail at specialization, not at run time: RoPE needs an even head
/// dim, grouped-query attention needs H % KV == 0.
#[test]
fn motif_shape_preconditions_are_specialization_errors() {
    let cat = catalog();
    let spec = |stage: &str, cfg: &[(&str, i64)]| {
        let (module, name) = stage.rsplit_once('.').expect("MODULE.STAGE");
        let cfg: Vec<(String, TValue)> =
            cfg.iter().map(|(k, v)| (k.to_string(), int(*v))).collect();
        loom_kernel::specialize_stage(cat, cat.find(module).expect("module"), name, &cfg)
    };
    assert!(spec("motifs.rope.rope", &[("D", 8)]).is_ok());
    let e = spec("motifs.rope.rope", &[("D", 7)]).unwrap_err().join("");
    assert!(e.contains("kernel expects f32[16, 4, 6]"), "{e}");
    assert!(spec("motifs.attention.attention_causal", &[("H", 6), ("KV", 3)]).is_ok());
    for stage in [
        "motifs.attention.attention_causal",
        "motifs.attention.attention_padded",
    ] {
        let e = spec(stage, &[("H", 6), ("KV", 4)]).unwrap_err().join("");
        assert!(e.contains("wrong buffer for parameter %q"), "{e}");
    }
}
