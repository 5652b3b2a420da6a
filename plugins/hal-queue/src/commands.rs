//! The checks of `HalDevice::submit` and of the commands it queues, the same on every plugin so that a mistake
//! fails with the same text on every device:
//!
//! * [`Objects`]: a device's buffers and executables by id (`alloc` / `free` / `compile` and the lookups of
//!   `submit`), and [`Objects::resolve`], which turns a submission's commands into [`Cmd`]s holding their
//!   buffers and executable (so that a buffer freed while queued lives until its submission retires);
//! * what a queued command checks when it runs: [`byte_range`] (fill, write, read), [`copy_ranges`],
//!   [`check_stage_buffers`] (the execution contract's counts and sizes) and [`check_aliasing`] (an output
//!   bound twice), both in [`check_dispatch`].

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use loom_ir::kernel::{ExecError, Stage, check_buffer_count, check_buffer_size};
use loom_plugin_api::{BufferId, Command, ExecutableId};

/// What [`Objects::resolve`] asks of a device's compiled stage.
pub trait Executable {
    /// The stage's name (in the workspace count's error).
    fn stage_name(&self) -> &str;
    /// How many workspace buffers the stage declares.
    fn workspace_len(&self) -> usize;
}

/// A command with its buffers (`B`, a reference-counted handle) and executable resolved, and so kept alive,
/// when the submission is accepted.
#[derive(Debug)]
pub enum Cmd<B, E> {
    /// `Command::Dispatch`; the workspace buffers were only checked to exist (a device uses its own).
    Dispatch {
        exe: Arc<E>,
        inputs: Vec<B>,
        params: Vec<B>,
        outputs: Vec<B>,
    },
    /// `Command::Copy`.
    Copy {
        src: B,
        src_offset: u64,
        dst: B,
        dst_offset: u64,
        len: u64,
    },
    /// `Command::Fill`.
    Fill {
        dst: B,
        offset: u64,
        len: u64,
        byte: u8,
    },
}

/// A device's buffers and executables by id, with the error texts of `free` and `submit`. Ids come from one
/// counter ([`Objects::next_id`]), which a device may also use for its other objects.
#[derive(Debug)]
pub struct Objects<B, E> {
    buffers: HashMap<u64, B>,
    exes: HashMap<u64, Arc<E>>,
    next_id: u64,
}

impl<B, E> Default for Objects<B, E> {
    fn default() -> Self {
        Objects {
            buffers: HashMap::new(),
            exes: HashMap::new(),
            next_id: 0,
        }
    }
}

impl<B: Clone, E: Executable> Objects<B, E> {
    /// A new id (1, 2, ...).
    pub fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Gives `buffer` an id (`alloc`).
    pub fn add_buffer(&mut self, buffer: B) -> BufferId {
        let id = self.next_id();
        self.buffers.insert(id, buffer);
        BufferId(id)
    }

    /// Gives `exe` an id (`compile`).
    pub fn add_executable(&mut self, exe: E) -> ExecutableId {
        let id = self.next_id();
        self.exes.insert(id, Arc::new(exe));
        ExecutableId(id)
    }

    /// `HalControl::release` (ABI 1.5): ends `exe`'s id; queued submissions keep their own references, so the
    /// executable is dropped (its code freed) when the last of them retires.
    pub fn release_executable(&mut self, exe: ExecutableId) -> Result<(), String> {
        match self.exes.remove(&exe.0) {
            Some(_) => Ok(()),
            None => Err(format!("release: unknown executable {}", exe.0)),
        }
    }

    /// How many executables have live ids.
    pub fn executables(&self) -> usize {
        self.exes.len()
    }

    /// `HalDevice::free`: queued submissions keep their own references to the buffer.
    pub fn free(&mut self, buffer: BufferId) -> Result<(), String> {
        match self.buffers.remove(&buffer.0) {
            Some(_) => Ok(()),
            None => Err(format!("free: unknown buffer {}", buffer.0)),
        }
    }

    /// The buffer `id` refers to.
    pub fn buffer(&self, id: BufferId) -> Result<B, String> {
        self.buffers
            .get(&id.0)
            .cloned()
            .ok_or_else(|| format!("unknown buffer {}", id.0))
    }

