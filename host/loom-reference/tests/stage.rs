//! Stages: dispatch order, workspace (and its poison), parameter bindings, buffer views and binding checks.

mod common;

use common::*;
use loom_ir::kernel::{BufRef, DType, Kernel, ParamBinding};
use loom_reference::{Error, alloc_outputs, run_kernel, run_stage};

/// `y[i] = x[i] * a + b` over `n` elements, 8 per program (masked).
fn affine(name: &str, n: u64, a: f64, b: f64) -> Kernel {
    let mut kb = KB::new(name, [cdiv(n, 8), 1, 1]);
    let x = kb.param("x", DType::F32, &[n], READ);
    let y = kb.param("y", DType::F32, &[n], WRITE);
    let p = kb.pid(0);
    let s = kb.mul(p, i(8));
    let r = kb.range(s, 8);
    let t = kb.load(x, vec![r.clone()], Some(f(0.0)));
    let t = kb.mul(t, f(a));
    let t = kb.add(t, f(b));
    kb.store(y, vec![r], t);
    kb.finish()
}

#[test]
fn two_dispatches_through_workspace() {
    let x: Vec<f32> = (0..15).map(|v| v as f32 - 4.0).collect();
    // x is [3, 5]; the kernels view it (and y) as [15].
    let st = stage(
        "two_step",
        vec![buf("x", DType::F32, &[3, 5])],
        vec![buf("y", DType::F32, &[3, 5])],
        vec![buf("w", DType::F32, &[15])],
        vec![affine("double", 15, 2.0, 0.0), affine("inc", 15, 1.0, 1.0)],
        vec![
            (0, vec![BufRef::Input(0), BufRef::Workspace(0)]),
            (1, vec![BufRef::Workspace(0), BufRef::Output(0)]),
        ],
    );
    let xb = f32_bytes(&x);
    let mut outs = alloc_outputs(&st).unwrap();
    run_stage(&st, &[&xb], &[], &mut outs).unwrap();
    let y = f32s(&outs[0]);
    assert_eq!(y, x.iter().map(|v| v * 2.0 + 1.0).collect::<Vec<_>>());
}

#[test]
fn reading_unwritten_workspace_is_visible() {
    // The first dispatch fills only w[0..8] (one program, 8 of the 15 elements); the second reads all of w.
    let mut kb = KB::new("prefix", [1, 1, 1]);
    let x = kb.param("x", DType::F32, &[15], READ);
    let w = kb.param("w", DType::F32, &[15], WRITE);
    let r = kb.range(i(0), 8);
    let t = kb.load(x, vec![r.clone()], None);
    kb.store(w, vec![r], t);
    let prefix = kb.finish();
    let st = stage(
        "poison",
        vec![buf("x", DType::F32, &[15])],
        vec![buf("y", DType::F32, &[15])],
        vec![buf("w", DType::F32, &[15])],
        vec![prefix, affine("inc", 15, 1.0, 1.0)],
        vec![
            (0, vec![BufRef::Input(0), BufRef::Workspace(0)]),
            (1, vec![BufRef::Workspace(0), BufRef::Output(0)]),
        ],
    );
    let xb = f32_bytes(&[1.0; 15]);
    let mut outs = vec![vec![0u8; 60]];
    run_stage(&st, &[&xb], &[], &mut outs).unwrap();
    let y = f32s(&outs[0]);
    assert!(y[..8].iter().all(|&v| v == 2.0), "{y:?}");
    assert!(
        y[8..].iter().all(|v| v.is_nan()),
        "unwritten workspace must read as NaN: {y:?}"
    );
}

fn embed_stage(v: u64, h: u64, b: u64, t: u64) -> loom_ir::kernel::Stage {
    let r = b * t;
    let mut kb = KB::new("gather_rows", [r, 1, 1]);
    let emb = kb.param("emb", DType::F32, &[v, h], READ);
    let ids = kb.param("ids", DType::I32, &[r], READ);
    let out = kb.param("out", DType::F32, &[r, h], WRITE);
    let p = kb.pid(0);
    let id32 = kb.load(ids, vec![p.clone()], None);
    let id = kb.cast(id32, DType::I64);
    let rh = kb.range(i(0), h as u32);
    let row = kb.load(emb, vec![id, rh.clone()], None);
    kb.store(out, vec![p, rh], row);
    let mut st = stage(
        "embed_forward",
        vec![buf("ids", DType::I32, &[b, t])],
        vec![buf("out", DType::F32, &[b, t, h])],
        vec![],
        vec![kb.finish()],
        vec![(
            0,
            vec![BufRef::Param(0), BufRef::Input(0), BufRef::Output(0)],
        )],
    );
    st.param_domain = Some("dense".into());
    st.params = vec![ParamBinding {
        name: "emb".into(),
        dtype: DType::F32,
        shape: vec![v, h],
        input: 0,
        key: "embeddings.weight".into(),
        layout: None,
    }];
    st
}

#[test]
fn parameter_bindings_and_token_ids_out_of_vocabulary() {
    let (v, h, b, t) = (11u64, 6u64, 2u64, 3u64);
    let st = embed_stage(v, h, b, t);
    let emb: Vec<f32> = (0..v * h).map(|x| x as f32 * 0.5).collect();
    let embb = f32_bytes(&emb);
    let ids = i32_bytes(&[0, 10, 3, 3, 7, 1]);
    let mut outs = alloc_outputs(&st).unwrap();
    run_stage(&st, &[&ids], &[&embb], &mut outs).unwrap();
    let out = f32s(&outs[0]);
    for (k, id) in [0usize, 10, 3, 3, 7, 1].into_iter().enumerate() {
        assert_eq!(
            &out[k * h as usize..(k + 1) * h as usize],
            &emb[id * h as usize..(id + 1) * h as usize]
        );
    }
    let ids = i32_bytes(&[0, 11, 3, 3, 7, 1]);
    let err = run_stage(&st, &[&ids], &[&embb], &mut outs).unwrap_err();
    assert!(
        matches!(&err, Error::IndexOutOfRange { param, index: 11, extent: 11, program_id: [1, 0, 0], .. } if param == "emb"),
        "{err:?}"
    );
}

