//! The scheduler of one finite model: a thread that owns the waiting queue and runs cohorts. Everyone else
//! talks to it with [`Cmd`]s over a channel. How a cohort is formed is [`form_cohort`], a pure function.

use super::metrics::{Metrics, fold};
use super::service::{CohortCancel, Prepared, Reply, RequestCancel};
use super::{Limits, cohort};
use serve_runtime::model::Model;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Instant;

/// An admitted request waiting for a cohort.
pub(crate) struct Pending {
    pub(crate) prepared: Prepared,
    pub(crate) reply: Reply,
    pub(crate) cancelled: Arc<RequestCancel>,
    pub(crate) arrived: Instant,
}

/// What the scheduler is told.
pub(crate) enum Cmd {
    /// Queue an admitted request.
    Request(Pending),
    /// Finish everything accepted, then stop (and say so on the channel).
    Drain(mpsc::Sender<()>),
}

/// Forms the next cohort from `waiting` (oldest first): the oldest request, then every waiting request of the
/// same compatibility tag, oldest first, whose units still fit `limit` (a request that does not fit is
/// skipped, and a later smaller one may still join). The members leave `waiting`; the others keep their
/// order. `key` gives a request's (tag, units). Empty when nothing waits.
pub fn form_cohort<T>(
    waiting: &mut VecDeque<T>,
    limit: i64,
    key: impl Fn(&T) -> (i64, i64),
) -> Vec<T> {
    let Some(first) = waiting.pop_front() else {
        return Vec::new();
    };
    let (tag, mut units) = key(&first);
    let mut cohort = vec![first];
    let mut i = 0;
    while i < waiting.len() {
        let (t, u) = key(&waiting[i]);
        if t == tag && units + u <= limit {
            units += u;
            if let Some(p) = waiting.remove(i) {
                cohort.push(p);
            }
        } else {
            i += 1;
        }
    }
    cohort
}

/// The scheduler thread's loop: take every command that has arrived (never wait for more while requests
/// wait), drop cancelled waiting requests, run the next cohort (retrying each member alone when a cohort of
/// several fails), reply to each member. Ends after a drain once nothing waits, or when every sender is gone.
pub(crate) fn scheduler(
    model: Arc<Model>,
    limits: Limits,
    metrics: Arc<Metrics>,
    rx: mpsc::Receiver<Cmd>,
    exec: Arc<Mutex<()>>,
) {
    let mut waiting: VecDeque<Pending> = VecDeque::new();
    let mut drain: Option<mpsc::Sender<()>> = None;
    loop {
        if waiting.is_empty() {
            if let Some(d) = drain.take() {
                let _ = d.send(());
                return;
            }
            match rx.recv() {
                Ok(Cmd::Request(p)) => waiting.push_back(p),
                Ok(Cmd::Drain(d)) => drain = Some(d),
                Err(_) => return,
            }
        }
        // Take whatever else has already arrived; never wait for more.
        while let Ok(c) = rx.try_recv() {
            match c {
                Cmd::Request(p) => waiting.push_back(p),
                Cmd::Drain(d) => drain = Some(d),
            }
        }
        waiting.retain(|p| {
            let keep = !p.cancelled.is_cancelled();
            if !keep {
                metrics.queue.fetch_sub(1, Ordering::Relaxed);
                metrics.cancelled_waiting.fetch_add(1, Ordering::Relaxed);
            }
            keep
        });
        let cohort = form_cohort(&mut waiting, limits.batch_units, |p| {
            (p.prepared.tag, p.prepared.units)
        });
        if cohort.is_empty() {
            continue;
        }
        run(&model, &limits, &metrics, &exec, cohort);
    }
}

