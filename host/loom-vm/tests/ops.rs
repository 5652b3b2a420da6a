//! Semantics of every simple opcode, including the trapping cases.
mod common;
use common::*;
use loom_ir::{Opcode as O, Type as T};
use loom_vm::{TrapKind, Value as V};

fn kind(r: Result<V, loom_vm::Trap>) -> TrapKind {
    r.expect_err("expected a trap").kind
}

#[test]
fn integer_arithmetic_checked_and_wrapping() {
    assert_eq!(
        binop(O::Add, T::I64, T::I64, V::I64(2), V::I64(3)).unwrap(),
        V::I64(5)
    );
    assert_eq!(
        binop(O::Add, T::I32, T::I32, V::I32(-2), V::I32(-3)).unwrap(),
        V::I32(-5)
    );
    assert_eq!(
        kind(binop(O::Add, T::I64, T::I64, V::I64(i64::MAX), V::I64(1))),
        TrapKind::IntegerOverflow
    );
    assert_eq!(
        kind(binop(O::Add, T::I32, T::I32, V::I32(i32::MAX), V::I32(1))),
        TrapKind::IntegerOverflow
    );
    assert_eq!(
        kind(binop(O::Sub, T::I64, T::I64, V::I64(i64::MIN), V::I64(1))),
        TrapKind::IntegerOverflow
    );
    assert_eq!(
        kind(binop(
            O::Mul,
            T::I32,
            T::I32,
            V::I32(1 << 20),
            V::I32(1 << 12)
        )),
        TrapKind::IntegerOverflow
    );
    assert_eq!(
        binop(O::Mul, T::I32, T::I32, V::I32(-7), V::I32(6)).unwrap(),
        V::I32(-42)
    );
    assert_eq!(
        binop(O::AddWrap, T::I32, T::I32, V::I32(i32::MAX), V::I32(1)).unwrap(),
        V::I32(i32::MIN)
    );
    assert_eq!(
        binop(O::SubWrap, T::I64, T::I64, V::I64(i64::MIN), V::I64(1)).unwrap(),
        V::I64(i64::MAX)
    );
    assert_eq!(
        binop(O::MulWrap, T::I64, T::I64, V::I64(i64::MAX), V::I64(2)).unwrap(),
        V::I64(-2)
    );
    assert_eq!(
        binop(O::Div, T::I64, T::I64, V::I64(-7), V::I64(2)).unwrap(),
        V::I64(-3)
    );
    assert_eq!(
        binop(O::Rem, T::I32, T::I32, V::I32(-7), V::I32(2)).unwrap(),
        V::I32(-1)
    );
    assert_eq!(
        kind(binop(O::Div, T::I64, T::I64, V::I64(1), V::I64(0))),
        TrapKind::DivisionByZero
    );
    assert_eq!(
        kind(binop(O::Rem, T::I32, T::I32, V::I32(1), V::I32(0))),
        TrapKind::DivisionByZero
    );
    assert_eq!(
        kind(binop(O::Div, T::I64, T::I64, V::I64(i64::MIN), V::I64(-1))),
        TrapKind::IntegerOverflow
    );
    assert_eq!(
        kind(binop(O::Div, T::I32, T::I32, V::I32(i32::MIN), V::I32(-1))),
        TrapKind::IntegerOverflow
    );
    assert_eq!(
        binop(O::DivU, T::I32, T::I32, V::I32(-1), V::I32(2)).unwrap(),
        V::I32(i32::MAX)
    );
    assert_eq!(
        binop(O::RemU, T::I64, T::I64, V::I64(-1), V::I64(10)).unwrap(),
        V::I64(5)
    );
    assert_eq!(
        kind(binop(O::DivU, T::I64, T::I64, V::I64(1), V::I64(0))),
        TrapKind::DivisionByZero
    );
    assert_eq!(
        kind(binop(O::RemU, T::I32, T::I32, V::I32(1), V::I32(0))),
        TrapKind::DivisionByZero
    );
    assert_eq!(
        binop(O::Min, T::I32, T::I32, V::I32(-3), V::I32(2)).unwrap(),
        V::I32(-3)
    );
    assert_eq!(
        binop(O::Max, T::I64, T::I64, V::I64(-3), V::I64(2)).unwrap(),
        V::I64(2)
    );
    assert_eq!(unop(O::Neg, T::I32, T::I32, V::I32(5)).unwrap(), V::I32(-5));
    assert_eq!(
        kind(unop(O::Neg, T::I64, T::I64, V::I64(i64::MIN))),
        TrapKind::IntegerOverflow
    );
    assert_eq!(unop(O::Abs, T::I64, T::I64, V::I64(-5)).unwrap(), V::I64(5));
    assert_eq!(
        kind(unop(O::Abs, T::I32, T::I32, V::I32(i32::MIN))),
        TrapKind::IntegerOverflow
    );
}

