//! Stage specialization: buffers, parameter bindings, workspace allocations and dispatches, with
//! compile-time `if`, `static.match` and `static.for` (unrolled here: the IR never sees a loop).
//!
//! A `static.for` body runs once per index with the loop variable bound to that integer in a scope of its
//! own; everything the body defines goes to the stage's scope (stages are SSA as a whole), so a value defined
//! in a loop is a *family member* `%h[INDEX]`, which is the value named `%h` followed by INDEX's decimal digits
//! (`%h[3]` is `%h3`): the unrolled text and the loop define the same names, and give the same stage.

use super::*;

/// Specializes a stage.
pub(crate) fn stage(
    sp: &mut Spec<'_>,
    m: usize,
    name: &str,
    config: &[(String, TValue)],
) -> Result<Stage, Vec<String>> {
    let p = sp.item(m, name)?;
    if p.item.kind != DeviceKind::Stage {
        return Err(vec![p.src.error(
            p.item.name.span,
            format!("@{name} is a {}, not a stage", p.item.kind.keyword()),
        )]);
    }
    let mut given = Vec::new();
    for (k, v) in config {
        match tvalue_to_const(v) {
            Some(c) => given.push((k.clone(), c, p.item.name.span)),
            None => {
                return Err(vec![p.src.error(
                    p.item.name.span,
                    format!(
                        "config value for `{k}` is not a constant i64, bool, str, dtype or shape"
                    ),
                )]);
            }
        }
    }
    let at = |s: Span, msg: String| p.src.error(s, msg);
    let tvals = bind_tparams(sp, &p, given, &at, p.item.name.span).map_err(|e| vec![e])?;
    let env: HashMap<String, ConstValue> = tvals.into_iter().collect();
    let qualified = format!("{}.{}", sp.module_name(m), name);
    let mut cx = KernelBuilder::new(sp, p.clone(), env);
    let mut st = Stage {
        name: qualified,
        inputs: Vec::new(),
        outputs: Vec::new(),
        workspace: Vec::new(),
        param_domain: None,
        params: Vec::new(),
        kernels: Vec::new(),
        dispatches: Vec::new(),
    };
    let one = |e: String| vec![e];
    let Header::Stage { buffers, params } = &p.item.header else {
        return Err(vec![p.src.error(p.item.name.span, "not a stage")]);
    };
    for b in buffers {
        let (dtype, shape) = cx.buffer_type(&b.dtype, &b.dims).map_err(one)?;
        let sb = StageBuffer {
            name: b.name.text.clone(),
            dtype,
            shape,
        };
        let r = match b.mode.text.as_str() {
            "input" => {
                st.inputs.push(sb);
                BufRef::Input(st.inputs.len() as u32 - 1)
            }
            "output" => {
                st.outputs.push(sb);
                BufRef::Output(st.outputs.len() as u32 - 1)
            }
            other => {
                return Err(vec![cx.err(
                    b.mode.span,
                    format!("a stage buffer is `input` or `output`, found `{other}`"),
                )]);
            }
        };
        cx.bind(&b.name, SpecValue::Stage(r)).map_err(one)?;
    }
    if let Some(pb) = params {
        st.param_domain = Some(pb.domain.text.clone());
        let inputs = match cx.const_of(&pb.inputs).map_err(one)? {
            ConstValue::Int(n) if n >= 0 => n,
            other => {
                return Err(vec![cx.err(
                    pb.inputs.span(),
                    format!(
                        "`inputs` must be a non-negative integer, found {}",
                        other.describe()
                    ),
                )]);
            }
        };
        param_items(&mut cx, &pb.bindings, inputs, &mut st).map_err(one)?;
    }
    let mut errors = Vec::new();
    stage_block(&mut cx, &p.item.body, &mut st, &mut errors);
    if errors.is_empty() {
        Ok(st)
    } else {
        Err(errors)
    }
}

