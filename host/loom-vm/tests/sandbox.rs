//! Fuel, memory, call depth, capability imports and native modules.
mod common;
use common::*;
use loom_ir::{Callee, Opcode as O, Signature, Type as T};
use loom_vm::{
    HostState, InvokeLimits, LoadError, NativeError, NativeModule, TrapKind, Value as V, testing,
};
use std::sync::Arc;

fn infinite() -> loom_vm::Loaded {
    single(&[], &[T::I64], |b, _| {
        let r = b.while_(
            vec![(i64_(0), T::I64)],
            |_, _| b_(true),
            |b, it| vec![v(b.op(O::AddWrap, vec![v(it[0]), i64_(1)], T::I64))],
        );
        b.ret(vec![v(r[0])]);
    })
}

#[test]
fn infinite_loop_runs_out_of_fuel_deterministically() {
    let l = infinite();
    for fuel in [0u64, 1, 2, 3, 1000, 12_345, 1_000_000] {
        let lim = InvokeLimits {
            fuel,
            ..Default::default()
        };
        let a = l.invoke_metered("main", &[], &lim);
        let b = l.invoke_metered("main", &[], &lim);
        let (ta, tb) = (a.result.unwrap_err(), b.result.unwrap_err());
        assert_eq!(ta.kind, TrapKind::OutOfFuel);
        assert_eq!(ta.message, "out of fuel");
        assert_eq!(ta, tb, "same program and fuel must trap at the same point");
        assert_eq!(a.fuel_used, fuel);
        assert_eq!(b.fuel_used, fuel);
        assert!(ta.to_string().contains("in @t.main (pc "), "{ta}");
    }
}

#[test]
fn fuel_is_the_ir_op_count() {
    // Body: 2 ops (add, return) -> 2 fuel.
    let l = single(&[T::I64], &[T::I64], |b, p| {
        let x = b.op(O::Add, vec![v(p[0]), i64_(1)], T::I64);
        b.ret(vec![v(x)]);
    });
    let inv = l.invoke_metered("main", &[V::I64(1)], &InvokeLimits::default());
    assert_eq!(inv.fuel_used, 2);
    assert_eq!(
        l.invoke_metered(
            "main",
            &[V::I64(1)],
            &InvokeLimits {
                fuel: 1,
                ..Default::default()
            }
        )
        .result
        .unwrap_err()
        .kind,
        TrapKind::OutOfFuel
    );
    // for over n iterations of a 2-op body (add, yield), plus the entry block (for) and the exit block (return).
    let l = single(&[T::I64], &[T::I64], |b, p| {
        let r = b.for_(
            i64_(0),
            v(p[0]),
            i64_(1),
            vec![(i64_(0), T::I64)],
            |b, i, it| vec![v(b.op(O::Add, vec![v(it[0]), v(i)], T::I64))],
        );
        b.ret(vec![v(r[0])]);
    });
    for n in [0, 1, 10] {
        let inv = l.invoke_metered("main", &[V::I64(n)], &InvokeLimits::default());
        assert_eq!(inv.fuel_used, 1 + 2 * n as u64 + 1, "n={n}");
    }
    // A long loop under a budget stops within the budget.
    let inv = l.invoke_metered(
        "main",
        &[V::I64(1 << 40)],
        &InvokeLimits {
            fuel: 1_000_001,
            ..Default::default()
        },
    );
    assert_eq!(inv.result.unwrap_err().kind, TrapKind::OutOfFuel);
    assert_eq!(inv.fuel_used, 1_000_001);
}

#[test]
fn oversized_buffer_new_traps_without_allocating() {
    let l = single(&[T::I64], &[T::I64], |b, p| {
        let bf = b.op(O::BufferNew, vec![v(p[0])], T::Buffer);
        let n = b.op(O::BufferLen, vec![v(bf)], T::I64);
        b.ret(vec![v(n)]);
    });
    let cap = 1 << 20;
    let lim = InvokeLimits {
        memory_bytes: cap,
        ..Default::default()
    };
    for n in [1i64 << 40, i64::MAX, cap as i64] {
        let inv = l.invoke_metered("main", &[V::I64(n)], &lim);
        let t = inv.result.unwrap_err();
        assert_eq!(t.kind, TrapKind::OutOfMemory, "{t}");
        assert!(t.message.contains("memory cap"), "{t}");
        assert!(inv.memory_used <= cap);
    }
    assert_eq!(
        l.invoke("main", &[V::I64(cap as i64 - 64)], &lim).unwrap(),
        vec![V::I64(cap as i64 - 64)]
    );
}

