//! The finite contract's counters and the Prometheus series they export.

use serve_runtime::contract::Series;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Counters the HTTP layer exports as Prometheus metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub failed: AtomicU64,
    pub refused: AtomicU64,
    pub cancelled_waiting: AtomicU64,
    /// Requests whose running cohort was stopped because every member's client was gone.
    pub cancelled_running: AtomicU64,
    pub cohorts: AtomicU64,
    pub cohort_members: AtomicU64,
    pub cohort_max: AtomicU64,
    pub cohorts_shared: AtomicU64,
    pub retried_alone: AtomicU64,
    pub device_ns: AtomicU64,
    pub queue: AtomicUsize,
    /// Requests taken off the queue into a cohort and not yet answered (or a lone request run in place).
    pub running: AtomicUsize,
    /// A moving average of `prepare_request`'s wall time (ns), for [`FiniteService::admits_inline`].
    pub admit_ns: AtomicU64,
    /// A moving average of a cohort's wall time (ns), for [`FiniteService::submit_one`].
    pub cohort_ns: AtomicU64,
    /// Cohorts run in place by the submitting thread (a subset of `cohorts`).
    pub cohorts_in_place: AtomicU64,
    /// Cohorts parked while their declarations are specialized.
    pub specializing: AtomicUsize,
    /// The most cohorts submitted and not yet collected at once (pipelining).
    pub in_flight_max: AtomicU64,
    /// A consumer's requests being run by its upstream model (not yet on its own queue).
    pub upstream: AtomicUsize,
    /// A producer's request results left on the device for a consumer model (never downloaded).
    pub device_results: AtomicU64,
    /// Result bytes downloaded from the device for HTTP replies (the compact live prefixes).
    pub download_bytes: AtomicU64,
    /// Cohorts whose prepared working set did not fit the budget, formed again with half their members.
    pub cohorts_split: AtomicU64,
    /// Cohorts that waited for the model's other cohorts to free budget before being submitted.
    pub waited_for_memory: AtomicU64,
}

impl Metrics {
    /// The series the metrics route exports for this model (per-model labels are the exporter's).
    pub fn series(&self) -> Vec<Series> {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let s = Series::sample;
        vec![
            s(
                "loom_requests_total",
                "finite requests submitted",
                "counter",
                get(&self.requests),
            ),
            s(
                "loom_requests_failed_total",
                "finite requests that failed",
                "counter",
                get(&self.failed),
            ),
            s(
                "loom_admission_refusals_total",
                "requests refused because the queue was full",
                "counter",
                get(&self.refused),
            ),
            s(
                "loom_cancelled_waiting_total",
                "requests cancelled before joining a cohort",
                "counter",
                get(&self.cancelled_waiting),
            ),
            s(
                "loom_cancelled_running_total",
                "requests whose running cohort was stopped because every client was gone",
                "counter",
                get(&self.cancelled_running),
            ),
            s(
                "loom_cohorts_total",
                "cohorts executed",
                "counter",
                get(&self.cohorts),
            ),
            s(
                "loom_cohort_members_total",
                "requests executed in cohorts",
                "counter",
                get(&self.cohort_members),
            ),
            s(
                "loom_cohorts_shared_total",
                "cohorts with more than one request",
                "counter",
                get(&self.cohorts_shared),
            ),
            s(
                "loom_cohorts_in_place_total",
                "cohorts run on the submitting thread (a lone request, quick cohorts, nothing waiting)",
                "counter",
                get(&self.cohorts_in_place),
            ),
            s(
                "loom_cohort_max_members",
                "largest cohort so far",
                "gauge",
                get(&self.cohort_max),
            ),
            s(
                "loom_retried_alone_total",
                "members of failed cohorts retried alone",
                "counter",
                get(&self.retried_alone),
            ),
            s(
                "loom_queue_depth",
                "requests waiting for a cohort",
                "gauge",
                self.queue.load(Ordering::Relaxed) as f64,
            ),
            s(
                "loom_requests_running",
                "requests in a cohort being executed, not yet answered",
                "gauge",
                self.running.load(Ordering::Relaxed) as f64,
            ),
            s(
                "loom_cohorts_specializing",
                "cohorts waiting for their request-time stages to compile",
                "gauge",
                self.specializing.load(Ordering::Relaxed) as f64,
            ),
            s(
                "loom_cohorts_in_flight_max",
                "the most cohorts of the model on the device at once (submitted, not yet collected)",
                "gauge",
                get(&self.in_flight_max),
            ),
            s(
                "loom_requests_upstream",
                "a consumer's requests being run by its upstream model",
                "gauge",
                self.upstream.load(Ordering::Relaxed) as f64,
            ),
            s(
                "loom_device_results_total",
                "request results left on the device for a consumer model (not downloaded)",
                "counter",
                get(&self.device_results),
            ),
            s(
                "loom_result_download_bytes_total",
                "result bytes downloaded from the device for replies",
                "counter",
                get(&self.download_bytes),
            ),
            s(
                "loom_cohorts_split_total",
                "cohorts whose prepared working set did not fit the memory budget, formed again with half the members",
                "counter",
                get(&self.cohorts_split),
            ),
            s(
                "loom_cohorts_waited_for_memory_total",
                "cohorts that waited for the model's cohorts in flight to free memory budget before submission",
                "counter",
                get(&self.waited_for_memory),
            ),
            s(
                "loom_cohort_seconds_total",
                "time spent executing cohorts (batch preparation, device, collection)",
                "counter",
                get(&self.device_ns) / 1e9,
            ),
        ]
    }
}

/// Folds a sample into a moving average (weight 1/8).
pub(crate) fn fold(avg: &AtomicU64, sample: Duration) {
    let ns = sample.as_nanos().min(u64::MAX as u128) as u64;
    let a = avg.load(Ordering::Relaxed);
    avg.store(a - a / 8 + ns / 8, Ordering::Relaxed);
}
