//! The kernel being built: scopes, values, op emission and the evaluation of compile-time operands and types.

use super::*;

impl<'s, 'c> KernelBuilder<'s, 'c> {
    pub(super) fn new(
        sp: &'s mut Spec<'c>,
        cur: Rc<Parsed>,
        env: HashMap<String, ConstValue>,
    ) -> KernelBuilder<'s, 'c> {
        KernelBuilder {
            sp,
            cur,
            env,
            scopes: vec![HashMap::new()],
            values: Vec::new(),
            names: HashMap::new(),
            regions: Vec::new(),
            params: Vec::new(),
            inline_depth: 0,
            nops: 0,
            families: HashMap::new(),
            members: HashMap::new(),
            unrolled: 0,
        }
    }

    pub(super) fn err(&self, span: Span, msg: impl Into<String>) -> String {
        self.cur.src.error(span, msg)
    }

    pub(super) fn loc(&self, span: Span) -> Loc {
        // why the overlay location: it is the item's file position (the same one diagnostics show)
        let s = self.cur.src.location(span);
        let mut parts = s.rsplitn(3, ':');
        let col = parts.next().and_then(|c| c.parse().ok()).unwrap_or(0);
        let line = parts.next().and_then(|l| l.parse().ok()).unwrap_or(0);
        Loc { line, col }
    }

    pub(super) fn bind(&mut self, n: &Name, v: SpecValue) -> R<()> {
        let top = self.scopes.last_mut().ok_or("no scope")?;
        if top.contains_key(&n.text) {
            return Err(self.err(
                n.span,
                format!("%{} is defined twice (values are SSA)", n.text),
            ));
        }
        top.insert(n.text.clone(), v);
        Ok(())
    }

    pub(super) fn lookup(&self, n: &Name) -> R<SpecValue> {
        for s in self.scopes.iter().rev() {
            if let Some(v) = s.get(&n.text) {
                return Ok(v.clone());
            }
        }
        Err(self.err(n.span, format!("unknown value %{}", n.text)))
    }

    pub(super) fn new_value(&mut self, name: &str, ty: KType, span: Span) -> R<KValue> {
        if let KType::Tile { shape, .. } = &ty {
            if ty.elements() > MAX_TILE_ELEMENTS || shape.is_empty() {
                return Err(self.err(
                    span,
                    format!(
                        "tile too large: {ty} has {} elements, the limit is {MAX_TILE_ELEMENTS}",
                        ty.elements()
                    ),
                ));
            }
        }
        let base = if name.is_empty() { "t" } else { name };
        let n = self.names.entry(base.to_string()).or_insert(0);
        let unique = if *n == 0 {
            base.to_string()
        } else {
            format!("{base}_{n}")
        };
        *n += 1;
        let id = KValue(self.values.len() as u32);
        self.values.push(KValueDef { name: unique, ty });
        Ok(id)
    }

    pub(super) fn emit(&mut self, kind: KOpKind, results: Vec<KValue>, span: Span) -> R<()> {
        self.nops += 1;
        if self.nops > MAX_KERNEL_OPS {
            return Err(self.err(
                span,
                format!("the kernel has more than {MAX_KERNEL_OPS} operations after inlining"),
            ));
        }
        let loc = self.loc(span);
        match self.regions.last_mut() {
            Some(r) => {
                r.push(KOp { kind, results, loc });
                Ok(())
            }
            None => Err(self.err(span, "operations are not allowed here")),
        }
    }

    /// Emits an op with one result of type `ty`.
    pub(super) fn emit1(
        &mut self,
        name: &str,
        kind: KOpKind,
        ty: KType,
        span: Span,
    ) -> R<SpecValue> {
        let v = self.new_value(name, ty.clone(), span)?;
        self.emit(kind, vec![v], span)?;
        Ok(SpecValue::Dyn(KOperand::Value(v), ty))
    }

    pub(super) fn const_of(&mut self, e: &Expr) -> R<ConstValue> {
        match self.eval(e, "")? {
            SpecValue::Const(c) => Ok(c),
            _ => Err(self.err(e.span(), "expected a compile-time constant")),
        }
    }

    pub(super) fn dtype_of(&mut self, e: &Expr) -> R<DType> {
        match self.eval(e, "")? {
            SpecValue::Const(ConstValue::DType(d)) => Ok(d),
            SpecValue::Const(other) => Err(self.err(
                e.span(),
                format!("expected an element type, found {}", other.describe()),
            )),
            _ => Err(self.err(e.span(), "expected an element type")),
        }
    }

    pub(super) fn dims_of(&mut self, dims: &[Expr]) -> R<Vec<u64>> {
        let mut out = Vec::new();
        for d in dims {
            match self.const_of(d)? {
                ConstValue::Int(v) if v >= 0 => out.push(v as u64),
                other => {
                    return Err(self.err(
                        d.span(),
                        format!(
                            "a dimension must be a non-negative integer, found {}",
                            other.describe()
                        ),
                    ));
                }
            }
        }
        Ok(out)
    }

    pub(super) fn buffer_type(&mut self, dtype: &Expr, dims: &[Expr]) -> R<(DType, Vec<u64>)> {
        let d = self.dtype_of(dtype)?;
        let shape = self.dims_of(dims)?;
        if d.bytes_for(&shape).is_none() {
            return Err(self.err(dtype.span(), format!("{d}{shape:?} is not a valid buffer (size overflow, or a quantized last dim that is not whole blocks)")));
        }
        Ok((d, shape))
    }

    pub(super) fn shape_of(&mut self, e: &Expr) -> R<Vec<u32>> {
        match self.const_of(e)? {
            ConstValue::Shape(s) => s
                .iter()
                .map(|&d| u32::try_from(d).ok().filter(|&d| d > 0))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| {
                    self.err(e.span(), format!("tile dims must be positive, found {s:?}"))
                }),
            ConstValue::Int(v) if v > 0 && v <= u32::MAX as i64 => Ok(vec![v as u32]),
            other => Err(self.err(
                e.span(),
                format!(
                    "expected a shape such as [4, 8], found {}",
                    other.describe()
                ),
            )),
        }
    }

    pub(super) fn ktype(&mut self, t: &TypeExpr) -> R<KType> {
        match t {
            TypeExpr::Scalar(d) => Ok(KType::Scalar(self.dtype_of(d)?)),
            TypeExpr::Tile { shape, dtype, span } => {
                let shape = self.shape_of(shape)?;
                let dtype = self.dtype_of(dtype)?;
                let ty = KType::Tile { shape, dtype };
                if ty.elements() > MAX_TILE_ELEMENTS {
                    return Err(self.err(*span, format!("tile too large: {ty} has {} elements, the limit is {MAX_TILE_ELEMENTS}", ty.elements())));
                }
                Ok(ty)
            }
        }
    }
}