/// A cap larger than the machine does not let a program abort the process: an allocation the system refuses
/// is the program's out-of-memory trap (in both tiers), and the invocation's memory is not left charged.
#[test]
fn an_allocation_the_system_refuses_traps() {
    let l = single(&[T::I64], &[T::I64], |b, p| {
        let bf = b.op(O::BufferNew, vec![v(p[0])], T::Buffer);
        let n = b.op(O::BufferLen, vec![v(bf)], T::I64);
        b.ret(vec![v(n)]);
    });
    let lim = InvokeLimits {
        memory_bytes: 1 << 62,
        fuel: u64::MAX,
        ..Default::default()
    };
    // 2^50 bytes: far over any machine's memory (and Linux's overcommit heuristic).
    let inv = l.invoke_metered("main", &[V::I64(1 << 50)], &lim);
    let t = inv.result.unwrap_err();
    assert_eq!(t.kind, TrapKind::OutOfMemory, "{t}");
    assert!(t.message.contains("could not allocate"), "{t}");
    assert!(inv.memory_used < 1 << 20, "{}", inv.memory_used);
    assert_eq!(
        l.invoke("main", &[V::I64(4096)], &lim).unwrap(),
        vec![V::I64(4096)]
    );
}

/// Bulk operations cost fuel by the bytes they touch (one unit per 64), so fuel bounds their time: a megabyte
/// buffer costs 16,384 units more than an empty one, and a budget too small for the bytes stops the program
/// before it allocates them.
#[test]
fn bulk_operations_cost_fuel_by_bytes() {
    let l = single(&[T::I64], &[T::I64], |b, p| {
        let bf = b.op(O::BufferNew, vec![v(p[0])], T::Buffer);
        let n = b.op(O::BufferLen, vec![v(bf)], T::I64);
        b.ret(vec![v(n)]);
    });
    let lim = InvokeLimits {
        memory_bytes: 1 << 24,
        ..Default::default()
    };
    let empty = l.invoke_metered("main", &[V::I64(0)], &lim);
    let mib = l.invoke_metered("main", &[V::I64(1 << 20)], &lim);
    assert_eq!(mib.result.unwrap(), vec![V::I64(1 << 20)]);
    assert_eq!(mib.fuel_used - empty.fuel_used, 16_384);
    let short = l.invoke_metered(
        "main",
        &[V::I64(1 << 20)],
        &InvokeLimits {
            fuel: 16_000,
            ..lim
        },
    );
    assert_eq!(short.result.unwrap_err().kind, TrapKind::OutOfFuel);
    assert_eq!(short.memory_used, 0, "nothing stays charged");
}

#[test]
fn allocating_in_a_loop_hits_the_cap() {
    let l = single(&[], &[T::I64], |b, _| {
        let r = b.while_(
            vec![(i64_(0), T::I64)],
            |_, _| b_(true),
            |b, it| {
                b.op(O::BufferNew, vec![i64_(1000)], T::Buffer);
                b.op(O::StrFromI64, vec![v(it[0])], T::Str);
                vec![v(b.op(O::Add, vec![v(it[0]), i64_(1)], T::I64))]
            },
        );
        b.ret(vec![v(r[0])]);
    });
    let inv = l.invoke_metered(
        "main",
        &[],
        &InvokeLimits {
            memory_bytes: 1 << 20,
            ..Default::default()
        },
    );
    assert_eq!(inv.result.unwrap_err().kind, TrapKind::OutOfMemory);
    assert!(inv.memory_used <= 1 << 20 && inv.memory_used > (1 << 20) - 1200);
    // list growth too.
    let l = single(&[], &[T::I64], |b, _| {
        let li = b.op_ann(O::ListNew, vec![i64_(0)], list(T::I64));
        let r = b.while_(
            vec![(i64_(0), T::I64)],
            |_, _| b_(true),
            |b, it| {
                b.op0(O::ListPush, vec![v(li), v(it[0])]);
                vec![v(b.op(O::Add, vec![v(it[0]), i64_(1)], T::I64))]
            },
        );
        b.ret(vec![v(r[0])]);
    });
    let inv = l.invoke_metered(
        "main",
        &[],
        &InvokeLimits {
            memory_bytes: 1 << 20,
            ..Default::default()
        },
    );
    assert_eq!(inv.result.unwrap_err().kind, TrapKind::OutOfMemory);
}

