//! A persistent worker pool for grid and microkernel parallelism.
//!
//! Spawning scoped threads per dispatch cost 20-60 us per thread on this machine class, more than a small stage
//! runs for (a BERT layer at batch 1 issues a dozen dispatches). [`run`] hands indices `0..n` to the calling
//! thread and to parked workers that live for the process; the caller takes part, so a dispatch on two cores
//! wakes one worker and does half the work itself.
//!
//! # Protocol
//!
//! * A job is the caller's closure, its index count, a claim counter and a completion counter. The caller
//!   publishes it (one queue entry per helper wanted), then claims indices itself until none are left, then
//!   waits until every claimed index has *finished*.
//! * A worker pops an entry and claims indices from that job until the claim counter passes `n`. It calls the
//!   closure only for indices it claimed below `n`, so once the completion counter reaches `n` no worker will
//!   touch the closure again: it may hold the job's `Arc` a little longer, but never dereferences the closure
//!   after that point. That is what makes lending a stack closure to other threads sound.
//! * A panic in the closure is caught where it happens and re-raised on the caller after the job completes.
//! * Workers spin briefly after finishing (back-to-back dispatches are common), then park on a condvar.
//!
//! Several callers (two device queues, two models) may run jobs at once; entries are served in FIFO order and
//! every caller also works on its own job, so a job always makes progress even when all workers are busy.
//!
//! **Idle prefetch.** A caller may name a range of memory that the next parallel job will read ([`prefetch`]:
//! the next quantised product's weights, while a norm or attention kernel runs). Threads that would otherwise
//! spin (a worker between jobs, a caller waiting for its helpers) bring it into their caches a chunk at a time,
//! checking for work between chunks, so a core the current kernel leaves idle streams the next product's
//! weights instead of waiting. Prefetches never fault and change no memory, so a stale or freed range costs
//! only bandwidth.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

type Panic = Box<dyn std::any::Any + Send>;

/// The caller's closure with its lifetime erased; see the module doc for why it is never used after the job
/// completes.
#[derive(Clone, Copy)]
struct Body(*const (dyn Fn(usize) + Sync));
// SAFETY: the closure is `Sync`, so calling it from several threads through a shared pointer is allowed; the
// pointer itself is only dereferenced while the caller keeps the closure alive (module doc).
unsafe impl Send for Body {}
unsafe impl Sync for Body {}

struct Job {
    body: Body,
    n: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    panic: Mutex<Option<Panic>>,
    finished: Mutex<bool>,
    cv: Condvar,
}

impl Job {
    /// Claims and runs indices until none are left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n {
                return;
            }
            {
                // SAFETY: `i < n` was claimed by this thread and has not finished, so the caller is still
                // waiting in `run` and the closure is alive. The reference does not outlive this block, which
                // ends before the completion counter below counts `i` as finished.
                let f = unsafe { &*self.body.0 };
                if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(i))) {
                    let mut slot = self.panic.lock().unwrap_or_else(|e| e.into_inner());
                    slot.get_or_insert(p);
                }
            }
            // Release: the closure's effects happen before the caller observes completion (the increments
            // form one release sequence, so the caller's acquire load of `n` sees every index's effects).
            if self.done.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
                let mut g = self.finished.lock().unwrap_or_else(|e| e.into_inner());
                *g = true;
                self.cv.notify_all();
            }
        }
    }
}

struct Pool {
    queue: Mutex<VecDeque<Arc<Job>>>,
    /// The queue's length, kept under the queue lock but readable without it (spinning workers poll this
    /// instead of taking the lock in a loop).
    pending: AtomicUsize,
    cv: Condvar,
    workers: usize,
}

static POOL: OnceLock<Arc<Pool>> = OnceLock::new();

/// How long a worker spins for more work before parking (and the caller for its helpers before it parks). A
/// decode epoch runs single-threaded kernels (norms, one-row attention) of tens of microseconds between its
/// parallel ones; at 50 us the worker often parked in between and the next parallel kernel waited for its wake
/// (SmolLM2 decode 40-45 tok/s; 46-53 at 250 us, no better at 1 ms; BENCHMARKS.md). Spinning yields the core
/// each round, so other runnable threads are not held up.
const SPIN: Duration = Duration::from_micros(250);

/// Bytes one idle thread prefetches before it looks for work again (64 lines: about 0.3-0.5 us at the
/// bandwidth one core draws).
const PREFETCH_CHUNK: usize = 4096;

