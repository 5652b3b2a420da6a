//! Prometheus text exposition: the HTTP counter, each service's own series (its contract's metrics), the
//! generic series of every prepared model (device bytes, specialization cache), device allocations, and the
//! server-wide gauges of the inference gateway's model-server protocol ([`Load`]).

use crate::state::AppState;
use serve_runtime::contract::{Series, Service};
use serve_runtime::registry::Registry;
use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// The generic series of a served model, whatever its contract.
fn model_series(svc: &dyn Service) -> Vec<Series> {
    let m = svc.model();
    let c = m.spec_cache_stats();
    vec![
        Series::sample(
            "loom_device_bytes",
            "device bytes held by the model (parameters, workspace, cohort buffers)",
            "gauge",
            m.device_bytes() as f64,
        ),
        Series::sample(
            "loom_work_timelines",
            "device work timelines the model holds (idle and in use): at least one per invocation in flight, \
             and one per chain of independent stages within an invocation",
            "gauge",
            m.work_timelines() as f64,
        ),
        Series::sample(
            "loom_specialization_cache_hits_total",
            "invocation stage sets reused",
            "counter",
            c.hits as f64,
        ),
        Series::sample(
            "loom_specialization_cache_misses_total",
            "invocation stage sets compiled",
            "counter",
            c.misses as f64,
        ),
        Series::sample(
            "loom_specialization_cache_evictions_total",
            "invocation stage sets dropped to keep at most specialization_cache",
            "counter",
            c.evictions as f64,
        ),
        Series::sample(
            "loom_specialization_cache_stale_total",
            "invocation stage sets dropped because a checkpoint they opened changed on disk",
            "counter",
            c.stale as f64,
        ),
        Series::sample(
            "loom_specialization_cache_entries",
            "invocation stage sets cached (at most the package's specialization_cache)",
            "gauge",
            c.entries as f64,
        ),
    ]
}

fn family(o: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// The server-wide load the Gateway API Inference Extension's endpoint picker reads (its model-server
/// protocol, `docs/proposals/003-model-server-protocol`): requests queued and requests running, summed over
/// every served model, and the KV-cache utilization as a fraction: that of the fullest page pool (models'
/// pools differ in page size and are not shared, so a sum of pages would let a large idle pool hide a full
/// one; the fullest pool is where the next request is likeliest to wait).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct Load {
    pub(crate) waiting: f64,
    pub(crate) running: f64,
    pub(crate) kv_utilization: f64,
}

impl Load {
    /// Adds one model's series: finite models count `loom_queue_depth` as queued and
    /// `loom_requests_running` as running, retained-text models `loom_text_waiting` and `loom_text_running`
    /// (sequences: a request for `n` choices counts `n`) and their page pool's
    /// `loom_text_page_pool_usage_ratio`.
    pub(crate) fn add(&mut self, s: &Series) {
        match s.name {
            "loom_queue_depth" | "loom_text_waiting" | "loom_sequence_waiting" => {
                self.waiting += s.value
            }
            "loom_requests_running" | "loom_text_running" | "loom_sequence_running" => {
                self.running += s.value
            }
            "loom_text_page_pool_usage_ratio" | "loom_sequence_page_pool_usage_ratio" => {
                self.kv_utilization = self.kv_utilization.max(s.value.clamp(0.0, 1.0))
            }
            _ => {}
        }
    }
}

pub(crate) fn render(st: &AppState) -> String {
    let registry: &Registry = &st.registry;
    let mut o = String::new();
    family(
        &mut o,
        "loom_http_requests_total",
        "HTTP requests received",
        "counter",
    );
    let _ = writeln!(
        o,
        "loom_http_requests_total {}",
        st.requests.load(Ordering::Relaxed)
    );
    family(
        &mut o,
        "loom_http_requests_in_flight",
        "requests accepted and not yet answered in full (streams until their last byte; probes not counted)",
        "gauge",
    );
    let _ = writeln!(o, "loom_http_requests_in_flight {}", st.work_in_flight());
    family(
        &mut o,
        "loom_draining",
        "1 from the shutdown signal on (readiness fails, new work is refused), else 0",
        "gauge",
    );
    let _ = writeln!(o, "loom_draining {}", u8::from(st.draining()));
    // Families in first-seen order, each with one sample per model that exports it.
    let services: Vec<Arc<dyn Service>> = registry.services();
    let mut families: Vec<(Series, Vec<(String, Series)>)> = Vec::new();
    for svc in &services {
        let name = &svc.model().name;
        for s in svc.series().into_iter().chain(model_series(svc.as_ref())) {
            match families.iter_mut().find(|(f, _)| f.name == s.name) {
                Some((_, samples)) => samples.push((name.clone(), s)),
                None => families.push((s.clone(), vec![(name.clone(), s)])),
            }
        }
    }
    let mut load = Load::default();
    for (_, samples) in &families {
        for (_, s) in samples {
            load.add(s);
        }
    }
    for (name, help, value) in [
        (
            "loom_num_requests_waiting",
            "requests queued, summed over every model (model-server protocol: TotalQueuedRequests)",
            load.waiting,
        ),
        (
            "loom_num_requests_running",
            "requests being served, summed over every model (model-server protocol: TotalRunningRequests)",
            load.running,
        ),
        (
            "loom_kv_cache_utilization",
            "fraction (0 to 1) of the fullest retained-text page pool in use (model-server protocol: KVCacheUtilization)",
            load.kv_utilization,
        ),
    ] {
        family(&mut o, name, help, "gauge");
        let _ = writeln!(o, "{name} {value}");
    }
    for (f, samples) in &families {
        family(&mut o, f.name, f.help, f.kind);
        for (model, s) in samples {
            match &s.histogram {
                None => {
                    let _ = writeln!(o, "{}{{model=\"{model}\"}} {}", f.name, s.value);
                }
                Some(h) => {
                    for (le, n) in &h.buckets {
                        let le = if le.is_infinite() {
                            "+Inf".to_string()
                        } else {
                            le.to_string()
                        };
                        let _ =
                            writeln!(o, "{}_bucket{{model=\"{model}\",le=\"{le}\"}} {n}", f.name);
                    }
                    let _ = writeln!(o, "{}_sum{{model=\"{model}\"}} {}", f.name, h.sum);
                    let _ = writeln!(o, "{}_count{{model=\"{model}\"}} {}", f.name, h.count);
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_sums_requests_and_takes_the_fullest_pool() {
        let mut l = Load::default();
        assert_eq!(l.kv_utilization, 0.0, "no pool: idle");
        for (name, v) in [
            ("loom_queue_depth", 2.0),
            ("loom_requests_running", 3.0),
            ("loom_text_waiting", 4.0),
            ("loom_text_running", 5.0),
            ("loom_text_page_pool_usage_ratio", 0.75),
            ("loom_text_page_pool_usage_ratio", 0.1),
            ("loom_cohorts_total", 99.0),
        ] {
            l.add(&Series::sample(name, "", "gauge", v));
        }
        assert_eq!((l.waiting, l.running), (6.0, 8.0));
        assert_eq!(l.kv_utilization, 0.75, "the fullest pool");
    }
}