#[test]
fn runaway_recursion_hits_the_depth_limit_not_the_stack() {
    let mut pb = ProgramBuilder::new();
    let f = pb.reserve("t.down");
    let (mut b, p) = FuncBuilder::new("t.down", &[T::I64, T::Buffer], &[T::I64]);
    let a = b.op(O::Add, vec![v(p[0]), i64_(1)], T::I64);
    let r = b.call(Callee::Func(f), vec![v(a), v(p[1])], &[T::I64]);
    b.ret(vec![v(r[0])]);
    pb.set(f, b.finish(), Some("main"));
    let l = pb.load();
    let args = [V::I64(0), V::buffer(vec![])];
    let t = l
        .invoke(
            "main",
            &args,
            &InvokeLimits {
                call_depth: 100,
                ..Default::default()
            },
        )
        .unwrap_err();
    assert_eq!(t.kind, TrapKind::CallDepth);
    assert!(t.message.contains("call depth limit of 100"), "{t}");
    // A deep limit on a small thread stack: the interpreter does not recurse per Loom call.
    let h = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || {
            l.invoke(
                "main",
                &args,
                &InvokeLimits {
                    call_depth: 200_000,
                    fuel: u64::MAX,
                    memory_bytes: 1 << 30,
                    retained_bytes: None,
                },
            )
            .unwrap_err()
            .kind
        })
        .unwrap();
    assert_eq!(h.join().unwrap(), TrapKind::CallDepth);
}

fn import_prog(sig_params: &[T], sig_results: &[T], module: &str, symbol: &str) -> ProgramBuilder {
    let mut pb = ProgramBuilder::new();
    let d = pb.import(symbol, module, sig_params, sig_results);
    let (mut b, p) = FuncBuilder::new("t.main", sig_params, sig_results);
    let r = b.call(
        Callee::Decl(d),
        p.iter().map(|x| v(*x)).collect(),
        sig_results,
    );
    b.ret(r.iter().map(|x| v(*x)).collect());
    pb.add(b.finish(), Some("main"));
    pb
}

#[test]
fn import_binding_errors() {
    let m = Arc::new(NativeModule::new("input").func(
        "encode",
        Signature {
            params: vec![T::Str],
            results: vec![T::Buffer],
        },
        5,
        |_, _| Ok(vec![V::buffer(vec![])]),
    ));
    let pb = import_prog(&[T::Str], &[T::Buffer], "input", "input.encode");
    assert!(pb.load_with(std::slice::from_ref(&m), &["input"]).is_ok());
    let e = pb
        .load_with(std::slice::from_ref(&m), &["test"])
        .unwrap_err();
    assert!(
        matches!(&e, LoadError::NotGranted { module, .. } if module == "input"),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("not granted to this role (granted: test)"),
        "{e}"
    );
    assert!(e.to_string().starts_with("test.loom:3:1:"), "{e}");
    let e = pb.load_with(&[], &["input"]).unwrap_err();
    assert!(matches!(e, LoadError::UnknownModule { .. }), "{e}");
    let pb2 = import_prog(&[T::Str], &[T::Buffer], "input", "input.decode");
    assert!(matches!(
        pb2.load_with(std::slice::from_ref(&m), &["input"])
            .unwrap_err(),
        LoadError::UnknownFunction { .. }
    ));
    let pb3 = import_prog(&[T::Str], &[T::Buffer], "input", "other.encode");
    assert!(matches!(
        pb3.load_with(std::slice::from_ref(&m), &["input"])
            .unwrap_err(),
        LoadError::BadImportSymbol { .. }
    ));
    let pb4 = import_prog(&[T::Str], &[T::I64], "input", "input.encode");
    let e = pb4.load_with(&[m], &["input"]).unwrap_err();
    assert!(matches!(e, LoadError::SignatureMismatch { .. }));
    assert!(
        e.to_string().contains(
            "declared as (str) -> (i64) but the native function has signature (str) -> (buffer)"
        ),
        "{e}"
    );
}