#[test]
fn in_place_dispatch_binds_one_buffer_twice() {
    // y = x * 3 - 1 where x and y are the same output buffer.
    let st = stage(
        "in_place",
        vec![],
        vec![buf("y", DType::F32, &[10])],
        vec![],
        vec![affine("affine", 10, 3.0, -1.0)],
        vec![(0, vec![BufRef::Output(0), BufRef::Output(0)])],
    );
    let x: Vec<f32> = (0..10).map(|v| v as f32).collect();
    let mut outs = vec![f32_bytes(&x)];
    run_stage(&st, &[], &[], &mut outs).unwrap();
    assert_eq!(
        f32s(&outs[0]),
        x.iter().map(|v| v * 3.0 - 1.0).collect::<Vec<_>>()
    );
}

fn malformed_stage(st: &loom_ir::kernel::Stage, inputs: &[&[u8]], needle: &str) {
    let mut outs = alloc_outputs(st).unwrap();
    match run_stage(st, inputs, &[], &mut outs) {
        Err(Error::Malformed { at, message }) => {
            assert!(
                message.contains(needle),
                "`{message}` should mention `{needle}`"
            );
            assert!(at.contains("dispatch 0"), "{at}");
        }
        other => panic!("expected a malformed-IR error mentioning `{needle}`, got {other:?}"),
    }
}

#[test]
fn dispatch_bindings_are_checked() {
    let ok = |args: Vec<BufRef>, kernel: u32| {
        stage(
            "bind",
            vec![
                buf("x", DType::F32, &[15]),
                buf("i", DType::I32, &[15]),
                buf("s", DType::F32, &[14]),
            ],
            vec![buf("y", DType::F32, &[15])],
            vec![],
            vec![affine("affine", 15, 1.0, 0.0)],
            vec![(kernel, args)],
        )
    };
    let (x, ib, s) = (
        f32_bytes(&[0.0; 15]),
        i32_bytes(&[0; 15]),
        f32_bytes(&[0.0; 14]),
    );
    let inputs: [&[u8]; 3] = [&x, &ib, &s];
    malformed_stage(
        &ok(vec![BufRef::Input(1), BufRef::Output(0)], 0),
        &inputs,
        "cannot bind",
    );
    malformed_stage(
        &ok(vec![BufRef::Input(2), BufRef::Output(0)], 0),
        &inputs,
        "cannot bind",
    );
    malformed_stage(
        &ok(vec![BufRef::Input(0), BufRef::Input(0)], 0),
        &inputs,
        "read-only",
    );
    malformed_stage(
        &ok(vec![BufRef::Input(0)], 0),
        &inputs,
        "1 arguments for 2 parameters",
    );
    malformed_stage(
        &ok(vec![BufRef::Input(7), BufRef::Output(0)], 0),
        &inputs,
        "does not exist",
    );
    malformed_stage(
        &ok(vec![BufRef::Input(0), BufRef::Workspace(0)], 0),
        &inputs,
        "does not exist",
    );
    malformed_stage(
        &ok(vec![BufRef::Input(0), BufRef::Output(0)], 3),
        &inputs,
        "kernel #3",
    );

    let st = ok(vec![BufRef::Input(0), BufRef::Output(0)], 0);
    let mut outs = alloc_outputs(&st).unwrap();
    run_stage(&st, &inputs, &[], &mut outs).unwrap();
    let err = run_stage(&st, &inputs[..2], &[], &mut outs).unwrap_err();
    assert_eq!(
        err,
        Error::BufferCount {
            what: "stage `bind` inputs".into(),
            expected: 3,
            actual: 2
        }
    );
    let short = vec![0u8; 59];
    let err = run_stage(&st, &[&x, &ib, &short], &[], &mut outs).unwrap_err();
    assert!(
        matches!(&err, Error::SizeMismatch { buffer, expected: 56, actual: 59, .. } if buffer.contains("input `s`")),
        "{err:?}"
    );
    let mut bad_outs = vec![vec![0u8; 61]];
    let err = run_stage(&st, &inputs, &[], &mut bad_outs).unwrap_err();
    assert!(
        matches!(&err, Error::SizeMismatch { buffer, .. } if buffer.contains("output `y`")),
        "{err}"
    );
}

#[test]
fn kernel_buffer_sizes_are_checked() {
    let k = affine("affine", 15, 1.0, 0.0);
    let err = run_kernel(&k, &mut [vec![0; 60], vec![0; 64]]).unwrap_err();
    assert_eq!(
        err,
        Error::SizeMismatch {
            buffer: "kernel `affine` parameter `y`".into(),
            dtype: DType::F32,
            shape: vec![15],
            expected: 60,
            actual: 64
        }
    );
    assert!(err.to_string().contains("parameter `y`"), "{err}");
    let err = run_kernel(&k, &mut [vec![0; 60]]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::BufferCount {
                expected: 2,
                actual: 1,
                ..
            }
        ),
        "{err:?}"
    );
}
