//! Queued file reads (`loom_plugin_api::HalFiles`): what every plugin does the same way, so that a read fails
//! with the same text on every device. Opening reopens the host's descriptor through `/proc/self/fd/<fd>`
//! (`O_DIRECT` for a direct file: a file system that refuses it, such as tmpfs, is an error, never a buffered
//! fallback). A read is checked before any byte moves: a direct read needs its file offset, length and
//! destination offset to be multiples of [`DIRECT_ALIGNMENT`], and the destination range must lie inside the
//! buffer. Errors begin `file read at offset X length Y of PATH:`.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::Arc;

use loom_plugin_api::{BufferId, FileId, FileInfo, FileOpenFlags, FileRead, MAX_FILE_READS};

/// A device's open files by id: `file_open` / `file_close` and the lookups of `submit_reads`, with the same
/// error texts on every device. Queued reads hold their file's `Arc`, so a file closed while reads are queued
/// stays open until they retire.
#[derive(Debug, Default)]
pub struct FileTable {
    files: HashMap<u64, Arc<OpenFile>>,
    next_id: u64,
}

impl FileTable {
    /// `HalFiles::file_open`: opens the host's descriptor `fd` and gives it an id.
    pub fn open(&mut self, fd: i32, path: &str, flags: FileOpenFlags) -> Result<FileInfo, String> {
        let (file, len) = OpenFile::open(fd, path, flags)?;
        let direct_alignment = file.alignment();
        self.next_id += 1;
        self.files.insert(self.next_id, Arc::new(file));
        Ok(FileInfo {
            file: FileId(self.next_id),
            len,
            direct_alignment,
        })
    }

    /// `HalFiles::file_close`.
    pub fn close(&mut self, file: FileId) -> Result<(), String> {
        match self.files.remove(&file.0) {
            Some(_) => Ok(()),
            None => Err(format!("file_close: unknown file {}", file.0)),
        }
    }

    /// The open file `file` refers to, for a read of `submit_reads`.
    pub fn get(&self, file: FileId) -> Result<Arc<OpenFile>, String> {
        self.files
            .get(&file.0)
            .cloned()
            .ok_or_else(|| format!("submit_reads: unknown file {}", file.0))
    }

    /// The lookups of `submit_reads` (after its count and timeline points' checks), in read order: each read's
    /// file, then its destination buffer (`buffer`: the device's lookup, a reference-counted handle `B`).
    pub fn resolve<B>(
        &self,
        reads: &[FileRead],
        buffer: impl Fn(BufferId) -> Result<B, String>,
    ) -> Result<Vec<QueuedRead<B>>, String> {
        reads
            .iter()
            .map(|r| {
                Ok(QueuedRead {
                    file: self.get(r.file)?,
                    file_offset: r.file_offset,
                    len: r.len,
                    dst: buffer(r.dst)?,
                    dst_offset: r.dst_offset,
                })
            })
            .collect()
    }
}

/// One read of a `submit_reads`, resolved (and so kept alive: the file and the buffer `B`) when accepted; it
/// is checked when it runs ([`OpenFile::check`]).
#[derive(Debug)]
pub struct QueuedRead<B> {
    pub file: Arc<OpenFile>,
    pub file_offset: u64,
    pub len: u64,
    pub dst: B,
    pub dst_offset: u64,
}

/// The size limit of one `submit_reads` ([`MAX_FILE_READS`]).
pub fn check_read_count(n: usize) -> Result<(), String> {
    if n > MAX_FILE_READS {
        return Err(format!(
            "submit_reads: {n} reads, more than the {MAX_FILE_READS} of one submission"
        ));
    }
    Ok(())
}

/// What a direct read's file offset, length and destination offset must be multiples of (not asked of the
/// file system, which needs a `statx`/`ioctl` call and `unsafe`; a multiple of every common logical block size).
pub const DIRECT_ALIGNMENT: u64 = loom_plugin_api::DEFAULT_DIRECT_ALIGNMENT;

/// Largest bounce slice of a direct read into memory whose address is not aligned.
const BOUNCE_BYTES: usize = 1 << 20;

/// A file opened by `file_open`.
#[derive(Debug)]
pub struct OpenFile {
    pub file: File,
    pub path: String,
    pub direct: bool,
}

