//! Checkpoint indexing: safetensors (one file or ordered shards) and GGUF (including block-quantised types).
//!
//! A [`Source`] is the ordered file list a package declared with `prepare.source` / `prepare.source_append`.
//! Indexing opens each file once, parses only its header and keeps the open handle: payload bytes are read on
//! demand by activation and `parameters.gather` with positional reads. Every size in a header is checked against
//! the file's length before it is trusted, so a truncated or hostile file is an error, never a wild read.

use loom_ir::kernel::DType;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Largest header we parse (safetensors JSON or GGUF metadata).
pub const MAX_HEADER_BYTES: u64 = 256 << 20;
/// Most tensors in one file.
pub const MAX_TENSORS: u64 = 1 << 20;

/// One tensor of a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Index of the shard in [`Source::files`].
    pub file: usize,
    /// The dtype as the checkpoint names it (`F32`, `Q4_1`, ...).
    pub format_dtype: String,
    /// Our dtype, when we have one for it.
    pub dtype: Option<DType>,
    /// Row-major shape (outermost first).
    pub shape: Vec<u64>,
    /// Absolute byte offset of the payload in its file.
    pub offset: u64,
    /// Payload bytes.
    pub len: u64,
}

/// A GGUF metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Meta {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Meta>),
}

/// The block size (file offsets and lengths, and staging addresses) of direct-I/O reads.
pub const DIRECT_ALIGN: u64 = 4096;

/// An indexed checkpoint: the ordered shards, their open handles, and every tensor by key.
#[derive(Debug)]
pub struct Source {
    pub files: Vec<PathBuf>,
    /// Each file's generation when it was opened and indexed.
    pub gens: Vec<FileGen>,
    /// How messages name each file (package-relative for package checkpoints).
    pub names: Vec<String>,
    handles: Vec<Arc<File>>,
    pub entries: HashMap<String, Entry>,
    /// GGUF metadata (empty for safetensors).
    pub meta: HashMap<String, Meta>,
}

/// A checkpoint file's generation: its identity (device, inode) and its size and modification time. Replacing the
/// file (a new inode) or rewriting it (a new size or time) makes a new generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileGen {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

impl FileGen {
    fn of(m: &std::fs::Metadata) -> FileGen {
        use std::os::unix::fs::MetadataExt;
        FileGen {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        }
    }
}

impl Source {
    /// Opens and indexes `files` in order. A key present in two shards is an error. Messages name each file
    /// by its path.
    pub fn open(files: &[PathBuf]) -> Result<Source, String> {
        let named: Vec<(PathBuf, String)> = files
            .iter()
            .map(|p| (p.clone(), p.display().to_string()))
            .collect();
        Source::open_named(&named)
    }

    /// [`Source::open`] for (path, name) shards: messages name each file by `name` only (a package-relative
    /// path, so that errors never show where the server keeps files).
    pub fn open_named(files: &[(PathBuf, String)]) -> Result<Source, String> {
        let mut s = Source {
            files: Vec::new(),
            gens: Vec::new(),
            names: Vec::new(),
            handles: Vec::new(),
            entries: HashMap::new(),
            meta: HashMap::new(),
        };
        for (path, name) in files {
            s.append(path, name)?;
        }
        Ok(s)
    }

