//! The syntax tree of one `.loom` file.
//!
//! The tree mirrors the grammar in `docs/loom/syntax.md`. Every node carries the [`Span`] of the text it came
//! from. The parser never fails: where the text is broken it records a [`crate::Diagnostic`] and either drops
//! the broken piece or fills it with an `Error` node, so later stages can still report more problems.

use crate::Span;

/// A name with where it was written (`@embed.control` is stored as `embed.control`, without the sigil).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Name {
    pub text: String,
    pub span: Span,
}

/// A whole file: one module.
#[derive(Clone, Debug, PartialEq)]
pub struct Module {
    /// `None` when the `module @name` header could not be parsed.
    pub name: Option<Name>,
    pub items: Vec<Item>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    Decl(FuncDecl),
    Func(Func),
    Record(Record),
    Const(Const),
    Device(DeviceItem),
}

/// `func.decl @sym<tparams>(types) -> results import("module")`
#[derive(Clone, Debug, PartialEq)]
pub struct FuncDecl {
    pub name: Name,
    pub tparams: Vec<TParam>,
    pub params: Vec<Type>,
    pub results: Vec<Type>,
    /// `Some` for a capability import: the native module's name.
    pub import: Option<Name>,
    pub span: Span,
}

/// `export? func @name<tparams>(%p: T, ...) -> results { body }`
#[derive(Clone, Debug, PartialEq)]
pub struct Func {
    pub exported: bool,
    pub name: Name,
    pub tparams: Vec<TParam>,
    pub params: Vec<Param>,
    pub results: Vec<Type>,
    pub body: Block,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    /// Without the `%`.
    pub name: Name,
    pub ty: Type,
}

/// `export? type @Name = record { field: T, ... }`
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub exported: bool,
    pub name: Name,
    pub fields: Vec<(Name, Type)>,
    pub span: Span,
}

/// `export? const @NAME: T = expr`
#[derive(Clone, Debug, PartialEq)]
pub struct Const {
    pub exported: bool,
    pub name: Name,
    pub ty: Type,
    pub value: ConstExpr,
    pub span: Span,
}

/// `kernel`, `kfunc` or `stage`: header parsed, the rest kept as token trees for the kernel compiler.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceItem {
    pub exported: bool,
    pub kind: DeviceKind,
    pub name: Name,
    pub tparams: Vec<TParam>,
    /// Every token after the template parameters, up to and including the closing `}` of the body.
    pub tokens: Vec<TokenTree>,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Kernel,
    Kfunc,
    Stage,
}

/// A token, or a bracketed group of token trees (`(..)`, `[..]`, `{..}`).
#[derive(Clone, Debug, PartialEq)]
pub enum TokenTree {
    Token {
        text: String,
        span: Span,
    },
    Group {
        open: char,
        trees: Vec<TokenTree>,
        span: Span,
    },
}