#[test]
fn immediate_forms_match_register_forms() {
    // add/sub/mul/shift/and with an immediate, both widths, including overflow.
    let l = single(
        &[T::I64, T::I32],
        &[T::I64, T::I32, T::I64, T::I32, T::I64, T::I64],
        |b, p| {
            let a = b.op(O::Add, vec![v(p[0]), i64_(-10)], T::I64);
            let c = b.op(O::Mul, vec![i32_(3), v(p[1])], T::I32);
            let d = b.op(O::Sub, vec![v(p[0]), i64_(7)], T::I64);
            let e = b.op(O::Shl, vec![v(p[1]), i32_(33)], T::I32);
            let f = b.op(O::And, vec![v(p[0]), i64_(-2)], T::I64);
            let g = b.op(O::ShrU, vec![v(p[0]), i64_(60)], T::I64);
            b.ret(vec![v(a), v(c), v(d), v(e), v(f), v(g)]);
        },
    );
    let r = run(&l, &[V::I64(-1), V::I32(-5)]).unwrap();
    assert_eq!(
        r,
        vec![
            V::I64(-11),
            V::I32(-15),
            V::I64(-8),
            V::I32(-10),
            V::I64(-2),
            V::I64(15)
        ]
    );
    let t = run(&l, &[V::I64(i64::MIN), V::I32(1)]).unwrap_err();
    assert_eq!(t.kind, TrapKind::IntegerOverflow);
    assert!(t.message.contains("add"), "{t}");
}

#[test]
fn bitwise_and_shifts() {
    assert_eq!(
        binop(O::And, T::I32, T::I32, V::I32(0b1100), V::I32(0b1010)).unwrap(),
        V::I32(0b1000)
    );
    assert_eq!(
        binop(O::Or, T::I64, T::I64, V::I64(0b1100), V::I64(0b1010)).unwrap(),
        V::I64(0b1110)
    );
    assert_eq!(
        binop(O::Xor, T::I1, T::I1, V::I1(true), V::I1(true)).unwrap(),
        V::I1(false)
    );
    assert_eq!(
        unop(O::Not, T::I1, T::I1, V::I1(false)).unwrap(),
        V::I1(true)
    );
    assert_eq!(unop(O::Not, T::I32, T::I32, V::I32(0)).unwrap(), V::I32(-1));
    assert_eq!(unop(O::Not, T::I64, T::I64, V::I64(5)).unwrap(), V::I64(!5));
    assert_eq!(
        binop(O::Shl, T::I32, T::I32, V::I32(1), V::I32(33)).unwrap(),
        V::I32(2)
    );
    assert_eq!(
        binop(O::Shl, T::I64, T::I64, V::I64(1), V::I64(65)).unwrap(),
        V::I64(2)
    );
    assert_eq!(
        binop(O::Shr, T::I32, T::I32, V::I32(-8), V::I32(1)).unwrap(),
        V::I32(-4)
    );
    assert_eq!(
        binop(O::ShrU, T::I32, T::I32, V::I32(-8), V::I32(1)).unwrap(),
        V::I32(0x7fff_fffc)
    );
    assert_eq!(
        binop(O::Shr, T::I64, T::I64, V::I64(-8), V::I64(66)).unwrap(),
        V::I64(-2)
    );
    assert_eq!(
        binop(O::ShrU, T::I64, T::I64, V::I64(-1), V::I64(63)).unwrap(),
        V::I64(1)
    );
}