/// The bindings of a `params` block, `static.for` unrolled.
fn param_items(
    cx: &mut KernelBuilder<'_, '_>,
    items: &[ParamItem],
    inputs: i64,
    st: &mut Stage,
) -> R<()> {
    for it in items {
        let b = match it {
            ParamItem::Binding(b) => b,
            ParamItem::For { header, body } => {
                for k in cx.static_range(header)? {
                    cx.scopes.push(HashMap::from([(
                        header.var.text.clone(),
                        SpecValue::Const(ConstValue::Int(k)),
                    )]));
                    let r = param_items(cx, body, inputs, st);
                    cx.scopes.pop();
                    r?;
                }
                continue;
            }
        };
        let (dtype, shape) = cx.buffer_type(&b.dtype, &b.dims)?;
        let input = match cx.const_of(&b.input)? {
            ConstValue::Int(i) if i >= 0 && i < inputs => i as u32,
            other => {
                return Err(cx.err(
                    b.input.span(),
                    format!(
                        "the input ordinal must be 0..{inputs}, found {}",
                        other.describe()
                    ),
                ));
            }
        };
        let key = cx.key_text(&b.key)?;
        let name = cx.define(
            &b.name,
            b.index.as_ref(),
            SpecValue::Stage(BufRef::Param(st.params.len() as u32)),
        )?;
        st.params.push(ParamBinding {
            name,
            dtype,
            shape,
            input,
            key,
            layout: b.layout.clone(),
        });
    }
    Ok(())
}

impl KernelBuilder<'_, '_> {
    /// The indices a `static.for` runs over (bounds and step compile-time integers, at most
    /// [`MAX_STATIC_TRIPS`] of them, at most [`MAX_STATIC_ITERATIONS`] in the whole stage). The loop variable
    /// may not shadow a value.
    fn static_range(&mut self, h: &StaticFor) -> R<Vec<i64>> {
        let int = |cx: &mut Self, e: &Expr, what: &str| -> R<i64> {
            match cx.const_of(e)? {
                ConstValue::Int(v) => Ok(v),
                other => Err(cx.err(
                    e.span(),
                    format!(
                        "the {what} of `static.for %{}` must be a compile-time integer, found {}",
                        h.var.text,
                        other.describe()
                    ),
                )),
            }
        };
        let lo = int(self, &h.lo, "lower bound")?;
        let hi = int(self, &h.hi, "upper bound")?;
        let step = match &h.step {
            Some(e) => {
                let s = int(self, e, "step")?;
                if s <= 0 {
                    return Err(self.err(
                        e.span(),
                        format!(
                            "the step of `static.for %{}` must be positive, found {s}",
                            h.var.text
                        ),
                    ));
                }
                s
            }
            None => 1,
        };
        let trips = if hi <= lo {
            0
        } else {
            (i128::from(hi) - i128::from(lo) + i128::from(step) - 1) / i128::from(step)
        };
        if trips > i128::from(MAX_STATIC_TRIPS) {
            return Err(self.err(
                h.span,
                format!(
                    "`static.for %{} = {lo} to {hi}` would run {trips} iterations; the limit is {MAX_STATIC_TRIPS}",
                    h.var.text
                ),
            ));
        }
        self.unrolled += trips as u64;
        if self.unrolled > MAX_STATIC_ITERATIONS {
            return Err(self.err(
                h.span,
                format!(
                    "the stage's `static.for` loops unroll to more than {MAX_STATIC_ITERATIONS} iterations in all"
                ),
            ));
        }
        if self.scopes.iter().any(|s| s.contains_key(&h.var.text)) {
            return Err(self.err(
                h.var.span,
                format!("the loop variable %{} is already defined", h.var.text),
            ));
        }
        Ok((0..trips as i64).map(|i| lo + i * step).collect())
    }

