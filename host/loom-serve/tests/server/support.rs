//! `TestServer`: copies packages into a temp dir, starts the real `loom-serve` binary on port 0, reads back the
//! address, and speaks minimal HTTP/1.1 to it. On a failing test it prints the server's log.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Copies directory `from` (recursively) to `to`.
pub(crate) fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}

/// A fresh temporary directory holding copies of the example packages (same relative layout).
pub(crate) fn package_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("loom-serve-test-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for p in [
        "arith-embed",
        "arith-embed-weighted",
        "arith-decision",
        "arith-lookup",
        "arith-chat",
        "arith-score",
        "motifs",
    ] {
        copy_dir(&repo_root().join("packages").join(p), &dir.join(p));
    }
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/server/fixtures");
    for f in [
        "slow-compile",
        "slow-embed",
        "weighted-t",
        "forecast-embed",
        "branches",
        "embed-head",
    ] {
        copy_dir(&fixtures.join(f), &dir.join(f));
    }
    dir
}

pub(crate) struct TestServer {
    child: Option<Child>,
    pub(crate) addr: String,
    pub(crate) dir: PathBuf,
    log: PathBuf,
    args: Vec<String>,
}

#[derive(Debug)]
pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Response {
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl TestServer {
    /// Starts the server with the three example packages registered, plus `extra` arguments.
    pub(crate) fn start(tag: &str, extra: &[&str]) -> TestServer {
        let dir = package_dir(tag);
        let models: Vec<PathBuf> = ["arith-embed", "arith-embed-weighted", "arith-decision"]
            .iter()
            .map(|p| dir.join(p))
            .collect();
        TestServer::spawn(dir, &models, extra)
    }

    /// Starts the server with `models` (package directories, used in place) registered, plus `extra`
    /// arguments; the log goes to a fresh temporary directory.
    pub(crate) fn start_models(tag: &str, models: &[PathBuf], extra: &[&str]) -> TestServer {
        let dir =
            std::env::temp_dir().join(format!("loom-serve-test-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TestServer::spawn(dir, models, extra)
    }

    fn spawn(dir: PathBuf, models: &[PathBuf], extra: &[&str]) -> TestServer {
        let mut args: Vec<String> =
            vec!["--port".into(), "0".into(), "--log".into(), "debug".into()];
        for p in models {
            args.push("--model".into());
            args.push(p.display().to_string());
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let log = dir.join("server.log");
        // LOOM_SERVE_BIN runs the tests against another build of the server (say, one from before a fix).
        let bin = std::env::var_os("LOOM_SERVE_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_loom-serve")));
        let mut child = Command::new(bin)
            .args(&args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawning loom-serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on http://")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        let s = TestServer {
            child: Some(child),
            addr,
            dir,
            log,
            args,
        };
        let t0 = Instant::now();
        loop {
            if let Ok(r) = s.try_request("GET", "/health", &[], b"") {
                if r.status == 200 {
                    break;
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "server never became ready"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(crate) fn try_request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Response> {
        let mut s = TcpStream::connect(&self.addr)?;
        s.set_read_timeout(Some(Duration::from_secs(120)))?;
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
            && !body.is_empty()
        {
            req.push_str("Content-Type: application/json\r\n");
        }
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes())?;
        s.write_all(body)?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)?;
        parse_response(&raw).ok_or_else(|| {
            std::io::Error::other(format!("bad response: {:?}", String::from_utf8_lossy(&raw)))
        })
    }

    pub(crate) fn request(&self, method: &str, path: &str, body: &[u8]) -> Response {
        self.try_request(method, path, &[], body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    pub(crate) fn post_json(&self, path: &str, v: &serde_json::Value) -> Response {
        self.request("POST", path, v.to_string().as_bytes())
    }

    /// The value of a Prometheus series (`name{model="m"}`), 0 when absent.
    pub(crate) fn metric(&self, series: &str) -> f64 {
        let text = self.request("GET", "/metrics", b"").text();
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
            .map(|v| v.trim().parse().unwrap())
            .unwrap_or(0.0)
    }

    pub(crate) fn healthy(&self) {
        let r = self.request("GET", "/health", b"");
        assert_eq!(r.status, 200, "{}", r.text());
    }

    /// Sends SIGTERM and waits for the exit status.
    pub(crate) fn terminate(self) -> std::process::ExitStatus {
        self.sigterm();
        self.wait_exit(Duration::from_secs(30)).0
    }

    /// Sends SIGTERM (the server starts draining) and returns at once.
    pub(crate) fn sigterm(&self) {
        let child = self.child.as_ref().expect("running");
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
    }

    /// Waits up to `limit` for the server to exit: its exit status and its whole log.
    pub(crate) fn wait_exit(mut self, limit: Duration) -> (std::process::ExitStatus, String) {
        let mut child = self.child.take().unwrap();
        let t0 = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return (st, self.log());
            }
            assert!(t0.elapsed() < limit, "server did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "---- loom-serve {}\n---- log:\n{}\n---- dir: {}",
                self.args.join(" "),
                self.log(),
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn parse_response(raw: &[u8]) -> Option<Response> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        let mut out = Vec::new();
        let mut rest = &body[..];
        loop {
            let nl = rest.windows(2).position(|w| w == b"\r\n")?;
            let n =
                usize::from_str_radix(std::str::from_utf8(&rest[..nl]).ok()?.trim(), 16).ok()?;
            if n == 0 {
                break;
            }
            out.extend_from_slice(&rest[nl + 2..nl + 2 + n]);
            rest = &rest[nl + 2 + n + 2..];
        }
        body = out;
    }
    Some(Response {
        status,
        headers,
        body,
    })
}

/// A multipart/form-data body: (field name, optional file name, bytes).
pub(crate) fn multipart(parts: &[(&str, Option<&str>, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "loomtestboundary7d1f";
    let mut body = Vec::new();
    for (name, file, data) in parts {
        body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        match file {
            Some(f) => body.extend_from_slice(
                format!(
                    "Content-Disposition: form-data; name=\"{name}\"; filename=\"{f}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
                )
                .as_bytes(),
            ),
            None => body.extend_from_slice(
                format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n").as_bytes(),
            ),
        }
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}