#[test]
fn comparisons() {
    let c = |o, t: T, a, b| binop(o, t, T::I1, a, b).unwrap();
    assert_eq!(c(O::CmpLt, T::I32, V::I32(-1), V::I32(0)), V::I1(true));
    assert_eq!(c(O::CmpUlt, T::I32, V::I32(-1), V::I32(0)), V::I1(false));
    assert_eq!(c(O::CmpGe, T::I64, V::I64(3), V::I64(3)), V::I1(true));
    assert_eq!(c(O::CmpGt, T::I64, V::I64(-3), V::I64(3)), V::I1(false));
    assert_eq!(c(O::CmpUgt, T::I64, V::I64(-3), V::I64(3)), V::I1(true));
    assert_eq!(c(O::CmpUle, T::I32, V::I32(3), V::I32(3)), V::I1(true));
    assert_eq!(c(O::CmpUge, T::I32, V::I32(2), V::I32(3)), V::I1(false));
    assert_eq!(c(O::CmpLe, T::I32, V::I32(2), V::I32(3)), V::I1(true));
    assert_eq!(c(O::CmpEq, T::I1, V::I1(true), V::I1(true)), V::I1(true));
    assert_eq!(c(O::CmpNe, T::I64, V::I64(1), V::I64(2)), V::I1(true));
    assert_eq!(
        c(O::CmpLt, T::F64, V::F64(f64::NAN), V::F64(1.0)),
        V::I1(false)
    );
    assert_eq!(
        c(O::CmpGe, T::F64, V::F64(f64::NAN), V::F64(1.0)),
        V::I1(false)
    );
    assert_eq!(
        c(O::CmpNe, T::F32, V::F32(f32::NAN), V::F32(f32::NAN)),
        V::I1(true)
    );
    assert_eq!(c(O::CmpEq, T::F64, V::F64(0.0), V::F64(-0.0)), V::I1(true));
    assert_eq!(c(O::CmpLe, T::F32, V::F32(1.5), V::F32(2.0)), V::I1(true));
    // Immediates on the left, negative immediates on i32.
    let l = single(&[T::I32, T::I64], &[T::I1, T::I1, T::I1], |b, p| {
        let x = b.op(O::CmpLt, vec![i32_(-5), v(p[0])], T::I1);
        let y = b.op(O::CmpEq, vec![v(p[0]), i32_(-1)], T::I1);
        let z = b.op(O::CmpGe, vec![v(p[1]), i64_(-1)], T::I1);
        b.ret(vec![v(x), v(y), v(z)]);
    });
    assert_eq!(
        run(&l, &[V::I32(-1), V::I64(-1)]).unwrap(),
        vec![V::I1(true), V::I1(true), V::I1(true)]
    );
    assert_eq!(
        run(&l, &[V::I32(-6), V::I64(-2)]).unwrap(),
        vec![V::I1(false), V::I1(false), V::I1(false)]
    );
}

#[test]
fn floats() {
    assert_eq!(
        binop(O::Add, T::F64, T::F64, V::F64(1.5), V::F64(2.25)).unwrap(),
        V::F64(3.75)
    );
    assert_eq!(
        binop(O::Sub, T::F32, T::F32, V::F32(1.5), V::F32(2.0)).unwrap(),
        V::F32(-0.5)
    );
    assert_eq!(
        binop(O::Mul, T::F32, T::F32, V::F32(1.5), V::F32(2.0)).unwrap(),
        V::F32(3.0)
    );
    assert_eq!(
        binop(O::Div, T::F64, T::F64, V::F64(1.0), V::F64(0.0)).unwrap(),
        V::F64(f64::INFINITY)
    );
    assert_eq!(
        binop(O::Div, T::F32, T::F32, V::F32(1.0), V::F32(3.0)).unwrap(),
        V::F32(1.0 / 3.0)
    );
    assert_eq!(
        binop(O::Rem, T::F64, T::F64, V::F64(7.5), V::F64(2.0)).unwrap(),
        V::F64(1.5)
    );
    assert_eq!(
        binop(O::Min, T::F64, T::F64, V::F64(f64::NAN), V::F64(1.0))
            .unwrap()
            .as_f64()
            .map(f64::is_nan),
        Some(true)
    );
    assert_eq!(
        binop(O::Max, T::F32, T::F32, V::F32(-1.0), V::F32(2.0)).unwrap(),
        V::F32(2.0)
    );
    assert_eq!(
        binop(O::Min, T::F64, T::F64, V::F64(0.0), V::F64(-0.0)).unwrap(),
        V::F64(-0.0)
    );
    assert_eq!(
        unop(O::Neg, T::F64, T::F64, V::F64(2.0)).unwrap(),
        V::F64(-2.0)
    );
    assert_eq!(
        unop(O::Abs, T::F32, T::F32, V::F32(-2.0)).unwrap(),
        V::F32(2.0)
    );
    assert_eq!(
        unop(O::Sqrt, T::F64, T::F64, V::F64(9.0)).unwrap(),
        V::F64(3.0)
    );
    assert_eq!(
        unop(O::Floor, T::F64, T::F64, V::F64(-1.5)).unwrap(),
        V::F64(-2.0)
    );
    assert_eq!(
        unop(O::Ceil, T::F32, T::F32, V::F32(1.25)).unwrap(),
        V::F32(2.0)
    );
    assert_eq!(
        unop(O::Exp, T::F64, T::F64, V::F64(0.0)).unwrap(),
        V::F64(1.0)
    );
    assert_eq!(
        unop(O::Log, T::F64, T::F64, V::F64(1.0)).unwrap(),
        V::F64(0.0)
    );
}

