//! Flat and nested operations: the dispatch by operation name, and the non-tile operations (compares,
//! conversions, compile-time `cdiv` and `str.eq`, `program_id`, `select`).

use super::*;

impl KernelBuilder<'_, '_> {
    /// A flat or nested operation; `None` for ops without a result (`tile.store`).
    pub(super) fn simple(
        &mut self,
        opn: &str,
        ops: &[Expr],
        ann: Option<&TypeExpr>,
        span: Span,
        name: &str,
    ) -> R<Option<SpecValue>> {
        let short = opn.rsplit('.').next().unwrap_or(opn);
        let vname = if name.is_empty() { short } else { name };
        if ann.is_some() && !matches!(opn, "tile.full" | "tile.zeros") {
            return Err(self.err(span, format!("`{opn}` takes no type annotation")));
        }
        if let Some(op) = bin_op(opn) {
            self.nargs(ops, 2..=2, opn, span)?;
            let a = self.eval(&ops[0], "")?;
            let b = self.eval(&ops[1], "")?;
            return self.binary(op, a, b, span, vname).map(Some);
        }
        if let Some(op) = un_op(opn) {
            self.nargs(ops, 1..=1, opn, span)?;
            let a = self.eval(&ops[0], "")?;
            return self.unary(op, a, span, vname).map(Some);
        }
        if let Some(c) = opn.strip_prefix("cmp.") {
            return self.compare(c, opn, ops, span, vname);
        }
        if let Some(to) = opn.strip_prefix("conv.") {
            return self.convert(to, opn, ops, span, vname);
        }
        match opn {
            "copy" => {
                self.nargs(ops, 1..=1, opn, span)?;
                self.eval(&ops[0], name).map(Some)
            }
            "cdiv" => self.cdiv(opn, ops, span),
            "str.eq" => self.const_str_eq(opn, ops, span),
            "program_id" => self.program_id(opn, ops, span, vname),
            "tile.range" => self.tile_range(opn, ops, span, vname),
            "tile.full" | "tile.zeros" => self.tile_full(opn, ops, ann, span, vname),
            "tile.broadcast" => self.tile_broadcast(opn, ops, span, vname),
            "tile.expand_dims" => self.tile_expand_dims(opn, ops, span, vname),
            "tile.reshape" => self.tile_reshape(opn, ops, span, vname),
            "tile.transpose" => self.tile_transpose(opn, ops, span, vname),
            "tile.sum" | "tile.max" | "tile.min" => self.tile_reduce(opn, ops, span, vname),
            "tile.dot" => self.tile_dot(opn, ops, span, vname),
            "select" => self.select(opn, ops, span, vname),
            "tile.load" => self.load(ops, span, vname).map(Some),
            "tile.store" => {
                self.store(ops, span)?;
                Ok(None)
            }
            _ => Err(self.err(span, format!("unknown kernel operation `{opn}`"))),
        }
    }

    /// `cdiv`: ceiling division of two compile-time integers.
    pub(super) fn cdiv(&mut self, opn: &str, ops: &[Expr], span: Span) -> R<Option<SpecValue>> {
        self.nargs(ops, 2..=2, opn, span)?;
        let a = self.const_of(&ops[0])?;
        let b = self.const_of(&ops[1])?;
        match (a, b) {
            (ConstValue::Int(a), ConstValue::Int(b)) if b > 0 && a >= 0 => Ok(Some(
                SpecValue::Const(ConstValue::Int(a / b + i64::from(a % b != 0))),
            )),
            (a, b) => Err(self.err(
                span,
                format!(
                    "cdiv needs a non-negative and a positive integer, found {} and {}",
                    a.describe(),
                    b.describe()
                ),
            )),
        }
    }

    /// `str.eq`: equality of two compile-time strings.
    pub(super) fn const_str_eq(
        &mut self,
        opn: &str,
        ops: &[Expr],
        span: Span,
    ) -> R<Option<SpecValue>> {
        self.nargs(ops, 2..=2, opn, span)?;
        match (self.const_of(&ops[0])?, self.const_of(&ops[1])?) {
            (ConstValue::Str(a), ConstValue::Str(b)) => {
                Ok(Some(SpecValue::Const(ConstValue::Bool(a == b))))
            }
            (a, b) => Err(self.err(
                span,
                format!(
                    "str.eq compares two strings, found {} and {}",
                    a.describe(),
                    b.describe()
                ),
            )),
        }
    }

