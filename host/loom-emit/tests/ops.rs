//! Hand-built kernels (the shared `KB` builder) covering every op, dtype family and access kind: each must emit
//! WGSL that naga validates and CUDA C, or fail with the documented error. Malformed IR must be an error,
//! never a panic.

use loom_emit::{Error, WgslLimits, cuda_kernel, wgsl_kernel};
use loom_ir::kernel::{Access, BinOp, DType, KOpKind, KType, KValue, Kernel, UnOp};
use loom_testkit::corpus::{self, FLOATS, INTS};
use loom_testkit::{KB, f, i, imm_f, imm_i, tile, v};

fn both(k: &Kernel) {
    if let Err(e) = wgsl_kernel(k, &WgslLimits::default()) {
        panic!("WGSL for `{}`: {e}", k.name);
    }
    if let Err(e) = cuda_kernel(k) {
        panic!("CUDA for `{}`: {e}", k.name);
    }
}

#[test]
fn elementwise_ops_of_every_dtype() {
    for &d in INTS.iter().chain(FLOATS) {
        both(&corpus::elementwise(d));
    }
}

#[test]
fn casts_between_every_pair_of_value_dtypes() {
    let all: Vec<DType> = INTS
        .iter()
        .chain(FLOATS)
        .copied()
        .chain([DType::I1])
        .collect();
    for &from in &all {
        let k = corpus::casts_from(from);
        // 12 buffers exceed the 8 storage bindings of the default limits: WGSL says so, CUDA does not care.
        match wgsl_kernel(&k, &WgslLimits::default()) {
            Err(Error::Unsupported(m)) => assert!(m.contains("storage buffers"), "{m}"),
            other => panic!("{other:?}"),
        }
        let lim = WgslLimits {
            max_storage_buffers_per_shader_stage: 16,
            ..WgslLimits::default()
        };
        wgsl_kernel(&k, &lim).unwrap_or_else(|e| panic!("cast from {from}: {e}"));
        cuda_kernel(&k).unwrap();
    }
}

#[test]
fn data_movement_reductions_and_dot() {
    both(&corpus::data_movement_reductions_and_dot());
}

#[test]
fn integer_reductions_and_big_tiles_chunk_through_scratch() {
    // A [8, 4096] i32 tile: 32768 elements, reduced along both axes; the index tile is a computed (not range)
    // tile, so it is staged through scratch in chunks.
    let k = corpus::big_integer_reductions();
    let m = wgsl_kernel(&k, &WgslLimits::default()).unwrap();
    assert_eq!(m.workgroup_size, 128);
    cuda_kernel(&k).unwrap();
}

#[test]
fn loads_and_stores_of_every_buffer_dtype() {
    let all: Vec<DType> = INTS
        .iter()
        .chain(FLOATS)
        .copied()
        .chain([DType::I1])
        .collect();
    for &d in &all {
        both(&corpus::loads_and_stores(d));
    }
}

#[test]
fn quantised_loads_dequantise_on_both_targets() {
    for d in [
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q4K,
        DType::Q6K,
    ] {
        let k = corpus::quantised_load(d);
        // WGSL is validated by naga inside wgsl_kernel and executed against the reference in
        // hal_conformance.rs; the CUDA reader is compiled by NVRTC in hal-cuda's tests/nvrtc.rs and run on the
        // host against the reference in tests/cuda_dequant.rs.
        let m = wgsl_kernel(&k, &WgslLimits::default())
            .unwrap_or_else(|e| panic!("WGSL for `{}`: {e}", k.name));
        assert!(m.source.contains("fn rd0("), "{}", m.source);
        let c = cuda_kernel(&k).unwrap_or_else(|e| panic!("CUDA for `{}`: {e}", k.name));
        assert!(
            c.source
                .contains("float rd0(const unsigned char* __restrict__ b, long long g)"),
            "{}",
            c.source
        );
    }
}

#[test]
fn control_flow_if_and_nested_for() {
    both(&corpus::control_flow());
}

#[test]
fn f64_is_unsupported_in_wgsl_but_emitted_for_cuda() {
    let k = corpus::f64_math();
    match wgsl_kernel(&k, &WgslLimits::default()) {
        Err(Error::Unsupported(m)) => assert!(m.contains("f64"), "{m}"),
        other => panic!("{other:?}"),
    }
    cuda_kernel(&k).unwrap();
}