    /// Indexes one more shard, named `name` in messages.
    pub fn append(&mut self, path: &Path, name: &str) -> Result<(), String> {
        let file = File::open(path)
            .map_err(|e| format!("checkpoint {name}: {}", crate::package::io_text(&e)))?;
        let md = file
            .metadata()
            .map_err(|e| format!("checkpoint {name}: {}", crate::package::io_text(&e)))?;
        let len = md.len();
        let generation = FileGen::of(&md);
        let mut magic = [0u8; 4];
        read_exact_at(&file, &mut magic, 0, len).map_err(|e| format!("checkpoint {name}: {e}"))?;
        let idx = self.files.len();
        let (entries, meta) = if &magic == b"GGUF" {
            gguf_index(&file, len, idx)
        } else {
            safetensors_index(&file, len, idx)
        }
        .map_err(|e| format!("checkpoint {name}: {e}"))?;
        for (k, e) in entries {
            if self.entries.contains_key(&k) {
                return Err(format!(
                    "checkpoint {name}: tensor `{k}` is also in an earlier shard"
                ));
            }
            self.entries.insert(k, e);
        }
        self.meta.extend(meta);
        self.files.push(path.to_path_buf());
        self.gens.push(generation);
        self.names.push(name.to_string());
        self.handles.push(Arc::new(file));
        Ok(())
    }

    /// The first of its files (by name) that is no longer the generation it indexed: replaced, rewritten or
    /// gone. Its index (tensor offsets) then describes another file, so nothing may be placed from it again.
    pub fn stale(&self) -> Option<&str> {
        self.files
            .iter()
            .zip(&self.gens)
            .zip(&self.names)
            .find(|((path, g), _)| {
                std::fs::metadata(path).map(|m| FileGen::of(&m)).ok() != Some(**g)
            })
            .map(|(_, name)| name.as_str())
    }

    /// The open descriptor of shard `shard`, to hand to a device that queues file reads (it opens its own
    /// handle on the same file, see `loom_plugin_api::HalFiles`).
    pub fn raw_fd(&self, shard: usize) -> Option<i32> {
        use std::os::fd::AsRawFd;
        self.handles.get(shard).map(|f| f.as_raw_fd())
    }

    /// Reads `len` bytes of `entry` starting `offset` bytes into its payload.
    pub fn read(&self, entry: &Entry, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        self.check_range(entry, offset, buf.len())?;
        let file = &self.handles[entry.file];
        file.read_exact_at(buf, entry.offset + offset).map_err(|e| {
            format!(
                "{}: {}",
                self.names[entry.file],
                crate::package::io_text(&e)
            )
        })
    }

    fn check_range(&self, entry: &Entry, offset: u64, len: usize) -> Result<(), String> {
        offset
            .checked_add(len as u64)
            .filter(|&e| e <= entry.len)
            .map(|_| ())
            .ok_or_else(|| {
                format!(
                    "range {offset}+{len} is outside the tensor's {} bytes",
                    entry.len
                )
            })
    }

    /// Opens shard `shard` for direct I/O (`O_DIRECT`: reads bypass the page cache). A file system that refuses
    /// it (tmpfs) is an error naming the file, never a buffered fallback.
    pub fn open_direct(&self, shard: usize) -> Result<File, String> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&self.files[shard])
            .map_err(|e| {
                format!(
                    "{}: the file system refuses direct I/O (`io.direct` in model.json): {}",
                    self.names[shard],
                    crate::package::io_text(&e)
                )
            })
    }

    /// [`read`](Self::read) through `direct`, a handle of the entry's shard from [`open_direct`](Self::open_direct):
    /// the whole [`DIRECT_ALIGN`]-byte blocks around the range go into `staging` (grown as needed; its aligned
    /// part is used), and the range is copied out of them.
    pub fn read_direct(
        &self,
        direct: &File,
        staging: &mut Vec<u8>,
        entry: &Entry,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), String> {
        self.check_range(entry, offset, buf.len())?;
        let a = DIRECT_ALIGN;
        let at = entry.offset + offset;
        let start = at / a * a;
        let end = (at + buf.len() as u64).div_ceil(a) * a;
        let span = (end - start) as usize;
        if staging.len() < span + a as usize {
            staging.resize(span + a as usize, 0);
        }
        let skew = staging.as_ptr().align_offset(a as usize);
        let block = &mut staging[skew..skew + span];
        let mut got = 0usize;
        while got < span {
            // The file's last block may be short: a read at the end returns fewer bytes.
            let n = direct
                .read_at(&mut block[got..], start + got as u64)
                .map_err(|e| {
                    format!(
                        "{}: {}",
                        self.names[entry.file],
                        crate::package::io_text(&e)
                    )
                })?;
            if n == 0 {
                break;
            }
            got += n;
        }
        let from = (at - start) as usize;
        if got < from + buf.len() {
            return Err(format!(
                "{}: truncated: needs {} bytes at offset {at}",
                self.names[entry.file],
                buf.len()
            ));
        }
        buf.copy_from_slice(&block[from..from + buf.len()]);
        Ok(())
    }
}

