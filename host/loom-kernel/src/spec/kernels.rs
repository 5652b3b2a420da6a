//! Kernel specialization: template binding, memoisation by specialized name, parameters and body.

use super::*;

/// Specializes kernel `name` of module `m` with template values `given` (`(name, value, span for errors)`).
/// Returns the memoised kernel.
pub(crate) fn kernel(
    sp: &mut Spec<'_>,
    m: usize,
    name: &str,
    given: Vec<(String, ConstValue, Span)>,
    at: &dyn Fn(Span, String) -> String,
    call_span: Span,
) -> R<Kernel> {
    let p = sp.item(m, name).map_err(|e| e.join(""))?;
    if p.item.kind != DeviceKind::Kernel {
        return Err(at(
            call_span,
            format!("@{name} is a {}, not a kernel", p.item.kind.keyword()),
        ));
    }
    let tvals = bind_tparams(sp, &p, given, at, call_span)?;
    // The name is the memo key: a kfunc of another module is qualified (`F=@motifs.gemm.silu`), so that two
    // same-named kfuncs of different modules give two kernels.
    let spec_name = format!(
        "{}.{}<{}>",
        sp.module_name(m),
        name,
        tvals
            .iter()
            .map(|(n, v)| match v {
                ConstValue::Func(fm, f) if *fm != m => format!("{n}=@{}.{f}", sp.module_name(*fm)),
                v => format!("{n}={}", const_text(v)),
            })
            .collect::<Vec<_>>()
            .join(",")
    );
    if let Some(k) = sp.kernels.get(&spec_name) {
        return Ok(k.clone());
    }
    let Header::Kernel { grid, params } = &p.item.header else {
        return Err(at(call_span, format!("@{name} is not a kernel")));
    };
    let env: HashMap<String, ConstValue> = tvals.iter().cloned().collect();
    let file = sp.catalog.entries()[m].module.file.clone();
    let mut cx = KernelBuilder::new(sp, p.clone(), env);
    let mut kparams = Vec::new();
    for (i, b) in params.iter().enumerate() {
        let access = match b.mode.text.as_str() {
            "read" => Access::Read,
            "write" => Access::Write,
            "readwrite" => Access::ReadWrite,
            other => {
                return Err(cx.err(
                    b.mode.span,
                    format!("unknown access mode `{other}`: expected read, write or readwrite"),
                ));
            }
        };
        let (dtype, shape) = cx.buffer_type(&b.dtype, &b.dims)?;
        if kparams.iter().any(|k: &KParam| k.name == b.name.text) {
            return Err(cx.err(
                b.name.span,
                format!("parameter %{} is declared twice", b.name.text),
            ));
        }
        kparams.push(KParam {
            name: b.name.text.clone(),
            dtype,
            shape,
            access,
        });
        cx.bind(&b.name, SpecValue::Buf(i as u32))?;
    }
    let mut g = [1u64; 3];
    for (i, e) in grid.iter().enumerate() {
        match cx.const_of(e)? {
            ConstValue::Int(v) if v >= 0 => g[i] = v as u64,
            other => {
                return Err(cx.err(
                    e.span(),
                    format!(
                        "a grid dimension must be a non-negative integer, found {}",
                        other.describe()
                    ),
                ));
            }
        }
    }
    cx.params = kparams.clone();
    // why: values and parameters print in one namespace (`%y`); keep value names distinct from parameters
    for k in &kparams {
        cx.names.insert(k.name.clone(), 1);
    }
    cx.regions.push(Vec::new());
    let body = p.item.body.clone();
    let y = cx.block(&body)?;
    if let Some((_, span)) = y {
        if !matches!(body.stmts.last(), Some(Stmt::Yield { values, .. }) if values.is_empty()) {
            return Err(cx.err(span, "a kernel body returns nothing"));
        }
    }
    let mut ops = cx.regions.pop().unwrap_or_default();
    ops.push(KOp {
        kind: KOpKind::Yield(Vec::new()),
        results: Vec::new(),
        loc: cx.loc(body.span),
    });
    let k = Kernel {
        name: spec_name.clone(),
        params: kparams,
        grid: g,
        values: cx.values,
        body: KRegion { ops },
        file,
    };
    sp.kernels.insert(spec_name, k.clone());
    Ok(k)
}

/// Specializes a kernel directly (a dispatch root, or tests).
pub(crate) fn kernel_root(
    sp: &mut Spec<'_>,
    m: usize,
    name: &str,
    tv: &[(String, TValue)],
) -> Result<Kernel, Vec<String>> {
    let p = sp.item(m, name)?;
    let mut given = Vec::new();
    for (k, v) in tv {
        match tvalue_to_const(v) {
            Some(c) => given.push((k.clone(), c, p.item.name.span)),
            None => {
                return Err(vec![p.src.error(
                    p.item.name.span,
                    format!("template value for `{k}` is not a constant"),
                )]);
            }
        }
    }
    let at = |s: Span, msg: String| p.src.error(s, msg);
    kernel(sp, m, name, given, &at, p.item.name.span).map_err(|e| vec![e])
}
