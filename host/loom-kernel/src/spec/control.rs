//! Blocks and statements: `let`, `if` (compile-time or emitted), `static.match`, `for` and regions.

use super::*;

impl KernelBuilder<'_, '_> {
    pub(super) fn block(&mut self, b: &Block) -> R<Option<(Vec<SpecValue>, Span)>> {
        let n = b.stmts.len();
        for (i, s) in b.stmts.iter().enumerate() {
            match s {
                Stmt::Yield { values, span } => {
                    if i + 1 != n {
                        return Err(self.err(
                            *span,
                            "`yield`/`return` must be the last statement of its block",
                        ));
                    }
                    let mut vals = Vec::new();
                    for v in values {
                        vals.push(self.eval(v, "")?);
                    }
                    return Ok(Some((vals, *span)));
                }
                Stmt::Let {
                    results,
                    index,
                    op,
                    span,
                } => {
                    if let Some(i) = index {
                        return Err(self.err(
                                i.span(),
                                "an indexed definition `%name[INDEX]` defines a stage value, not a kernel value",
                            ));
                    }
                    let names: Vec<String> = results.iter().map(|n| n.text.clone()).collect();
                    let vals = self.op(op, &names)?;
                    if vals.len() != results.len() {
                        return Err(self.err(
                            *span,
                            format!(
                                "the operation gives {} result(s), {} named",
                                vals.len(),
                                results.len()
                            ),
                        ));
                    }
                    for (n, v) in results.iter().zip(vals) {
                        self.bind(n, v)?;
                    }
                }
                Stmt::Index {
                    out,
                    indices,
                    expr,
                    span,
                } => {
                    let v = self.index_notation(out, indices, expr, *span)?;
                    self.bind(out, v)?;
                }
            }
        }
        Ok(None)
    }

    /// Evaluates one statement's operation; `names` are its result names (IR values take them).
    pub(super) fn op(&mut self, op: &Op, names: &[String]) -> R<Vec<SpecValue>> {
        let name = names.first().map_or("", |n| n.as_str());
        match op {
            Op::Simple {
                name: opn,
                operands,
                annotation,
                span,
            } => {
                let v = self.simple(&opn.text, operands, annotation.as_ref(), *span, name)?;
                Ok(v.into_iter().collect())
            }
            Op::Call {
                callee,
                targs,
                args,
                span,
            } => self.call(callee, targs, args, *span),
            Op::If {
                cond,
                results,
                then_block,
                else_block,
                span,
            } => self.if_op(cond, results, then_block, else_block.as_ref(), *span, names),
            Op::Match {
                scrutinee,
                results,
                cases,
                default,
                span,
            } => {
                let blk = self.static_case(scrutinee, cases, default.as_ref(), *span)?;
                self.if_op(&Expr::Bool(true, *span), results, blk, None, *span, names)
            }
            Op::For {
                var,
                lo,
                hi,
                step,
                iters,
                results,
                body,
                span,
            } => self.for_op(
                var,
                lo,
                hi,
                step.as_ref(),
                iters,
                results,
                body,
                *span,
                names,
            ),
            Op::Alloc { span, .. } | Op::Dispatch { span, .. } => Err(self.err(
                *span,
                "`alloc` and `dispatch` are stage statements, not kernel operations",
            )),
            Op::StaticFor { header, .. } => Err(self.err(
                header.span,
                "`static.for` is a stage statement (kernels loop with `for`)",
            )),
        }
    }

