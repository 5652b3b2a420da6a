//! Fuzzing the allocation paths: random straight-line programs of the operations that allocate (buffers,
//! strings, lists), with sizes, offsets and lengths drawn from the edges (negative, zero, one under or over the
//! cap, 2^40 and beyond, `i64::MIN`/`MAX`) and passed as arguments so that nothing is folded, run under random
//! memory caps and fuel budgets. Each invocation either returns or traps with a sandbox trap; it never aborts
//! or panics the process, never leaves more memory charged than its cap, and (the JIT cross-check of
//! `common::ProgramBuilder`) the interpreter and the JIT agree on results, traps, fuel and memory.
mod common;
use common::*;
use loom_ir::{Opcode as O, Type as T, ValueId};
use loom_vm::{InvokeLimits, TrapKind, Value as V};

/// xorshift64*: deterministic, so a failure names a seed that reproduces it.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Integer arguments: sizes, offsets, lengths and fill values at the interesting edges of `cap`.
fn edge_int(r: &mut Rng, cap: u64, huge: bool) -> i64 {
    let cap = cap.min(i64::MAX as u64) as i64;
    match r.below(if huge { 14 } else { 12 }) {
        0 => 0,
        1 => 1,
        2 => -1,
        3 => r.below(64) as i64,
        4 => r.below(4096) as i64,
        5 => cap,
        6 => cap.saturating_sub(1),
        7 => cap.saturating_add(1),
        8 => cap / 2 + r.below(64) as i64,
        9 => i64::MIN,
        10 => -(r.below(1 << 20) as i64),
        11 => (r.below(1 << 16) as i64) << 4,
        12 => i64::MAX,
        _ => 1 << (40 + r.below(22)),
    }
}

const PARAMS: usize = 24;

/// A program of `ops` allocating operations over pools of buffers, strings and one list; every integer
/// operand is one of the `PARAMS` arguments. Returns the program and how many pool values it made.
fn program(r: &mut Rng, ops: usize) -> loom_vm::Loaded {
    let params = vec![T::I64; PARAMS];
    let picks: Vec<u64> = (0..ops * 8).map(|_| r.next()).collect();
    single(&params, &[T::I64], |b, p| {
        let mut k = picks.iter().copied();
        let mut pick = |n: usize| (k.next().unwrap_or(0) % n as u64) as usize;
        let mut bufs: Vec<ValueId> = vec![b.op(O::BufferNew, vec![v(p[0])], T::Buffer)];
        let mut strs: Vec<ValueId> = vec![b.op(O::StrFromI64, vec![v(p[1])], T::Str)];
        let list_ = b.op_ann(O::ListNew, vec![v(p[2])], list(T::Buffer));
        for _ in 0..ops {
            let int = |i: usize| v(p[i % PARAMS]);
            match pick(11) {
                0 => bufs.push(b.op(O::BufferNew, vec![int(pick(PARAMS))], T::Buffer)),
                1 => {
                    let src = bufs[pick(bufs.len())];
                    let (o, n) = (int(pick(PARAMS)), int(pick(PARAMS)));
                    bufs.push(b.op(O::BufferSlice, vec![v(src), o, n], T::Buffer));
                }
                2 => {
                    let (x, y) = (bufs[pick(bufs.len())], bufs[pick(bufs.len())]);
                    bufs.push(b.op(O::BufferConcat, vec![v(x), v(y)], T::Buffer));
                }
                3 => {
                    let (d, s) = (bufs[pick(bufs.len())], bufs[pick(bufs.len())]);
                    let (a, c, n) = (int(pick(PARAMS)), int(pick(PARAMS)), int(pick(PARAMS)));
                    b.op0(O::BufferCopy, vec![v(d), a, v(s), c, n]);
                }
                4 => {
                    let d = bufs[pick(bufs.len())];
                    let (a, n) = (int(pick(PARAMS)), int(pick(PARAMS)));
                    b.op0(O::BufferFill, vec![v(d), a, n, i32_(7)]);
                }
                5 => {
                    let s = strs[pick(strs.len())];
                    bufs.push(b.op(O::StrToBuffer, vec![v(s)], T::Buffer));
                }
                6 => {
                    // Zero-filled buffers are valid UTF-8, so this reaches the allocation.
                    let s = bufs[pick(bufs.len())];
                    let (o, n) = (int(pick(PARAMS)), int(pick(PARAMS)));
                    strs.push(b.op(O::StrFromBuffer, vec![v(s), o, n], T::Str));
                }
                7 => {
                    let (x, y) = (strs[pick(strs.len())], strs[pick(strs.len())]);
                    strs.push(b.op(O::StrConcat, vec![v(x), v(y)], T::Str));
                }
                8 => strs.push(b.op(O::StrFromI64, vec![int(pick(PARAMS))], T::Str)),
                9 => {
                    let x = bufs[pick(bufs.len())];
                    b.op0(O::ListPush, vec![v(list_), v(x)]);
                }
                _ => {
                    let l = b.op_ann(O::ListNew, vec![int(pick(PARAMS))], list(T::I64));
                    b.op0(O::ListPush, vec![v(l), int(pick(PARAMS))]);
                }
            }
        }
        // The result depends on every pool, so nothing is dead.
        let mut acc = b.op(O::ListLen, vec![v(list_)], T::I64);
        for x in bufs {
            let n = b.op(O::BufferLen, vec![v(x)], T::I64);
            acc = b.op(O::AddWrap, vec![v(acc), v(n)], T::I64);
        }
        for s in strs {
            let n = b.op(O::StrLen, vec![v(s)], T::I64);
            acc = b.op(O::AddWrap, vec![v(acc), v(n)], T::I64);
        }
        b.ret(vec![v(acc)]);
    })
}

