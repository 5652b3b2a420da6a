//! The stable-ABI interfaces every loom plugin implements: the root module [`LoomPlugin`], the HAL
//! ([`HalDriver`], [`HalDevice`]) and, since ABI 1.1, the codecs ([`Codec`], [`AudioCodec`] with its
//! [`AudioDecodeSession`] and [`ResampleSession`], [`ImageCodec`]), since ABI 1.2, HTTP profiles
//! ([`Profile`]), since ABI 1.3, queued file reads of HAL devices ([`HalFiles`]) and, since ABI 1.4, streamed
//! profile responses ([`ProfileEvents`]) and, since ABI 1.5, run-time bounds, cancellation and executable
//! release of HAL devices ([`HalControl`]).
//!
//! A plugin is a `cdylib` that exports one [`LoomPlugin`] with `#[export_root_module]`; the host
//! (`loom-plugins`) scans a directory, checks each library's header and layout with abi_stable, checks the ABI
//! version, probes the plugin and only then uses it. Libraries are never unloaded.
//!
//! # Shape of the interface
//!
//! Coarse and IREE-shaped, so a later hand-rolled `#[repr(C)]` vtable stays cheap:
//!
//! * a **driver** enumerates devices and opens one;
//! * a **device** has limits, allocates buffers (host-visible byte arrays named by [`BufferId`]), compiles a
//!   specialized stage (`loom_ir::kernel::Stage` encoded by `loom_ir::kernel_codec`) into an [`ExecutableId`],
//!   and executes [`Submission`]s: plain-data [`Command`] lists that wait on and signal timeline points;
//! * a **fence** is a [`TimelinePoint`] `(timeline, value)`. A failed submission fails its signal point with
//!   the error, and every later wait on that timeline reports it.
//!
//! Errors cross the boundary as [`RBoxError`]; for execution failures their text is the kernel contract's
//! `ExecError` text, unchanged.
//!
//! # Codecs (ABI 1.1)
//!
//! A [`PluginKind::CODEC`] plugin's [`LoomPlugin::codec`] returns a [`Codec`], which hands out an
//! [`AudioCodec`] and/or an [`ImageCodec`]:
//!
//! * **audio decoding**: [`AudioCodec::open_decoder`] with a [`DecodeConfig`] (container WAV/MP3/FLAC or auto,
//!   target channel count and rate, a sample budget and an input budget, the largest chunk) opens a
//!   streaming [`AudioDecodeSession`]: `push` bytes, `finish` (the explicit EOF, returns the
//!   [`AudioSourceInfo`]), then `next_chunk` until `None`. Chunks ([`PcmChunk`]) are **interleaved** F32 PCM
//!   with their channel count and rate, 1 to `max_chunk_frames` frames each. Resampling is filtered with an
//!   exact rational clock: `round(frames * out / in)` frames in all, so the flush never extends duration;
//! * **raw resampling**: [`AudioCodec::open_resampler`], interleaved F32 in and out, no container;
//! * **images**: [`ImageCodec::decode`] (PNG/JPEG/WebP into packed RGB8/RGBA8, geometry and EXIF orientation,
//!   a pixel budget checked from the header before decoding) and [`ImageCodec::encode`] (PNG/JPEG/WebP).
//!
//! Only plain data crosses: `#[repr(C)]` structs, `RVec`, `RString`, `ROption`, and integer newtypes with
//! constants ([`AudioContainer`], [`ImageFormat`], [`PixelFormat`]) instead of Rust enums, so a value an older
//! plugin does not know is an error there, not undefined behaviour. Plugins that are not codecs put
//! [`no_codec`] in the field.
//!
//! # HTTP profiles (ABI 1.2)
//!
//! A [`PluginKind::PROFILE`] plugin's [`LoomPlugin::profile`] returns a [`Profile`]: another HTTP dialect
//! for the models the server serves (`plugins/profile-tei` is TEI's `POST /embed`). Coarse, three calls and
//! plain data, no callbacks into the host:
//!
//! * [`Profile::routes`]: method, literal path and the model role each route serves (`embeddings`,
//!   `decisions`; the role fixes the protocol record format of `docs/serving/finite.md`). The server rejects
//!   a profile with a route that collides with a built-in route or an earlier profile's, in one log line;
//! * [`Profile::parse`]: content type and body bytes to a [`ParsedRequest`]: the model name (empty: the only
//!   model of the role), the protocol input records (one finite request each), and opaque `state` bytes
//!   (the request's options) handed back to `encode`;
//! * [`Profile::encode`]: per record its result rows of `f32`, plus the request's usage units, to a body
//!   and content type.
//!
//! Errors are a [`ProfileError`]: an [`ErrorClass`] (the HTTP status, 4xx for the client's mistakes) and a
//! message; the server answers them with the OpenAI error shape. See the `profile` module doc for details.
//! Plugins that are not profiles put [`no_profile`] in the field.
//!
//! # Queued file reads (ABI 1.3)
//!
//! [`LoomPlugin::hal_files`] opens a HAL device together with its [`HalFiles`]: the host hands the device an
//! open file ([`HalFiles::file_open`], buffered or direct I/O) and queues reads of file byte ranges straight
//! into device buffers ([`HalFiles::submit_reads`]: plain [`FileRead`] records, at most [`MAX_FILE_READS`] per
//! submission, ordered by wait and signal points like a [`Submission`], on a transfer queue ordered against
//! other work only by those points; a short read, a destination outside the buffer or a misaligned direct
//! read fails the signal point with a message naming the file offset and length). `parameters.gather` uses it when the device has it. It is a separate object, not methods appended
//! to [`HalDevice`], because abi_stable's layout check refuses a plugin whose device vtable is shorter than
//! the host's, which would reject every HAL plugin built before 1.3; see the `files` module doc. Plugins
//! without it put [`no_hal_files`] in the field; plugins built before 1.3 have no field, and the host then
//! reads checkpoint ranges itself and writes them to the device (direct I/O is then refused).
//!
//! # Streamed profile responses (ABI 1.4)
//!
//! [`LoomPlugin::profile_events`] hands out a profile's [`ProfileEvents`]: which of its routes answer with
//! a stream ([`ProfileEvents::streams`], each with its content type) and the bytes of each event of such a
//! response ([`ProfileEvents::encode_event`]: a START, one RESULT or ERROR per record in completion order,
//! an END with the usage). A separate object for the same reason as [`HalFiles`]; see the `events` module
//! doc. Plugins without streamed routes put [`no_profile_events`] in the field.
//!
//! # Run-time bounds and executable release (ABI 1.5)
//!
//! [`LoomPlugin::hal_open`] opens a HAL device together with its queued file reads and its [`HalControl`]:
//! [`HalControl::submit_bounded`] submits with a step budget and a cancellation flag applied to each dispatch
//! (a dispatch past its budget or cancelled fails its point with the kernel contract's text), and
//! [`HalControl::release`] frees a compiled stage once nothing uses it. A separate object for the same reason
//! as [`HalFiles`]; see the `control` module doc. Plugins without it put [`no_hal_open`] in the field; for
//! plugins built before 1.5 the host submits unbounded and never releases executables.
//!
//! # No unwinding across the boundary
//!
//! A panic must never unwind out of a plugin: every exported function body runs under
//! [`std::panic::catch_unwind`] and turns a panic into an error. [`guard`] and [`guard_probe`] do that; plugin
//! implementations wrap every trait method and root-module function in one of them ([`guard_profile`] for
//! profile methods, whose error type is [`ProfileError`]). abi_stable aborts the process when a panic
//! reaches one of its `extern "C"` wrappers, so an unguarded panic takes the server down.
//!
//! ```
//! use loom_plugin_api::{guard, guard_probe, ProbeStatus};
//!
//! let ok = guard("alloc", || Ok::<u32, String>(7));
//! assert_eq!(ok.into_result().unwrap(), 7);
//! let failed = guard("alloc", || -> Result<u32, String> { panic!("boom") });
//! assert!(failed.into_result().unwrap_err().to_string().contains("panicked"));
//! assert_eq!(guard_probe(|| panic!("no driver")).status, ProbeStatus::Panicked);
//! ```
//!
//! # Evolution rule
//!
//! This crate changes **only by appending**:
//!
//! * the root module and all traits are abi_stable prefix types; a new field or method is appended after
//!   the current last one (never inserted, reordered, retyped or removed), and [`ABI_MINOR`] is incremented;
//!   the `#[sabi(last_prefix_field)]` marker stays where it is, so every appended item is optional and the host
//!   reads it as an `Option` (absent in older plugins);
//! * abi_stable's layout check, however, refuses a library whose root module has *fewer* fields than the
//!   host's type ("too many fields", measured with the ABI 1.0 test plugins against 1.1), so the previous root
//!   module shape is kept, frozen, as a module ([`abi_1_0`]) and the loader checks a library against the
//!   current shape first and then against the older ones, newest first ([`abi_1_4`], [`abi_1_3`], [`abi_1_2`],
//!   [`abi_1_1`], then [`abi_1_0`]). That is why plugins built against ABI 1.0 to 1.4 still load under 1.5 (the fields
//!   appended after their version read as absent; `tests/plugins/abi-1-0` and `tests/plugins/abi-1-1` are
//!   such plugins, built in tree);
//! * the same check applies to every prefix type *nested* in the root module, the vtables of the
//!   `#[sabi_trait]`s included: a method appended to [`HalDevice`] (after its `last_prefix_field`) would make
//!   the host refuse every HAL plugin built before, whose vtable is shorter, and the root shapes frozen here
//!   name the current trait types, so they cannot help. A trait therefore never grows either: new methods go
//!   on a new trait handed out by a new, appended root field (1.3's [`HalFiles`] through
//!   [`LoomPlugin::hal_files`], 1.4's [`ProfileEvents`] through [`LoomPlugin::profile_events`]);
//! * appending a root field is ABI-compatible but not source-compatible: a plugin that writes the root
//!   module as a struct literal must name the new field when it is rebuilt (HAL plugins write
//!   `codec: loom_plugin_api::no_codec, profile: loom_plugin_api::no_profile`, and so on for each field);
//! * plain data types (structs, enums) never change: a new shape is a new type used by a new, appended method;
//! * anything else is a new [`ABI_MAJOR`]: old plugins are then rejected with "ABI version mismatch".
//!
//! Versions: 1.0 (root module, HAL); 1.1 appended [`LoomPlugin::codec`] and the codec interfaces; 1.2 appended
//! [`LoomPlugin::profile`] and the profile interface; 1.3 appended [`LoomPlugin::hal_files`] and the
//! file-read interface; 1.4 appended [`LoomPlugin::profile_events`] and the event interface, and let
//! [`AudioDecodeSession::next_chunk`] stream before `finish` (a semantic addition: a 0-frame
//! chunk asks for more input); 1.5 (this version) appended [`LoomPlugin::hal_open`] and the device-control
//! interface. The host accepts a plugin with the
//! same major and an older or equal minor. abi_stable's own library
//! version is pinned to `ABI_MAJOR.0.0` (its minor rule runs the other way round), so the two checks agree.

