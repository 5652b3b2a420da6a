//! `fold`: which values are the same in every program instance, and their exact values.

use loom_ir::kernel::{Access, BinOp, DType, KOperand, UnOp};
use loom_reference::{Elements, fold};
use loom_testkit::{KB, i, imm_f, imm_i};

fn value(o: &KOperand) -> u32 {
    match o {
        KOperand::Value(v) => v.0,
        KOperand::Imm(..) => panic!("an immediate"),
    }
}

#[test]
fn template_only_values_fold_and_instance_dependent_ones_do_not() {
    let mut kb = KB::new("fold", [4, 1, 1]);
    let x = kb.param("x", DType::F32, &[4, 8], Access::Read);
    let y = kb.param("y", DType::F32, &[4, 8], Access::Write);
    let r = kb.range(i(0), 8);
    let e = kb.cast(r.clone(), DType::F64);
    let e = kb.mul(e, imm_f(-0.5, DType::F64));
    let ex = kb.un(UnOp::Exp, e);
    let lim = kb.cast(ex.clone(), DType::I32);
    let by_zero = kb.bin(BinOp::Div, lim.clone(), imm_i(0, DType::I32));
    let n = kb.pid(0);
    let row = kb.add(n.clone(), i(1));
    let t = kb.load(x, vec![n.clone(), r.clone()], Some(imm_f(0.0, DType::F32)));
    let s = kb.cast(ex.clone(), DType::F32);
    let t = kb.mul(t, s.clone());
    kb.store(y, vec![n, r.clone()], t.clone());
    let k = kb.finish();
    let f = fold(&k);

    let range = &f[&value(&r)];
    assert_eq!((range.dtype, range.shape.clone()), (DType::I64, vec![8]));
    assert_eq!(range.elements, Elements::Int((0..8).collect()));
    // f64 exp, exactly Rust's (the reference's semantics), then the f32 rounding of the cast.
    let want: Vec<f64> = (0..8).map(|j| (j as f64 * -0.5).exp()).collect();
    assert_eq!(f[&value(&ex)].elements, Elements::Float(want.clone()));
    let want32: Vec<f64> = want.iter().map(|&w| f64::from(w as f32)).collect();
    assert_eq!(f[&value(&s)].elements, Elements::Float(want32));
    assert_eq!(
        f[&value(&lim)].elements,
        Elements::Int(vec![1, 0, 0, 0, 0, 0, 0, 0])
    );
    // Failing operations, program ids, loads and everything after them are left to run.
    for o in [&by_zero, &row, &t] {
        assert!(!f.contains_key(&value(o)), "{o:?} folded");
    }
}
