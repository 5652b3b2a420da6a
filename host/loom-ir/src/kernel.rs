//! The portable kernel and stage IR: what HAL plugins receive and lower for their device.
//!
//! Everything here is **specialized**: template values are bound, so shapes, grids and extents are numbers.
//! Semantics are in `docs/loom/kernels.md`; the reference interpreter (`loom-reference`) is their executable
//! definition. Values are SSA with structured regions, like host code: a region's last op is `Yield`.

use crate::Loc;
use std::fmt;

/// Element types of buffers and tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I64,
    I32,
    U32,
    I16,
    U16,
    I8,
    U8,
    I1,
    /// GGUF block quantisations: only `Load` reads them (dequantising to f32), along the last dimension.
    Q8_0,
    Q4_0,
    Q4_1,
    Q4K,
    Q6K,
}

impl DType {
    /// Smallest and largest value of an integer dtype, as held in i64 storage (i64 and the float types: the
    /// whole i64 range). Casts to an integer type saturate to it; the reference and every backend share it.
    pub fn int_range(self) -> (i64, i64) {
        match self {
            DType::I32 => (i32::MIN.into(), i32::MAX.into()),
            DType::U32 => (0, u32::MAX.into()),
            DType::I16 => (i16::MIN.into(), i16::MAX.into()),
            DType::U16 => (0, u16::MAX.into()),
            DType::I8 => (i8::MIN.into(), i8::MAX.into()),
            DType::U8 => (0, u8::MAX.into()),
            DType::I1 => (0, 1),
            _ => (i64::MIN, i64::MAX),
        }
    }

    pub const ALL: &'static [DType] = &[
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I64,
        DType::I32,
        DType::U32,
        DType::I16,
        DType::U16,
        DType::I8,
        DType::U8,
        DType::I1,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q4K,
        DType::Q6K,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I16 => "i16",
            DType::U16 => "u16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I1 => "i1",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q4K => "q4_k",
            DType::Q6K => "q6_k",
        }
    }

    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.iter().copied().find(|d| d.name() == s)
    }

    /// For block-quantised types: (elements per block, bytes per block).
    pub fn block(self) -> Option<(u64, u64)> {
        match self {
            DType::Q8_0 => Some((32, 34)),
            DType::Q4_0 => Some((32, 18)),
            DType::Q4_1 => Some((32, 20)),
            DType::Q4K => Some((256, 144)),
            DType::Q6K => Some((256, 210)),
            _ => None,
        }
    }

    /// Bytes per element of a plain (non-block) type; `i1` is stored as one byte.
    pub fn size(self) -> Option<u64> {
        match self {
            DType::F64 | DType::I64 => Some(8),
            DType::F32 | DType::I32 | DType::U32 => Some(4),
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => Some(2),
            DType::I8 | DType::U8 | DType::I1 => Some(1),
            _ => None,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }

    pub fn is_quantized(self) -> bool {
        self.block().is_some()
    }

    /// Bytes of a buffer of this type with this shape (blocks along the last dimension), or `None` when the
    /// last dimension is not a whole number of blocks or the size overflows.
    pub fn bytes_for(self, shape: &[u64]) -> Option<u64> {
        let elems = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?;
        match self.block() {
            None => elems.checked_mul(self.size()?),
            Some((per, bytes)) => {
                let last = *shape.last()?;
                if last % per != 0 {
                    return None;
                }
                (elems / per).checked_mul(bytes)
            }
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The type of a kernel value: a scalar or a tile with a static shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KType {
    Scalar(DType),
    Tile { shape: Vec<u32>, dtype: DType },
}

impl KType {
    pub fn dtype(&self) -> DType {
        match self {
            KType::Scalar(d) | KType::Tile { dtype: d, .. } => *d,
        }
    }
    /// Number of elements (1 for a scalar).
    pub fn elements(&self) -> u64 {
        match self {
            KType::Scalar(_) => 1,
            KType::Tile { shape, .. } => shape.iter().map(|&d| d as u64).product(),
        }
    }
}

impl fmt::Display for KType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KType::Scalar(d) => write!(f, "{d}"),
            KType::Tile { shape, dtype } => {
                let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
                write!(f, "tile<[{}], {dtype}>", dims.join(", "))
            }
        }
    }
}

