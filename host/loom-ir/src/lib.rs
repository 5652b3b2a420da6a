//! `loom-ir`: the typed intermediate representation of Loom host programs and its `.loombc` container.
//!
//! The IR is SSA with structured control flow (`if`, `for`, `while` regions), the same shape as the canonical
//! text form. One [`Module`] is one compiled `.loom` file: it may still contain templates and references to
//! other modules' exports. The linker (in `loom-compiler`) turns a catalog of modules into a [`Program`]: a flat,
//! monomorphic set of functions whose only external references are capability imports. The VM loads programs.
//!
//! Modules:
//! - [`opcode`]: every simple operation, its text name and its typing rule;
//! - [`verify`]: the verifier (types, SSA scoping, region terminators, call signatures); runs before anything
//!   executes, on decoded bytecode as on freshly compiled code;
//! - [`bytecode`]: the `.loombc` encoder/decoder (canonical, size-limited, digest-checked);
//! - [`print`]: the canonical text printer (`loomc dis`).
//!
//! **Invariant:** this crate performs no IO and never panics on untrusted input.

pub mod bytecode;
pub mod kernel;
pub mod kernel_codec;
mod leb;
pub mod opcode;
pub mod print;
pub mod verify;

pub use bytecode::{DecodeError, DecodeErrorKind, decode, encode};
pub use opcode::Opcode;
pub use print::{print_module, print_program};
pub use verify::{VerifyError, verify_module, verify_program};

use std::fmt;

/// A value type of the host language.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Type {
    I1,
    I32,
    I64,
    F32,
    F64,
    Str,
    Buffer,
    List(Box<Type>),
    /// A nominal reference type such as `!hal.buffer` (`name` is `hal.buffer`); `nullable` when written `?`.
    Ref {
        name: String,
        nullable: bool,
    },
}

impl Type {
    pub fn is_int(&self) -> bool {
        matches!(self, Type::I32 | Type::I64)
    }
    pub fn is_float(&self) -> bool {
        matches!(self, Type::F32 | Type::F64)
    }
    /// Scalars live in the VM's scalar register bank; everything else in the reference bank.
    pub fn is_scalar(&self) -> bool {
        matches!(
            self,
            Type::I1 | Type::I32 | Type::I64 | Type::F32 | Type::F64
        )
    }
    pub fn is_nullable(&self) -> bool {
        matches!(self, Type::Ref { nullable: true, .. })
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::I1 => f.write_str("i1"),
            Type::I32 => f.write_str("i32"),
            Type::I64 => f.write_str("i64"),
            Type::F32 => f.write_str("f32"),
            Type::F64 => f.write_str("f64"),
            Type::Str => f.write_str("str"),
            Type::Buffer => f.write_str("buffer"),
            Type::List(t) => write!(f, "list<{t}>"),
            Type::Ref { name, nullable } => {
                write!(f, "{}!{}", if *nullable { "?" } else { "" }, name)
            }
        }
    }
}

/// A function signature: parameter and result types.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Signature {
    pub params: Vec<Type>,
    pub results: Vec<Type>,
}

/// Where an op came from: 1-based line and column in the module's source file (0:0 when unknown).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Loc {
    pub line: u32,
    pub col: u32,
}

/// An SSA value of one function: an index into [`Function::values`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

/// A value's name (without `%`, used by the printer) and type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ValueDef {
    pub name: String,
    pub ty: Type,
}

/// An immediate operand. Its type is decided by context when compiled from text; the verifier checks it.
#[derive(Clone, Debug, PartialEq)]
pub enum Imm {
    I1(bool),
    I32(i32),
    I64(i64),
    F32(f32),
    F64(f64),
    Str(String),
    /// `null` of a nullable reference type.
    Null(Type),
}

impl Imm {
    pub fn ty(&self) -> Type {
        match self {
            Imm::I1(_) => Type::I1,
            Imm::I32(_) => Type::I32,
            Imm::I64(_) => Type::I64,
            Imm::F32(_) => Type::F32,
            Imm::F64(_) => Type::F64,
            Imm::Str(_) => Type::Str,
            Imm::Null(t) => t.clone(),
        }
    }
}

