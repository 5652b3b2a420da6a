//! The plugin loader: finds loom plugins (`cdylib`s exporting `loom_plugin_api::LoomPlugin`) in plugin
//! directories, checks each one and returns the usable ones plus **one clear line per rejected file**.
//!
//! Directories: the configured ones, then the default `plugins/` next to the current executable
//! ([`default_dir`]; silently skipped when absent). Every file with the platform's library extension is
//! checked on its own, in name order, so one bad file never stops the others:
//!
//! 1. `lib_header_from_path`: a file that is not a loadable library, or has no abi_stable root module, is
//!    "not a loom plugin". (`RootModule::load_from_directory` is not used: it caches one library per interface
//!    type.)
//! 2. The library's abi_stable version string (pinned to `ABI_MAJOR.0.0` by the API crate) and then the root
//!    module's `abi_major`/`abi_minor`: same major and an older or equal minor are accepted, anything else is
//!    an "ABI version mismatch".
//! 3. `LibHeader::check_layout`: a root module of another shape is a "layout mismatch"; the line shows the
//!    first line of abi_stable's report (which runs to hundreds of lines), the full report is logged at debug
//!    level.
//! 4. The kind: [`PluginKind::HAL`] (its `hal` factory is always present), [`PluginKind::CODEC`], which
//!    needs the `codec` factory appended in ABI 1.1 (a codec plugin built against 1.0 cannot have one and is
//!    rejected as "unsupported plugin"), or [`PluginKind::PROFILE`], which needs the `profile` factory
//!    appended in ABI 1.2; any other kind is rejected the same way. Older plugins (1.0 to 1.2) still load:
//!    the root fields appended after their version read as absent, and [`LoadedPlugin::codec`] /
//!    [`LoadedPlugin::profile`] say so ([`LoadedPlugin::hal_files`], appended in 1.3, and
//!    [`LoadedPlugin::profile_events`], appended in 1.4, likewise). (Whether a profile's routes can be mounted is the HTTP server's
//!    check, not the loader's.)
//! 5. The plugin's `probe`: "device absent" is a clean rejection ("probe failed: device absent"), as are a
//!    failed probe and a panic the plugin caught while probing. A codec plugin answers `Available` with 1
//!    "device" (the codec itself).
//!
//! Loaded libraries are never unloaded (abi_stable leaks them on purpose: their `'static` data must outlive
//! every use). A second plugin with an id already loaded is rejected as a duplicate.

use std::collections::HashSet;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use abi_stable::library::{LibraryError, lib_header_from_path};
use abi_stable::std_types::{RBoxError, RResult};
use loom_plugin_api::{
    ABI_MAJOR, ABI_MINOR, CodecBox, HalDeviceParts, HalDeviceWithFiles, HalDriverBox,
    LoomPlugin_Ref, PluginKind, Probe, ProbeStatus, ProfileBox, ProfileEventsBox, abi_1_0, abi_1_1,
    abi_1_2, abi_1_3, abi_1_4, panic_message,
};

type Factory<T> = extern "C" fn() -> RResult<T, RBoxError>;
type HalFilesOpen = extern "C" fn(u32) -> RResult<HalDeviceWithFiles, RBoxError>;
type HalOpen = extern "C" fn(u32) -> RResult<HalDeviceParts, RBoxError>;

/// A checked root module, in the shape it was checked against (see `loom_plugin_api::abi_1_0`).
#[derive(Clone, Copy)]
enum Root {
    /// The current shape.
    Current(LoomPlugin_Ref),
    /// ABI 1.4: no `hal_open` field.
    V1_4(abi_1_4::LoomPlugin_Ref),
    /// ABI 1.3: no `profile_events` field.
    V1_3(abi_1_3::LoomPlugin_Ref),
    /// ABI 1.2: no `hal_files` field.
    V1_2(abi_1_2::LoomPlugin_Ref),
    /// ABI 1.1: no `profile` field.
    V1_1(abi_1_1::LoomPlugin_Ref),
    /// ABI 1.0: no `codec` field.
    V1_0(abi_1_0::LoomPlugin_Ref),
}

