//! The JIT tier against the interpreter: the same program loaded with `jit: false` and `jit: true` must give
//! identical results, traps (kind, message, function, pc, loc), fuel used and memory used.

mod common;

use common::*;
use loom_ir::{Opcode as O, Type as T};
use loom_vm::{InvokeLimits, LoadLimits, Loaded, TrapKind, Value as V, Vm};

fn tiers(pb: &ProgramBuilder) -> (Loaded, Loaded) {
    let load = |jit| {
        Vm::load(
            &pb.prog,
            &[],
            &[],
            &LoadLimits {
                jit,
                ..Default::default()
            },
        )
        .expect("load")
    };
    (load(false), load(true))
}

fn prog(
    params: &[T],
    results: &[T],
    body: impl FnOnce(&mut FuncBuilder, &[loom_ir::ValueId]),
) -> ProgramBuilder {
    let (mut b, ps) = FuncBuilder::new("t.main", params, results);
    body(&mut b, &ps);
    let mut pb = ProgramBuilder::new();
    pb.add(b.finish(), Some("main"));
    pb
}

/// Runs both tiers and asserts they agree; returns the JIT tier's invocation.
fn same(i: &Loaded, j: &Loaded, args: &[V], lim: &InvokeLimits) -> loom_vm::Invocation {
    let a = i.invoke_metered("main", args, lim);
    let b = j.invoke_metered("main", args, lim);
    assert_eq!(a.result, b.result, "args {args:?}, fuel {}", lim.fuel);
    assert_eq!(a.fuel_used, b.fuel_used, "args {args:?}, fuel {}", lim.fuel);
    assert_eq!(a.memory_used, b.memory_used, "args {args:?}");
    b
}

/// `for i in lo..hi: x = load.u8(buf, i); store.i8(buf, i, x + 1); acc += x` (checked), returns (acc, buf).
fn bytes_loop() -> ProgramBuilder {
    prog(
        &[T::Buffer, T::I64, T::I64],
        &[T::I64, T::Buffer],
        |b, p| {
            let (buf, lo, hi) = (p[0], p[1], p[2]);
            let r = b.for_(
                v(lo),
                v(hi),
                i64_(1),
                vec![(i64_(0), T::I64)],
                |b, i, it| {
                    let x = b.op(O::LoadU8, vec![v(buf), v(i)], T::I32);
                    let x1 = b.op(O::Add, vec![v(x), i32_(1)], T::I32);
                    b.op0(O::StoreI8, vec![v(buf), v(i), v(x1)]);
                    let x64 = b.op(O::ConvI64, vec![v(x)], T::I64);
                    vec![v(b.op(O::Add, vec![v(it[0]), v(x64)], T::I64))]
                },
            );
            b.ret(vec![v(r[0]), v(buf)]);
        },
    )
}

#[test]
fn loops_are_jitted_and_agree() {
    let (i, j) = tiers(&bytes_loop());
    assert!(!i.is_jitted("t.main"));
    eprintln!(
        "jit default {} stats {:?}",
        LoadLimits::default().jit,
        j.jit_stats()
    );
    if LoadLimits::default().jit {
        assert!(j.is_jitted("t.main"));
        assert_eq!(j.jit_stats().0, 1);
    }
    let data: Vec<u8> = (0..64u8).map(|x| x.wrapping_mul(37)).collect();
    let r = same(
        &i,
        &j,
        &[V::buffer(data.clone()), V::I64(0), V::I64(64)],
        &InvokeLimits::default(),
    );
    let want: i64 = data.iter().map(|&x| x as i64).sum();
    let out: Vec<u8> = data.iter().map(|x| x.wrapping_add(1)).collect();
    assert_eq!(r.result.unwrap(), vec![V::I64(want), V::buffer(out)]);
    // The copy-on-write of the shared input is charged in both tiers.
    assert!(r.memory_used >= 64);
}

