//! Prometheus text exposition: the HTTP counter, each service's own series (its contract's metrics), the
//! generic series of every prepared model (device bytes, specialization cache), and device allocations.

use serve_runtime::contract::{Series, Service};
use serve_runtime::registry::Registry;
use std::fmt::Write;
use std::sync::Arc;

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

pub(crate) fn render(registry: &Registry, http_requests: u64) -> String {
    let mut o = String::new();
    family(
        &mut o,
        "loom_http_requests_total",
        "HTTP requests received",
        "counter",
    );
    let _ = writeln!(o, "loom_http_requests_total {http_requests}");
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