    /// The index of a family member `%name[INDEX]`: a non-negative compile-time integer.
    fn member_index(&mut self, family: &Name, index: &Expr) -> R<i64> {
        match self.const_of(index)? {
            ConstValue::Int(k) if k >= 0 => Ok(k),
            other => Err(self.err(
                index.span(),
                format!(
                    "the index of `%{}[...]` must be a non-negative compile-time integer, found {}",
                    family.text,
                    other.describe()
                ),
            )),
        }
    }

    /// Defines a stage value (`%name`, or the family member `%name[index]`, which is `%name` followed by the
    /// index's digits) in the stage's scope; returns its name. A name is defined once in a stage.
    fn define(&mut self, n: &Name, index: Option<&Expr>, v: SpecValue) -> R<String> {
        let (name, member) = match index {
            None => (n.text.clone(), None),
            Some(e) => {
                let k = self.member_index(n, e)?;
                (format!("{}{k}", n.text), Some(k))
            }
        };
        if self.scopes.iter().any(|s| s.contains_key(&name)) {
            let written = match member {
                Some(k) => format!("`%{}[{k}]` (the value %{name})", n.text),
                None => format!("%{name}"),
            };
            let earlier = match self.members.get(&name) {
                Some((f, k)) if member != Some(*k) || *f != n.text => {
                    format!(", already defined as `%{f}[{k}]`")
                }
                _ => String::new(),
            };
            let hint = if member.is_none() && self.scopes.len() > 1 {
                format!(
                    "; a value defined in a `static.for` body is defined once per iteration: index it by the loop variable, `%{}[%l]`",
                    n.text
                )
            } else {
                String::new()
            };
            return Err(self.err(
                n.span,
                format!("{written} is defined twice{earlier} (values are SSA{hint})"),
            ));
        }
        if let Some(k) = member {
            self.families.entry(n.text.clone()).or_default().insert(k);
            self.members.insert(name.clone(), (n.text.clone(), k));
        }
        self.scopes[0].insert(name.clone(), v);
        Ok(name)
    }

    /// A stage buffer named by a dispatch argument: `%name` or a family member `%name[INDEX]`.
    fn stage_buffer(&mut self, a: &Expr) -> R<(BufRef, String)> {
        let (n, v, shown) = match a {
            Expr::Value(n) => (n, self.lookup(n)?, format!("%{}", n.text)),
            Expr::Index { buf, indices, span } => {
                let [i] = indices.as_slice() else {
                    return Err(self.err(*span, "a family member has one index: `%name[INDEX]`"));
                };
                let k = self.member_index(buf, i)?;
                let name = format!("{}{k}", buf.text);
                let found = self.scopes.iter().rev().find_map(|s| s.get(&name)).cloned();
                let Some(v) = found else {
                    let have = match self.families.get(&buf.text) {
                        Some(ks) if !ks.is_empty() => {
                            format!("%{} is defined here for indices {}", buf.text, ranges(ks))
                        }
                        _ => format!("no member of the family %{} is defined here", buf.text),
                    };
                    return Err(self.err(
                        *span,
                        format!("`%{}[{k}]` is not defined ({have})", buf.text),
                    ));
                };
                (buf, v, format!("%{}[{k}]", buf.text))
            }
            _ => {
                return Err(self.err(
                    a.span(),
                    "a dispatch argument must be a stage buffer `%name` or `%family[INDEX]`",
                ));
            }
        };
        match v {
            SpecValue::Stage(r) => Ok((r, shown)),
            _ => Err(self.err(n.span, format!("{shown} is not a stage buffer"))),
        }
    }

