//! Tile operations: `tile.range`, `tile.full`/`tile.zeros`, shape changes, reductions and `tile.dot`.

use super::*;

impl KernelBuilder<'_, '_> {
    /// `tile.range(start, LEN)`: a 1-D i64 tile of consecutive values.
    pub(super) fn tile_range(
        &mut self,
        opn: &str,
        ops: &[Expr],
        span: Span,
        vname: &str,
    ) -> R<Option<SpecValue>> {
        self.nargs(ops, 2..=2, opn, span)?;
        let s = self.eval(&ops[0], "")?;
        let start = self.coerce(s, &KType::Scalar(DType::I64), ops[0].span())?;
        let len = match self.const_of(&ops[1])? {
            ConstValue::Int(l) if l > 0 && l <= u32::MAX as i64 => l as u32,
            other => {
                return Err(self.err(
                    ops[1].span(),
                    format!(
                        "a range length must be a positive constant, found {}",
                        other.describe()
                    ),
                ));
            }
        };
        let ty = KType::Tile {
            shape: vec![len],
            dtype: DType::I64,
        };
        self.emit1(vname, KOpKind::Range { start, len }, ty, span)
            .map(Some)
    }

    /// `tile.full(v)` / `tile.zeros()`: a tile of the annotated type filled with one value.
    pub(super) fn tile_full(
        &mut self,
        opn: &str,
        ops: &[Expr],
        ann: Option<&TypeExpr>,
        span: Span,
        vname: &str,
    ) -> R<Option<SpecValue>> {
        let Some(ann) = ann else {
            return Err(self.err(
                span,
                format!("`{opn}` needs a type annotation `: tile<[dims], dtype>`"),
            ));
        };
        let ty = self.ktype(ann)?;
        let KType::Tile { shape, dtype } = ty.clone() else {
            return Err(self.err(ann.span(), "the annotation must be a tile type"));
        };
        let value = if opn == "tile.zeros" {
            self.nargs(ops, 0..=0, opn, span)?;
            self.imm(&ConstValue::Int(0), dtype, span)
                .or_else(|_| self.imm(&ConstValue::Bool(false), dtype, span))?
        } else {
            self.nargs(ops, 1..=1, opn, span)?;
            let v = self.eval(&ops[0], "")?;
            self.coerce(v, &KType::Scalar(dtype), ops[0].span())?
        };
        self.emit1(
            vname,
            KOpKind::Full {
                value,
                shape,
                dtype,
            },
            ty,
            span,
        )
        .map(Some)
    }

    /// `tile.broadcast(a, SHAPE)`: numpy broadcasting to a shape.
    pub(super) fn tile_broadcast(
        &mut self,
        opn: &str,
        ops: &[Expr],
        span: Span,
        vname: &str,
    ) -> R<Option<SpecValue>> {
        self.nargs(ops, 2..=2, opn, span)?;
        let (a, ty) = self.dyn_operand(&ops[0])?;
        let shape = self.shape_of(&ops[1])?;
        let from = match &ty {
            KType::Scalar(_) => vec![],
            KType::Tile { shape, .. } => shape.clone(),
        };
        if broadcast_shape(&from, &shape).as_deref() != Some(&shape[..]) {
            return Err(self.err(
                span,
                format!(
                    "broadcasting mismatch: {ty} does not broadcast to {}",
                    shape_u32(&shape)
                ),
            ));
        }
        let rty = KType::Tile {
            shape: shape.clone(),
            dtype: ty.dtype(),
        };
        self.emit1(vname, KOpKind::Broadcast { a, shape }, rty, span)
            .map(Some)
    }

    /// `tile.expand_dims(a, AXIS)`: a size-1 dim inserted.
    pub(super) fn tile_expand_dims(
        &mut self,
        opn: &str,
        ops: &[Expr],
        span: Span,
        vname: &str,
    ) -> R<Option<SpecValue>> {
        self.nargs(ops, 2..=2, opn, span)?;
        let (a, ty) = self.dyn_operand(&ops[0])?;
        let KType::Tile { shape, dtype } = ty else {
            return Err(self.err(ops[0].span(), "tile.expand_dims needs a tile"));
        };
        let axis = self.axis(&ops[1], shape.len() + 1)?;
        let mut s = shape.clone();
        s.insert(axis as usize, 1);
        self.emit1(
            vname,
            KOpKind::ExpandDims { a, axis },
            KType::Tile { shape: s, dtype },
            span,
        )
        .map(Some)
    }

