//! Buffers: storage buffers rounded up to whole 4-byte words; `write` and `read` are staged and finish before
//! they return (unaligned edge words are read-modify-written), and the staging buffers of the other modules.

use std::sync::{Arc, mpsc};
use std::time::Duration;

use hal_queue::commands::byte_range;

use crate::device::Gpu;

/// How long a staging map may take before the device is considered lost.
const MAP_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug)]
pub(crate) struct VkBuf {
    pub(crate) buffer: wgpu::Buffer,
    /// The buffer's size as allocated by the host (the wgpu buffer is rounded up to whole words).
    pub(crate) len: u64,
}

pub(crate) type Buf = Arc<VkBuf>;

/// Whether `x` is a multiple of wgpu's copy alignment.
pub(crate) fn aligned(x: u64) -> bool {
    x.is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT)
}

impl Gpu {
    pub(crate) fn create_buffer(
        &self,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer, String> {
        if size > self.limits.max_buffer_size {
            return Err(format!(
                "{size} bytes is over the device's max_buffer_size of {}",
                self.limits.max_buffer_size
            ));
        }
        self.scoped("vulkan buffer", || {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: size.max(4),
                usage,
                mapped_at_creation: false,
            })
        })
    }

    /// A `COPY_SRC` buffer holding `data` (a whole number of words).
    pub(crate) fn init_buffer(&self, data: &[u8]) -> Result<wgpu::Buffer, String> {
        let b = self.scoped("vulkan staging buffer", || {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: data.len() as u64,
                usage: wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: true,
            })
        })?;
        {
            let mut view = b
                .slice(..)
                .get_mapped_range_mut()
                .map_err(|e| format!("vulkan staging map: {e}"))?;
            view.copy_from_slice(data);
        }
        b.unmap();
        Ok(b)
    }

    /// Maps a `MAP_READ` buffer after the work that fills it was submitted, and copies `len` bytes from `at`.
    pub(crate) fn map_read(&self, b: &wgpu::Buffer, at: u64, len: u64) -> Result<Vec<u8>, String> {
        let (tx, rx) = mpsc::channel();
        b.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| format!("vulkan: waiting for a map: {e}"))?;
        rx.recv_timeout(MAP_TIMEOUT)
            .map_err(|_| "vulkan: the staging map never completed".to_string())?
            .map_err(|e| format!("vulkan: staging map failed: {e}"))?;
        let out = {
            let view = b
                .slice(..)
                .get_mapped_range()
                .map_err(|e| format!("vulkan staging view: {e}"))?;
            view[at as usize..(at + len) as usize].to_vec()
        };
        b.unmap();
        Ok(out)
    }

    /// Reads `len` bytes at `offset` (whole words are copied to a staging buffer and mapped).
    pub(crate) fn read(&self, b: &VkBuf, offset: u64, len: u64) -> Result<Vec<u8>, String> {
        byte_range("read", b.len, offset, len)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        let a0 = offset / 4 * 4;
        let a1 = (offset + len).div_ceil(4) * 4;
        let staging = self.create_buffer(
            a1 - a0,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        let mut enc = self.encoder();
        enc.copy_buffer_to_buffer(&b.buffer, a0, &staging, 0, a1 - a0);
        self.flush(enc)?;
        self.map_read(&staging, offset - a0, len)
    }

    /// Writes `data` at `offset`; unaligned edge words are read first and merged.
    pub(crate) fn write(&self, b: &VkBuf, offset: u64, data: &[u8]) -> Result<(), String> {
        byte_range("write", b.len, offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        let end = offset + data.len() as u64;
        let a0 = offset / 4 * 4;
        let a1 = end.div_ceil(4) * 4;
        let mut words = vec![0u8; (a1 - a0) as usize];
        if a0 != offset {
            let head = self.read_words(b, a0)?;
            words[..4].copy_from_slice(&head);
        }
        if a1 != end {
            let tail = self.read_words(b, a1 - 4)?;
            let n = words.len();
            words[n - 4..].copy_from_slice(&tail);
        }
        let at = (offset - a0) as usize;
        words[at..at + data.len()].copy_from_slice(data);
        let idx = self.scoped("write", || {
            self.queue.write_buffer(&b.buffer, a0, &words);
            self.queue.submit([])
        })?;
        self.wait(idx)
    }

    /// The word at `at` (a multiple of 4 inside the rounded buffer).
    fn read_words(&self, b: &VkBuf, at: u64) -> Result<[u8; 4], String> {
        let staging = self.create_buffer(
            4,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        let mut enc = self.encoder();
        enc.copy_buffer_to_buffer(&b.buffer, at, &staging, 0, 4);
        self.flush(enc)?;
        let v = self.map_read(&staging, 0, 4)?;
        Ok([v[0], v[1], v[2], v[3]])
    }
}
