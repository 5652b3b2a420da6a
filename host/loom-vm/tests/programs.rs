//! Control flow, calls, recursion and reference semantics.
mod common;
use common::*;
use loom_ir::{Callee, Opcode as O, Type as T};
use loom_vm::{InvokeLimits, Value as V};

#[test]
fn if_with_results_and_fused_branches() {
    let l = single(&[T::I64, T::I32], &[T::I64, T::I32], |b, p| {
        let c = b.op(O::CmpLt, vec![v(p[0]), i64_(10)], T::I1);
        let r = b.if_(
            v(c),
            &[T::I64],
            |b| vec![v(b.op(O::Mul, vec![v(p[0]), i64_(2)], T::I64))],
            |_| vec![i64_(-1)],
        );
        let c2 = b.op(O::CmpUge, vec![v(p[1]), v(p[1])], T::I1);
        let c3 = b.op(O::CmpGt, vec![i32_(0), v(p[1])], T::I1); // immediate on the left
        let both = b.op(O::And, vec![v(c2), v(c3)], T::I1);
        let r2 = b.if_(v(both), &[T::I32], |_| vec![i32_(1)], |_| vec![i32_(2)]);
        b.ret(vec![v(r[0]), v(r2[0])]);
    });
    assert_eq!(
        run(&l, &[V::I64(3), V::I32(-1)]).unwrap(),
        vec![V::I64(6), V::I32(1)]
    );
    assert_eq!(
        run(&l, &[V::I64(10), V::I32(1)]).unwrap(),
        vec![V::I64(-1), V::I32(2)]
    );
}

#[test]
fn all_fused_compare_kinds() {
    use O::*;
    for (op, t) in [
        (CmpEq, T::I64),
        (CmpNe, T::I32),
        (CmpLt, T::I32),
        (CmpLe, T::I64),
        (CmpGt, T::I64),
        (CmpGe, T::I32),
        (CmpUlt, T::I64),
        (CmpUle, T::I32),
        (CmpUgt, T::I32),
        (CmpUge, T::I64),
    ] {
        for imm in [false, true] {
            let l = single(&[t.clone(), t.clone()], &[T::I64], |b, p| {
                let rhs = if imm {
                    if t == T::I64 { i64_(-3) } else { i32_(-3) }
                } else {
                    v(p[1])
                };
                let c = b.op(op, vec![v(p[0]), rhs], T::I1);
                let r = b.if_(v(c), &[T::I64], |_| vec![i64_(1)], |_| vec![i64_(0)]);
                b.ret(vec![v(r[0])]);
            });
            for (x, y) in [(-3i64, -3i64), (-4, -3), (5, -3), (-3, 7)] {
                let y = if imm { -3 } else { y };
                let want = match op {
                    CmpEq => x == y,
                    CmpNe => x != y,
                    CmpLt => x < y,
                    CmpLe => x <= y,
                    CmpGt => x > y,
                    CmpGe => x >= y,
                    CmpUlt | CmpUle | CmpUgt | CmpUge => {
                        let (a, b2) = if t == T::I64 {
                            (x as u64, y as u64)
                        } else {
                            (x as u32 as u64, y as u32 as u64)
                        };
                        match op {
                            CmpUlt => a < b2,
                            CmpUle => a <= b2,
                            CmpUgt => a > b2,
                            _ => a >= b2,
                        }
                    }
                    _ => unreachable!(),
                };
                let args = if t == T::I64 {
                    [V::I64(x), V::I64(y)]
                } else {
                    [V::I32(x as i32), V::I32(y as i32)]
                };
                assert_eq!(
                    run(&l, &args).unwrap(),
                    vec![V::I64(want as i64)],
                    "{op} {t} imm={imm} {x} {y}"
                );
            }
        }
    }
}

