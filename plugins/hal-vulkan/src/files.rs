//! Queued file reads (`HalFiles`): opening and the checks are `hal_queue::files`, shared with `hal-cpu`; a read
//! submission runs on the device's transfer queue.

use abi_stable::std_types::{RBoxError, RResult, RStr};
use hal_queue::files::{self, QueuedRead};
use loom_plugin_api::{FileId, FileInfo, FileOpenFlags, FileReadSubmission, HalFiles, guard};

use crate::buffer::Buf;
use crate::device::{Gpu, VkDevice};

/// Bytes of a file read staged in host memory and written to the device at a time.
const FILE_CHUNK: usize = 8 << 20;

/// Runs one submission's file reads in order on the transfer queue: each is checked (direct alignment, the
/// destination range), read with `read_exact_at` into host memory [`FILE_CHUNK`] bytes at a time and written
/// to the buffer with `Queue::write_buffer`; `Gpu::write` waits until the device has the bytes, so the point
/// is signalled only after the copies are done.
pub(crate) fn run_reads(gpu: &Gpu, reads: Vec<QueuedRead<Buf>>) -> Result<(), String> {
    let mut host = Vec::new();
    for r in &reads {
        let range = r
            .file
            .check(r.file_offset, r.len, r.dst.len, r.dst_offset)?;
        let mut done = 0u64;
        while done < r.len {
            let n = (r.len - done).min(FILE_CHUNK as u64) as usize;
            host.resize(n, 0);
            r.file
                .read_piece((r.file_offset, r.len), r.file_offset + done, &mut host)?;
            gpu.write(&r.dst, range.start + done, &host).map_err(|e| {
                format!(
                    "file read at offset {} length {} of {}: {e}",
                    r.file_offset, r.len, r.file.path
                )
            })?;
            done += n as u64;
        }
    }
    drop(reads);
    Ok(())
}

impl HalFiles for VkDevice {
    fn file_open(
        &self,
        fd: i32,
        path: RStr<'_>,
        flags: FileOpenFlags,
    ) -> RResult<FileInfo, RBoxError> {
        guard("file_open", || {
            self.state().files.open(fd, path.as_str(), flags)
        })
    }

    fn file_close(&self, file: FileId) -> RResult<(), RBoxError> {
        guard("file_close", || self.state().files.close(file))
    }

    fn submit_reads(&self, submission: FileReadSubmission) -> RResult<(), RBoxError> {
        guard("submit_reads", || {
            files::check_read_count(submission.reads.len())?;
            self.transfer
                .submit_checked(&submission.wait, submission.signal, || {
                    let st = self.state();
                    st.files
                        .resolve(&submission.reads, |id| st.objects.buffer(id))
                })
        })
    }
}