    /// A checkpoint key with its holes filled: `{%l}` a compile-time integer value in scope (a `static.for`
    /// variable), `{N}` an integer template parameter.
    fn key_text(&mut self, k: &KeyTemplate) -> R<String> {
        let mut out = String::new();
        for p in &k.parts {
            let (v, shown) = match p {
                KeyPart::Text(t) => {
                    out.push_str(t);
                    continue;
                }
                KeyPart::Value(v) => (
                    self.scopes.iter().rev().find_map(|s| s.get(v)).cloned(),
                    format!("{{%{v}}}"),
                ),
                KeyPart::Word(w) => (
                    self.env.get(w).cloned().map(SpecValue::Const),
                    format!("{{{w}}}"),
                ),
            };
            match v {
                Some(SpecValue::Const(ConstValue::Int(i))) => out.push_str(&i.to_string()),
                Some(SpecValue::Const(c)) => {
                    return Err(self.err(
                        k.span,
                        format!(
                            "`{shown}` in the checkpoint key is {}, not an integer",
                            c.describe()
                        ),
                    ));
                }
                Some(_) => {
                    return Err(self.err(
                        k.span,
                        format!("`{shown}` in the checkpoint key is a buffer, not a compile-time integer"),
                    ));
                }
                None => {
                    return Err(self.err(
                        k.span,
                        format!(
                            "the checkpoint key names `{shown}`, which is not defined here (a hole is a `static.for` variable `{{%l}}` or an integer template parameter `{{N}}`)"
                        ),
                    ));
                }
            }
        }
        Ok(out)
    }
}

/// `0..=6`, `0, 2..=4`: a set of indices as ranges.
fn ranges(ks: &std::collections::BTreeSet<i64>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut it = ks.iter().copied().peekable();
    while let Some(a) = it.next() {
        let mut b = a;
        while it.peek() == Some(&(b + 1)) {
            b += 1;
            it.next();
        }
        out.push(if a == b {
            a.to_string()
        } else {
            format!("{a}..={b}")
        });
    }
    out.join(", ")
}

pub(super) fn stage_block(
    cx: &mut KernelBuilder<'_, '_>,
    b: &Block,
    st: &mut Stage,
    errors: &mut Vec<String>,
) {
    for s in &b.stmts {
        match s {
            Stmt::Yield { values, span } => {
                if !values.is_empty() {
                    errors.push(cx.err(*span, "a stage yields nothing"));
                }
            }
            Stmt::Let {
                results,
                index,
                op,
                span,
            } => {
                if let Err(e) = stage_stmt(cx, results, index.as_ref(), op, *span, st, errors) {
                    errors.push(e);
                }
            }
            Stmt::Index { span, .. } => errors.push(cx.err(
                *span,
                "index notation is a kernel statement, not a stage statement",
            )),
        }
    }
}

