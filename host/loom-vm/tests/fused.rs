//! Superinstructions: fused loop latches, test-and-branch, indexed loads/stores, and the retained-state cap.
mod common;
use common::*;
use loom_ir::{Opcode as O, Type as T};
use loom_vm::{InvokeLimits, TrapKind, Value as V};

/// `for i in 0..n (acc = 0) { acc = if (i & 1) == 0 { acc +w i } else { acc ^ i } }; return acc`.
/// Fuel by the protocol: entry block 1 (`for`), per iteration 3 (`and`, `cmp`, `if`) + 3 (branch op, `yield`,
/// join `yield`), then 1 (`return`): 6n + 2.
fn latch_loop() -> loom_vm::Loaded {
    single(&[T::I64], &[T::I64], |b, p| {
        let r = b.for_(
            i64_(0),
            v(p[0]),
            i64_(1),
            vec![(i64_(0), T::I64)],
            |b, i, it| {
                let lo = b.op(O::And, vec![v(i), i64_(1)], T::I64);
                let z = b.op(O::CmpEq, vec![v(lo), i64_(0)], T::I1);
                let a = b.if_(
                    v(z),
                    &[T::I64],
                    |b| vec![v(b.op(O::AddWrap, vec![v(it[0]), v(i)], T::I64))],
                    |b| vec![v(b.op(O::Xor, vec![v(it[0]), v(i)], T::I64))],
                );
                vec![v(a[0])]
            },
        );
        b.ret(vec![v(r[0])]);
    })
}

#[test]
fn fused_latch_fuel_is_exact_at_every_budget() {
    let l = latch_loop();
    let dis = l.disassemble();
    assert!(dis.contains("JTestNz"), "{dis}");
    assert!(
        dis.matches("ForLoop").count() >= 2,
        "latch duplicated: {dis}"
    );
    let n = 7i64;
    let total = 6 * n as u64 + 2;
    let mut acc = 0i64;
    for i in 0..n {
        acc = if i & 1 == 0 {
            acc.wrapping_add(i)
        } else {
            acc ^ i
        };
    }
    let ok = l.invoke_metered("main", &[V::I64(n)], &InvokeLimits::default());
    assert_eq!(ok.result.unwrap(), vec![V::I64(acc)]);
    assert_eq!(ok.fuel_used, total);
    let mut pcs = std::collections::BTreeSet::new();
    for fuel in 0..=total + 3 {
        let lim = InvokeLimits {
            fuel,
            ..Default::default()
        };
        let a = l.invoke_metered("main", &[V::I64(n)], &lim);
        let b = l.invoke_metered("main", &[V::I64(n)], &lim);
        if fuel < total {
            let (ta, tb) = (a.result.unwrap_err(), b.result.unwrap_err());
            assert_eq!(ta.kind, TrapKind::OutOfFuel, "fuel {fuel}");
            assert_eq!(ta, tb, "fuel {fuel}: same trap point");
            assert_eq!((a.fuel_used, b.fuel_used), (fuel, fuel));
            pcs.insert(ta.pc);
        } else {
            assert_eq!(a.result.unwrap(), vec![V::I64(acc)], "fuel {fuel}");
            assert_eq!(a.fuel_used, total);
        }
    }
    // Both branch paths and the latch trap somewhere along the way.
    assert!(pcs.len() >= 3, "{pcs:?}");
}

/// `store.i32(out, base + i*4, v)` and `load.i32(src, (x + y) * 4)`, both folded into indexed forms.
fn indexed() -> loom_vm::Loaded {
    single(
        &[T::Buffer, T::I64, T::I64, T::I64, T::I64, T::I64],
        &[T::Buffer, T::I32],
        |b, p| {
            let (buf, base, i, x, y, val) = (p[0], p[1], p[2], p[3], p[4], p[5]);
            let v32 = b.op(O::ConvI32, vec![v(val)], T::I32);
            let i4 = b.op(O::Mul, vec![v(i), i64_(4)], T::I64);
            let o = b.op(O::Add, vec![v(base), v(i4)], T::I64);
            b.op0(O::StoreI32, vec![v(buf), v(o), v(v32)]);
            let s = b.op(O::Add, vec![v(x), v(y)], T::I64);
            let s4 = b.op(O::Mul, vec![v(s), i64_(4)], T::I64);
            let r = b.op(O::LoadI32, vec![v(buf), v(s4)], T::I32);
            b.ret(vec![v(buf), v(r)]);
        },
    )
}

