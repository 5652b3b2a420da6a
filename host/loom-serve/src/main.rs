//! `loom-serve`: the model server binary.
//!
//! ```text
//! loom-serve [--host ADDR] [--port N] [--plugins DIR]... [--deployment FILE] [--model DIR[=NAME]]...
//!            [--params-root DIR] [--package-root DIR]... [--max-invocation-bytes N] [--max-state-bytes N]
//!            [--max-kernel-steps N]
//!            [--api-key KEY]... [--admin-key KEY]... [--idle-timeout SECONDS] [--body-limit BYTES]
//!            [--max-upload-bytes N] [--upload-dir DIR] [--drain-timeout SECONDS] [--log LEVEL]
//! ```
//!
//! Server-local packages (start-up ones and JSON registrations) and every file they read must lie inside a
//! `--package-root` (symlinks resolved); without one, inside the directories holding the start-up packages.
//! `--max-invocation-bytes` (default 1 GiB) and `--max-state-bytes` (default 256 MiB) bound what a package may
//! declare as `memory.invocation_bytes` and `memory.state_bytes`; `--max-kernel-steps` (default 2^30) bounds
//! `limits.kernel_steps`, the step budget of each kernel dispatch (one step per program instance and per
//! iteration of a kernel `for` loop), and is the budget of packages that declare none. Uploaded packages may carry their parameter
//! files (multipart parts named `parameters`, at most `--max-upload-bytes`, default 4 GiB), stored in a
//! directory per upload under `--upload-dir` and removed with the model; uploads without them read
//! checkpoints under `--params-root`.
//!
//! A deployment file (`deploy/*.json`) names plugin directories and models with their device choice:
//! `{"plugins": ["DIR"], "models": [{"base": "DIR", "name": "N", "device": "cpu" | ["vulkan:0", "cpu"],
//! "options": {...}}]}`; relative paths resolve from the file's directory. A model whose chosen devices are
//! all absent fails its registration with an error naming the devices present; the server keeps serving.
//!
//! Loads plugins (a bad plugin is one log line), opens devices (the built-in CPU HAL when no plugin gives a
//! CPU device), mounts the routes of HTTP profile plugins (a profile whose route collides with a built-in
//! route or an earlier profile's is one "plugin rejected" line), starts listening, registers the `--model` packages, then reports ready on `/health`. On
//! SIGINT/SIGTERM it drains: `/health` answers 503 at once and new work is refused with 503, while the listener
//! keeps answering until every accepted request (streams included) is answered; then it stops accepting,
//! drains the models' queues and exits 0; if that takes longer than
//! `--drain-timeout` (default 30 s; 0: no deadline) it exits 1, failing the work still in flight. With `--port 0` it prints the
//! bound address on stdout (`listening on http://127.0.0.1:PORT`) for tests.

use anyhow::{Context, Result, bail};
use serve_http::{AppState, Config};
use serve_runtime::device::{BuiltinHal, Devices};
use serve_runtime::model::Overrides;
use serve_runtime::package::{OperatorLimits, PackageFiles};
use serve_runtime::registry::Registry;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

const USAGE: &str = "usage: loom-serve [--host ADDR] [--port N] [--plugins DIR]... [--deployment FILE] [--model DIR[=NAME]]... \
[--params-root DIR] [--package-root DIR]... [--max-invocation-bytes N] [--max-state-bytes N] [--max-kernel-steps N] [--api-key KEY]... \
[--admin-key KEY]... [--idle-timeout SECONDS] [--body-limit BYTES] [--max-upload-bytes N] [--upload-dir DIR] \
[--drain-timeout SECONDS] [--log error|warn|info|debug|trace]";

/// Set when the drain deadline passed (the exit status is then 1 even if the cancelled work drains).
static DEADLINE_PASSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[derive(Clone, Debug)]
struct StartModel {
    dir: PathBuf,
    name: Option<String>,
    overrides: Overrides,
}