/// `$e` over the root module `$m` of whichever shape (for the fields every shape has).
macro_rules! any_shape {
    ($root:expr, $m:ident => $e:expr) => {
        match $root {
            Root::Current($m) => $e,
            Root::V1_4($m) => $e,
            Root::V1_3($m) => $e,
            Root::V1_2($m) => $e,
            Root::V1_1($m) => $e,
            Root::V1_0($m) => $e,
        }
    };
}

impl Root {
    fn abi(self) -> (u16, u16) {
        any_shape!(self, m => (m.abi_major(), m.abi_minor()))
    }
    fn id(self) -> String {
        any_shape!(self, m => m.id().as_str().to_string())
    }
    fn kind(self) -> PluginKind {
        any_shape!(self, m => m.kind())
    }
    fn probe(self) -> extern "C" fn() -> Probe {
        any_shape!(self, m => m.probe())
    }
    fn hal(self) -> Factory<HalDriverBox> {
        any_shape!(self, m => m.hal())
    }
    fn codec(self) -> Option<Factory<CodecBox>> {
        match self {
            Root::Current(m) => m.codec(),
            Root::V1_4(m) => m.codec(),
            Root::V1_3(m) => m.codec(),
            Root::V1_2(m) => m.codec(),
            Root::V1_1(m) => m.codec(),
            Root::V1_0(_) => None,
        }
    }
    fn profile(self) -> Option<Factory<ProfileBox>> {
        match self {
            Root::Current(m) => m.profile(),
            Root::V1_4(m) => m.profile(),
            Root::V1_3(m) => m.profile(),
            Root::V1_2(m) => m.profile(),
            Root::V1_1(_) | Root::V1_0(_) => None,
        }
    }
    fn hal_files(self) -> Option<HalFilesOpen> {
        match self {
            Root::Current(m) => m.hal_files(),
            Root::V1_4(m) => m.hal_files(),
            Root::V1_3(m) => m.hal_files(),
            Root::V1_2(_) | Root::V1_1(_) | Root::V1_0(_) => None,
        }
    }
    fn profile_events(self) -> Option<Factory<ProfileEventsBox>> {
        match self {
            Root::Current(m) => m.profile_events(),
            Root::V1_4(m) => m.profile_events(),
            Root::V1_3(_) | Root::V1_2(_) | Root::V1_1(_) | Root::V1_0(_) => None,
        }
    }
    fn hal_open(self) -> Option<HalOpen> {
        match self {
            Root::Current(m) => m.hal_open(),
            _ => None,
        }
    }
}

/// Why one file was not loaded. Each renders as one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// Not a loadable library, or a library without a loom root module.
    #[error("not a loom plugin ({0})")]
    NotAPlugin(String),
    /// Built against an incompatible `loom-plugin-api`.
    #[error("ABI version mismatch: the plugin has {plugin}, this host accepts {host}")]
    AbiVersion {
        /// The plugin's version.
        plugin: String,
        /// What the host accepts.
        host: String,
    },
    /// The root module's layout differs from this host's.
    #[error("layout mismatch: {first_line} (full report at debug level)")]
    Layout {
        /// The first line of abi_stable's report.
        first_line: String,
    },
    /// A kind this host does not use, or a codec (profile) plugin without a codec (profile) factory.
    #[error("unsupported plugin: {0}")]
    Unsupported(String),
    /// The probe answered that the device is not on this machine.
    #[error("probe failed: device absent ({0})")]
    DeviceAbsent(String),
    /// The probe reported an error.
    #[error("probe failed: {0}")]
    ProbeFailed(String),
    /// The probe panicked (caught inside the plugin, or by the host while loading).
    #[error("panicked while probing: {0}")]
    Panicked(String),
    /// Another file already provided this plugin id.
    #[error("duplicate plugin id `{id}` (already loaded from {first})")]
    Duplicate {
        /// The id.
        id: String,
        /// Where it was loaded from first.
        first: String,
    },
    /// A configured directory could not be read.
    #[error("cannot read the plugin directory: {0}")]
    Unreadable(String),
}