#[test]
fn fuel_is_exact_at_every_budget() {
    let (i, j) = tiers(&bytes_loop());
    let args = [V::buffer(vec![7u8; 20]), V::I64(0), V::I64(20)];
    let total = same(&i, &j, &args, &InvokeLimits::default()).fuel_used;
    let mut pcs = std::collections::BTreeSet::new();
    for fuel in 0..=total + 2 {
        let lim = InvokeLimits {
            fuel,
            ..Default::default()
        };
        let r = same(&i, &j, &args, &lim);
        match r.result {
            Err(t) => {
                assert_eq!(t.kind, TrapKind::OutOfFuel);
                assert_eq!(r.fuel_used, fuel);
                pcs.insert(t.pc);
            }
            Ok(_) => assert!(fuel >= total),
        }
    }
    assert!(pcs.len() >= 2, "{pcs:?}");
}

#[test]
fn out_of_bounds_at_both_bounds() {
    let (i, j) = tiers(&bytes_loop());
    for (lo, hi) in [
        (-1, 4),
        (0, 17),
        (16, 17),
        (i64::MIN, i64::MIN + 2),
        (15, 16),
    ] {
        let r = same(
            &i,
            &j,
            &[V::buffer(vec![1u8; 16]), V::I64(lo), V::I64(hi)],
            &InvokeLimits::default(),
        );
        if (lo, hi) != (15, 16) {
            let t = r.result.unwrap_err();
            assert_eq!(t.kind, TrapKind::OutOfBounds, "{t}");
            assert!(t.message.contains("buffer length 16"), "{t}");
        }
    }
    // Stores past the end of an owned buffer (no copy-on-write first).
    let pb = prog(&[T::I64, T::I64], &[T::I64], |b, p| {
        let buf = b.op(O::BufferNew, vec![i64_(32)], T::Buffer);
        b.for_(v(p[0]), v(p[1]), i64_(1), vec![], |b, i, _| {
            let o = b.op(O::Mul, vec![v(i), i64_(8)], T::I64);
            b.op0(O::StoreI64, vec![v(buf), v(o), v(i)]);
            vec![]
        });
        let x = b.op(O::LoadI64, vec![v(buf), i64_(24)], T::I64);
        b.ret(vec![v(x)]);
    });
    let (i, j) = tiers(&pb);
    assert_eq!(
        same(&i, &j, &[V::I64(0), V::I64(4)], &InvokeLimits::default())
            .result
            .unwrap(),
        vec![V::I64(3)]
    );
    for (lo, hi) in [(0, 5), (-1, 2), (3, 5)] {
        let t = same(&i, &j, &[V::I64(lo), V::I64(hi)], &InvokeLimits::default())
            .result
            .unwrap_err();
        assert_eq!(t.kind, TrapKind::OutOfBounds, "{t}");
    }
    // `buffer.new` over the memory cap or of negative length.
    for (n, cap) in [(-1i64, 1 << 20), (1 << 20, 1 << 10)] {
        let pb = prog(&[T::I64], &[T::I64], |b, p| {
            let r = b.for_(
                i64_(0),
                i64_(3),
                i64_(1),
                vec![(i64_(0), T::I64)],
                |b, _, it| {
                    let buf = b.op(O::BufferNew, vec![v(p[0])], T::Buffer);
                    let l = b.op(O::BufferLen, vec![v(buf)], T::I64);
                    vec![v(b.op(O::Add, vec![v(it[0]), v(l)], T::I64))]
                },
            );
            b.ret(vec![v(r[0])]);
        });
        let (i, j) = tiers(&pb);
        let lim = InvokeLimits {
            memory_bytes: cap,
            ..Default::default()
        };
        let t = same(&i, &j, &[V::I64(n)], &lim).result.unwrap_err();
        assert!(
            matches!(t.kind, TrapKind::OutOfBounds | TrapKind::OutOfMemory),
            "{t}"
        );
        same(&i, &j, &[V::I64(10)], &lim).result.unwrap();
    }
}