#[test]
fn conversions() {
    let cv = |o, from: T, to: T, a: V| unop(o, from, to, a);
    assert_eq!(
        cv(O::ConvI32, T::I64, T::I32, V::I64(-5)).unwrap(),
        V::I32(-5)
    );
    assert_eq!(
        kind(cv(O::ConvI32, T::I64, T::I32, V::I64(1 << 40))),
        TrapKind::BadConversion
    );
    assert_eq!(
        cv(O::ConvI64, T::I32, T::I64, V::I32(-5)).unwrap(),
        V::I64(-5)
    );
    assert_eq!(
        cv(O::ConvI64, T::I1, T::I64, V::I1(true)).unwrap(),
        V::I64(1)
    );
    assert_eq!(
        cv(O::ConvUI64, T::I32, T::I64, V::I32(-1)).unwrap(),
        V::I64(0xffff_ffff)
    );
    assert_eq!(
        cv(O::ConvI64, T::F64, T::I64, V::F64(-2.9)).unwrap(),
        V::I64(-2)
    );
    assert_eq!(
        kind(cv(O::ConvI64, T::F64, T::I64, V::F64(f64::NAN))),
        TrapKind::BadConversion
    );
    assert_eq!(
        kind(cv(O::ConvI64, T::F64, T::I64, V::F64(f64::INFINITY))),
        TrapKind::BadConversion
    );
    assert_eq!(
        kind(cv(O::ConvI64, T::F64, T::I64, V::F64(9.3e18))),
        TrapKind::BadConversion
    );
    assert_eq!(
        kind(cv(O::ConvI32, T::F32, T::I32, V::F32(3e9))),
        TrapKind::BadConversion
    );
    assert_eq!(
        cv(O::ConvI32, T::F32, T::I32, V::F32(-2147483648.0)).unwrap(),
        V::I32(i32::MIN)
    );
    assert_eq!(
        cv(O::ConvF64, T::I64, T::F64, V::I64(3)).unwrap(),
        V::F64(3.0)
    );
    assert_eq!(
        cv(O::ConvF32, T::F64, T::F32, V::F64(0.5)).unwrap(),
        V::F32(0.5)
    );
    assert_eq!(
        kind(cv(O::ConvF32, T::F64, T::F32, V::F64(1e300))),
        TrapKind::BadConversion
    );
    assert_eq!(
        cv(O::ConvF64, T::F32, T::F64, V::F32(0.25)).unwrap(),
        V::F64(0.25)
    );
    assert_eq!(
        cv(O::TruncI32, T::I64, T::I32, V::I64(0x1_0000_0005)).unwrap(),
        V::I32(5)
    );
    assert_eq!(
        cv(O::BitcastI32, T::F32, T::I32, V::F32(1.0)).unwrap(),
        V::I32(0x3f80_0000)
    );
    assert_eq!(
        cv(O::BitcastF64, T::I64, T::F64, V::I64(0x3ff0_0000_0000_0000)).unwrap(),
        V::F64(1.0)
    );
    assert_eq!(
        cv(O::BitcastI64, T::F64, T::I64, V::F64(-0.0)).unwrap(),
        V::I64(i64::MIN)
    );
    assert_eq!(
        cv(O::BitcastF32, T::I32, T::F32, V::I32(0x4000_0000)).unwrap(),
        V::F32(2.0)
    );
}

#[test]
fn select_copy_consts() {
    let l = single(
        &[T::I1, T::Str, T::Str],
        &[T::I64, T::Str, T::F64, T::Str, T::I32],
        |b, p| {
            let a = b.op(O::Select, vec![v(p[0]), i64_(1), i64_(2)], T::I64);
            let s = b.op(O::Select, vec![v(p[0]), v(p[1]), v(p[2])], T::Str);
            let f = b.op(O::ConstF64, vec![f64_(0.5)], T::F64);
            let c = b.op(O::ConstStr, vec![s_("k")], T::Str);
            let i = b.op(O::Copy, vec![i32_(-4)], T::I32);
            b.ret(vec![v(a), v(s), v(f), v(c), v(i)]);
        },
    );
    let r = run(&l, &[V::I1(false), V::str("x"), V::str("y")]).unwrap();
    assert_eq!(
        r,
        vec![V::I64(2), V::str("y"), V::F64(0.5), V::str("k"), V::I32(-4)]
    );
}