impl OpenFile {
    /// Opens the host's descriptor `fd` (`path` only names it in messages); returns the file and its length.
    pub fn open(fd: i32, path: &str, flags: FileOpenFlags) -> Result<(OpenFile, u64), String> {
        if fd < 0 {
            return Err(format!("file_open {path}: bad descriptor {fd}"));
        }
        if flags.0 & !FileOpenFlags::DIRECT.0 != 0 {
            return Err(format!("file_open {path}: unknown flags {:#x}", flags.0));
        }
        let direct = flags.direct();
        let mut o = std::fs::OpenOptions::new();
        o.read(true);
        if direct {
            o.custom_flags(libc::O_DIRECT);
        }
        // The host's open file, not whatever its path names now.
        let file = o.open(format!("/proc/self/fd/{fd}")).map_err(|e| {
            if direct && e.raw_os_error() == Some(libc::EINVAL) {
                format!(
                    "file_open {path}: the file system refuses direct I/O (O_DIRECT): {e} \
                     (tmpfs does; there are no buffered fallbacks)"
                )
            } else {
                format!("file_open {path}: {e}")
            }
        })?;
        let meta = file
            .metadata()
            .map_err(|e| format!("file_open {path}: {e}"))?;
        if !meta.is_file() {
            return Err(format!("file_open {path}: not a regular file"));
        }
        Ok((
            OpenFile {
                file,
                path: path.to_string(),
                direct,
            },
            meta.len(),
        ))
    }

    /// `direct_alignment` of the `FileInfo`: [`DIRECT_ALIGNMENT`] for a direct file, else 0.
    pub fn alignment(&self) -> u64 {
        if self.direct { DIRECT_ALIGNMENT } else { 0 }
    }

    fn at(&self, file_offset: u64, len: u64) -> String {
        format!(
            "file read at offset {file_offset} length {len} of {}",
            self.path
        )
    }

    /// Checks one read of `len` bytes at `file_offset` into bytes `dst_offset..` of a `dst_len`-byte buffer
    /// (direct alignment first, then the destination range) and returns the destination range.
    pub fn check(
        &self,
        file_offset: u64,
        len: u64,
        dst_len: u64,
        dst_offset: u64,
    ) -> Result<Range<u64>, String> {
        let a = DIRECT_ALIGNMENT;
        if self.direct
            && !(file_offset.is_multiple_of(a)
                && len.is_multiple_of(a)
                && dst_offset.is_multiple_of(a))
        {
            return Err(format!(
                "{}: direct I/O needs {a}-byte aligned ranges: offset {file_offset} length {len}{}",
                self.at(file_offset, len),
                if !dst_offset.is_multiple_of(a) {
                    format!(" (destination offset {dst_offset})")
                } else {
                    String::new()
                }
            ));
        }
        match dst_offset.checked_add(len) {
            Some(end) if end <= dst_len => Ok(dst_offset..end),
            _ => Err(format!(
                "{}: destination: bytes {dst_offset}..{dst_offset}+{len} are outside the buffer ({dst_len} bytes)",
                self.at(file_offset, len)
            )),
        }
    }

    /// Reads `out.len()` bytes at `pos`, a piece of the checked read (`file_offset`, `len`) that errors name.
    /// A direct read into memory whose address is not [`DIRECT_ALIGNMENT`]-aligned goes through an aligned
    /// bounce slice of at most 1 MiB (carved out of a slightly larger `Vec<u8>`, no `unsafe`).
    pub fn read_piece(
        &self,
        (file_offset, len): (u64, u64),
        pos: u64,
        out: &mut [u8],
    ) -> Result<(), String> {
        let io = |e: std::io::Error| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                let size = self
                    .file
                    .metadata()
                    .map_or_else(|_| "?".to_string(), |m| m.len().to_string());
                format!(
                    "{}: short read (the file has {size} bytes; the range ends at {})",
                    self.at(file_offset, len),
                    file_offset.saturating_add(len)
                )
            } else {
                format!("{}: {e}", self.at(file_offset, len))
            }
        };
        let a = DIRECT_ALIGNMENT as usize;
        if !self.direct || (out.as_ptr() as usize).is_multiple_of(a) {
            return self.file.read_exact_at(out, pos).map_err(io);
        }
        let chunk = out.len().min(BOUNCE_BYTES);
        let mut bounce = vec![0u8; chunk + a];
        let skip = (a - (bounce.as_ptr() as usize) % a) % a;
        let aligned = &mut bounce[skip..skip + chunk];
        let mut at = pos;
        for piece in out.chunks_mut(chunk) {
            let n = piece.len();
            self.file.read_exact_at(&mut aligned[..n], at).map_err(io)?;
            piece.copy_from_slice(&aligned[..n]);
            at += n as u64;
        }
        Ok(())
    }
}