/// A rejected file (or directory) and why: displays as the one line to show the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedFile {
    pub path: PathBuf,
    pub reason: Rejection,
}

impl fmt::Display for RejectedFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.reason)
    }
}

/// A plugin that passed every check.
#[derive(Clone)]
pub struct LoadedPlugin {
    /// The plugin's id, e.g. `cpu-0001`.
    pub id: String,
    pub kind: PluginKind,
    pub path: PathBuf,
    /// The plugin's (major, minor) ABI version.
    pub abi: (u16, u16),
    /// Devices the probe found.
    pub devices: u32,
    /// The probe's detail line.
    pub detail: String,
    module: Root,
}

impl fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("id", &self.id)
            .field("kind", &self.kind)
            .field("path", &self.path)
            .field("abi", &self.abi)
            .field("devices", &self.devices)
            .field("detail", &self.detail)
            .finish_non_exhaustive()
    }
}

/// Errors of a loaded plugin's factories.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    #[error("plugin `{id}` is a {kind} plugin, not a HAL")]
    NotAHal { id: String, kind: PluginKind },
    #[error("plugin `{id}` is a {kind} plugin, not a codec")]
    NotACodec { id: String, kind: PluginKind },
    #[error(
        "plugin `{id}` was built against ABI {major}.{minor}, which has no codec factory (1.1 added it)"
    )]
    NoCodecFactory { id: String, major: u16, minor: u16 },
    #[error("plugin `{id}` is a {kind} plugin, not an HTTP profile")]
    NotAProfile { id: String, kind: PluginKind },
    #[error(
        "plugin `{id}` was built against ABI {major}.{minor}, which has no profile factory (1.2 added it)"
    )]
    NoProfileFactory { id: String, major: u16, minor: u16 },
    #[error("plugin `{id}`: {message}")]
    Plugin { id: String, message: String },
}

impl LoadedPlugin {
    /// The plugin's HAL driver.
    pub fn hal(&self) -> Result<HalDriverBox, PluginError> {
        if self.kind != PluginKind::HAL {
            return Err(PluginError::NotAHal {
                id: self.id.clone(),
                kind: self.kind,
            });
        }
        (self.module.hal())()
            .into_result()
            .map_err(|e| PluginError::Plugin {
                id: self.id.clone(),
                message: e.to_string(),
            })
    }

    /// The plugin's codec factory's answer: the [`CodecBox`] that opens audio and image codecs.
    pub fn codec(&self) -> Result<CodecBox, PluginError> {
        if self.kind != PluginKind::CODEC {
            return Err(PluginError::NotACodec {
                id: self.id.clone(),
                kind: self.kind,
            });
        }
        let Some(factory) = self.module.codec() else {
            return Err(PluginError::NoCodecFactory {
                id: self.id.clone(),
                major: self.abi.0,
                minor: self.abi.1,
            });
        };
        factory().into_result().map_err(|e| PluginError::Plugin {
            id: self.id.clone(),
            message: e.to_string(),
        })
    }

    /// Whether the root module has the `codec` field (ABI 1.1 and later).
    pub fn has_codec_factory(&self) -> bool {
        self.module.codec().is_some()
    }

    /// The plugin's profile factory's answer: the [`ProfileBox`] with its routes, `parse` and `encode`.
    pub fn profile(&self) -> Result<ProfileBox, PluginError> {
        if self.kind != PluginKind::PROFILE {
            return Err(PluginError::NotAProfile {
                id: self.id.clone(),
                kind: self.kind,
            });
        }
        let Some(factory) = self.module.profile() else {
            return Err(PluginError::NoProfileFactory {
                id: self.id.clone(),
                major: self.abi.0,
                minor: self.abi.1,
            });
        };
        factory().into_result().map_err(|e| PluginError::Plugin {
            id: self.id.clone(),
            message: e.to_string(),
        })
    }

