//! ABI 1.3: queued file reads, the HAL capability behind `parameters.gather`.
//!
//! A device that has it reads byte ranges of files the host hands it straight into its buffers, on a
//! **transfer queue** of its own, ordered by timeline points like a [`crate::Submission`]: a
//! [`FileReadSubmission`] runs after every `wait` point is reached and after the read submissions accepted
//! before it, then signals `signal`, or fails it with the first error. It is *not* ordered behind the device's
//! other submissions except through points: work that waits for a read's point may be submitted before the
//! read (`parameters.gather` does exactly that: the consumer of the rows is queued while the gather worker is
//! still reading the descriptors), and an implementation that put reads on its one in-order queue would
//! deadlock there.
//!
//! # Why a separate object
//!
//! [`crate::HalDevice`] cannot grow a method without breaking every HAL plugin already built: abi_stable's
//! layout check refuses a library whose vtable (a prefix type nested in the root module) has *fewer* methods
//! than the host's, exactly as it refuses a shorter root module (`#[sabi(last_prefix_field)]` makes an
//! appended method *readable* as absent, it does not make the check accept the older library). So the
//! capability is its own trait object, [`HalFiles`], handed out together with the device by the root-module
//! field appended in 1.3, [`crate::LoomPlugin::hal_files`] (`open device index with its file reads`). A plugin
//! built against 1.0, 1.1 or 1.2 has no such field and loads as before; the host then reads checkpoint ranges
//! itself and writes them with [`crate::HalDevice::write`] (and says so once per device). A 1.3 HAL plugin
//! without the capability puts [`no_hal_files`] in the field; one whose device has it on some devices only
//! answers [`HalDeviceWithFiles::files`] `RNone` for the others.
//!
//! # Files
//!
//! [`HalFiles::file_open`] gets a file descriptor **open in the host process** (plugins are libraries in the
//! same process) and the file's path for messages. The plugin opens its own handle on the same open file
//! (on Linux through `/proc/self/fd/<fd>`, so the file is the one the host indexed even if its path was
//! replaced since) and keeps it until [`HalFiles::file_close`]; the host may close its descriptor at any time
//! after `file_open` returns. [`FileOpenFlags::DIRECT`] asks for direct I/O (`O_DIRECT`): the plugin either
//! opens the file that way or fails (a file system that refuses `O_DIRECT`, such as tmpfs, is an error), and
//! never falls back to buffered reads. [`FileInfo`] returns the file's length and, for a direct file, the
//! alignment every direct read needs.
//!
//! # Reads
//!
//! A [`FileRead`] is plain data: `(file, file_offset, len, dst, dst_offset)`; at most [`MAX_FILE_READS`] of
//! them per submission (a host splits longer lists into several submissions). Unknown files or buffers are
//! errors of [`HalFiles::submit_reads`] itself; when a read runs, a short read (the range passes the end of
//! the file), a destination range outside the buffer, a direct read whose file offset, length or destination
//! offset is not a multiple of [`FileInfo::direct_alignment`], or an I/O error fails the signal point with a
//! message that names the read's file offset and length (`file read at offset 8192 length 4096: ...`). A direct
//! read's misalignment text is `direct I/O needs 4096-byte aligned ranges: offset X length Y` (with the
//! file's alignment in place of 4096).

use crate::{BufferId, HalDeviceBox, TimelinePoint, error};
use abi_stable::StableAbi;
use abi_stable::sabi_trait;
use abi_stable::std_types::{RBox, RBoxError, ROption, RResult, RStr, RVec};

/// Most [`FileRead`]s one [`FileReadSubmission`] may carry.
pub const MAX_FILE_READS: usize = 4096;

/// The alignment direct reads need where the plugin cannot ask the file system (a multiple of every logical
/// block size in common use: 512 and 4096).
pub const DEFAULT_DIRECT_ALIGNMENT: u64 = 4096;

