//! Index notation (`%out[i, j] = EXPR`, `docs/loom/kernels.md`), desugared into ordinary IR.
//!
//! A statement first gets a *scan*: every indexed tile `%a[i, k]` binds its index names to its dims (extents
//! must agree across the statement), the left's indices must each be used, and an index that is not on the
//! left must be under a reduction. Each index gets a position: the left's indices in order, then the others
//! in order of first use. Evaluation then gives every subexpression a value whose dims are a list of index
//! positions; binary operations align their operands (2-D transposes, `ExpandDims`, the ordinary numpy
//! broadcasting of `operands2`), reductions emit one `Reduce` per reduced index, and the contraction
//! `sum(X * Y)` over exactly one index shared by two f32 2-D tiles becomes one `Dot` (with the accumulator
//! when written `ACC + sum(X * Y)`).

use super::*;

/// What the scan learned about a statement's indices.
struct Scan {
    /// Index names by position: the left's first.
    order: Vec<String>,
    /// Extent of each index and the indexed tile that bound it (for diagnostics).
    ext: HashMap<String, (u32, String)>,
    /// How many indices the left has (positions `0..nleft`).
    nleft: usize,
}

impl Scan {
    fn pos(&self, n: &str) -> Option<usize> {
        self.order.iter().position(|o| o == n)
    }
    fn names(&self, idx: &[usize]) -> String {
        idx.iter()
            .map(|&i| self.order.get(i).map_or("?", |s| s.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A value during index-notation evaluation: `idx[d]` is the index position of the value's dim `d`.
/// Constants and scalars have no indices; a tile reduced over all its indices is a `[1]` tile without
/// indices.
struct IndexedValue {
    v: SpecValue,
    idx: Vec<usize>,
}

fn or<'a>(name: &'a str, default: &'a str) -> &'a str {
    if name.is_empty() { default } else { name }
}

fn leaf_text(buf: &Name, indices: &[Expr]) -> String {
    let ix: Vec<String> = indices
        .iter()
        .map(|e| match e {
            Expr::Word(n) => n.text.clone(),
            _ => "?".into(),
        })
        .collect();
    format!("%{}[{}]", buf.text, ix.join(", "))
}

/// `sum(X * Y)`: the two factors.
fn product(e: &Expr) -> Option<(&Expr, &Expr)> {
    match e {
        Expr::Binary {
            op: '*', lhs, rhs, ..
        } => Some((lhs, rhs)),
        Expr::Call { name, args, .. } if name.text == "mul" && args.len() == 2 => {
            Some((&args[0], &args[1]))
        }
        _ => None,
    }
}

/// `sum(X * Y)`: the sum's operand and span.
fn contraction(e: &Expr) -> Option<(&Expr, Span)> {
    match e {
        Expr::Call { name, args, span } if name.text == "sum" && args.len() == 1 => {
            product(&args[0]).map(|_| (&args[0], *span))
        }
        _ => None,
    }
}

fn reduce_op(name: &str) -> Option<ReduceOp> {
    Some(match name {
        "sum" => ReduceOp::Sum,
        "max" => ReduceOp::Max,
        "min" => ReduceOp::Min,
        _ => return None,
    })
}

impl KernelBuilder<'_, '_> {
    /// `%out[indices] = expr`: the value `%out` is bound to.
    pub(super) fn index_notation(
        &mut self,
        out: &Name,
        indices: &[Name],
        expr: &Expr,
        span: Span,
    ) -> R<SpecValue> {
        let mut st = Scan {
            order: Vec::new(),
            ext: HashMap::new(),
            nleft: indices.len(),
        };
        for n in indices {
            if st.order.contains(&n.text) {
                return Err(self.err(
                    n.span,
                    format!(
                        "index `{}` appears twice on the left (each index on the left is one dim of %{})",
                        n.text, out.text
                    ),
                ));
            }
            st.order.push(n.text.clone());
        }
        self.ix_scan(expr, false, &mut st)?;
        for n in indices {
            if !st.ext.contains_key(&n.text) {
                return Err(self.err(
                    n.span,
                    format!(
                        "index `{}` on the left is not used on the right, so its extent is unknown",
                        n.text
                    ),
                ));
            }
        }
        let r = self.ix_eval(expr, &st, &out.text)?;
        let target: Vec<usize> = (0..st.nleft).collect();
        if !matches!(r.v, SpecValue::Dyn(_, KType::Tile { .. })) || r.idx.is_empty() {
            return Err(self.err(span, "internal: index notation gave no indexed tile"));
        }
        self.ix_permute(&r, &target, span, &out.text, &st)
    }

    /// Binds index extents and checks the statement's index rules (see the module doc).
    fn ix_scan(&mut self, e: &Expr, reduced: bool, st: &mut Scan) -> R<()> {
        match e {
            Expr::Index { buf, indices, span } => {
                let ty = match self.lookup(buf)? {
                    SpecValue::Dyn(_, t @ KType::Tile { .. }) => t,
                    SpecValue::Buf(_) | SpecValue::Stage(_) => {
                        return Err(self.err(
                            buf.span,
                            format!(
                                "%{} is a buffer: index notation computes on tiles (tile.load it first)",
                                buf.text
                            ),
                        ));
                    }
                    SpecValue::Dyn(_, t) => {
                        return Err(self.err(
                            *span,
                            format!("%{} is {t}, not a tile: use it without indices", buf.text),
                        ));
                    }
                    SpecValue::Const(c) => {
                        return Err(self.err(
                            *span,
                            format!("%{} is {}, not a tile", buf.text, c.describe()),
                        ));
                    }
                };
                let KType::Tile { shape, .. } = &ty else {
                    return Err(self.err(*span, "internal: not a tile"));
                };
                if shape.len() != indices.len() {
                    return Err(self.err(
                        *span,
                        format!(
                            "%{} is {ty}: it takes {} indices, found {}",
                            buf.text,
                            shape.len(),
                            indices.len()
                        ),
                    ));
                }
                let here = leaf_text(buf, indices);
                let mut seen: Vec<&str> = Vec::new();
                for (ix, &d) in indices.iter().zip(shape) {
                    let Expr::Word(n) = ix else {
                        return Err(self.err(
                            ix.span(),
                            "expected an index name (a bare word such as `k`) in index notation",
                        ));
                    };
                    if seen.contains(&n.text.as_str()) {
                        return Err(self.err(
                            n.span,
                            format!(
                                "index `{}` appears twice in {here} (diagonals are not supported)",
                                n.text
                            ),
                        ));
                    }
                    seen.push(&n.text);
                    let on_left = st.pos(&n.text).is_some_and(|p| p < st.nleft);
                    if !on_left && !reduced {
                        return Err(self.err(
                            n.span,
                            format!(
                                "index `{}` is neither on the left nor under a reduction (sum, max, min)",
                                n.text
                            ),
                        ));
                    }
                    match st.ext.get(&n.text) {
                        Some((e, first)) if *e != d => {
                            return Err(self.err(
                                n.span,
                                format!(
                                    "extent mismatch for index `{}`: {e} in {first}, {d} in {here}",
                                    n.text
                                ),
                            ));
                        }
                        Some(_) => {}
                        None => {
                            st.ext.insert(n.text.clone(), (d, here.clone()));
                            if !on_left {
                                st.order.push(n.text.clone());
                            }
                        }
                    }
                }
                Ok(())
            }
            Expr::Value(n) => match self.lookup(n)? {
                SpecValue::Dyn(_, KType::Tile { .. }) => Err(self.err(
                    n.span,
                    format!(
                        "the tile %{} needs its indices in index notation (`%{}[i, ...]`)",
                        n.text, n.text
                    ),
                )),
                SpecValue::Buf(_) | SpecValue::Stage(_) => Err(self.err(
                    n.span,
                    format!("%{} is a buffer: index notation computes on tiles", n.text),
                )),
                _ => Ok(()),
            },
            Expr::Call { name, args, .. } => {
                let reduction = args.len() == 1 && reduce_op(&name.text).is_some();
                for a in args {
                    self.ix_scan(a, reduced || reduction, st)?;
                }
                Ok(())
            }
            Expr::Binary { lhs, rhs, .. } => {
                self.ix_scan(lhs, reduced, st)?;
                self.ix_scan(rhs, reduced, st)
            }
            Expr::Neg(inner, _) => self.ix_scan(inner, reduced, st),
            Expr::Int(..) | Expr::Float(..) | Expr::Word(_) => Ok(()),
            other => Err(self.err(other.span(), "not allowed in index notation")),
        }
    }

    fn ix_eval(&mut self, e: &Expr, st: &Scan, name: &str) -> R<IndexedValue> {
        match e {
            Expr::Index { buf, indices, span } => {
                let v = self.lookup(buf)?;
                let idx = indices
                    .iter()
                    .map(|i| match i {
                        Expr::Word(n) => st.pos(&n.text),
                        _ => None,
                    })
                    .collect::<Option<Vec<usize>>>()
                    .ok_or_else(|| {
                        self.err(*span, "internal: index not bound by the first pass (a bug)")
                    })?;
                Ok(IndexedValue { v, idx })
            }
            Expr::Value(_) | Expr::Int(..) | Expr::Float(..) | Expr::Word(_) => Ok(IndexedValue {
                v: self.eval(e, "")?,
                idx: Vec::new(),
            }),
            Expr::Neg(inner, span) => {
                let a = self.ix_eval(inner, st, "")?;
                let v = self.unary(UnOp::Neg, a.v, *span, or(name, "neg"))?;
                Ok(IndexedValue { v, idx: a.idx })
            }
            Expr::Binary { op, lhs, rhs, span } => {
                let bop = match op {
                    '+' => BinOp::Add,
                    '-' => BinOp::Sub,
                    '*' => BinOp::Mul,
                    '/' => BinOp::Div,
                    _ => BinOp::Rem,
                };
                self.ix_binary_expr(bop, lhs, rhs, *span, st, name)
            }
            Expr::Call {
                name: f,
                args,
                span,
            } => {
                let fname = f.text.as_str();
                match args.as_slice() {
                    [a] if reduce_op(fname).is_some() => {
                        let op = reduce_op(fname).unwrap_or(ReduceOp::Sum);
                        Ok(self.ix_reduce(op, fname, a, None, *span, st, name)?.0)
                    }
                    [a] if un_op(fname).is_some() => {
                        let op = un_op(fname).unwrap_or(UnOp::Neg);
                        let a = self.ix_eval(a, st, "")?;
                        let v = self.unary(op, a.v, *span, or(name, fname))?;
                        Ok(IndexedValue { v, idx: a.idx })
                    }
                    [a, b] if bin_op(fname).is_some() => {
                        let op = bin_op(fname).unwrap_or(BinOp::Add);
                        self.ix_binary_expr(op, a, b, *span, st, or(name, fname))
                    }
                    [a] if fname.starts_with("conv.") => {
                        let to = fname
                            .strip_prefix("conv.")
                            .and_then(DType::from_name)
                            .filter(|d| !d.is_quantized())
                            .ok_or_else(|| {
                                self.err(*span, format!("unknown conversion `{fname}`"))
                            })?;
                        let a = self.ix_eval(a, st, "")?;
                        let SpecValue::Dyn(o, ty) = a.v else {
                            return Err(self.err(*span, format!("`{fname}` needs a value")));
                        };
                        let rty = match ty {
                            KType::Scalar(_) => KType::Scalar(to),
                            KType::Tile { shape, .. } => KType::Tile { shape, dtype: to },
                        };
                        let v = self.emit1(or(name, "conv"), KOpKind::Cast { a: o, to }, rty, *span)?;
                        Ok(IndexedValue { v, idx: a.idx })
                    }
                    _ => Err(self.err(
                        *span,
                        format!(
                            "`{fname}` with {} operand(s) is not available in index notation (elementwise operations such as exp, max(a, b), conv.*, and the reductions sum, max, min of one operand are)",
                            args.len()
                        ),
                    )),
                }
            }
            other => Err(self.err(other.span(), "not allowed in index notation")),
        }
    }

    /// `lhs op rhs`; `ACC + sum(X * Y)` (either order) passes the accumulator to the contraction.
    fn ix_binary_expr(
        &mut self,
        op: BinOp,
        lhs: &Expr,
        rhs: &Expr,
        span: Span,
        st: &Scan,
        name: &str,
    ) -> R<IndexedValue> {
        if op == BinOp::Add {
            let fused = match (contraction(lhs), contraction(rhs)) {
                (_, Some((arg, s))) => Some((lhs, arg, s, true)),
                (Some((arg, s)), None) => Some((rhs, arg, s, false)),
                _ => None,
            };
            if let Some((acc_e, arg, s, acc_first)) = fused {
                let acc = self.ix_eval(acc_e, st, "")?;
                let (sum, used) =
                    self.ix_reduce(ReduceOp::Sum, "sum", arg, Some(&acc), s, st, name)?;
                if used {
                    return Ok(sum);
                }
                return if acc_first {
                    self.ix_bin(op, acc, sum, span, st, name)
                } else {
                    self.ix_bin(op, sum, acc, span, st, name)
                };
            }
        }
        let a = self.ix_eval(lhs, st, "")?;
        let b = self.ix_eval(rhs, st, "")?;
        self.ix_bin(op, a, b, span, st, name)
    }

    /// An elementwise binary operation on aligned operands.
    fn ix_bin(
        &mut self,
        op: BinOp,
        a: IndexedValue,
        b: IndexedValue,
        span: Span,
        st: &Scan,
        name: &str,
    ) -> R<IndexedValue> {
        if let (SpecValue::Dyn(_, ta), SpecValue::Dyn(_, tb)) = (&a.v, &b.v) {
            if ta.dtype() != tb.dtype() {
                return Err(self.err(
                    span,
                    format!(
                        "operand types differ: {ta} and {tb} (no implicit conversions: use conv.*)"
                    ),
                ));
            }
        }
        let within = |x: &[usize], y: &[usize]| y.iter().all(|i| x.contains(i));
        let target = if within(&a.idx, &b.idx) {
            a.idx.clone()
        } else if within(&b.idx, &a.idx) {
            b.idx.clone()
        } else {
            let mut u = a.idx.clone();
            u.extend(b.idx.iter().filter(|i| !a.idx.contains(i)));
            u.sort_unstable();
            u
        };
        let va = self.ix_align(a, &target, span, st)?;
        let vb = self.ix_align(b, &target, span, st)?;
        let dflt = format!("{op:?}").to_lowercase();
        let v = self.binary(op, va, vb, span, or(name, &dflt))?;
        Ok(IndexedValue { v, idx: target })
    }

    /// `op(arg)`: reduces the indices of `arg` that are not on the left. `sum(X * Y)` may become a `Dot`,
    /// which then takes `acc` when it fits (the second result says whether it was used).
    #[allow(clippy::too_many_arguments)]
    fn ix_reduce(
        &mut self,
        op: ReduceOp,
        opname: &str,
        arg: &Expr,
        acc: Option<&IndexedValue>,
        span: Span,
        st: &Scan,
        name: &str,
    ) -> R<(IndexedValue, bool)> {
        // why: with an unused accumulator the add after the reduction is the statement's value
        let own = if acc.is_some() { "" } else { name };
        if op == ReduceOp::Sum {
            if let Some((x, y)) = product(arg) {
                let xa = self.ix_eval(x, st, "")?;
                let yb = self.ix_eval(y, st, "")?;
                if let Some(r) = self.ix_dot(&xa, &yb, acc, span, st, name)? {
                    return Ok(r);
                }
                let prod = self.ix_bin(BinOp::Mul, xa, yb, arg.span(), st, "")?;
                return Ok((self.ix_reduce_iv(op, opname, prod, span, st, own)?, false));
            }
        }
        let a = self.ix_eval(arg, st, "")?;
        Ok((self.ix_reduce_iv(op, opname, a, span, st, own)?, false))
    }

    /// `sum(X * Y)` as a `Dot` when X and Y are f32 2-D tiles sharing exactly one index, which is reduced,
    /// and each has one index of the left.
    fn ix_dot(
        &mut self,
        x: &IndexedValue,
        y: &IndexedValue,
        acc: Option<&IndexedValue>,
        span: Span,
        st: &Scan,
        name: &str,
    ) -> R<Option<(IndexedValue, bool)>> {
        let f32_2d = |iv: &IndexedValue| {
            matches!(&iv.v, SpecValue::Dyn(_, KType::Tile { shape, dtype: DType::F32 }) if shape.len() == 2)
                && iv.idx.len() == 2
        };
        if !f32_2d(x) || !f32_2d(y) {
            return Ok(None);
        }
        let shared: Vec<usize> = x
            .idx
            .iter()
            .copied()
            .filter(|i| y.idx.contains(i))
            .collect();
        let [k] = shared[..] else {
            return Ok(None);
        };
        let other = |iv: &IndexedValue| iv.idx.iter().copied().find(|&i| i != k).unwrap_or(k);
        let (p, q) = (other(x), other(y));
        if k < st.nleft || p >= st.nleft || q >= st.nleft {
            return Ok(None);
        }
        // the operand holding the earlier left index is the dot's `a`: the result is then in left order
        let (first, second, a, b) = if p < q { (p, q, x, y) } else { (q, p, y, x) };
        let ext = |i: usize| {
            st.order
                .get(i)
                .and_then(|n| st.ext.get(n))
                .map_or(1, |e| e.0)
        };
        let rty_shape = vec![ext(first), ext(second)];
        let rty = KType::Tile {
            shape: rty_shape.clone(),
            dtype: DType::F32,
        };
        let out_idx = vec![first, second];
        let fits = acc.filter(|c| {
            c.idx.iter().all(|i| out_idx.contains(i))
                && match &c.v {
                    SpecValue::Dyn(_, t) => t.dtype() == DType::F32,
                    SpecValue::Const(ConstValue::Int(_) | ConstValue::Float(_)) => true,
                    _ => false,
                }
        });
        let av = self.ix_permute(a, &[first, k], span, "tr", st)?;
        let bv = self.ix_permute(b, &[k, second], span, "tr", st)?;
        let (acc_op, used) = match fits {
            Some(c) => {
                let c = IndexedValue {
                    v: c.v.clone(),
                    idx: c.idx.clone(),
                };
                let v = self.ix_align(c, &out_idx, span, st)?;
                let o = match v {
                    SpecValue::Dyn(o, t) if t == rty => o,
                    SpecValue::Dyn(o, t) => {
                        let _ = t;
                        self.bcast(o, &[ext(first), ext(second)], DType::F32, span)?
                    }
                    v => self.coerce(v, &rty, span)?,
                };
                (o, true)
            }
            None => {
                let SpecValue::Dyn(z, _) = self.emit1(
                    "zero",
                    KOpKind::Full {
                        value: KOperand::Imm(KImm::F64(0.0), DType::F32),
                        shape: rty_shape.clone(),
                        dtype: DType::F32,
                    },
                    rty.clone(),
                    span,
                )?
                else {
                    return Err(self.err(span, "internal: zero"));
                };
                (z, false)
            }
        };
        let (SpecValue::Dyn(a, _), SpecValue::Dyn(b, _)) = (av, bv) else {
            return Err(self.err(span, "internal: dot operands"));
        };
        let nm = if acc.is_some() && !used {
            "dot"
        } else {
            or(name, "dot")
        };
        let v = self.emit1(nm, KOpKind::Dot { a, b, acc: acc_op }, rty, span)?;
        Ok(Some((IndexedValue { v, idx: out_idx }, used)))
    }

    /// One `Reduce` per index of `a` that is not on the left (the last one named `name`).
    fn ix_reduce_iv(
        &mut self,
        op: ReduceOp,
        opname: &str,
        a: IndexedValue,
        span: Span,
        st: &Scan,
        name: &str,
    ) -> R<IndexedValue> {
        let axes: Vec<usize> = (0..a.idx.len()).filter(|&d| a.idx[d] >= st.nleft).collect();
        let SpecValue::Dyn(mut o, KType::Tile { mut shape, dtype }) = a.v else {
            return Err(self.err(
                span,
                format!("`{opname}(...)` reduces no index: its operand has no index"),
            ));
        };
        if a.idx.len() > usize::from(u8::MAX) {
            return Err(self.err(span, "index notation: too many indices in one value"));
        }
        if axes.is_empty() {
            return Err(self.err(
                span,
                format!(
                    "`{opname}(...)` reduces no index: its indices ({}) are all on the left (a reduction reduces the indices that are not on the left)",
                    st.names(&a.idx)
                ),
            ));
        }
        if op == ReduceOp::Sum && !(dtype.is_float() || is_int(dtype)) {
            return Err(self.err(span, format!("sum is not defined on {dtype}")));
        }
        let mut idx = a.idx;
        let n = axes.len();
        for (i, &axis) in axes.iter().rev().enumerate() {
            shape.remove(axis);
            idx.remove(axis);
            if shape.is_empty() {
                shape.push(1);
            }
            let ty = KType::Tile {
                shape: shape.clone(),
                dtype,
            };
            let nm = if i + 1 == n { or(name, opname) } else { opname };
            let SpecValue::Dyn(r, _) = self.emit1(
                nm,
                KOpKind::Reduce {
                    op,
                    a: o,
                    axis: axis as u8,
                },
                ty,
                span,
            )?
            else {
                return Err(self.err(span, "internal: reduce"));
            };
            o = r;
        }
        Ok(IndexedValue {
            v: SpecValue::Dyn(o, KType::Tile { shape, dtype }),
            idx,
        })
    }

    /// `iv` with dims in `target` order (a superset of its indices): transpose, then size-1 dims for the
    /// missing indices (the binary operation broadcasts them).
    fn ix_align(
        &mut self,
        iv: IndexedValue,
        target: &[usize],
        span: Span,
        st: &Scan,
    ) -> R<SpecValue> {
        if target.len() > usize::from(u8::MAX) {
            return Err(self.err(span, "index notation: too many indices in one value"));
        }
        let SpecValue::Dyn(o, KType::Tile { shape, dtype }) = &iv.v else {
            return Ok(iv.v);
        };
        if iv.idx.is_empty() {
            // a fully reduced `[1]` tile
            if target.len() <= shape.len() {
                return Ok(iv.v);
            }
            let s = vec![1; target.len()];
            return self.emit1(
                "reshape",
                KOpKind::Reshape {
                    a: o.clone(),
                    shape: s.clone(),
                },
                KType::Tile {
                    shape: s,
                    dtype: *dtype,
                },
                span,
            );
        }
        let sub: Vec<usize> = target
            .iter()
            .copied()
            .filter(|t| iv.idx.contains(t))
            .collect();
        let mut v = self.ix_permute(&iv, &sub, span, "tr", st)?;
        for (pos, t) in target.iter().enumerate() {
            if iv.idx.contains(t) {
                continue;
            }
            let SpecValue::Dyn(a, KType::Tile { shape, dtype }) = v else {
                return Err(self.err(span, "internal: align"));
            };
            let mut s = shape;
            s.insert(pos, 1);
            v = self.emit1(
                "xd",
                KOpKind::ExpandDims { a, axis: pos as u8 },
                KType::Tile { shape: s, dtype },
                span,
            )?;
        }
        Ok(v)
    }

    /// `iv` with its dims in `want` order (the same indices).
    fn ix_permute(
        &mut self,
        iv: &IndexedValue,
        want: &[usize],
        span: Span,
        name: &str,
        st: &Scan,
    ) -> R<SpecValue> {
        self.ix_permute_v(iv, want, span, name).map_err(|e| {
            if e.is_empty() {
                self.err(
                    span,
                    format!(
                        "index notation needs the indices ({}) in the order ({}), which takes a permutation of a {}-D tile; only 2-D transposes are available",
                        st.names(&iv.idx),
                        st.names(want),
                        iv.idx.len()
                    ),
                )
            } else {
                e
            }
        })
    }

    /// `ix_permute` without the names: an empty error means "not a 2-D transpose".
    fn ix_permute_v(
        &mut self,
        iv: &IndexedValue,
        want: &[usize],
        span: Span,
        name: &str,
    ) -> R<SpecValue> {
        if iv.idx == want {
            return Ok(iv.v.clone());
        }
        match (&iv.v, &iv.idx[..], want) {
            (SpecValue::Dyn(a, KType::Tile { shape, dtype }), &[x, y], &[p, q])
                if x == q && y == p && shape.len() == 2 =>
            {
                self.emit1(
                    name,
                    KOpKind::Transpose { a: a.clone() },
                    KType::Tile {
                        shape: vec![shape[1], shape[0]],
                        dtype: *dtype,
                    },
                    span,
                )
            }
            _ => Err(String::new()),
        }
    }
}