/// Most elements one tile may have.
pub const MAX_TILE_ELEMENTS: u64 = 1 << 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    Read,
    Write,
    ReadWrite,
}

/// A kernel parameter: a buffer with a concrete shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KParam {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub access: Access,
}

/// An SSA value of a kernel: index into [`Kernel::values`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KValue(pub u32);

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KValueDef {
    pub name: String,
    pub ty: KType,
}

/// A scalar immediate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KImm {
    I64(i64),
    F64(f64),
    I1(bool),
}

#[derive(Clone, Debug, PartialEq)]
pub enum KOperand {
    Value(KValue),
    /// An immediate of the type the operation expects (see [`KOp`]).
    Imm(KImm, DType),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Min,
    Max,
    And,
    Or,
    Xor,
    Shl,
    Shr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnOp {
    Neg,
    Abs,
    Not,
    Exp,
    Log,
    Tanh,
    Erf,
    Sqrt,
    Rsqrt,
    Sigmoid,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
}

/// One index of a load/store: a scalar (no result dimension) or a 1-D i64 tile (one result dimension).
pub type KIndex = KOperand;

#[derive(Clone, Debug, PartialEq)]
pub enum KOpKind {
    /// -> i64 scalar
    ProgramId {
        axis: u8,
    },
    /// Elementwise; a scalar operand broadcasts over a tile operand; result dtype = operand dtype.
    Binary {
        op: BinOp,
        a: KOperand,
        b: KOperand,
    },
    Unary {
        op: UnOp,
        a: KOperand,
    },
    /// -> i1 (scalar or tile)
    Cmp {
        op: CmpOp,
        a: KOperand,
        b: KOperand,
    },
    Select {
        cond: KOperand,
        a: KOperand,
        b: KOperand,
    },
    Cast {
        a: KOperand,
        to: DType,
    },
    /// -> tile<[len], i64>: start, start + 1, ...
    Range {
        start: KOperand,
        len: u32,
    },
    /// -> tile<shape, dtype> filled with `value`
    Full {
        value: KOperand,
        shape: Vec<u32>,
        dtype: DType,
    },
    Broadcast {
        a: KOperand,
        shape: Vec<u32>,
    },
    ExpandDims {
        a: KOperand,
        axis: u8,
    },
    Reshape {
        a: KOperand,
        shape: Vec<u32>,
    },
    Transpose {
        a: KOperand,
    },
    /// Removes `axis` (a rank-1 input gives a `[1]` tile).
    Reduce {
        op: ReduceOp,
        a: KOperand,
        axis: u8,
    },
    /// a: [M, K], b: [K, N], acc: [M, N] f32 -> [M, N] f32
    Dot {
        a: KOperand,
        b: KOperand,
        acc: KOperand,
    },
    /// `param` indexes [`Kernel::params`]; one index per buffer dimension; `fill: None` = checked load.
    Load {
        param: u32,
        indices: Vec<KIndex>,
        fill: Option<KOperand>,
    },
    Store {
        param: u32,
        indices: Vec<KIndex>,
        value: KOperand,
    },
    For {
        lo: KOperand,
        hi: KOperand,
        step: KOperand,
        iv: KValue,
        iters: Vec<KValue>,
        inits: Vec<KOperand>,
        body: KRegion,
    },
    If {
        cond: KOperand,
        then_region: KRegion,
        else_region: KRegion,
    },
    Yield(Vec<KOperand>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct KOp {
    pub kind: KOpKind,
    pub results: Vec<KValue>,
    pub loc: crate::Loc,
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct KRegion {
    pub ops: Vec<KOp>,
}

/// A specialized kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// Qualified and specialized: `motifs.gemm<M=128,N=384,K=1536>`.
    pub name: String,
    pub params: Vec<KParam>,
    /// Launch grid (missing trailing dimensions are 1).
    pub grid: [u64; 3],
    pub values: Vec<KValueDef>,
    /// Ends in an empty `Yield`.
    pub body: KRegion,
    pub file: String,
}

/// Where a stage's dispatch argument lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufRef {
    Input(u32),
    Output(u32),
    Workspace(u32),
    Param(u32),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StageBuffer {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
}

/// A reflected fixed parameter binding: `%w: f32[H, H] = weights(0, "proj.weight") layout(packed_b)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ParamBinding {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// Policy-local input ordinal.
    pub input: u32,
    pub key: String,
    pub layout: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Dispatch {
    /// Index into [`Stage::kernels`].
    pub kernel: u32,
    /// One per kernel parameter.
    pub args: Vec<BufRef>,
}

/// A specialized stage: a command program.
#[derive(Clone, Debug, PartialEq)]
pub struct Stage {
    pub name: String,
    pub inputs: Vec<StageBuffer>,
    pub outputs: Vec<StageBuffer>,
    pub workspace: Vec<StageBuffer>,
    /// The parameter domain's name (`@dense`) and its bindings.
    pub param_domain: Option<String>,
    pub params: Vec<ParamBinding>,
    pub kernels: Vec<Kernel>,
    pub dispatches: Vec<Dispatch>,
}

/// Why a kernel or stage could not run to completion. This is part of the execution contract: the reference
/// interpreter and every backend report the same variant (and message) for the same failure, which is what
/// differential tests compare.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExecError {
    #[error("{buffer}: {actual} bytes, but {dtype}{shape:?} needs {expected}")]
    SizeMismatch {
        buffer: String,
        dtype: DType,
        shape: Vec<u64>,
        expected: u64,
        actual: usize,
    },
    #[error("{what}: {actual} buffers given, {expected} expected")]
    BufferCount {
        what: String,
        expected: usize,
        actual: usize,
    },
    #[error(
        "kernel `{kernel}`: checked load from `{param}`: index {index} is outside dimension {dim} \
         (extent {extent}) in program {program_id:?}"
    )]
    IndexOutOfRange {
        kernel: String,
        param: String,
        index: i64,
        dim: usize,
        extent: u64,
        program_id: [u64; 3],
    },
    #[error("kernel `{kernel}` at {}:{}: integer division by zero in program {program_id:?}", .loc.line, .loc.col)]
    DivisionByZero {
        kernel: String,
        loc: Loc,
        program_id: [u64; 3],
    },
    #[error(
        "kernel `{kernel}` at {}:{}: a tile of {elements} elements exceeds the limit of {limit}",
        .loc.line, .loc.col, limit = MAX_TILE_ELEMENTS
    )]
    TileTooLarge {
        kernel: String,
        loc: Loc,
        elements: u64,
    },
    #[error("malformed IR: {at}: {message}")]
    Malformed { at: String, message: String },
    /// A dispatch ran past its step budget ([`RunBounds::steps`]): more program instances than the budget,
    /// or an instance took more loop iterations than its share.
    #[error("kernel `{kernel}` of stage `{stage}` exceeded its budget of {budget} steps")]
    BudgetExceeded {
        kernel: String,
        stage: String,
        budget: u64,
    },
    /// The dispatch's cancellation flag ([`RunBounds::cancel`]) was set while it ran.
    #[error("kernel `{kernel}` of stage `{stage}` was cancelled")]
    Cancelled { kernel: String, stage: String },
    /// Valid IR that a backend does not lower (yet), or a backend compiler failure.
    #[error("kernel `{kernel}`: not supported by the {backend} backend: {message}")]
    Unsupported {
        kernel: String,
        backend: String,
        message: String,
    },
}