#![deny(missing_docs)]
// why: abi_stable generates `LoomPlugin_Ref` / `HalDevice_TO` names and impls inside its own const blocks.
#![allow(non_camel_case_types, non_local_definitions)]

pub use abi_stable;

mod codec;
pub use codec::*;

mod profile;
pub use profile::*;

mod files;
pub use files::*;

mod events;
pub use events::*;

mod control;
pub use control::*;

pub mod records;

use abi_stable::library::RootModule;
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::{RBox, RBoxError, RResult, RSlice, RStr, RString, RVec};
use abi_stable::{StableAbi, declare_root_module_statics, sabi_trait};
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Incompatible interface changes increment this; plugins of another major are rejected.
pub const ABI_MAJOR: u16 = 1;
/// Appended fields or methods increment this; plugins with a minor up to this one are accepted.
pub const ABI_MINOR: u16 = 5;

/// The library version abi_stable checks: `ABI_MAJOR.0.0` (a test keeps the two in step).
pub const ABI_VERSION_STRING: &str = "1.0.0";

/// What a plugin provides.
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PluginKind(pub u32);

impl PluginKind {
    /// A hardware abstraction layer: [`LoomPlugin::hal`] returns its driver.
    pub const HAL: PluginKind = PluginKind(1);
    /// A media codec: [`LoomPlugin::codec`] returns its [`Codec`] (ABI 1.1).
    pub const CODEC: PluginKind = PluginKind(2);
    /// An HTTP profile: [`LoomPlugin::profile`] returns its [`Profile`] (ABI 1.2).
    pub const PROFILE: PluginKind = PluginKind(3);

    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            PluginKind::HAL => "hal",
            PluginKind::CODEC => "codec",
            PluginKind::PROFILE => "profile",
            _ => "unknown",
        }
    }
}