struct Args {
    host: String,
    port: u16,
    plugins: Vec<PathBuf>,
    models: Vec<StartModel>,
    config: Config,
    limits: OperatorLimits,
    /// How long accepted work may take to finish after SIGTERM/SIGINT (`None`: for ever).
    drain_timeout: Option<std::time::Duration>,
    log: log::LevelFilter,
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        host: "127.0.0.1".into(),
        port: 8080,
        plugins: Vec::new(),
        models: Vec::new(),
        config: Config::default(),
        limits: OperatorLimits::default(),
        drain_timeout: Some(std::time::Duration::from_secs(30)),
        log: log::LevelFilter::Info,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .with_context(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--host" => a.host = value()?,
            "--port" => a.port = value()?.parse().context("--port takes a number")?,
            "--plugins" => a.plugins.push(value()?.into()),
            "--model" => {
                let v = value()?;
                let (dir, name) = match v.split_once('=') {
                    Some((d, n)) => (d.to_string(), Some(n.to_string())),
                    None => (v, None),
                };
                let dir = std::fs::canonicalize(&dir).with_context(|| format!("--model {dir}"))?;
                a.models.push(StartModel {
                    dir,
                    name,
                    overrides: Overrides::default(),
                });
            }
            "--deployment" => {
                let f = PathBuf::from(value()?);
                deployment(&f, &mut a).with_context(|| format!("deployment {}", f.display()))?;
            }
            "--params-root" => {
                let v = value()?;
                a.config.params_root =
                    Some(std::fs::canonicalize(&v).with_context(|| format!("--params-root {v}"))?);
                a.limits.params_root = a.config.params_root.clone();
            }
            "--package-root" => {
                let v = value()?;
                a.limits.package_roots.push(
                    std::fs::canonicalize(&v).with_context(|| format!("--package-root {v}"))?,
                );
            }
            "--max-invocation-bytes" => {
                a.limits.max_invocation_bytes = value()?
                    .parse()
                    .context("--max-invocation-bytes takes a byte count")?
            }
            "--max-kernel-steps" => {
                let n: u64 = value()?
                    .parse()
                    .context("--max-kernel-steps takes a step count")?;
                if n == 0 {
                    bail!("--max-kernel-steps must be positive");
                }
                a.limits.max_kernel_steps = n;
            }
            "--max-state-bytes" => {
                a.limits.max_state_bytes = value()?
                    .parse()
                    .context("--max-state-bytes takes a byte count")?
            }
            "--api-key" => a.config.api_keys.push(value()?),
            "--body-limit" => {
                a.config.body_limit = value()?
                    .parse()
                    .context("--body-limit takes a byte count")?
            }
            "--max-upload-bytes" => {
                a.config.max_upload_bytes = value()?
                    .parse()
                    .context("--max-upload-bytes takes a byte count")?
            }
            "--upload-dir" => a.config.upload_dir = Some(PathBuf::from(value()?)),
            "--admin-key" => a.config.admin_keys.push(value()?),
            "--idle-timeout" => {
                let secs: f64 = value()?
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                    .context("--idle-timeout takes a number of seconds (0: no limit)")?;
                a.config.idle_timeout =
                    (secs > 0.0).then(|| std::time::Duration::from_secs_f64(secs));
            }
            "--drain-timeout" => {
                let secs: f64 = value()?
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                    .context("--drain-timeout takes a number of seconds (0: wait for ever)")?;
                a.drain_timeout = (secs > 0.0).then(|| std::time::Duration::from_secs_f64(secs));
            }
            "--log" => {
                a.log = value()?
                    .parse()
                    .map_err(|_| anyhow::anyhow!("--log takes error, warn, info, debug or trace"))?
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument `{other}`\n{USAGE}"),
        }
    }
    // Without --package-root, server-local packages may live beside the start-up ones (the directories that
    // hold them, e.g. `packages/`), and nowhere else.
    if a.limits.package_roots.is_empty() {
        for m in &a.models {
            if let Some(parent) = m.dir.parent() {
                if !a.limits.package_roots.iter().any(|r| r == parent) {
                    a.limits.package_roots.push(parent.to_path_buf());
                }
            }
        }
    }
    Ok(a)
}

/// A minimal stderr logger (timestamps in seconds since start).
struct Logger(std::time::Instant);