fn buf(bytes: &[u8]) -> V {
    V::buffer(bytes.to_vec())
}

#[test]
fn buffer_loads_and_stores() {
    let l = single(
        &[T::I64],
        &[
            T::Buffer,
            T::I32,
            T::I32,
            T::I32,
            T::I32,
            T::I64,
            T::I64,
            T::F64,
            T::F32,
            T::I64,
        ],
        |b, p| {
            let bf = b.op(O::BufferNew, vec![v(p[0])], T::Buffer);
            b.op0(O::StoreI64, vec![v(bf), i64_(0), i64_(-2)]);
            b.op0(O::StoreI8, vec![v(bf), i64_(8), i32_(0x1ff)]);
            b.op0(O::StoreI16, vec![v(bf), i64_(9), i32_(-2)]);
            b.op0(O::StoreF64, vec![v(bf), i64_(16), f64_(1.5)]);
            b.op0(O::StoreF32, vec![v(bf), i64_(24), f32_(2.5)]);
            b.op0(O::StoreI32, vec![v(bf), i64_(28), i32_(-7)]);
            let a = b.op(O::LoadI8, vec![v(bf), i64_(8)], T::I32);
            let c = b.op(O::LoadU8, vec![v(bf), i64_(8)], T::I32);
            let d = b.op(O::LoadI16, vec![v(bf), i64_(9)], T::I32);
            let e = b.op(O::LoadU16, vec![v(bf), i64_(9)], T::I32);
            let f = b.op(O::LoadU32, vec![v(bf), i64_(28)], T::I64);
            let g = b.op(O::LoadI64, vec![v(bf), i64_(0)], T::I64);
            let h = b.op(O::LoadF64, vec![v(bf), i64_(16)], T::F64);
            let i = b.op(O::LoadF32, vec![v(bf), i64_(24)], T::F32);
            let n = b.op(O::BufferLen, vec![v(bf)], T::I64);
            b.ret(vec![
                v(bf),
                v(a),
                v(c),
                v(d),
                v(e),
                v(f),
                v(g),
                v(h),
                v(i),
                v(n),
            ]);
        },
    );
    let r = run(&l, &[V::I64(32)]).unwrap();
    assert_eq!(
        &r[1..],
        &[
            V::I32(-1),
            V::I32(255),
            V::I32(-2),
            V::I32(0xfffe),
            V::I64(0xffff_fff9),
            V::I64(-2),
            V::F64(1.5),
            V::F32(2.5),
            V::I64(32)
        ]
    );
    let bytes = r[0].as_buffer().unwrap();
    assert_eq!(&bytes[0..8], &(-2i64).to_le_bytes());
    // Out of bounds: the offset is in the message.
    let t = run(&l, &[V::I64(30)]).unwrap_err();
    assert_eq!(t.kind, TrapKind::OutOfBounds);
    assert!(t.message.contains("offset 28"), "{t}");
    let l = single(&[T::Buffer, T::I64], &[T::I32], |b, p| {
        let x = b.op(O::LoadI32, vec![v(p[0]), v(p[1])], T::I32);
        b.ret(vec![v(x)]);
    });
    assert_eq!(
        run(&l, &[buf(&[1, 0, 0, 0, 9]), V::I64(1)]).unwrap(),
        vec![V::I32(0x0900_0000)]
    );
    for off in [-1i64, 2, i64::MAX, i64::MIN] {
        let t = run(&l, &[buf(&[1, 0, 0, 0, 9]), V::I64(off)]).unwrap_err();
        assert_eq!(t.kind, TrapKind::OutOfBounds, "{t}");
        assert!(t.message.contains(&format!("offset {off}")), "{t}");
    }
}

