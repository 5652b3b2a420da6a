//! Returning freed memory to the system after bursts.
//!
//! Device buffers on the CPU are ordinary heap allocations. glibc's allocator keeps what a burst of large
//! cohorts freed (its mmap threshold grows with the sizes it sees, so large buffers end up in arenas that it
//! does not shrink on its own): measured on MiniLM, a 64-client burst left the server at 1.2 GiB resident,
//! with 90 MB of buffers alive. Forcing every large buffer through mmap instead returns the memory but made
//! the burst 30 % slower (fresh pages fault in on every cohort). So: the HAL reports the bytes it frees
//! ([`note_freed`]); once more than [`TRIM_AFTER_BYTES`] were freed, a background thread waits until frees
//! have been quiet for [`QUIET`] and then asks the allocator to give its free pages back (`malloc_trim`), off
//! every hot path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

/// Freed bytes after which a trim is considered.
pub const TRIM_AFTER_BYTES: u64 = 64 << 20;
/// How long frees must pause before the trim runs.
pub const QUIET: Duration = Duration::from_secs(2);

static FREED: AtomicU64 = AtomicU64::new(0);
static GENERATION: AtomicU64 = AtomicU64::new(0);
static TRIMS: AtomicU64 = AtomicU64::new(0);

struct Trimmer {
    wake: Mutex<bool>,
    cv: Condvar,
}

fn trimmer() -> &'static Trimmer {
    static T: OnceLock<&'static Trimmer> = OnceLock::new();
    T.get_or_init(|| {
        let t: &'static Trimmer = Box::leak(Box::new(Trimmer {
            wake: Mutex::new(false),
            cv: Condvar::new(),
        }));
        let spawned = std::thread::Builder::new()
            .name("loom-trim".into())
            .spawn(move || run(t));
        if spawned.is_err() {
            // Without the thread nothing is trimmed; memory is still correct, only retained.
            FREED.store(0, Ordering::Relaxed);
        }
        t
    })
}

fn run(t: &'static Trimmer) {
    loop {
        {
            let mut w = t.wake.lock().unwrap_or_else(|e| e.into_inner());
            while !*w {
                w = t.cv.wait(w).unwrap_or_else(|e| e.into_inner());
            }
            *w = false;
        }
        // Wait for the burst to end: no free for QUIET.
        loop {
            let g = GENERATION.load(Ordering::Relaxed);
            std::thread::sleep(QUIET);
            if GENERATION.load(Ordering::Relaxed) == g {
                break;
            }
        }
        FREED.store(0, Ordering::Relaxed);
        release_free_memory();
        TRIMS.fetch_add(1, Ordering::Relaxed);
    }
}

/// Records that `bytes` of buffer memory were freed (called by the CPU HAL's `free`); cheap: two atomic adds,
/// and a wake-up of the trim thread once the threshold is crossed.
pub fn note_freed(bytes: u64) {
    if !enabled() {
        return;
    }
    GENERATION.fetch_add(1, Ordering::Relaxed);
    let before = FREED.fetch_add(bytes, Ordering::Relaxed);
    if before < TRIM_AFTER_BYTES && before + bytes >= TRIM_AFTER_BYTES {
        let t = trimmer();
        *t.wake.lock().unwrap_or_else(|e| e.into_inner()) = true;
        t.cv.notify_one();
    }
}

/// Trimming is on unless the environment sets `LOOM_TRIM=0` (read once).
fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("LOOM_TRIM").map_or(true, |v| v != "0"))
}

/// How many trims have run (for tests and logs).
pub fn trims() -> u64 {
    TRIMS.load(Ordering::Relaxed)
}

/// Asks the allocator to return free memory to the system now.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: glibc's `malloc_trim` takes no pointers and only rearranges the allocator's own free
        // lists (it is thread-safe: it locks each arena in turn); any `pad` value is valid.
        unsafe {
            malloc_trim(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_frees_is_trimmed_once_it_goes_quiet() {
        let before = trims();
        for _ in 0..8 {
            // Allocate and drop real memory, reporting it as the HAL does.
            let v = vec![1u8; 16 << 20];
            drop(std::hint::black_box(v));
            note_freed(16 << 20);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while trims() == before && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(trims() > before, "the trim thread ran after the burst");
    }
}
