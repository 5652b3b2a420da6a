//! A canonical binary encoding of a specialized [`Stage`]: how a stage crosses the plugin ABI (as bytes) to a
//! HAL plugin's `compile`.
//!
//! The bytes come from the host, but a plugin treats them as untrusted like any other input: [`decode_stage`]
//! enforces hard limits, never allocates from an unchecked count, recurses at most [`MAX_NESTING`] regions deep
//! and never panics.
//!
//! # Layout
//!
//! ```text
//! stage    := magic major minor body
//! magic    := 00 6c 6f 6f 6d 6b 73 0a          "\0loomks\n"
//! major    := u16 LE = 1                        a decoder accepts its own major and any minor <= its own
//! minor    := u16 LE = 0
//! body     := name:str inputs:list(buf) outputs:list(buf) workspace:list(buf) domain:opt(str)
//!             params:list(binding) kernels:list(kernel) dispatches:list(dispatch)
//! buf      := name:str dtype shape:list(uleb)
//! binding  := name:str dtype shape:list(uleb) input:uleb key:str layout:opt(str)
//! kernel   := name:str file:str params:list(kparam) grid:uleb*3 values:list(vdef) body:region
//! kparam   := name:str dtype shape:list(uleb) access:u8 (0 read, 1 write, 2 read-write)
//! vdef     := name:str ktype
//! ktype    := 0 dtype (scalar) | 1 dtype shape:list(uleb) (tile)
//! dispatch := kernel:uleb args:list(bufref)
//! bufref   := 0 uleb (input) | 1 uleb (output) | 2 uleb (workspace) | 3 uleb (param)
//! region   := list(op)
//! op       := tag:u8 results:list(value:uleb) line:uleb col:uleb payload
//!   0 program_id axis:u8          1 binary binop:u8 a b       2 unary unop:u8 a       3 cmp cmpop:u8 a b
//!   4 select cond a b             5 cast a to:dtype           6 range start len:uleb
//!   7 full value shape dtype      8 broadcast a shape         9 expand_dims a axis:u8 10 reshape a shape
//!   11 transpose a                12 reduce redop:u8 a axis:u8 13 dot a b acc
//!   14 load param:uleb indices:list(operand) fill:opt(operand)
//!   15 store param:uleb indices:list(operand) value
//!   16 for lo hi step iv:uleb iters:list(uleb) inits:list(operand) body:region
//!   17 if cond then:region else:region                        18 yield list(operand)
//! operand  := 0 value:uleb | 1 sleb dtype (i64 imm) | 2 bits:8 LE dtype (f64 imm) | 3 dtype (false) | 4 dtype (true)
//! ```
//!
//! `uleb`/`sleb` are (un)signed LEB128, always minimal; `str` is `len:uleb utf8`; `list(x)` is `n:uleb x*n`;
//! `opt(x)` is a byte `0`, or `1` then `x`; `dtype` is a byte, the index in [`DType::ALL`]; op codes are indices
//! in the tables below. Floats are stored as their bits (any bits: `-inf` is a common reduction seed).
//! References are checked: values against the kernel's value table, load/store parameters against the kernel's
//! parameters, dispatch kernels and buffer references against the stage's lists.
//!
//! # Canonical form
//!
//! Exactly one encoding per stage: [`decode_stage`] re-encodes what it read and rejects any difference, so for
//! every accepted `b`, `encode_stage(&decode_stage(b)?) == b`, and `decode_stage(&encode_stage(s)) == Ok(s)`
//! for every stage within the limits whose references are in range (float immediates compare by bits; `NaN`
//! immediates are kept but compare unequal under `PartialEq`).

use crate::Loc;
use crate::kernel::{
    Access, BinOp, BufRef, CmpOp, DType, Dispatch, KImm, KOp, KOpKind, KOperand, KParam, KRegion,
    KType, KValue, KValueDef, Kernel, ParamBinding, ReduceOp, Stage, StageBuffer, UnOp,
};
use thiserror::Error;

/// The first 8 bytes of every encoded stage.
pub const MAGIC: [u8; 8] = *b"\0loomks\n";
/// The format's major version: a different major is unreadable.
pub const VERSION_MAJOR: u16 = 1;
/// The format's minor version: encodings with a minor up to this one are readable.
pub const VERSION_MINOR: u16 = 0;

/// Largest accepted encoding.
pub const MAX_STAGE_BYTES: usize = 64 << 20;
/// Largest string.
pub const MAX_STRING_LEN: usize = 1 << 16;
/// Most entries in any list (buffers, params, shape dims, operands, results, ...).
pub const MAX_LIST_LEN: usize = 1 << 16;
/// Most kernels in one stage.
pub const MAX_KERNELS: usize = 1 << 12;
/// Most values in one kernel.
pub const MAX_VALUES: usize = 1 << 20;
/// Most ops in one stage, nested regions included.
pub const MAX_OPS: usize = 1 << 20;
/// Deepest region nesting: a kernel body is depth 0. (A recursive walk takes several KiB of stack per level in
/// debug builds; 128 levels stay well inside a 2 MiB thread stack.)
pub const MAX_NESTING: usize = 128;

const HEADER_LEN: usize = MAGIC.len() + 4;