#[test]
fn arithmetic_traps_agree() {
    // acc = acc * 3 (checked) overflows; x / (i - k) divides by zero at i = k; i32 and i64.
    for t in [T::I64, T::I32] {
        let k = |x: i64| if t == T::I64 { i64_(x) } else { i32_(x as i32) };
        let pb = prog(&[T::I64, T::I64], std::slice::from_ref(&t), |b, p| {
            let r = b.for_(
                i64_(0),
                v(p[0]),
                i64_(1),
                vec![(k(1), t.clone())],
                |b, i, it| {
                    let i_t = if t == T::I64 {
                        i
                    } else {
                        b.op(O::ConvI32, vec![v(i)], T::I32)
                    };
                    let kk = if t == T::I64 {
                        p[1]
                    } else {
                        b.op(O::ConvI32, vec![v(p[1])], T::I32)
                    };
                    let m = b.op(O::Mul, vec![v(it[0]), k(3)], t.clone());
                    let dd = b.op(O::Sub, vec![v(i_t), v(kk)], t.clone());
                    let q = b.op(O::Div, vec![v(m), v(dd)], t.clone());
                    let s = b.op(O::Add, vec![v(m), v(q)], t.clone());
                    vec![v(s)]
                },
            );
            b.ret(vec![v(r[0])]);
        });
        let (i, j) = tiers(&pb);
        let lim = InvokeLimits::default();
        let t1 = same(&i, &j, &[V::I64(5), V::I64(3)], &lim)
            .result
            .unwrap_err();
        assert_eq!(t1.kind, TrapKind::DivisionByZero, "{t1}");
        let t2 = same(&i, &j, &[V::I64(100), V::I64(-1)], &lim)
            .result
            .unwrap_err();
        assert_eq!(t2.kind, TrapKind::IntegerOverflow, "{t2}");
        same(&i, &j, &[V::I64(8), V::I64(-1)], &lim).result.unwrap();
    }
}

#[test]
fn untranslated_instructions_leave_and_reenter() {
    // Strings inside the loop: the JIT code leaves to the interpreter at each string op and is re-entered after it.
    let pb = prog(&[T::I64], &[T::I64], |b, p| {
        let r = b.for_(
            i64_(0),
            v(p[0]),
            i64_(1),
            vec![(i64_(0), T::I64)],
            |b, i, it| {
                let s = b.op(O::StrFromI64, vec![v(i)], T::Str);
                let l = b.op(O::StrLen, vec![v(s)], T::I64);
                let m = b.op(O::Mul, vec![v(l), v(i)], T::I64);
                vec![v(b.op(O::Add, vec![v(it[0]), v(m)], T::I64))]
            },
        );
        b.ret(vec![v(r[0])]);
    });
    let (i, j) = tiers(&pb);
    assert!(j.is_jitted("t.main") || !LoadLimits::default().jit);
    let want: i64 = (0..12).map(|x: i64| x.to_string().len() as i64 * x).sum();
    let lim = InvokeLimits::default();
    let total = same(&i, &j, &[V::I64(12)], &lim);
    assert_eq!(total.result.unwrap(), vec![V::I64(want)]);
    for fuel in 0..=total.fuel_used {
        let lim = InvokeLimits {
            fuel,
            ..Default::default()
        };
        same(&i, &j, &[V::I64(12)], &lim);
    }
    for mem in [0, 40, 100, 200] {
        let lim = InvokeLimits {
            memory_bytes: mem,
            ..Default::default()
        };
        same(&i, &j, &[V::I64(12)], &lim);
    }
}

#[test]
fn calls_between_jitted_functions() {
    // main: for i in 0..n: acc += sum_to(i) (a callee with its own loop); the call depth limit traps alike.
    let mut pb = ProgramBuilder::new();
    let (mut cb, cp) = FuncBuilder::new("t.sum_to", &[T::I64], &[T::I64]);
    let r = cb.for_(
        i64_(0),
        v(cp[0]),
        i64_(1),
        vec![(i64_(0), T::I64)],
        |b, k, it| vec![v(b.op(O::Add, vec![v(it[0]), v(k)], T::I64))],
    );
    cb.ret(vec![v(r[0])]);
    let callee = pb.add(cb.finish(), None);
    let (mut b, ps) = FuncBuilder::new("t.main", &[T::I64], &[T::I64]);
    let r = b.for_(
        i64_(0),
        v(ps[0]),
        i64_(1),
        vec![(i64_(0), T::I64)],
        |b, i, it| {
            let x = b.call(loom_ir::Callee::Func(callee), vec![v(i)], &[T::I64]);
            vec![v(b.op(O::Add, vec![v(it[0]), v(x[0])], T::I64))]
        },
    );
    b.ret(vec![v(r[0])]);
    pb.add(b.finish(), Some("main"));
    let (i, j) = tiers(&pb);
    if LoadLimits::default().jit {
        assert!(j.is_jitted("t.main") && j.is_jitted("t.sum_to"));
    }
    let want: i64 = (0..30i64).map(|x| x * (x - 1) / 2).sum();
    let r = same(&i, &j, &[V::I64(30)], &InvokeLimits::default());
    assert_eq!(r.result.unwrap(), vec![V::I64(want)]);
    for fuel in 0..=r.fuel_used {
        let lim = InvokeLimits {
            fuel,
            ..Default::default()
        };
        same(&i, &j, &[V::I64(30)], &lim);
    }
    let lim = InvokeLimits {
        call_depth: 1,
        ..Default::default()
    };
    let t = same(&i, &j, &[V::I64(3)], &lim).result.unwrap_err();
    assert_eq!(t.kind, TrapKind::CallDepth, "{t}");
}