fn read_exact_at(file: &File, buf: &mut [u8], at: u64, len: u64) -> Result<(), String> {
    if at.checked_add(buf.len() as u64).is_none_or(|e| e > len) {
        return Err(format!(
            "truncated: needs {} bytes at offset {at}, the file has {len}",
            buf.len()
        ));
    }
    file.read_exact_at(buf, at).map_err(|e| e.to_string())
}

type Index = (Vec<(String, Entry)>, HashMap<String, Meta>);

fn safetensors_dtype(s: &str) -> (Option<DType>, Option<u64>) {
    match s {
        "F32" => (Some(DType::F32), Some(4)),
        "F16" => (Some(DType::F16), Some(2)),
        "BF16" => (Some(DType::BF16), Some(2)),
        "F64" => (Some(DType::F64), Some(8)),
        "I64" => (Some(DType::I64), Some(8)),
        "I32" => (Some(DType::I32), Some(4)),
        "U32" => (Some(DType::U32), Some(4)),
        "I16" => (Some(DType::I16), Some(2)),
        "U16" => (Some(DType::U16), Some(2)),
        "I8" => (Some(DType::I8), Some(1)),
        "U8" => (Some(DType::U8), Some(1)),
        "BOOL" => (None, Some(1)),
        "U64" => (None, Some(8)),
        _ => (None, None),
    }
}

fn safetensors_index(file: &File, len: u64, idx: usize) -> Result<Index, String> {
    let mut n = [0u8; 8];
    read_exact_at(file, &mut n, 0, len)?;
    let n = u64::from_le_bytes(n);
    if n > MAX_HEADER_BYTES || n.checked_add(8).is_none_or(|e| e > len) {
        return Err(format!(
            "not a safetensors file: header length {n} does not fit the file's {len} bytes"
        ));
    }
    let mut header = vec![0u8; n as usize];
    read_exact_at(file, &mut header, 8, len)?;
    let json: serde_json::Value = serde_json::from_slice(&header)
        .map_err(|e| format!("not a safetensors file: header is not JSON: {e}"))?;
    let obj = json
        .as_object()
        .ok_or("safetensors header is not a JSON object")?;
    if obj.len() as u64 > MAX_TENSORS {
        return Err(format!("more than {MAX_TENSORS} tensors"));
    }
    let data_start = 8 + n;
    let data_len = len - data_start;
    let mut out = Vec::with_capacity(obj.len());
    for (k, v) in obj {
        if k == "__metadata__" {
            continue;
        }
        let bad = |m: &str| format!("tensor `{k}`: {m}");
        let dtype = v
            .get("dtype")
            .and_then(|d| d.as_str())
            .ok_or_else(|| bad("no string `dtype`"))?;
        let shape: Vec<u64> = v
            .get("shape")
            .and_then(|s| s.as_array())
            .ok_or_else(|| bad("no array `shape`"))?
            .iter()
            .map(|d| d.as_u64())
            .collect::<Option<_>>()
            .ok_or_else(|| bad("`shape` holds a non-integer"))?;
        let offs = v
            .get("data_offsets")
            .and_then(|s| s.as_array())
            .filter(|a| a.len() == 2)
            .ok_or_else(|| bad("no two-element `data_offsets`"))?;
        let (b, e) = match (offs[0].as_u64(), offs[1].as_u64()) {
            (Some(b), Some(e)) if b <= e && e <= data_len => (b, e),
            _ => {
                return Err(bad(&format!(
                    "data_offsets {offs:?} are not within the {data_len} payload bytes"
                )));
            }
        };
        let (ours, elem) = safetensors_dtype(dtype);
        let elem = elem.ok_or_else(|| bad(&format!("unknown dtype {dtype:?}")))?;
        let elems = shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad("shape overflows"))?;
        if elems.checked_mul(elem) != Some(e - b) {
            return Err(bad(&format!(
                "{dtype}{shape:?} needs {} bytes, data_offsets give {}",
                elems.saturating_mul(elem),
                e - b
            )));
        }
        out.push((
            k.clone(),
            Entry {
                file: idx,
                format_dtype: dtype.to_string(),
                dtype: ours,
                shape,
                offset: data_start + b,
                len: e - b,
            },
        ));
    }
    Ok((out, HashMap::new()))
}

