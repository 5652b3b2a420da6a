//! Compiled programs in the VM: sandbox limits and results against independent Rust oracles.

use loom_compiler::{Catalog, Role};
use loom_vm::{InvokeLimits, LoadError, LoadLimits, Loaded, TrapKind, Value, Vm};
use std::sync::Arc;

fn all_role() -> Role {
    Role::new(
        "all",
        &[
            "prepare",
            "input",
            "options",
            "runner",
            "parameters",
            "test",
        ],
    )
}

fn program(src: &str) -> loom_ir::Program {
    let mut cat = Catalog::new();
    let (primary, _) = cat
        .add_source("prog.loom", src)
        .unwrap_or_else(|e| panic!("{e}"));
    loom_compiler::link(&cat, primary, &[], &all_role()).unwrap_or_else(|e| panic!("{e:?}"))
}

fn load(src: &str) -> Loaded {
    let test = Arc::new(loom_vm::testing::test_module(None));
    Vm::load(&program(src), &[test], &["test"], &LoadLimits::default())
        .unwrap_or_else(|e| panic!("{e}"))
}

const SANDBOX: &str = r#"
module @sandbox {
  export func @spin() -> i64 {
    %r = while iter(%x = 0 : i64) -> i64 {
      condition true
    } do {
      yield add.wrap(%x, 1)
    }
    return %r
  }

  export func @huge() -> i64 {
    %b = buffer.new 1099511627776
    return buffer.len(%b)
  }

  export func @grow(%n: i64) -> i64 {
    %t = for %i = 0 to %n iter(%acc = 0 : i64) -> i64 {
      %b = buffer.new 65536
      yield add(%acc, buffer.len(%b))
    }
    return %t
  }

  export func @deep(%n: i64) -> i64 {
    %r = call @deep(add(%n, 1))
    return %r
  }

  export func @oob(%i: i64) -> i32 {
    %b = buffer.new 16
    return buffer.load.i32(%b, %i)
  }
}
"#;

#[test]
fn endless_loop_runs_out_of_fuel_deterministically() {
    let vm = load(SANDBOX);
    let limits = InvokeLimits {
        fuel: 1_000_003,
        ..InvokeLimits::default()
    };
    let a = vm.invoke_metered("spin", &[], &limits);
    let b = vm.invoke_metered("spin", &[], &limits);
    let (ta, tb) = (
        a.result.expect_err("must trap"),
        b.result.expect_err("must trap"),
    );
    assert_eq!(ta.kind, TrapKind::OutOfFuel);
    assert_eq!(
        (ta.pc, ta.loc),
        (tb.pc, tb.loc),
        "same program and fuel must trap at the same point"
    );
    assert_eq!(
        a.fuel_used, 1_000_003,
        "the budget is spent exactly, never exceeded"
    );
    assert_eq!(ta.func, "sandbox.spin");
    assert!(ta.to_string().starts_with("prog.loom:"), "{ta}");
}

#[test]
fn oversized_allocation_traps_at_the_cap() {
    let vm = load(SANDBOX);
    let limits = InvokeLimits {
        memory_bytes: 1 << 20,
        ..InvokeLimits::default()
    };
    let t = vm
        .invoke("huge", &[], &limits)
        .expect_err("1 TiB cannot fit in 1 MiB");
    assert_eq!(t.kind, TrapKind::OutOfMemory);
    // 64 KiB buffers in a loop: 15 fit under 1 MiB with per-object overhead, 16 do not.
    let ok = vm
        .invoke("grow", &[Value::I64(15)], &limits)
        .expect("15 x 64 KiB fits");
    assert_eq!(ok, vec![Value::I64(15 * 65536)]);
    let t = vm
        .invoke("grow", &[Value::I64(1000)], &limits)
        .expect_err("1000 x 64 KiB does not");
    assert_eq!(t.kind, TrapKind::OutOfMemory);
}

#[test]
fn runaway_recursion_traps_at_the_depth_limit() {
    let vm = load(SANDBOX);
    let limits = InvokeLimits {
        call_depth: 1000,
        ..InvokeLimits::default()
    };
    let t = vm
        .invoke("deep", &[Value::I64(0)], &limits)
        .expect_err("unbounded recursion");
    assert_eq!(t.kind, TrapKind::CallDepth);
    // A very large limit still cannot overflow the host stack: Loom calls do not recurse in Rust.
    let limits = InvokeLimits {
        call_depth: 200_000,
        fuel: 10_000_000,
        ..InvokeLimits::default()
    };
    let t = vm
        .invoke("deep", &[Value::I64(0)], &limits)
        .expect_err("unbounded recursion");
    assert!(
        matches!(t.kind, TrapKind::CallDepth | TrapKind::OutOfFuel),
        "{t}"
    );
}

#[test]
fn out_of_bounds_access_is_a_trap_with_location() {
    let vm = load(SANDBOX);
    let t = vm
        .invoke("oob", &[Value::I64(13)], &InvokeLimits::default())
        .expect_err("13 + 4 > 16");
    assert_eq!(t.kind, TrapKind::OutOfBounds);
    assert!(
        t.to_string().contains("prog.loom:32:12: in @sandbox.oob"),
        "{t}"
    );
    let t = vm
        .invoke("oob", &[Value::I64(-1)], &InvokeLimits::default())
        .expect_err("negative offset");
    assert_eq!(t.kind, TrapKind::OutOfBounds);
    assert_eq!(
        vm.invoke("oob", &[Value::I64(12)], &InvokeLimits::default())
            .expect("in range"),
        vec![Value::I32(0)]
    );
}

