//! Expressions: evaluation, coercion, elementwise binary and unary operations with broadcasting, operand checks.

use super::*;

impl KernelBuilder<'_, '_> {
    /// Converts a value to an operand of type `want` (literals take the type; a constant scalar for a tile
    /// type becomes a `Full`; IR values must already have the type).
    pub(super) fn coerce(&mut self, v: SpecValue, want: &KType, span: Span) -> R<KOperand> {
        match (v, want) {
            (SpecValue::Dyn(o, t), want) if t == *want => Ok(o),
            (SpecValue::Dyn(_, t), want) => Err(self.err(span, format!("expected {want}, found {t} (no implicit conversions: use conv.* or tile.broadcast)"))),
            (SpecValue::Const(c), KType::Scalar(d)) => self.imm(&c, *d, span),
            (SpecValue::Const(c), KType::Tile { shape, dtype }) => {
                let value = self.imm(&c, *dtype, span)?;
                let SpecValue::Dyn(o, _) = self.emit1("full", KOpKind::Full { value, shape: shape.clone(), dtype: *dtype }, want.clone(), span)? else {
                    return Err(self.err(span, "internal: full"));
                };
                Ok(o)
            }
            _ => Err(self.err(span, format!("expected {want}, found a buffer"))),
        }
    }

    /// A literal as an immediate of dtype `d`.
    pub(super) fn imm(&self, c: &ConstValue, d: DType, span: Span) -> R<KOperand> {
        let imm = match (c, d) {
            (ConstValue::Bool(b), DType::I1) => KImm::I1(*b),
            (ConstValue::Int(v), d) if d.is_float() => KImm::F64(*v as f64),
            (ConstValue::Int(v), d) if is_int(d) => KImm::I64(*v),
            (ConstValue::Float(v), d) if d.is_float() => KImm::F64(*v),
            (c, d) => {
                return Err(self.err(
                    span,
                    format!("{} cannot be used as a value of type {d}", c.describe()),
                ));
            }
        };
        Ok(KOperand::Imm(imm, d))
    }

    // ---- expressions

    pub(super) fn eval(&mut self, e: &Expr, name: &str) -> R<SpecValue> {
        Ok(match e {
            Expr::Int(v, _) => SpecValue::Const(ConstValue::Int(*v)),
            Expr::Float(v, _) => SpecValue::Const(ConstValue::Float(*v)),
            Expr::Str(s, _) => SpecValue::Const(ConstValue::Str(s.clone())),
            Expr::Bool(b, _) => SpecValue::Const(ConstValue::Bool(*b)),
            Expr::Word(n) => match word_value(&n.text, &self.env) {
                Some(v) => SpecValue::Const(v),
                None => {
                    return Err(self.err(
                        n.span,
                        format!(
                            "unknown name `{}` (not a template parameter or dtype)",
                            n.text
                        ),
                    ));
                }
            },
            Expr::Symbol(n) => {
                let (m, f) = self
                    .sp
                    .resolve(self.cur.module, &n.text, DeviceKind::Kfunc)
                    .map_err(|m| self.err(n.span, m))?;
                SpecValue::Const(ConstValue::Func(m, f))
            }
            Expr::Value(n) => self.lookup(n)?,
            Expr::Index { span, .. } => {
                return Err(self.err(*span, "an index operand `%buf[...]` is only allowed as the first operand of tile.load / tile.store"));
            }
            Expr::List(items, _) => {
                let mut dims = Vec::new();
                for i in items {
                    match self.const_of(i)? {
                        ConstValue::Int(d) => dims.push(d),
                        other => {
                            return Err(self.err(
                                i.span(),
                                format!("shape dims must be integers, found {}", other.describe()),
                            ));
                        }
                    }
                }
                SpecValue::Const(ConstValue::Shape(dims))
            }
            Expr::Call {
                name: opn,
                args,
                span,
            } => match self.simple(&opn.text, args, None, *span, name)? {
                Some(v) => v,
                None => return Err(self.err(*span, format!("`{}` gives no value", opn.text))),
            },
            Expr::Binary { op, lhs, rhs, span } => {
                let a = self.eval(lhs, "")?;
                let b = self.eval(rhs, "")?;
                let bop = match op {
                    '+' => BinOp::Add,
                    '-' => BinOp::Sub,
                    '*' => BinOp::Mul,
                    '/' => BinOp::Div,
                    _ => BinOp::Rem,
                };
                self.binary(bop, a, b, *span, name)?
            }
            Expr::Neg(inner, span) => {
                let a = self.eval(inner, "")?;
                self.unary(UnOp::Neg, a, *span, name)?
            }
        })
    }