#[test]
fn indexed_loads_and_stores_at_both_bounds() {
    let l = indexed();
    let dis = l.disassemble();
    assert!(dis.contains("St32X {") && dis.contains("Ld32XS"), "{dis}");
    let run = |base: i64, i: i64, x: i64, y: i64| {
        l.invoke(
            "main",
            &[
                V::buffer(vec![0u8; 16]),
                V::I64(base),
                V::I64(i),
                V::I64(x),
                V::I64(y),
                V::I64(0x1234_5678),
            ],
            &InvokeLimits::default(),
        )
    };
    // Last valid word (offset 12) through either split of base/index.
    let r = run(4, 2, 1, 2).unwrap();
    let mut want = vec![0u8; 16];
    want[12..16].copy_from_slice(&0x1234_5678u32.to_le_bytes());
    assert_eq!(r, vec![V::buffer(want), V::I32(0x1234_5678)]);
    assert_eq!(run(0, 0, 0, 0).unwrap()[1], V::I32(0x1234_5678));
    assert_eq!(run(0, 0, 1, 2).unwrap()[1], V::I32(0));
    assert_eq!(run(12, 0, 0, 3).unwrap()[1], V::I32(0x1234_5678));
    // One past the end, and negative offsets.
    let t = run(8, 2, 0, 0).unwrap_err();
    assert_eq!(t.kind, TrapKind::OutOfBounds, "{t}");
    assert!(t.message.contains("offset 16"), "{t}");
    assert_eq!(run(0, -1, 0, 0).unwrap_err().kind, TrapKind::OutOfBounds);
    assert_eq!(run(0, 0, 2, 2).unwrap_err().kind, TrapKind::OutOfBounds);
    assert_eq!(run(0, 0, 0, -1).unwrap_err().kind, TrapKind::OutOfBounds);
    // Overflow of the folded arithmetic traps like the unfused ops.
    let t = run(0, i64::MAX / 2, 0, 0).unwrap_err();
    assert_eq!(
        (t.kind, t.message.as_str()),
        (TrapKind::IntegerOverflow, "integer overflow in i64 mul")
    );
    let t = run(i64::MAX, 1, 0, 0).unwrap_err();
    assert_eq!(
        (t.kind, t.message.as_str()),
        (TrapKind::IntegerOverflow, "integer overflow in i64 add")
    );
    let t = run(0, 0, i64::MAX, 1).unwrap_err();
    assert_eq!(
        (t.kind, t.message.as_str()),
        (TrapKind::IntegerOverflow, "integer overflow in i64 add")
    );
    let t = run(0, 0, i64::MAX / 2, 0).unwrap_err();
    assert_eq!(
        (t.kind, t.message.as_str()),
        (TrapKind::IntegerOverflow, "integer overflow in i64 mul")
    );
}

#[test]
fn retained_bytes_cap_on_returned_values() {
    let l = single(&[T::I64], &[T::Buffer], |b, p| {
        let buf = b.op(O::BufferNew, vec![v(p[0])], T::Buffer);
        b.ret(vec![v(buf)]);
    });
    let need = V::buffer(vec![0u8; 100]).retained_bytes();
    let lim = |cap: Option<u64>| InvokeLimits {
        retained_bytes: cap,
        ..Default::default()
    };
    assert!(l.invoke("main", &[V::I64(100)], &lim(None)).is_ok());
    assert!(l.invoke("main", &[V::I64(100)], &lim(Some(need))).is_ok());
    let t = l
        .invoke("main", &[V::I64(100)], &lim(Some(need - 1)))
        .unwrap_err();
    assert_eq!(t.kind, TrapKind::RetainedTooLarge);
    assert!(
        t.message.contains(&need.to_string()) && t.message.contains(&(need - 1).to_string()),
        "{t}"
    );
}

/// `for i in lo..hi step S { acc += i }` with S an immediate (`ForLoopK`) or a parameter (`ForLoop`).
fn stepped(imm: Option<i64>) -> loom_vm::Loaded {
    single(&[T::I64, T::I64, T::I64], &[T::I64], |b, p| {
        let step = match imm {
            Some(k) => i64_(k),
            None => v(p[2]),
        };
        let r = b.for_(
            v(p[0]),
            v(p[1]),
            step,
            vec![(i64_(0), T::I64)],
            |b, i, it| vec![v(b.op(O::AddWrap, vec![v(it[0]), v(i)], T::I64))],
        );
        b.ret(vec![v(r[0])]);
    })
}

#[test]
fn immediate_step_latch_matches_the_register_form() {
    let k = stepped(Some(3));
    let r = stepped(None);
    assert!(k.disassemble().contains("ForLoopK"), "{}", k.disassemble());
    assert!(!r.disassemble().contains("ForLoopK"), "{}", r.disassemble());
    // Ordinary ranges, empty ranges, and ranges ending at i64::MAX (where `i + step` overflows: the loop ends).
    let cases = [
        (0, 10),
        (5, 5),
        (7, 3),
        (i64::MAX - 7, i64::MAX),
        (i64::MIN, i64::MIN + 8),
    ];
    for (lo, hi) in cases {
        let args = [V::I64(lo), V::I64(hi), V::I64(3)];
        let a = k.invoke_metered("main", &args, &InvokeLimits::default());
        let b = r.invoke_metered("main", &args, &InvokeLimits::default());
        let mut want = 0i64;
        let mut i = lo;
        while i < hi {
            want = want.wrapping_add(i);
            match i.checked_add(3) {
                Some(n) => i = n,
                None => break,
            }
        }
        assert_eq!(
            a.result.as_ref().unwrap(),
            &vec![V::I64(want)],
            "{lo}..{hi}"
        );
        assert_eq!(b.result.unwrap(), vec![V::I64(want)]);
        assert_eq!(a.fuel_used, b.fuel_used, "{lo}..{hi}");
        // Fuel determinism at every budget, and the same trap point as the register form.
        for fuel in 0..a.fuel_used {
            let lim = InvokeLimits {
                fuel,
                ..Default::default()
            };
            let (x, y) = (
                k.invoke_metered("main", &args, &lim),
                k.invoke_metered("main", &args, &lim),
            );
            let z = r.invoke_metered("main", &args, &lim);
            let (tx, ty, tz) = (
                x.result.unwrap_err(),
                y.result.unwrap_err(),
                z.result.unwrap_err(),
            );
            assert_eq!(tx.kind, TrapKind::OutOfFuel);
            assert_eq!(tx, ty);
            assert_eq!((tx.kind, tx.loc), (tz.kind, tz.loc), "fuel {fuel}");
            assert_eq!((x.fuel_used, z.fuel_used), (fuel, fuel));
        }
    }
}