    /// `program_id(axis)`: the program instance's index along a grid axis.
    pub(super) fn program_id(
        &mut self,
        opn: &str,
        ops: &[Expr],
        span: Span,
        vname: &str,
    ) -> R<Option<SpecValue>> {
        self.nargs(ops, 1..=1, opn, span)?;
        let axis = self.axis(&ops[0], 3)?;
        self.emit1(
            vname,
            KOpKind::ProgramId { axis },
            KType::Scalar(DType::I64),
            span,
        )
        .map(Some)
    }

    /// `select(c, a, b)`: folded on a compile-time condition, else elementwise.
    pub(super) fn select(
        &mut self,
        opn: &str,
        ops: &[Expr],
        span: Span,
        vname: &str,
    ) -> R<Option<SpecValue>> {
        self.nargs(ops, 3..=3, opn, span)?;
        let c = self.eval(&ops[0], "")?;
        let a = self.eval(&ops[1], "")?;
        let b = self.eval(&ops[2], "")?;
        if let SpecValue::Const(ConstValue::Bool(c)) = c {
            return Ok(Some(if c { a } else { b }));
        }
        let (a, b, ty) = self.operands2(a, b, span)?;
        let SpecValue::Dyn(cond, ct) = c else {
            return Err(self.err(ops[0].span(), "select needs an i1 condition"));
        };
        let ok = ct.dtype() == DType::I1
            && match (&ct, &ty) {
                (KType::Scalar(_), _) => true,
                (KType::Tile { shape: x, .. }, KType::Tile { shape: y, .. }) => x == y,
                _ => false,
            };
        if !ok {
            return Err(self.err(
                ops[0].span(),
                format!("select's condition {ct} does not fit its values {ty}"),
            ));
        }
        self.emit1(vname, KOpKind::Select { cond, a, b }, ty, span)
            .map(Some)
    }

    /// `cmp.*`: folded on two compile-time integers, else an elementwise compare into `i1`.
    pub(super) fn compare(
        &mut self,
        c: &str,
        opn: &str,
        ops: &[Expr],
        span: Span,
        vname: &str,
    ) -> R<Option<SpecValue>> {
        let op = match c {
            "eq" => CmpOp::Eq,
            "ne" => CmpOp::Ne,
            "lt" => CmpOp::Lt,
            "le" => CmpOp::Le,
            "gt" => CmpOp::Gt,
            "ge" => CmpOp::Ge,
            _ => return Err(self.err(span, format!("unknown comparison `{opn}`"))),
        };
        self.nargs(ops, 2..=2, opn, span)?;
        let a = self.eval(&ops[0], "")?;
        let b = self.eval(&ops[1], "")?;
        if let (SpecValue::Const(ConstValue::Int(x)), SpecValue::Const(ConstValue::Int(y))) =
            (&a, &b)
        {
            let r = match op {
                CmpOp::Eq => x == y,
                CmpOp::Ne => x != y,
                CmpOp::Lt => x < y,
                CmpOp::Le => x <= y,
                CmpOp::Gt => x > y,
                CmpOp::Ge => x >= y,
            };
            return Ok(Some(SpecValue::Const(ConstValue::Bool(r))));
        }
        let (a, b, ty) = self.operands2(a, b, span)?;
        let rty = match ty {
            KType::Scalar(_) => KType::Scalar(DType::I1),
            KType::Tile { shape, .. } => KType::Tile {
                shape,
                dtype: DType::I1,
            },
        };
        self.emit1(vname, KOpKind::Cmp { op, a, b }, rty, span)
            .map(Some)
    }

    /// `conv.DTYPE`: an elementwise conversion.
    pub(super) fn convert(
        &mut self,
        to: &str,
        opn: &str,
        ops: &[Expr],
        span: Span,
        vname: &str,
    ) -> R<Option<SpecValue>> {
        let Some(to) = DType::from_name(to).filter(|d| !d.is_quantized()) else {
            return Err(self.err(span, format!("unknown conversion `{opn}`")));
        };
        self.nargs(ops, 1..=1, opn, span)?;
        let (a, ty) = self.dyn_operand(&ops[0])?;
        let rty = match ty {
            KType::Scalar(_) => KType::Scalar(to),
            KType::Tile { shape, .. } => KType::Tile { shape, dtype: to },
        };
        self.emit1(vname, KOpKind::Cast { a, to }, rty, span)
            .map(Some)
    }
}
