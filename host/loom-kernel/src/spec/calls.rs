//! kfunc calls, inlined into the calling kernel.

use super::*;

impl KernelBuilder<'_, '_> {
    /// Inlines a kfunc call.
    pub(super) fn call(
        &mut self,
        callee: &Expr,
        targs: &[(Name, Expr)],
        args: &[Expr],
        span: Span,
    ) -> R<Vec<SpecValue>> {
        let (m, fname) = match self.eval(callee, "")? {
            SpecValue::Const(ConstValue::Func(m, f)) => (m, f),
            _ => {
                return Err(self.err(
                    callee.span(),
                    "`call` needs a kfunc (@name) or a func template parameter",
                ));
            }
        };
        if self.inline_depth >= MAX_INLINE_DEPTH {
            return Err(self.err(
                span,
                format!("kfunc calls nest deeper than {MAX_INLINE_DEPTH} (recursive kfunc?)"),
            ));
        }
        let p = self.sp.item(m, &fname).map_err(|e| e.join(""))?;
        let Header::Kfunc { params, results } = &p.item.header else {
            return Err(self.err(
                callee.span(),
                format!("@{fname} is a {}, not a kfunc", p.item.kind.keyword()),
            ));
        };
        if params.len() != args.len() {
            return Err(self.err(
                span,
                format!(
                    "@{fname} takes {} argument(s), {} given",
                    params.len(),
                    args.len()
                ),
            ));
        }
        let mut given = Vec::new();
        for (n, e) in targs {
            let v = self.const_of(e)?;
            given.push((n.text.clone(), v, n.span));
        }
        let mut argv = Vec::new();
        for a in args {
            argv.push(self.eval(a, "")?);
        }
        // infer unbound shape/dtype parameters from the argument types: `tile<S, T>` against a tile
        for ((_, pt), a) in params.iter().zip(&argv) {
            let SpecValue::Dyn(_, at) = a else { continue };
            let (shape_e, dtype_e) = match pt {
                TypeExpr::Tile { shape, dtype, .. } => (Some(shape), dtype),
                TypeExpr::Scalar(d) => (None, d),
            };
            if let (Some(Expr::Word(w)), KType::Tile { shape, .. }) = (shape_e, at) {
                if p.item.tparams.iter().any(|t| t.name.text == w.text)
                    && !given.iter().any(|g| g.0 == w.text)
                {
                    given.push((
                        w.text.clone(),
                        ConstValue::Shape(shape.iter().map(|&d| d as i64).collect()),
                        span,
                    ));
                }
            }
            if let Expr::Word(w) = dtype_e {
                if p.item.tparams.iter().any(|t| t.name.text == w.text)
                    && !given.iter().any(|g| g.0 == w.text)
                {
                    given.push((w.text.clone(), ConstValue::DType(at.dtype()), span));
                }
            }
        }
        let cur = self.cur.clone();
        let at = |s: Span, msg: String| cur.src.error(s, msg);
        let tvals = bind_tparams(self.sp, &p, given, &at, span)?;
        // switch to the kfunc's frame: its own template values and scope, the same kernel being built
        let saved_cur = std::mem::replace(&mut self.cur, p.clone());
        let saved_env = std::mem::replace(&mut self.env, tvals.into_iter().collect());
        let saved_scopes = std::mem::replace(&mut self.scopes, vec![HashMap::new()]);
        self.inline_depth += 1;
        let r = self.inline_body(&p, params, results, argv, span);
        self.inline_depth -= 1;
        self.cur = saved_cur;
        self.env = saved_env;
        self.scopes = saved_scopes;
        r.map_err(|e| {
            format!(
                "{e}{}",
                self.cur
                    .src
                    .error(span, format!("in the call of @{fname} here"))
                    .replacen("error:", "note:", 1)
            )
        })
    }

    pub(super) fn inline_body(
        &mut self,
        p: &Parsed,
        params: &[(Name, TypeExpr)],
        results: &[TypeExpr],
        argv: Vec<SpecValue>,
        span: Span,
    ) -> R<Vec<SpecValue>> {
        for ((n, t), a) in params.iter().zip(argv) {
            let ty = self.ktype(t)?;
            let v = match a {
                SpecValue::Dyn(o, at) => {
                    if at != ty {
                        return Err(self.err(
                            n.span,
                            format!("parameter %{} is {ty}, the argument is {at}", n.text),
                        ));
                    }
                    SpecValue::Dyn(o, at)
                }
                c @ SpecValue::Const(_) => {
                    let o = self.coerce(c, &ty, span)?;
                    SpecValue::Dyn(o, ty)
                }
                _ => return Err(self.err(n.span, "a kfunc argument must be a scalar or a tile")),
            };
            self.bind(n, v)?;
        }
        let rtys: Vec<KType> = results.iter().map(|t| self.ktype(t)).collect::<R<_>>()?;
        let y = self.block(&p.item.body)?;
        let (vals, yspan) = y.unwrap_or((Vec::new(), p.item.body.span));
        if vals.len() != rtys.len() {
            return Err(self.err(
                yspan,
                format!(
                    "@{} returns {} value(s), {} declared",
                    p.item.name.text,
                    vals.len(),
                    rtys.len()
                ),
            ));
        }
        let mut out = Vec::new();
        for (v, t) in vals.into_iter().zip(&rtys) {
            let o = self.coerce(v, t, yspan)?;
            out.push(SpecValue::Dyn(o, t.clone()));
        }
        Ok(out)
    }
}
