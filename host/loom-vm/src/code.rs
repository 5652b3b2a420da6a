//! The register bytecode: one compact `Copy` instruction enum plus per-function side tables.
//!
//! Register operands are `u16` indices into the current frame's scalar bank (`s`) or reference bank (`r`).
//! Scalars are `u64` bit patterns in canonical form: `i1` is 0/1, `i32` and `f32` are zero-extended 32-bit
//! patterns, `i64`/`f64` are their 64 bits. Canonical form lets bitwise ops, equality and unsigned compares share
//! one instruction for `i1`/`i32`/`i64`, and lets one 4-byte load serve `i32`, `u32` and `f32`.
//!
//! Branch instructions carry fuel: the `J*` family jumps to `target` when its condition holds and otherwise
//! charges `fuel` (the block it falls into) and falls through; `Jump` and `ForLoop` charge `fuel` when they jump.

use loom_ir::{Loc, Type};

pub(crate) type R = u16;

/// Where an SSA value lives: scalar bank or reference bank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Slot {
    S(R),
    R(R),
}

/// The float unary functions of `Instr::FUn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FloatUnary {
    Neg,
    Abs,
    Sqrt,
    Floor,
    Ceil,
    Exp,
    Log,
}

/// The rarer float binary operations of `Instr::FBin` (add/sub/mul have their own instructions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FloatBinary {
    Div,
    Rem,
    Min,
    Max,
}

/// The float comparisons of `Instr::FCmp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FloatCmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// Scalar kinds for conversions and record fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ScalarKind {
    I1,
    I32,
    I64,
    F32,
    F64,
}