    /// Whether the root module has the `profile` field (ABI 1.2 and later).
    pub fn has_profile_factory(&self) -> bool {
        self.module.profile().is_some()
    }

    /// The profile's streamed responses (`LoomPlugin::profile_events`, ABI 1.4): `None` when the plugin is
    /// not a profile, was built before 1.4 or answers [`loom_plugin_api::no_profile_events`] (its error text
    /// is [`loom_plugin_api::NO_PROFILE_EVENTS`]): every route then answers with one body. Otherwise the
    /// plugin's [`ProfileEventsBox`], or the other error its factory gave.
    pub fn profile_events(&self) -> Option<Result<ProfileEventsBox, PluginError>> {
        if self.kind != PluginKind::PROFILE {
            return None;
        }
        let factory = self.module.profile_events()?;
        match factory().into_result() {
            Ok(events) => Some(Ok(events)),
            Err(e) if e.to_string() == loom_plugin_api::NO_PROFILE_EVENTS => None,
            Err(e) => Some(Err(PluginError::Plugin {
                id: self.id.clone(),
                message: e.to_string(),
            })),
        }
    }

    /// Opens HAL device `index` with its queued file reads and its control (`LoomPlugin::hal_open`, ABI 1.5):
    /// `None` when the plugin was built before 1.5 or answers [`loom_plugin_api::no_hal_open`] (open it with
    /// [`LoadedPlugin::hal_files`] or [`LoadedPlugin::hal`] then), otherwise the plugin's answer.
    pub fn hal_open(&self, index: u32) -> Option<Result<HalDeviceParts, PluginError>> {
        if self.kind != PluginKind::HAL {
            return Some(Err(PluginError::NotAHal {
                id: self.id.clone(),
                kind: self.kind,
            }));
        }
        let open = self.module.hal_open()?;
        match open(index).into_result() {
            Ok(parts) => Some(Ok(parts)),
            Err(e) if e.to_string() == loom_plugin_api::NO_HAL_OPEN => None,
            Err(e) => Some(Err(PluginError::Plugin {
                id: self.id.clone(),
                message: e.to_string(),
            })),
        }
    }

    /// Opens HAL device `index` with its queued file reads (`LoomPlugin::hal_files`, ABI 1.3): `None` when
    /// the plugin was built before 1.3 (open it with [`LoadedPlugin::hal`] then), otherwise the plugin's
    /// answer (an error from a 1.3 plugin without file reads: `no_hal_files`).
    pub fn hal_files(&self, index: u32) -> Option<Result<HalDeviceWithFiles, PluginError>> {
        if self.kind != PluginKind::HAL {
            return Some(Err(PluginError::NotAHal {
                id: self.id.clone(),
                kind: self.kind,
            }));
        }
        let open = self.module.hal_files()?;
        Some(open(index).into_result().map_err(|e| PluginError::Plugin {
            id: self.id.clone(),
            message: e.to_string(),
        }))
    }
}

/// What a scan found.
#[derive(Debug, Default)]
pub struct LoadReport {
    pub plugins: Vec<LoadedPlugin>,
    pub rejected: Vec<RejectedFile>,
}

/// `plugins/` next to the current executable.
pub fn default_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.join("plugins"))
}

/// Scans `configured` directories, then [`default_dir`] (skipped when it does not exist or is one of them).
pub fn load_all(configured: &[PathBuf]) -> LoadReport {
    let mut dirs: Vec<(PathBuf, bool)> = configured.iter().map(|d| (d.clone(), true)).collect();
    if let Some(d) = default_dir() {
        dirs.push((d, false));
    }
    let mut report = LoadReport::default();
    let mut seen = HashSet::new();
    for (dir, required) in dirs {
        if !required && !dir.is_dir() {
            continue;
        }
        let key = dir.canonicalize().unwrap_or_else(|_| dir.clone());
        if seen.insert(key) {
            scan_into(&dir, &mut report);
        }
    }
    report
}