    /// The block `static.match` takes: the first case with a value equal to the scrutinee (both compile-time
    /// constants of one kind), else `default`; neither is an error naming the value and every case.
    pub(super) fn static_case<'b>(
        &mut self,
        scrutinee: &Expr,
        cases: &'b [(Vec<Expr>, Block)],
        default: Option<&'b Block>,
        span: Span,
    ) -> R<&'b Block> {
        let x = self.const_of(scrutinee)?;
        let mut seen: Vec<ConstValue> = Vec::new();
        let mut chosen = None;
        for (values, blk) in cases {
            for e in values {
                let v = self.const_of(e)?;
                if std::mem::discriminant(&v) != std::mem::discriminant(&x) {
                    return Err(self.err(
                        e.span(),
                        format!(
                            "`static.match` on {}: this case is {}",
                            x.describe(),
                            v.describe()
                        ),
                    ));
                }
                if seen.contains(&v) {
                    return Err(self.err(
                        e.span(),
                        format!("{} is matched by an earlier case", v.describe()),
                    ));
                }
                if chosen.is_none() && v == x {
                    chosen = Some(blk);
                }
                seen.push(v);
            }
        }
        match chosen.or(default) {
            Some(b) => Ok(b),
            None => Err(self.err(
                span,
                format!(
                    "`static.match`: {} matches no case (cases: {}) and there is no `default`",
                    x.describe(),
                    seen.iter()
                        .map(ConstValue::describe)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        }
    }

    pub(super) fn if_op(
        &mut self,
        cond: &Expr,
        results: &[TypeExpr],
        then_b: &Block,
        else_b: Option<&Block>,
        span: Span,
        names: &[String],
    ) -> R<Vec<SpecValue>> {
        let nresults = names.len();
        let c = self.eval(cond, "")?;
        let tys: Vec<KType> = results.iter().map(|t| self.ktype(t)).collect::<R<_>>()?;
        match c {
            SpecValue::Const(ConstValue::Bool(b)) => {
                // folded: the taken branch runs in its own scope, its yield gives the results
                let chosen = if b { Some(then_b) } else { else_b };
                let Some(blk) = chosen else {
                    if nresults > 0 {
                        return Err(self.err(span, "an `if` with results needs an `else`"));
                    }
                    return Ok(Vec::new());
                };
                self.scopes.push(HashMap::new());
                let y = self.block(blk);
                self.scopes.pop();
                let vals = y?.map(|(v, _)| v).unwrap_or_default();
                if !tys.is_empty() {
                    if vals.len() != tys.len() {
                        return Err(self.err(
                            span,
                            format!(
                                "the branch yields {} values, {} declared",
                                vals.len(),
                                tys.len()
                            ),
                        ));
                    }
                    let mut out = Vec::new();
                    for (v, t) in vals.into_iter().zip(&tys) {
                        let o = self.coerce(v, t, span)?;
                        out.push(SpecValue::Dyn(o, t.clone()));
                    }
                    return Ok(out);
                }
                Ok(vals)
            }
            SpecValue::Dyn(o, KType::Scalar(DType::I1)) => {
                if !tys.is_empty() && else_b.is_none() {
                    return Err(self.err(span, "an `if` with results needs an `else`"));
                }
                let then_region = self.region(Some(then_b), &tys, span)?;
                let else_region = self.region(else_b, &tys, span)?;
                let mut res = Vec::new();
                let mut vals = Vec::new();
                for (i, t) in tys.iter().enumerate() {
                    let v =
                        self.new_value(names.get(i).map_or("if", |n| n.as_str()), t.clone(), span)?;
                    res.push(v);
                    vals.push(SpecValue::Dyn(KOperand::Value(v), t.clone()));
                }
                self.emit(
                    KOpKind::If {
                        cond: o,
                        then_region,
                        else_region,
                    },
                    res,
                    span,
                )?;
                Ok(vals)
            }
            SpecValue::Dyn(_, t) => Err(self.err(
                cond.span(),
                format!("an `if` condition must be an i1 scalar, found {t}"),
            )),
            SpecValue::Const(other) => Err(self.err(
                cond.span(),
                format!("an `if` condition must be i1, found {}", other.describe()),
            )),
            _ => Err(self.err(cond.span(), "an `if` condition must be i1")),
        }
    }

    /// A region from a block whose yield must match `tys`.
    pub(super) fn region(&mut self, b: Option<&Block>, tys: &[KType], span: Span) -> R<KRegion> {
        self.regions.push(Vec::new());
        self.scopes.push(HashMap::new());
        let y = match b {
            Some(b) => self.block(b),
            None => Ok(None),
        };
        self.scopes.pop();
        let y = y?;
        let (vals, yspan) = y.unwrap_or((Vec::new(), span));
        if vals.len() != tys.len() {
            return Err(self.err(
                yspan,
                format!(
                    "the region yields {} values, {} expected",
                    vals.len(),
                    tys.len()
                ),
            ));
        }
        let mut ops_out = Vec::new();
        for (v, t) in vals.into_iter().zip(tys) {
            ops_out.push(self.coerce(v, t, yspan)?);
        }
        let loc = self.loc(yspan);
        let mut ops = self.regions.pop().unwrap_or_default();
        ops.push(KOp {
            kind: KOpKind::Yield(ops_out),
            results: Vec::new(),
            loc,
        });
        Ok(KRegion { ops })
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn for_op(
        &mut self,
        var: &Name,
        lo: &Expr,
        hi: &Expr,
        step: Option<&Expr>,
        iters: &[(Name, Expr, TypeExpr)],
        results: &[TypeExpr],
        body: &Block,
        span: Span,
        names: &[String],
    ) -> R<Vec<SpecValue>> {
        let i64t = KType::Scalar(DType::I64);
        let lo = {
            let v = self.eval(lo, "")?;
            self.coerce(v, &i64t, lo.span())?
        };
        let hi = {
            let v = self.eval(hi, "")?;
            self.coerce(v, &i64t, hi.span())?
        };
        let step = match step {
            Some(s) => {
                let v = self.eval(s, "")?;
                if let SpecValue::Const(ConstValue::Int(n)) = &v {
                    if *n <= 0 {
                        return Err(self.err(s.span(), "a loop step must be positive"));
                    }
                }
                self.coerce(v, &i64t, s.span())?
            }
            None => KOperand::Imm(KImm::I64(1), DType::I64),
        };
        let mut tys = Vec::new();
        let mut inits = Vec::new();
        for (_, init, t) in iters {
            let ty = self.ktype(t)?;
            let v = self.eval(init, "")?;
            inits.push(self.coerce(v, &ty, init.span())?);
            tys.push(ty);
        }
        if !results.is_empty() {
            let rt: Vec<KType> = results.iter().map(|t| self.ktype(t)).collect::<R<_>>()?;
            if rt != tys {
                return Err(self.err(
                    span,
                    "a loop's result types must be its iteration values' types",
                ));
            }
        }
        let iv = self.new_value(&var.text, i64t.clone(), var.span)?;
        let mut iter_vals = Vec::new();
        self.scopes.push(HashMap::new());
        self.bind(var, SpecValue::Dyn(KOperand::Value(iv), i64t))?;
        for ((n, _, _), t) in iters.iter().zip(&tys) {
            let v = self.new_value(&n.text, t.clone(), n.span)?;
            iter_vals.push(v);
            self.bind(n, SpecValue::Dyn(KOperand::Value(v), t.clone()))?;
        }
        let r = self.region(Some(body), &tys, span);
        self.scopes.pop();
        let body = r?;
        let mut res = Vec::new();
        let mut out = Vec::new();
        for (i, t) in tys.iter().enumerate() {
            let v = self.new_value(names.get(i).map_or("for", |n| n.as_str()), t.clone(), span)?;
            res.push(v);
            out.push(SpecValue::Dyn(KOperand::Value(v), t.clone()));
        }
        self.emit(
            KOpKind::For {
                lo,
                hi,
                step,
                iv,
                iters: iter_vals,
                inits,
                body,
            },
            res,
            span,
        )?;
        Ok(out)
    }
}
