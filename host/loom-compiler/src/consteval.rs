//! Compile-time expressions: template defaults and arguments, module constants.

use loom_syntax::ast::ConstExpr;
use loom_syntax::{Diagnostic, Span};

/// The value of a constant expression before it meets its expected kind.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum CValue {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    List(Vec<CValue>),
    /// A bare word (dtype names, or a template parameter the caller must resolve).
    Word(String),
    /// `@sym`
    Symbol(String),
}

/// Evaluates integer arithmetic with overflow checks; words and symbols are returned as such (only at the
/// top level: arithmetic over them is an error).
pub(crate) fn eval(e: &ConstExpr) -> Result<CValue, Diagnostic> {
    Ok(match e {
        ConstExpr::Int(v, _) => CValue::Int(*v),
        ConstExpr::Float(v, _) => CValue::Float(*v),
        ConstExpr::Bool(v, _) => CValue::Bool(*v),
        ConstExpr::Str(s, _) => CValue::Str(s.clone()),
        ConstExpr::List(items, _) => {
            CValue::List(items.iter().map(eval).collect::<Result<_, _>>()?)
        }
        ConstExpr::Word(n) => CValue::Word(n.text.clone()),
        ConstExpr::Symbol(n) => CValue::Symbol(n.text.clone()),
        ConstExpr::Neg(inner, span) => match eval(inner)? {
            CValue::Int(v) => CValue::Int(v.checked_neg().ok_or_else(|| overflow(*span))?),
            CValue::Float(v) => CValue::Float(-v),
            _ => {
                return Err(Diagnostic::error(
                    *span,
                    "only numbers can be negated in a constant expression",
                ));
            }
        },
        ConstExpr::Binary { op, lhs, rhs, span } => {
            let (a, b) = (eval(lhs)?, eval(rhs)?);
            match (a, b) {
                (CValue::Int(a), CValue::Int(b)) => {
                    let r = match op {
                        '+' => a.checked_add(b),
                        '-' => a.checked_sub(b),
                        '*' => a.checked_mul(b),
                        '/' if b == 0 => {
                            return Err(Diagnostic::error(
                                *span,
                                "division by zero in a constant expression",
                            ));
                        }
                        '/' => a.checked_div(b),
                        '%' if b == 0 => {
                            return Err(Diagnostic::error(
                                *span,
                                "division by zero in a constant expression",
                            ));
                        }
                        '%' => a.checked_rem(b),
                        _ => None,
                    };
                    CValue::Int(r.ok_or_else(|| overflow(*span))?)
                }
                (CValue::Float(a), CValue::Float(b)) => CValue::Float(match op {
                    '+' => a + b,
                    '-' => a - b,
                    '*' => a * b,
                    '/' => a / b,
                    _ => {
                        return Err(Diagnostic::error(
                            *span,
                            "`%` is only defined on integers here",
                        ));
                    }
                }),
                (CValue::Word(w), _) | (_, CValue::Word(w)) => {
                    return Err(Diagnostic::error(
                        *span,
                        format!(
                            "arithmetic over `{w}` is not supported in host templates: pass the parameter directly"
                        ),
                    ));
                }
                _ => {
                    return Err(Diagnostic::error(
                        *span,
                        "arithmetic needs two integers or two floats",
                    ));
                }
            }
        }
        ConstExpr::Error(span) => {
            return Err(Diagnostic::error(*span, "invalid constant expression"));
        }
    })
}

fn overflow(span: Span) -> Diagnostic {
    Diagnostic::error(span, "integer overflow in a constant expression")
}
