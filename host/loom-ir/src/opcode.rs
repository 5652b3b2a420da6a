//! Simple operations: names, semantics and typing rules.
//!
//! Semantics, shared by the VM and every other consumer:
//! - Integer `add sub mul neg abs` are **checked**: signed overflow traps. `add.wrap sub.wrap mul.wrap` wrap.
//!   `div rem` on integers are signed and trap on a zero divisor and on `MIN / -1`; `div.u rem.u` are unsigned and
//!   trap on zero. On floats `add sub mul div rem min max neg abs` follow IEEE 754 (`rem` is `fmod`, `min`/`max`
//!   propagate NaN).
//! - `shl shr shr.u` take the shift amount modulo the bit width. `and or xor not` are bitwise (logical on `i1`).
//! - `cmp.*` yield `i1`; `lt le gt ge` are signed on integers and ordered on floats (false if NaN); `ult ...`
//!   are unsigned.
//! - `conv.T` converts to `T` and traps when the value does not fit (float to int: NaN, infinities and out-of-range
//!   values trap; fractional parts truncate toward zero); int to float rounds to nearest; `i1` converts as 0/1.
//!   `conv.u.i64` zero-extends an `i32`. `trunc.i32` keeps the low 32 bits. `bitcast.*` reinterprets bits.
//! - `buffer.*` loads and stores are little-endian and bounds-checked (a trap names the offset and length);
//!   `load.i8/u8/i16/u16` sign/zero-extend to `i32`, `load.u32` zero-extends to `i64`; narrow stores keep the low
//!   bits. `buffer.new` gives zeroed bytes and counts against the invocation's memory cap. `buffer.slice` copies.
//!   `buffer.fill %b, %off, %len, %byte` stores the low 8 bits of `%byte`.
//! - `buffer.load.field %b, %index, @R.f` reads field `f` of record element `%index` (byte offset
//!   `index * size(R) + offset(f)`); `i1` fields are one byte (nonzero is true).
//! - `str` values are immutable UTF-8; `str.from_buffer` traps on invalid UTF-8; `str.parse_i64` traps on bad text.
//! - `list<T>` is a growable reference (`list.new %capacity : list<T>`; capacity is a hint bounded by the cap).
//! - `opaque.new a, b, ...` makes an immutable tuple (source-owned state); `opaque.get %s, %i : T` traps when
//!   the index is out of range or the element is not a `T`.
//! - `ref.unwrap` traps on null; `assert %c, "msg"` traps with `msg` when `%c` is false; `trap "msg"` always traps.
//!   These traps are *source errors*: they fail the request that ran them, with the message.

use crate::Type;
use std::fmt;

macro_rules! opcodes {
    ($($variant:ident = $name:literal,)*) => {
        /// A simple (non-structured) operation.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u16)]
        pub enum Opcode { $($variant,)* }

        impl Opcode {
            /// Every opcode, in encoding order (the index is the bytecode number).
            pub const ALL: &'static [Opcode] = &[$(Opcode::$variant,)*];

            /// The text name (`buffer.load.i64`).
            pub fn name(self) -> &'static str {
                match self { $(Opcode::$variant => $name,)* }
            }

            pub fn from_name(name: &str) -> Option<Opcode> {
                match name { $($name => Some(Opcode::$variant),)* _ => None }
            }
        }
    };
}

