//! Golden tests of the emitted CUDA C (and WGSL) for small kernels: the text is compared with
//! `tests/golden/*.cu` / `*.wgsl`; `LOOM_BLESS=1 cargo test -p loom-emit --test golden` rewrites them. A diff
//! in review shows exactly how a generator change alters device code.

use std::path::Path;

use loom_emit::{WgslLimits, cuda_kernel, wgsl_kernel};
use loom_ir::kernel::{Access, DType, Kernel, ReduceOp};
use loom_testkit::{KB, f, i};

fn check(name: &str, text: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("LOOM_BLESS").is_some() {
        std::fs::write(&path, text).expect("golden file is writable");
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("{} is missing: run with LOOM_BLESS=1", path.display()));
    assert!(
        want == text,
        "{name} differs from the emitted text (LOOM_BLESS=1 re-blesses):\n{text}"
    );
}

/// `y = x * 2 + 1` over a masked [37] f32 vector, 2 programs of 32.
fn axpb() -> Kernel {
    let mut kb = KB::new("golden.axpb", [2, 1, 1]);
    let x = kb.param("x", DType::F32, &[37], Access::Read);
    let y = kb.param("y", DType::F32, &[37], Access::Write);
    let p = kb.pid(0);
    let s = kb.mul(p, i(32));
    let r = kb.range(s, 32);
    let t = kb.load(x, vec![r.clone()], Some(f(0.0)));
    let t = kb.mul(t, f(2.0));
    let t = kb.add(t, f(1.0));
    kb.store(y, vec![r], t);
    kb.finish()
}

/// Row sums of an f16 [4, 8] matrix with a checked load (a reduction through shared memory).
fn rowsum_f16() -> Kernel {
    let mut kb = KB::new("golden.rowsum", [1, 1, 1]);
    let x = kb.param("x", DType::F16, &[4, 8], Access::Read);
    let y = kb.param("y", DType::F16, &[4], Access::Write);
    let rr = kb.range(i(0), 4);
    let rc = kb.range(i(0), 8);
    let t = kb.load(x, vec![rr.clone(), rc], None);
    let s = kb.reduce(ReduceOp::Sum, t, 1);
    kb.store(y, vec![rr], s);
    kb.finish()
}

fn gemm() -> Kernel {
    loom_testkit::gemm_kernel(20, 12, 9, 16, 8, 4, false)
}

#[test]
fn cuda_golden() {
    check("axpb.cu", &cuda_kernel(&axpb()).unwrap().source);
    check("rowsum_f16.cu", &cuda_kernel(&rowsum_f16()).unwrap().source);
    check("gemm.cu", &cuda_kernel(&gemm()).unwrap().source);
}

#[test]
fn wgsl_golden() {
    check(
        "axpb.wgsl",
        &wgsl_kernel(&axpb(), &WgslLimits::default()).unwrap().source,
    );
}