#[test]
fn for_loops_nested_with_carried_values() {
    // sum_{i<n} sum_{j<i} (i*j), plus a count carried by the outer loop, and a swap of two carried values.
    let l = single(&[T::I64], &[T::I64, T::I64, T::I64, T::I64], |b, p| {
        let r = b.for_(
            i64_(0),
            v(p[0]),
            i64_(1),
            vec![(i64_(0), T::I64), (i64_(0), T::I64)],
            |b, i, it| {
                let inner = b.for_(
                    i64_(0),
                    v(i),
                    i64_(1),
                    vec![(v(it[0]), T::I64)],
                    |b, j, jt| {
                        let m = b.op(O::Mul, vec![v(i), v(j)], T::I64);
                        vec![v(b.op(O::Add, vec![v(jt[0]), v(m)], T::I64))]
                    },
                );
                vec![
                    v(inner[0]),
                    v(b.op(O::Add, vec![v(it[1]), i64_(1)], T::I64)),
                ]
            },
        );
        let sw = b.for_(
            i64_(0),
            i64_(5),
            i64_(2),
            vec![(i64_(1), T::I64), (i64_(2), T::I64)],
            |_, _, it| vec![v(it[1]), v(it[0])],
        );
        b.ret(vec![v(r[0]), v(r[1]), v(sw[0]), v(sw[1])]);
    });
    let n = 20i64;
    let want: i64 = (0..n).map(|i| (0..i).map(|j| i * j).sum::<i64>()).sum();
    // 3 iterations (0, 2, 4) of a swap.
    assert_eq!(
        run(&l, &[V::I64(n)]).unwrap(),
        vec![V::I64(want), V::I64(n), V::I64(2), V::I64(1)]
    );
    assert_eq!(
        run(&l, &[V::I64(0)]).unwrap(),
        vec![V::I64(0), V::I64(0), V::I64(2), V::I64(1)]
    );
    assert_eq!(
        run(&l, &[V::I64(-5)]).unwrap(),
        vec![V::I64(0), V::I64(0), V::I64(2), V::I64(1)]
    );
}

#[test]
fn for_step_must_be_positive_and_near_max_terminates() {
    let l = single(&[T::I64, T::I64, T::I64], &[T::I64], |b, p| {
        let r = b.for_(
            v(p[0]),
            v(p[1]),
            v(p[2]),
            vec![(i64_(0), T::I64)],
            |b, _, it| vec![v(b.op(O::Add, vec![v(it[0]), i64_(1)], T::I64))],
        );
        b.ret(vec![v(r[0])]);
    });
    assert_eq!(
        run(&l, &[V::I64(0), V::I64(10), V::I64(3)]).unwrap(),
        vec![V::I64(4)]
    );
    assert_eq!(
        run(
            &l,
            &[V::I64(i64::MAX - 2), V::I64(i64::MAX), V::I64(1 << 40)]
        )
        .unwrap(),
        vec![V::I64(1)]
    );
    assert_eq!(
        run(&l, &[V::I64(0), V::I64(10), V::I64(0)])
            .unwrap_err()
            .kind,
        loom_vm::TrapKind::BadStep
    );
}

#[test]
fn while_loops_collatz_and_nested() {
    // steps of collatz(n), computed with a while containing an if; and a nested while counting pairs.
    let l = single(&[T::I64], &[T::I64, T::I64], |b, p| {
        let r = b.while_(
            vec![(v(p[0]), T::I64), (i64_(0), T::I64)],
            |b, it| v(b.op(O::CmpNe, vec![v(it[0]), i64_(1)], T::I1)),
            |b, it| {
                let odd = b.op(O::And, vec![v(it[0]), i64_(1)], T::I64);
                let c = b.op(O::CmpEq, vec![v(odd), i64_(0)], T::I1);
                let nx = b.if_(
                    v(c),
                    &[T::I64],
                    |b| vec![v(b.op(O::Shr, vec![v(it[0]), i64_(1)], T::I64))],
                    |b| {
                        let t = b.op(O::Mul, vec![v(it[0]), i64_(3)], T::I64);
                        vec![v(b.op(O::Add, vec![v(t), i64_(1)], T::I64))]
                    },
                );
                vec![v(nx[0]), v(b.op(O::Add, vec![v(it[1]), i64_(1)], T::I64))]
            },
        );
        let pairs = b.while_(
            vec![(i64_(0), T::I64), (i64_(0), T::I64)],
            |b, it| v(b.op(O::CmpLt, vec![v(it[0]), i64_(4)], T::I1)),
            |b, it| {
                let inner = b.while_(
                    vec![(i64_(0), T::I64), (v(it[1]), T::I64)],
                    |b, jt| v(b.op(O::CmpLt, vec![v(jt[0]), v(it[0])], T::I1)),
                    |b, jt| {
                        vec![
                            v(b.op(O::Add, vec![v(jt[0]), i64_(1)], T::I64)),
                            v(b.op(O::Add, vec![v(jt[1]), i64_(1)], T::I64)),
                        ]
                    },
                );
                vec![
                    v(b.op(O::Add, vec![v(it[0]), i64_(1)], T::I64)),
                    v(inner[1]),
                ]
            },
        );
        b.ret(vec![v(r[1]), v(pairs[1])]);
    });
    assert_eq!(
        run(&l, &[V::I64(27)]).unwrap(),
        vec![V::I64(111), V::I64(6)]
    );
    assert_eq!(run(&l, &[V::I64(1)]).unwrap(), vec![V::I64(0), V::I64(6)]);
}