    /// The executable `id` refers to.
    pub fn executable(&self, id: ExecutableId) -> Result<Arc<E>, String> {
        self.exes
            .get(&id.0)
            .cloned()
            .ok_or_else(|| format!("unknown executable {}", id.0))
    }

    fn buffers(&self, ids: &[BufferId]) -> Result<Vec<B>, String> {
        ids.iter().map(|&id| self.buffer(id)).collect()
    }

    /// The checks of `HalDevice::submit` (after its timeline points'), in command order: every id must exist,
    /// and a dispatch must name as many workspace buffers as its stage declares (they are only checked to
    /// exist: a device uses its own scratch).
    pub fn resolve(&self, commands: &[Command]) -> Result<Vec<Cmd<B, E>>, String> {
        let mut out = Vec::with_capacity(commands.len());
        for c in commands {
            out.push(match c {
                Command::Dispatch {
                    exe,
                    inputs,
                    params,
                    outputs,
                    workspace,
                } => {
                    let exe = self.executable(*exe)?;
                    check_buffer_count(
                        format!("stage `{}` workspace", exe.stage_name()),
                        exe.workspace_len(),
                        workspace.len(),
                    )
                    .map_err(|e| e.to_string())?;
                    self.buffers(workspace)?;
                    Cmd::Dispatch {
                        exe,
                        inputs: self.buffers(inputs)?,
                        params: self.buffers(params)?,
                        outputs: self.buffers(outputs)?,
                    }
                }
                Command::Copy {
                    src,
                    src_offset,
                    dst,
                    dst_offset,
                    len,
                } => Cmd::Copy {
                    src: self.buffer(*src)?,
                    src_offset: *src_offset,
                    dst: self.buffer(*dst)?,
                    dst_offset: *dst_offset,
                    len: *len,
                },
                Command::Fill {
                    dst,
                    offset,
                    len,
                    byte,
                } => Cmd::Fill {
                    dst: self.buffer(*dst)?,
                    offset: *offset,
                    len: *len,
                    byte: *byte,
                },
            });
        }
        Ok(out)
    }
}

/// Bytes `offset..offset + n` of a `len`-byte buffer, or `{what}: bytes ... are outside the buffer` (`what`:
/// `read`, `write`, `fill`, `copy source`, ...).
pub fn byte_range(what: &str, len: u64, offset: u64, n: u64) -> Result<Range<usize>, String> {
    match offset.checked_add(n) {
        Some(end) if end <= len => Ok(offset as usize..end as usize),
        _ => Err(format!(
            "{what}: bytes {offset}..{offset}+{n} are outside the buffer ({len} bytes)"
        )),
    }
}

/// The source and destination ranges of a copy of `len` bytes (source checked first); `same`: the two are one
/// buffer, whose ranges must not overlap.
pub fn copy_ranges(
    (src_len, src_offset): (u64, u64),
    (dst_len, dst_offset): (u64, u64),
    len: u64,
    same: bool,
) -> Result<(Range<usize>, Range<usize>), String> {
    let s = byte_range("copy source", src_len, src_offset, len)?;
    let d = byte_range("copy destination", dst_len, dst_offset, len)?;
    if same && s.start < d.end && d.start < s.end {
        return Err("copy: source and destination overlap".into());
    }
    Ok((s, d))
}

/// The execution contract's buffer checks of a dispatch of `stage` (counts, then each buffer's byte length
/// against its declared dtype and shape), from the lengths of the bound buffers; the text of
/// `Stage::check_buffers`, which `hal-cpu` and `loom-reference` run.
pub fn check_stage_buffers(
    stage: &Stage,
    inputs: &[u64],
    params: &[u64],
    outputs: &[u64],
) -> Result<(), String> {
    let at = format!("stage `{}`", stage.name);
    let contract = || -> Result<(), ExecError> {
        check_buffer_count(format!("{at} inputs"), stage.inputs.len(), inputs.len())?;
        check_buffer_count(format!("{at} parameters"), stage.params.len(), params.len())?;
        check_buffer_count(format!("{at} outputs"), stage.outputs.len(), outputs.len())?;
        let len = |b: &u64| usize::try_from(*b).unwrap_or(usize::MAX);
        for (d, b) in stage.inputs.iter().zip(inputs) {
            check_buffer_size(
                format!("{at} input `{}`", d.name),
                d.dtype,
                &d.shape,
                len(b),
            )?;
        }
        for (d, b) in stage.params.iter().zip(params) {
            check_buffer_size(
                format!("{at} parameter `{}`", d.name),
                d.dtype,
                &d.shape,
                len(b),
            )?;
        }
        for (d, b) in stage.outputs.iter().zip(outputs) {
            check_buffer_size(
                format!("{at} output `{}`", d.name),
                d.dtype,
                &d.shape,
                len(b),
            )?;
        }
        Ok(())
    };
    contract().map_err(|e| e.to_string())
}