const BINOPS: [BinOp; 12] = [
    BinOp::Add,
    BinOp::Sub,
    BinOp::Mul,
    BinOp::Div,
    BinOp::Rem,
    BinOp::Min,
    BinOp::Max,
    BinOp::And,
    BinOp::Or,
    BinOp::Xor,
    BinOp::Shl,
    BinOp::Shr,
];
const UNOPS: [UnOp; 10] = [
    UnOp::Neg,
    UnOp::Abs,
    UnOp::Not,
    UnOp::Exp,
    UnOp::Log,
    UnOp::Tanh,
    UnOp::Erf,
    UnOp::Sqrt,
    UnOp::Rsqrt,
    UnOp::Sigmoid,
];
const CMPOPS: [CmpOp; 6] = [
    CmpOp::Eq,
    CmpOp::Ne,
    CmpOp::Lt,
    CmpOp::Le,
    CmpOp::Gt,
    CmpOp::Ge,
];
const REDOPS: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min];
const ACCESS: [Access; 3] = [Access::Read, Access::Write, Access::ReadWrite];

// op tags
const OP_PROGRAM_ID: u8 = 0;
const OP_BINARY: u8 = 1;
const OP_UNARY: u8 = 2;
const OP_CMP: u8 = 3;
const OP_SELECT: u8 = 4;
const OP_CAST: u8 = 5;
const OP_RANGE: u8 = 6;
const OP_FULL: u8 = 7;
const OP_BROADCAST: u8 = 8;
const OP_EXPAND_DIMS: u8 = 9;
const OP_RESHAPE: u8 = 10;
const OP_TRANSPOSE: u8 = 11;
const OP_REDUCE: u8 = 12;
const OP_DOT: u8 = 13;
const OP_LOAD: u8 = 14;
const OP_STORE: u8 = 15;
const OP_FOR: u8 = 16;
const OP_IF: u8 = 17;
const OP_YIELD: u8 = 18;

// operand tags
const OPND_VALUE: u8 = 0;
const OPND_I64: u8 = 1;
const OPND_F64: u8 = 2;
const OPND_FALSE: u8 = 3;
const OPND_TRUE: u8 = 4;

// buffer reference tags
const REF_INPUT: u8 = 0;
const REF_OUTPUT: u8 = 1;
const REF_WORKSPACE: u8 = 2;
const REF_PARAM: u8 = 3;

fn index_of<T: PartialEq>(table: &[T], x: &T) -> u8 {
    // every table above has fewer than 256 entries and lists every variant
    table.iter().position(|t| t == x).unwrap_or(0) as u8
}

// ---------------------------------------------------------------------------------------------------------------
// Encoder

struct Enc {
    out: Vec<u8>,
}