opcodes! {
    Add = "add", Sub = "sub", Mul = "mul", Div = "div", Rem = "rem", Min = "min", Max = "max",
    AddWrap = "add.wrap", SubWrap = "sub.wrap", MulWrap = "mul.wrap", DivU = "div.u", RemU = "rem.u",
    And = "and", Or = "or", Xor = "xor", Shl = "shl", Shr = "shr", ShrU = "shr.u",
    Neg = "neg", Abs = "abs", Not = "not", Sqrt = "sqrt", Floor = "floor", Ceil = "ceil", Exp = "exp", Log = "log",
    CmpEq = "cmp.eq", CmpNe = "cmp.ne", CmpLt = "cmp.lt", CmpLe = "cmp.le", CmpGt = "cmp.gt", CmpGe = "cmp.ge",
    CmpUlt = "cmp.ult", CmpUle = "cmp.ule", CmpUgt = "cmp.ugt", CmpUge = "cmp.uge",
    Select = "select", Copy = "copy",
    ConstI1 = "const.i1", ConstI32 = "const.i32", ConstI64 = "const.i64", ConstF32 = "const.f32",
    ConstF64 = "const.f64", ConstStr = "const.str",
    ConvI32 = "conv.i32", ConvI64 = "conv.i64", ConvUI64 = "conv.u.i64", ConvF32 = "conv.f32", ConvF64 = "conv.f64",
    TruncI32 = "trunc.i32", BitcastI32 = "bitcast.i32", BitcastI64 = "bitcast.i64", BitcastF32 = "bitcast.f32",
    BitcastF64 = "bitcast.f64",
    BufferNew = "buffer.new", BufferLen = "buffer.len",
    LoadI8 = "buffer.load.i8", LoadU8 = "buffer.load.u8", LoadI16 = "buffer.load.i16", LoadU16 = "buffer.load.u16",
    LoadI32 = "buffer.load.i32", LoadU32 = "buffer.load.u32", LoadI64 = "buffer.load.i64",
    LoadF32 = "buffer.load.f32", LoadF64 = "buffer.load.f64",
    StoreI8 = "buffer.store.i8", StoreI16 = "buffer.store.i16", StoreI32 = "buffer.store.i32",
    StoreI64 = "buffer.store.i64", StoreF32 = "buffer.store.f32", StoreF64 = "buffer.store.f64",
    BufferSlice = "buffer.slice", BufferCopy = "buffer.copy", BufferFill = "buffer.fill",
    BufferConcat = "buffer.concat", LoadField = "buffer.load.field", StoreField = "buffer.store.field",
    RecordSize = "record.size", RecordOffset = "record.offset",
    StrLen = "str.len", StrConcat = "str.concat", StrEq = "str.eq", StrFromI64 = "str.from_i64",
    StrFromF64 = "str.from_f64", StrToBuffer = "str.to_buffer", StrFromBuffer = "str.from_buffer",
    StrParseI64 = "str.parse_i64",
    ListNew = "list.new", ListLen = "list.len", ListGet = "list.get", ListSet = "list.set", ListPush = "list.push",
    OpaqueNew = "opaque.new", OpaqueGet = "opaque.get", OpaqueLen = "opaque.len",
    RefIsNull = "ref.is_null", RefUnwrap = "ref.unwrap",
    Assert = "assert", Trap = "trap",
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What is known about one operand's type while typing an operation.
#[derive(Clone, Debug, PartialEq)]
pub enum ArgTy {
    /// A value or typed operand.
    Known(Type),
    /// An untyped literal whose type comes from context; the payload is its default (`i64`, `f64`, `str`, ...).
    /// `Lit(Type::Ref{..})` stands for `null` (it has no default).
    Lit(Type),
    /// A record operand (`@R`).
    Record,
    /// A record field operand (`@R.f`) with the field's type.
    Field(Type),
}

/// The outcome of typing an operation: the type each operand must have (for record/field operands: their
/// field type, or `i64` for a record), and the result types.
#[derive(Clone, Debug, PartialEq)]
pub struct Typing {
    pub operands: Vec<Type>,
    pub results: Vec<Type>,
}

#[derive(Clone, Copy, PartialEq)]
enum Class {
    Int,
    IntOrBool,
    Num,
    NumOrBool,
    Float,
}

impl Class {
    fn admits(self, t: &Type) -> bool {
        match self {
            Class::Int => t.is_int(),
            Class::IntOrBool => t.is_int() || *t == Type::I1,
            Class::Num => t.is_int() || t.is_float(),
            Class::NumOrBool => t.is_int() || t.is_float() || *t == Type::I1,
            Class::Float => t.is_float(),
        }
    }
    fn describe(self) -> &'static str {
        match self {
            Class::Int => "i32 or i64",
            Class::IntOrBool => "i1, i32 or i64",
            Class::Num => "i32, i64, f32 or f64",
            Class::NumOrBool => "i1, i32, i64, f32 or f64",
            Class::Float => "f32 or f64",
        }
    }
}

fn arity(op: Opcode, args: &[ArgTy], n: usize) -> Result<(), String> {
    if args.len() == n {
        Ok(())
    } else {
        Err(format!(
            "{op} takes {n} operand{}, found {}",
            if n == 1 { "" } else { "s" },
            args.len()
        ))
    }
}