impl fmt::Display for PluginKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            "unknown" => write!(f, "kind {}", self.0),
            n => f.write_str(n),
        }
    }
}

/// The answer of a plugin's probe.
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeStatus {
    /// The plugin can be used; [`Probe::devices`] devices are present.
    Available = 0,
    /// A clean "no": the device (or its driver) is not on this machine.
    Absent = 1,
    /// The probe itself failed; [`Probe::detail`] says why.
    Failed = 2,
    /// The probe panicked (caught inside the plugin); [`Probe::detail`] holds the panic message.
    Panicked = 3,
}

/// What [`LoomPlugin::probe`] returns.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    /// Whether the plugin is usable.
    pub status: ProbeStatus,
    /// How many devices are present (0 unless available).
    pub devices: u32,
    /// A one-line human-readable detail (device names, or why not).
    pub detail: RString,
}

impl Probe {
    /// `devices` devices are present.
    pub fn available(devices: u32, detail: impl Into<String>) -> Probe {
        Probe {
            status: ProbeStatus::Available,
            devices,
            detail: RString::from(detail.into()),
        }
    }
    /// The device is not on this machine.
    pub fn absent(detail: impl Into<String>) -> Probe {
        Probe {
            status: ProbeStatus::Absent,
            devices: 0,
            detail: RString::from(detail.into()),
        }
    }
    /// The probe failed.
    pub fn failed(detail: impl Into<String>) -> Probe {
        Probe {
            status: ProbeStatus::Failed,
            devices: 0,
            detail: RString::from(detail.into()),
        }
    }
}

/// The root module every plugin exports (an abi_stable prefix type: see the evolution rule in the crate doc).
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = LoomPlugin_Ref)))]
pub struct LoomPlugin {
    /// The plugin's [`ABI_MAJOR`] at build time.
    pub abi_major: u16,
    /// The plugin's [`ABI_MINOR`] at build time.
    pub abi_minor: u16,
    /// A short stable id with a version, e.g. `"cpu-0001"`.
    pub id: RStr<'static>,
    /// What the plugin provides.
    pub kind: PluginKind,
    /// Whether the plugin can run here. Never panics across the boundary (see [`guard_probe`]).
    pub probe: extern "C" fn() -> Probe,
    /// The HAL driver factory (an error for plugins that are not [`PluginKind::HAL`]).
    #[sabi(last_prefix_field)]
    pub hal: extern "C" fn() -> RResult<HalDriverBox, RBoxError>,
    /// ABI 1.1: the codec factory (an error for plugins that are not [`PluginKind::CODEC`]; [`no_codec`] is
    /// the one to use there). Appended after the prefix: the host reads it as an `Option`, `None` for
    /// plugins built against ABI 1.0.
    pub codec: extern "C" fn() -> RResult<CodecBox, RBoxError>,
    /// ABI 1.2: the HTTP profile factory (an error for plugins that are not [`PluginKind::PROFILE`];
    /// [`no_profile`] is the one to use there). Read as an `Option`, `None` for plugins built against ABI
    /// 1.0 or 1.1.
    pub profile: extern "C" fn() -> RResult<ProfileBox, RBoxError>,
    /// ABI 1.3: opens HAL device `index` (as [`HalDriver::open`] does) together with its queued file reads
    /// ([`HalFiles`]); [`no_hal_files`] for plugins without them. Read as an `Option`, `None` for plugins
    /// built against ABI 1.0 to 1.2.
    pub hal_files: extern "C" fn(index: u32) -> RResult<HalDeviceWithFiles, RBoxError>,
    /// ABI 1.4: a profile's streamed responses ([`ProfileEvents`]); [`no_profile_events`] for plugins
    /// without them. Read as an `Option`, `None` for plugins built against ABI 1.0 to 1.3.
    pub profile_events: extern "C" fn() -> RResult<ProfileEventsBox, RBoxError>,
    /// ABI 1.5: opens HAL device `index` with its queued file reads and its [`HalControl`] (run-time bounds,
    /// cancellation, executable release); [`no_hal_open`] for plugins without them. Read as an `Option`,
    /// `None` for plugins built against ABI 1.0 to 1.4.
    pub hal_open: extern "C" fn(index: u32) -> RResult<HalDeviceParts, RBoxError>,
}