pub(super) fn stage_stmt(
    cx: &mut KernelBuilder<'_, '_>,
    results: &[Name],
    index: Option<&Expr>,
    op: &Op,
    span: Span,
    st: &mut Stage,
    errors: &mut Vec<String>,
) -> R<()> {
    match op {
        Op::Alloc { dtype, dims, .. } => {
            let [r] = results else {
                return Err(cx.err(
                    span,
                    "`alloc` gives one buffer: `%name = alloc dtype[dims]`",
                ));
            };
            let (dtype, shape) = cx.buffer_type(dtype, dims)?;
            let name = cx.define(
                r,
                index,
                SpecValue::Stage(BufRef::Workspace(st.workspace.len() as u32)),
            )?;
            st.workspace.push(StageBuffer { name, dtype, shape });
            Ok(())
        }
        Op::StaticFor { header, body } => {
            if !results.is_empty() {
                return Err(cx.err(span, "a `static.for` has no results"));
            }
            for k in cx.static_range(header)? {
                cx.scopes.push(HashMap::from([(
                    header.var.text.clone(),
                    SpecValue::Const(ConstValue::Int(k)),
                )]));
                let before = errors.len();
                stage_block(cx, body, st, errors);
                cx.scopes.pop();
                if errors.len() > before {
                    // why stop: the next iterations would only repeat the error
                    break;
                }
            }
            Ok(())
        }
        Op::If {
            cond,
            then_block,
            else_block,
            ..
        } => {
            if !results.is_empty() {
                return Err(cx.err(span, "a stage `if` has no results"));
            }
            match cx.eval(cond, "")? {
                SpecValue::Const(ConstValue::Bool(b)) => {
                    let blk = if b { Some(then_block) } else { else_block.as_ref() };
                    if let Some(blk) = blk {
                        stage_block(cx, blk, st, errors);
                    }
                    Ok(())
                }
                _ => Err(cx.err(cond.span(), "a stage `if` needs a compile-time condition (stages have no data-dependent control flow)")),
            }
        }
        Op::Match {
            scrutinee,
            results: tys,
            cases,
            default,
            span,
        } => {
            if !results.is_empty() || !tys.is_empty() {
                return Err(cx.err(*span, "a stage `static.match` has no results"));
            }
            let blk = cx.static_case(scrutinee, cases, default.as_ref(), *span)?;
            stage_block(cx, blk, st, errors);
            Ok(())
        }
        Op::Dispatch {
            kernel: kn,
            targs,
            args,
            span,
        } => {
            if !results.is_empty() {
                return Err(cx.err(*span, "`dispatch` gives no values"));
            }
            let (m, kname) = cx
                .sp
                .resolve(cx.cur.module, &kn.text, DeviceKind::Kernel)
                .map_err(|e| cx.err(kn.span, e))?;
            let mut given = Vec::new();
            for (n, e) in targs {
                let v = cx.const_of(e)?;
                given.push((n.text.clone(), v, e.span()));
            }
            let cur = cx.cur.clone();
            let at = |s: Span, msg: String| cur.src.error(s, msg);
            let k = kernel(cx.sp, m, &kname, given, &at, kn.span).map_err(|e| {
                format!(
                    "{e}{}",
                    cur.src
                        .error(
                            *span,
                            format!("while specializing @{kname} for this dispatch")
                        )
                        .replacen("error:", "note:", 1)
                )
            })?;
            if args.len() != k.params.len() {
                return Err(cx.err(
                    *span,
                    format!(
                        "@{kname} takes {} buffers, {} given",
                        k.params.len(),
                        args.len()
                    ),
                ));
            }
            let mut refs = Vec::new();
            for (a, kp) in args.iter().zip(&k.params) {
                let (r, shown) = cx.stage_buffer(a)?;
                let b = match r {
                    BufRef::Input(i) => &st.inputs[i as usize],
                    BufRef::Output(i) => &st.outputs[i as usize],
                    BufRef::Workspace(i) => &st.workspace[i as usize],
                    BufRef::Param(i) => {
                        let p = &st.params[i as usize];
                        &StageBuffer {
                            name: p.name.clone(),
                            dtype: p.dtype,
                            shape: p.shape.clone(),
                        }
                    }
                };
                if b.dtype != kp.dtype || b.shape != kp.shape {
                    return Err(cx.err(a.span(), format!(
                        "wrong buffer for parameter %{} of @{kname}: {shown} is {}{:?}, the kernel expects {}{:?}",
                        kp.name, b.dtype, b.shape, kp.dtype, kp.shape
                    )));
                }
                if kp.access != Access::Read && matches!(r, BufRef::Input(_) | BufRef::Param(_)) {
                    return Err(cx.err(a.span(), format!("@{kname} writes parameter %{}, but {shown} is a read-only stage input or parameter", kp.name)));
                }
                refs.push(r);
            }
            let ki = match st.kernels.iter().position(|x| x.name == k.name) {
                Some(i) => i,
                None => {
                    st.kernels.push(k);
                    st.kernels.len() - 1
                }
            };
            st.dispatches.push(Dispatch {
                kernel: ki as u32,
                args: refs,
            });
            Ok(())
        }
        other => Err(cx.err(
            other.span(),
            "a stage body holds `alloc`, `dispatch`, compile-time `if`, `static.match` and `static.for` only",
        )),
    }
}