/// At most this many bytes of one [`prefetch`] range are fetched (the rest is left to the reading job).
const PREFETCH_MAX: usize = 1 << 20;

/// The range idle threads prefetch: `cursor` (the next byte nobody has claimed) to `end`; `end` 0 is none.
/// The two words are set one after the other, so a thread may claim from a cursor and end of two different
/// ranges: claims past `PREFETCH_MAX` from the end are refused, which bounds what such a mix can fetch.
static PREFETCH_CURSOR: AtomicUsize = AtomicUsize::new(0);
static PREFETCH_END: AtomicUsize = AtomicUsize::new(0);
/// The start of the range last named (so that naming it again, from the next kernel before the same product,
/// does not start it over).
static PREFETCH_START: AtomicUsize = AtomicUsize::new(0);

/// Asks idle pool threads to bring `len` bytes from `ptr` (at most [`PREFETCH_MAX`]) into their caches, in
/// order, until the range is done or replaced. Any address is allowed: a prefetch never faults.
pub(crate) fn prefetch(ptr: *const u8, len: usize) {
    let start = ptr as usize;
    if PREFETCH_START.swap(start, Ordering::Relaxed) == start
        && PREFETCH_END.load(Ordering::Relaxed) != 0
    {
        return;
    }
    PREFETCH_END.store(0, Ordering::Relaxed);
    PREFETCH_CURSOR.store(start, Ordering::Relaxed);
    PREFETCH_END.store(
        start.saturating_add(len.min(PREFETCH_MAX)),
        Ordering::Relaxed,
    );
}

/// Withdraws the current [`prefetch`] range (its reader has started).
pub(crate) fn prefetch_stop() {
    PREFETCH_END.store(0, Ordering::Relaxed);
}

/// Prefetches one chunk of the current range, if any is left; whether it did.
fn prefetch_some() -> bool {
    let end = PREFETCH_END.load(Ordering::Relaxed);
    if end == 0 || PREFETCH_CURSOR.load(Ordering::Relaxed) >= end {
        return false;
    }
    let at = PREFETCH_CURSOR.fetch_add(PREFETCH_CHUNK, Ordering::Relaxed);
    if at >= end || end - at > PREFETCH_MAX {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let stop = at.saturating_add(PREFETCH_CHUNK).min(end);
        let mut a = at;
        while a < stop {
            // SAFETY: a prefetch reads nothing the program can observe and does not fault on any address.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                    a as *const i8,
                )
            };
            let Some(next) = a.checked_add(64) else { break };
            a = next;
        }
    }
    true
}

fn pool() -> &'static Arc<Pool> {
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        // The caller is one of the threads; at most 63 helpers.
        let workers = cores.saturating_sub(1).clamp(1, 63);
        let p = Arc::new(Pool {
            queue: Mutex::new(VecDeque::new()),
            pending: AtomicUsize::new(0),
            cv: Condvar::new(),
            workers,
        });
        for w in 0..workers {
            let p = p.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("loom-cpu-{w}"))
                .spawn(move || worker(&p));
            // A worker that cannot start only costs parallelism: callers claim every index themselves.
            drop(spawned);
        }
        p
    })
}

fn worker(p: &Pool) {
    loop {
        let job = {
            let mut q = p.queue.lock().unwrap_or_else(|e| e.into_inner());
            let mut idle_since: Option<Instant> = None;
            loop {
                if let Some(j) = q.pop_front() {
                    p.pending.store(q.len(), Ordering::Relaxed);
                    break j;
                }
                // Spin (lock released, polling `pending`) for a moment, then park.
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() < SPIN {
                    drop(q);
                    while p.pending.load(Ordering::Relaxed) == 0 && since.elapsed() < SPIN {
                        if !prefetch_some() {
                            std::hint::spin_loop();
                            std::thread::yield_now();
                        }
                    }
                    q = p.queue.lock().unwrap_or_else(|e| e.into_inner());
                } else {
                    q = p.cv.wait(q).unwrap_or_else(|e| e.into_inner());
                    idle_since = None;
                }
            }
        };
        job.work();
    }
}

/// The number of threads [`run`] can use at once (workers plus the caller).
pub fn threads() -> usize {
    pool().workers + 1
}