#[test]
fn oversized_functions_stay_interpreted() {
    let pb = prog(&[T::I64], &[T::I64], |b, p| {
        let r = b.for_(
            i64_(0),
            v(p[0]),
            i64_(1),
            vec![(i64_(0), T::I64)],
            |b, i, it| {
                let mut x = b.op(O::AddWrap, vec![v(it[0]), v(i)], T::I64);
                for k in 0..21_000 {
                    x = b.op(O::AddWrap, vec![v(x), v(i)], T::I64);
                    if k % 1000 == 0 {
                        x = b.op(O::Xor, vec![v(x), i64_(k)], T::I64);
                    }
                }
                vec![v(x)]
            },
        );
        b.ret(vec![v(r[0])]);
    });
    let load = |jit| {
        let lim = LoadLimits {
            jit,
            max_registers: 65_535,
            ..Default::default()
        };
        Vm::load(&pb.prog, &[], &[], &lim).expect("load")
    };
    let (i, j) = (load(false), load(true));
    assert!(j.code_size() > 20_000);
    assert!(!j.is_jitted("t.main"));
    assert_eq!(j.jit_stats().0, 0);
    same(&i, &j, &[V::I64(3)], &InvokeLimits::default())
        .result
        .unwrap();
}

#[test]
fn floats_and_conversions_agree() {
    let pb = prog(&[T::I64, T::F64], &[T::F64, T::I32, T::F32], |b, p| {
        let r = b.for_(
            i64_(0),
            v(p[0]),
            i64_(1),
            vec![(f64_(0.0), T::F64), (i32_(0), T::I32), (f32_(1.0), T::F32)],
            |b, i, it| {
                let fi = b.op(O::ConvF64, vec![v(i)], T::F64);
                let x = b.op(O::Mul, vec![v(fi), v(p[1])], T::F64);
                let y = b.op(O::Div, vec![v(x), f64_(3.0)], T::F64);
                let s = b.op(O::Add, vec![v(it[0]), v(y)], T::F64);
                let n = b.op(O::ConvI32, vec![v(y)], T::I32);
                let f32x = b.op(O::ConvF32, vec![v(y)], T::F32);
                let g = b.op(O::Mul, vec![v(it[2]), f32_(1.5)], T::F32);
                let g2 = b.op(O::Sub, vec![v(g), v(f32x)], T::F32);
                vec![v(s), v(b.op(O::Add, vec![v(it[1]), v(n)], T::I32)), v(g2)]
            },
        );
        b.ret(vec![v(r[0]), v(r[1]), v(r[2])]);
    });
    let (i, j) = tiers(&pb);
    let lim = InvokeLimits::default();
    for (n, x) in [(10, 1.5), (3, f64::NAN), (4, 1e300), (2, -0.0), (5, 3e9)] {
        same(&i, &j, &[V::I64(n), V::F64(x)], &lim);
    }
}