#[test]
fn calls_with_multiple_results_and_fib_recursion() {
    let mut pb = ProgramBuilder::new();
    let fib = pb.reserve("t.fib");
    let (mut b, p) = FuncBuilder::new("t.fib", &[T::I64], &[T::I64]);
    let c = b.op(O::CmpLt, vec![v(p[0]), i64_(2)], T::I1);
    b.if_return(v(c), |_| vec![v(p[0])]);
    let a = b.op(O::Sub, vec![v(p[0]), i64_(1)], T::I64);
    let x = b.call(Callee::Func(fib), vec![v(a)], &[T::I64]);
    let a2 = b.op(O::Sub, vec![v(p[0]), i64_(2)], T::I64);
    let y = b.call(Callee::Func(fib), vec![v(a2)], &[T::I64]);
    let s = b.op(O::Add, vec![v(x[0]), v(y[0])], T::I64);
    b.ret(vec![v(s)]);
    pb.set(fib, b.finish(), Some("fib"));
    // divmod returns two results of both banks.
    let (mut b, p) = FuncBuilder::new(
        "t.divmod",
        &[T::Str, T::I64, T::I64],
        &[T::I64, T::Str, T::I64],
    );
    let q = b.op(O::Div, vec![v(p[1]), v(p[2])], T::I64);
    let r = b.op(O::Rem, vec![v(p[1]), v(p[2])], T::I64);
    b.ret(vec![v(q), v(p[0]), v(r)]);
    let dm = pb.add(b.finish(), None);
    let (mut b, p) = FuncBuilder::new("t.main", &[T::I64], &[T::I64, T::I64, T::Str]);
    let r = b.call(
        Callee::Func(dm),
        vec![s_("tag"), v(p[0]), i64_(7)],
        &[T::I64, T::Str, T::I64],
    );
    b.ret(vec![v(r[0]), v(r[2]), v(r[1])]);
    pb.add(b.finish(), Some("main"));
    let l = pb.load();
    assert_eq!(
        run(&l, &[V::I64(45)]).unwrap(),
        vec![V::I64(6), V::I64(3), V::str("tag")]
    );
    let r = l
        .invoke("fib", &[V::I64(20)], &InvokeLimits::default())
        .unwrap();
    assert_eq!(r, vec![V::I64(6765)]);
}

#[test]
fn buffers_are_references_across_calls() {
    let mut pb = ProgramBuilder::new();
    let (mut b, p) = FuncBuilder::new("t.fill", &[T::Buffer, T::I64], &[]);
    b.op0(O::StoreI64, vec![v(p[0]), i64_(0), v(p[1])]);
    b.ret(vec![]);
    let fill = pb.add(b.finish(), None);
    let (mut b, p) = FuncBuilder::new("t.main", &[T::Buffer], &[T::I64, T::I64, T::Buffer]);
    let nb = b.op(O::BufferNew, vec![i64_(8)], T::Buffer);
    b.call(Callee::Func(fill), vec![v(nb), i64_(42)], &[]);
    let x = b.op(O::LoadI64, vec![v(nb), i64_(0)], T::I64);
    // A host buffer: the callee's store is seen by the caller, but the host's bytes are untouched.
    b.call(Callee::Func(fill), vec![v(p[0]), i64_(7)], &[]);
    let y = b.op(O::LoadI64, vec![v(p[0]), i64_(0)], T::I64);
    b.ret(vec![v(x), v(y), v(p[0])]);
    pb.add(b.finish(), Some("main"));
    let l = pb.load();
    let host = V::buffer(vec![1; 8]);
    let r = run(&l, std::slice::from_ref(&host)).unwrap();
    assert_eq!(&r[..2], &[V::I64(42), V::I64(7)]);
    assert_eq!(r[2], V::buffer(7i64.to_le_bytes().to_vec()));
    assert_eq!(
        host,
        V::buffer(vec![1; 8]),
        "host-provided buffer was mutated"
    );
}

#[test]
fn copy_on_write_of_host_buffers_and_returned_state() {
    // Returns the (written) buffer; the returned buffer is a copy and the input is unchanged; running again on
    // the returned buffer (as retained state) does not change it either.
    let l = single(&[T::Buffer], &[T::Buffer], |b, p| {
        let x = b.op(O::LoadI32, vec![v(p[0]), i64_(0)], T::I32);
        let y = b.op(O::Add, vec![v(x), i32_(1)], T::I32);
        b.op0(O::StoreI32, vec![v(p[0]), i64_(0), v(y)]);
        b.ret(vec![v(p[0])]);
    });
    let input = V::buffer(vec![5, 0, 0, 0]);
    let out = run(&l, std::slice::from_ref(&input)).unwrap().remove(0);
    assert_eq!(input.as_buffer().unwrap(), &[5, 0, 0, 0]);
    assert_eq!(out.as_buffer().unwrap(), &[6, 0, 0, 0]);
    let out2 = run(&l, std::slice::from_ref(&out)).unwrap().remove(0);
    assert_eq!(out.as_buffer().unwrap(), &[6, 0, 0, 0]);
    assert_eq!(out2.as_buffer().unwrap(), &[7, 0, 0, 0]);
    // The copy is charged against the memory cap.
    let inv = l.invoke_metered(
        "main",
        &[V::buffer(vec![0; 4096])],
        &InvokeLimits {
            memory_bytes: 1000,
            ..Default::default()
        },
    );
    assert_eq!(inv.result.unwrap_err().kind, loom_vm::TrapKind::OutOfMemory);
}