#[test]
fn natives_run_and_are_checked() {
    let sig = Signature {
        params: vec![T::Str],
        results: vec![T::Buffer],
    };
    let m = Arc::new(
        NativeModule::new("input")
            .func("good", sig.clone(), 5, |ctx, a| {
                let s = a[0].as_str().unwrap_or_default();
                ctx.alloc(s.len() as u64)?;
                Ok(vec![V::buffer(s.as_bytes().to_vec())])
            })
            .func("bad", sig.clone(), 5, |_, _| Ok(vec![V::I64(3)]))
            .func("many", sig.clone(), 5, |_, _| Ok(vec![]))
            .func("hog", sig.clone(), 5, |ctx, _| {
                ctx.alloc(1 << 40)?;
                Ok(vec![V::buffer(vec![])])
            })
            .func("fail", sig.clone(), 5, |_, _| {
                Err(NativeError::failed("tokenizer exploded"))
            })
            .func("panics", sig.clone(), 5, |_, _| panic!("boom")),
    );
    let run_native = |name: &str| {
        let pb = import_prog(&[T::Str], &[T::Buffer], "input", &format!("input.{name}"));
        let l = pb.load_with(std::slice::from_ref(&m), &["input"]).unwrap();
        l.invoke_metered(
            "main",
            &[V::str("hi")],
            &InvokeLimits {
                memory_bytes: 1 << 20,
                ..Default::default()
            },
        )
    };
    let ok = run_native("good");
    assert_eq!(ok.result.unwrap(), vec![V::buffer(b"hi".to_vec())]);
    assert_eq!(ok.fuel_used, 2 + 5);
    let t = run_native("bad").result.unwrap_err();
    assert_eq!(t.kind, TrapKind::TypeMismatch);
    assert!(
        t.message
            .contains("returned i64 for result 0, its signature declares buffer"),
        "{t}"
    );
    assert_eq!(
        run_native("many").result.unwrap_err().kind,
        TrapKind::TypeMismatch
    );
    assert_eq!(
        run_native("hog").result.unwrap_err().kind,
        TrapKind::OutOfMemory
    );
    let t = run_native("fail").result.unwrap_err();
    assert_eq!(t.kind, TrapKind::Native);
    assert!(t.message.contains("tokenizer exploded"), "{t}");
    assert_eq!(
        run_native("panics").result.unwrap_err().kind,
        TrapKind::Native
    );
}

#[test]
fn native_results_are_copy_on_write() {
    // A native keeps the buffer it returns; the program's store must not change the native's copy.
    let kept: Arc<std::sync::Mutex<Option<V>>> = Arc::default();
    let k2 = kept.clone();
    let m = Arc::new(NativeModule::new("st").func(
        "get",
        Signature {
            params: vec![],
            results: vec![T::Buffer],
        },
        1,
        move |_, _| {
            let b = V::buffer(vec![1, 2, 3, 4]);
            *k2.lock().unwrap() = Some(b.clone());
            Ok(vec![b])
        },
    ));
    let mut pb = ProgramBuilder::new();
    let d = pb.import("st.get", "st", &[], &[T::Buffer]);
    let (mut b, _) = FuncBuilder::new("t.main", &[], &[T::Buffer]);
    let r = b.call(Callee::Decl(d), vec![], &[T::Buffer]);
    b.op0(O::StoreI8, vec![v(r[0]), i64_(0), i32_(9)]);
    b.ret(vec![v(r[0])]);
    pb.add(b.finish(), Some("main"));
    let l = pb.load_with(&[m], &["st"]).unwrap();
    assert_eq!(run(&l, &[]).unwrap(), vec![V::buffer(vec![9, 2, 3, 4])]);
    assert_eq!(
        kept.lock().unwrap().clone().unwrap(),
        V::buffer(vec![1, 2, 3, 4])
    );
}

#[test]
fn test_module_prints() {
    let (m, sink) = testing::test_module_with_sink();
    let mut pb = ProgramBuilder::new();
    let pi = pb.import("test.print_i64", "test", &[T::I64], &[]);
    let pf = pb.import("test.print_f64", "test", &[T::F64], &[]);
    let ps = pb.import("test.print", "test", &[T::Str], &[]);
    let pbuf = pb.import("test.print_buffer", "test", &[T::Buffer], &[]);
    let (mut b, _) = FuncBuilder::new("t.main", &[], &[]);
    b.call(Callee::Decl(pi), vec![i64_(-3)], &[]);
    b.call(Callee::Decl(pf), vec![f64_(2.5)], &[]);
    b.call(Callee::Decl(ps), vec![s_("hello")], &[]);
    let bf = b.op(O::BufferNew, vec![i64_(2)], T::Buffer);
    b.op0(O::StoreI8, vec![v(bf), i64_(1), i32_(0xab)]);
    b.call(Callee::Decl(pbuf), vec![v(bf)], &[]);
    b.ret(vec![]);
    pb.add(b.finish(), Some("main"));
    let l = pb.load_with(&[m], &["test"]).unwrap();
    run(&l, &[]).unwrap();
    assert_eq!(*sink.lock().unwrap(), vec!["-3", "2.5", "hello", "00ab"]);
}