#[test]
fn copy_on_write_through_an_alias_is_seen_by_cached_reads() {
    // `alias` (a loop-carried copy of the handle) is stored to; reads through `buf` must see the stored bytes
    // after the first store copied the shared input.
    let pb = prog(&[T::Buffer, T::I64], &[T::I64, T::Buffer], |b, p| {
        let (buf, n) = (p[0], p[1]);
        let r = b.for_(
            i64_(0),
            v(n),
            i64_(1),
            vec![(i64_(0), T::I64), (v(buf), T::Buffer)],
            |b, i, it| {
                let before = b.op(O::LoadU8, vec![v(buf), v(i)], T::I32);
                let x1 = b.op(O::Add, vec![v(before), i32_(100)], T::I32);
                b.op0(O::StoreI8, vec![v(it[1]), v(i), v(x1)]);
                let after = b.op(O::LoadU8, vec![v(buf), v(i)], T::I32);
                let a64 = b.op(O::ConvI64, vec![v(after)], T::I64);
                vec![v(b.op(O::Add, vec![v(it[0]), v(a64)], T::I64)), v(it[1])]
            },
        );
        b.ret(vec![v(r[0]), v(r[1])]);
    });
    let (i, j) = tiers(&pb);
    let dis = j.disassemble();
    assert!(dis.contains("MovR"), "{dis}");
    assert!(j.is_jitted("t.main") || !LoadLimits::default().jit);
    let data = vec![1u8, 2, 3, 4, 5, 6, 7, 8];
    let r = same(
        &i,
        &j,
        &[V::buffer(data.clone()), V::I64(8)],
        &InvokeLimits::default(),
    );
    let want: i64 = data.iter().map(|&x| x as i64 + 100).sum();
    let out: Vec<u8> = data.iter().map(|&x| x + 100).collect();
    assert_eq!(r.result.unwrap(), vec![V::I64(want), V::buffer(out)]);
    // Copy-on-write over the memory cap traps the same way in both tiers.
    let lim = InvokeLimits {
        memory_bytes: 4,
        ..Default::default()
    };
    let t = same(&i, &j, &[V::buffer(data), V::I64(8)], &lim)
        .result
        .unwrap_err();
    assert_eq!(t.kind, TrapKind::OutOfMemory, "{t}");
}

#[test]
fn jit_can_be_turned_off() {
    let (i, _) = tiers(&bytes_loop());
    assert_eq!(i.jit_stats().0, 0);
}

/// Random loop bodies over i32/i64 arithmetic, bitwise ops, shifts, compares and selects, at edge-case inputs:
/// both tiers must agree on every result, trap, fuel and memory figure.
#[test]
fn random_integer_loops_agree() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move |n: usize| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 33) as usize) % n
    };
    let edge = [
        0i64,
        1,
        -1,
        2,
        7,
        31,
        32,
        63,
        64,
        i32::MIN as i64,
        i32::MAX as i64,
        i64::MIN,
        i64::MAX,
    ];
    let bin = [
        O::Add,
        O::Sub,
        O::Mul,
        O::Div,
        O::Rem,
        O::Min,
        O::Max,
        O::AddWrap,
        O::SubWrap,
        O::MulWrap,
        O::DivU,
        O::RemU,
        O::And,
        O::Or,
        O::Xor,
        O::Shl,
        O::Shr,
        O::ShrU,
    ];
    let cmps = [
        O::CmpEq,
        O::CmpNe,
        O::CmpLt,
        O::CmpLe,
        O::CmpGt,
        O::CmpGe,
        O::CmpUlt,
        O::CmpUge,
    ];
    let un = [O::Neg, O::Abs, O::Not];
    for case in 0..120 {
        let t = if case % 2 == 0 { T::I64 } else { T::I32 };
        let imm = |k: i64| {
            if t == T::I64 { i64_(k) } else { i32_(k as i32) }
        };
        let nops = 2 + rnd(6);
        let choices: Vec<(usize, usize, usize, usize, usize)> = (0..nops)
            .map(|_| (rnd(4), rnd(bin.len()), rnd(64), rnd(64), rnd(edge.len())))
            .collect();
        let (r0, r1) = (rnd(64), rnd(64));
        let pb = prog(
            &[T::I64, t.clone(), t.clone()],
            &[t.clone(), t.clone()],
            |b, p| {
                let r = b.for_(
                    i64_(0),
                    v(p[0]),
                    i64_(1),
                    vec![(v(p[1]), t.clone()), (v(p[2]), t.clone())],
                    |b, i, it| {
                        let it_t = if t == T::I64 {
                            i
                        } else {
                            b.op(O::ConvI32, vec![v(i)], T::I32)
                        };
                        let mut pool = vec![it[0], it[1], it_t];
                        for &(kind, op, x, y, k) in &choices {
                            let a = v(pool[x % pool.len()]);
                            let c = if y % 3 == 0 {
                                imm(edge[k])
                            } else {
                                v(pool[y % pool.len()])
                            };
                            let res = match kind {
                                0 | 1 => b.op(bin[op], vec![a, c], t.clone()),
                                2 => {
                                    let cc = b.op(
                                        cmps[op % cmps.len()],
                                        vec![a.clone(), c.clone()],
                                        T::I1,
                                    );
                                    b.op(O::Select, vec![v(cc), a, c], t.clone())
                                }
                                _ => b.op(un[op % un.len()], vec![a], t.clone()),
                            };
                            pool.push(res);
                        }
                        vec![v(pool[r0 % pool.len()]), v(pool[r1 % pool.len()])]
                    },
                );
                b.ret(vec![v(r[0]), v(r[1])]);
            },
        );
        let (i, j) = tiers(&pb);
        for _ in 0..6 {
            let (a, bb) = (edge[rnd(edge.len())], edge[rnd(edge.len())]);
            let val = |x: i64| {
                if t == T::I64 {
                    V::I64(x)
                } else {
                    V::I32(x as i32)
                }
            };
            let n = rnd(4) as i64;
            let args = [V::I64(n), val(a), val(bb)];
            let full = same(&i, &j, &args, &InvokeLimits::default());
            let fuel = rnd(full.fuel_used as usize + 1) as u64;
            same(
                &i,
                &j,
                &args,
                &InvokeLimits {
                    fuel,
                    ..Default::default()
                },
            );
        }
    }
}