impl fmt::Debug for LoomPlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoomPlugin")
            .field("abi_major", &self.abi_major)
            .field("abi_minor", &self.abi_minor)
            .field("id", &self.id)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl RootModule for LoomPlugin_Ref {
    declare_root_module_statics! {LoomPlugin_Ref}
    const BASE_NAME: &'static str = "loom_plugin";
    const NAME: &'static str = "loom_plugin";
    const VERSION_STRINGS: VersionStrings = VersionStrings::new(ABI_VERSION_STRING);
}

/// The root module exactly as ABI 1.4 declared it, kept so that the host can still load plugins built then
/// (see [`abi_1_0`] for why each earlier shape is kept). Never changes.
pub mod abi_1_4 {
    use super::declare_root_module_statics;
    use super::{CodecBox, HalDeviceWithFiles, HalDriverBox, PluginKind, Probe, ProfileBox};
    use super::{
        ProfileEventsBox, RBoxError, RResult, RStr, RootModule, StableAbi, VersionStrings,
    };

    /// The ABI 1.4 root module: [`super::LoomPlugin`] without `hal_open`.
    #[repr(C)]
    #[derive(StableAbi)]
    #[sabi(kind(Prefix(prefix_ref = LoomPlugin_Ref)))]
    pub struct LoomPlugin {
        /// The plugin's ABI major at build time.
        pub abi_major: u16,
        /// The plugin's ABI minor at build time.
        pub abi_minor: u16,
        /// A short stable id with a version.
        pub id: RStr<'static>,
        /// What the plugin provides.
        pub kind: PluginKind,
        /// Whether the plugin can run here.
        pub probe: extern "C" fn() -> Probe,
        /// The HAL driver factory.
        #[sabi(last_prefix_field)]
        pub hal: extern "C" fn() -> RResult<HalDriverBox, RBoxError>,
        /// The codec factory.
        pub codec: extern "C" fn() -> RResult<CodecBox, RBoxError>,
        /// The HTTP profile factory.
        pub profile: extern "C" fn() -> RResult<ProfileBox, RBoxError>,
        /// A HAL device with its queued file reads.
        pub hal_files: extern "C" fn(index: u32) -> RResult<HalDeviceWithFiles, RBoxError>,
        /// A profile's streamed responses.
        pub profile_events: extern "C" fn() -> RResult<ProfileEventsBox, RBoxError>,
    }

    impl std::fmt::Debug for LoomPlugin {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("abi_1_4::LoomPlugin")
                .field("id", &self.id)
                .finish_non_exhaustive()
        }
    }

    impl RootModule for LoomPlugin_Ref {
        declare_root_module_statics! {LoomPlugin_Ref}
        const BASE_NAME: &'static str = "loom_plugin";
        const NAME: &'static str = "loom_plugin";
        const VERSION_STRINGS: VersionStrings = VersionStrings::new(super::ABI_VERSION_STRING);
    }
}

/// The root module exactly as ABI 1.3 declared it, kept so that the host can still load plugins built then
/// (see [`abi_1_0`] for why each earlier shape is kept). Never changes.
pub mod abi_1_3 {
    use super::declare_root_module_statics;
    use super::{CodecBox, HalDeviceWithFiles, HalDriverBox, PluginKind, Probe, ProfileBox};
    use super::{RBoxError, RResult, RStr, RootModule, StableAbi, VersionStrings};

    /// The ABI 1.3 root module: [`super::LoomPlugin`] without `profile_events`.
    #[repr(C)]
    #[derive(StableAbi)]
    #[sabi(kind(Prefix(prefix_ref = LoomPlugin_Ref)))]
    pub struct LoomPlugin {
        /// The plugin's ABI major at build time.
        pub abi_major: u16,
        /// The plugin's ABI minor at build time.
        pub abi_minor: u16,
        /// A short stable id with a version.
        pub id: RStr<'static>,
        /// What the plugin provides.
        pub kind: PluginKind,
        /// Whether the plugin can run here.
        pub probe: extern "C" fn() -> Probe,
        /// The HAL driver factory.
        #[sabi(last_prefix_field)]
        pub hal: extern "C" fn() -> RResult<HalDriverBox, RBoxError>,
        /// The codec factory.
        pub codec: extern "C" fn() -> RResult<CodecBox, RBoxError>,
        /// The HTTP profile factory.
        pub profile: extern "C" fn() -> RResult<ProfileBox, RBoxError>,
        /// A HAL device with its queued file reads.
        pub hal_files: extern "C" fn(index: u32) -> RResult<HalDeviceWithFiles, RBoxError>,
    }

    impl std::fmt::Debug for LoomPlugin {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("abi_1_3::LoomPlugin")
                .field("id", &self.id)
                .finish_non_exhaustive()
        }
    }

    impl RootModule for LoomPlugin_Ref {
        declare_root_module_statics! {LoomPlugin_Ref}
        const BASE_NAME: &'static str = "loom_plugin";
        const NAME: &'static str = "loom_plugin";
        const VERSION_STRINGS: VersionStrings = VersionStrings::new(super::ABI_VERSION_STRING);
    }
}

/// The root module exactly as ABI 1.2 declared it, kept so that the host can still load plugins built then
/// (see [`abi_1_0`] for why each earlier shape is kept). Never changes.
pub mod abi_1_2 {
    use super::{CodecBox, HalDriverBox, PluginKind, Probe, ProfileBox, RBoxError, RResult, RStr};
    use super::{RootModule, StableAbi, VersionStrings, declare_root_module_statics};