#[test]
fn values_are_send_sync_and_loaded_is_shareable() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<V>();
    assert_send_sync::<loom_vm::Loaded>();
    let l = single(&[T::I64], &[T::I64], |b, p| {
        let m = b.op(O::Mul, vec![v(p[0]), i64_(2)], T::I64);
        b.ret(vec![v(m)]);
    });
    let hs: Vec<_> = (0..4)
        .map(|i| {
            let l = l.clone();
            std::thread::spawn(move || run(&l, &[V::I64(i)]).unwrap())
        })
        .collect();
    for (i, h) in hs.into_iter().enumerate() {
        assert_eq!(h.join().unwrap(), vec![V::I64(2 * i as i64)]);
    }
}

#[test]
fn entry_argument_checks() {
    let l = single(&[T::I64], &[T::I64], |b, p| b.ret(vec![v(p[0])]));
    let t = run(&l, &[]).unwrap_err();
    assert_eq!(t.kind, loom_vm::TrapKind::BadArguments);
    assert!(t.message.contains("takes 1 arguments, 0 given"), "{t}");
    let t = run(&l, &[V::I32(1)]).unwrap_err();
    assert!(t.message.contains("must be i64, got i32"), "{t}");
    let t = l.invoke("nope", &[], &InvokeLimits::default()).unwrap_err();
    assert!(t.message.contains("no export named `nope`"), "{t}");
}

#[test]
fn retained_bytes() {
    let v1 = V::opaque(vec![V::I64(1), V::buffer(vec![0; 100]), V::str("abc")]);
    assert_eq!(v1.retained_bytes(), 32 + (32) + (32 + 100) + (32 + 3));
}

#[test]
fn coalesced_loop_values_keep_semantics() {
    // iters (a, b): n = a + 1 is defined before a's last read (b' = a * 2 + b), so it must not overwrite a early;
    // c = if .. yields into an if result that is itself a loop register; a swap via fresh values.
    let l = single(&[T::I64], &[T::I64, T::I64, T::I64, T::I64], |b, p| {
        let r = b.for_(
            i64_(0),
            v(p[0]),
            i64_(1),
            vec![
                (i64_(1), T::I64),
                (i64_(0), T::I64),
                (i64_(5), T::I64),
                (i64_(7), T::I64),
            ],
            |b, i, it| {
                let n = b.op(O::Add, vec![v(it[0]), i64_(1)], T::I64);
                let m = b.op(O::Mul, vec![v(it[0]), i64_(2)], T::I64);
                let bb = b.op(O::Add, vec![v(m), v(it[1])], T::I64);
                let odd = b.op(O::And, vec![v(i), i64_(1)], T::I64);
                let c = b.op(O::CmpEq, vec![v(odd), i64_(1)], T::I1);
                let x = b.if_(
                    v(c),
                    &[T::I64],
                    |b| vec![v(b.op(O::Add, vec![v(it[2]), v(it[3])], T::I64))],
                    |b| vec![v(b.op(O::Sub, vec![v(it[2]), i64_(1)], T::I64))],
                );
                let y = b.op(O::Add, vec![v(it[2]), i64_(0)], T::I64); // reads the old it[2] after the if
                vec![v(n), v(bb), v(x[0]), v(y)]
            },
        );
        b.ret(vec![v(r[0]), v(r[1]), v(r[2]), v(r[3])]);
    });
    let (mut a, mut bv, mut c, mut d) = (1i64, 0i64, 5i64, 7i64);
    for i in 0..6 {
        let n = a + 1;
        let bb = a * 2 + bv;
        let x = if i & 1 == 1 { c + d } else { c - 1 };
        let y = c;
        (a, bv, c, d) = (n, bb, x, y);
    }
    assert_eq!(
        run(&l, &[V::I64(6)]).unwrap(),
        vec![V::I64(a), V::I64(bv), V::I64(c), V::I64(d)]
    );
}
