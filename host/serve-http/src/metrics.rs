//! Prometheus text exposition of the registry's counters.

use serve_runtime::registry::Registry;
use std::fmt::Write;
use std::sync::atomic::Ordering;

pub(crate) fn render(registry: &Registry, http_requests: u64) -> String {
    let mut o = String::new();
    let family = |o: &mut String, name: &str, help: &str, kind: &str| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    family(
        &mut o,
        "loom_http_requests_total",
        "HTTP requests received",
        "counter",
    );
    let _ = writeln!(o, "loom_http_requests_total {http_requests}");
    let services = registry.services();
    type Get = fn(&serve_runtime::finite::FiniteService) -> u64;
    let series: &[(&str, &str, &str, Get)] = &[
        (
            "loom_requests_total",
            "finite requests submitted",
            "counter",
            |s| s.metrics.requests.load(Ordering::Relaxed),
        ),
        (
            "loom_requests_failed_total",
            "finite requests that failed",
            "counter",
            |s| s.metrics.failed.load(Ordering::Relaxed),
        ),
        (
            "loom_admission_refusals_total",
            "requests refused because the queue was full",
            "counter",
            |s| s.metrics.refused.load(Ordering::Relaxed),
        ),
        (
            "loom_cancelled_waiting_total",
            "requests cancelled before joining a cohort",
            "counter",
            |s| s.metrics.cancelled_waiting.load(Ordering::Relaxed),
        ),
        ("loom_cohorts_total", "cohorts executed", "counter", |s| {
            s.metrics.cohorts.load(Ordering::Relaxed)
        }),
        (
            "loom_cohort_members_total",
            "requests executed in cohorts",
            "counter",
            |s| s.metrics.cohort_members.load(Ordering::Relaxed),
        ),
        (
            "loom_cohorts_shared_total",
            "cohorts with more than one request",
            "counter",
            |s| s.metrics.cohorts_shared.load(Ordering::Relaxed),
        ),
        (
            "loom_cohorts_in_place_total",
            "cohorts run on the submitting thread (a lone request, quick cohorts, nothing waiting)",
            "counter",
            |s| s.metrics.cohorts_in_place.load(Ordering::Relaxed),
        ),
        (
            "loom_cohort_max_members",
            "largest cohort so far",
            "gauge",
            |s| s.metrics.cohort_max.load(Ordering::Relaxed),
        ),
        (
            "loom_retried_alone_total",
            "members of failed cohorts retried alone",
            "counter",
            |s| s.metrics.retried_alone.load(Ordering::Relaxed),
        ),
        (
            "loom_queue_depth",
            "requests waiting for a cohort",
            "gauge",
            |s| s.metrics.queue.load(Ordering::Relaxed) as u64,
        ),
        (
            "loom_cohort_seconds_total",
            "time spent executing cohorts (batch preparation, device, collection)",
            "counter",
            |s| s.metrics.device_ns.load(Ordering::Relaxed) / 1_000_000_000,
        ),
        (
            "loom_device_bytes",
            "device bytes held by the model (parameters, workspace, cohort buffers)",
            "gauge",
            |s| s.model.device_bytes(),
        ),
        (
            "loom_specialization_cache_hits_total",
            "invocation stage sets reused",
            "counter",
            |s| s.model.spec_cache_stats().0,
        ),
        (
            "loom_specialization_cache_misses_total",
            "invocation stage sets compiled",
            "counter",
            |s| s.model.spec_cache_stats().1,
        ),
    ];
    for (name, help, kind, get) in series {
        family(&mut o, name, help, kind);
        for s in &services {
            let _ = writeln!(o, "{name}{{model=\"{}\"}} {}", s.model.name, get(s));
        }
    }
    family(
        &mut o,
        "loom_device_allocated_bytes",
        "bytes allocated on each device",
        "gauge",
    );
    for d in &registry.devices.devices {
        let _ = writeln!(
            o,
            "loom_device_allocated_bytes{{device=\"{}\"}} {}",
            d.name,
            d.allocated()
        );
    }
    o
}
