//! Kernel run-time bounds through the binary (issue 14 item 2): a package's runaway kernel fails its own
//! request with the step-budget error while another model on the same device keeps answering; the operator's
//! `--max-kernel-steps` caps what a package declares; a client that disconnects while its kernel runs frees
//! the device promptly.

use crate::support::TestServer;
use serde_json::json;
use std::io::Write;
use std::time::{Duration, Instant};

/// A copy of the slow-embed fixture whose spin kernel runs 2^40 iterations (hours), with `limits` in its
/// `model.json` when given; registered as `name`.
fn register_runaway(s: &TestServer, name: &str, limits: Option<serde_json::Value>) {
    let base = s.dir.join(name);
    crate::support::copy_dir(&s.dir.join("slow-embed"), &base);
    let k = std::fs::read_to_string(base.join("kernel.loom")).unwrap();
    assert!(
        k.contains("SPIN: i64 = 24000000"),
        "the fixture's spin default"
    );
    std::fs::write(
        base.join("kernel.loom"),
        k.replace("SPIN: i64 = 24000000", "SPIN: i64 = 1099511627776"),
    )
    .unwrap();
    let mut doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(base.join("model.json")).unwrap()).unwrap();
    if let Some(l) = limits {
        doc["limits"] = l;
    }
    std::fs::write(base.join("model.json"), doc.to_string()).unwrap();
    let r = s.post_json(
        "/v1/models",
        &json!({"name": name, "base": base.display().to_string()}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
}

/// An answer: status and body text.
struct Answer {
    status: u16,
    body: String,
}

impl Answer {
    fn text(&self) -> String {
        self.body.clone()
    }
}

/// `POST /v1/embeddings` of one input to `model` on the server at `addr` (usable from any thread).
fn embed_at(addr: &str, model: &str) -> Answer {
    use std::io::Read;
    let body = json!({"model": model, "input": "a b c"}).to_string();
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        c,
        "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    let _ = c.read_to_end(&mut raw);
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = raw
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string());
    Answer { status, body }
}

fn embed(s: &TestServer, model: &str) -> Answer {
    embed_at(&s.addr, model)
}

/// `f` on another thread, its answer within `limit` or a panic naming `what`.
fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what}: no answer within {limit:?}"))
}

