//! Request-time specialization through the server: a cohort whose declarations miss the specialization cache
//! compiles on the shared workers while the model keeps serving cohorts whose code is cached, and the cache
//! keeps at most `specialization_cache` sets (least recently used out).

use crate::http_embed::arith;
use crate::support::TestServer;
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Posts `text` to the slow-compile model and checks the arithmetic embedding it gets back.
fn embed_checked(s: &TestServer, text: &str) {
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "slow-compile", "input": text}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let got = r.json()["data"][0]["embedding"].clone();
    let vals: Vec<i64> = text.bytes().map(i64::from).collect();
    let want = arith(&vals, 64);
    for (g, w) in got.as_array().unwrap().iter().zip(&want) {
        assert!(
            (g.as_f64().unwrap() - w).abs() <= 1e-5 * w.abs().max(1.0),
            "{g} vs {w}"
        );
    }
}

fn series(s: &TestServer, name: &str) -> f64 {
    s.metric(&format!("{name}{{model=\"slow-compile\"}}"))
}

#[test]
fn a_miss_compiles_while_cached_cohorts_keep_running_and_the_cache_is_bounded() {
    let s = TestServer::start("specialize", &[]);
    let base = s.dir.join("slow-compile");
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "slow-compile", "base": base.display().to_string()}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    // A first cohort of one short text (T = 16): a miss, compiled before it runs.
    let t0 = Instant::now();
    embed_checked(&s, "a");
    let compile = t0.elapsed();
    assert_eq!(series(&s, "loom_specialization_cache_misses_total"), 1.0);
    // A longer text (T = 48) misses again. While it compiles, short texts are served from the cache.
    let done = AtomicBool::new(false);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            embed_checked(&s, &"x".repeat(40));
            done.store(true, Ordering::SeqCst);
        });
        let t = Instant::now();
        while series(&s, "loom_cohorts_specializing") < 1.0 {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "the miss never parked"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        let served = Instant::now();
        for text in ["b", "cd", "efg"] {
            embed_checked(&s, text);
        }
        let took = served.elapsed();
        assert!(
            !done.load(Ordering::SeqCst),
            "the cached cohorts waited for the compilation ({took:?} for three, a compile takes {compile:?})"
        );
    });
    assert_eq!(series(&s, "loom_cohorts_specializing"), 0.0);
    assert_eq!(series(&s, "loom_specialization_cache_misses_total"), 2.0);
    assert_eq!(series(&s, "loom_specialization_cache_hits_total"), 3.0);
    // specialization_cache is 2: a third extent (T = 64) evicts the least recently used (T = 16), which then
    // misses again and evicts T = 48.
    embed_checked(&s, &"y".repeat(60));
    assert_eq!(series(&s, "loom_specialization_cache_evictions_total"), 1.0);
    assert_eq!(series(&s, "loom_specialization_cache_entries"), 2.0);
    embed_checked(&s, "z");
    assert_eq!(series(&s, "loom_specialization_cache_misses_total"), 4.0);
    assert_eq!(series(&s, "loom_specialization_cache_evictions_total"), 2.0);
    assert_eq!(series(&s, "loom_specialization_cache_entries"), 2.0);
    embed_checked(&s, &"w".repeat(60));
    assert_eq!(series(&s, "loom_specialization_cache_hits_total"), 4.0);
    s.healthy();
}

/// Cohorts are pipelined: while one of a model's cohorts runs on the device (here a long one, run in place on
/// the thread of the request that came alone), its next cohort is prepared, uploaded and submitted without
/// waiting, up to two in flight; each still gets its own, correct result. (Another model's cohort no longer
/// holds a model up at all: each invocation's work has its own lane on the CPU device, see `http_bounds`.)
#[test]
fn cohorts_are_submitted_while_the_device_is_busy() {
    let s = TestServer::start("pipeline", &[]);
    let base = s.dir.join("slow-embed");
    // Cohorts of up to 5 s count as quick, so the first request runs in place.
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "slow-embed", "base": base.display().to_string(),
                "options": {"stage": "slow.kernel.embed", "max_tokens": 64, "batch_units": 4096,
                            "in_place_cohort_us": 5_000_000}}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    // Warm the stages for one short text (so nothing compiles below).
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "slow-embed", "input": "warm"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let texts = ["busy", "one", "two", "six"];
    std::thread::scope(|sc| {
        // The first request's cohort runs in place for a while; three more requests arrive one after the other.
        let hs: Vec<_> = texts
            .iter()
            .enumerate()
            .map(|(i, text)| {
                let s = &s;
                sc.spawn(move || {
                    std::thread::sleep(Duration::from_millis(if i == 0 {
                        0
                    } else {
                        10 + 10 * i as u64
                    }));
                    let r = s.post_json(
                        "/v1/embeddings",
                        &json!({"model": "slow-embed", "input": text}),
                    );
                    assert_eq!(r.status, 200, "{}", r.text());
                    let vals: Vec<i64> = text.bytes().map(i64::from).collect();
                    let want = arith(&vals, 64);
                    let got = r.json()["data"][0]["embedding"].clone();
                    for (g, w) in got.as_array().unwrap().iter().zip(&want) {
                        assert!((g.as_f64().unwrap() - w).abs() <= 1e-5 * w.abs().max(1.0));
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    });
    assert!(s.metric("loom_cohorts_in_place_total{model=\"slow-embed\"}") >= 1.0);
    assert_eq!(
        s.metric("loom_cohorts_in_flight_max{model=\"slow-embed\"}"),
        2.0,
        "{}",
        s.request("GET", "/metrics", b"").text()
    );
    s.healthy();
}
