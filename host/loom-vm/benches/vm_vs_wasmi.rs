//! Loom VM vs the `wasmi` WebAssembly interpreter on two workloads, same inputs, checksums compared.
//!
//! Run: `cargo bench -p loom-vm --bench vm_vs_wasmi`. Prints a table of median times over several runs;
//! ratio = wasmi / loom (> 1 means the Loom VM is faster).

#[path = "../tests/common/mod.rs"]
mod common;

use common::*;
use loom_ir::{Opcode as O, Type as T};
use loom_vm::{InvokeLimits, Loaded, Value as V};
use std::time::{Duration, Instant};

const SCALAR_N: i64 = 10_000_000;
const B: i64 = 32;
const TT: i64 = 256;
const REPS: i64 = 200;
const RUNS: usize = 7;
const TINY_N: i64 = 1_000_000;

const C1: i64 = 6364136223846793005;
const C2: i64 = 1442695040888963407;

/// (a) LCG with a data-dependent branch: x = x*C1 + C2; t = x >>u 33; acc = (t even) ? acc + t : acc ^ t.
fn loom_scalar(jit: bool) -> Loaded {
    single_jit(&[T::I64, T::I64], &[T::I64], jit, |b, p| {
        let r = b.for_(
            i64_(0),
            v(p[0]),
            i64_(1),
            vec![(v(p[1]), T::I64), (i64_(0), T::I64)],
            |b, _, it| {
                let m = b.op(O::MulWrap, vec![v(it[0]), i64_(C1)], T::I64);
                let x = b.op(O::AddWrap, vec![v(m), i64_(C2)], T::I64);
                let t = b.op(O::ShrU, vec![v(x), i64_(33)], T::I64);
                let lo = b.op(O::And, vec![v(t), i64_(1)], T::I64);
                let even = b.op(O::CmpEq, vec![v(lo), i64_(0)], T::I1);
                let acc = b.if_(
                    v(even),
                    &[T::I64],
                    |b| vec![v(b.op(O::AddWrap, vec![v(it[1]), v(t)], T::I64))],
                    |b| vec![v(b.op(O::Xor, vec![v(it[1]), v(t)], T::I64))],
                );
                vec![v(x), v(acc[0])]
            },
        );
        b.ret(vec![v(r[1])]);
    })
}

const WAT_SCALAR: &str = r#"
(module
  (func (export "scalar") (param $n i64) (param $seed i64) (result i64)
    (local $i i64) (local $x i64) (local $acc i64) (local $t i64)
    (local.set $x (local.get $seed))
    (block $exit
      (br_if $exit (i64.ge_s (i64.const 0) (local.get $n)))
      (loop $top
        (local.set $x (i64.add (i64.mul (local.get $x) (i64.const 6364136223846793005)) (i64.const 1442695040888963407)))
        (local.set $t (i64.shr_u (local.get $x) (i64.const 33)))
        (if (i64.eqz (i64.and (local.get $t) (i64.const 1)))
          (then (local.set $acc (i64.add (local.get $acc) (local.get $t))))
          (else (local.set $acc (i64.xor (local.get $acc) (local.get $t)))))
        (local.set $i (i64.add (local.get $i) (i64.const 1)))
        (br_if $top (i64.lt_s (local.get $i) (local.get $n)))))
    (local.get $acc)))
"#;

