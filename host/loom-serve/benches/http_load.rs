//! Load on `POST /v1/embeddings` of the arithmetic package through the real `loom-serve` binary, side by side in
//! the same run with a bare axum handler doing the same JSON work (parse the request, compute the same
//! arithmetic embedding in Rust, encode the same response). Both servers get the same machine; the load
//! generator runs in this process with keep-alive connections. Then 100,000 requests against loom-serve with
//! its resident memory sampled along the way.
//!
//! `cargo bench -p loom-serve --bench http_load` (env: `SERVER_ARGS`, extra server flags; `LOAD_SECONDS`, default 4; `MEMORY_REQUESTS`, default
//! 100000).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn body() -> String {
    serde_json::json!({"model": "arith-embed", "input": "The quick brown fox jumps over the lazy dog, twice."})
        .to_string()
}

/// The arithmetic embedding (the package's formula), for the bare handler.
fn arith(values: &[u8], dims: usize) -> Vec<f32> {
    let n = values.len() as f32;
    (0..dims)
        .map(|j| {
            let mut s = 0f32;
            for (t, &v) in values.iter().enumerate() {
                s += v as f32 * (64.0 / (64.0 + ((t + 1) * (j + 1)) as f32));
            }
            s / (n * 256.0)
        })
        .collect()
}

async fn bare(body: axum::body::Bytes) -> axum::response::Response {
    use axum::response::IntoResponse;
    let v: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return (axum::http::StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let text = v["input"].as_str().unwrap_or_default();
    let e = arith(text.as_bytes(), 64);
    axum::Json(serde_json::json!({
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": e}],
        "model": v["model"],
        "usage": {"prompt_tokens": text.len(), "total_tokens": text.len()},
    }))
    .into_response()
}

fn start_bare() -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(l.local_addr().unwrap().to_string()).unwrap();
            let app = axum::Router::new().route("/v1/embeddings", axum::routing::post(bare));
            axum::serve(l, app).await.unwrap();
        });
    });
    rx.recv().unwrap()
}

struct Conn {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Conn {
    fn new(addr: &str) -> Conn {
        let s = TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        Conn {
            r: BufReader::new(s.try_clone().unwrap()),
            w: s,
        }
    }
    fn post(&mut self, body: &str) -> usize {
        write!(
            self.w,
            "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut line = String::new();
        self.r.read_line(&mut line).unwrap();
        assert!(line.starts_with("HTTP/1.1 200"), "{line}");
        let mut len = 0;
        loop {
            line.clear();
            self.r.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
        }
        let mut buf = vec![0u8; len];
        self.r.read_exact(&mut buf).unwrap();
        len
    }
}

struct Load {
    rps: f64,
    p50: Duration,
    p99: Duration,
}

fn load(addr: &str, clients: usize, secs: f64) -> Load {
    let addr = Arc::new(addr.to_string());
    let body = Arc::new(body());
    // Warm up: connections, the specialization cache, the JIT.
    let mut c = Conn::new(&addr);
    for _ in 0..200 {
        c.post(&body);
    }
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let t0 = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            let (addr, body) = (addr.clone(), body.clone());
            std::thread::spawn(move || {
                let mut c = Conn::new(&addr);
                let mut lat = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    c.post(&body);
                    lat.push(t.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut all: Vec<Duration> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let wall = t0.elapsed().as_secs_f64();
    all.sort();
    let q = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)];
    Load {
        rps: all.len() as f64 / wall,
        p50: q(0.50),
        p99: q(0.99),
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return; // `cargo test --benches` / `--list`: nothing to run here.
    }
    let secs: f64 = std::env::var("LOAD_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4.0);
    let mem_requests: usize = std::env::var("MEMORY_REQUESTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let pkg = concat!(env!("CARGO_MANIFEST_DIR"), "/../../packages/arith-embed");
    // SERVER_ARGS: extra server flags for an A/B run (e.g. `--idle-timeout 0`).
    let extra = std::env::var("SERVER_ARGS").unwrap_or_default();
    let mut child = Command::new(env!("CARGO_BIN_EXE_loom-serve"))
        .args(["--port", "0", "--log", "warn", "--model", pkg])
        .args(extra.split_whitespace())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let loom = line
        .trim()
        .trim_start_matches("listening on http://")
        .to_string();
    // Wait until the model is registered.
    let t0 = Instant::now();
    loop {
        let mut s = TcpStream::connect(&loom).unwrap();
        write!(
            s,
            "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut r = String::new();
        let _ = s.read_to_string(&mut r);
        if r.contains("\"models_ready\":1") {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(20));
    }
    let bare_addr = start_bare();

    println!(
        "workload: POST /v1/embeddings, one 51-byte input, arith-embed (64 dims); keep-alive clients; {secs} s each"
    );
    println!("| clients | loom-serve req/s | p50 | p99 | bare axum req/s | p50 | p99 | ratio |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for clients in [1usize, 16, 64] {
        let a = load(&loom, clients, secs);
        let b = load(&bare_addr, clients, secs);
        println!(
            "| {clients} | {:.0} | {:.2} ms | {:.2} ms | {:.0} | {:.2} ms | {:.2} ms | {:.2}x |",
            a.rps,
            a.p50.as_secs_f64() * 1e3,
            a.p99.as_secs_f64() * 1e3,
            b.rps,
            b.p50.as_secs_f64() * 1e3,
            b.p99.as_secs_f64() * 1e3,
            a.rps / b.rps
        );
    }

    // Memory over many requests (16 clients).
    let pid = child.id();
    let body = Arc::new(body());
    let per = mem_requests / 16;
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handles: Vec<_> = (0..16)
        .map(|_| {
            let (addr, body, done) = (loom.clone(), body.clone(), done.clone());
            std::thread::spawn(move || {
                let mut c = Conn::new(&addr);
                for _ in 0..per {
                    c.post(&body);
                    done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        })
        .collect();
    let mut samples = vec![(0usize, rss_kib(pid))];
    let marks = [mem_requests / 10, mem_requests / 2, per * 16];
    let mut next = 0;
    while next < marks.len() {
        let d = done.load(std::sync::atomic::Ordering::Relaxed);
        if d >= marks[next] {
            samples.push((d, rss_kib(pid)));
            next += 1;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for h in handles {
        h.join().unwrap();
    }
    println!();
    println!("| requests served | loom-serve RSS |");
    println!("|---:|---:|");
    for (n, kib) in samples {
        println!("| {n} | {:.1} MiB |", kib as f64 / 1024.0);
    }
    let _ = child.kill();
    let _ = child.wait();
}