/// The common type of same-typed operands: the first known one, else the first literal's default.
fn unify(op: Opcode, args: &[ArgTy], class: Class) -> Result<Type, String> {
    let known = args.iter().find_map(|a| match a {
        ArgTy::Known(t) => Some(t.clone()),
        _ => None,
    });
    let t = match known {
        Some(t) => t,
        None => match args.iter().find_map(|a| {
            if let ArgTy::Lit(t) = a {
                Some(t.clone())
            } else {
                None
            }
        }) {
            Some(t) => t,
            None => return Err(format!("{op}: operands must be values or literals")),
        },
    };
    for a in args {
        match a {
            ArgTy::Known(u) if *u != t => {
                return Err(format!(
                    "{op}: operands must have the same type, found {t} and {u}"
                ));
            }
            ArgTy::Record | ArgTy::Field(_) => {
                return Err(format!("{op}: a record operand is not allowed here"));
            }
            _ => {}
        }
    }
    if !class.admits(&t) {
        return Err(format!("{op} expects {}, found {t}", class.describe()));
    }
    Ok(t)
}

fn fixed(op: Opcode, args: &[ArgTy], params: &[Type], results: &[Type]) -> Result<Typing, String> {
    arity(op, args, params.len())?;
    for (i, (a, p)) in args.iter().zip(params).enumerate() {
        if let ArgTy::Known(t) = a {
            if t != p {
                return Err(format!("{op}: operand {} must be {p}, found {t}", i + 1));
            }
        }
        if matches!(a, ArgTy::Record | ArgTy::Field(_)) {
            return Err(format!(
                "{op}: operand {} must be {p}, found a record",
                i + 1
            ));
        }
    }
    Ok(Typing {
        operands: params.to_vec(),
        results: results.to_vec(),
    })
}

fn known(op: Opcode, a: &ArgTy, what: &str) -> Result<Type, String> {
    match a {
        ArgTy::Known(t) => Ok(t.clone()),
        ArgTy::Lit(t) if !matches!(t, Type::Ref { .. }) => Ok(t.clone()),
        _ => Err(format!("{op}: operand must be {what}")),
    }
}