/// The run-time bounds of one dispatch (issue 14): a step budget and a cancellation flag, checked at the same
/// places on every backend: once per program instance (grid boundary) and once per iteration of a kernel's
/// `for` loop (its back-edge). Tile operations' element loops are bounded by the tile size and not counted.
///
/// The budget is split evenly: a dispatch of `G` program instances under a budget of `B` steps fails before
/// running when `G > B`, and otherwise each instance may run `B / G - 1` loop iterations in all (one step is
/// the instance itself), so the whole dispatch takes at most `B` steps and the result does not depend on how
/// instances are spread over threads or GPU lanes ([`instance_allowance`]). `steps == 0` is no budget.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunBounds<'a> {
    /// Steps one dispatch may take; 0: unbounded.
    pub steps: u64,
    /// A flag another thread sets (non-zero) to stop the dispatch at its next instance or iteration.
    pub cancel: Option<&'a std::sync::atomic::AtomicU32>,
}

impl RunBounds<'_> {
    /// No budget, no cancellation.
    pub const NONE: RunBounds<'static> = RunBounds {
        steps: 0,
        cancel: None,
    };

    /// Whether the cancellation flag is set.
    pub fn cancelled(&self) -> bool {
        self.cancel
            .is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed) != 0)
    }
}

/// The loop iterations each of `instances` program instances may run under a budget of `steps` (see
/// [`RunBounds`]): `None` when the grid alone is over the budget; `u64::MAX` when `steps` is 0 (unbounded).
pub fn instance_allowance(steps: u64, instances: u64) -> Option<u64> {
    if steps == 0 {
        return Some(u64::MAX);
    }
    if instances > steps {
        return None;
    }
    Some(steps / instances.max(1) - 1)
}