    /// The ABI 1.2 root module: [`super::LoomPlugin`] without `hal_files`.
    #[repr(C)]
    #[derive(StableAbi)]
    #[sabi(kind(Prefix(prefix_ref = LoomPlugin_Ref)))]
    pub struct LoomPlugin {
        /// The plugin's ABI major at build time.
        pub abi_major: u16,
        /// The plugin's ABI minor at build time.
        pub abi_minor: u16,
        /// A short stable id with a version.
        pub id: RStr<'static>,
        /// What the plugin provides.
        pub kind: PluginKind,
        /// Whether the plugin can run here.
        pub probe: extern "C" fn() -> Probe,
        /// The HAL driver factory.
        #[sabi(last_prefix_field)]
        pub hal: extern "C" fn() -> RResult<HalDriverBox, RBoxError>,
        /// The codec factory.
        pub codec: extern "C" fn() -> RResult<CodecBox, RBoxError>,
        /// The HTTP profile factory.
        pub profile: extern "C" fn() -> RResult<ProfileBox, RBoxError>,
    }

    impl std::fmt::Debug for LoomPlugin {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("abi_1_2::LoomPlugin")
                .field("id", &self.id)
                .finish_non_exhaustive()
        }
    }

    impl RootModule for LoomPlugin_Ref {
        declare_root_module_statics! {LoomPlugin_Ref}
        const BASE_NAME: &'static str = "loom_plugin";
        const NAME: &'static str = "loom_plugin";
        const VERSION_STRINGS: VersionStrings = VersionStrings::new(super::ABI_VERSION_STRING);
    }
}

/// The root module exactly as ABI 1.1 declared it, kept so that the host can still load plugins built then
/// (see [`abi_1_0`] for why each earlier shape is kept). Never changes.
pub mod abi_1_1 {
    use super::{CodecBox, HalDriverBox, PluginKind, Probe, RBoxError, RResult, RStr, RootModule};
    use super::{StableAbi, VersionStrings, declare_root_module_statics};

    /// The ABI 1.1 root module: [`super::LoomPlugin`] without `profile`.
    #[repr(C)]
    #[derive(StableAbi)]
    #[sabi(kind(Prefix(prefix_ref = LoomPlugin_Ref)))]
    pub struct LoomPlugin {
        /// The plugin's ABI major at build time.
        pub abi_major: u16,
        /// The plugin's ABI minor at build time.
        pub abi_minor: u16,
        /// A short stable id with a version.
        pub id: RStr<'static>,
        /// What the plugin provides.
        pub kind: PluginKind,
        /// Whether the plugin can run here.
        pub probe: extern "C" fn() -> Probe,
        /// The HAL driver factory.
        #[sabi(last_prefix_field)]
        pub hal: extern "C" fn() -> RResult<HalDriverBox, RBoxError>,
        /// The codec factory.
        pub codec: extern "C" fn() -> RResult<CodecBox, RBoxError>,
    }

    impl std::fmt::Debug for LoomPlugin {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("abi_1_1::LoomPlugin")
                .field("id", &self.id)
                .finish_non_exhaustive()
        }
    }

    impl RootModule for LoomPlugin_Ref {
        declare_root_module_statics! {LoomPlugin_Ref}
        const BASE_NAME: &'static str = "loom_plugin";
        const NAME: &'static str = "loom_plugin";
        const VERSION_STRINGS: VersionStrings = VersionStrings::new(super::ABI_VERSION_STRING);
    }
}

/// The root module exactly as ABI 1.0 declared it, kept so that the host can still load plugins built then.
///
/// abi_stable's layout check (`LibHeader::check_layout`) rejects a library whose prefix type has *fewer*
/// fields than the host's ("too many fields"), even after the `#[sabi(last_prefix_field)]` marker, although
/// its accessors would read the missing ones as `None`. So the host checks a library against the current
/// [`LoomPlugin`] first and, when that fails, against each earlier shape kept here; a match is read through
/// that shape and every field appended since is absent. This type never changes; each minor that appends a
/// root-module field adds the previous shape as a module like this one ([`abi_1_1`] for 1.2, [`abi_1_2`] for
/// 1.3, [`abi_1_3`] for 1.4, [`abi_1_4`] for 1.5).
pub mod abi_1_0 {
    use super::{HalDriverBox, PluginKind, Probe, RBoxError, RResult, RStr, RootModule, StableAbi};
    use super::{VersionStrings, declare_root_module_statics};

    /// The ABI 1.0 root module: [`super::LoomPlugin`] without `codec`. abi_stable compares type names and
    /// the package, not module paths, so this matches what 1.0 plugins export.
    #[repr(C)]
    #[derive(StableAbi)]
    #[sabi(kind(Prefix(prefix_ref = LoomPlugin_Ref)))]
    pub struct LoomPlugin {
        /// The plugin's ABI major at build time.
        pub abi_major: u16,
        /// The plugin's ABI minor at build time.
        pub abi_minor: u16,
        /// A short stable id with a version.
        pub id: RStr<'static>,
        /// What the plugin provides.
        pub kind: PluginKind,
        /// Whether the plugin can run here.
        pub probe: extern "C" fn() -> Probe,
        /// The HAL driver factory.
        #[sabi(last_prefix_field)]
        pub hal: extern "C" fn() -> RResult<HalDriverBox, RBoxError>,
    }

    impl std::fmt::Debug for LoomPlugin {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("abi_1_0::LoomPlugin")
                .field("id", &self.id)
                .finish_non_exhaustive()
        }
    }

    impl RootModule for LoomPlugin_Ref {
        declare_root_module_statics! {LoomPlugin_Ref}
        const BASE_NAME: &'static str = "loom_plugin";
        const NAME: &'static str = "loom_plugin";
        const VERSION_STRINGS: VersionStrings = VersionStrings::new(super::ABI_VERSION_STRING);
    }
}

/// A buffer of one device.
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId(pub u64);

/// A compiled stage of one device.
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExecutableId(pub u64);

/// A timeline (a monotonically increasing `u64` counter, like a Vulkan timeline semaphore) of one device.
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TimelineId(pub u64);

