//! The kernel AST: what [`crate::parse`] builds from a device item's token trees.
//!
//! One expression type serves constant expressions (shapes, grids, template arguments) and kernel operands:
//! the specializer evaluates each expression to a compile-time value when it can and emits IR otherwise, so
//! `mul(program_id(0), BM)` and `cdiv(M, BM)` use the same machinery.

use loom_syntax::Span;
use loom_syntax::ast::TParam;

pub use loom_ir::DeviceKind;

/// A name (without its sigil) and where it was written.
#[derive(Clone, Debug, PartialEq)]
pub struct Name {
    pub text: String,
    pub span: Span,
}

/// One parsed device item.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    pub kind: DeviceKind,
    pub exported: bool,
    pub name: Name,
    pub tparams: Vec<TParam>,
    pub header: Header,
    pub body: Block,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Header {
    /// `grid(e, ...) (%x: buffer<T, [dims]> mode, ...)`
    Kernel {
        grid: Vec<Expr>,
        params: Vec<BufDecl>,
    },
    /// `(%x: tile<S, T>, %s: f32) -> type`
    Kfunc {
        params: Vec<(Name, TypeExpr)>,
        results: Vec<TypeExpr>,
    },
    /// `(%x: buffer<T, [dims]> input|output, ...) params @domain(inputs: N) { bindings }`
    Stage {
        buffers: Vec<BufDecl>,
        params: Option<ParamBlock>,
    },
}

/// `%x: buffer<f32, [M, K]> read`: a kernel parameter (`read`/`write`/`readwrite`) or a stage buffer
/// (`input`/`output`).
#[derive(Clone, Debug, PartialEq)]
pub struct BufDecl {
    pub name: Name,
    pub dtype: Expr,
    pub dims: Vec<Expr>,
    pub mode: Name,
    pub span: Span,
}

/// `params @dense(inputs: 1) { ... }`
#[derive(Clone, Debug, PartialEq)]
pub struct ParamBlock {
    pub domain: Name,
    pub inputs: Expr,
    pub bindings: Vec<ParamItem>,
}

/// One entry of a `params` block: a binding, or a `static.for` repeating bindings.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamItem {
    Binding(Binding),
    For {
        header: StaticFor,
        body: Vec<ParamItem>,
    },
}

/// `static.for %l = LO to HI step S`: the header of a compile-time loop (stage bodies and `params` blocks).
#[derive(Clone, Debug, PartialEq)]
pub struct StaticFor {
    pub var: Name,
    pub lo: Expr,
    pub hi: Expr,
    pub step: Option<Expr>,
    pub span: Span,
}

/// `%w: f32[H, H] = weights(0, "proj.weight") layout(packed_b)`; `%wq[%l]: ... = weights(0, "l.{%l}.q")`
/// defines member `%l` of the family `%wq`.
#[derive(Clone, Debug, PartialEq)]
pub struct Binding {
    pub name: Name,
    /// The family index of `%name[index]`.
    pub index: Option<Expr>,
    pub dtype: Expr,
    pub dims: Vec<Expr>,
    pub input: Expr,
    pub key: KeyTemplate,
    pub layout: Option<String>,
    pub span: Span,
}