#[test]
fn folded_offset_keeps_overflow_semantics() {
    let l = single(&[T::Buffer, T::I64], &[T::I64], |b, p| {
        let o = b.op(O::Add, vec![v(p[1]), i64_(8)], T::I64);
        let x = b.op(O::LoadI64, vec![v(p[0]), v(o)], T::I64);
        b.ret(vec![v(x)]);
    });
    let mut bytes = vec![0u8; 16];
    bytes[8] = 7;
    assert_eq!(
        run(&l, &[V::buffer(bytes.clone()), V::I64(0)]).unwrap(),
        vec![V::I64(7)]
    );
    assert_eq!(
        run(&l, &[V::buffer(bytes.clone()), V::I64(i64::MAX)])
            .unwrap_err()
            .kind,
        TrapKind::IntegerOverflow
    );
    let t = run(&l, &[V::buffer(bytes), V::I64(1)]).unwrap_err();
    assert!(t.message.contains("offset 9"), "{t}");
}

#[test]
fn buffer_bulk_ops() {
    let l = single(&[T::Buffer], &[T::Buffer, T::Buffer, T::Buffer], |b, p| {
        let s = b.op(O::BufferSlice, vec![v(p[0]), i64_(1), i64_(2)], T::Buffer);
        let n = b.op(O::BufferNew, vec![i64_(6)], T::Buffer);
        b.op0(O::BufferFill, vec![v(n), i64_(0), i64_(6), i32_(0x1aa)]);
        b.op0(
            O::BufferCopy,
            vec![v(n), i64_(1), v(p[0]), i64_(0), i64_(3)],
        );
        b.op0(O::BufferCopy, vec![v(n), i64_(3), v(n), i64_(0), i64_(3)]);
        let c = b.op(O::BufferConcat, vec![v(s), v(p[0])], T::Buffer);
        b.ret(vec![v(s), v(n), v(c)]);
    });
    let r = run(&l, &[buf(&[1, 2, 3, 4])]).unwrap();
    assert_eq!(
        r,
        vec![
            buf(&[2, 3]),
            buf(&[0xaa, 1, 2, 0xaa, 1, 2]),
            buf(&[2, 3, 1, 2, 3, 4])
        ]
    );
    let l = single(&[T::Buffer, T::I64, T::I64], &[T::Buffer], |b, p| {
        let s = b.op(O::BufferSlice, vec![v(p[0]), v(p[1]), v(p[2])], T::Buffer);
        b.ret(vec![v(s)]);
    });
    for (o, n) in [(-1, 1), (3, 2), (0, -1), (i64::MAX, 2)] {
        let t = run(&l, &[buf(&[1, 2, 3, 4]), V::I64(o), V::I64(n)]).unwrap_err();
        assert_eq!(t.kind, TrapKind::OutOfBounds);
    }
    let l = single(&[T::I64], &[T::Buffer], |b, p| {
        let s = b.op(O::BufferNew, vec![v(p[0])], T::Buffer);
        b.ret(vec![v(s)]);
    });
    assert_eq!(
        run(&l, &[V::I64(-1)]).unwrap_err().kind,
        TrapKind::OutOfBounds
    );
}

#[test]
fn records() {
    let mut pb = ProgramBuilder::new();
    let r = pb.record(
        "Range",
        &[("offset", T::I64), ("length", T::I32), ("flag", T::I1)],
    );
    let (mut b, p) = FuncBuilder::new(
        "t.main",
        &[T::Buffer],
        &[T::I64, T::I32, T::I1, T::I64, T::I64, T::Buffer],
    );
    let off = b.op(
        O::LoadField,
        vec![v(p[0]), i64_(1), loom_ir::Operand::Field(r, 0)],
        T::I64,
    );
    let len = b.op(
        O::LoadField,
        vec![v(p[0]), i64_(1), loom_ir::Operand::Field(r, 1)],
        T::I32,
    );
    let fl = b.op(
        O::LoadField,
        vec![v(p[0]), i64_(0), loom_ir::Operand::Field(r, 2)],
        T::I1,
    );
    let sz = b.op(O::RecordSize, vec![loom_ir::Operand::Record(r)], T::I64);
    let fo = b.op(O::RecordOffset, vec![loom_ir::Operand::Field(r, 2)], T::I64);
    let nb = b.op(O::BufferNew, vec![i64_(16)], T::Buffer);
    b.op0(
        O::StoreField,
        vec![v(nb), i64_(0), loom_ir::Operand::Field(r, 1), i32_(9)],
    );
    b.op0(
        O::StoreField,
        vec![v(nb), i64_(0), loom_ir::Operand::Field(r, 2), b_(true)],
    );
    b.ret(vec![v(off), v(len), v(fl), v(sz), v(fo), v(nb)]);
    pb.add(b.finish(), Some("main"));
    let l = pb.load();
    let mut data = vec![0u8; 32];
    data[12] = 5; // record 0 flag
    data[16] = 40; // record 1 offset
    data[24] = 3; // record 1 length
    let out = run(&l, &[V::buffer(data)]).unwrap();
    let mut want = vec![0u8; 16];
    want[8] = 9;
    want[12] = 1;
    assert_eq!(
        out,
        vec![
            V::I64(40),
            V::I32(3),
            V::I1(true),
            V::I64(16),
            V::I64(12),
            V::buffer(want)
        ]
    );
    let t = run(&l, &[V::buffer(vec![0; 20])]).unwrap_err();
    assert_eq!(t.kind, TrapKind::OutOfBounds);
    assert!(t.message.contains("offset 16"), "{t}");
}