#[test]
fn load_limits() {
    let (mut b, _) = FuncBuilder::new("t.main", &[], &[T::I64]);
    let mut last = b.op(O::ConstI64, vec![i64_(0)], T::I64);
    for _ in 0..100 {
        last = b.op(O::Add, vec![v(last), i64_(1)], T::I64);
    }
    b.ret(vec![v(last)]);
    let mut pb = ProgramBuilder::new();
    pb.add(b.finish(), Some("main"));
    let lim = loom_vm::LoadLimits {
        max_registers: 50,
        ..Default::default()
    };
    let e = loom_vm::Vm::load(&pb.prog, &[], &[], &lim).unwrap_err();
    assert!(
        matches!(e, LoadError::Limit { .. })
            && e.to_string().contains("more than 50 scalar registers"),
        "{e}"
    );
    let lim = loom_vm::LoadLimits {
        max_code_per_function: 50,
        ..Default::default()
    };
    assert!(matches!(
        loom_vm::Vm::load(&pb.prog, &[], &[], &lim).unwrap_err(),
        LoadError::Limit { .. }
    ));
    assert_eq!(run(&pb.load(), &[]).unwrap(), vec![V::I64(100)]);
}

#[test]
fn malformed_programs_are_load_errors_not_panics() {
    let (mut b, _) = FuncBuilder::new("t.main", &[], &[T::I64]);
    b.ret(vec![v(loom_ir::ValueId(999))]);
    let mut pb = ProgramBuilder::new();
    pb.add(b.finish(), Some("main"));
    assert!(matches!(
        loom_vm::Vm::load(&pb.prog, &[], &[], &Default::default()).unwrap_err(),
        LoadError::Invalid { .. }
    ));
    let (mut b, _) = FuncBuilder::new("t.main", &[], &[T::I64]);
    b.op(O::Add, vec![v(loom_ir::ValueId(999))], T::I64);
    b.ret(vec![i64_(0)]);
    let mut pb = ProgramBuilder::new();
    pb.add(b.finish(), Some("main"));
    assert!(loom_vm::Vm::load(&pb.prog, &[], &[], &Default::default()).is_err());
    let (b, _) = FuncBuilder::new("t.main", &[], &[T::I64]);
    let mut pb = ProgramBuilder::new();
    pb.add(b.finish(), Some("main")); // empty body
    assert!(loom_vm::Vm::load(&pb.prog, &[], &[], &Default::default()).is_err());
}

/// Host state moves into an invocation, reaches its natives through their context (not a thread-local), and
/// comes back to the host afterwards, also when the invocation traps.
#[test]
fn host_state_reaches_natives_and_returns() {
    let sig = Signature {
        params: vec![T::Str],
        results: vec![T::Buffer],
    };
    let m = Arc::new(
        NativeModule::new("input")
            .func("count", sig.clone(), 5, |ctx, a| {
                let calls = ctx
                    .host::<Vec<String>>()
                    .ok_or_else(|| NativeError::failed("no host state"))?;
                calls.push(a[0].as_str().unwrap_or_default().to_string());
                Ok(vec![V::buffer(vec![calls.len() as u8])])
            })
            .func("fail", sig, 5, |ctx, _| {
                ctx.host::<Vec<String>>().unwrap().push("failed".into());
                Err(NativeError::failed("no"))
            }),
    );
    let load = |name: &str| {
        import_prog(&[T::Str], &[T::Buffer], "input", &format!("input.{name}"))
            .load_with(std::slice::from_ref(&m), &["input"])
            .unwrap()
    };
    let l = load("count");
    let entry = l.entry("main").unwrap();
    let mut host: Option<HostState> = Some(Box::new(Vec::<String>::new()));
    let mut out = Vec::new();
    for word in ["a", "b"] {
        l.invoke_hosted(
            entry,
            &[V::str(word)],
            &InvokeLimits::default(),
            &mut out,
            &mut host,
        )
        .unwrap();
    }
    assert_eq!(out, vec![V::buffer(vec![2])]);
    let calls = host
        .as_mut()
        .unwrap()
        .downcast_mut::<Vec<String>>()
        .unwrap();
    assert_eq!(calls, &["a", "b"]);
    // Without host state the native sees none (and says so).
    let t = l
        .invoke("main", &[V::str("c")], &InvokeLimits::default())
        .unwrap_err();
    assert!(t.message.contains("no host state"), "{t}");
    // A trap still gives the state back.
    let l = load("fail");
    let entry = l.entry("main").unwrap();
    l.invoke_hosted(
        entry,
        &[V::str("x")],
        &InvokeLimits::default(),
        &mut out,
        &mut host,
    )
    .unwrap_err();
    let calls = host.unwrap().downcast::<Vec<String>>().unwrap();
    assert_eq!(*calls, vec!["a", "b", "failed"]);
}