/// Calls `f(i)` for every `i` in `0..n`, spread over the calling thread and up to `helpers` pool workers, and
/// returns when all calls have finished. A panic in `f` is re-raised here after the others finish.
pub fn run(n: usize, helpers: usize, f: &(dyn Fn(usize) + Sync)) {
    let helpers = helpers.min(n.saturating_sub(1));
    if helpers == 0 {
        for i in 0..n {
            f(i);
        }
        return;
    }
    let p = pool();
    let helpers = helpers.min(p.workers);
    // SAFETY (lifetime erasure): see the module doc; `run` does not return before `done == n`, after which the
    // pointer is never dereferenced.
    let body = Body(unsafe {
        std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const (dyn Fn(usize) + Sync)>(
            f as *const _,
        )
    });
    let job = Arc::new(Job {
        body,
        n,
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        panic: Mutex::new(None),
        finished: Mutex::new(false),
        cv: Condvar::new(),
    });
    {
        let mut q = p.queue.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..helpers {
            q.push_back(job.clone());
        }
        p.pending.store(q.len(), Ordering::Relaxed);
    }
    if helpers == 1 {
        p.cv.notify_one();
    } else {
        p.cv.notify_all();
    }
    job.work();
    // Wait for indices other threads claimed: spin a little (they are usually nearly done), then park.
    let t0 = Instant::now();
    while job.done.load(Ordering::Acquire) < n {
        if t0.elapsed() < SPIN {
            if !prefetch_some() {
                std::hint::spin_loop();
            }
            continue;
        }
        let mut g = job.finished.lock().unwrap_or_else(|e| e.into_inner());
        while !*g {
            g = job.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        break;
    }
    // Entries nobody popped (the caller finished everything first) would only be popped and dropped later;
    // take them out now so workers do not wake for nothing.
    {
        let mut q = p.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.retain(|j| !Arc::ptr_eq(j, &job));
        p.pending.store(q.len(), Ordering::Relaxed);
    }
    let panic = job.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(p) = panic {
        resume_unwind(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_runs_exactly_once() {
        for n in [0, 1, 2, 3, 17, 1000] {
            for helpers in [0, 1, 2, 8] {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                run(n, helpers, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "n={n} helpers={helpers}"
                );
            }
        }
    }

    #[test]
    fn concurrent_callers_and_borrowed_state() {
        std::thread::scope(|s| {
            for t in 0..4 {
                s.spawn(move || {
                    for round in 0..200 {
                        let mut out = vec![0usize; 64];
                        let cells: Vec<Mutex<&mut usize>> =
                            out.iter_mut().map(Mutex::new).collect();
                        run(64, 3, &|i| {
                            **cells[i].lock().unwrap() = i * t + round;
                        });
                        drop(cells);
                        assert!(out.iter().enumerate().all(|(i, v)| *v == i * t + round));
                    }
                });
            }
        });
    }

    #[test]
    fn prefetch_ranges_at_any_address_are_harmless() {
        // Unmapped memory, a freed buffer, ranges at the end of the address space, then a live one: idle
        // threads prefetch from each while jobs run, and the jobs see nothing of it.
        let freed = vec![7u8; 1 << 16];
        let freed_at = freed.as_ptr();
        drop(freed);
        let live = vec![1u32; 1 << 16];
        for (ptr, len) in [
            (std::ptr::null::<u8>(), 1 << 20),
            (freed_at, 1 << 16),
            (usize::MAX as *const u8, 1 << 20),
            ((usize::MAX - 100) as *const u8, 1 << 20),
            (live.as_ptr() as *const u8, 4 << 16),
        ] {
            prefetch(ptr, len);
            for _ in 0..20 {
                let sum = AtomicUsize::new(0);
                run(64, 2, &|i| {
                    sum.fetch_add(live[i] as usize + i, Ordering::Relaxed);
                });
                assert_eq!(sum.load(Ordering::Relaxed), 64 + 63 * 64 / 2);
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        prefetch_stop();
        assert!(!prefetch_some());
    }

    #[test]
    fn a_panic_reaches_the_caller_after_the_others_finish() {
        let hits = AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            run(32, 2, &|i| {
                hits.fetch_add(1, Ordering::Relaxed);
                assert!(i != 7, "index 7 fails");
            })
        }));
        assert!(r.is_err());
        assert_eq!(hits.load(Ordering::Relaxed), 32);
        // The pool still works afterwards.
        let sum = AtomicUsize::new(0);
        run(10, 2, &|i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 45);
    }
}