impl log::Log for Logger {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        // Dependencies (Cranelift logs every function it compiles at info) only speak up for warnings.
        let ours = ["loom", "serve", "hal"]
            .iter()
            .any(|p| m.target().starts_with(p));
        m.level() <= log::max_level() && (ours || m.level() <= log::Level::Warn)
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            let t = self.0.elapsed().as_secs_f64();
            let _ = writeln!(std::io::stderr(), "[{t:9.3} {:5}] {}", r.level(), r.args());
        }
    }
    fn flush(&self) {}
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let logger = Box::leak(Box::new(Logger(std::time::Instant::now())));
    log::set_logger(logger).map_err(|e| anyhow::anyhow!("logger: {e}"))?;
    log::set_max_level(args.log);

    let report = loom_plugins_report(&args.plugins);
    // The CPU HAL is linked in and injected: it serves when no plugin gives a CPU device.
    let builtin_cpu = BuiltinHal {
        id: hal_cpu::PLUGIN_ID.to_string(),
        backend: "cpu".to_string(),
        driver: hal_cpu::driver(),
        open_with_files: hal_cpu::open_with_files,
        open_parts: Some(hal_cpu::open_parts),
    };
    let (devices, notes) = Devices::open(&report, &[builtin_cpu]);
    for n in notes {
        log::info!("{n}");
    }
    let profiles = mount_profiles(&report);
    let registry = Arc::new(
        Registry::new(Arc::new(devices), serve_contracts::builtin())
            .with_limits(args.limits.clone()),
    );
    let state = AppState::with_profiles(registry.clone(), args.config.clone(), profiles);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("binding {}:{}", args.host, args.port))?;
        let addr = listener.local_addr()?;
        println!("listening on http://{addr}");
        let _ = std::io::stdout().flush();
        log::info!("listening on http://{addr}");

        // Start-up registrations run beside the listener; /health turns 200 when they are done.
        let st = state.clone();
        let models = args.models.clone();
        tokio::task::spawn_blocking(move || {
            for StartModel {
                dir,
                name,
                overrides,
            } in models
            {
                let files = PackageFiles::Dir(dir.clone());
                let name = name.unwrap_or_else(|| {
                    files
                        .default_name(overrides.manifest_file())
                        .ok()
                        .unwrap_or_else(|| {
                        dir.file_name()
                            .map(|n| n.to_string_lossy().into_owned())
                            .unwrap_or_else(|| "model".into())
                    })
                });
                if let Err(e) = st.registry.register(&name, files, overrides) {
                    log::error!("model {name} ({}): {e}", dir.display());
                }
            }
            st.ready.store(true, Ordering::Relaxed);
            log::info!("ready");
        });

        // The drain deadline: from the shutdown signal, accepted work (HTTP requests in flight, then the models'
        // queues) has `--drain-timeout` to finish; past it the process exits with status 1, failing what is
        // left, so that a runaway kernel cannot keep a stopping server (or a pod's termination) waiting forever.
        if let Some(deadline) = args.drain_timeout {
            let reg = registry.clone();
            tokio::spawn(async move {
                serve_http::shutdown_requested().await;
                let spawned = std::thread::Builder::new()
                    .name("drain-deadline".into())
                    .spawn(move || {
                        std::thread::sleep(deadline);
                        // Stop the kernels still running (devices with run-time bounds), so that their
                        // requests are answered with an error before the process exits.
                        DEADLINE_PASSED.store(true, Ordering::SeqCst);
                        let stopped = reg.devices.cancel_all();
                        if stopped > 0 {
                            log::error!(
                                "shutdown: drain deadline of {deadline:?} passed; cancelled {stopped} running \
                                 cohort(s)"
                            );
                            std::thread::sleep(std::time::Duration::from_millis(500));
                        }
                        log::error!(
                            "shutdown: accepted work did not finish within the drain deadline of {deadline:?} \
                             (--drain-timeout); exiting, failing what is still in flight"
                        );
                        std::process::exit(1);
                    });
                if let Err(e) = spawned {
                    log::warn!("shutdown: no drain deadline ({e})");
                }
            });
        }
        let app = serve_http::router(state.clone());
        axum_serve(listener, app, state.clone()).await?;
        log::info!("shutting down: draining accepted work");
        let reg = registry.clone();
        tokio::task::spawn_blocking(move || reg.drain_all()).await?;
        if DEADLINE_PASSED.load(Ordering::SeqCst) {
            // The deadline cancelled what was running: that work failed, so the exit status says so.
            log::error!("stopped after the drain deadline, with cancelled work");
            std::process::exit(1);
        }
        log::info!("stopped");
        Ok::<(), anyhow::Error>(())
    })
}