/// A dispatch's checks when it runs on a GPU: [`check_stage_buffers`] with each buffer's host-allocated length
/// (`len`), then [`check_aliasing`].
pub fn check_dispatch<T>(
    stage: &Stage,
    inputs: &[Arc<T>],
    params: &[Arc<T>],
    outputs: &[Arc<T>],
    len: impl Fn(&T) -> u64,
) -> Result<(), String> {
    let lens = |bs: &[Arc<T>]| bs.iter().map(|b| len(b)).collect::<Vec<u64>>();
    check_stage_buffers(stage, &lens(inputs), &lens(params), &lens(outputs))?;
    check_aliasing(&stage.name, inputs, params, outputs)
}

/// A dispatch's outputs must not be bound to another argument (an input, a parameter or an earlier output).
pub fn check_aliasing<T>(
    stage_name: &str,
    inputs: &[Arc<T>],
    params: &[Arc<T>],
    outputs: &[Arc<T>],
) -> Result<(), String> {
    for (i, o) in outputs.iter().enumerate() {
        let mut others = inputs.iter().chain(params).chain(&outputs[..i]);
        if others.any(|b| Arc::ptr_eq(b, o)) {
            return Err(format!(
                "dispatch of `{stage_name}`: output {i} is also bound to another argument"
            ));
        }
    }
    Ok(())
}

/// The position of `b` in `distinct`, appending it when new: one lock per distinct buffer, as a buffer may be
/// bound to several read-only arguments.
pub fn slot<'a, T>(b: &'a Arc<T>, distinct: &mut Vec<&'a Arc<T>>) -> usize {
    match distinct.iter().position(|d| Arc::ptr_eq(d, b)) {
        Some(i) => i,
        None => {
            distinct.push(b);
            distinct.len() - 1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_overlaps() {
        assert_eq!(byte_range("read", 8, 2, 6).unwrap(), 2..8);
        assert_eq!(
            byte_range("read", 8, 2, 7).unwrap_err(),
            "read: bytes 2..2+7 are outside the buffer (8 bytes)"
        );
        assert_eq!(
            byte_range("fill", 8, u64::MAX, 2).unwrap_err(),
            format!(
                "fill: bytes {}..{}+2 are outside the buffer (8 bytes)",
                u64::MAX,
                u64::MAX
            )
        );
        assert_eq!(copy_ranges((8, 0), (8, 4), 4, true).unwrap(), (0..4, 4..8));
        assert_eq!(
            copy_ranges((8, 0), (8, 2), 4, true).unwrap_err(),
            "copy: source and destination overlap"
        );
        assert!(copy_ranges((8, 0), (8, 2), 4, false).is_ok());
        assert_eq!(
            copy_ranges((8, 6), (2, 0), 4, false).unwrap_err(),
            "copy source: bytes 6..6+4 are outside the buffer (8 bytes)"
        );
    }

    #[test]
    fn aliasing_and_slots() {
        let (a, b) = (Arc::new(1), Arc::new(2));
        let (one_a, one_b) = (std::slice::from_ref(&a), std::slice::from_ref(&b));
        assert!(check_aliasing("s", one_a, &[], one_b).is_ok());
        assert_eq!(
            check_aliasing("s", &[], &[], &[b.clone(), b.clone()]).unwrap_err(),
            "dispatch of `s`: output 1 is also bound to another argument"
        );
        let mut distinct = Vec::new();
        let slots: Vec<usize> = [&a, &b, &a]
            .iter()
            .map(|x| slot(x, &mut distinct))
            .collect();
        assert_eq!(slots, [0, 1, 0]);
    }
}