/// Byte length of a buffer of `dtype` and `shape`, or the contract's error naming `name` when it has none
/// (block-misaligned or too big).
pub fn buffer_bytes(at: &str, name: &str, dtype: DType, shape: &[u64]) -> Result<usize, ExecError> {
    dtype
        .bytes_for(shape)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| ExecError::Malformed {
            at: at.to_string(),
            message: format!(
                "`{name}`: {dtype}{shape:?} has no byte size (block-misaligned or too big)"
            ),
        })
}

/// The contract's size check of one buffer: its length must equal `dtype.bytes_for(shape)`.
pub fn check_buffer_size(
    buffer: String,
    dtype: DType,
    shape: &[u64],
    actual: usize,
) -> Result<(), ExecError> {
    let expected = buffer_bytes(&buffer, &buffer, dtype, shape)?;
    if expected != actual {
        return Err(ExecError::SizeMismatch {
            buffer,
            dtype,
            shape: shape.to_vec(),
            expected: expected as u64,
            actual,
        });
    }
    Ok(())
}

/// The contract's count check: `actual` buffers given where `expected` are declared.
pub fn check_buffer_count(what: String, expected: usize, actual: usize) -> Result<(), ExecError> {
    if expected != actual {
        return Err(ExecError::BufferCount {
            what,
            expected,
            actual,
        });
    }
    Ok(())
}

/// Workspace alignment in bytes (every placed workspace buffer starts at a multiple of it).
pub const WORKSPACE_ALIGN: u64 = 256;

/// Where a stage's workspace buffers live in one region ([`Stage::workspace_placement`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkspacePlacement {
    /// Per workspace buffer: the first and last dispatch that use it (`None`: no dispatch does; no memory).
    pub live: Vec<Option<(usize, usize)>>,
    /// Per workspace buffer: its byte offset in the region.
    pub offsets: Vec<u64>,
    /// Per workspace buffer: its byte size.
    pub sizes: Vec<u64>,
    /// The region's size (the highest end, rounded up to [`WORKSPACE_ALIGN`]).
    pub total: u64,
}