    pub(super) fn binary(
        &mut self,
        op: BinOp,
        a: SpecValue,
        b: SpecValue,
        span: Span,
        name: &str,
    ) -> R<SpecValue> {
        if let (SpecValue::Const(x), SpecValue::Const(y)) = (&a, &b) {
            let sym = match op {
                BinOp::Add => Some('+'),
                BinOp::Sub => Some('-'),
                BinOp::Mul => Some('*'),
                BinOp::Div => Some('/'),
                BinOp::Rem => Some('%'),
                _ => None,
            };
            if let Some(s) = sym {
                return fold_arith(s, x, y)
                    .map(SpecValue::Const)
                    .map_err(|m| self.err(span, m));
            }
            return match (op, x, y) {
                (BinOp::Min, ConstValue::Int(x), ConstValue::Int(y)) => {
                    Ok(SpecValue::Const(ConstValue::Int(*x.min(y))))
                }
                (BinOp::Max, ConstValue::Int(x), ConstValue::Int(y)) => {
                    Ok(SpecValue::Const(ConstValue::Int(*x.max(y))))
                }
                (BinOp::Min, ConstValue::Float(x), ConstValue::Float(y)) => {
                    Ok(SpecValue::Const(ConstValue::Float(x.min(*y))))
                }
                (BinOp::Max, ConstValue::Float(x), ConstValue::Float(y)) => {
                    Ok(SpecValue::Const(ConstValue::Float(x.max(*y))))
                }
                (BinOp::And, ConstValue::Bool(x), ConstValue::Bool(y)) => {
                    Ok(SpecValue::Const(ConstValue::Bool(*x && *y)))
                }
                (BinOp::Or, ConstValue::Bool(x), ConstValue::Bool(y)) => {
                    Ok(SpecValue::Const(ConstValue::Bool(*x || *y)))
                }
                _ => Err(self.err(
                    span,
                    format!(
                        "cannot fold {op:?} of {} and {}",
                        x.describe(),
                        y.describe()
                    ),
                )),
            };
        }
        let (a, b, ty) = self.operands2(a, b, span)?;
        let d = ty.dtype();
        let ok = match op {
            BinOp::And | BinOp::Or | BinOp::Xor => is_int(d) || d == DType::I1,
            BinOp::Shl | BinOp::Shr => is_int(d),
            _ => d.is_float() || is_int(d),
        };
        if !ok {
            return Err(self.err(span, format!("{op:?} is not defined on {d}")));
        }
        self.emit1(name, KOpKind::Binary { op, a, b }, ty, span)
    }

    /// Two elementwise operands: a literal takes the other's dtype; dtypes must match; a scalar broadcasts
    /// over a tile; two tiles of different shapes are broadcast (numpy rules) with explicit `Broadcast` ops.
    pub(super) fn operands2(
        &mut self,
        a: SpecValue,
        b: SpecValue,
        span: Span,
    ) -> R<(KOperand, KOperand, KType)> {
        let (ta, tb) = match (&a, &b) {
            (SpecValue::Dyn(_, t), SpecValue::Const(_)) => (t.clone(), KType::Scalar(t.dtype())),
            (SpecValue::Const(_), SpecValue::Dyn(_, t)) => (KType::Scalar(t.dtype()), t.clone()),
            (SpecValue::Dyn(_, x), SpecValue::Dyn(_, y)) => (x.clone(), y.clone()),
            _ => return Err(self.err(span, "expected scalar or tile operands")),
        };
        if ta.dtype() != tb.dtype() {
            return Err(self.err(
                span,
                format!(
                    "operand types differ: {ta} and {tb} (no implicit conversions: use conv.*)"
                ),
            ));
        }
        let oa = self.coerce(a, &ta, span)?;
        let ob = self.coerce(b, &tb, span)?;
        match (&ta, &tb) {
            (KType::Scalar(_), t) | (t, KType::Scalar(_)) => Ok((oa, ob, t.clone())),
            (KType::Tile { shape: sa, dtype }, KType::Tile { shape: sb, .. }) => {
                if sa == sb {
                    return Ok((oa, ob, ta.clone()));
                }
                let Some(out) = broadcast_shape(sa, sb) else {
                    return Err(self.err(
                        span,
                        format!(
                            "broadcasting mismatch: shapes {} and {} are not compatible",
                            shape_u32(sa),
                            shape_u32(sb)
                        ),
                    ));
                };
                let ty = KType::Tile {
                    shape: out.clone(),
                    dtype: *dtype,
                };
                let oa = if *sa == out {
                    oa
                } else {
                    self.bcast(oa, &out, *dtype, span)?
                };
                let ob = if *sb == out {
                    ob
                } else {
                    self.bcast(ob, &out, *dtype, span)?
                };
                Ok((oa, ob, ty))
            }
        }
    }