/// Sends one request to the model `runaway` and returns its connection, unread: the request runs until the
/// connection closes (its kernel is cancelled then) or the server stops.
fn send_runaway(s: &TestServer) -> std::net::TcpStream {
    let body = json!({"model": "runaway", "input": "spin"}).to_string();
    let mut c = std::net::TcpStream::connect(&s.addr).unwrap();
    write!(
        c,
        "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    c
}

/// Waits up to `limit` for `series` to read at least `value`; whether it did.
fn metric_reaches(s: &TestServer, series: &str, value: f64, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while s.metric(series) < value {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

#[test]
fn a_runaway_kernel_fails_its_request_at_its_budget_and_other_models_keep_answering() {
    let s = TestServer::start("bounds-budget", &[]);
    register_runaway(&s, "runaway", Some(json!({"kernel_steps": 1000000})));
    let t0 = Instant::now();
    let addr = s.addr.clone();
    let dir = s.dir.display().to_string();
    // The runaway request and one for another model on the same device (cpu:0), at the same time.
    let runaway = std::thread::spawn({
        let addr = addr.clone();
        move || embed_at(&addr, "runaway")
    });
    std::thread::sleep(Duration::from_millis(50));
    let other = within(Duration::from_secs(20), "the other model", move || {
        embed_at(&addr, "arith-embed")
    });
    assert_eq!(other.status, 200, "{}", other.text());
    let r = runaway.join().unwrap();
    let took = t0.elapsed();
    assert!((400..600).contains(&r.status), "{} {}", r.status, r.text());
    let text = r.text();
    assert!(
        text.contains("kernel `slow.kernel.spin<")
            && text.contains("of stage `slow.kernel.embed` exceeded its budget of 1000000 steps"),
        "{text}"
    );
    assert!(
        !text.contains(&dir),
        "the error reveals a server path: {text}"
    );
    assert!(took < Duration::from_secs(20), "the runaway took {took:?}");
    // The model fails the same way again (a failed cohort does not poison the model's later work), and the
    // other model still answers.
    let again = embed(&s, "runaway");
    assert!(
        again
            .text()
            .contains("exceeded its budget of 1000000 steps"),
        "{}",
        again.text()
    );
    assert_eq!(embed(&s, "arith-embed").status, 200);
    s.healthy();
}

#[test]
fn the_operator_caps_kernel_steps() {
    let s = TestServer::start("bounds-cap", &["--max-kernel-steps", "2000000"]);
    // Declaring more than the cap is refused at registration, naming the field and the flag.
    let base = s.dir.join("greedy");
    crate::support::copy_dir(&s.dir.join("arith-embed"), &base);
    let mut doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(base.join("model.json")).unwrap()).unwrap();
    doc["limits"] = json!({"kernel_steps": 1000000000u64});
    std::fs::write(base.join("model.json"), doc.to_string()).unwrap();
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "greedy", "base": base.display().to_string()}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let text = r.text();
    assert!(
        text.contains("limits.kernel_steps") && text.contains("--max-kernel-steps"),
        "{text}"
    );
    // A package that declares nothing runs under the operator's cap.
    register_runaway(&s, "runaway", None);
    let addr = s.addr.clone();
    let r = within(Duration::from_secs(30), "the runaway", move || {
        embed_at(&addr, "runaway")
    });
    assert!(
        r.text().contains("exceeded its budget of 2000000 steps"),
        "{} {}",
        r.status,
        r.text()
    );
    // A bad flag value is refused at start-up.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_loom-serve"))
        .args(["--max-kernel-steps", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--max-kernel-steps"));
}

#[test]
fn a_client_disconnect_stops_its_running_kernel_and_frees_the_device() {
    // No budget in the way (2^50 steps): only cancellation can stop the runaway.
    let s = TestServer::start("bounds-cancel", &["--max-kernel-steps", "1125899906842624"]);
    register_runaway(&s, "runaway", None);
    let c = send_runaway(&s);
    // Let its cohort start executing, then hang up.
    std::thread::sleep(Duration::from_millis(1000));
    drop(c);
    let t0 = Instant::now();
    // Another model on the same device: before, it queued behind the runaway for ever.
    let addr = s.addr.clone();
    let r = within(
        Duration::from_secs(10),
        "the next request after the disconnect",
        move || embed_at(&addr, "arith-embed"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    eprintln!("served {:?} after the disconnect", t0.elapsed());
    // The stopped cohort is counted when its collector has seen it fail (maybe just after the next request).
    metric_reaches(
        &s,
        "loom_cancelled_running_total{model=\"runaway\"}",
        1.0,
        Duration::from_secs(10),
    );
    assert_eq!(
        s.metric("loom_cancelled_running_total{model=\"runaway\"}"),
        1.0
    );
    s.healthy();
}

#[test]
fn the_drain_deadline_cancels_a_running_kernel_and_answers_its_request() {
    // No budget in the way: only the deadline's cancellation stops the runaway.
    let s = TestServer::start(
        "bounds-drain",
        &[
            "--drain-timeout",
            "2",
            "--max-kernel-steps",
            "1125899906842624",
        ],
    );
    register_runaway(&s, "runaway", None);
    let addr = s.addr.clone();
    let client = std::thread::spawn(move || embed_at(&addr, "runaway"));
    std::thread::sleep(Duration::from_millis(1000));
    let t0 = Instant::now();
    let st = s.terminate();
    assert_eq!(st.code(), Some(1), "{st:?}");
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(15),
        "exited {took:?} after SIGTERM"
    );
    // The request was answered with the cancellation, not cut off.
    let r = client.join().unwrap();
    assert!((400..600).contains(&r.status), "{} {}", r.status, r.text());
    assert!(r.text().contains("was cancelled"), "{}", r.text());
}

#[test]
fn a_runaway_kernel_does_not_hold_up_other_models_on_its_device() {
    // No budget in the way (2^50 steps): the runaway runs until its client goes. Meanwhile another model on
    // the same device (cpu:0) answers: before the device ran each model's work on a lane of its own, its
    // requests queued behind the runaway's dispatch for as long as it ran.
    let s = TestServer::start("bounds-lanes", &["--max-kernel-steps", "1125899906842624"]);
    register_runaway(&s, "runaway", None);
    let c = send_runaway(&s);
    let running = "loom_requests_running{model=\"runaway\"}";
    assert!(
        metric_reaches(&s, running, 1.0, Duration::from_secs(30)),
        "the runaway's cohort never ran"
    );
    for i in 0..3 {
        let addr = s.addr.clone();
        let r = within(
            Duration::from_secs(60),
            &format!("request {i} to another model while the runaway runs"),
            move || embed_at(&addr, "arith-embed"),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // The runaway was running all along (its request is still unanswered).
    assert_eq!(s.metric(running), 1.0, "the runaway stopped on its own");
    drop(c);
    assert!(
        metric_reaches(
            &s,
            "loom_cancelled_running_total{model=\"runaway\"}",
            1.0,
            Duration::from_secs(30)
        ),
        "the runaway was not cancelled"
    );
    s.healthy();
}
