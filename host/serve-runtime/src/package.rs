//! Model packages: the `model.json` schema, its validation, and where a package's files come from.
//!
//! A package is either a directory on the server (JSON registration names its absolute base) or an uploaded
//! set of files (multipart registration: programs and metadata in their own logical namespace, parameter files
//! only under the operator's parameter root). Both are a [`PackageFiles`]: program and asset paths resolve
//! against the package's base and may not escape it; checkpoint paths resolve against the parameter root.
//!
//! Errors name the file and the field (`model.json: field `capacities.max_batch_units`: expected a positive
//! integer, found 0`).

use crate::Error;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

/// `model.json`, as written by package authors.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelDoc {
    /// Default model name (registration can override it).
    pub name: Option<String>,
    /// The contract the package implements (`finite`, ...).
    pub contract: String,
    /// The HTTP role it serves under its contract (for `finite`: `embeddings` or `decisions`).
    pub role: String,
    /// Program roles -> files (`.loom` or `.loombc`).
    pub programs: Programs,
    #[serde(default)]
    pub definition: Definition,
    /// Named assets (`tokenizer`), relative to the package base.
    #[serde(default)]
    pub assets: BTreeMap<String, String>,
    #[serde(default)]
    pub capacities: Capacities,
    /// Device choice: `"cpu"`, `"vulkan:0"`, or a preference list.
    #[serde(default)]
    pub device: Option<DeviceChoice>,
    #[serde(default)]
    pub memory: Memory,
    /// Run-time bounds of the model's device work (`"limits": {"kernel_steps": N}`).
    #[serde(default)]
    pub limits: Limits,
    /// How many invocation-declared stage sets are kept compiled (LRU).
    #[serde(default = "default_spec_cache")]
    pub specialization_cache: usize,
    #[serde(default)]
    pub fuel: Fuel,
    /// How checkpoint bytes are read (`"io": {"direct": true}`: direct I/O).
    #[serde(default)]
    pub io: Io,
    /// The source-owned options object, given to `prepare` as JSON text and through the `options` module.
    #[serde(default)]
    pub options: serde_json::Map<String, serde_json::Value>,
    /// Another registered model whose results this one consumes on the device (`"upstream": {"model":
    /// "minilm"}`; finite packages only): a request is run by that model first and its result rows, left on
    /// the device, are this model's input.
    #[serde(default)]
    pub upstream: Option<Upstream>,
}

/// `model.json`'s `upstream` object.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    /// The producing model's registered name.
    pub model: String,
}

fn default_spec_cache() -> usize {
    8
}