    pub(super) fn bcast(
        &mut self,
        a: KOperand,
        shape: &[u32],
        dtype: DType,
        span: Span,
    ) -> R<KOperand> {
        let ty = KType::Tile {
            shape: shape.to_vec(),
            dtype,
        };
        match self.emit1(
            "bcast",
            KOpKind::Broadcast {
                a,
                shape: shape.to_vec(),
            },
            ty,
            span,
        )? {
            SpecValue::Dyn(o, _) => Ok(o),
            _ => Err(self.err(span, "internal: broadcast")),
        }
    }

    pub(super) fn unary(&mut self, op: UnOp, a: SpecValue, span: Span, name: &str) -> R<SpecValue> {
        match (&op, &a) {
            (UnOp::Neg, SpecValue::Const(ConstValue::Int(v))) => {
                return v
                    .checked_neg()
                    .map(|v| SpecValue::Const(ConstValue::Int(v)))
                    .ok_or_else(|| self.err(span, "integer overflow"));
            }
            (UnOp::Neg, SpecValue::Const(ConstValue::Float(v))) => {
                return Ok(SpecValue::Const(ConstValue::Float(-v)));
            }
            (UnOp::Not, SpecValue::Const(ConstValue::Bool(b))) => {
                return Ok(SpecValue::Const(ConstValue::Bool(!b)));
            }
            _ => {}
        }
        let SpecValue::Dyn(o, ty) = a else {
            return Err(self.err(span, format!("{op:?} needs a scalar or tile value")));
        };
        let d = ty.dtype();
        let ok = match op {
            UnOp::Neg | UnOp::Abs => d.is_float() || is_int(d),
            UnOp::Not => is_int(d) || d == DType::I1,
            _ => d.is_float(),
        };
        if !ok {
            return Err(self.err(span, format!("{op:?} is not defined on {d}")));
        }
        self.emit1(name, KOpKind::Unary { op, a: o }, ty, span)
    }

    pub(super) fn dyn_operand(&mut self, e: &Expr) -> R<(KOperand, KType)> {
        match self.eval(e, "")? {
            SpecValue::Dyn(o, t) => Ok((o, t)),
            _ => Err(self.err(e.span(), "expected a scalar or tile value")),
        }
    }

    pub(super) fn axis(&mut self, e: &Expr, rank: usize) -> R<u8> {
        match self.const_of(e)? {
            ConstValue::Int(a) if a >= 0 && (a as usize) < rank => Ok(a as u8),
            other => Err(self.err(
                e.span(),
                format!("axis must be 0..{rank}, found {}", other.describe()),
            )),
        }
    }

    pub(super) fn nargs(
        &self,
        ops: &[Expr],
        n: std::ops::RangeInclusive<usize>,
        opn: &str,
        span: Span,
    ) -> R<()> {
        if n.contains(&ops.len()) {
            Ok(())
        } else {
            Err(self.err(
                span,
                format!(
                    "`{opn}` takes {} operand(s), found {}",
                    if n.start() == n.end() {
                        n.start().to_string()
                    } else {
                        format!("{} to {}", n.start(), n.end())
                    },
                    ops.len()
                ),
            ))
        }
    }
}