impl Enc {
    fn u8(&mut self, b: u8) {
        self.out.push(b);
    }
    fn uleb(&mut self, v: u64) {
        crate::leb::write_uleb(&mut self.out, v);
    }
    fn sleb(&mut self, v: i64) {
        crate::leb::write_sleb(&mut self.out, v);
    }
    fn len(&mut self, n: usize) {
        self.uleb(n as u64);
    }
    fn str(&mut self, s: &str) {
        self.len(s.len());
        self.out.extend_from_slice(s.as_bytes());
    }
    fn opt_str(&mut self, s: &Option<String>) {
        match s {
            None => self.u8(0),
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
        }
    }
    fn dtype(&mut self, d: DType) {
        self.u8(index_of(DType::ALL, &d));
    }
    fn shape64(&mut self, shape: &[u64]) {
        self.len(shape.len());
        for &d in shape {
            self.uleb(d);
        }
    }
    fn shape32(&mut self, shape: &[u32]) {
        self.len(shape.len());
        for &d in shape {
            self.uleb(u64::from(d));
        }
    }
    fn buf(&mut self, b: &StageBuffer) {
        self.str(&b.name);
        self.dtype(b.dtype);
        self.shape64(&b.shape);
    }
    fn operand(&mut self, o: &KOperand) {
        match o {
            KOperand::Value(v) => {
                self.u8(OPND_VALUE);
                self.uleb(u64::from(v.0));
            }
            KOperand::Imm(KImm::I64(i), d) => {
                self.u8(OPND_I64);
                self.sleb(*i);
                self.dtype(*d);
            }
            KOperand::Imm(KImm::F64(f), d) => {
                self.u8(OPND_F64);
                self.out.extend_from_slice(&f.to_bits().to_le_bytes());
                self.dtype(*d);
            }
            KOperand::Imm(KImm::I1(b), d) => {
                self.u8(if *b { OPND_TRUE } else { OPND_FALSE });
                self.dtype(*d);
            }
        }
    }
    fn operands(&mut self, os: &[KOperand]) {
        self.len(os.len());
        for o in os {
            self.operand(o);
        }
    }
    fn values(&mut self, vs: &[KValue]) {
        self.len(vs.len());
        for v in vs {
            self.uleb(u64::from(v.0));
        }
    }
    fn region(&mut self, r: &KRegion) {
        self.len(r.ops.len());
        for op in &r.ops {
            self.op(op);
        }
    }
    fn op(&mut self, op: &KOp) {
        let tag = match &op.kind {
            KOpKind::ProgramId { .. } => OP_PROGRAM_ID,
            KOpKind::Binary { .. } => OP_BINARY,
            KOpKind::Unary { .. } => OP_UNARY,
            KOpKind::Cmp { .. } => OP_CMP,
            KOpKind::Select { .. } => OP_SELECT,
            KOpKind::Cast { .. } => OP_CAST,
            KOpKind::Range { .. } => OP_RANGE,
            KOpKind::Full { .. } => OP_FULL,
            KOpKind::Broadcast { .. } => OP_BROADCAST,
            KOpKind::ExpandDims { .. } => OP_EXPAND_DIMS,
            KOpKind::Reshape { .. } => OP_RESHAPE,
            KOpKind::Transpose { .. } => OP_TRANSPOSE,
            KOpKind::Reduce { .. } => OP_REDUCE,
            KOpKind::Dot { .. } => OP_DOT,
            KOpKind::Load { .. } => OP_LOAD,
            KOpKind::Store { .. } => OP_STORE,
            KOpKind::For { .. } => OP_FOR,
            KOpKind::If { .. } => OP_IF,
            KOpKind::Yield(_) => OP_YIELD,
        };
        self.u8(tag);
        self.values(&op.results);
        self.uleb(u64::from(op.loc.line));
        self.uleb(u64::from(op.loc.col));
        match &op.kind {
            KOpKind::ProgramId { axis } => self.u8(*axis),
            KOpKind::Binary { op, a, b } => {
                self.u8(index_of(&BINOPS, op));
                self.operand(a);
                self.operand(b);
            }
            KOpKind::Unary { op, a } => {
                self.u8(index_of(&UNOPS, op));
                self.operand(a);
            }
            KOpKind::Cmp { op, a, b } => {
                self.u8(index_of(&CMPOPS, op));
                self.operand(a);
                self.operand(b);
            }
            KOpKind::Select { cond, a, b } => {
                self.operand(cond);
                self.operand(a);
                self.operand(b);
            }
            KOpKind::Cast { a, to } => {
                self.operand(a);
                self.dtype(*to);
            }
            KOpKind::Range { start, len } => {
                self.operand(start);
                self.uleb(u64::from(*len));
            }
            KOpKind::Full {
                value,
                shape,
                dtype,
            } => {
                self.operand(value);
                self.shape32(shape);
                self.dtype(*dtype);
            }
            KOpKind::Broadcast { a, shape } | KOpKind::Reshape { a, shape } => {
                self.operand(a);
                self.shape32(shape);
            }
            KOpKind::ExpandDims { a, axis } => {
                self.operand(a);
                self.u8(*axis);
            }
            KOpKind::Transpose { a } => self.operand(a),
            KOpKind::Reduce { op, a, axis } => {
                self.u8(index_of(&REDOPS, op));
                self.operand(a);
                self.u8(*axis);
            }
            KOpKind::Dot { a, b, acc } => {
                self.operand(a);
                self.operand(b);
                self.operand(acc);
            }
            KOpKind::Load {
                param,
                indices,
                fill,
            } => {
                self.uleb(u64::from(*param));
                self.operands(indices);
                match fill {
                    None => self.u8(0),
                    Some(f) => {
                        self.u8(1);
                        self.operand(f);
                    }
                }
            }
            KOpKind::Store {
                param,
                indices,
                value,
            } => {
                self.uleb(u64::from(*param));
                self.operands(indices);
                self.operand(value);
            }
            KOpKind::For {
                lo,
                hi,
                step,
                iv,
                iters,
                inits,
                body,
            } => {
                self.operand(lo);
                self.operand(hi);
                self.operand(step);
                self.uleb(u64::from(iv.0));
                self.values(iters);
                self.operands(inits);
                self.region(body);
            }
            KOpKind::If {
                cond,
                then_region,
                else_region,
            } => {
                self.operand(cond);
                self.region(then_region);
                self.region(else_region);
            }
            KOpKind::Yield(os) => self.operands(os),
        }
    }
    fn kernel(&mut self, k: &Kernel) {
        self.str(&k.name);
        self.str(&k.file);
        self.len(k.params.len());
        for p in &k.params {
            self.str(&p.name);
            self.dtype(p.dtype);
            self.shape64(&p.shape);
            self.u8(index_of(&ACCESS, &p.access));
        }
        for g in k.grid {
            self.uleb(g);
        }
        self.len(k.values.len());
        for v in &k.values {
            self.str(&v.name);
            match &v.ty {
                KType::Scalar(d) => {
                    self.u8(0);
                    self.dtype(*d);
                }
                KType::Tile { shape, dtype } => {
                    self.u8(1);
                    self.dtype(*dtype);
                    self.shape32(shape);
                }
            }
        }
        self.region(&k.body);
    }
}

/// Encodes `stage` canonically. Any stage encodes; one that breaks the limits or has out-of-range references
/// encodes to bytes that [`decode_stage`] rejects.
pub fn encode_stage(stage: &Stage) -> Vec<u8> {
    let mut e = Enc { out: Vec::new() };
    e.out.extend_from_slice(&MAGIC);
    e.out.extend_from_slice(&VERSION_MAJOR.to_le_bytes());
    e.out.extend_from_slice(&VERSION_MINOR.to_le_bytes());
    e.str(&stage.name);
    for list in [&stage.inputs, &stage.outputs, &stage.workspace] {
        e.len(list.len());
        for b in list {
            e.buf(b);
        }
    }
    e.opt_str(&stage.param_domain);
    e.len(stage.params.len());
    for p in &stage.params {
        e.str(&p.name);
        e.dtype(p.dtype);
        e.shape64(&p.shape);
        e.uleb(u64::from(p.input));
        e.str(&p.key);
        e.opt_str(&p.layout);
    }
    e.len(stage.kernels.len());
    for k in &stage.kernels {
        e.kernel(k);
    }
    e.len(stage.dispatches.len());
    for d in &stage.dispatches {
        e.uleb(u64::from(d.kernel));
        e.len(d.args.len());
        for a in &d.args {
            let (tag, i) = match a {
                BufRef::Input(i) => (REF_INPUT, i),
                BufRef::Output(i) => (REF_OUTPUT, i),
                BufRef::Workspace(i) => (REF_WORKSPACE, i),
                BufRef::Param(i) => (REF_PARAM, i),
            };
            e.u8(tag);
            e.uleb(u64::from(*i));
        }
    }
    e.out
}

// ---------------------------------------------------------------------------------------------------------------
// Decoder

/// Why an encoded stage was rejected, and where.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("invalid encoded stage at byte {offset}: {kind}")]
pub struct DecodeError {
    /// Byte offset where the problem was found.
    pub offset: usize,
    pub kind: DecodeErrorKind,
}

