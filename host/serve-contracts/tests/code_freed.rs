//! Compiled code is freed on unregister (issue 14 item 6): registering and unregistering a package many times
//! returns the process to its count of live JIT modules and executable mappings, and resident memory stays
//! bounded. Its tests run one at a time and alone in their test binary, so that nothing else compiles stages
//! meanwhile.

use hal_cpu as _;
use loom_plugin_api::records;
use serve_contracts::finite::FiniteService;
use serve_runtime::device::{BuiltinHal, Devices};
use serve_runtime::model::Overrides;
use serve_runtime::package::{OperatorLimits, PackageFiles};
use serve_runtime::registry::Registry;
use std::path::Path;
use std::sync::{Arc, mpsc};

fn executable_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split_whitespace().nth(1).is_some_and(|p| p.contains('x')))
        .count()
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Registers and unregisters `package` (under `packages/`) `n` times after a warm-up of 3, each time serving
/// one request; returns (live JIT modules, executable mappings, RSS KiB) before and after.
fn cycles(package: &str, n: i64) -> ((usize, usize, u64), (usize, usize, u64)) {
    // The counts are process-wide: one package's cycles at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cpu = BuiltinHal {
        id: hal_cpu::PLUGIN_ID.into(),
        backend: "cpu".into(),
        driver: hal_cpu::driver(),
        open_with_files: hal_cpu::open_with_files,
        open_parts: Some(hal_cpu::open_parts),
    };
    let (devices, _) = Devices::open(&[], &[cpu]);
    let packages = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../packages")
        .canonicalize()
        .unwrap();
    let reg =
        Registry::new(Arc::new(devices), serve_contracts::builtin()).with_limits(OperatorLimits {
            package_roots: vec![packages.clone()],
            ..OperatorLimits::default()
        });
    let cycle = |i: i64| {
        reg.register(
            "cycle",
            PackageFiles::Dir(packages.join(package)),
            Overrides::default(),
        )
        .unwrap();
        // One request, so that request-time stages (the specialization cache) are compiled too.
        let svc = reg
            .service("cycle")
            .unwrap()
            .as_any()
            .downcast::<FiniteService>()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        svc.submit(
            records::ids_record([i, i + 1, i + 2]).unwrap(),
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        )
        .unwrap();
        rx.recv().unwrap().unwrap();
        drop(svc);
        reg.unregister("cycle").unwrap();
    };
    // Warm-up: lazily built tables, thread pools and allocator arenas.
    for i in 0..3 {
        cycle(i);
    }
    let (modules, maps, rss) = (
        loom_cpu::live_code_modules(),
        executable_mappings(),
        rss_kib(),
    );
    for i in 0..n {
        cycle(i);
    }
    let after = (
        loom_cpu::live_code_modules(),
        executable_mappings(),
        rss_kib(),
    );
    ((modules, maps, rss), after)
}

#[test]
fn register_unregister_cycles_free_compiled_code() {
    let n = 60;
    let ((modules, maps, rss), (modules2, maps2, rss2)) = cycles("arith-embed", n);
    eprintln!(
        "{n} cycles: live JIT modules {modules} -> {modules2}, executable mappings {maps} -> {maps2}, \
         RSS {rss} -> {rss2} KiB"
    );
    assert_eq!(modules2, modules, "every compiled stage is freed");
    assert!(
        maps2 <= maps + 2,
        "executable mappings grew from {maps} to {maps2} over {n} cycles"
    );
    // Before, each cycle kept its code (one executable mapping and ~0.6 MB per MiniLM cycle).
    assert!(
        rss2 <= rss + 8 * 1024,
        "RSS grew from {rss} to {rss2} KiB over {n} cycles"
    );
}

/// The case: all-MiniLM-L6-v2 (its weights are in `packages/minilm/model/`, fetched by
/// `scripts/fetch-models.sh`), which kept one executable mapping and ~0.6 MB per cycle. `LOOM_CYCLES=100` runs
/// the 100 cycles (about 1.5 minutes; 2026-12-03: JIT modules 0 -> 0, executable mappings 7 -> 7, RSS
/// 47696 -> 46368 KiB).
#[test]
fn minilm_register_unregister_cycles_free_compiled_code() {
    let n = std::env::var("LOOM_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let ((modules, maps, rss), (modules2, maps2, rss2)) = cycles("minilm", n);
    eprintln!(
        "MiniLM, {n} cycles: live JIT modules {modules} -> {modules2}, executable mappings {maps} -> {maps2}, \
         RSS {rss} -> {rss2} KiB"
    );
    assert_eq!(modules2, modules, "every compiled stage is freed");
    assert!(
        maps2 <= maps + 2,
        "executable mappings grew from {maps} to {maps2}"
    );
    assert!(
        rss2 <= rss + 4 * 1024,
        "RSS grew from {rss} to {rss2} KiB over {n} cycles"
    );
}