/// A fence: reached when `timeline`'s value is at least `value`.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimelinePoint {
    /// The timeline.
    pub timeline: TimelineId,
    /// The value to reach.
    pub value: u64,
}

/// What [`HalDevice::timeline_wait`] observed (a failed point is an `Err` carrying the failure).
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WaitStatus {
    /// The point was reached.
    Reached = 0,
    /// The timeout passed first.
    TimedOut = 1,
}

/// One device a driver can open.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Human-readable name, e.g. `"cpu (16 threads)"`.
    pub name: RString,
    /// The backend: `"cpu"`, `"vulkan"`, `"cuda"`, ...
    pub backend: RString,
    /// Device memory in bytes (0 when unknown).
    pub memory_bytes: u64,
}

/// Limits of an open device.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Largest single buffer.
    pub max_buffer_bytes: u64,
    /// Largest encoded stage [`HalDevice::compile`] accepts.
    pub max_stage_bytes: u64,
    /// Worker threads (CPU) or compute units (GPU).
    pub parallelism: u32,
}

/// One command of a [`Submission`]: plain data, buffers named by id.
#[repr(u8)]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Runs a compiled stage: one buffer per stage input, parameter, output and workspace buffer, in order.
    Dispatch {
        /// The compiled stage.
        exe: ExecutableId,
        /// The stage's inputs.
        inputs: RVec<BufferId>,
        /// The stage's fixed parameters.
        params: RVec<BufferId>,
        /// The stage's outputs.
        outputs: RVec<BufferId>,
        /// The stage's workspace buffers (a device may use its own scratch instead).
        workspace: RVec<BufferId>,
    },
    /// Copies `len` bytes between buffers (the same buffer is allowed when the ranges do not overlap).
    Copy {
        /// Source buffer.
        src: BufferId,
        /// Byte offset in `src`.
        src_offset: u64,
        /// Destination buffer.
        dst: BufferId,
        /// Byte offset in `dst`.
        dst_offset: u64,
        /// Bytes to copy.
        len: u64,
    },
    /// Sets `len` bytes of `dst` from `offset` to `byte`.
    Fill {
        /// Destination buffer.
        dst: BufferId,
        /// Byte offset in `dst`.
        offset: u64,
        /// Bytes to set.
        len: u64,
        /// The value.
        byte: u8,
    },
}

/// Work for a device's queue: runs after every `wait` point is reached, then signals `signal` (or fails it with
/// the first error). Submissions that signal points of one timeline run in submission order; submissions of
/// different timelines are ordered only by their `wait` points, so a device may run them side by side (the CPU
/// device does: the server gives each invocation a timeline of its own, so one model's long dispatch does not hold up
/// another's; the GPU plugins run timelines on lanes of their queue). A device with one in-order queue, which runs
/// everything in submission order, meets this too, but holds every timeline up behind a blocked one.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct Submission {
    /// Commands, run in order.
    pub commands: RVec<Command>,
    /// Points to wait for first.
    pub wait: RVec<TimelinePoint>,
    /// The point signalled (or failed) when the commands have run.
    pub signal: TimelinePoint,
}

/// A HAL driver as it crosses the boundary.
pub type HalDriverBox = HalDriver_TO<'static, RBox<()>>;
/// A HAL device as it crosses the boundary.
pub type HalDeviceBox = HalDevice_TO<'static, RBox<()>>;

/// A HAL driver: enumerates devices and opens them.
#[sabi_trait]
pub trait HalDriver: Send + Sync {
    /// The devices this driver can open (index = position).
    fn devices(&self) -> RVec<DeviceInfo>;

    /// Opens device `index`.
    #[sabi(last_prefix_field)]
    fn open(&self, index: u32) -> RResult<HalDevice_TO<'static, RBox<()>>, RBoxError>;
}

/// An open HAL device. Every method may be called from any thread; `write` and `read` act immediately (wait on
/// the timeline point of the submission that produces or consumes the data first).
#[sabi_trait]
pub trait HalDevice: Send + Sync {
    /// The device's limits.
    fn limits(&self) -> DeviceLimits;

    /// Allocates a zero-filled buffer of `bytes` bytes.
    fn alloc(&self, bytes: u64) -> RResult<BufferId, RBoxError>;

    /// Releases `buffer`; its memory stays alive until the last accepted submission that uses it retires.
    fn free(&self, buffer: BufferId) -> RResult<(), RBoxError>;

    /// Writes `data` into `buffer` at `offset`.
    fn write(&self, buffer: BufferId, offset: u64, data: RSlice<'_, u8>) -> RResult<(), RBoxError>;

    /// Reads `len` bytes of `buffer` at `offset`.
    fn read(&self, buffer: BufferId, offset: u64, len: u64) -> RResult<RVec<u8>, RBoxError>;

    /// Compiles a stage encoded by `loom_ir::kernel_codec::encode_stage`.
    fn compile(&self, stage: RSlice<'_, u8>) -> RResult<ExecutableId, RBoxError>;

    /// Queues a submission (checked when accepted: unknown buffers or executables are an error here).
    fn submit(&self, submission: Submission) -> RResult<(), RBoxError>;

    /// Creates a timeline at value 0.
    fn timeline_create(&self) -> RResult<TimelineId, RBoxError>;

    /// The timeline's current value, or its failure.
    fn timeline_value(&self, timeline: TimelineId) -> RResult<u64, RBoxError>;

    /// Signals a point from the host (the value must increase).
    fn timeline_signal(&self, point: TimelinePoint) -> RResult<(), RBoxError>;

    /// Blocks until `point` is reached (`Reached`), `timeout_ns` passes (`TimedOut`), or the timeline fails
    /// (`Err` with the failure).
    #[sabi(last_prefix_field)]
    fn timeline_wait(
        &self,
        point: TimelinePoint,
        timeout_ns: u64,
    ) -> RResult<WaitStatus, RBoxError>;
}

/// The [`LoomPlugin::hal`] of a plugin that is not a HAL (the loader checks the kind first and never calls
/// it; it is there because the field is not optional): always an error.
pub extern "C" fn no_hal() -> RResult<HalDriverBox, RBoxError> {
    RResult::RErr(error("this plugin is not a HAL plugin"))
}

/// An [`RBoxError`] whose text is `message`'s `Display`.
pub fn error(message: impl fmt::Display) -> RBoxError {
    RBoxError::from_fmt(&message.to_string())
}

/// The text of a caught panic payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_string()
    }
}

