//! Buffer access: index operands, `tile.load` and `tile.store`.

use super::*;

impl KernelBuilder<'_, '_> {
    /// The buffer and indices of an index operand; the indices' tile lengths make the access shape.
    pub(super) fn index(&mut self, e: &Expr) -> R<(u32, Vec<KOperand>, Vec<u32>)> {
        let Expr::Index { buf, indices, span } = e else {
            return Err(self.err(e.span(), "expected an index operand `%buf[i, ...]`"));
        };
        let SpecValue::Buf(p) = self.lookup(buf)? else {
            return Err(self.err(buf.span, format!("%{} is not a buffer parameter", buf.text)));
        };
        let rank = self.params.get(p as usize).map_or(0, |k| k.shape.len());
        if indices.len() != rank {
            return Err(self.err(
                *span,
                format!(
                    "%{} has {rank} dimension(s), {} indices given",
                    buf.text,
                    indices.len()
                ),
            ));
        }
        let mut out = Vec::new();
        let mut shape = Vec::new();
        for i in indices {
            match self.eval(i, "")? {
                SpecValue::Const(ConstValue::Int(v)) => {
                    out.push(KOperand::Imm(KImm::I64(v), DType::I64))
                }
                SpecValue::Dyn(o, KType::Scalar(DType::I64)) => out.push(o),
                SpecValue::Dyn(
                    o,
                    KType::Tile {
                        shape: s,
                        dtype: DType::I64,
                    },
                ) if s.len() == 1 => {
                    shape.push(s[0]);
                    out.push(o);
                }
                SpecValue::Dyn(_, t) => {
                    return Err(self.err(
                        i.span(),
                        format!("an index must be an i64 scalar or a 1-D i64 tile, found {t}"),
                    ));
                }
                _ => {
                    return Err(
                        self.err(i.span(), "an index must be an i64 scalar or a 1-D i64 tile")
                    );
                }
            }
        }
        Ok((p, out, shape))
    }

    pub(super) fn load(&mut self, ops: &[Expr], span: Span, name: &str) -> R<SpecValue> {
        self.nargs(ops, 1..=2, "tile.load", span)?;
        let (p, indices, shape) = self.index(&ops[0])?;
        let kp = self.params[p as usize].clone();
        if kp.access == Access::Write {
            return Err(self.err(
                ops[0].span(),
                format!("load from %{}, a write-only buffer", kp.name),
            ));
        }
        let dtype = if kp.dtype.is_quantized() {
            DType::F32
        } else {
            kp.dtype
        };
        let fill = match ops.get(1) {
            None => None,
            Some(f) => {
                let v = self.eval(f, "")?;
                Some(self.coerce(v, &KType::Scalar(dtype), f.span())?)
            }
        };
        let ty = if shape.is_empty() {
            KType::Scalar(dtype)
        } else {
            KType::Tile { shape, dtype }
        };
        self.emit1(
            name,
            KOpKind::Load {
                param: p,
                indices,
                fill,
            },
            ty,
            span,
        )
    }

    pub(super) fn store(&mut self, ops: &[Expr], span: Span) -> R<()> {
        self.nargs(ops, 2..=2, "tile.store", span)?;
        let (p, indices, shape) = self.index(&ops[0])?;
        let kp = self.params[p as usize].clone();
        if kp.access == Access::Read {
            return Err(self.err(
                ops[0].span(),
                format!("store to %{}, a read-only buffer", kp.name),
            ));
        }
        if kp.dtype.is_quantized() {
            return Err(self.err(
                ops[0].span(),
                format!("store to %{}, a quantized buffer", kp.name),
            ));
        }
        let want = if shape.is_empty() {
            KType::Scalar(kp.dtype)
        } else {
            KType::Tile {
                shape,
                dtype: kp.dtype,
            }
        };
        let v = self.eval(&ops[1], "")?;
        let value = match v {
            SpecValue::Dyn(_, ref t) if *t != want => {
                return Err(self.err(
                    ops[1].span(),
                    format!("the stored value is {t}, but the index gives {want}"),
                ));
            }
            v => self.coerce(v, &want, ops[1].span())?,
        };
        self.emit(
            KOpKind::Store {
                param: p,
                indices,
                value,
            },
            Vec::new(),
            span,
        )
    }
}