// No `deny_unknown_fields` here: `flatten` collects the other roles (serde cannot combine the two).
#[derive(Debug, Clone, Deserialize)]
pub struct Programs {
    pub prepare: String,
    pub control: String,
    /// Extra files compiled into the catalog under these role names (`config`, `kernel`, ...).
    #[serde(flatten)]
    pub other: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Definition {
    /// Shared VM and native providers (motif libraries, the package's kernels), relative to the package base.
    #[serde(default)]
    pub sources: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capacities {
    /// Requests waiting for a cohort, per model; more are refused with 429.
    #[serde(default = "default_queue")]
    pub max_queue: usize,
    /// Bytes of one request's input record.
    #[serde(default = "default_request_bytes")]
    pub max_request_bytes: usize,
}

impl Default for Capacities {
    fn default() -> Self {
        Capacities {
            max_queue: default_queue(),
            max_request_bytes: default_request_bytes(),
        }
    }
}

fn default_queue() -> usize {
    1024
}
fn default_request_bytes() -> usize {
    1 << 20
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum DeviceChoice {
    One(String),
    Preference(Vec<String>),
}

impl DeviceChoice {
    pub fn preferences(&self) -> Vec<String> {
        match self {
            DeviceChoice::One(s) => vec![s.clone()],
            DeviceChoice::Preference(v) => v.clone(),
        }
    }
}

/// `limits` of `model.json`: run-time bounds of the model's device work.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// The step budget of each kernel dispatch (one step per program instance and per iteration of a kernel
    /// `for` loop; see `loom_ir::kernel::RunBounds`). Absent: the operator's cap (`--max-kernel-steps`).
    #[serde(default)]
    pub kernel_steps: Option<u64>,
}

impl ModelDoc {
    /// The step budget of each of this model's dispatches under `limits` (its own, or the operator's cap).
    pub fn kernel_steps(&self, limits: &OperatorLimits) -> u64 {
        self.limits
            .kernel_steps
            .unwrap_or(limits.max_kernel_steps)
            .min(limits.max_kernel_steps)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Memory {
    /// The model's device-memory budget: parameters, stage workspace, cohort buffers.
    #[serde(default = "default_device_bytes")]
    pub device_bytes: u64,
    /// Cap on the source state retained across invocations (the cold `!opaque`).
    #[serde(default = "default_state_bytes")]
    pub state_bytes: u64,
    /// Per-invocation VM memory cap.
    #[serde(default = "default_invoke_bytes")]
    pub invocation_bytes: u64,
}

impl Default for Memory {
    fn default() -> Self {
        Memory {
            device_bytes: default_device_bytes(),
            state_bytes: default_state_bytes(),
            invocation_bytes: default_invoke_bytes(),
        }
    }
}

fn default_device_bytes() -> u64 {
    1 << 30
}
fn default_state_bytes() -> u64 {
    16 << 20
}
fn default_invoke_bytes() -> u64 {
    64 << 20
}

/// Checkpoint reads (`parameters.gather`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Io {
    /// Direct I/O (`O_DIRECT`, bypassing the page cache) for the ranges `parameters.gather` reads: the device
    /// must queue file reads, and every range's file offset, length and destination offset must be aligned
    /// (4096 bytes on the CPU HAL); a misaligned range fails its gather (never a buffered fallback). Resident
    /// parameters are placed through direct reads too (aligned blocks staged on the host, see
    /// `checkpoint::Source::read_direct`).
    #[serde(default)]
    pub direct: bool,
}

/// Fuel budgets per entry (`prepare` and the contract's entries, checked against the contract when the package
/// is prepared); an entry without one gets the default. The server caps each at [`MAX_FUEL`].
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(transparent)]
pub struct Fuel(pub BTreeMap<String, u64>);

impl Fuel {
    /// The budget of cold `prepare`.
    pub fn prepare(&self) -> u64 {
        self.0
            .get("prepare")
            .copied()
            .unwrap_or_else(default_cold_fuel)
    }

    /// The budget of control entry `entry`.
    pub fn entry(&self, entry: &str) -> u64 {
        self.0.get(entry).copied().unwrap_or_else(default_warm_fuel)
    }
}

fn default_cold_fuel() -> u64 {
    100_000_000
}
fn default_warm_fuel() -> u64 {
    10_000_000
}

/// The server-wide cap on any fuel budget a package asks for.
pub const MAX_FUEL: u64 = 10_000_000_000;

/// What the operator allows packages (the binary's flags). Checked at every registration.
#[derive(Debug, Clone)]
pub struct OperatorLimits {
    /// Server-local packages, and every file they read (programs, `definition.sources`, assets, checkpoints),
    /// resolve inside one of these directories, with symlinks resolved (canonical paths). Empty: each package
    /// reads only inside its own directory.
    pub package_roots: Vec<PathBuf>,
    /// The largest `memory.invocation_bytes` a package may declare.
    pub max_invocation_bytes: u64,
    /// The largest `memory.state_bytes` a package may declare.
    pub max_state_bytes: u64,
    /// The largest `limits.kernel_steps` a package may declare, and the budget of packages that declare none.
    pub max_kernel_steps: u64,
    /// The operator's parameter root (`--params-root`, canonical): besides its own parameter root, a package's
    /// `prepare.source(directory, path)` may name an absolute directory inside it (weights on a shared volume,
    /// packages elsewhere). None: only the asset root.
    pub params_root: Option<PathBuf>,
}

/// Default [`OperatorLimits::max_invocation_bytes`]: 1 GiB.
pub const DEFAULT_MAX_INVOCATION_BYTES: u64 = 1 << 30;
/// Default [`OperatorLimits::max_state_bytes`]: 256 MiB.
pub const DEFAULT_MAX_STATE_BYTES: u64 = 256 << 20;
/// Default [`OperatorLimits::max_kernel_steps`]: 2^30 steps (about a second of an empty loop on one core;
/// MiniLM's largest dispatch takes a few thousand).
pub const DEFAULT_MAX_KERNEL_STEPS: u64 = 1 << 30;
/// The largest program or `definition.sources` file a package may name.
pub const MAX_PROGRAM_BYTES: u64 = 16 << 20;

impl Default for OperatorLimits {
    fn default() -> Self {
        OperatorLimits {
            package_roots: Vec::new(),
            max_invocation_bytes: DEFAULT_MAX_INVOCATION_BYTES,
            max_state_bytes: DEFAULT_MAX_STATE_BYTES,
            max_kernel_steps: DEFAULT_MAX_KERNEL_STEPS,
            params_root: None,
        }
    }
}

impl OperatorLimits {
    /// The declared caps of `doc` within these limits (errors name the field and the limit).
    pub fn check_doc(&self, file: &str, doc: &ModelDoc) -> Result<(), Error> {
        for (field, v, max, flag) in [
            (
                "memory.invocation_bytes",
                doc.memory.invocation_bytes,
                self.max_invocation_bytes,
                "--max-invocation-bytes",
            ),
            (
                "memory.state_bytes",
                doc.memory.state_bytes,
                self.max_state_bytes,
                "--max-state-bytes",
            ),
        ] {
            if v > max {
                return Err(Error::package(
                    file,
                    field,
                    format!("{v} bytes is over this server's limit of {max} bytes ({flag})"),
                ));
            }
        }
        if let Some(v) = doc.limits.kernel_steps {
            if v > self.max_kernel_steps {
                return Err(Error::package(
                    file,
                    "limits.kernel_steps",
                    format!(
                        "{v} steps is over this server's limit of {} steps (--max-kernel-steps)",
                        self.max_kernel_steps
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Whether `canonical` (a canonical path) is a place a server-local package based at `base` may read:
    /// inside a package root, or inside `base` itself when no root is configured.
    pub fn admits(&self, base: &Path, canonical: &Path) -> bool {
        if self.package_roots.is_empty() {
            return base.canonicalize().is_ok_and(|b| canonical.starts_with(b));
        }
        self.package_roots.iter().any(|r| canonical.starts_with(r))
    }

    /// Checks that a server-local package directory lies inside the package roots.
    pub fn check_base(&self, base: &Path) -> Result<(), Error> {
        let canon = base.canonicalize().map_err(|_| {
            Error::BadRequest("the package directory does not exist or cannot be read".into())
        })?;
        if !self.package_roots.is_empty()
            && !self.package_roots.iter().any(|r| canon.starts_with(r))
        {
            return Err(Error::BadRequest(
                "the package directory is outside the package roots this server allows (--package-root)"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// Where a package's files are.
#[derive(Debug, Clone)]
pub enum PackageFiles {
    /// A directory on the server.
    Dir(PathBuf),
    /// Uploaded files (relative path -> bytes). Checkpoint paths resolve in the upload's own parameter files
    /// when it carried any (`params`), otherwise under the operator's `params_root`.
    Uploaded {
        files: BTreeMap<String, Vec<u8>>,
        params_root: Option<PathBuf>,
        params: Option<std::sync::Arc<UploadedParams>>,
    },
}

/// The parameter files that came with one uploaded package: a directory of its own (so two uploads never
/// collide), removed when the last holder of the package's files (the prepared model) is dropped.
#[derive(Debug)]
pub struct UploadedParams {
    dir: PathBuf,
    files: BTreeSet<String>,
}

impl UploadedParams {
    /// A new, empty directory under `parent` (created if missing), unique to this upload.
    pub fn create(parent: &Path) -> std::io::Result<UploadedParams> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        std::fs::create_dir_all(parent)?;
        let parent = parent.canonicalize()?;
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let dir = parent.join(format!("upload-{}-{n}", std::process::id()));
            match std::fs::create_dir(&dir) {
                Ok(()) => {
                    return Ok(UploadedParams {
                        dir,
                        files: BTreeSet::new(),
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Where the uploaded parameter file `rel` (normalised by [`relative`]) is to be written; records it and
    /// creates its parent directories. `None` when the upload already has a file at `rel`.
    pub fn add(&mut self, rel: &str) -> std::io::Result<Option<PathBuf>> {
        if !self.files.insert(rel.to_string()) {
            return Ok(None);
        }
        let path = self.dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        Ok(Some(path))
    }

    /// The directory checkpoint paths resolve in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The package-relative paths of the uploaded parameter files.
    pub fn files(&self) -> &BTreeSet<String> {
        &self.files
    }
}

impl Drop for UploadedParams {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Checks a registration's `manifest` (the package's manifest to prepare instead of `model.json`, a deployment
/// of the same package family): a `.json` file name in the package's base directory, `[A-Za-z0-9._-]`, at most
/// 128 bytes.
pub fn manifest_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name.ends_with(".json")
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`manifest` {name:?}: expected the name of a `.json` file in the package's directory (1 to 128 \
             characters of [A-Za-z0-9._-], not starting with a dot)"
        ))
    }
}

/// Normalises a package-relative path: no absolute paths, no `..` escaping the base.
pub fn relative(doc_file: &str, field: &str, path: &str) -> Result<String, Error> {
    let p = Path::new(path);
    let mut parts: Vec<String> = Vec::new();
    for c in p.components() {
        match c {
            Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
            Component::CurDir => {}
            Component::ParentDir => {
                if parts.pop().is_none() {
                    return Err(Error::package(
                        doc_file,
                        field,
                        format!("path {path:?} escapes the package base"),
                    ));
                }
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(Error::package(
                    doc_file,
                    field,
                    format!("path {path:?} must be relative to the package base"),
                ));
            }
        }
    }
    if parts.is_empty() {
        return Err(Error::package(doc_file, field, "empty path"));
    }
    Ok(parts.join("/"))
}

impl PackageFiles {
    /// Reads package file `rel` (already normalised by [`relative`]).
    pub fn read(&self, rel: &str) -> Result<Vec<u8>, String> {
        match self {
            PackageFiles::Dir(base) => {
                let path = base.join(rel);
                // Symlinks must not lead out of the base either. Messages name the package-relative path only.
                let canon = path
                    .canonicalize()
                    .map_err(|e| format!("{rel}: {}", io_text(&e)))?;
                let base_canon = base
                    .canonicalize()
                    .map_err(|e| format!("the package directory: {}", io_text(&e)))?;
                if !canon.starts_with(&base_canon) {
                    return Err(format!("{rel}: resolves outside the package directory"));
                }
                std::fs::read(&canon).map_err(|e| format!("{rel}: {}", io_text(&e)))
            }
            PackageFiles::Uploaded { files, .. } => files
                .get(rel)
                .cloned()
                .ok_or_else(|| format!("{rel}: not in the uploaded package")),
        }
    }

    /// Reads a program or `definition.sources` entry: for a server-local package, relative to its directory and
    /// allowed to name shared libraries elsewhere (`../motifs/norm.loom`) inside the operator's package roots
    /// (symlinks resolved; see [`OperatorLimits::admits`]); for an uploaded package, only its own files. At most
    /// [`MAX_PROGRAM_BYTES`]. Messages name the path as the package wrote it, never the server's.
    pub fn read_source(
        &self,
        doc_file: &str,
        field: &str,
        path: &str,
        limits: &OperatorLimits,
    ) -> Result<Vec<u8>, Error> {
        match self {
            PackageFiles::Dir(base) => {
                if Path::new(path).is_absolute() {
                    return Err(Error::package(
                        doc_file,
                        field,
                        format!("path {path:?} must be relative to the package base"),
                    ));
                }
                let bad = |m: String| Error::package(doc_file, field, format!("{path}: {m}"));
                let canon = base
                    .join(path)
                    .canonicalize()
                    .map_err(|e| bad(io_text(&e)))?;
                if !limits.admits(base, &canon) {
                    return Err(bad(
                        "resolves outside the package roots this server allows".into()
                    ));
                }
                let len = std::fs::metadata(&canon)
                    .map_err(|e| bad(io_text(&e)))?
                    .len();
                if len > MAX_PROGRAM_BYTES {
                    return Err(bad(format!(
                        "{len} bytes; a program or source file has at most {MAX_PROGRAM_BYTES}"
                    )));
                }
                std::fs::read(&canon).map_err(|e| bad(io_text(&e)))
            }
            PackageFiles::Uploaded { .. } => {
                let rel = relative(doc_file, field, path)?;
                self.read(&rel)
                    .map_err(|m| Error::package(doc_file, field, m))
            }
        }
    }

    /// The `name` in the package's `model.json` (registrations that name no model use it).
    pub fn default_name(&self, manifest: &str) -> Result<String, String> {
        let doc = self
            .read(manifest)
            .map_err(|m| format!("{manifest}: {m}"))?;
        let v: serde_json::Value =
            serde_json::from_slice(&doc).map_err(|e| format!("{manifest}: {e}"))?;
        v.get("name")
            .and_then(serde_json::Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| format!("no `name` in the request or in {manifest}"))
    }

    /// The base directory checkpoint paths resolve against.
    pub fn params_root(&self) -> Option<&Path> {
        match self {
            PackageFiles::Dir(base) => Some(base),
            PackageFiles::Uploaded {
                params: Some(p), ..
            } => Some(p.dir()),
            PackageFiles::Uploaded { params_root, .. } => params_root.as_deref(),
        }
    }

    /// A name for messages.
    pub fn describe(&self) -> String {
        match self {
            PackageFiles::Dir(base) => base.display().to_string(),
            PackageFiles::Uploaded { .. } => "<uploaded package>".to_string(),
        }
    }
}

/// An I/O error as a message that names no path (the caller names the file by its package-relative path).
pub(crate) fn io_text(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file or directory".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        std::io::ErrorKind::IsADirectory => "is a directory".into(),
        _ => e.kind().to_string(),
    }
}

/// Parses and validates `model.json` bytes. The `contract` and `role` fields are checked against the
/// contracts the server serves by [`crate::contract::Contracts::for_doc`].
pub fn parse_model_doc(file: &str, bytes: &[u8]) -> Result<ModelDoc, Error> {
    check_io(file, bytes)?;
    let doc: ModelDoc = serde_json::from_slice(bytes).map_err(|e| Error::Package {
        file: file.to_string(),
        field: String::new(),
        message: e.to_string(),
    })?;
    if let Some(name) = &doc.name {
        check_model_name(name).map_err(|m| Error::package(file, "name", m))?;
    }
    if let Some(u) = &doc.upstream {
        check_model_name(&u.model).map_err(|m| Error::package(file, "upstream.model", m))?;
    }
    if doc.capacities.max_queue == 0 {
        return Err(Error::package(
            file,
            "capacities.max_queue",
            "expected a positive integer, found 0",
        ));
    }
    if doc.capacities.max_request_bytes == 0 {
        return Err(Error::package(
            file,
            "capacities.max_request_bytes",
            "expected a positive integer, found 0",
        ));
    }
    if doc.specialization_cache == 0 {
        return Err(Error::package(
            file,
            "specialization_cache",
            "expected a positive integer, found 0",
        ));
    }
    for (entry, &v) in &doc.fuel.0 {
        if v == 0 || v > MAX_FUEL {
            return Err(Error::package(
                file,
                &format!("fuel.{entry}"),
                format!("expected 1..={MAX_FUEL}, found {v}"),
            ));
        }
    }
    for (field, v) in [
        ("memory.device_bytes", doc.memory.device_bytes),
        ("memory.state_bytes", doc.memory.state_bytes),
        ("memory.invocation_bytes", doc.memory.invocation_bytes),
    ] {
        if v == 0 {
            return Err(Error::package(
                file,
                field,
                "expected a positive byte count, found 0",
            ));
        }
    }
    if doc.limits.kernel_steps == Some(0) {
        return Err(Error::package(
            file,
            "limits.kernel_steps",
            "expected a positive step count, found 0",
        ));
    }
    if let Some(d) = &doc.device {
        let prefs = d.preferences();
        if prefs.is_empty() {
            return Err(Error::package(
                file,
                "device",
                "expected a device name or a non-empty preference list",
            ));
        }
        for p in prefs {
            crate::device::parse_device_name(&p).map_err(|m| Error::package(file, "device", m))?;
        }
    }
    // `definition.sources` are checked where they are read: a server-local package may name shared motif
    // libraries outside its directory; an uploaded one may not (see `PackageFiles::read_source`).
    for (k, v) in &doc.assets {
        relative(file, &format!("assets.{k}"), v)?;
    }
    Ok(doc)
}

/// `io`'s shape, checked first so that a mistake names its field (serde's message would not).
fn check_io(file: &str, bytes: &[u8]) -> Result<(), Error> {
    let Ok(serde_json::Value::Object(doc)) = serde_json::from_slice::<serde_json::Value>(bytes)
    else {
        return Ok(()); // the typed parse reports it
    };
    let Some(io) = doc.get("io") else {
        return Ok(());
    };
    let io = io
        .as_object()
        .ok_or_else(|| Error::package(file, "io", format!("expected an object, found {io}")))?;
    for (k, v) in io {
        match k.as_str() {
            "direct" if v.is_boolean() => {}
            "direct" => {
                return Err(Error::package(
                    file,
                    "io.direct",
                    format!("expected true or false, found {v}"),
                ));
            }
            other => {
                return Err(Error::package(
                    file,
                    &format!("io.{other}"),
                    "unknown field (`io` has `direct`)",
                ));
            }
        }
    }
    Ok(())
}

/// Model names appear in URLs and metrics: `[A-Za-z0-9._-]{1,128}`.
pub fn check_model_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 128
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(format!(
            "a model name is 1 to 128 characters of [A-Za-z0-9._-], found {name:?}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"contract": "finite", "role": "embeddings",
        "programs": {"prepare": "p.loom", "control": "c.loom", "kernel": "k.loom"}}"#;

    /// `GOOD` with `edit` applied, parsed.
    fn parse(edit: impl FnOnce(&mut serde_json::Value)) -> Result<ModelDoc, Error> {
        let mut v: serde_json::Value = serde_json::from_str(GOOD).unwrap();
        edit(&mut v);
        parse_model_doc("model.json", v.to_string().as_bytes())
    }

    fn err(edit: impl FnOnce(&mut serde_json::Value)) -> String {
        parse(edit).unwrap_err().to_string()
    }

    #[test]
    fn a_minimal_package_gets_the_defaults() {
        let d = parse(|_| {}).unwrap();
        assert_eq!(d.programs.prepare, "p.loom");
        assert_eq!(
            d.programs.other.get("kernel").map(String::as_str),
            Some("k.loom")
        );
        assert!(d.capacities.max_queue > 0 && d.specialization_cache > 0);
        assert!(d.device.is_none() && !d.io.direct);
    }

    #[test]
    fn errors_name_the_file_and_the_field() {
        type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;
        let cases: Vec<(Edit, &str)> = vec![
            (
                Box::new(|v| v["capacities"] = serde_json::json!({"max_queue": 0})),
                "model.json: field `capacities.max_queue`: expected a positive integer, found 0",
            ),
            (
                Box::new(|v| v["specialization_cache"] = 0.into()),
                "field `specialization_cache`",
            ),
            (
                Box::new(|v| v["fuel"] = serde_json::json!({"run": 0})),
                "field `fuel.run`: expected 1..=",
            ),
            (
                Box::new(|v| v["memory"] = serde_json::json!({"state_bytes": 0})),
                "field `memory.state_bytes`: expected a positive byte count",
            ),
            (
                Box::new(|v| v["name"] = "a b".into()),
                "field `name`: a model name is",
            ),
            (
                Box::new(|v| v["device"] = "gpu:x".into()),
                "field `device`: device \"gpu:x\": the index after `:` must be a number",
            ),
            (
                Box::new(|v| v["device"] = serde_json::json!([])),
                "field `device`: expected a device name or a non-empty preference list",
            ),
            (
                Box::new(|v| v["io"] = serde_json::json!({"direct": "yes"})),
                "field `io.direct`: expected true or false",
            ),
            (
                Box::new(|v| v["io"] = serde_json::json!({"odirect": true})),
                "field `io.odirect`: unknown field",
            ),
            (
                Box::new(|v| v["assets"] = serde_json::json!({"tokenizer": "../t.json"})),
                "assets.tokenizer",
            ),
            (Box::new(|v| v["typo"] = 1.into()), "unknown field `typo`"),
            (
                Box::new(|v| v["capacities"] = serde_json::json!({"max_queue": -1})),
                "model.json",
            ),
        ];
        for (edit, want) in cases {
            let e = err(edit);
            assert!(e.starts_with("model.json"), "{e}");
            assert!(e.contains(want), "{e:?} should contain {want:?}");
        }
    }

    #[test]
    fn not_json_is_an_error_naming_the_file() {
        let e = parse_model_doc("model.json", b"{\"contract\": ").unwrap_err();
        assert!(matches!(e, Error::Package { .. }), "{e}");
        assert!(e.to_string().starts_with("model.json"), "{e}");
    }

    #[test]
    fn model_names_are_url_and_metric_safe() {
        assert!(check_model_name("all-MiniLM_L6.v2").is_ok());
        for bad in ["", "a/b", "a b", "é", "x\"y", &"n".repeat(129)] {
            assert!(check_model_name(bad).is_err(), "{bad:?}");
        }
    }
}