/// An operand of an operation.
#[derive(Clone, Debug, PartialEq)]
pub enum Operand {
    Value(ValueId),
    Imm(Imm),
    /// The value of template parameter `n` of the enclosing function (kinds `i64`, `bool`, `str`). Only in
    /// [`Module`]s; instantiation replaces it by an immediate.
    TParam(u32),
    /// A record type (`@Range`): index into [`Module::records`] / [`Program::records`].
    Record(u32),
    /// A record field (`@Range.length`): record index, field index.
    Field(u32, u32),
}

/// The target of a call.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Callee {
    /// A function of this module (or, in a [`Program`], of the program).
    Func(u32),
    /// A `func.decl` of this module (or, in a [`Program`], a capability import).
    Decl(u32),
    /// A function-typed template parameter of the enclosing function. Only in [`Module`]s.
    TParam(u32),
}

/// A template argument: a compile-time value, or a forwarded template parameter of the caller.
#[derive(Clone, Debug, PartialEq)]
pub enum TArg {
    Value(TValue),
    Forward(u32),
}

/// A compile-time value bound to a template parameter.
#[derive(Clone, Debug, PartialEq)]
pub enum TValue {
    I64(i64),
    Bool(bool),
    Str(String),
    DType(String),
    Shape(Vec<i64>),
    /// A function of this module, or a `func.decl` (definition reference) of this module.
    Func(Callee),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TParamKind {
    I64,
    Bool,
    Str,
    DType,
    Shape,
    Func(Signature),
}

#[derive(Clone, Debug, PartialEq)]
pub struct TParam {
    pub name: String,
    pub kind: TParamKind,
    pub default: Option<TValue>,
}

/// A sequence of operations. The last op of a region is its terminator (`yield`, `condition` or `return`).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Region {
    pub ops: Vec<Op>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Op {
    pub kind: OpKind,
    /// Values defined by this op (its results), in order.
    pub results: Vec<ValueId>,
    pub loc: Loc,
}

#[derive(Clone, Debug, PartialEq)]
pub enum OpKind {
    /// A simple operation; `annotation` is the written `: T` for ops that need one (see [`Opcode`]).
    Simple {
        opcode: Opcode,
        operands: Vec<Operand>,
        annotation: Option<Type>,
    },
    Call {
        callee: Callee,
        targs: Vec<(String, TArg)>,
        args: Vec<Operand>,
    },
    /// Both regions end in `yield` with the results; a result-less `if` may have an empty else region,
    /// which then holds just `yield`.
    If {
        cond: Operand,
        then_region: Region,
        else_region: Region,
    },
    /// `for %iv = lo to hi step s iter(%a = init, ...)`: `iv` and `iters` are defined for the body, which ends in
    /// `yield` of the next iter values. The op's results are the final iter values.
    For {
        lo: Operand,
        hi: Operand,
        step: Operand,
        iv: ValueId,
        iters: Vec<ValueId>,
        inits: Vec<Operand>,
        body: Region,
    },
    /// `while iter(%a = init, ...) { ... condition %c } do { ... yield next }`: `iters` are defined for both regions.
    While {
        iters: Vec<ValueId>,
        inits: Vec<Operand>,
        cond_region: Region,
        body: Region,
    },
    Yield(Vec<Operand>),
    Condition(Operand),
    Return(Vec<Operand>),
}

/// A host function.
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    pub name: String,
    pub exported: bool,
    pub tparams: Vec<TParam>,
    /// The first `params.len()` entries of `values` are the parameters.
    pub params: Vec<ValueId>,
    pub results: Vec<Type>,
    pub values: Vec<ValueDef>,
    pub body: Region,
    pub loc: Loc,
}

impl Function {
    pub fn signature(&self) -> Signature {
        Signature {
            params: self
                .params
                .iter()
                .map(|v| self.values[v.0 as usize].ty.clone())
                .collect(),
            results: self.results.clone(),
        }
    }
}

/// `func.decl`: a definition reference (`import == None`) or a capability import.
#[derive(Clone, Debug, PartialEq)]
pub struct Decl {
    /// The written symbol without `@`: `input.encode`, `motifs.row_bytes`, `row_bytes`.
    pub symbol: String,
    pub tparams: Vec<TParam>,
    pub sig: Signature,
    pub import: Option<String>,
    pub loc: Loc,
}