/// Runs `f` under `catch_unwind`: its error becomes an [`RBoxError`] with the same text, and a panic becomes
/// the error `"{what}: the plugin panicked: {message}"`. Wrap every exported function body in this.
pub fn guard<T, E: fmt::Display>(
    what: &str,
    f: impl FnOnce() -> Result<T, E>,
) -> RResult<T, RBoxError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => RResult::ROk(v),
        Ok(Err(e)) => RResult::RErr(error(e)),
        Err(p) => RResult::RErr(error(format_args!(
            "{what}: the plugin panicked: {}",
            panic_message(&*p)
        ))),
    }
}

/// Runs a probe under `catch_unwind`: a panic becomes [`ProbeStatus::Panicked`] with the panic message.
pub fn guard_probe(f: impl FnOnce() -> Probe) -> Probe {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(p) => p,
        Err(p) => Probe {
            status: ProbeStatus::Panicked,
            devices: 0,
            detail: RString::from(panic_message(&*p)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_string_is_the_major() {
        assert_eq!(ABI_VERSION_STRING, format!("{ABI_MAJOR}.0.0"));
    }

    #[test]
    fn guard_keeps_error_text() {
        let r: RResult<(), RBoxError> = guard("x", || Err("exact text"));
        assert_eq!(r.into_result().unwrap_err().to_string(), "exact text");
    }

    fn fields<T: StableAbi>() -> Vec<&'static str> {
        T::LAYOUT
            .get_fields()
            .expect("a struct")
            .iter()
            .map(|f| f.name())
            .collect()
    }

    /// Each root-module shape is the previous one plus the fields its minor appended, in order.
    #[test]
    fn root_shapes_only_append() {
        use abi_stable::prefix_type::PrefixTypeTrait;
        let v1_0 = <abi_1_0::LoomPlugin as PrefixTypeTrait>::PT_LAYOUT.get_field_names_vec();
        let v1_1 = <abi_1_1::LoomPlugin as PrefixTypeTrait>::PT_LAYOUT.get_field_names_vec();
        let v1_2 = <abi_1_2::LoomPlugin as PrefixTypeTrait>::PT_LAYOUT.get_field_names_vec();
        let v1_3 = <abi_1_3::LoomPlugin as PrefixTypeTrait>::PT_LAYOUT.get_field_names_vec();
        let v1_4 = <abi_1_4::LoomPlugin as PrefixTypeTrait>::PT_LAYOUT.get_field_names_vec();
        let v1_5 = <LoomPlugin as PrefixTypeTrait>::PT_LAYOUT.get_field_names_vec();
        assert_eq!(
            v1_0,
            ["abi_major", "abi_minor", "id", "kind", "probe", "hal"]
        );
        assert_eq!(v1_1, [&v1_0[..], &["codec"]].concat());
        assert_eq!(v1_2, [&v1_1[..], &["profile"]].concat());
        assert_eq!(v1_3, [&v1_2[..], &["hal_files"]].concat());
        assert_eq!(v1_4, [&v1_3[..], &["profile_events"]].concat());
        assert_eq!(v1_5, [&v1_4[..], &["hal_open"]].concat());
        assert_eq!(
            ABI_MINOR, 5,
            "a new minor appends a root field and freezes this shape"
        );
    }

    /// abi_stable's own check: a library with the current shape satisfies every older interface (the frozen
    /// shapes are true prefixes), while the current interface refuses an older library ("too many fields"),
    /// which is why the loader tries the frozen shapes after the current one.
    #[test]
    fn frozen_root_shapes_are_prefixes_of_the_current_one() {
        use abi_stable::abi_stability::abi_checking::check_layout_compatibility;
        let cur = <LoomPlugin_Ref as StableAbi>::LAYOUT;
        let v1_4 = <abi_1_4::LoomPlugin_Ref as StableAbi>::LAYOUT;
        let v1_3 = <abi_1_3::LoomPlugin_Ref as StableAbi>::LAYOUT;
        let v1_2 = <abi_1_2::LoomPlugin_Ref as StableAbi>::LAYOUT;
        let v1_1 = <abi_1_1::LoomPlugin_Ref as StableAbi>::LAYOUT;
        let v1_0 = <abi_1_0::LoomPlugin_Ref as StableAbi>::LAYOUT;
        check_layout_compatibility(v1_4, cur).expect("1.4 interface, 1.5 library");
        check_layout_compatibility(v1_3, v1_4).expect("1.3 interface, 1.4 library");
        check_layout_compatibility(v1_2, v1_3).expect("1.2 interface, 1.3 library");
        check_layout_compatibility(v1_1, v1_2).expect("1.1 interface, 1.2 library");
        check_layout_compatibility(v1_0, v1_1).expect("1.0 interface, 1.1 library");
        check_layout_compatibility(v1_0, cur).expect("1.0 interface, 1.5 library");
        assert!(check_layout_compatibility(cur, v1_4).is_err());
        assert!(check_layout_compatibility(cur, v1_3).is_err());
        assert!(check_layout_compatibility(cur, v1_2).is_err());
        assert!(check_layout_compatibility(cur, v1_1).is_err());
        assert!(check_layout_compatibility(cur, v1_0).is_err());
    }

    /// The profile interface's plain data, field by field: these types never change (a new shape is a new
    /// type), so a reordering or renaming here is an ABI break this test catches.
    #[test]
    fn profile_types_are_frozen() {
        assert_eq!(fields::<ProfileRoute>(), ["method", "path", "role"]);
        assert_eq!(fields::<ParseContext>(), ["max_inputs"]);
        assert_eq!(fields::<ParsedRequest>(), ["model", "records", "state"]);
        assert_eq!(fields::<ProfileError>(), ["class", "message"]);
        assert_eq!(fields::<RecordResult>(), ["rows"]);
        assert_eq!(
            fields::<EncodeRequest>(),
            ["model", "state", "results", "units"]
        );
        assert_eq!(fields::<ProfileResponse>(), ["content_type", "body"]);
        assert_eq!(std::mem::size_of::<HttpMethod>(), 4);
        assert_eq!(std::mem::size_of::<ErrorClass>(), 2);
        assert_eq!(std::mem::size_of::<ParseContext>(), 8);
    }

    /// Why 1.3's file reads are a new trait behind a new root field and not methods appended to `HalDevice`:
    /// abi_stable refuses a library whose trait vtable has fewer methods than the host's, even after the
    /// `last_prefix_field` marker (the same rule as for root modules).
    #[allow(unreachable_pub)]
    mod vtable_v1 {
        use abi_stable::sabi_trait;
        #[sabi_trait]
        pub trait Dev: Send + Sync {
            fn a(&self) -> u32;
            #[sabi(last_prefix_field)]
            fn b(&self) -> u32;
        }
    }
    #[allow(unreachable_pub)]
    mod vtable_v2 {
        use abi_stable::sabi_trait;
        #[sabi_trait]
        pub trait Dev: Send + Sync {
            fn a(&self) -> u32;
            #[sabi(last_prefix_field)]
            fn b(&self) -> u32;
            fn c(&self) -> u32;
        }
    }

    #[test]
    fn a_longer_trait_vtable_refuses_an_older_plugin() {
        use abi_stable::abi_stability::abi_checking::check_layout_compatibility;
        type Old = vtable_v1::Dev_TO<'static, RBox<()>>;
        type New = vtable_v2::Dev_TO<'static, RBox<()>>;
        check_layout_compatibility(<Old as StableAbi>::LAYOUT, <New as StableAbi>::LAYOUT)
            .expect("an old host takes a newer plugin");
        assert!(
            check_layout_compatibility(<New as StableAbi>::LAYOUT, <Old as StableAbi>::LAYOUT)
                .is_err(),
            "a new host refuses an older plugin's shorter vtable"
        );
    }

    /// The file-read interface's plain data, field by field (frozen like the profile types).
    #[test]
    fn file_read_types_are_frozen() {
        assert_eq!(
            fields::<FileRead>(),
            ["file", "file_offset", "len", "dst", "dst_offset"]
        );
        assert_eq!(fields::<FileReadSubmission>(), ["reads", "wait", "signal"]);
        assert_eq!(fields::<FileInfo>(), ["file", "len", "direct_alignment"]);
        assert_eq!(fields::<HalDeviceWithFiles>(), ["device", "files"]);
        assert_eq!(std::mem::size_of::<FileRead>(), 40);
        assert_eq!(std::mem::size_of::<FileOpenFlags>(), 4);
        assert!(FileOpenFlags::DIRECT.direct() && !FileOpenFlags::BUFFERED.direct());
    }

    /// The device-control interface's plain data, field by field (frozen like the profile types).
    #[test]
    fn control_types_are_frozen() {
        assert_eq!(fields::<DispatchBounds>(), ["steps", "cancel"]);
        assert_eq!(fields::<HalDeviceParts>(), ["device", "files", "control"]);
        assert_eq!(std::mem::size_of::<DispatchBounds>(), 16);
        assert_eq!(std::mem::size_of::<CancelId>(), 8);
    }

    /// The event interface's plain data, field by field (frozen like the profile types).
    #[test]
    fn event_types_are_frozen() {
        assert_eq!(fields::<StreamRoute>(), ["route", "content_type"]);
        assert_eq!(
            fields::<ProfileEvent>(),
            [
                "kind",
                "model",
                "state",
                "index",
                "result",
                "done",
                "total",
                "units",
                "error_status",
                "error_code",
                "error_message"
            ]
        );
        assert_eq!(std::mem::size_of::<EventKind>(), 4);
    }

    #[test]
    fn profile_guard_turns_panics_into_internal_errors() {
        let ok = guard_profile("parse", || Ok::<_, ProfileError>(3));
        assert_eq!(ok.into_result().unwrap(), 3);
        let e = guard_profile("encode", || -> Result<(), _> {
            Err(ProfileError::bad_request("no"))
        })
        .into_result()
        .unwrap_err();
        assert_eq!(
            (e.class, e.message.as_str()),
            (ErrorClass::BAD_REQUEST, "no")
        );
        let e = guard_profile("parse", || -> Result<(), ProfileError> { panic!("boom") })
            .into_result()
            .unwrap_err();
        assert_eq!(e.class, ErrorClass::INTERNAL);
        assert_eq!(e.message.as_str(), "parse: the plugin panicked: boom");
        assert!(guard_list::<u8>(|| panic!("x")).is_empty());
        assert_eq!(HttpMethod::POST.to_string(), "POST");
        assert_eq!(HttpMethod(77).to_string(), "method 77");
    }

    #[test]
    fn kind_names() {
        assert_eq!(PluginKind::HAL.to_string(), "hal");
        assert_eq!(PluginKind(9).to_string(), "kind 9");
    }
}