#[test]
fn strings() {
    let l = single(
        &[T::Str, T::Str, T::Buffer],
        &[
            T::I64,
            T::Str,
            T::I1,
            T::Str,
            T::Str,
            T::Buffer,
            T::Str,
            T::I64,
        ],
        |b, p| {
            let n = b.op(O::StrLen, vec![v(p[0])], T::I64);
            let c = b.op(O::StrConcat, vec![v(p[0]), v(p[1])], T::Str);
            let e = b.op(O::StrEq, vec![v(p[0]), s_("héllo")], T::I1);
            let i = b.op(O::StrFromI64, vec![i64_(-42)], T::Str);
            let f = b.op(O::StrFromF64, vec![f64_(1.5)], T::Str);
            let tb = b.op(O::StrToBuffer, vec![v(p[1])], T::Buffer);
            let fb = b.op(O::StrFromBuffer, vec![v(p[2]), i64_(1), i64_(2)], T::Str);
            let pi = b.op(O::StrParseI64, vec![v(p[1])], T::I64);
            b.ret(vec![v(n), v(c), v(e), v(i), v(f), v(tb), v(fb), v(pi)]);
        },
    );
    let r = run(&l, &[V::str("héllo"), V::str("17"), buf(b"xok")]).unwrap();
    assert_eq!(
        r,
        vec![
            V::I64(6),
            V::str("héllo17"),
            V::I1(true),
            V::str("-42"),
            V::str("1.5"),
            buf(b"17"),
            V::str("ok"),
            V::I64(17)
        ]
    );
    let t = run(&l, &[V::str("a"), V::str("1"), buf(&[0, 0xff, 0xfe])]).unwrap_err();
    assert_eq!(t.kind, TrapKind::InvalidUtf8);
    let t = run(&l, &[V::str("a"), V::str("1x"), buf(b"xok")]).unwrap_err();
    assert_eq!(t.kind, TrapKind::BadConversion);
    assert!(t.message.contains("1x"), "{t}");
}

#[test]
fn lists() {
    let l = single(
        &[T::I64],
        &[list(T::I64), T::I64, T::I64, list(T::Str)],
        |b, p| {
            let li = b.op_ann(O::ListNew, vec![i64_(2)], list(T::I64));
            b.for_(i64_(0), v(p[0]), i64_(1), vec![], |b, iv, _| {
                b.op0(O::ListPush, vec![v(li), v(iv)]);
                vec![]
            });
            b.op0(O::ListSet, vec![v(li), i64_(0), i64_(100)]);
            let n = b.op(O::ListLen, vec![v(li)], T::I64);
            let g = b.op(O::ListGet, vec![v(li), i64_(1)], T::I64);
            let ls = b.op_ann(O::ListNew, vec![i64_(1 << 40)], list(T::Str));
            b.op0(O::ListPush, vec![v(ls), s_("a")]);
            b.ret(vec![v(li), v(n), v(g), v(ls)]);
        },
    );
    let r = run(&l, &[V::I64(5)]).unwrap();
    assert_eq!(
        r,
        vec![
            V::list(
                (0..5)
                    .map(|i| V::I64(if i == 0 { 100 } else { i }))
                    .collect()
            ),
            V::I64(5),
            V::I64(1),
            V::list(vec![V::str("a")])
        ]
    );
    let t = run(&l, &[V::I64(1)]).unwrap_err();
    assert_eq!(t.kind, TrapKind::OutOfBounds);
    assert!(t.message.contains("index 1"), "{t}");
}