impl ScalarKind {
    pub(crate) fn of(t: &Type) -> Option<ScalarKind> {
        Some(match t {
            Type::I1 => ScalarKind::I1,
            Type::I32 => ScalarKind::I32,
            Type::I64 => ScalarKind::I64,
            Type::F32 => ScalarKind::F32,
            Type::F64 => ScalarKind::F64,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Conv {
    /// `conv.T` from `from` to `to`.
    To {
        from: ScalarKind,
        to: ScalarKind,
    },
    TruncI32,
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum Instr {
    // ---- control ----
    Fuel {
        n: u32,
    },
    Jump {
        target: u32,
        fuel: u32,
    },
    /// Jump when `s[c]` is 0 (false).
    Jz {
        c: R,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    // fused compare-and-branch, register/register; jump when the comparison holds
    JEq {
        a: R,
        b: R,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    JNe {
        a: R,
        b: R,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    JUlt {
        a: R,
        b: R,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    JUle {
        a: R,
        b: R,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    JUgt {
        a: R,
        b: R,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    JUge {
        a: R,
        b: R,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    JLt64 {
        a: R,
        b: R,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    JLe64 {
        a: R,
        b: R,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    JGt64 {
        a: R,
        b: R,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    JGe64 {
        a: R,
        b: R,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    JLt32 {
        a: R,
        b: R,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    JLe32 {
        a: R,
        b: R,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    JGt32 {
        a: R,
        b: R,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    JGe32 {
        a: R,
        b: R,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    // register/immediate (k is the canonical bits for Eq/Ne, the signed value otherwise)
    JEqK {
        a: R,
        k: i32,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    JNeK {
        a: R,
        k: i32,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    JLtK64 {
        a: R,
        k: i32,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    JLeK64 {
        a: R,
        k: i32,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    JGtK64 {
        a: R,
        k: i32,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    JGeK64 {
        a: R,
        k: i32,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    JLtK32 {
        a: R,
        k: i32,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    JLeK32 {
        a: R,
        k: i32,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    JGtK32 {
        a: R,
        k: i32,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    JGeK32 {
        a: R,
        k: i32,
        target: u32,
        fuel: u16,
        /// Charged when the branch is taken.
        tfuel: u16,
    },
    /// Jump when `s[a] & mask != 0` (a single-use `and` fused with a compare against 0).
    JTestNz {
        a: R,
        mask: u32,
        target: u32,
        fuel: u16,
        tfuel: u16,
    },
    /// Jump when `s[a] & mask == 0`.
    JTestZ {
        a: R,
        mask: u32,
        target: u32,
        fuel: u16,
        tfuel: u16,
    },
    /// `iv += step`; if no overflow and `iv < hi`, charge `fuel` and jump to `target`.
    ForLoop {
        iv: R,
        hi: R,
        step: R,
        target: u32,
        fuel: u32,
    },
    /// `ForLoop` with an immediate step (a `for` whose step is a constant in 1..=65535): one register read
    /// less per iteration; same overflow rule (an `iv + step` that overflows leaves the loop).
    ForLoopK {
        iv: R,
        hi: R,
        step: u16,
        target: u32,
        fuel: u32,
    },
    /// Traps unless `s[step] > 0`.
    StepCheck {
        step: R,
    },
    Call {
        site: u32,
    },
    CallNative {
        site: u32,
    },
    Ret {
        site: u32,
    },
    Assert {
        c: R,
        msg: R,
    },
    Trap {
        msg: R,
    },

    // ---- moves and constants ----
    MovS {
        d: R,
        a: R,
    },
    MovR {
        d: R,
        a: R,
    },
    ConstS {
        d: R,
        bits: u64,
    },
    ConstStr {
        d: R,
        idx: u32,
    },
    ConstNull {
        d: R,
    },
    SelS {
        d: R,
        c: R,
        a: R,
        b: R,
    },
    SelR {
        d: R,
        c: R,
        a: R,
        b: R,
    },

    // ---- integer arithmetic ----
    Add32 {
        d: R,
        a: R,
        b: R,
    },
    Add64 {
        d: R,
        a: R,
        b: R,
    },
    Sub32 {
        d: R,
        a: R,
        b: R,
    },
    Sub64 {
        d: R,
        a: R,
        b: R,
    },
    Mul32 {
        d: R,
        a: R,
        b: R,
    },
    Mul64 {
        d: R,
        a: R,
        b: R,
    },
    AddK32 {
        d: R,
        a: R,
        k: i32,
    },
    AddK64 {
        d: R,
        a: R,
        k: i32,
    },
    SubK32 {
        d: R,
        a: R,
        k: i32,
    },
    SubK64 {
        d: R,
        a: R,
        k: i32,
    },
    MulK32 {
        d: R,
        a: R,
        k: i32,
    },
    MulK64 {
        d: R,
        a: R,
        k: i32,
    },
    AddW32 {
        d: R,
        a: R,
        b: R,
    },
    AddW64 {
        d: R,
        a: R,
        b: R,
    },
    SubW32 {
        d: R,
        a: R,
        b: R,
    },
    SubW64 {
        d: R,
        a: R,
        b: R,
    },
    MulW32 {
        d: R,
        a: R,
        b: R,
    },
    MulW64 {
        d: R,
        a: R,
        b: R,
    },
    AddWK32 {
        d: R,
        a: R,
        k: i32,
    },
    AddWK64 {
        d: R,
        a: R,
        k: i32,
    },
    MulWK32 {
        d: R,
        a: R,
        k: i32,
    },
    MulWK64 {
        d: R,
        a: R,
        k: i32,
    },
    /// `d = a * b + c`, wrapping (a single-use `mul.wrap` feeding an `add.wrap`).
    MulAddW64 {
        d: R,
        a: R,
        b: R,
        c: R,
    },
    /// `d = a * k + c`, wrapping.
    MulKAddW64 {
        d: R,
        a: R,
        k: i32,
        c: R,
    },
    Div32 {
        d: R,
        a: R,
        b: R,
    },
    Div64 {
        d: R,
        a: R,
        b: R,
    },
    Rem32 {
        d: R,
        a: R,
        b: R,
    },
    Rem64 {
        d: R,
        a: R,
        b: R,
    },
    DivU32 {
        d: R,
        a: R,
        b: R,
    },
    DivU64 {
        d: R,
        a: R,
        b: R,
    },
    RemU32 {
        d: R,
        a: R,
        b: R,
    },
    RemU64 {
        d: R,
        a: R,
        b: R,
    },
    Min32 {
        d: R,
        a: R,
        b: R,
    },
    Min64 {
        d: R,
        a: R,
        b: R,
    },
    Max32 {
        d: R,
        a: R,
        b: R,
    },
    Max64 {
        d: R,
        a: R,
        b: R,
    },
    Neg32 {
        d: R,
        a: R,
    },
    Neg64 {
        d: R,
        a: R,
    },
    Abs32 {
        d: R,
        a: R,
    },
    Abs64 {
        d: R,
        a: R,
    },
    /// Bitwise on canonical bits: valid for i1, i32 and i64.
    And {
        d: R,
        a: R,
        b: R,
    },
    Or {
        d: R,
        a: R,
        b: R,
    },
    Xor {
        d: R,
        a: R,
        b: R,
    },
    /// `k` is canonical bits of the immediate, sign-extended from 32 bits for i64 (masked for i32 by lowering).
    AndK {
        d: R,
        a: R,
        k: u32,
    },
    AndK64 {
        d: R,
        a: R,
        k: i32,
    },
    OrK {
        d: R,
        a: R,
        k: u32,
    },
    XorK {
        d: R,
        a: R,
        k: u32,
    },
    Not1 {
        d: R,
        a: R,
    },
    Not32 {
        d: R,
        a: R,
    },
    Not64 {
        d: R,
        a: R,
    },
    Shl32 {
        d: R,
        a: R,
        b: R,
    },
    Shl64 {
        d: R,
        a: R,
        b: R,
    },
    Shr32 {
        d: R,
        a: R,
        b: R,
    },
    Shr64 {
        d: R,
        a: R,
        b: R,
    },
    ShrU32 {
        d: R,
        a: R,
        b: R,
    },
    ShrU64 {
        d: R,
        a: R,
        b: R,
    },
    ShlK32 {
        d: R,
        a: R,
        k: u8,
    },
    ShlK64 {
        d: R,
        a: R,
        k: u8,
    },
    ShrK32 {
        d: R,
        a: R,
        k: u8,
    },
    ShrK64 {
        d: R,
        a: R,
        k: u8,
    },
    ShrUK32 {
        d: R,
        a: R,
        k: u8,
    },
    ShrUK64 {
        d: R,
        a: R,
        k: u8,
    },

    // ---- integer comparisons producing i1 ----
    Eq {
        d: R,
        a: R,
        b: R,
    },
    Ne {
        d: R,
        a: R,
        b: R,
    },
    Ult {
        d: R,
        a: R,
        b: R,
    },
    Ule {
        d: R,
        a: R,
        b: R,
    },
    Lt32 {
        d: R,
        a: R,
        b: R,
    },
    Le32 {
        d: R,
        a: R,
        b: R,
    },
    Lt64 {
        d: R,
        a: R,
        b: R,
    },
    Le64 {
        d: R,
        a: R,
        b: R,
    },
    EqK {
        d: R,
        a: R,
        k: i32,
    },
    NeK {
        d: R,
        a: R,
        k: i32,
    },
    LtK32 {
        d: R,
        a: R,
        k: i32,
    },
    LeK32 {
        d: R,
        a: R,
        k: i32,
    },
    GtK32 {
        d: R,
        a: R,
        k: i32,
    },
    GeK32 {
        d: R,
        a: R,
        k: i32,
    },
    LtK64 {
        d: R,
        a: R,
        k: i32,
    },
    LeK64 {
        d: R,
        a: R,
        k: i32,
    },
    GtK64 {
        d: R,
        a: R,
        k: i32,
    },
    GeK64 {
        d: R,
        a: R,
        k: i32,
    },

    // ---- floats ----
    FAdd32 {
        d: R,
        a: R,
        b: R,
    },
    FAdd64 {
        d: R,
        a: R,
        b: R,
    },
    FSub32 {
        d: R,
        a: R,
        b: R,
    },
    FSub64 {
        d: R,
        a: R,
        b: R,
    },
    FMul32 {
        d: R,
        a: R,
        b: R,
    },
    FMul64 {
        d: R,
        a: R,
        b: R,
    },
    FBin {
        d: R,
        a: R,
        b: R,
        op: FloatBinary,
        wide: bool,
    },
    FUn {
        d: R,
        a: R,
        op: FloatUnary,
        wide: bool,
    },
    FCmp {
        d: R,
        a: R,
        b: R,
        op: FloatCmp,
        wide: bool,
    },
    Conv {
        d: R,
        a: R,
        op: Conv,
    },

    // ---- buffers: effective offset is s[off] + disp (checked) ----
    BufNew {
        d: R,
        len: R,
    },
    BufLen {
        d: R,
        b: R,
    },
    Ld8s {
        d: R,
        b: R,
        off: R,
        disp: i32,
    },
    Ld8u {
        d: R,
        b: R,
        off: R,
        disp: i32,
    },
    Ld16s {
        d: R,
        b: R,
        off: R,
        disp: i32,
    },
    Ld16u {
        d: R,
        b: R,
        off: R,
        disp: i32,
    },
    Ld32 {
        d: R,
        b: R,
        off: R,
        disp: i32,
    },
    Ld64 {
        d: R,
        b: R,
        off: R,
        disp: i32,
    },
    St8 {
        b: R,
        off: R,
        v: R,
        disp: i32,
    },
    St16 {
        b: R,
        off: R,
        v: R,
        disp: i32,
    },
    St32 {
        b: R,
        off: R,
        v: R,
        disp: i32,
    },
    St64 {
        b: R,
        off: R,
        v: R,
        disp: i32,
    },
    /// Indexed forms. `X`: offset `s[x] + s[y] * sc + disp`; `XS`: offset `(s[x] + s[y]) * sc + disp`. Each step is
    /// checked exactly like the `add`/`mul` it replaces (same trap kinds and messages).
    Ld32X {
        d: R,
        b: R,
        x: R,
        y: R,
        sc: u8,
        disp: i32,
    },
    Ld32XS {
        d: R,
        b: R,
        x: R,
        y: R,
        sc: u8,
        disp: i32,
    },
    Ld64X {
        d: R,
        b: R,
        x: R,
        y: R,
        sc: u8,
        disp: i32,
    },
    Ld64XS {
        d: R,
        b: R,
        x: R,
        y: R,
        sc: u8,
        disp: i32,
    },
    St32X {
        b: R,
        x: R,
        y: R,
        v: R,
        sc: u8,
        disp: i32,
    },
    St32XS {
        b: R,
        x: R,
        y: R,
        v: R,
        sc: u8,
        disp: i32,
    },
    St64X {
        b: R,
        x: R,
        y: R,
        v: R,
        sc: u8,
        disp: i32,
    },
    St64XS {
        b: R,
        x: R,
        y: R,
        v: R,
        sc: u8,
        disp: i32,
    },
    /// Field at byte `idx * size + off`; `kind` gives the width (i1: one byte, nonzero is true).
    LdField {
        d: R,
        b: R,
        idx: R,
        size: u16,
        off: u16,
        kind: ScalarKind,
    },
    StField {
        b: R,
        idx: R,
        v: R,
        size: u16,
        off: u16,
        kind: ScalarKind,
    },
    BufSlice {
        d: R,
        b: R,
        off: R,
        len: R,
    },
    BufCopy {
        dst: R,
        doff: R,
        src: R,
        soff: R,
        len: R,
    },
    BufFill {
        b: R,
        off: R,
        len: R,
        byte: R,
    },
    BufConcat {
        d: R,
        a: R,
        b: R,
    },

    // ---- strings ----
    StrLen {
        d: R,
        a: R,
    },
    StrConcat {
        d: R,
        a: R,
        b: R,
    },
    StrEq {
        d: R,
        a: R,
        b: R,
    },
    StrFromI64 {
        d: R,
        a: R,
    },
    StrFromF64 {
        d: R,
        a: R,
    },
    StrToBuf {
        d: R,
        a: R,
    },
    StrFromBuf {
        d: R,
        b: R,
        off: R,
        len: R,
    },
    StrParse {
        d: R,
        a: R,
    },

    // ---- lists (elements are scalar bits or reference handles) ----
    ListNew {
        d: R,
        cap: R,
    },
    ListLen {
        d: R,
        l: R,
    },
    ListGetS {
        d: R,
        l: R,
        i: R,
    },
    ListGetR {
        d: R,
        l: R,
        i: R,
    },
    ListSetS {
        l: R,
        i: R,
        v: R,
    },
    ListSetR {
        l: R,
        i: R,
        v: R,
    },
    ListPushS {
        l: R,
        v: R,
    },
    ListPushR {
        l: R,
        v: R,
    },

    // ---- opaque tuples and references ----
    OpaqueNew {
        d: R,
        site: u32,
    },
    OpaqueGetS {
        d: R,
        o: R,
        i: R,
        ty: u32,
    },
    OpaqueGetR {
        d: R,
        o: R,
        i: R,
        ty: u32,
    },
    OpaqueLen {
        d: R,
        o: R,
    },
    IsNull {
        d: R,
        a: R,
    },
    Unwrap {
        d: R,
        a: R,
    },
}

// Keep the instruction small: the dispatch loop copies one per step.
const _: () = assert!(std::mem::size_of::<Instr>() <= 16);

impl Instr {
    /// The jump target of a control instruction, for patching.
    pub(crate) fn target_mut(&mut self) -> Option<&mut u32> {
        use Instr::*;
        match self {
            Jump { target, .. }
            | Jz { target, .. }
            | JEq { target, .. }
            | JNe { target, .. }
            | JUlt { target, .. }
            | JUle { target, .. }
            | JUgt { target, .. }
            | JUge { target, .. }
            | JLt64 { target, .. }
            | JLe64 { target, .. }
            | JGt64 { target, .. }
            | JGe64 { target, .. }
            | JLt32 { target, .. }
            | JLe32 { target, .. }
            | JGt32 { target, .. }
            | JGe32 { target, .. }
            | JEqK { target, .. }
            | JNeK { target, .. }
            | JLtK64 { target, .. }
            | JLeK64 { target, .. }
            | JGtK64 { target, .. }
            | JGeK64 { target, .. }
            | JLtK32 { target, .. }
            | JLeK32 { target, .. }
            | JGtK32 { target, .. }
            | JGeK32 { target, .. }
            | JTestNz { target, .. }
            | JTestZ { target, .. }
            | ForLoop { target, .. }
            | ForLoopK { target, .. } => Some(target),
            _ => None,
        }
    }
}

/// A Loom call site: argument copies into the callee's frame and where results go in the caller's.
#[derive(Clone, Debug)]
pub(crate) struct CallSite {
    pub(crate) callee: u32,
    /// (caller register, callee register) per bank.
    pub(crate) sargs: Box<[(R, R)]>,
    pub(crate) rargs: Box<[(R, R)]>,
    pub(crate) results: Box<[Slot]>,
}

/// A native call site.
#[derive(Clone, Debug)]
pub(crate) struct NativeSite {
    pub(crate) import: u32,
    pub(crate) args: Box<[Slot]>,
    pub(crate) results: Box<[Slot]>,
}

/// One lowered function.
#[derive(Debug)]
pub(crate) struct FuncCode {
    pub(crate) name: String,
    pub(crate) file: u32,
    pub(crate) loc: Loc,
    pub(crate) code: Vec<Instr>,
    pub(crate) locs: Vec<Loc>,
    pub(crate) n_s: u32,
    pub(crate) n_r: u32,
    /// Where each parameter lives, in order.
    pub(crate) params: Vec<Slot>,
    pub(crate) param_types: Vec<Type>,
    pub(crate) result_types: Vec<Type>,
    /// Fuel of the body's first block, charged on entry.
    pub(crate) entry_fuel: u32,
    pub(crate) calls: Vec<CallSite>,
    pub(crate) natives: Vec<NativeSite>,
    pub(crate) rets: Vec<Box<[Slot]>>,
    /// `opaque.new` operands: (type id, slot).
    pub(crate) opaques: Vec<Box<[(u32, Slot)]>>,
}