impl Decl {
    /// For `m.a.f`, (`m.a`, `f`); for `f`, (``, `f`).
    pub fn split_symbol(&self) -> (&str, &str) {
        match self.symbol.rfind('.') {
            Some(i) => (&self.symbol[..i], &self.symbol[i + 1..]),
            None => ("", &self.symbol),
        }
    }
}

/// A record layout: fields at natural alignment, little-endian.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub name: String,
    pub exported: bool,
    pub fields: Vec<(String, Type)>,
    pub loc: Loc,
}

impl Record {
    /// Byte offset of each field, and the total size (rounded up to the largest alignment).
    pub fn layout(&self) -> (Vec<u64>, u64) {
        let mut offsets = Vec::with_capacity(self.fields.len());
        let mut at = 0u64;
        let mut max_align = 1u64;
        for (_, t) in &self.fields {
            let size = scalar_size(t).unwrap_or(8);
            at = at.div_ceil(size) * size;
            offsets.push(at);
            at += size;
            max_align = max_align.max(size);
        }
        (offsets, at.div_ceil(max_align) * max_align)
    }
}

/// Byte size of a scalar type in buffers and records (`i1` is one byte).
pub fn scalar_size(t: &Type) -> Option<u64> {
    match t {
        Type::I1 => Some(1),
        Type::I32 | Type::F32 => Some(4),
        Type::I64 | Type::F64 => Some(8),
        _ => None,
    }
}

/// A named module constant (`const @MAX: i64 = 4096`). Uses are folded into immediates by the compiler; the
/// table stays for reflection.
#[derive(Clone, Debug, PartialEq)]
pub struct Const {
    pub name: String,
    pub exported: bool,
    pub value: Imm,
    pub loc: Loc,
}

/// The kind of a device item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    Kernel,
    Kfunc,
    Stage,
}

impl DeviceKind {
    pub fn keyword(self) -> &'static str {
        match self {
            DeviceKind::Kernel => "kernel",
            DeviceKind::Kfunc => "kfunc",
            DeviceKind::Stage => "stage",
        }
    }
}

/// A device item (kernel, kfunc, stage) carried as its canonical source text: the host compiler does not
/// compile device code; the kernel front end (`loom-kernel`) parses `text` and specializes it on demand.
///
/// `text` is the whole item (`export kernel @name<...> ... { ... }`) in the normalized rendering the host
/// compiler produces (see `loom-compiler`'s `device` module): compiling the printed module again stores the
/// same text. `tparams` repeats the template parameters for reflection; a default that is not a plain value
/// (an expression over other parameters, or a `func` default naming a kfunc) is `None` here and lives in
/// `text` only.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceItem {
    pub kind: DeviceKind,
    pub name: String,
    pub exported: bool,
    pub tparams: Vec<TParam>,
    pub text: String,
    /// Where the item (its first token) starts in the source file.
    pub loc: Loc,
}

/// One compiled `.loom` file.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Module {
    /// Without `@`: `embed.control`.
    pub name: String,
    /// The source file name, for diagnostics and trap locations.
    pub file: String,
    pub decls: Vec<Decl>,
    pub records: Vec<Record>,
    pub consts: Vec<Const>,
    pub funcs: Vec<Function>,
    /// Kernels, kfuncs and stages, in source order.
    pub device: Vec<DeviceItem>,
}

/// A linked, monomorphic program: what the VM loads.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Program {
    /// Source file names; `func_files[i]` indexes here.
    pub files: Vec<String>,
    /// Every function reachable from the roots, templates instantiated (no `tparams`, no `Callee::TParam`,
    /// no `Operand::TParam`). Names are qualified: `module.func` or `module.func<N=4>`.
    pub funcs: Vec<Function>,
    pub func_files: Vec<u32>,
    /// Capability imports only (every `Decl` has `import: Some`).
    pub imports: Vec<Decl>,
    pub records: Vec<Record>,
    /// The roots by their unqualified exported name, with their function index.
    pub exports: Vec<(String, u32)>,
}

impl Program {
    pub fn export(&self, name: &str) -> Option<u32> {
        self.exports
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, i)| *i)
    }
}