#[test]
fn opaque_tuples() {
    let op = T::Ref {
        name: "opaque".into(),
        nullable: false,
    };
    let l = single(
        &[T::I64],
        &[op.clone(), T::I64, T::Buffer, T::I64],
        |b, p| {
            let bf = b.op(O::BufferNew, vec![i64_(2)], T::Buffer);
            let o = b.op(O::OpaqueNew, vec![v(p[0]), v(bf), s_("s")], op.clone());
            let x = b.op_ann(O::OpaqueGet, vec![v(o), i64_(0)], T::I64);
            let y = b.op_ann(O::OpaqueGet, vec![v(o), i64_(1)], T::Buffer);
            let n = b.op(O::OpaqueLen, vec![v(o)], T::I64);
            b.ret(vec![v(o), v(x), v(y), v(n)]);
        },
    );
    let r = run(&l, &[V::I64(9)]).unwrap();
    assert_eq!(r[0], V::opaque(vec![V::I64(9), buf(&[0, 0]), V::str("s")]));
    assert_eq!(&r[1..], &[V::I64(9), buf(&[0, 0]), V::I64(3)]);
    // State from the host: get with the wrong type traps, out of range traps.
    let l = single(&[op.clone(), T::I64], &[T::Str], |b, p| {
        let x = b.op_ann(O::OpaqueGet, vec![v(p[0]), v(p[1])], T::Str);
        b.ret(vec![v(x)]);
    });
    let state = r[0].clone();
    assert_eq!(
        run(&l, &[state.clone(), V::I64(2)]).unwrap(),
        vec![V::str("s")]
    );
    let t = run(&l, &[state.clone(), V::I64(0)]).unwrap_err();
    assert_eq!(t.kind, TrapKind::TypeMismatch);
    assert!(
        t.message.contains("i64") && t.message.contains("str"),
        "{t}"
    );
    assert_eq!(
        run(&l, &[state, V::I64(3)]).unwrap_err().kind,
        TrapKind::OutOfBounds
    );
    // In-invocation tuple, wrong type.
    let l = single(&[], &[T::Str], |b, _| {
        let o = b.op(O::OpaqueNew, vec![i64_(1)], op.clone());
        let x = b.op_ann(O::OpaqueGet, vec![v(o), i64_(0)], T::Str);
        b.ret(vec![v(x)]);
    });
    assert_eq!(run(&l, &[]).unwrap_err().kind, TrapKind::TypeMismatch);
}

#[test]
fn refs_assert_trap() {
    let nt = T::Ref {
        name: "hal.fence".into(),
        nullable: true,
    };
    let t = T::Ref {
        name: "hal.fence".into(),
        nullable: false,
    };
    let l = single(std::slice::from_ref(&nt), &[T::I1, t.clone()], |b, p| {
        let n = b.op(O::RefIsNull, vec![v(p[0])], T::I1);
        let u = b.op(O::RefUnwrap, vec![v(p[0])], t.clone());
        b.ret(vec![v(n), v(u)]);
    });
    let fence = V::native("hal.fence", 5u32);
    assert_eq!(
        run(&l, std::slice::from_ref(&fence)).unwrap(),
        vec![V::I1(false), fence]
    );
    let tr = run(&l, &[V::Null(nt.clone())]).unwrap_err();
    assert_eq!(tr.kind, TrapKind::NullReference);
    let l = single(&[T::I64], &[T::I64], |b, p| {
        let c = b.op(O::CmpGt, vec![v(p[0]), i64_(0)], T::I1);
        b.op0(O::Assert, vec![v(c), s_("empty input")]);
        b.if_(
            b_(true),
            &[],
            |b| {
                let big = b.op(O::CmpGt, vec![v(p[0]), i64_(100)], T::I1);
                b.if_(
                    v(big),
                    &[],
                    |b| {
                        b.op0(O::Trap, vec![s_("too big")]);
                        vec![]
                    },
                    |_| vec![],
                );
                vec![]
            },
            |_| vec![],
        );
        b.ret(vec![v(p[0])]);
    });
    assert_eq!(run(&l, &[V::I64(5)]).unwrap(), vec![V::I64(5)]);
    let tr = run(&l, &[V::I64(0)]).unwrap_err();
    assert_eq!(
        (tr.kind, tr.message.as_str()),
        (TrapKind::SourceError, "empty input")
    );
    assert_eq!(tr.loc.line, 3);
    assert!(
        tr.to_string().starts_with("test.loom:3:5: in @t.main (pc "),
        "{tr}"
    );
    assert!(tr.to_string().ends_with("): empty input"), "{tr}");
    let tr = run(&l, &[V::I64(101)]).unwrap_err();
    assert_eq!(
        (tr.kind, tr.message.as_str()),
        (TrapKind::SourceError, "too big")
    );
}
