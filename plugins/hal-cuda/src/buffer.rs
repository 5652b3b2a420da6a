//! Buffers: `cuMemAlloc` allocations; `write` and `read` are copies on the device's stream followed by a
//! stream synchronisation, so they finish before returning.

use std::sync::{Arc, Mutex};

use cudarc::driver::CudaSlice;
use hal_queue::commands::byte_range;
use hal_queue::lock;

use crate::device::{Gpu, cu};

#[derive(Debug)]
pub(crate) struct CuBuf {
    pub(crate) mem: Mutex<CudaSlice<u8>>,
    pub(crate) len: u64,
}

pub(crate) type Buf = Arc<CuBuf>;

impl Gpu {
    pub(crate) fn read(&self, b: &CuBuf, offset: u64, len: u64) -> Result<Vec<u8>, String> {
        let r = byte_range("read", b.len, offset, len)?;
        let mut out = vec![0u8; r.len()];
        if !out.is_empty() {
            let mem = lock(&b.mem);
            self.stream
                .memcpy_dtoh(&mem.slice(r), &mut out[..])
                .map_err(cu("read"))?;
            self.stream.synchronize().map_err(cu("read"))?;
        }
        Ok(out)
    }

    pub(crate) fn write(&self, b: &CuBuf, offset: u64, data: &[u8]) -> Result<(), String> {
        let r = byte_range("write", b.len, offset, data.len() as u64)?;
        if !data.is_empty() {
            let mut mem = lock(&b.mem);
            self.stream
                .memcpy_htod(data, &mut mem.slice_mut(r))
                .map_err(cu("write"))?;
            self.stream.synchronize().map_err(cu("write"))?;
        }
        Ok(())
    }
}