/// A checkpoint key: literal text and `{%var}` / `{NAME}` holes filled with compile-time integers (`{{` and
/// `}}` are literal braces).
#[derive(Clone, Debug, PartialEq)]
pub struct KeyTemplate {
    pub parts: Vec<KeyPart>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum KeyPart {
    Text(String),
    /// `{%l}`: a `static.for` variable (or any compile-time integer value in scope).
    Value(String),
    /// `{N}`: an integer template parameter.
    Word(String),
}

/// A written type: a scalar dtype, or `tile<SHAPE, DTYPE>` (SHAPE a list or a `shape` parameter).
#[derive(Clone, Debug, PartialEq)]
pub enum TypeExpr {
    Scalar(Expr),
    Tile {
        shape: Expr,
        dtype: Expr,
        span: Span,
    },
}

impl TypeExpr {
    pub fn span(&self) -> Span {
        match self {
            TypeExpr::Scalar(e) => e.span(),
            TypeExpr::Tile { span, .. } => *span,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Block {
    pub stmts: Vec<Stmt>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// `%a, %b = op` or a bare `op`; in stage bodies `%h[INDEX] = op` defines member INDEX of the family `%h`
    /// (`index` is then set and `results` is that one name).
    Let {
        results: Vec<Name>,
        index: Option<Expr>,
        op: Op,
        span: Span,
    },
    /// `yield a, b` (regions) or `return a, b` (kfunc bodies).
    Yield { values: Vec<Expr>, span: Span },
    /// Index notation `%out[i, j] = EXPR` (kernel and kfunc bodies): defines the new tile `%out` whose dims
    /// are the index variables `i, j`; desugared by the specializer.
    Index {
        out: Name,
        indices: Vec<Name>,
        expr: Expr,
        span: Span,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// `name a, b : T` (flat form).
    Simple {
        name: Name,
        operands: Vec<Expr>,
        annotation: Option<TypeExpr>,
        span: Span,
    },
    /// `call @kfunc<N = 4>(args)` or `call F(args)` (a `func` template parameter).
    Call {
        callee: Expr,
        targs: Vec<(Name, Expr)>,
        args: Vec<Expr>,
        span: Span,
    },
    If {
        cond: Expr,
        results: Vec<TypeExpr>,
        then_block: Block,
        else_block: Option<Block>,
        span: Span,
    },
    /// `static.match X { case A, B { ... } case C { ... } default { ... } }`: the first case one of whose
    /// compile-time values equals `X` is taken (in kernels and stages); no match and no `default` is an error.
    Match {
        scrutinee: Expr,
        results: Vec<TypeExpr>,
        cases: Vec<(Vec<Expr>, Block)>,
        default: Option<Block>,
        span: Span,
    },
    For {
        var: Name,
        lo: Expr,
        hi: Expr,
        step: Option<Expr>,
        iters: Vec<(Name, Expr, TypeExpr)>,
        results: Vec<TypeExpr>,
        body: Block,
        span: Span,
    },
    /// Stage bodies: `static.for %l = 0 to L { ... }`, the body repeated once per index (compile-time).
    StaticFor { header: StaticFor, body: Block },
    /// Stage bodies: `alloc f32[B * T, H]`.
    Alloc {
        dtype: Expr,
        dims: Vec<Expr>,
        span: Span,
    },
    /// Stage bodies: `dispatch @kernel<M = B * T>(%a, %b)`.
    Dispatch {
        kernel: Name,
        targs: Vec<(Name, Expr)>,
        args: Vec<Expr>,
        span: Span,
    },
}

impl Op {
    pub fn span(&self) -> Span {
        match self {
            Op::Simple { span, .. }
            | Op::Call { span, .. }
            | Op::If { span, .. }
            | Op::Match { span, .. }
            | Op::For { span, .. }
            | Op::Alloc { span, .. }
            | Op::Dispatch { span, .. } => *span,
            Op::StaticFor { header, .. } => header.span,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// `%x`
    Value(Name),
    /// `%buf[i, j]`: only as the first operand of `tile.load` / `tile.store`.
    Index {
        buf: Name,
        indices: Vec<Expr>,
        span: Span,
    },
    Int(i64, Span),
    Float(f64, Span),
    Str(String, Span),
    Bool(bool, Span),
    /// A template parameter or a dtype name.
    Word(Name),
    /// `@kfunc`
    Symbol(Name),
    /// `[a, b]`: a shape.
    List(Vec<Expr>, Span),
    /// Nested operation `op(a, b)` (also `cdiv`, `min`, `max` in constant expressions).
    Call {
        name: Name,
        args: Vec<Expr>,
        span: Span,
    },
    /// `a + b` etc.; `op` is one of `+ - * / %`.
    Binary {
        op: char,
        lhs: Box<Expr>,
        rhs: Box<Expr>,
        span: Span,
    },
    Neg(Box<Expr>, Span),
}

impl Expr {
    pub fn span(&self) -> Span {
        match self {
            Expr::Value(n) | Expr::Word(n) | Expr::Symbol(n) => n.span,
            Expr::Index { span, .. }
            | Expr::Int(_, span)
            | Expr::Float(_, span)
            | Expr::Str(_, span)
            | Expr::Bool(_, span)
            | Expr::List(_, span)
            | Expr::Call { span, .. }
            | Expr::Binary { span, .. }
            | Expr::Neg(_, span) => *span,
        }
    }
}