/// Runs one cohort and replies to its members.
fn run(model: &Model, limits: &Limits, metrics: &Metrics, exec: &Mutex<()>, cohort: Vec<Pending>) {
    metrics.queue.fetch_sub(cohort.len(), Ordering::Relaxed);
    let n = cohort.len() as u64;
    metrics.cohorts.fetch_add(1, Ordering::Relaxed);
    metrics.cohort_members.fetch_add(n, Ordering::Relaxed);
    metrics.cohort_max.fetch_max(n, Ordering::Relaxed);
    if n > 1 {
        metrics.cohorts_shared.fetch_add(1, Ordering::Relaxed);
    }
    let guard = exec.lock().unwrap_or_else(|e| e.into_inner());
    let t0 = Instant::now();
    // The cohort's cancellation: when every member's client is gone, its dispatches are stopped.
    let flag = model.device.cancel_flag().unwrap_or_else(|e| {
        log::warn!("model {}: no cancellation flag: {e}", model.name);
        None
    });
    let cc = Arc::new(CohortCancel::new(cohort.len(), flag));
    for p in &cohort {
        p.cancelled.join(&cc);
    }
    let members: Vec<&Prepared> = cohort.iter().map(|p| &p.prepared).collect();
    let results = match cohort::run_cohort(model, limits, &members, cc.flag.clone()) {
        Ok(r) => r.into_iter().map(Ok).collect::<Vec<_>>(),
        Err(e) if cc.all_gone() => {
            metrics.cancelled_running.fetch_add(n, Ordering::Relaxed);
            log::debug!(
                "model {}: cohort of {n} stopped: every client is gone ({e})",
                model.name
            );
            cohort.iter().map(|_| Err(e.clone())).collect()
        }
        Err(e) if cohort.len() > 1 => {
            log::debug!(
                "model {}: cohort of {n} failed ({e}); retrying each alone",
                model.name
            );
            metrics.retried_alone.fetch_add(n, Ordering::Relaxed);
            members
                .iter()
                .map(|m| {
                    cohort::run_cohort(model, limits, &[*m], cc.flag.clone())
                        .map(|mut r| r.remove(0))
                })
                .collect()
        }
        Err(e) => vec![Err(e)],
    };
    let took = t0.elapsed();
    drop(members);
    drop(guard);
    fold(&metrics.cohort_ns, took);
    metrics
        .device_ns
        .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    for (p, r) in cohort.into_iter().zip(results) {
        if r.is_err() {
            metrics.failed.fetch_add(1, Ordering::Relaxed);
        }
        let _ = p.arrived;
        (p.reply)(r);
    }
}

#[cfg(test)]
mod tests {
    use super::form_cohort;
    use std::collections::VecDeque;

    /// (id, tag, units)
    fn queue(items: &[(u32, i64, i64)]) -> VecDeque<(u32, i64, i64)> {
        items.iter().copied().collect()
    }

    fn ids(v: &[(u32, i64, i64)]) -> Vec<u32> {
        v.iter().map(|x| x.0).collect()
    }

    fn form(q: &mut VecDeque<(u32, i64, i64)>, limit: i64) -> Vec<u32> {
        ids(&form_cohort(q, limit, |x| (x.1, x.2)))
    }

    #[test]
    fn nothing_waiting_forms_nothing() {
        let mut q = queue(&[]);
        assert!(form(&mut q, 10).is_empty());
    }

    #[test]
    fn the_oldest_leads_and_compatible_requests_join_oldest_first() {
        let mut q = queue(&[(1, 0, 2), (2, 1, 2), (3, 0, 2), (4, 0, 2)]);
        assert_eq!(form(&mut q, 100), vec![1, 3, 4]);
        assert_eq!(ids(&q.iter().copied().collect::<Vec<_>>()), vec![2]);
        assert_eq!(form(&mut q, 100), vec![2]);
        assert!(q.is_empty());
    }

    #[test]
    fn units_bound_a_cohort_and_a_smaller_later_request_still_fits() {
        let mut q = queue(&[(1, 0, 5), (2, 0, 4), (3, 0, 2), (4, 0, 1)]);
        // 5 + 4 > 8: 2 is skipped; 5 + 2 + 1 = 8 fits.
        assert_eq!(form(&mut q, 8), vec![1, 3, 4]);
        assert_eq!(form(&mut q, 8), vec![2]);
    }

    #[test]
    fn a_request_over_the_limit_alone_still_forms_its_own_cohort() {
        // Admission refuses such requests; the scheduler never starves the head of the queue.
        let mut q = queue(&[(1, 0, 20), (2, 0, 1)]);
        assert_eq!(form(&mut q, 8), vec![1]);
        assert_eq!(form(&mut q, 8), vec![2]);
    }

    #[test]
    fn the_order_of_those_left_is_kept() {
        let mut q = queue(&[(1, 0, 1), (2, 1, 1), (3, 2, 1), (4, 1, 1), (5, 0, 1)]);
        assert_eq!(form(&mut q, 100), vec![1, 5]);
        assert_eq!(form(&mut q, 100), vec![2, 4]);
        assert_eq!(form(&mut q, 100), vec![3]);
    }
}