/// f64 computed from template values only (RoPE's frequency table) is folded by `loom_reference::fold` and
/// written as literals in WGSL; the f64 values themselves are not emitted. CUDA computes them natively.
#[test]
fn f64_constants_are_folded_to_literals_in_wgsl() {
    let mut kb = KB::new("f64_table", [2, 1, 1]);
    let x = kb.param("x", DType::I32, &[2, 16], Access::Read);
    let y = kb.param("y", DType::I32, &[2, 16], Access::Write);
    let n = kb.pid(0);
    let r = kb.range(i(0), 16);
    let e = kb.cast(r.clone(), DType::F64);
    let e = kb.mul(e, imm_f(-0.1, DType::F64));
    let e = kb.un(UnOp::Exp, e);
    let e = kb.mul(e, imm_f(1000.0, DType::F64));
    let table = kb.cast(e, DType::I32);
    let t = kb.load(x, vec![n.clone(), r.clone()], Some(imm_i(0, DType::I32)));
    let t = kb.bin(BinOp::Add, t, table);
    kb.store(y, vec![n, r], t);
    let k = kb.finish();
    let m = wgsl_kernel(&k, &WgslLimits::default()).unwrap_or_else(|e| panic!("{e}"));
    // trunc(1000 exp(-0.1 i)) for i = 0, 1, 2: 1000, 904, 818.
    assert!(
        m.source.contains("array<i32, 16>(1000i, 904i, 818i"),
        "{}",
        m.source
    );
    let main = m.source.split("@compute").nth(1).expect("an entry point");
    assert!(!main.contains("exp("), "{}", m.source);
    cuda_kernel(&k).unwrap();
}

#[test]
fn extents_beyond_the_i32_emulation_are_rejected() {
    let mut kb = KB::new("huge", [1, 1, 1]);
    let x = kb.param("x", DType::U8, &[1 << 16, 1 << 16], Access::Read);
    let y = kb.param("y", DType::U8, &[4], Access::Write);
    let r = kb.range(i(0), 4);
    let t = kb.load(x, vec![i(0), r.clone()], None);
    kb.store(y, vec![r], t);
    let k = kb.finish();
    match wgsl_kernel(&k, &WgslLimits::default()) {
        Err(Error::Unsupported(m)) => assert!(m.contains("i32"), "{m}"),
        other => panic!("{other:?}"),
    }
    cuda_kernel(&k).unwrap();
    // An i64 immediate outside i32.
    let mut kb = KB::new("bigimm", [1, 1, 1]);
    let y = kb.param("y", DType::I64, &[1], Access::Write);
    let s = kb.add(i(1 << 40), i(1));
    kb.store(y, vec![i(0)], s);
    let k = kb.finish();
    assert!(matches!(
        wgsl_kernel(&k, &WgslLimits::default()),
        Err(Error::Unsupported(_))
    ));
    cuda_kernel(&k).unwrap();
}

#[test]
fn malformed_ir_is_an_error_not_a_panic() {
    let base = || {
        let mut kb = KB::new("bad", [1, 1, 1]);
        let y = kb.param("y", DType::F32, &[4], Access::Write);
        let r = kb.range(i(0), 4);
        let t = kb.full(f(1.0), &[4], DType::F32);
        kb.store(y, vec![r], t);
        kb.finish()
    };
    let mut cases: Vec<Kernel> = vec![];
    // A use of a value that does not exist.
    let mut k = base();
    if let KOpKind::Store { value, .. } = &mut k.body.ops[2].kind {
        *value = v(KValue(99));
    }
    cases.push(k);
    // A store to a parameter that does not exist.
    let mut k = base();
    if let KOpKind::Store { param, .. } = &mut k.body.ops[2].kind {
        *param = 7;
    }
    cases.push(k);
    // No final yield.
    let mut k = base();
    k.body.ops.pop();
    cases.push(k);
    // Empty body.
    let mut k = base();
    k.body.ops.clear();
    cases.push(k);
    // A declared type that disagrees with the op.
    let mut k = base();
    k.values[0].ty = KType::Scalar(DType::F32);
    cases.push(k);
    // Wrong number of indices, and a store to a read-only parameter.
    let mut k = base();
    if let KOpKind::Store { indices, .. } = &mut k.body.ops[2].kind {
        indices.push(i(0));
    }
    cases.push(k);
    let mut k = base();
    k.params[0].access = Access::Read;
    cases.push(k);
    // Shapes that do not line up.
    let mut k = base();
    k.values[1].ty = tile(&[5], DType::F32);
    cases.push(k);
    for (n, k) in cases.iter().enumerate() {
        let w = wgsl_kernel(k, &WgslLimits::default());
        assert!(matches!(w, Err(Error::Malformed(_))), "case {n}: {w:?}");
        let c = cuda_kernel(k);
        assert!(matches!(c, Err(Error::Malformed(_))), "case {n}: {c:?}");
    }
}