/// Scans one directory.
pub fn load_dir(dir: &Path) -> LoadReport {
    let mut report = LoadReport::default();
    scan_into(dir, &mut report);
    report
}

fn scan_into(dir: &Path, report: &mut LoadReport) {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            report.rejected.push(RejectedFile {
                path: dir.to_path_buf(),
                reason: Rejection::Unreadable(e.to_string()),
            });
            return;
        }
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && p.extension()
                    .is_some_and(|e| e == std::env::consts::DLL_EXTENSION)
        })
        .collect();
    files.sort();
    for path in files {
        match load_file(&path) {
            Ok(p) => {
                if let Some(first) = report.plugins.iter().find(|q| q.id == p.id) {
                    let reason = Rejection::Duplicate {
                        id: p.id.clone(),
                        first: first.path.display().to_string(),
                    };
                    report.rejected.push(RejectedFile { path, reason });
                } else {
                    log::debug!("loaded plugin {} from {}", p.id, path.display());
                    report.plugins.push(p);
                }
            }
            Err(reason) => report.rejected.push(RejectedFile { path, reason }),
        }
    }
}

fn first_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .to_string()
}

fn host_accepts() -> String {
    format!("{ABI_MAJOR}.0 to {ABI_MAJOR}.{ABI_MINOR}")
}

/// Checks and probes one library.
pub fn load_file(path: &Path) -> Result<LoadedPlugin, Rejection> {
    catch_unwind(AssertUnwindSafe(|| load_file_inner(path)))
        .unwrap_or_else(|p| Err(Rejection::Panicked(panic_message(&*p))))
}

fn load_file_inner(path: &Path) -> Result<LoadedPlugin, Rejection> {
    let header = lib_header_from_path(path).map_err(|e| match e {
        LibraryError::OpenError { err, .. } => {
            Rejection::NotAPlugin(format!("cannot load it: {}", first_line(&err.to_string())))
        }
        LibraryError::GetSymbolError { .. } => {
            Rejection::NotAPlugin("it exports no abi_stable root module".into())
        }
        LibraryError::InvalidAbiHeader(h) => Rejection::AbiVersion {
            plugin: format!("abi_stable ABI {}.{}", h.abi_major, h.abi_minor),
            host: "this host's abi_stable".into(),
        },
        other => Rejection::NotAPlugin(first_line(&other.to_string())),
    })?;
    let vs = header.version_strings();
    let major = vs
        .version
        .split('.')
        .next()
        .and_then(|m| m.parse::<u16>().ok());
    if major != Some(ABI_MAJOR) {
        return Err(Rejection::AbiVersion {
            plugin: vs.version.as_str().to_string(),
            host: host_accepts(),
        });
    }
    // The current shape first, then the older ones, newest first (abi_stable refuses a library with fewer
    // root-module fields than the host's type, so older plugins are checked against their own shape).
    let module = match header.check_layout::<LoomPlugin_Ref>() {
        Ok(m) => Ok(Root::Current(m)),
        Err(e) => header
            .check_layout::<abi_1_4::LoomPlugin_Ref>()
            .map(Root::V1_4)
            .or_else(|_| {
                header
                    .check_layout::<abi_1_3::LoomPlugin_Ref>()
                    .map(Root::V1_3)
            })
            .or_else(|_| {
                header
                    .check_layout::<abi_1_2::LoomPlugin_Ref>()
                    .map(Root::V1_2)
            })
            .or_else(|_| {
                header
                    .check_layout::<abi_1_1::LoomPlugin_Ref>()
                    .map(Root::V1_1)
            })
            .or_else(|_| {
                header
                    .check_layout::<abi_1_0::LoomPlugin_Ref>()
                    .map(Root::V1_0)
            })
            .map_err(|_| e),
    };
    let module = module.map_err(|e| match e {
        LibraryError::AbiInstability(report) => {
            let full = report.to_string();
            log::debug!("{}: layout mismatch, full report:\n{full}", path.display());
            Rejection::Layout {
                first_line: first_line(&full),
            }
        }
        other => {
            let full = other.to_string();
            log::debug!("{}: {full}", path.display());
            Rejection::NotAPlugin(first_line(&full))
        }
    })?;
    let abi = module.abi();
    if abi.0 != ABI_MAJOR || abi.1 > ABI_MINOR {
        return Err(Rejection::AbiVersion {
            plugin: format!("{}.{}", abi.0, abi.1),
            host: host_accepts(),
        });
    }
    let id = module.id();
    let kind = module.kind();
    match kind {
        PluginKind::HAL => {}
        PluginKind::CODEC if module.codec().is_some() => {}
        PluginKind::CODEC => {
            return Err(Rejection::Unsupported(format!(
                "`{id}` is a codec plugin without a codec factory (built against ABI {}.{}; codecs need {ABI_MAJOR}.1)",
                abi.0, abi.1
            )));
        }
        PluginKind::PROFILE if module.profile().is_some() => {}
        PluginKind::PROFILE => {
            return Err(Rejection::Unsupported(format!(
                "`{id}` is a profile plugin without a profile factory (built against ABI {}.{}; profiles need {ABI_MAJOR}.2)",
                abi.0, abi.1
            )));
        }
        other => {
            return Err(Rejection::Unsupported(format!(
                "`{id}` is a {other} plugin, which this host does not load"
            )));
        }
    }
    let probe = (module.probe())();
    classify_probe(&probe)?;
    log::debug!(
        "plugin {id} ({kind}) from {}: {} device(s): {}",
        path.display(),
        probe.devices,
        probe.detail
    );
    Ok(LoadedPlugin {
        id,
        kind,
        path: path.to_path_buf(),
        abi,
        devices: probe.devices,
        detail: probe.detail.as_str().to_string(),
        module,
    })
}