/// A template parameter: `N: i64 = 4`, `F: func(i64) -> i64`.
#[derive(Clone, Debug, PartialEq)]
pub struct TParam {
    pub name: Name,
    pub kind: TParamKind,
    pub default: Option<ConstExpr>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum TParamKind {
    I64,
    Bool,
    Str,
    DType,
    Shape,
    Func {
        params: Vec<Type>,
        results: Vec<Type>,
    },
}

/// A written type.
#[derive(Clone, Debug, PartialEq)]
pub enum Type {
    I1(Span),
    I32(Span),
    I64(Span),
    F32(Span),
    F64(Span),
    Str(Span),
    Buffer(Span),
    List(Box<Type>, Span),
    /// `!hal.buffer` (name without `!`); `nullable` when written `?!hal.buffer`.
    Ref {
        name: Name,
        nullable: bool,
        span: Span,
    },
    /// Anything the parser could not read as a type (a diagnostic was recorded).
    Error(Span),
}

impl Type {
    pub fn span(&self) -> Span {
        match self {
            Type::I1(s)
            | Type::I32(s)
            | Type::I64(s)
            | Type::F32(s)
            | Type::F64(s)
            | Type::Str(s)
            | Type::Buffer(s)
            | Type::List(_, s)
            | Type::Error(s) => *s,
            Type::Ref { span, .. } => *span,
        }
    }
}

/// A compile-time expression: template defaults, template arguments, constants.
#[derive(Clone, Debug, PartialEq)]
pub enum ConstExpr {
    Int(i64, Span),
    Float(f64, Span),
    Bool(bool, Span),
    Str(String, Span),
    /// `[2, N, 4]`: a shape.
    List(Vec<ConstExpr>, Span),
    /// A bare word: a template parameter, or a dtype name such as `f32`.
    Word(Name),
    /// `@sym`: a constant or a function reference.
    Symbol(Name),
    /// `a + b`, `a * b`, ... with the usual precedence; `op` is one of `+ - * / %`.
    Binary {
        op: char,
        lhs: Box<ConstExpr>,
        rhs: Box<ConstExpr>,
        span: Span,
    },
    Neg(Box<ConstExpr>, Span),
    Error(Span),
}

impl ConstExpr {
    pub fn span(&self) -> Span {
        match self {
            ConstExpr::Int(_, s)
            | ConstExpr::Float(_, s)
            | ConstExpr::Bool(_, s)
            | ConstExpr::Str(_, s)
            | ConstExpr::List(_, s)
            | ConstExpr::Binary { span: s, .. }
            | ConstExpr::Neg(_, s)
            | ConstExpr::Error(s) => *s,
            ConstExpr::Word(n) | ConstExpr::Symbol(n) => n.span,
        }
    }
}

/// `{ stmt* }`
#[derive(Clone, Debug, PartialEq)]
pub struct Block {
    pub stmts: Vec<Stmt>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// `%a, %b = expr` or a bare `expr` (no results).
    Let {
        results: Vec<Name>,
        expr: Expr,
        span: Span,
    },
    Return {
        values: Vec<Operand>,
        span: Span,
    },
    Yield {
        values: Vec<Operand>,
        span: Span,
    },
    Condition {
        value: Operand,
        span: Span,
    },
    /// A statement the parser could not read (a diagnostic was recorded).
    Error(Span),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// `opname a, b` or `opname a, b : T` (flat) — operands may themselves be nested ops. `assert %c, "msg"`
    /// and `trap "msg"` are ordinary ops.
    Op {
        name: Name,
        operands: Vec<Operand>,
        annotation: Option<Type>,
        span: Span,
    },
    Call {
        callee: Callee,
        targs: Vec<TArg>,
        args: Vec<Operand>,
        span: Span,
    },
    If {
        cond: Operand,
        results: Vec<Type>,
        then_block: Block,
        else_block: Option<Block>,
        span: Span,
    },
    For {
        var: Name,
        lo: Operand,
        hi: Operand,
        step: Option<Operand>,
        iters: Vec<IterArg>,
        results: Vec<Type>,
        body: Block,
        span: Span,
    },
    While {
        iters: Vec<IterArg>,
        results: Vec<Type>,
        cond_block: Block,
        body: Block,
        span: Span,
    },
}

/// `%acc = 0 : i64` inside `iter(...)`.
#[derive(Clone, Debug, PartialEq)]
pub struct IterArg {
    pub name: Name,
    pub init: Operand,
    pub ty: Type,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Callee {
    /// `@f` or `@m.f`
    Symbol(Name),
    /// `F`: a function-typed template parameter.
    TParam(Name),
}

/// `N = 4` in `call @f<N = 4>(...)`.
#[derive(Clone, Debug, PartialEq)]
pub struct TArg {
    pub name: Name,
    pub value: ConstExpr,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Operand {
    /// `%x` (name without `%`).
    Value(Name),
    Int(i64, Span),
    Float(f64, Span),
    Str(String, Span),
    Bool(bool, Span),
    Null(Span),
    /// A bare word: a template parameter.
    Word(Name),
    /// `@sym`: a constant, function, record or record field.
    Symbol(Name),
    /// `op(a, b)`: sugar for a fresh value defined just before the statement.
    Nested {
        name: Name,
        operands: Vec<Operand>,
        span: Span,
    },
    Error(Span),
}

impl Operand {
    pub fn span(&self) -> Span {
        match self {
            Operand::Value(n) | Operand::Word(n) | Operand::Symbol(n) => n.span,
            Operand::Int(_, s)
            | Operand::Float(_, s)
            | Operand::Str(_, s)
            | Operand::Bool(_, s)
            | Operand::Null(s)
            | Operand::Nested { span: s, .. }
            | Operand::Error(s) => *s,
        }
    }
}