#[test]
fn import_of_a_module_not_granted_is_rejected_at_load() {
    let src = r#"
module @needs.runner {
  func.decl @runner.flush(i64) -> i64 import("runner")
  export func @go(%x: i64) -> i64 {
    %r = call @runner.flush(%x)
    return %r
  }
}
"#;
    // Linked under a permissive role, then loaded for a role without `runner`: the VM refuses too.
    let runner = Arc::new(loom_vm::NativeModule::new("runner").func(
        "flush",
        loom_ir::Signature {
            params: vec![loom_ir::Type::I64],
            results: vec![loom_ir::Type::I64],
        },
        1,
        |_, a| Ok(a.to_vec()),
    ));
    let p = program(src);
    let err = Vm::load(
        &p,
        std::slice::from_ref(&runner),
        &["prepare", "input"],
        &LoadLimits::default(),
    )
    .expect_err("runner is not granted");
    assert!(matches!(err, LoadError::NotGranted { .. }), "{err}");
    assert!(err.to_string().contains("runner"), "{err}");
    let ok = Vm::load(&p, &[runner], &["runner"], &LoadLimits::default()).expect("granted");
    assert_eq!(
        ok.invoke("go", &[Value::I64(4)], &InvokeLimits::default())
            .expect("runs"),
        vec![Value::I64(4)]
    );
}

const ARITH: &str = r#"
module @oracle {
  type @Range = record { offset: i64, length: i64 }

  export func @collatz(%n: i64) -> i64 {
    %x, %steps = while iter(%v = %n : i64, %k = 0 : i64) -> (i64, i64) {
      condition cmp.gt(%v, 1)
    } do {
      %even = cmp.eq(rem(%v, 2), 0)
      %next = if %even -> i64 {
        yield div(%v, 2)
      } else {
        yield add(mul(%v, 3), 1)
      }
      yield %next, add(%k, 1)
    }
    return %steps
  }

  // Pack ranges of i32 ids into a zero-padded [count, T] matrix; also return the total of live lengths.
  export func @pack(%ranges: buffer, %count: i64, %ids: buffer, %t: i64) -> (buffer, i64) {
    %out = buffer.new mul(mul(%count, %t), 4)
    %total = for %r = 0 to %count iter(%acc = 0 : i64) -> i64 {
      %off = buffer.load.field %ranges, %r, @Range.offset
      %len = min(buffer.load.field(%ranges, %r, @Range.length), %t)
      for %j = 0 to %len {
        buffer.store.i32 %out, mul(add(mul(%r, %t), %j), 4), buffer.load.i32(%ids, mul(add(%off, %j), 4))
      }
      yield add(%acc, %len)
    }
    return %out, %total
  }

  export func @mix(%a: i64, %b: i32, %f: f64) -> (i64, i32, f64, i1) {
    %x = xor(shl(%a, 7), shr.u(%a, 3))
    %y = add.wrap(mul.wrap(%b, 31), trunc.i32(%a))
    %z = add(mul(%f, 0.5), conv.f64(%b))
    return %x, %y, %z, cmp.ult(%a, conv.i64(%b))
  }
}
"#;

/// A small deterministic generator, so failures reproduce.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 11
    }
}

#[test]
fn compiled_programs_match_rust_oracles() {
    let vm = load(ARITH);
    let lim = InvokeLimits::default();
    let mut rng = Lcg(42);
    for _ in 0..200 {
        let n = (rng.next() % 100_000 + 1) as i64;
        let mut v = n;
        let mut steps = 0i64;
        while v > 1 {
            v = if v % 2 == 0 { v / 2 } else { 3 * v + 1 };
            steps += 1;
        }
        assert_eq!(
            vm.invoke("collatz", &[Value::I64(n)], &lim).expect("runs"),
            vec![Value::I64(steps)],
            "n={n}"
        );

        let a = rng.next() as i64 - (1 << 52);
        let b = rng.next() as i32;
        let f = (rng.next() % 10_000) as f64 / 7.0;
        let want = vec![
            Value::I64((a << 7) ^ ((a as u64) >> 3) as i64),
            Value::I32(b.wrapping_mul(31).wrapping_add(a as i32)),
            Value::F64(f * 0.5 + b as f64),
            Value::I1((a as u64) < (b as i64 as u64)),
        ];
        assert_eq!(
            vm.invoke("mix", &[Value::I64(a), Value::I32(b), Value::F64(f)], &lim)
                .expect("runs"),
            want
        );
    }
    for _ in 0..50 {
        let count = (rng.next() % 9) as usize;
        let t = (rng.next() % 12 + 1) as usize;
        let lens: Vec<usize> = (0..count).map(|_| (rng.next() % 20) as usize).collect();
        let total_ids: usize = lens.iter().sum();
        let ids: Vec<i32> = (0..total_ids).map(|_| rng.next() as i32).collect();
        let mut ranges = Vec::new();
        let mut off = 0usize;
        for &l in &lens {
            ranges.extend((off as i64).to_le_bytes());
            ranges.extend((l as i64).to_le_bytes());
            off += l;
        }
        let mut want = vec![0u8; count * t * 4];
        let mut live = 0i64;
        let mut off = 0usize;
        for (r, &l) in lens.iter().enumerate() {
            for j in 0..l.min(t) {
                want[(r * t + j) * 4..][..4].copy_from_slice(&ids[off + j].to_le_bytes());
            }
            live += l.min(t) as i64;
            off += l;
        }
        let id_bytes: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
        let got = vm
            .invoke(
                "pack",
                &[
                    Value::buffer(ranges),
                    Value::I64(count as i64),
                    Value::buffer(id_bytes),
                    Value::I64(t as i64),
                ],
                &lim,
            )
            .expect("runs");
        assert_eq!(got, vec![Value::buffer(want), Value::I64(live)]);
    }
}