/// Types an operation. `annotation` is the written `: T`, required exactly by `list.new` and `opaque.get`.
pub fn type_op(op: Opcode, args: &[ArgTy], annotation: Option<&Type>) -> Result<Typing, String> {
    use Opcode::*;
    use Type::*;
    let needs_annotation = matches!(op, ListNew | OpaqueGet);
    match (needs_annotation, annotation) {
        (true, None) => return Err(format!("{op} needs a result type annotation (`: T`)")),
        (false, Some(t)) => return Err(format!("{op} takes no type annotation, found `: {t}`")),
        _ => {}
    }
    let same = |class: Class, n: usize, result: Option<Type>| -> Result<Typing, String> {
        arity(op, args, n)?;
        let t = unify(op, args, class)?;
        Ok(Typing {
            operands: vec![t.clone(); n],
            results: vec![result.unwrap_or(t)],
        })
    };
    match op {
        Add | Sub | Mul | Div | Rem | Min | Max => same(Class::Num, 2, None),
        AddWrap | SubWrap | MulWrap | DivU | RemU | Shl | Shr | ShrU => same(Class::Int, 2, None),
        And | Or | Xor => same(Class::IntOrBool, 2, None),
        Neg | Abs => same(Class::Num, 1, None),
        Not => same(Class::IntOrBool, 1, None),
        Sqrt | Floor | Ceil | Exp | Log => same(Class::Float, 1, None),
        CmpEq | CmpNe => same(Class::NumOrBool, 2, Some(I1)),
        CmpLt | CmpLe | CmpGt | CmpGe => same(Class::Num, 2, Some(I1)),
        CmpUlt | CmpUle | CmpUgt | CmpUge => same(Class::Int, 2, Some(I1)),
        Select => type_select(op, args),
        Copy => {
            arity(op, args, 1)?;
            let t = known(op, &args[0], "a value or literal")?;
            Ok(Typing {
                operands: vec![t.clone()],
                results: vec![t],
            })
        }
        ConstI1 => fixed(op, args, &[I1], &[I1]),
        ConstI32 => fixed(op, args, &[I32], &[I32]),
        ConstI64 => fixed(op, args, &[I64], &[I64]),
        ConstF32 => fixed(op, args, &[F32], &[F32]),
        ConstF64 => fixed(op, args, &[F64], &[F64]),
        ConstStr => fixed(op, args, &[Str], &[Str]),
        ConvI32 | ConvI64 | ConvF32 | ConvF64 => {
            arity(op, args, 1)?;
            let from = known(op, &args[0], "a scalar")?;
            if !Class::NumOrBool.admits(&from) {
                return Err(format!("{op}: cannot convert from {from}"));
            }
            let to = match op {
                ConvI32 => I32,
                ConvI64 => I64,
                ConvF32 => F32,
                _ => F64,
            };
            Ok(Typing {
                operands: vec![from],
                results: vec![to],
            })
        }
        ConvUI64 => {
            arity(op, args, 1)?;
            let from = known(op, &args[0], "i1 or i32")?;
            if !matches!(from, I1 | I32) {
                return Err(format!("conv.u.i64: expects i1 or i32, found {from}"));
            }
            Ok(Typing {
                operands: vec![from],
                results: vec![I64],
            })
        }
        TruncI32 => fixed(op, args, &[I64], &[I32]),
        BitcastI32 => fixed(op, args, &[F32], &[I32]),
        BitcastI64 => fixed(op, args, &[F64], &[I64]),
        BitcastF32 => fixed(op, args, &[I32], &[F32]),
        BitcastF64 => fixed(op, args, &[I64], &[F64]),
        BufferNew => fixed(op, args, &[I64], &[Buffer]),
        BufferLen => fixed(op, args, &[Buffer], &[I64]),
        LoadI8 | LoadU8 | LoadI16 | LoadU16 | LoadI32 => fixed(op, args, &[Buffer, I64], &[I32]),
        LoadU32 | LoadI64 => fixed(op, args, &[Buffer, I64], &[I64]),
        LoadF32 => fixed(op, args, &[Buffer, I64], &[F32]),
        LoadF64 => fixed(op, args, &[Buffer, I64], &[F64]),
        StoreI8 | StoreI16 | StoreI32 => fixed(op, args, &[Buffer, I64, I32], &[]),
        StoreI64 => fixed(op, args, &[Buffer, I64, I64], &[]),
        StoreF32 => fixed(op, args, &[Buffer, I64, F32], &[]),
        StoreF64 => fixed(op, args, &[Buffer, I64, F64], &[]),
        BufferSlice => fixed(op, args, &[Buffer, I64, I64], &[Buffer]),
        BufferCopy => fixed(op, args, &[Buffer, I64, Buffer, I64, I64], &[]),
        BufferFill => fixed(op, args, &[Buffer, I64, I64, I32], &[]),
        BufferConcat => fixed(op, args, &[Buffer, Buffer], &[Buffer]),
        LoadField | StoreField => type_field_access(op, args),
        RecordSize => {
            arity(op, args, 1)?;
            if args[0] != ArgTy::Record {
                return Err("record.size: the operand must be a record (`@Record`)".into());
            }
            Ok(Typing {
                operands: vec![I64],
                results: vec![I64],
            })
        }
        RecordOffset => {
            arity(op, args, 1)?;
            let ArgTy::Field(ft) = &args[0] else {
                return Err(
                    "record.offset: the operand must be a record field (`@Record.field`)".into(),
                );
            };
            Ok(Typing {
                operands: vec![ft.clone()],
                results: vec![I64],
            })
        }
        StrLen => fixed(op, args, &[Str], &[I64]),
        StrConcat => fixed(op, args, &[Str, Str], &[Str]),
        StrEq => fixed(op, args, &[Str, Str], &[I1]),
        StrFromI64 => fixed(op, args, &[I64], &[Str]),
        StrFromF64 => fixed(op, args, &[F64], &[Str]),
        StrToBuffer => fixed(op, args, &[Str], &[Buffer]),
        StrFromBuffer => fixed(op, args, &[Buffer, I64, I64], &[Str]),
        StrParseI64 => fixed(op, args, &[Str], &[I64]),
        ListNew => {
            let t = annotation.cloned().unwrap_or(I64);
            if !matches!(t, List(_)) {
                return Err(format!(
                    "list.new: the annotation must be a list type, found {t}"
                ));
            }
            fixed(op, args, &[I64], &[t])
        }
        ListLen | ListGet | ListSet | ListPush => type_list_access(op, args),
        OpaqueNew => {
            let mut operands = Vec::with_capacity(args.len());
            for (i, a) in args.iter().enumerate() {
                match a {
                    ArgTy::Known(t) => operands.push(t.clone()),
                    ArgTy::Lit(t) if !matches!(t, Type::Ref { .. }) => operands.push(t.clone()),
                    _ => {
                        return Err(format!(
                            "opaque.new: operand {} must be a value or a literal",
                            i + 1
                        ));
                    }
                }
            }
            Ok(Typing {
                operands,
                results: vec![opaque()],
            })
        }
        OpaqueGet => {
            let t = annotation.cloned().unwrap_or(I64);
            fixed(op, args, &[opaque(), I64], &[t])
        }
        OpaqueLen => fixed(op, args, &[opaque()], &[I64]),
        RefIsNull | RefUnwrap => type_nullable_ref(op, args),
        Assert => fixed(op, args, &[I1, Str], &[]),
        Trap => fixed(op, args, &[Str], &[]),
    }
}