#[test]
fn division_edge_cases_agree() {
    // MIN / -1 and MIN % -1 (overflow traps), x / 0 (division by zero), unsigned forms, both widths.
    for t in [T::I64, T::I32] {
        for op in [O::Div, O::Rem, O::DivU, O::RemU] {
            let pb = prog(
                &[T::I64, t.clone(), t.clone()],
                std::slice::from_ref(&t),
                |b, p| {
                    let r = b.for_(
                        i64_(0),
                        v(p[0]),
                        i64_(1),
                        vec![(v(p[1]), t.clone())],
                        |b, _, it| vec![v(b.op(op, vec![v(it[0]), v(p[2])], t.clone()))],
                    );
                    b.ret(vec![v(r[0])]);
                },
            );
            let (i, j) = tiers(&pb);
            let val = |x: i64| {
                if t == T::I64 {
                    V::I64(x)
                } else {
                    V::I32(x as i32)
                }
            };
            let min = if t == T::I64 {
                i64::MIN
            } else {
                i32::MIN as i64
            };
            for (a, d) in [(min, -1), (min, 0), (7, 0), (-7, 2), (min, 1), (-1, -1)] {
                same(
                    &i,
                    &j,
                    &[V::I64(2), val(a), val(d)],
                    &InvokeLimits::default(),
                );
            }
        }
    }
}