/// The rejection (if any) a probe answer means.
pub fn classify_probe(p: &Probe) -> Result<(), Rejection> {
    let detail = p.detail.as_str().to_string();
    match p.status {
        ProbeStatus::Available if p.devices > 0 => Ok(()),
        ProbeStatus::Available | ProbeStatus::Absent => Err(Rejection::DeviceAbsent(detail)),
        ProbeStatus::Failed => Err(Rejection::ProbeFailed(detail)),
        ProbeStatus::Panicked => Err(Rejection::Panicked(detail)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_answers_are_one_line_each() {
        let line = |p: Probe| {
            RejectedFile {
                path: "x.so".into(),
                reason: classify_probe(&p).unwrap_err(),
            }
            .to_string()
        };
        assert_eq!(
            line(Probe::absent("no vulkan driver")),
            "x.so: probe failed: device absent (no vulkan driver)"
        );
        assert_eq!(
            line(Probe::available(0, "none")),
            "x.so: probe failed: device absent (none)"
        );
        assert_eq!(line(Probe::failed("ioctl")), "x.so: probe failed: ioctl");
        let panicked = loom_plugin_api::guard_probe(|| panic!("boom"));
        assert_eq!(line(panicked), "x.so: panicked while probing: boom");
        assert!(classify_probe(&Probe::available(1, "cpu")).is_ok());
    }

    #[test]
    fn missing_and_junk() {
        let dir = std::env::temp_dir().join(format!("loom-plugins-unit-{}", std::process::id()));
        let r = load_dir(&dir);
        assert!(matches!(r.rejected[0].reason, Rejection::Unreadable(_)));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("junk.so"), b"\x7fELF but not really").unwrap();
        std::fs::write(dir.join("notes.txt"), b"ignored").unwrap();
        let r = load_dir(&dir);
        assert!(r.plugins.is_empty());
        assert_eq!(r.rejected.len(), 1, "{:?}", r.rejected);
        let line = r.rejected[0].to_string();
        assert!(
            line.contains("junk.so: not a loom plugin (cannot load it: "),
            "{line}"
        );
        assert_eq!(line.lines().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