/// (b) prepare_batch: ranges[b] = {offset: i64, length: i64}; copy min(length, T) i32 token ids from `tokens`
/// into row b of a zero-padded [B, T] i32 buffer, write the lengths; repeat `reps` times; return a checksum.
fn loom_prepare(jit: bool) -> Loaded {
    single_jit(&[T::Buffer, T::Buffer, T::I64], &[T::I64], jit, |b, p| {
        let (ranges, tokens) = (p[0], p[1]);
        let out = b.op(O::BufferNew, vec![i64_(B * TT * 4)], T::Buffer);
        let lens = b.op(O::BufferNew, vec![i64_(B * 4)], T::Buffer);
        b.for_(i64_(0), v(p[2]), i64_(1), vec![], |b, _, _| {
            b.for_(i64_(0), i64_(B), i64_(1), vec![], |b, bi, _| {
                let ro = b.op(O::Mul, vec![v(bi), i64_(16)], T::I64);
                let off = b.op(O::LoadI64, vec![v(ranges), v(ro)], T::I64);
                let ro8 = b.op(O::Add, vec![v(ro), i64_(8)], T::I64);
                let len = b.op(O::LoadI64, vec![v(ranges), v(ro8)], T::I64);
                let n = b.op(O::Min, vec![v(len), i64_(TT)], T::I64);
                let row = b.op(O::Mul, vec![v(bi), i64_(TT * 4)], T::I64);
                b.for_(i64_(0), v(n), i64_(1), vec![], |b, t, _| {
                    let a = b.op(O::Add, vec![v(off), v(t)], T::I64);
                    let a4 = b.op(O::Mul, vec![v(a), i64_(4)], T::I64);
                    let tok = b.op(O::LoadI32, vec![v(tokens), v(a4)], T::I32);
                    let t4 = b.op(O::Mul, vec![v(t), i64_(4)], T::I64);
                    let o = b.op(O::Add, vec![v(row), v(t4)], T::I64);
                    b.op0(O::StoreI32, vec![v(out), v(o), v(tok)]);
                    vec![]
                });
                b.for_(v(n), i64_(TT), i64_(1), vec![], |b, t, _| {
                    let t4 = b.op(O::Mul, vec![v(t), i64_(4)], T::I64);
                    let o = b.op(O::Add, vec![v(row), v(t4)], T::I64);
                    b.op0(O::StoreI32, vec![v(out), v(o), i32_(0)]);
                    vec![]
                });
                let n32 = b.op(O::ConvI32, vec![v(n)], T::I32);
                let lo = b.op(O::Mul, vec![v(bi), i64_(4)], T::I64);
                b.op0(O::StoreI32, vec![v(lens), v(lo), v(n32)]);
                vec![]
            });
            vec![]
        });
        let s1 = b.for_(
            i64_(0),
            i64_(B * TT),
            i64_(1),
            vec![(i64_(0), T::I64)],
            |b, i, it| {
                let o = b.op(O::Mul, vec![v(i), i64_(4)], T::I64);
                let x = b.op(O::LoadI32, vec![v(out), v(o)], T::I32);
                let x64 = b.op(O::ConvI64, vec![v(x)], T::I64);
                let m = b.op(O::MulWrap, vec![v(it[0]), i64_(31)], T::I64);
                vec![v(b.op(O::AddWrap, vec![v(m), v(x64)], T::I64))]
            },
        );
        let s2 = b.for_(
            i64_(0),
            i64_(B),
            i64_(1),
            vec![(v(s1[0]), T::I64)],
            |b, i, it| {
                let o = b.op(O::Mul, vec![v(i), i64_(4)], T::I64);
                let x = b.op(O::LoadI32, vec![v(lens), v(o)], T::I32);
                let x64 = b.op(O::ConvI64, vec![v(x)], T::I64);
                vec![v(b.op(O::AddWrap, vec![v(it[0]), v(x64)], T::I64))]
            },
        );
        b.ret(vec![v(s2[0])]);
    })
}

// Memory layout: ranges at 0, tokens at TOK_BASE, out at OUT_BASE, lens at LENS_BASE.
const TOK_BASE: i32 = 4096;
const OUT_BASE: i32 = 1 << 16;
const LENS_BASE: i32 = OUT_BASE + (B * TT * 4) as i32;

