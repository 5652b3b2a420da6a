//! Stage specialization: buffers, workspace allocations and dispatches.

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
        for b in &pb.bindings {
            let (dtype, shape) = cx.buffer_type(&b.dtype, &b.dims).map_err(one)?;
            let input = match cx.const_of(&b.input).map_err(one)? {
                ConstValue::Int(i) if i >= 0 && i < inputs => i as u32,
                other => {
                    return Err(vec![cx.err(
                        b.input.span(),
                        format!(
                            "the input ordinal must be 0..{inputs}, found {}",
                            other.describe()
                        ),
                    )]);
                }
            };
            st.params.push(ParamBinding {
                name: b.name.text.clone(),
                dtype,
                shape,
                input,
                key: b.key.clone(),
                layout: b.layout.clone(),
            });
            cx.bind(
                &b.name,
                SpecValue::Stage(BufRef::Param(st.params.len() as u32 - 1)),
            )
            .map_err(one)?;
        }
    }
    let mut errors = Vec::new();
    stage_block(&mut cx, &p.item.body, &mut st, &mut errors);
    if errors.is_empty() {
        Ok(st)
    } else {
        Err(errors)
    }
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
            Stmt::Let { results, op, span } => {
                if let Err(e) = stage_stmt(cx, results, op, *span, st, errors) {
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
            st.workspace.push(StageBuffer {
                name: r.text.clone(),
                dtype,
                shape,
            });
            cx.bind(
                r,
                SpecValue::Stage(BufRef::Workspace(st.workspace.len() as u32 - 1)),
            )
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
                let Expr::Value(n) = a else {
                    return Err(cx.err(
                        a.span(),
                        "a dispatch argument must be a stage buffer `%name`",
                    ));
                };
                let SpecValue::Stage(r) = cx.lookup(n)? else {
                    return Err(cx.err(n.span, format!("%{} is not a stage buffer", n.text)));
                };
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
                        "wrong buffer for parameter %{} of @{kname}: %{} is {}{:?}, the kernel expects {}{:?}",
                        kp.name, n.text, b.dtype, b.shape, kp.dtype, kp.shape
                    )));
                }
                if kp.access != Access::Read && matches!(r, BufRef::Input(_) | BufRef::Param(_)) {
                    return Err(cx.err(a.span(), format!("@{kname} writes parameter %{}, but %{} is a read-only stage input or parameter", kp.name, n.text)));
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
            "a stage body holds `alloc`, `dispatch` and compile-time `if` only",
        )),
    }
}