impl Stage {
    /// The workspace placement every backend and the reflection share: a workspace buffer is live from the
    /// first dispatch that uses it to the last one (inclusive); a buffer no dispatch uses gets no memory.
    /// Buffers are placed in decreasing size (ties: by index) with greedy first fit: each takes the lowest
    /// [`WORKSPACE_ALIGN`]ed offset at which it overlaps no already-placed buffer whose live interval
    /// intersects its own, so buffers with disjoint intervals may share bytes.
    pub fn workspace_placement(&self) -> WorkspacePlacement {
        let mut live: Vec<Option<(usize, usize)>> = vec![None; self.workspace.len()];
        for (di, d) in self.dispatches.iter().enumerate() {
            for a in &d.args {
                if let BufRef::Workspace(w) = a {
                    if let Some(l) = live.get_mut(*w as usize) {
                        *l = Some(l.map_or((di, di), |(s, _)| (s, di)));
                    }
                }
            }
        }
        let sizes: Vec<u64> = self
            .workspace
            .iter()
            .map(|b| b.dtype.bytes_for(&b.shape).unwrap_or(0))
            .collect();
        let mut order: Vec<usize> = (0..self.workspace.len())
            .filter(|&i| live[i].is_some())
            .collect();
        order.sort_by(|&a, &b| sizes[b].cmp(&sizes[a]).then(a.cmp(&b)));
        let mut offsets = vec![0u64; self.workspace.len()];
        let mut placed: Vec<usize> = Vec::new();
        let overlaps = |x: (usize, usize), y: (usize, usize)| x.0 <= y.1 && y.0 <= x.1;
        let align = |v: u64| v.div_ceil(WORKSPACE_ALIGN).saturating_mul(WORKSPACE_ALIGN);
        let mut total = 0u64;
        for &i in &order {
            let li = live[i].unwrap_or((0, 0));
            let mut conflicts: Vec<(u64, u64)> = placed
                .iter()
                .filter(|&&j| overlaps(li, live[j].unwrap_or((0, 0))))
                .map(|&j| (offsets[j], offsets[j].saturating_add(sizes[j])))
                .collect();
            conflicts.sort();
            let mut off = 0u64;
            for (s, e) in conflicts {
                if off.saturating_add(sizes[i]) <= s {
                    break;
                }
                off = off.max(align(e));
            }
            offsets[i] = off;
            total = total.max(align(off.saturating_add(sizes[i])));
            placed.push(i);
        }
        WorkspacePlacement {
            live,
            offsets,
            sizes,
            total,
        }
    }

    /// The execution contract's checks of a stage's host buffers, shared by the reference and every backend so
    /// the same mistake gives the same error: the counts of inputs, parameters and outputs, then each buffer's
    /// byte length against its declared dtype and shape.
    pub fn check_buffers(
        &self,
        inputs: &[&[u8]],
        params: &[&[u8]],
        outputs: &[Vec<u8>],
    ) -> Result<(), ExecError> {
        let at = format!("stage `{}`", self.name);
        check_buffer_count(format!("{at} inputs"), self.inputs.len(), inputs.len())?;
        check_buffer_count(format!("{at} parameters"), self.params.len(), params.len())?;
        check_buffer_count(format!("{at} outputs"), self.outputs.len(), outputs.len())?;
        for (b, d) in self.inputs.iter().zip(inputs) {
            check_buffer_size(
                format!("{at} input `{}`", b.name),
                b.dtype,
                &b.shape,
                d.len(),
            )?;
        }
        for (b, d) in self.params.iter().zip(params) {
            check_buffer_size(
                format!("{at} parameter `{}`", b.name),
                b.dtype,
                &b.shape,
                d.len(),
            )?;
        }
        for (b, d) in self.outputs.iter().zip(outputs) {
            check_buffer_size(
                format!("{at} output `{}`", b.name),
                b.dtype,
                &b.shape,
                d.len(),
            )?;
        }
        Ok(())
    }
}