fn wat_prepare() -> String {
    format!(
        r#"
(module
  (memory (export "mem") 4)
  (func (export "prepare") (param $reps i32) (result i64)
    (local $r i32) (local $b i32) (local $t i32) (local $n i32) (local $off i32) (local $row i32) (local $acc i64) (local $i i32)
    (block $rdone (loop $rloop
      (br_if $rdone (i32.ge_s (local.get $r) (local.get $reps)))
      (local.set $b (i32.const 0))
      (loop $bloop
        (local.set $off (i32.wrap_i64 (i64.load (i32.shl (local.get $b) (i32.const 4)))))
        (local.set $n (i32.wrap_i64 (i64.load offset=8 (i32.shl (local.get $b) (i32.const 4)))))
        (if (i32.gt_s (local.get $n) (i32.const {TT})) (then (local.set $n (i32.const {TT}))))
        (local.set $row (i32.add (i32.const {OUT_BASE}) (i32.mul (local.get $b) (i32.const {ROWB}))))
        (local.set $t (i32.const 0))
        (block $cdone
          (br_if $cdone (i32.ge_s (local.get $t) (local.get $n)))
          (loop $copy
            (i32.store (i32.add (local.get $row) (i32.shl (local.get $t) (i32.const 2)))
              (i32.load offset={TOK_BASE} (i32.shl (i32.add (local.get $off) (local.get $t)) (i32.const 2))))
            (local.set $t (i32.add (local.get $t) (i32.const 1)))
            (br_if $copy (i32.lt_s (local.get $t) (local.get $n)))))
        (block $pdone
          (br_if $pdone (i32.ge_s (local.get $t) (i32.const {TT})))
          (loop $pad
            (i32.store (i32.add (local.get $row) (i32.shl (local.get $t) (i32.const 2))) (i32.const 0))
            (local.set $t (i32.add (local.get $t) (i32.const 1)))
            (br_if $pad (i32.lt_s (local.get $t) (i32.const {TT})))))
        (i32.store offset={LENS_BASE} (i32.shl (local.get $b) (i32.const 2)) (local.get $n))
        (local.set $b (i32.add (local.get $b) (i32.const 1)))
        (br_if $bloop (i32.lt_s (local.get $b) (i32.const {B}))))
      (local.set $r (i32.add (local.get $r) (i32.const 1)))
      (br $rloop)))
    (local.set $i (i32.const 0))
    (loop $sum
      (local.set $acc (i64.add (i64.mul (local.get $acc) (i64.const 31))
        (i64.extend_i32_s (i32.load offset={OUT_BASE} (i32.shl (local.get $i) (i32.const 2))))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $sum (i32.lt_s (local.get $i) (i32.const {BT}))))
    (local.set $i (i32.const 0))
    (loop $lsum
      (local.set $acc (i64.add (local.get $acc)
        (i64.extend_i32_s (i32.load offset={LENS_BASE} (i32.shl (local.get $i) (i32.const 2))))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $lsum (i32.lt_s (local.get $i) (i32.const {B}))))
    (local.get $acc)))
"#,
        TT = TT,
        B = B,
        BT = B * TT,
        ROWB = TT * 4,
        TOK_BASE = TOK_BASE,
        OUT_BASE = OUT_BASE,
        LENS_BASE = LENS_BASE,
    )
}

/// Ranges (offset, length) with lengths 1..=300 (some longer than T, truncated) and pseudo-random token ids.
fn prepare_inputs() -> (Vec<u8>, Vec<u8>) {
    let mut ranges = Vec::new();
    let mut off = 0i64;
    let mut x = 12345u64;
    for _ in 0..B {
        x = x.wrapping_mul(C1 as u64).wrapping_add(C2 as u64);
        let len = 1 + (x >> 33) as i64 % 300;
        ranges.extend_from_slice(&off.to_le_bytes());
        ranges.extend_from_slice(&len.to_le_bytes());
        off += len;
    }
    let mut tokens = Vec::new();
    for _ in 0..off {
        x = x.wrapping_mul(C1 as u64).wrapping_add(C2 as u64);
        tokens.extend_from_slice(&(((x >> 40) % 50_000) as i32).to_le_bytes());
    }
    (ranges, tokens)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time<R: PartialEq + std::fmt::Debug>(mut f: impl FnMut() -> R) -> (Duration, R) {
    let first = f(); // warm-up
    let mut ts = Vec::new();
    for _ in 0..RUNS {
        let t0 = Instant::now();
        let r = f();
        ts.push(t0.elapsed());
        assert_eq!(r, first, "nondeterministic result");
    }
    (median(ts), first)
}

fn main() {
    // Measure each tier alone (the test cross-check would run every invocation twice).
    CROSS_CHECK.store(false, std::sync::atomic::Ordering::Relaxed);
    let lim = InvokeLimits {
        fuel: u64::MAX,
        memory_bytes: 1 << 30,
        call_depth: 64,
        retained_bytes: None,
    };
    if std::env::var_os("LOOM_DIS").is_some() {
        println!(
            "{}\n{}",
            loom_scalar(false).disassemble(),
            loom_prepare(false).disassemble()
        );
    }
    let engine = wasmi::Engine::default();
    let linker = wasmi::Linker::<()>::new(&engine);
    let mut rows = Vec::new();
    let mut notes = Vec::new();

    // `LOOM_BENCH=scalar|prepare|tiny` runs one workload (for profiling).
    let only = std::env::var("LOOM_BENCH").ok();
    let want = |w: &str| only.as_deref().is_none_or(|o| o == w);

    // (a) scalar
    if want("scalar") {
        let l = loom_scalar(false);
        let (lt, lr) = time(|| {
            l.invoke("main", &[V::I64(SCALAR_N), V::I64(7)], &lim)
                .expect("loom scalar")
        });
        let lj = loom_scalar(true);
        notes.push(format!("scalar JIT: {:?}", lj.jit_stats()));
        let (jt, jr) = time(|| {
            lj.invoke("main", &[V::I64(SCALAR_N), V::I64(7)], &lim)
                .expect("loom scalar jit")
        });
        assert_eq!(lr, jr, "scalar: tiers differ");
        let module =
            wasmi::Module::new(&engine, wat::parse_str(WAT_SCALAR).expect("wat")).expect("module");
        let mut store = wasmi::Store::new(&engine, ());
        let inst = linker
            .instantiate_and_start(&mut store, &module)
            .expect("instantiate");
        let f = inst
            .get_typed_func::<(i64, i64), i64>(&store, "scalar")
            .expect("func");
        let (wt, wr) = time(|| f.call(&mut store, (SCALAR_N, 7)).expect("wasmi scalar"));
        assert_eq!(lr, vec![V::I64(wr)], "scalar checksums differ");
        rows.push(("scalar LCG + branch, 10M (interp)", lt, wt, wr));
        rows.push(("scalar LCG + branch, 10M (JIT)", jt, wt, wr));
    }

    // (b) prepare_batch
    if want("prepare") {
        let (ranges, tokens) = prepare_inputs();
        let l = loom_prepare(false);
        let lj = loom_prepare(true);
        notes.push(format!("prepare JIT: {:?}", lj.jit_stats()));
        let args = [
            V::buffer(ranges.clone()),
            V::buffer(tokens.clone()),
            V::I64(REPS),
        ];
        let (lt, lr) = time(|| l.invoke("main", &args, &lim).expect("loom prepare"));
        let (jt, jr) = time(|| lj.invoke("main", &args, &lim).expect("loom prepare jit"));
        assert_eq!(lr, jr, "prepare: tiers differ");
        let module = wasmi::Module::new(&engine, wat::parse_str(wat_prepare()).expect("wat"))
            .expect("module");
        let mut store = wasmi::Store::new(&engine, ());
        let inst = linker
            .instantiate_and_start(&mut store, &module)
            .expect("instantiate");
        let mem = inst.get_memory(&store, "mem").expect("memory");
        mem.write(&mut store, 0, &ranges).expect("write ranges");
        mem.write(&mut store, TOK_BASE as usize, &tokens)
            .expect("write tokens");
        let f = inst
            .get_typed_func::<i32, i64>(&store, "prepare")
            .expect("func");
        let (wt, wr) = time(|| f.call(&mut store, REPS as i32).expect("wasmi prepare"));
        assert_eq!(lr, vec![V::I64(wr)], "prepare checksums differ");
        rows.push(("prepare_batch B=32 T=256 x200 (interp)", lt, wt, wr));
        rows.push(("prepare_batch B=32 T=256 x200 (JIT)", jt, wt, wr));
    }

    // (c) tiny invocation: `x + 1` on i64, called TINY_N times; loom pays a full invocation each time (argument
    // checks, heap setup, pooled stacks, result conversion), wasmi a call on a ready instance.
    if want("tiny") {
        let l = single(&[T::I64], &[T::I64], |b, p| {
            let x = b.op(O::AddWrap, vec![v(p[0]), i64_(1)], T::I64);
            b.ret(vec![v(x)]);
        });
        // Loom: the export resolved once, results written into a reused `Vec` (what a serving loop does).
        let id = l.entry("main").expect("entry");
        let mut res = Vec::with_capacity(1);
        let (lt, lr) = time(|| {
            let mut acc = 0i64;
            for i in 0..TINY_N {
                l.invoke_into(id, &[V::I64(i)], &lim, &mut res)
                    .expect("loom tiny");
                match res[..] {
                    [V::I64(x)] => acc = acc.wrapping_add(x),
                    _ => panic!("loom tiny result"),
                }
            }
            acc
        });
        // Loom: the convenience API (lookup by name, fresh result `Vec`).
        let (lt2, lr2) = time(|| {
            let mut acc = 0i64;
            for i in 0..TINY_N {
                match l.invoke("main", &[V::I64(i)], &lim).expect("loom tiny")[..] {
                    [V::I64(x)] => acc = acc.wrapping_add(x),
                    _ => panic!("loom tiny result"),
                }
            }
            acc
        });
        let module = wasmi::Module::new(
        &engine,
        wat::parse_str(
            r#"(module (func (export "tiny") (param i64) (result i64) (i64.add (local.get 0) (i64.const 1))))"#,
        )
        .expect("wat"),
    )
    .expect("module");
        let mut store = wasmi::Store::new(&engine, ());
        let inst = linker
            .instantiate_and_start(&mut store, &module)
            .expect("instantiate");
        let f = inst
            .get_typed_func::<i64, i64>(&store, "tiny")
            .expect("func");
        let (wt, wr) = time(|| {
            let mut acc = 0i64;
            for i in 0..TINY_N {
                acc = acc.wrapping_add(f.call(&mut store, i).expect("wasmi tiny"));
            }
            acc
        });
        assert_eq!(lr, wr, "tiny checksums differ");
        rows.push(("tiny call x1M (invoke_into/typed)", lt, wt, wr));
        // wasmi's dynamically typed call (`Func::call` with `Val` slices, checked against the signature per call),
        // the analogue of Loom's `Value`-based `invoke`.
        let fu = inst.get_func(&store, "tiny").expect("func");
        let mut out = [wasmi::Val::I64(0)];
        let (wt2, wr2) = time(|| {
            let mut acc = 0i64;
            for i in 0..TINY_N {
                fu.call(&mut store, &[wasmi::Val::I64(i)], &mut out)
                    .expect("wasmi tiny");
                match out[0] {
                    wasmi::Val::I64(x) => acc = acc.wrapping_add(x),
                    _ => panic!("wasmi tiny result"),
                }
            }
            acc
        });
        assert_eq!((lr2, wr2), (wr, wr), "tiny checksums differ");
        rows.push(("tiny call x1M (invoke(&str)/untyped)", lt2, wt2, wr));
    }

    println!(
        "{:<40} {:>12} {:>12} {:>8}   checksum",
        "workload", "loom", "wasmi", "ratio"
    );
    for (name, lt, wt, ck) in rows {
        println!(
            "{name:<40} {:>10.2}ms {:>10.2}ms {:>8.2}   {ck}",
            lt.as_secs_f64() * 1e3,
            wt.as_secs_f64() * 1e3,
            wt.as_secs_f64() / lt.as_secs_f64()
        );
    }
    println!(
        "(median of {RUNS} runs after a warm-up; ratio = wasmi / loom, > 1 means loom is faster)"
    );
    for n in notes {
        println!("{n} (functions compiled, compile time)");
    }
}