/// Random float loop bodies (add/sub/mul/div, neg/abs/sqrt, compares and selects, conversions between f32, f64,
/// i32 and i64) at NaN, infinities, signed zeros, subnormals and out-of-range values: bit-identical in both tiers.
#[test]
fn random_float_loops_agree() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move |n: usize| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 33) as usize) % n
    };
    let edge = [
        0.0f64,
        -0.0,
        1.0,
        -1.5,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e300,
        3e9,
        2147483648.0,
        -2147483649.0,
        1e-310,
        f32::MAX as f64 * 2.0,
        9.3e18,
    ];
    let bin = [O::Add, O::Sub, O::Mul, O::Div];
    let cmps = [O::CmpEq, O::CmpNe, O::CmpLt, O::CmpLe, O::CmpGt, O::CmpGe];
    let un = [O::Neg, O::Abs, O::Sqrt];
    for _case in 0..80 {
        let nops = 2 + rnd(7);
        let choices: Vec<[usize; 5]> = (0..nops)
            .map(|_| [rnd(5), rnd(12), rnd(64), rnd(64), rnd(edge.len())])
            .collect();
        let pb = prog(&[T::I64, T::F64, T::F32], &[T::F64, T::F32], |b, p| {
            let r = b.for_(
                i64_(0),
                v(p[0]),
                i64_(1),
                vec![(v(p[1]), T::F64), (v(p[2]), T::F32)],
                |b, _, it| {
                    let (mut p64, mut p32) = (vec![it[0]], vec![it[1]]);
                    for &[kind, op, x, y, k] in &choices {
                        let wide = y % 2 == 0;
                        let (t, pool) = if wide { (T::F64, &p64) } else { (T::F32, &p32) };
                        let a = v(pool[x % pool.len()]);
                        let c = if y % 3 == 0 {
                            if wide {
                                f64_(edge[k])
                            } else {
                                f32_(edge[k] as f32)
                            }
                        } else {
                            v(pool[y % pool.len()])
                        };
                        let res = match kind {
                            0 | 1 => b.op(bin[op % bin.len()], vec![a, c], t.clone()),
                            2 => {
                                let cc =
                                    b.op(cmps[op % cmps.len()], vec![a.clone(), c.clone()], T::I1);
                                b.op(O::Select, vec![v(cc), a, c], t.clone())
                            }
                            3 => b.op(un[op % un.len()], vec![a], t.clone()),
                            _ => {
                                // through an integer (may trap) or the other float width
                                let (ct, back) = match op % 3 {
                                    0 => (T::I32, true),
                                    1 => (T::I64, true),
                                    _ => (if wide { T::F32 } else { T::F64 }, false),
                                };
                                let cop = match ct {
                                    T::I32 => O::ConvI32,
                                    T::I64 => O::ConvI64,
                                    T::F32 => O::ConvF32,
                                    _ => O::ConvF64,
                                };
                                let m = b.op(cop, vec![a], ct.clone());
                                if back {
                                    let bop = if wide { O::ConvF64 } else { O::ConvF32 };
                                    b.op(bop, vec![v(m)], t.clone())
                                } else {
                                    // now in the other width: put it in that pool
                                    if wide {
                                        p32.push(m);
                                    } else {
                                        p64.push(m);
                                    }
                                    continue;
                                }
                            }
                        };
                        if wide {
                            p64.push(res);
                        } else {
                            p32.push(res);
                        }
                    }
                    vec![v(*p64.last().unwrap()), v(*p32.last().unwrap())]
                },
            );
            b.ret(vec![v(r[0]), v(r[1])]);
        });
        let (i, j) = tiers(&pb);
        for _ in 0..6 {
            let (a, bb) = (edge[rnd(edge.len())], edge[rnd(edge.len())]);
            let args = [V::I64(rnd(4) as i64), V::F64(a), V::F32(bb as f32)];
            same(&i, &j, &args, &InvokeLimits::default());
        }
    }
}