#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum DecodeErrorKind {
    #[error("the encoding is {len} bytes, over the limit of {MAX_STAGE_BYTES}")]
    TooLarge { len: usize },
    #[error("bad magic: not an encoded stage")]
    BadMagic,
    #[error(
        "unsupported format version {major}.{minor} (this decoder reads {VERSION_MAJOR}.0 to {VERSION_MAJOR}.{VERSION_MINOR})"
    )]
    UnsupportedVersion { major: u16, minor: u16 },
    #[error("unexpected end of input while reading {what}")]
    Truncated { what: &'static str },
    #[error("non-minimal LEB128 encoding of {what}")]
    NonMinimalLeb { what: &'static str },
    #[error("{what} is out of range")]
    Overflow { what: &'static str },
    #[error("invalid UTF-8 in {what}")]
    InvalidUtf8 { what: &'static str },
    #[error("unknown {what} tag {tag:#04x}")]
    UnknownTag { what: &'static str, tag: u8 },
    #[error("{what} index {index} is out of range (there are {len})")]
    IndexOutOfRange {
        what: &'static str,
        index: u64,
        len: usize,
    },
    #[error("{count} {what}, over the limit of {limit}")]
    LimitExceeded {
        what: &'static str,
        count: u64,
        limit: usize,
    },
    #[error("regions nested deeper than {MAX_NESTING}")]
    TooDeep,
    #[error("{extra} unread bytes at the end")]
    TrailingBytes { extra: usize },
    #[error("not the canonical encoding of the stage it describes")]
    NonCanonical,
}

type R<T> = Result<T, DecodeError>;

struct Dec<'a> {
    buf: &'a [u8],
    pos: usize,
    ops: usize,
}

impl<'a> Dec<'a> {
    fn err_at(&self, offset: usize, kind: DecodeErrorKind) -> DecodeError {
        DecodeError { offset, kind }
    }
    fn err(&self, kind: DecodeErrorKind) -> DecodeError {
        self.err_at(self.pos, kind)
    }
    fn u8(&mut self, what: &'static str) -> R<u8> {
        let b = *self
            .buf
            .get(self.pos)
            .ok_or_else(|| self.err(DecodeErrorKind::Truncated { what }))?;
        self.pos += 1;
        Ok(b)
    }
    fn bytes(&mut self, n: usize, what: &'static str) -> R<&'a [u8]> {
        if n > self.buf.len() - self.pos {
            return Err(self.err(DecodeErrorKind::Truncated { what }));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn uleb(&mut self, what: &'static str) -> R<u64> {
        let start = self.pos;
        crate::leb::read_uleb(self.buf, &mut self.pos, self.buf.len())
            .map_err(|e| self.leb_err(start, e, what))
    }
    fn sleb(&mut self, what: &'static str) -> R<i64> {
        let start = self.pos;
        crate::leb::read_sleb(self.buf, &mut self.pos, self.buf.len())
            .map_err(|e| self.leb_err(start, e, what))
    }
    fn leb_err(&self, start: usize, e: crate::leb::LebError, what: &'static str) -> DecodeError {
        use crate::leb::LebError;
        match e {
            LebError::Truncated => self.err(DecodeErrorKind::Truncated { what }),
            LebError::Overflow => self.err_at(start, DecodeErrorKind::Overflow { what }),
            LebError::NonMinimal => self.err_at(start, DecodeErrorKind::NonMinimalLeb { what }),
        }
    }
    fn u32(&mut self, what: &'static str) -> R<u32> {
        let at = self.pos;
        let v = self.uleb(what)?;
        u32::try_from(v).map_err(|_| self.err_at(at, DecodeErrorKind::Overflow { what }))
    }
    fn index(&mut self, n: usize, what: &'static str) -> R<u32> {
        let at = self.pos;
        let v = self.uleb(what)?;
        if v >= n as u64 || v > u64::from(u32::MAX) {
            return Err(self.err_at(
                at,
                DecodeErrorKind::IndexOutOfRange {
                    what,
                    index: v,
                    len: n,
                },
            ));
        }
        Ok(v as u32)
    }
    /// A list length: within `limit` and within the bytes left (every element takes at least one byte).
    fn count(&mut self, limit: usize, what: &'static str) -> R<usize> {
        let at = self.pos;
        let n = self.uleb(what)?;
        if n > limit as u64 {
            return Err(self.err_at(
                at,
                DecodeErrorKind::LimitExceeded {
                    what,
                    count: n,
                    limit,
                },
            ));
        }
        if n > (self.buf.len() - self.pos) as u64 {
            return Err(self.err_at(at, DecodeErrorKind::Truncated { what }));
        }
        Ok(n as usize)
    }
    fn str(&mut self, what: &'static str) -> R<String> {
        let n = self.count(MAX_STRING_LEN, what)?;
        let at = self.pos;
        let b = self.bytes(n, what)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => Err(self.err_at(at, DecodeErrorKind::InvalidUtf8 { what })),
        }
    }
    fn flag(&mut self, what: &'static str) -> R<bool> {
        let at = self.pos;
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            tag => Err(self.err_at(at, DecodeErrorKind::UnknownTag { what, tag })),
        }
    }
    fn opt_str(&mut self, what: &'static str) -> R<Option<String>> {
        Ok(if self.flag(what)? {
            Some(self.str(what)?)
        } else {
            None
        })
    }
    fn table<T: Copy>(&mut self, table: &[T], what: &'static str) -> R<T> {
        let at = self.pos;
        let tag = self.u8(what)?;
        table
            .get(usize::from(tag))
            .copied()
            .ok_or_else(|| self.err_at(at, DecodeErrorKind::UnknownTag { what, tag }))
    }
    fn dtype(&mut self) -> R<DType> {
        self.table(DType::ALL, "dtype")
    }
    fn shape64(&mut self) -> R<Vec<u64>> {
        let n = self.count(MAX_LIST_LEN, "shape")?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.uleb("dimension")?);
        }
        Ok(v)
    }
    fn shape32(&mut self) -> R<Vec<u32>> {
        let n = self.count(MAX_LIST_LEN, "shape")?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.u32("dimension")?);
        }
        Ok(v)
    }
    fn buf(&mut self) -> R<StageBuffer> {
        Ok(StageBuffer {
            name: self.str("buffer name")?,
            dtype: self.dtype()?,
            shape: self.shape64()?,
        })
    }
    fn bufs(&mut self, what: &'static str) -> R<Vec<StageBuffer>> {
        let n = self.count(MAX_LIST_LEN, what)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.buf()?);
        }
        Ok(v)
    }
    fn value(&mut self, nvalues: usize) -> R<KValue> {
        Ok(KValue(self.index(nvalues, "value")?))
    }
    fn values(&mut self, nvalues: usize) -> R<Vec<KValue>> {
        let n = self.count(MAX_LIST_LEN, "value list")?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.value(nvalues)?);
        }
        Ok(v)
    }
    fn operand(&mut self, nvalues: usize) -> R<KOperand> {
        let at = self.pos;
        Ok(match self.u8("operand")? {
            OPND_VALUE => KOperand::Value(self.value(nvalues)?),
            OPND_I64 => {
                let i = self.sleb("i64 immediate")?;
                KOperand::Imm(KImm::I64(i), self.dtype()?)
            }
            OPND_F64 => {
                let b = self.bytes(8, "f64 immediate")?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                KOperand::Imm(
                    KImm::F64(f64::from_bits(u64::from_le_bytes(a))),
                    self.dtype()?,
                )
            }
            OPND_FALSE => KOperand::Imm(KImm::I1(false), self.dtype()?),
            OPND_TRUE => KOperand::Imm(KImm::I1(true), self.dtype()?),
            tag => {
                return Err(self.err_at(
                    at,
                    DecodeErrorKind::UnknownTag {
                        what: "operand",
                        tag,
                    },
                ));
            }
        })
    }
    fn operands(&mut self, nvalues: usize) -> R<Vec<KOperand>> {
        let n = self.count(MAX_LIST_LEN, "operand list")?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.operand(nvalues)?);
        }
        Ok(v)
    }
    fn region(&mut self, k: &KernelCtx, depth: usize) -> R<KRegion> {
        if depth > MAX_NESTING {
            return Err(self.err(DecodeErrorKind::TooDeep));
        }
        let n = self.count(MAX_OPS, "region")?;
        let mut ops = Vec::with_capacity(n);
        for _ in 0..n {
            ops.push(self.op(k, depth)?);
        }
        Ok(KRegion { ops })
    }
    fn op(&mut self, k: &KernelCtx, depth: usize) -> R<KOp> {
        self.ops += 1;
        if self.ops > MAX_OPS {
            return Err(self.err(DecodeErrorKind::LimitExceeded {
                what: "ops",
                count: self.ops as u64,
                limit: MAX_OPS,
            }));
        }
        let nv = k.nvalues;
        let at = self.pos;
        let tag = self.u8("op")?;
        let results = self.values(nv)?;
        let loc = Loc {
            line: self.u32("line")?,
            col: self.u32("column")?,
        };
        let kind = match tag {
            OP_PROGRAM_ID => KOpKind::ProgramId {
                axis: self.u8("axis")?,
            },
            OP_BINARY => KOpKind::Binary {
                op: self.table(&BINOPS, "binary op")?,
                a: self.operand(nv)?,
                b: self.operand(nv)?,
            },
            OP_UNARY => KOpKind::Unary {
                op: self.table(&UNOPS, "unary op")?,
                a: self.operand(nv)?,
            },
            OP_CMP => KOpKind::Cmp {
                op: self.table(&CMPOPS, "comparison")?,
                a: self.operand(nv)?,
                b: self.operand(nv)?,
            },
            OP_SELECT => KOpKind::Select {
                cond: self.operand(nv)?,
                a: self.operand(nv)?,
                b: self.operand(nv)?,
            },
            OP_CAST => KOpKind::Cast {
                a: self.operand(nv)?,
                to: self.dtype()?,
            },
            OP_RANGE => KOpKind::Range {
                start: self.operand(nv)?,
                len: self.u32("range length")?,
            },
            OP_FULL => KOpKind::Full {
                value: self.operand(nv)?,
                shape: self.shape32()?,
                dtype: self.dtype()?,
            },
            OP_BROADCAST => KOpKind::Broadcast {
                a: self.operand(nv)?,
                shape: self.shape32()?,
            },
            OP_EXPAND_DIMS => KOpKind::ExpandDims {
                a: self.operand(nv)?,
                axis: self.u8("axis")?,
            },
            OP_RESHAPE => KOpKind::Reshape {
                a: self.operand(nv)?,
                shape: self.shape32()?,
            },
            OP_TRANSPOSE => KOpKind::Transpose {
                a: self.operand(nv)?,
            },
            OP_REDUCE => KOpKind::Reduce {
                op: self.table(&REDOPS, "reduction")?,
                a: self.operand(nv)?,
                axis: self.u8("axis")?,
            },
            OP_DOT => KOpKind::Dot {
                a: self.operand(nv)?,
                b: self.operand(nv)?,
                acc: self.operand(nv)?,
            },
            OP_LOAD => KOpKind::Load {
                param: self.index(k.nparams, "kernel parameter")?,
                indices: self.operands(nv)?,
                fill: if self.flag("load fill")? {
                    Some(self.operand(nv)?)
                } else {
                    None
                },
            },
            OP_STORE => KOpKind::Store {
                param: self.index(k.nparams, "kernel parameter")?,
                indices: self.operands(nv)?,
                value: self.operand(nv)?,
            },
            OP_FOR => KOpKind::For {
                lo: self.operand(nv)?,
                hi: self.operand(nv)?,
                step: self.operand(nv)?,
                iv: self.value(nv)?,
                iters: self.values(nv)?,
                inits: self.operands(nv)?,
                body: self.region(k, depth + 1)?,
            },
            OP_IF => KOpKind::If {
                cond: self.operand(nv)?,
                then_region: self.region(k, depth + 1)?,
                else_region: self.region(k, depth + 1)?,
            },
            OP_YIELD => KOpKind::Yield(self.operands(nv)?),
            tag => return Err(self.err_at(at, DecodeErrorKind::UnknownTag { what: "op", tag })),
        };
        Ok(KOp { kind, results, loc })
    }
    fn kernel(&mut self) -> R<Kernel> {
        let name = self.str("kernel name")?;
        let file = self.str("file name")?;
        let np = self.count(MAX_LIST_LEN, "kernel parameters")?;
        let mut params = Vec::with_capacity(np);
        for _ in 0..np {
            params.push(KParam {
                name: self.str("parameter name")?,
                dtype: self.dtype()?,
                shape: self.shape64()?,
                access: self.table(&ACCESS, "access")?,
            });
        }
        let grid = [self.uleb("grid")?, self.uleb("grid")?, self.uleb("grid")?];
        let nv = self.count(MAX_VALUES, "values")?;
        let mut values = Vec::with_capacity(nv);
        for _ in 0..nv {
            let name = self.str("value name")?;
            let at = self.pos;
            let ty = match self.u8("value type")? {
                0 => KType::Scalar(self.dtype()?),
                1 => {
                    let dtype = self.dtype()?;
                    KType::Tile {
                        shape: self.shape32()?,
                        dtype,
                    }
                }
                tag => {
                    return Err(self.err_at(
                        at,
                        DecodeErrorKind::UnknownTag {
                            what: "value type",
                            tag,
                        },
                    ));
                }
            };
            values.push(KValueDef { name, ty });
        }
        let ctx = KernelCtx {
            nvalues: values.len(),
            nparams: params.len(),
        };
        let body = self.region(&ctx, 0)?;
        Ok(Kernel {
            name,
            params,
            grid,
            values,
            body,
            file,
        })
    }
}