/// GGML tensor types we know the size of: (name, our dtype, block elements, block bytes).
fn ggml_type(t: u32) -> Option<(&'static str, Option<DType>, u64, u64)> {
    Some(match t {
        0 => ("F32", Some(DType::F32), 1, 4),
        1 => ("F16", Some(DType::F16), 1, 2),
        2 => ("Q4_0", Some(DType::Q4_0), 32, 18),
        3 => ("Q4_1", Some(DType::Q4_1), 32, 20),
        6 => ("Q5_0", None, 32, 22),
        7 => ("Q5_1", None, 32, 24),
        8 => ("Q8_0", Some(DType::Q8_0), 32, 34),
        10 => ("Q2_K", None, 256, 84),
        11 => ("Q3_K", None, 256, 110),
        12 => ("Q4_K", Some(DType::Q4K), 256, 144),
        13 => ("Q5_K", None, 256, 176),
        14 => ("Q6_K", Some(DType::Q6K), 256, 210),
        24 => ("I8", Some(DType::I8), 1, 1),
        25 => ("I16", Some(DType::I16), 1, 2),
        26 => ("I32", Some(DType::I32), 1, 4),
        27 => ("I64", Some(DType::I64), 1, 8),
        28 => ("F64", Some(DType::F64), 1, 8),
        30 => ("BF16", Some(DType::BF16), 1, 2),
        _ => return None,
    })
}

struct Reader<'a> {
    file: &'a File,
    len: u64,
    pos: u64,
}

impl Reader<'_> {
    fn bytes(&mut self, n: u64) -> Result<Vec<u8>, String> {
        if n > MAX_HEADER_BYTES {
            return Err(format!("a {n}-byte header field is too large"));
        }
        let mut b = vec![0u8; n as usize];
        read_exact_at(self.file, &mut b, self.pos, self.len)?;
        self.pos += n;
        Ok(b)
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.bytes(4)?.try_into().unwrap_or([0; 4]),
        ))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.bytes(8)?.try_into().unwrap_or([0; 8]),
        ))
    }
    fn string(&mut self) -> Result<String, String> {
        let n = self.u64()?;
        String::from_utf8(self.bytes(n)?).map_err(|_| "a header string is not UTF-8".to_string())
    }
    fn value(&mut self, ty: u32, depth: u32) -> Result<Meta, String> {
        Ok(match ty {
            0 => Meta::Int(self.bytes(1)?[0] as i64),
            1 => Meta::Int(self.bytes(1)?[0] as i8 as i64),
            2 => Meta::Int(u16::from_le_bytes([self.bytes(1)?[0], self.bytes(1)?[0]]) as i64),
            3 => Meta::Int(i16::from_le_bytes([self.bytes(1)?[0], self.bytes(1)?[0]]) as i64),
            4 => Meta::Int(self.u32()? as i64),
            5 => Meta::Int(self.u32()? as i32 as i64),
            6 => Meta::Float(f32::from_bits(self.u32()?) as f64),
            7 => Meta::Bool(self.bytes(1)?[0] != 0),
            8 => Meta::Str(self.string()?),
            9 => {
                if depth > 4 {
                    return Err("metadata arrays nest too deeply".into());
                }
                let et = self.u32()?;
                let n = self.u64()?;
                if n > self.len {
                    return Err(format!(
                        "a metadata array of {n} items is larger than the file"
                    ));
                }
                let mut v = Vec::with_capacity(n.min(1 << 20) as usize);
                for _ in 0..n {
                    v.push(self.value(et, depth + 1)?);
                }
                Meta::Array(v)
            }
            10 => Meta::Int(self.u64()? as i64),
            11 => Meta::Int(self.u64()? as i64),
            12 => Meta::Float(f64::from_bits(self.u64()?)),
            t => return Err(format!("unknown metadata value type {t}")),
        })
    }
}