/// Reads a deployment file into `a` (plugin directories and start-up models).
fn deployment(file: &std::path::Path, a: &mut Args) -> Result<()> {
    let text = std::fs::read(file)?;
    let v: serde_json_min::Value = serde_json_min::from_slice(&text)?;
    let here = file.parent().unwrap_or(std::path::Path::new("."));
    let obj = v.as_object().context("expected a JSON object")?;
    for k in obj.keys() {
        if k != "plugins" && k != "models" {
            bail!("unknown field `{k}` (expected plugins, models)");
        }
    }
    if let Some(p) = v.get("plugins") {
        for (i, d) in p
            .as_array()
            .context("field `plugins`: expected a list")?
            .iter()
            .enumerate()
        {
            let d = d
                .as_str()
                .with_context(|| format!("field `plugins[{i}]`: expected a path"))?;
            a.plugins.push(here.join(d));
        }
    }
    let models = v.get("models").and_then(|m| m.as_array());
    for (i, m) in models.into_iter().flatten().enumerate() {
        let field = |f: &str| format!("field `models[{i}].{f}`");
        let base = m
            .get("base")
            .and_then(|b| b.as_str())
            .with_context(|| format!("{}: expected a package directory", field("base")))?;
        let dir = std::fs::canonicalize(here.join(base)).with_context(|| field("base"))?;
        let name = match m.get("name") {
            None => None,
            Some(n) => Some(
                n.as_str()
                    .with_context(|| format!("{}: expected a string", field("name")))?
                    .to_string(),
            ),
        };
        let device = match m.get("device") {
            None => None,
            Some(serde_json_min::Value::String(s)) => Some(vec![s.clone()]),
            Some(serde_json_min::Value::Array(l)) => Some(
                l.iter()
                    .map(|d| d.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
                    .with_context(|| format!("{}: expected device names", field("device")))?,
            ),
            Some(_) => bail!(
                "{}: expected a device name or a preference list",
                field("device")
            ),
        };
        let options = match m.get("options") {
            None => None,
            Some(o) => Some(
                o.as_object()
                    .with_context(|| format!("{}: expected an object", field("options")))?
                    .clone(),
            ),
        };
        let manifest = match m.get("manifest") {
            None => None,
            Some(v) => {
                let v = v
                    .as_str()
                    .with_context(|| format!("{}: expected a file name", field("manifest")))?;
                serve_runtime::package::manifest_name(v)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", field("manifest")))?;
                Some(v.to_string())
            }
        };
        a.models.push(StartModel {
            dir,
            name,
            overrides: Overrides {
                device,
                options,
                manifest,
            },
        });
    }
    Ok(())
}

use loom_plugin_api::PluginKind;
use serve_http::serve as axum_serve;
use serve_runtime::json as serde_json_min;

fn loom_plugins_report(dirs: &[PathBuf]) -> Vec<serve_runtime::PluginHandle> {
    let report = serve_runtime::load_plugins(dirs);
    for r in &report.rejected {
        log::warn!("plugin rejected: {r}");
    }
    for p in report
        .plugins
        .iter()
        .filter(|p| p.kind != PluginKind::PROFILE)
    {
        log::info!(
            "plugin {} ({}, ABI {}.{}): {} device(s): {}",
            p.id,
            p.kind,
            p.abi.0,
            p.abi.1,
            p.devices,
            p.detail
        );
    }
    report.plugins
}

/// The profile plugins' routes, checked against the built-in ones and each other: a profile that cannot be
/// mounted is one "plugin rejected" line, like the loader's.
fn mount_profiles(plugins: &[serve_runtime::PluginHandle]) -> serve_http::Profiles {
    let mut found = Vec::new();
    for p in plugins.iter().filter(|p| p.kind == PluginKind::PROFILE) {
        let events = match p.profile_events().transpose() {
            Ok(events) => events,
            Err(e) => {
                log::warn!("plugin rejected: {}: {e}", p.path.display());
                continue;
            }
        };
        match p.profile() {
            Ok(profile) => found.push(serve_http::ProfilePlugin {
                id: p.id.clone(),
                path: p.path.clone(),
                profile,
                events,
            }),
            Err(e) => log::warn!("plugin rejected: {}: {e}", p.path.display()),
        }
    }
    let (profiles, rejected) = serve_http::Profiles::mount(found);
    for r in rejected {
        log::warn!("plugin rejected: {r}");
    }
    for line in profiles.describe() {
        log::info!("profile route {line}");
    }
    profiles
}