/// Types `select`: an `i1` condition and two choices of one type.
fn type_select(op: Opcode, args: &[ArgTy]) -> Result<Typing, String> {
    use Type::*;
    arity(op, args, 3)?;
    let t = match (&args[1], &args[2]) {
        (ArgTy::Known(t), _) | (_, ArgTy::Known(t)) => t.clone(),
        (a, _) => known(op, a, "a value")?,
    };
    for a in &args[1..] {
        if let ArgTy::Known(u) = a {
            if *u != t {
                return Err(format!(
                    "select: both choices must have the same type, found {t} and {u}"
                ));
            }
        }
    }
    if let ArgTy::Known(c) = &args[0] {
        if *c != I1 {
            return Err(format!("select: the condition must be i1, found {c}"));
        }
    }
    Ok(Typing {
        operands: vec![I1, t.clone(), t.clone()],
        results: vec![t],
    })
}

/// Types `load.field` / `store.field`: a buffer, an index and a record field (and the stored value).
fn type_field_access(op: Opcode, args: &[ArgTy]) -> Result<Typing, String> {
    use Opcode::*;
    use Type::*;
    let n = if op == LoadField { 3 } else { 4 };
    arity(op, args, n)?;
    let ArgTy::Field(ft) = &args[2] else {
        return Err(format!(
            "{op}: operand 3 must be a record field (`@Record.field`)"
        ));
    };
    let ft = ft.clone();
    let mut params = vec![Buffer, I64, ft.clone()];
    if op == StoreField {
        params.push(ft.clone());
    }
    for (i, (a, p)) in args.iter().zip(&params).enumerate() {
        if i == 2 {
            continue;
        }
        if let ArgTy::Known(t) = a {
            if t != p {
                return Err(format!("{op}: operand {} must be {p}, found {t}", i + 1));
            }
        }
    }
    let results = if op == LoadField { vec![ft] } else { vec![] };
    Ok(Typing {
        operands: params,
        results,
    })
}

/// Types the list operations on an existing list: `list.len`, `list.get`, `list.set`, `list.push`.
fn type_list_access(op: Opcode, args: &[ArgTy]) -> Result<Typing, String> {
    use Opcode::*;
    use Type::*;
    let n = match op {
        ListLen => 1,
        ListGet | ListPush => 2,
        _ => 3,
    };
    arity(op, args, n)?;
    let lt = known(op, &args[0], "a list")?;
    let List(elem) = &lt else {
        return Err(format!("{op}: operand 1 must be a list, found {lt}"));
    };
    let elem = (**elem).clone();
    let (params, results) = match op {
        ListLen => (vec![lt.clone()], vec![I64]),
        ListGet => (vec![lt.clone(), I64], vec![elem]),
        ListPush => (vec![lt.clone(), elem], vec![]),
        _ => (vec![lt.clone(), I64, elem], vec![]),
    };
    fixed(op, args, &params, &results)
}

/// Types `ref.is_null` / `ref.unwrap` of a nullable reference.
fn type_nullable_ref(op: Opcode, args: &[ArgTy]) -> Result<Typing, String> {
    use Opcode::*;
    use Type::*;
    arity(op, args, 1)?;
    let t = known(op, &args[0], "a nullable reference")?;
    let Ref {
        name,
        nullable: true,
    } = &t
    else {
        return Err(format!(
            "{op}: expects a nullable reference (`?!T`), found {t}"
        ));
    };
    let result = if op == RefIsNull {
        I1
    } else {
        Ref {
            name: name.clone(),
            nullable: false,
        }
    };
    Ok(Typing {
        operands: vec![t.clone()],
        results: vec![result],
    })
}

/// `!opaque`
pub fn opaque() -> Type {
    Type::Ref {
        name: "opaque".into(),
        nullable: false,
    }
}

/// Whether a value of type `have` may be used where `want` is expected: equal types, or a non-null reference
/// where the nullable form of the same reference is expected.
pub fn assignable(have: &Type, want: &Type) -> bool {
    match (have, want) {
        (
            Type::Ref { name: a, .. },
            Type::Ref {
                name: b,
                nullable: true,
            },
        ) => a == b,
        _ => have == want,
    }
}