/// A file a device opened with [`HalFiles::file_open`].
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(pub u64);

/// How [`HalFiles::file_open`] opens a file: a bit set.
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileOpenFlags(pub u32);

impl FileOpenFlags {
    /// Ordinary buffered reads (through the page cache).
    pub const BUFFERED: FileOpenFlags = FileOpenFlags(0);
    /// Direct I/O (`O_DIRECT`): aligned ranges only, never a buffered fallback.
    pub const DIRECT: FileOpenFlags = FileOpenFlags(1);

    /// Whether [`FileOpenFlags::DIRECT`] is set.
    pub fn direct(self) -> bool {
        self.0 & Self::DIRECT.0 != 0
    }
}

/// What [`HalFiles::file_open`] returns.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileInfo {
    /// The device's name for the file.
    pub file: FileId,
    /// The file's length in bytes when it was opened.
    pub len: u64,
    /// For a direct file, the alignment of every read's file offset, length and destination offset; 0 for a
    /// buffered file.
    pub direct_alignment: u64,
}

/// One read: `len` bytes of `file` from `file_offset` into `dst` at `dst_offset`.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileRead {
    /// The file.
    pub file: FileId,
    /// Byte offset in the file.
    pub file_offset: u64,
    /// Bytes to read (all of them: a short read is an error).
    pub len: u64,
    /// Destination buffer.
    pub dst: BufferId,
    /// Byte offset in `dst`.
    pub dst_offset: u64,
}

/// File reads for a device's transfer queue: run after every `wait` point is reached and after earlier read
/// submissions, in order, then signal `signal` (or fail it with the first error). Ordered against the device's
/// other submissions only by points (see the module doc).
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct FileReadSubmission {
    /// The reads, at most [`MAX_FILE_READS`].
    pub reads: RVec<FileRead>,
    /// Points to wait for first.
    pub wait: RVec<TimelinePoint>,
    /// The point signalled (or failed) when the reads are done.
    pub signal: TimelinePoint,
}

/// A device's file reads as they cross the boundary.
pub type HalFilesBox = HalFiles_TO<'static, RBox<()>>;

/// The file reads of one open device (see the module doc). Every method may be called from any thread.
#[sabi_trait]
pub trait HalFiles: Send + Sync {
    /// Opens a handle on the host's open file descriptor `fd` (`path` names it in messages).
    fn file_open(
        &self,
        fd: i32,
        path: RStr<'_>,
        flags: FileOpenFlags,
    ) -> RResult<FileInfo, RBoxError>;

    /// Closes `file`; reads already accepted still complete.
    fn file_close(&self, file: FileId) -> RResult<(), RBoxError>;

    /// Queues reads (checked when accepted: unknown files or buffers, or more than [`MAX_FILE_READS`], are an
    /// error here; range and alignment failures fail the signal point).
    #[sabi(last_prefix_field)]
    fn submit_reads(&self, submission: FileReadSubmission) -> RResult<(), RBoxError>;
}

/// A device opened with its file reads ([`crate::LoomPlugin::hal_files`]).
#[repr(C)]
#[derive(StableAbi)]
pub struct HalDeviceWithFiles {
    /// The device, the same as [`crate::HalDriver::open`] gives.
    pub device: HalDeviceBox,
    /// Its file reads, sharing the device's buffers and queue; `RNone` when this device has none.
    pub files: ROption<HalFilesBox>,
}

impl std::fmt::Debug for HalDeviceWithFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HalDeviceWithFiles")
            .field("files", &self.files.is_some())
            .finish_non_exhaustive()
    }
}

/// What a 1.3 plugin without queued file reads puts in [`crate::LoomPlugin::hal_files`] (every codec and
/// profile plugin, and HAL plugins whose devices read no files).
pub extern "C" fn no_hal_files(_index: u32) -> RResult<HalDeviceWithFiles, RBoxError> {
    RResult::RErr(error("this plugin queues no file reads"))
}