struct KernelCtx {
    nvalues: usize,
    nparams: usize,
}

/// Decodes an encoded stage, checking limits, references and canonical form. Never panics.
pub fn decode_stage(bytes: &[u8]) -> Result<Stage, DecodeError> {
    let mut d = Dec {
        buf: bytes,
        pos: 0,
        ops: 0,
    };
    if bytes.len() > MAX_STAGE_BYTES {
        return Err(d.err(DecodeErrorKind::TooLarge { len: bytes.len() }));
    }
    if bytes.len() < HEADER_LEN || bytes[..MAGIC.len()] != MAGIC {
        return Err(d.err(DecodeErrorKind::BadMagic));
    }
    let major = u16::from_le_bytes([bytes[8], bytes[9]]);
    let minor = u16::from_le_bytes([bytes[10], bytes[11]]);
    if major != VERSION_MAJOR || minor > VERSION_MINOR {
        return Err(d.err_at(8, DecodeErrorKind::UnsupportedVersion { major, minor }));
    }
    d.pos = HEADER_LEN;
    let name = d.str("stage name")?;
    let inputs = d.bufs("inputs")?;
    let outputs = d.bufs("outputs")?;
    let workspace = d.bufs("workspace")?;
    let param_domain = d.opt_str("parameter domain")?;
    let n = d.count(MAX_LIST_LEN, "parameter bindings")?;
    let mut params = Vec::with_capacity(n);
    for _ in 0..n {
        params.push(ParamBinding {
            name: d.str("binding name")?,
            dtype: d.dtype()?,
            shape: d.shape64()?,
            input: d.u32("binding input")?,
            key: d.str("binding key")?,
            layout: d.opt_str("binding layout")?,
        });
    }
    let n = d.count(MAX_KERNELS, "kernels")?;
    let mut kernels = Vec::with_capacity(n);
    for _ in 0..n {
        kernels.push(d.kernel()?);
    }
    let n = d.count(MAX_LIST_LEN, "dispatches")?;
    let mut dispatches = Vec::with_capacity(n);
    for _ in 0..n {
        let kernel = d.index(kernels.len(), "kernel")?;
        let na = d.count(MAX_LIST_LEN, "dispatch arguments")?;
        let mut args = Vec::with_capacity(na);
        for _ in 0..na {
            let at = d.pos;
            let arg = match d.u8("buffer reference")? {
                REF_INPUT => BufRef::Input(d.index(inputs.len(), "input")?),
                REF_OUTPUT => BufRef::Output(d.index(outputs.len(), "output")?),
                REF_WORKSPACE => BufRef::Workspace(d.index(workspace.len(), "workspace")?),
                REF_PARAM => BufRef::Param(d.index(params.len(), "parameter")?),
                tag => {
                    return Err(d.err_at(
                        at,
                        DecodeErrorKind::UnknownTag {
                            what: "buffer reference",
                            tag,
                        },
                    ));
                }
            };
            args.push(arg);
        }
        dispatches.push(Dispatch { kernel, args });
    }
    if d.pos != bytes.len() {
        return Err(d.err(DecodeErrorKind::TrailingBytes {
            extra: bytes.len() - d.pos,
        }));
    }
    let stage = Stage {
        name,
        inputs,
        outputs,
        workspace,
        param_domain,
        params,
        kernels,
        dispatches,
    };
    if encode_stage(&stage) != bytes {
        return Err(d.err_at(0, DecodeErrorKind::NonCanonical));
    }
    Ok(stage)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(kind: KOpKind, results: &[u32]) -> KOp {
        KOp {
            kind,
            results: results.iter().map(|&r| KValue(r)).collect(),
            loc: Loc { line: 3, col: 200 },
        }
    }
    fn v(i: u32) -> KOperand {
        KOperand::Value(KValue(i))
    }

    /// A stage that uses every op, operand, buffer reference and option.
    fn sample() -> Stage {
        let values: Vec<KValueDef> = (0..8)
            .map(|i| KValueDef {
                name: format!("v{i}"),
                ty: if i % 2 == 0 {
                    KType::Scalar(DType::I64)
                } else {
                    KType::Tile {
                        shape: vec![4, 300],
                        dtype: DType::F32,
                    }
                },
            })
            .collect();
        let body = KRegion {
            ops: vec![
                op(KOpKind::ProgramId { axis: 2 }, &[0]),
                op(
                    KOpKind::Binary {
                        op: BinOp::Shr,
                        a: v(0),
                        b: KOperand::Imm(KImm::I64(-70), DType::I64),
                    },
                    &[2],
                ),
                op(
                    KOpKind::Unary {
                        op: UnOp::Sigmoid,
                        a: v(1),
                    },
                    &[3],
                ),
                op(
                    KOpKind::Cmp {
                        op: CmpOp::Ge,
                        a: v(1),
                        b: KOperand::Imm(KImm::F64(f64::NEG_INFINITY), DType::F32),
                    },
                    &[5],
                ),
                op(
                    KOpKind::Select {
                        cond: v(5),
                        a: v(1),
                        b: KOperand::Imm(KImm::F64(-0.5), DType::F32),
                    },
                    &[7],
                ),
                op(
                    KOpKind::Cast {
                        a: v(0),
                        to: DType::Q6K,
                    },
                    &[4],
                ),
                op(
                    KOpKind::Range {
                        start: KOperand::Imm(KImm::I64(i64::MIN), DType::I64),
                        len: u32::MAX,
                    },
                    &[1],
                ),
                op(
                    KOpKind::Full {
                        value: KOperand::Imm(KImm::I1(true), DType::I1),
                        shape: vec![2, 3],
                        dtype: DType::I1,
                    },
                    &[1],
                ),
                op(
                    KOpKind::Broadcast {
                        a: v(0),
                        shape: vec![128],
                    },
                    &[1],
                ),
                op(KOpKind::ExpandDims { a: v(1), axis: 1 }, &[3]),
                op(
                    KOpKind::Reshape {
                        a: v(1),
                        shape: vec![],
                    },
                    &[3],
                ),
                op(KOpKind::Transpose { a: v(1) }, &[3]),
                op(
                    KOpKind::Reduce {
                        op: ReduceOp::Min,
                        a: v(1),
                        axis: 0,
                    },
                    &[3],
                ),
                op(
                    KOpKind::Dot {
                        a: v(1),
                        b: v(3),
                        acc: v(5),
                    },
                    &[7],
                ),
                op(
                    KOpKind::Load {
                        param: 1,
                        indices: vec![v(0), KOperand::Imm(KImm::I64(i64::MAX), DType::I64)],
                        fill: Some(KOperand::Imm(KImm::I1(false), DType::I1)),
                    },
                    &[1],
                ),
                op(
                    KOpKind::Load {
                        param: 0,
                        indices: vec![v(0)],
                        fill: None,
                    },
                    &[1],
                ),
                op(
                    KOpKind::For {
                        lo: KOperand::Imm(KImm::I64(0), DType::I64),
                        hi: v(2),
                        step: KOperand::Imm(KImm::I64(1), DType::I64),
                        iv: KValue(6),
                        iters: vec![KValue(7)],
                        inits: vec![v(1)],
                        body: KRegion {
                            ops: vec![op(
                                KOpKind::If {
                                    cond: v(5),
                                    then_region: KRegion {
                                        ops: vec![op(KOpKind::Yield(vec![v(7)]), &[])],
                                    },
                                    else_region: KRegion::default(),
                                },
                                &[3],
                            )],
                        },
                    },
                    &[7],
                ),
                op(
                    KOpKind::Store {
                        param: 1,
                        indices: vec![v(0), v(2)],
                        value: v(7),
                    },
                    &[],
                ),
                op(KOpKind::Yield(vec![]), &[]),
            ],
        };
        let kernel = Kernel {
            name: "motifs.k<N=4>".into(),
            params: vec![
                KParam {
                    name: "x".into(),
                    dtype: DType::BF16,
                    shape: vec![u64::MAX, 1],
                    access: Access::Read,
                },
                KParam {
                    name: "y".into(),
                    dtype: DType::F32,
                    shape: vec![7],
                    access: Access::ReadWrite,
                },
            ],
            grid: [3, 1, 1 << 40],
            values,
            body,
            file: "motifs/k.loom".into(),
        };
        let buf = |n: &str, d: DType| StageBuffer {
            name: n.into(),
            dtype: d,
            shape: vec![16, 64],
        };
        Stage {
            name: "stage ü".into(),
            inputs: vec![buf("x", DType::F32), buf("ids", DType::I32)],
            outputs: vec![buf("y", DType::F32)],
            workspace: vec![buf("w", DType::F16)],
            param_domain: Some("@dense".into()),
            params: vec![ParamBinding {
                name: "t".into(),
                dtype: DType::Q4K,
                shape: vec![1, 256],
                input: 0,
                key: "tok.weight".into(),
                layout: Some("packed_b".into()),
            }],
            kernels: vec![kernel.clone(), kernel],
            dispatches: vec![
                Dispatch {
                    kernel: 1,
                    args: vec![BufRef::Input(1), BufRef::Output(0)],
                },
                Dispatch {
                    kernel: 0,
                    args: vec![BufRef::Workspace(0), BufRef::Param(0)],
                },
            ],
        }
    }

    #[test]
    fn round_trip() {
        let s = sample();
        let b = encode_stage(&s);
        assert_eq!(decode_stage(&b), Ok(s.clone()));
        // Canonical: encoding the decoded stage gives the same bytes.
        assert_eq!(encode_stage(&decode_stage(&b).unwrap()), b);
        let empty = Stage {
            name: String::new(),
            inputs: vec![],
            outputs: vec![],
            workspace: vec![],
            param_domain: None,
            params: vec![],
            kernels: vec![],
            dispatches: vec![],
        };
        let eb = encode_stage(&empty);
        assert_eq!(eb.len(), HEADER_LEN + 8);
        assert_eq!(decode_stage(&eb), Ok(empty));
    }

    #[test]
    fn header_errors() {
        let b = encode_stage(&sample());
        assert_eq!(
            decode_stage(&[]).unwrap_err().kind,
            DecodeErrorKind::BadMagic
        );
        let mut m = b.clone();
        m[1] = b'L';
        assert_eq!(
            decode_stage(&m).unwrap_err().kind,
            DecodeErrorKind::BadMagic
        );
        let mut m = b.clone();
        m[10] = 1;
        assert_eq!(
            decode_stage(&m).unwrap_err().kind,
            DecodeErrorKind::UnsupportedVersion { major: 1, minor: 1 }
        );
        let mut m = b.clone();
        m.push(0);
        assert_eq!(
            decode_stage(&m).unwrap_err().kind,
            DecodeErrorKind::TrailingBytes { extra: 1 }
        );
        let big = vec![0u8; MAX_STAGE_BYTES + 1];
        assert!(matches!(
            decode_stage(&big).unwrap_err().kind,
            DecodeErrorKind::TooLarge { .. }
        ));
    }

    #[test]
    fn non_minimal_leb_and_references() {
        // The stage name's length 0 written as 80 00.
        let mut b = encode_stage(&Stage {
            name: String::new(),
            inputs: vec![],
            outputs: vec![],
            workspace: vec![],
            param_domain: None,
            params: vec![],
            kernels: vec![],
            dispatches: vec![],
        });
        b[HEADER_LEN] = 0x80;
        b.insert(HEADER_LEN + 1, 0);
        assert!(matches!(
            decode_stage(&b).unwrap_err().kind,
            DecodeErrorKind::NonMinimalLeb { .. }
        ));
        // A dispatch of a kernel that does not exist.
        let mut s = sample();
        s.dispatches[0].kernel = 2;
        assert!(matches!(
            decode_stage(&encode_stage(&s)).unwrap_err().kind,
            DecodeErrorKind::IndexOutOfRange { what: "kernel", .. }
        ));
        // A value outside the value table.
        let mut s = sample();
        s.kernels[0].body.ops[0].results[0] = KValue(8);
        assert!(matches!(
            decode_stage(&encode_stage(&s)).unwrap_err().kind,
            DecodeErrorKind::IndexOutOfRange { what: "value", .. }
        ));
    }

    #[test]
    fn nesting_limit() {
        let mut region = KRegion {
            ops: vec![op(KOpKind::Yield(vec![]), &[])],
        };
        let wrap = |region: KRegion| KRegion {
            ops: vec![op(
                KOpKind::If {
                    cond: KOperand::Imm(KImm::I1(true), DType::I1),
                    then_region: region,
                    else_region: KRegion::default(),
                },
                &[],
            )],
        };
        for _ in 0..MAX_NESTING {
            region = wrap(region);
        }
        let mut s = sample();
        s.kernels[0].body = region.clone();
        assert_eq!(decode_stage(&encode_stage(&s)), Ok(s));
        region = wrap(region);
        let mut s = sample();
        s.kernels[0].body = region;
        assert_eq!(
            decode_stage(&encode_stage(&s)).unwrap_err().kind,
            DecodeErrorKind::TooDeep
        );
    }

    #[test]
    fn huge_counts_are_rejected_before_allocating() {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&[1, 0, 0, 0]);
        // stage name of length 2^60
        b.extend_from_slice(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x10]);
        assert!(matches!(
            decode_stage(&b).unwrap_err().kind,
            DecodeErrorKind::LimitExceeded { .. }
        ));
    }

    /// Every truncation and every single-bit flip of a valid encoding gives an error or a stage that re-encodes
    /// to exactly the mutated bytes; never a panic.
    #[test]
    fn mutations_never_panic() {
        let b = encode_stage(&sample());
        for n in 0..b.len() {
            assert!(decode_stage(&b[..n]).is_err(), "truncation to {n} accepted");
        }
        let mut accepted = 0;
        for i in 0..b.len() {
            for bit in 0..8 {
                let mut m = b.clone();
                m[i] ^= 1 << bit;
                if let Ok(s) = decode_stage(&m) {
                    assert_eq!(encode_stage(&s), m, "byte {i} bit {bit}");
                    accepted += 1;
                }
            }
        }
        // Flips inside names and immediates are valid stages: the check above did run.
        assert!(accepted > 0);
    }
}
