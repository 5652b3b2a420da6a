//! `LOOM_CPU_TIMING=N`: wall time per dispatch, summed by kernel and path, printed to stderr every `N` stage
//! runs (a diagnostic for finding where an epoch's time goes; off by default, one cached branch a dispatch).
//! Kernel names and counts are the package's own; nothing else is printed.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

#[derive(Default)]
struct Sums {
    /// How many stage runs one printed summary covers.
    every: u64,
    runs: u64,
    stage_ns: u64,
    /// (kernel name without its specialisation, path, grid) -> (dispatches, nanoseconds).
    by: HashMap<(String, &'static str, [u64; 3]), (u64, u64)>,
}

fn sums() -> Option<&'static Mutex<Sums>> {
    static ON: OnceLock<Option<Mutex<Sums>>> = OnceLock::new();
    ON.get_or_init(|| {
        let every = std::env::var("LOOM_CPU_TIMING").ok()?.parse::<u64>().ok()?;
        (every > 0).then(|| {
            Mutex::new(Sums {
                every,
                ..Sums::default()
            })
        })
    })
    .as_ref()
}

/// Whether timing is on.
pub(crate) fn on() -> bool {
    sums().is_some()
}

/// One dispatch of `kernel` on `path` over `grid` took `ns`.
pub(crate) fn dispatch(kernel: &str, path: &'static str, grid: [u64; 3], ns: u64) {
    if let Some(s) = sums() {
        let mut s = s.lock().unwrap_or_else(|e| e.into_inner());
        // Kernels specialised per layer (`LI=3`) share a line: the name up to its specialisation.
        let base = kernel.split('<').next().unwrap_or(kernel);
        let e = s.by.entry((base.to_string(), path, grid)).or_default();
        e.0 += 1;
        e.1 += ns;
    }
}

/// One run of stage `name` took `ns`; every `every` runs the summary is printed and reset.
pub(crate) fn stage(name: &str, ns: u64) {
    let Some(s) = sums() else { return };
    let mut s = s.lock().unwrap_or_else(|e| e.into_inner());
    s.runs += 1;
    s.stage_ns += ns;
    if s.runs < s.every {
        return;
    }
    let runs = s.runs as f64;
    let total = s.stage_ns as f64;
    let mut rows: Vec<_> = s.by.drain().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1.1));
    let mut out = format!(
        "loom-cpu timing: {} stage runs (last: {name}), {:.1} us a run\n",
        s.runs,
        total / runs / 1e3
    );
    let mut covered = 0u64;
    for ((k, path, g), (n, ns)) in rows {
        covered += ns;
        out.push_str(&format!(
            "  {:>5.1} %  {:>9.1} us/run  {:>6.1} us/dispatch  {:>5} dispatches/run  {k} [{path}] grid {g:?}\n",
            100.0 * ns as f64 / total,
            ns as f64 / runs / 1e3,
            ns as f64 / n as f64 / 1e3,
            n as f64 / runs,
        ));
    }
    out.push_str(&format!(
        "  {:>5.1} %  between dispatches\n",
        100.0 * (total - covered as f64) / total
    ));
    eprint!("{out}");
    s.runs = 0;
    s.stage_ns = 0;
}

/// A stage was compiled: its kernels' compile times (name, path, time), the slowest first, and the total.
pub(crate) fn compiled(stage: &str, kernels: &[crate::KernelReport], total: std::time::Duration) {
    if sums().is_none() {
        return;
    }
    let mut rows: Vec<&crate::KernelReport> = kernels.iter().collect();
    rows.sort_by_key(|k| std::cmp::Reverse(k.compile_time));
    let mut out = format!(
        "loom-cpu compile: stage {stage}, {} kernels in {:.1} ms\n",
        kernels.len(),
        total.as_secs_f64() * 1e3
    );
    for k in rows {
        out.push_str(&format!(
            "  {:>7.1} ms  {} [{}]\n",
            k.compile_time.as_secs_f64() * 1e3,
            k.name,
            k.path
        ));
    }
    eprint!("{out}");
}