fn gguf_index(file: &File, len: u64, idx: usize) -> Result<Index, String> {
    let mut r = Reader { file, len, pos: 4 };
    let version = r.u32()?;
    if !(2..=3).contains(&version) {
        return Err(format!("GGUF version {version} (expected 2 or 3)"));
    }
    let n_tensors = r.u64()?;
    let n_kv = r.u64()?;
    if n_tensors > MAX_TENSORS || n_kv > MAX_TENSORS {
        return Err(format!(
            "{n_tensors} tensors / {n_kv} metadata entries: too many"
        ));
    }
    let mut meta = HashMap::new();
    for _ in 0..n_kv {
        let k = r.string()?;
        let t = r.u32()?;
        let v = r.value(t, 0)?;
        meta.insert(k, v);
    }
    let align = match meta.get("general.alignment") {
        Some(Meta::Int(a)) if *a > 0 && (*a as u64).is_power_of_two() => *a as u64,
        None => 32,
        Some(other) => return Err(format!("general.alignment {other:?} is not a power of two")),
    };
    let mut infos = Vec::with_capacity(n_tensors as usize);
    for _ in 0..n_tensors {
        let name = r.string()?;
        let nd = r.u32()?;
        if nd > 8 {
            return Err(format!("tensor `{name}` has {nd} dimensions"));
        }
        let mut dims = Vec::with_capacity(nd as usize);
        for _ in 0..nd {
            dims.push(r.u64()?);
        }
        let t = r.u32()?;
        let off = r.u64()?;
        infos.push((name, dims, t, off));
    }
    let data_start = r.pos.div_ceil(align) * align;
    let mut out = Vec::with_capacity(infos.len());
    for (name, dims, t, off) in infos {
        let bad = |m: String| format!("tensor `{name}`: {m}");
        let (tname, ours, be, bb) =
            ggml_type(t).ok_or_else(|| bad(format!("unknown GGML type {t}")))?;
        let elems = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad("shape overflows".into()))?;
        if dims.first().is_some_and(|d| d % be != 0) {
            return Err(bad(format!(
                "row length {} is not a multiple of the {tname} block ({be})",
                dims[0]
            )));
        }
        let bytes = (elems / be)
            .checked_mul(bb)
            .ok_or_else(|| bad("size overflows".into()))?;
        let start = data_start
            .checked_add(off)
            .filter(|s| s.checked_add(bytes).is_some_and(|e| e <= len))
            .ok_or_else(|| {
                bad(format!(
                    "{bytes} bytes at data offset {off} do not fit the file's {len} bytes"
                ))
            })?;
        // GGUF lists dimensions innermost first; our shapes are row-major.
        let shape: Vec<u64> = dims.iter().rev().copied().collect();
        out.push((
            name,
            Entry {
                file: idx,
                format_dtype: tname.to_string(),
                dtype: ours,
                shape,
                offset: start,
                len: bytes,
            },
        ));
    }
    Ok((out, meta))
}

#[cfg(test)]
mod tests;
