//! Resolved exports (`Loaded::entry`, `invoke_entry`, `invoke_into`) and the pooled per-thread invocation state.
mod common;
use common::*;
use loom_ir::{Opcode as O, Type as T};
use loom_vm::{InvokeLimits, TrapKind, Value as V};

#[test]
fn invoke_into_matches_invoke_and_reuses_the_vec() {
    let l = single(&[T::I64], &[T::I64, T::Str], |b, p| {
        let x = b.op(O::AddWrap, vec![v(p[0]), i64_(1)], T::I64);
        b.ret(vec![v(x), s_("hi")]);
    });
    let lim = InvokeLimits::default();
    let id = l.entry("main").expect("export");
    assert_eq!(l.entry("nope"), None);
    let mut out = Vec::with_capacity(8);
    for i in [0i64, 5, -1, i64::MAX] {
        let m = l.invoke_into(id, &[V::I64(i)], &lim, &mut out).unwrap();
        assert_eq!(out, l.invoke("main", &[V::I64(i)], &lim).unwrap());
        assert_eq!(out, l.invoke_entry(id, &[V::I64(i)], &lim).unwrap());
        let full = l.invoke_metered("main", &[V::I64(i)], &lim);
        assert_eq!(
            (m.fuel_used, m.memory_used),
            (full.fuel_used, full.memory_used)
        );
        assert!(out.capacity() >= 8);
    }
    // Bad arguments: a trap, and `out` is left empty.
    let t = l.invoke_into(id, &[V::I32(1)], &lim, &mut out).unwrap_err();
    assert_eq!(t.kind, TrapKind::BadArguments);
    assert!(out.is_empty());
}

#[test]
fn entry_ids_are_checked_like_any_input() {
    let two = {
        let mut pb = ProgramBuilder::new();
        for name in ["a", "b"] {
            let (mut f, p) = FuncBuilder::new(name, &[T::I64], &[T::I64]);
            let x = f.op(O::AddWrap, vec![v(p[0]), i64_(1)], T::I64);
            f.ret(vec![v(x)]);
            pb.add(f.finish(), Some(name));
        }
        pb.load()
    };
    let one = single(&[T::Str], &[T::Str], |b, p| b.ret(vec![v(p[0])]));
    let lim = InvokeLimits::default();
    let b = two.entry("b").unwrap();
    // An id of another program: out of range here, or a different signature; never unchecked.
    let t = one.invoke_entry(b, &[V::I64(1)], &lim).unwrap_err();
    assert_eq!(t.kind, TrapKind::BadArguments, "{t}");
    let a = two.entry("a").unwrap();
    let t = one.invoke_entry(a, &[V::I64(1)], &lim).unwrap_err();
    assert_eq!(t.kind, TrapKind::BadArguments, "{t}");
}

/// The pooled heap is emptied between invocations: handles and string constants of one invocation never
/// resolve in the next, and memory accounting restarts from zero.
#[test]
fn pooled_heap_starts_empty_every_time() {
    let l = single(&[T::I64], &[T::Buffer, T::Str], |b, p| {
        let buf = b.op(O::BufferNew, vec![v(p[0])], T::Buffer);
        b.op0(O::StoreI8, vec![v(buf), i64_(0), i32_(7)]);
        b.ret(vec![v(buf), s_("const")]);
    });
    let lim = InvokeLimits::default();
    let first = l.invoke_metered("main", &[V::I64(16)], &lim);
    let r1 = first.result.unwrap();
    for _ in 0..3 {
        let again = l.invoke_metered("main", &[V::I64(16)], &lim);
        assert_eq!(again.memory_used, first.memory_used);
        assert_eq!(again.result.unwrap(), r1);
    }
    // A trapping invocation (out of memory) does not poison the pool either.
    let small = InvokeLimits {
        memory_bytes: 8,
        ..Default::default()
    };
    let t = l.invoke("main", &[V::I64(16)], &small).unwrap_err();
    assert_eq!(t.kind, TrapKind::OutOfMemory);
    let again = l.invoke_metered("main", &[V::I64(16)], &lim);
    assert_eq!(again.memory_used, first.memory_used);
    assert_eq!(again.result.unwrap(), r1);
}