/// Random loads and stores of every width on an input (shared, copy-on-write) buffer and a fresh one, at offsets
/// that may be negative or past the end, under small memory caps: identical in both tiers.
#[test]
fn random_buffer_loops_agree() {
    let mut seed = 0x1234_5678_9abc_def1u64;
    let mut rnd = move |n: usize| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 33) as usize) % n
    };
    let loads = [
        (O::LoadI8, T::I32),
        (O::LoadU8, T::I32),
        (O::LoadI16, T::I32),
        (O::LoadU16, T::I32),
        (O::LoadI32, T::I32),
        (O::LoadU32, T::I64),
        (O::LoadI64, T::I64),
        (O::LoadF32, T::F32),
        (O::LoadF64, T::F64),
    ];
    let stores = [
        (O::StoreI8, T::I32),
        (O::StoreI16, T::I32),
        (O::StoreI32, T::I32),
        (O::StoreI64, T::I64),
        (O::StoreF32, T::F32),
        (O::StoreF64, T::F64),
    ];
    for _case in 0..60 {
        let nops = 1 + rnd(6);
        let choices: Vec<[usize; 4]> = (0..nops)
            .map(|_| [rnd(2), rnd(9), rnd(4), rnd(40)])
            .collect();
        let pb = prog(
            &[T::Buffer, T::I64],
            &[T::Buffer, T::Buffer, T::I64],
            |b, p| {
                let fresh = b.op(O::BufferNew, vec![i64_(24)], T::Buffer);
                let r = b.for_(
                    i64_(0),
                    v(p[1]),
                    i64_(1),
                    vec![(i64_(0), T::I64)],
                    |b, i, it| {
                        let mut acc = it[0];
                        let mut last: std::collections::HashMap<String, loom_ir::ValueId> =
                            Default::default();
                        for &[which, op, scale, k] in &choices {
                            let buf = if which == 0 { p[0] } else { fresh };
                            let o1 = b.op(O::Mul, vec![v(i), i64_(scale as i64)], T::I64);
                            let off = b.op(O::Add, vec![v(o1), i64_(k as i64 - 8)], T::I64);
                            if op % 2 == 0 {
                                let (lop, lt) = &loads[op % loads.len()];
                                let x = b.op(*lop, vec![v(buf), v(off)], lt.clone());
                                last.insert(format!("{lt:?}"), x);
                                let x64 = match lt {
                                    T::I32 => b.op(O::ConvI64, vec![v(x)], T::I64),
                                    T::I64 => x,
                                    T::F32 => {
                                        let y = b.op(O::BitcastI32, vec![v(x)], T::I32);
                                        b.op(O::ConvI64, vec![v(y)], T::I64)
                                    }
                                    _ => b.op(O::BitcastI64, vec![v(x)], T::I64),
                                };
                                acc = b.op(O::AddWrap, vec![v(acc), v(x64)], T::I64);
                            } else {
                                let (sop, st) = &stores[op % stores.len()];
                                let val = match last.get(&format!("{st:?}")) {
                                    Some(&x) => v(x),
                                    None => match st {
                                        T::I32 => i32_(-0x1234_5678),
                                        T::I64 => v(i),
                                        T::F32 => f32_(-1.25),
                                        _ => f64_(3.5e-300),
                                    },
                                };
                                b.op0(*sop, vec![v(buf), v(off), val]);
                            }
                        }
                        vec![v(acc)]
                    },
                );
                b.ret(vec![v(p[0]), v(fresh), v(r[0])]);
            },
        );
        let (i, j) = tiers(&pb);
        for _ in 0..4 {
            let input: Vec<u8> = (0..(8 + rnd(24))).map(|_| rnd(256) as u8).collect();
            let n = rnd(6) as i64;
            let mem = [1 << 20, 80, 100, 40][rnd(4)];
            let lim = InvokeLimits {
                memory_bytes: mem,
                ..Default::default()
            };
            same(&i, &j, &[V::buffer(input), V::I64(n)], &lim);
        }
    }
}

/// Bulk fuel (`buffer.new` charged by its bytes) agrees between the tiers at every budget around the points
/// where a loop of allocations runs out: the JIT checks and charges the same units, or leaves the instruction
/// to the interpreter, which then traps exactly where it would have alone.
#[test]
fn bulk_fuel_agrees_at_every_budget() {
    let pb = prog(&[T::I64], &[T::I64], |b, p| {
        let r = b.for_(
            i64_(0),
            i64_(20),
            i64_(1),
            vec![(i64_(0), T::I64)],
            |b, _, it| {
                let buf = b.op(O::BufferNew, vec![v(p[0])], T::Buffer);
                let l = b.op(O::BufferLen, vec![v(buf)], T::I64);
                vec![v(b.op(O::Add, vec![v(it[0]), v(l)], T::I64))]
            },
        );
        b.ret(vec![v(r[0])]);
    });
    let (i, j) = tiers(&pb);
    let unlimited = InvokeLimits {
        memory_bytes: 1 << 26,
        ..Default::default()
    };
    let full = same(&i, &j, &[V::I64(4096)], &unlimited);
    assert_eq!(full.result.unwrap(), vec![V::I64(20 * 4096)]);
    // 20 allocations of 4096 bytes: 64 units each beyond the instructions' own.
    let plain = same(&i, &j, &[V::I64(0)], &unlimited).fuel_used;
    assert_eq!(full.fuel_used - plain, 20 * 64);
    for fuel in (full.fuel_used.saturating_sub(200)..=full.fuel_used).chain([1, 50, 64, 65, 100]) {
        let lim = InvokeLimits {
            fuel,
            ..unlimited.clone()
        };
        same(&i, &j, &[V::I64(4096)], &lim);
    }
}
