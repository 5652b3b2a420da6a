//! Run-time bounds of dispatched kernels (issue 14): the step budget and cancellation, on the CPU JIT and on
//! the reference interpreter (which must give the same error for the same bounds), and compiled code freed
//! when its stage drops.

mod common;

use common::*;
use loom_ir::kernel::{ExecError, RunBounds, Stage};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

fn counted(grid: u64) -> Stage {
    one_kernel_stage(loom_testkit::corpus::counted_loop(grid))
}

fn trips(n: i64) -> Vec<Vec<u8>> {
    vec![n.to_le_bytes().to_vec()]
}

/// Runs `stage` on the JIT (1 and 2 threads) and the reference under `steps`; both results, which must agree.
fn both(stage: &Stage, inputs: &[Vec<u8>], steps: u64) -> Result<Vec<Vec<u8>>, ExecError> {
    let ins: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    let bounds = RunBounds {
        steps,
        cancel: None,
    };
    let mut want = loom_reference::alloc_outputs(stage).unwrap();
    let r = loom_reference::run_stage_bounded(stage, &ins, &[], &mut want, &bounds).map(|_| want);
    let cs = loom_cpu::compile_stage(stage).expect("compile");
    for threads in [1, 2] {
        let mut got = loom_reference::alloc_outputs(stage).unwrap();
        let g = cs
            .run_bounded(&ins, &[], &mut got, threads, &bounds)
            .map(|_| got);
        assert_eq!(g, r, "JIT ({threads} threads) and reference differ");
    }
    r
}

#[test]
fn a_dispatch_within_its_budget_runs_and_one_step_less_fails_on_both_backends() {
    let s = counted(4);
    // 4 instances of 1 + 100 steps each.
    let out = both(&s, &trips(100), 4 * 101).expect("within the budget");
    let ys: Vec<f32> = out[0]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(ys, [100.0; 4]);
    let e = both(&s, &trips(100), 4 * 101 - 1).unwrap_err();
    assert_eq!(
        e.to_string(),
        "kernel `count` of stage `s` exceeded its budget of 403 steps"
    );
    // No budget (0) runs it as before.
    both(&s, &trips(100), 0).expect("unbounded");
}

#[test]
fn a_runaway_loop_stops_at_its_budget_quickly() {
    let s = counted(2);
    let t0 = Instant::now();
    let e = both(&s, &trips(1 << 40), 1_000_000).unwrap_err();
    assert!(
        matches!(e, ExecError::BudgetExceeded { ref kernel, ref stage, budget: 1_000_000 } if kernel == "count" && stage == "s"),
        "{e}"
    );
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
}

#[test]
fn a_grid_larger_than_the_budget_fails_before_running() {
    // 2^40 instances would run for hours; the budget refuses the grid at once.
    let mut kb = loom_testkit::KB::new("wide", [1 << 40, 1, 1]);
    let _ = kb.pid(0);
    let s = one_kernel_stage(kb.finish());
    let t0 = Instant::now();
    let e = both(&s, &[], 1 << 30).unwrap_err();
    assert_eq!(
        e.to_string(),
        "kernel `wide` of stage `s` exceeded its budget of 1073741824 steps"
    );
    assert!(t0.elapsed() < Duration::from_secs(5));
}

/// Runs the runaway kernel unbounded on another thread, sets the flag after 200 ms and checks that the
/// dispatch returns `Cancelled` promptly.
fn cancel_stops(
    run: impl FnOnce(&Stage, &[&[u8]], &RunBounds<'_>) -> Result<(), ExecError> + Send,
) {
    let s = counted(3);
    let n = trips(1 << 50);
    let flag = AtomicU32::new(0);
    std::thread::scope(|sc| {
        let h = sc.spawn(|| {
            let ins: Vec<&[u8]> = n.iter().map(|v| v.as_slice()).collect();
            let bounds = RunBounds {
                steps: 0,
                cancel: Some(&flag),
            };
            let t = Instant::now();
            (run(&s, &ins, &bounds), t)
        });
        std::thread::sleep(Duration::from_millis(200));
        let set = Instant::now();
        flag.store(1, Ordering::Relaxed);
        let (r, _) = h.join().unwrap();
        let stopped = set.elapsed();
        let e = r.unwrap_err();
        assert_eq!(e.to_string(), "kernel `count` of stage `s` was cancelled");
        assert!(stopped < Duration::from_secs(2), "took {stopped:?}");
    });
}

#[test]
fn cancellation_reaches_a_running_jit_kernel() {
    let cs = loom_cpu::compile_stage(&counted(3)).unwrap();
    for threads in [1, 2] {
        cancel_stops(|s, ins, b| {
            let mut out = loom_reference::alloc_outputs(s).unwrap();
            cs.run_bounded(ins, &[], &mut out, threads, b)
        });
    }
}

#[test]
fn cancellation_reaches_a_running_reference_kernel() {
    cancel_stops(|s, ins, b| {
        let mut out = loom_reference::alloc_outputs(s).unwrap();
        loom_reference::run_stage_bounded(s, ins, &[], &mut out, b)
    });
}

fn executable_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split_whitespace().nth(1).is_some_and(|p| p.contains('x')))
        .count()
}

#[test]
fn compiled_code_is_freed_when_its_stage_drops() {
    let s = counted(2);
    // Warm up (lazy statics, the first module's helper tables).
    drop(loom_cpu::compile_stage(&s).unwrap());
    let (modules, maps) = (loom_cpu::live_code_modules(), executable_mappings());
    let kept: Vec<_> = (0..20)
        .map(|_| loom_cpu::compile_stage(&s).unwrap())
        .collect();
    // At least the 20 held here (not `modules + 20`: other tests of this binary free theirs meanwhile).
    assert!(loom_cpu::live_code_modules() >= 20);
    drop(kept);
    for _ in 0..50 {
        drop(loom_cpu::compile_stage(&s).unwrap());
    }
    // Other tests of this binary compile concurrently: the module count is process-wide, so compare only
    // what this test can see settle.
    let deadline = Instant::now() + Duration::from_secs(10);
    while loom_cpu::live_code_modules() > modules && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(loom_cpu::live_code_modules() <= modules);
    assert!(
        executable_mappings() <= maps + 4,
        "executable mappings grew from {maps} to {}",
        executable_mappings()
    );
}

/// Resident plus mapped-but-untouched data of this process (`VmData`, KiB): JIT memory comes from page-aligned
/// allocations.
fn vm_data_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmData:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_failed_compile_frees_the_code_it_had_defined() {
    // The first kernel lowers (its code is defined in the module), the second is malformed (an empty region).
    let good = loom_testkit::corpus::counted_loop(2);
    let mut bad = good.clone();
    bad.name = "bad".into();
    bad.body = loom_ir::kernel::KRegion { ops: vec![] };
    let mut s = counted(2);
    s.kernels.push(bad);
    assert!(loom_cpu::compile_stage(&s).is_err());
    let before = vm_data_kib();
    for _ in 0..2000 {
        assert!(loom_cpu::compile_stage(&s).is_err());
    }
    let after = vm_data_kib();
    eprintln!("VmData {before} -> {after} KiB over 2000 failed compiles");
    // VmData is the whole process's: the other tests of this binary run in threads beside this one and move it
    // by a few MB. Leaking the code grew it by ~22 MB over these 2000 compiles.
    assert!(
        after <= before + 12288,
        "VmData grew from {before} to {after} KiB over 2000 failed compiles"
    );
}