#[test]
fn allocation_paths_trap_and_never_abort() {
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for seed in 1..=200u64 {
        let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let ops = 1 + r.below(10) as usize;
        let l = program(&mut r, ops);
        for _ in 0..4 {
            // Either a cap the operator could set with fuel to match, or a cap beyond the machine with a fuel
            // budget that bounds the bytes touched (one unit per 64 bytes) to at most 256 MiB. The huge sizes
            // (2^40 and up) are only drawn in the second case with unbounded fuel, where only the system's
            // refusal stops them.
            let (cap, fuel, huge) = match r.below(3) {
                0 => (
                    [0u64, 64, 4096, 1 << 20][r.below(4) as usize],
                    [16, 256, 1 << 22][r.below(3) as usize],
                    false,
                ),
                1 => (1 << 62, [16, 256, 1 << 22][r.below(3) as usize], false),
                _ => (1 << 62, u64::MAX, true),
            };
            let args: Vec<V> = (0..PARAMS)
                .map(|_| {
                    let x = edge_int(&mut r, cap.min(1 << 22), huge);
                    // Beyond-the-machine caps with unbounded fuel get only sizes the system refuses, or
                    // small ones (never a few GiB the system would hand out and the fill would touch).
                    V::I64(if huge && x > 1 << 24 && x < 1 << 40 {
                        1 << 40
                    } else {
                        x
                    })
                })
                .collect();
            let lim = InvokeLimits {
                memory_bytes: cap,
                fuel,
                ..Default::default()
            };
            let inv = l.invoke_metered("main", &args, &lim);
            assert!(
                inv.memory_used <= cap,
                "seed {seed}: {} bytes charged under a cap of {cap}",
                inv.memory_used
            );
            let key = match &inv.result {
                Ok(_) => "returned".to_string(),
                Err(t) => {
                    assert!(
                        matches!(
                            t.kind,
                            TrapKind::OutOfMemory
                                | TrapKind::OutOfFuel
                                | TrapKind::OutOfBounds
                                | TrapKind::IntegerOverflow
                        ),
                        "seed {seed}: unexpected trap {t}"
                    );
                    if t.kind == TrapKind::OutOfMemory {
                        assert!(
                            t.message.contains("memory cap")
                                || t.message.contains("could not allocate"),
                            "seed {seed}: {t}"
                        );
                    }
                    format!("{:?}", t.kind)
                }
            };
            *outcomes.entry(key).or_default() += 1;
        }
    }
    // The fuzzer reaches every outcome it is meant to exercise (else it tests nothing).
    for k in ["returned", "OutOfMemory", "OutOfFuel", "OutOfBounds"] {
        assert!(outcomes.get(k).copied().unwrap_or(0) > 10, "{outcomes:?}");
    }
}
