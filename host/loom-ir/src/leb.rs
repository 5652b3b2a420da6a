//! LEB128, as both binary formats (`.loombc` and the kernel stage codec) use it: always minimal on write, and
//! rejected when not minimal on read, so every value has exactly one encoding (canonical files, stable digests).

/// Why a LEB128 value could not be read. Each format maps this onto its own error with its own context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LebError {
    /// The input ended inside the value.
    Truncated,
    /// The value does not fit in 64 bits.
    Overflow,
    /// A longer encoding than needed (a canonical file never has one).
    NonMinimal,
}

pub(crate) fn write_uleb(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

pub(crate) fn write_sleb(out: &mut Vec<u8>, mut v: i64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if (v == 0 && byte & 0x40 == 0) || (v == -1 && byte & 0x40 != 0) {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Reads an unsigned value from `buf[*pos..end]`, advancing `pos` past it (also on error, where it matters
/// only for the error offset callers take before calling).
pub(crate) fn read_uleb(buf: &[u8], pos: &mut usize, end: usize) -> Result<u64, LebError> {
    let mut v = 0u64;
    let mut shift = 0u32;
    loop {
        let b = next(buf, pos, end)?;
        if shift == 63 && b > 1 {
            return Err(LebError::Overflow);
        }
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            if b == 0 && shift > 0 {
                return Err(LebError::NonMinimal);
            }
            return Ok(v);
        }
        shift += 7;
    }
}

/// Reads a signed value from `buf[*pos..end]`, advancing `pos` past it.
pub(crate) fn read_sleb(buf: &[u8], pos: &mut usize, end: usize) -> Result<i64, LebError> {
    let mut v = 0i64;
    let mut shift = 0u32;
    let mut prev = 0u8;
    loop {
        let b = next(buf, pos, end)?;
        if shift == 63 && b != 0 && b != 0x7f {
            return Err(LebError::Overflow);
        }
        v |= i64::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            if shift < 64 && b & 0x40 != 0 {
                v |= -1i64 << shift;
            }
            // why: a last byte that only repeats the previous byte's sign bit adds nothing
            let redundant = (b == 0 && prev & 0x40 == 0) || (b == 0x7f && prev & 0x40 != 0);
            if shift > 7 && redundant {
                return Err(LebError::NonMinimal);
            }
            return Ok(v);
        }
        prev = b;
    }
}

fn next(buf: &[u8], pos: &mut usize, end: usize) -> Result<u8, LebError> {
    if *pos >= end.min(buf.len()) {
        return Err(LebError::Truncated);
    }
    let b = buf[*pos];
    *pos += 1;
    Ok(b)
}