    /// `tile.reshape(a, SHAPE)`: the same elements in another shape.
    pub(super) fn tile_reshape(
        &mut self,
        opn: &str,
        ops: &[Expr],
        span: Span,
        vname: &str,
    ) -> R<Option<SpecValue>> {
        self.nargs(ops, 2..=2, opn, span)?;
        let (a, ty) = self.dyn_operand(&ops[0])?;
        let shape = self.shape_of(&ops[1])?;
        let n: u64 = shape.iter().map(|&d| d as u64).product();
        if !matches!(ty, KType::Tile { .. }) || n != ty.elements() {
            return Err(self.err(
                span,
                format!(
                    "cannot reshape {ty} to {}: element counts differ",
                    shape_u32(&shape)
                ),
            ));
        }
        let rty = KType::Tile {
            shape: shape.clone(),
            dtype: ty.dtype(),
        };
        self.emit1(vname, KOpKind::Reshape { a, shape }, rty, span)
            .map(Some)
    }

    /// `tile.transpose(a)` of a 2-D tile.
    pub(super) fn tile_transpose(
        &mut self,
        opn: &str,
        ops: &[Expr],
        span: Span,
        vname: &str,
    ) -> R<Option<SpecValue>> {
        self.nargs(ops, 1..=1, opn, span)?;
        let (a, ty) = self.dyn_operand(&ops[0])?;
        let KType::Tile { shape, dtype } = ty else {
            return Err(self.err(span, "tile.transpose needs a 2-D tile"));
        };
        let [r, c] = shape[..] else {
            return Err(self.err(
                span,
                format!(
                    "tile.transpose needs a 2-D tile, found {}",
                    shape_u32(&shape)
                ),
            ));
        };
        self.emit1(
            vname,
            KOpKind::Transpose { a },
            KType::Tile {
                shape: vec![c, r],
                dtype,
            },
            span,
        )
        .map(Some)
    }

    /// `tile.sum` / `tile.max` / `tile.min` along an axis.
    pub(super) fn tile_reduce(
        &mut self,
        opn: &str,
        ops: &[Expr],
        span: Span,
        vname: &str,
    ) -> R<Option<SpecValue>> {
        self.nargs(ops, 2..=2, opn, span)?;
        let (a, ty) = self.dyn_operand(&ops[0])?;
        let KType::Tile { shape, dtype } = ty else {
            return Err(self.err(span, format!("`{opn}` needs a tile")));
        };
        if opn == "tile.sum" && !(dtype.is_float() || is_int(dtype)) {
            return Err(self.err(span, format!("tile.sum is not defined on {dtype}")));
        }
        let axis = self.axis(&ops[1], shape.len())?;
        let mut s = shape.clone();
        s.remove(axis as usize);
        if s.is_empty() {
            s.push(1);
        }
        let op = match opn {
            "tile.sum" => ReduceOp::Sum,
            "tile.max" => ReduceOp::Max,
            _ => ReduceOp::Min,
        };
        self.emit1(
            vname,
            KOpKind::Reduce { op, a, axis },
            KType::Tile { shape: s, dtype },
            span,
        )
        .map(Some)
    }

    /// `tile.dot(a, b, acc)`: a matrix product of two float tiles accumulated in f32.
    pub(super) fn tile_dot(
        &mut self,
        opn: &str,
        ops: &[Expr],
        span: Span,
        vname: &str,
    ) -> R<Option<SpecValue>> {
        self.nargs(ops, 3..=3, opn, span)?;
        let (a, ta) = self.dyn_operand(&ops[0])?;
        let (b, tb) = self.dyn_operand(&ops[1])?;
        let acc = self.eval(&ops[2], "")?;
        let (
            KType::Tile {
                shape: sa,
                dtype: da,
            },
            KType::Tile {
                shape: sb,
                dtype: db,
            },
        ) = (&ta, &tb)
        else {
            return Err(self.err(span, "tile.dot needs 2-D tiles"));
        };
        let (&[m, k1], &[k2, n]) = (&sa[..], &sb[..]) else {
            return Err(self.err(
                span,
                format!("tile.dot needs 2-D tiles, found {ta} and {tb}"),
            ));
        };
        if k1 != k2 {
            return Err(self.err(
                span,
                format!("dot shape mismatch: {ta} times {tb} (inner dims {k1} and {k2} differ)"),
            ));
        }
        if da != db || !da.is_float() {
            return Err(self.err(
                span,
                format!("tile.dot needs two float tiles of one dtype, found {ta} and {tb}"),
            ));
        }
        let rty = KType::Tile {
            shape: vec![m, n],
            dtype: DType::F32,
        };
        let acc = match acc {
            SpecValue::Dyn(_, ref t) if *t != rty => {
                return Err(self.err(
                    ops[2].span(),
                    format!("dot shape mismatch: the accumulator is {t}, {rty} expected"),
                ));
            }
            v => self.coerce(v, &rty, ops[2].span())?,
        };
        self.emit1(vname, KOpKind::Dot { a, b, acc }, rty, span)
            .map(Some)
    }
}
