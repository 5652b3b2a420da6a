//! A readable text dump of specialized stages and kernels (golden tests, `loomc report`).
//!
//! The format is for people and diffs, not for parsing: one line per buffer, dispatch and op, regions
//! indented 2 spaces, values by their (unique) names, immediates as `value:dtype`.

use loom_ir::kernel::*;
use std::fmt::Write;

/// Dumps a stage, then each of its kernels.
pub fn dump_stage(s: &Stage) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "stage @{}", s.name);
    for b in &s.inputs {
        let _ = writeln!(o, "  input %{}: {}{:?}", b.name, b.dtype, b.shape);
    }
    for b in &s.outputs {
        let _ = writeln!(o, "  output %{}: {}{:?}", b.name, b.dtype, b.shape);
    }
    for b in &s.workspace {
        let _ = writeln!(o, "  workspace %{}: {}{:?}", b.name, b.dtype, b.shape);
    }
    if let Some(d) = &s.param_domain {
        let _ = writeln!(o, "  params @{d}");
    }
    for p in &s.params {
        let layout = p
            .layout
            .as_ref()
            .map(|l| format!(" layout({l})"))
            .unwrap_or_default();
        let _ = writeln!(
            o,
            "    %{}: {}{:?} = weights({}, {:?}){layout}",
            p.name, p.dtype, p.shape, p.input, p.key
        );
    }
    for d in &s.dispatches {
        let args: Vec<String> = d
            .args
            .iter()
            .map(|a| format!("%{}", buf_name(s, *a)))
            .collect();
        let _ = writeln!(o, "  dispatch #{}({})", d.kernel, args.join(", "));
    }
    for (i, k) in s.kernels.iter().enumerate() {
        let _ = write!(o, "\n#{i} ");
        o.push_str(&dump_kernel(k));
    }
    o
}

fn buf_name(s: &Stage, r: BufRef) -> String {
    let n = match r {
        BufRef::Input(i) => s.inputs.get(i as usize).map(|b| &b.name),
        BufRef::Output(i) => s.outputs.get(i as usize).map(|b| &b.name),
        BufRef::Workspace(i) => s.workspace.get(i as usize).map(|b| &b.name),
        BufRef::Param(i) => s.params.get(i as usize).map(|b| &b.name),
    };
    n.cloned().unwrap_or_else(|| format!("<bad {r:?}>"))
}

/// Dumps one kernel.
pub fn dump_kernel(k: &Kernel) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "kernel {} grid {:?}", k.name, k.grid);
    for p in &k.params {
        let _ = writeln!(
            o,
            "  param %{}: {}{:?} {:?}",
            p.name, p.dtype, p.shape, p.access
        );
    }
    region(&mut o, k, &k.body, 1);
    o
}

fn v(k: &Kernel, v: KValue) -> String {
    k.values
        .get(v.0 as usize)
        .map_or_else(|| format!("%<bad {}>", v.0), |d| format!("%{}", d.name))
}

fn opnd(k: &Kernel, o: &KOperand) -> String {
    match o {
        KOperand::Value(x) => v(k, *x),
        KOperand::Imm(KImm::I64(i), d) => format!("{i}:{d}"),
        KOperand::Imm(KImm::F64(f), d) => format!("{f:?}:{d}"),
        KOperand::Imm(KImm::I1(b), d) => format!("{b}:{d}"),
    }
}

fn list(k: &Kernel, os: &[KOperand]) -> String {
    os.iter().map(|o| opnd(k, o)).collect::<Vec<_>>().join(", ")
}

fn pname(k: &Kernel, p: u32) -> String {
    k.params
        .get(p as usize)
        .map_or_else(|| format!("<bad {p}>"), |p| format!("%{}", p.name))
}

fn region(o: &mut String, k: &Kernel, r: &KRegion, depth: usize) {
    let ind = "  ".repeat(depth);
    for op in &r.ops {
        let res: Vec<String> = op.results.iter().map(|&r| v(k, r)).collect();
        let lhs = if res.is_empty() {
            String::new()
        } else {
            format!("{} = ", res.join(", "))
        };
        let ty = op
            .results
            .iter()
            .map(|r| {
                k.values
                    .get(r.0 as usize)
                    .map_or("?".into(), |d| d.ty.to_string())
            })
            .collect::<Vec<_>>()
            .join(", ");
        let ann = if ty.is_empty() {
            String::new()
        } else {
            format!(" : {ty}")
        };
        let body = match &op.kind {
            KOpKind::ProgramId { axis } => format!("program_id {axis}"),
            KOpKind::Binary { op: b, a, b: c } => format!(
                "{} {}, {}",
                format!("{b:?}").to_lowercase(),
                opnd(k, a),
                opnd(k, c)
            ),
            KOpKind::Unary { op: u, a } => {
                format!("{} {}", format!("{u:?}").to_lowercase(), opnd(k, a))
            }
            KOpKind::Cmp { op: c, a, b } => format!(
                "cmp.{} {}, {}",
                format!("{c:?}").to_lowercase(),
                opnd(k, a),
                opnd(k, b)
            ),
            KOpKind::Select { cond, a, b } => {
                format!("select {}, {}, {}", opnd(k, cond), opnd(k, a), opnd(k, b))
            }
            KOpKind::Cast { a, to } => format!("conv.{to} {}", opnd(k, a)),
            KOpKind::Range { start, len } => format!("tile.range {}, {len}", opnd(k, start)),
            KOpKind::Full {
                value,
                shape,
                dtype,
            } => format!("tile.full {} {shape:?} {dtype}", opnd(k, value)),
            KOpKind::Broadcast { a, shape } => format!("tile.broadcast {}, {shape:?}", opnd(k, a)),
            KOpKind::ExpandDims { a, axis } => format!("tile.expand_dims {}, {axis}", opnd(k, a)),
            KOpKind::Reshape { a, shape } => format!("tile.reshape {}, {shape:?}", opnd(k, a)),
            KOpKind::Transpose { a } => format!("tile.transpose {}", opnd(k, a)),
            KOpKind::Reduce { op: r, a, axis } => format!(
                "tile.{} {}, {axis}",
                format!("{r:?}").to_lowercase(),
                opnd(k, a)
            ),
            KOpKind::Dot { a, b, acc } => {
                format!("tile.dot {}, {}, {}", opnd(k, a), opnd(k, b), opnd(k, acc))
            }
            KOpKind::Load {
                param,
                indices,
                fill,
            } => {
                let f = fill
                    .as_ref()
                    .map(|f| format!(", {}", opnd(k, f)))
                    .unwrap_or_else(|| " checked".into());
                format!("tile.load {}[{}]{f}", pname(k, *param), list(k, indices))
            }
            KOpKind::Store {
                param,
                indices,
                value,
            } => {
                format!(
                    "tile.store {}[{}], {}",
                    pname(k, *param),
                    list(k, indices),
                    opnd(k, value)
                )
            }
            KOpKind::For {
                lo,
                hi,
                step,
                iv,
                iters,
                inits,
                body,
            } => {
                let it: Vec<String> = iters
                    .iter()
                    .zip(inits)
                    .map(|(i, x)| format!("{} = {}", v(k, *i), opnd(k, x)))
                    .collect();
                let _ = writeln!(
                    o,
                    "{ind}{lhs}for {} = {} to {} step {} iter({}){ann} {{",
                    v(k, *iv),
                    opnd(k, lo),
                    opnd(k, hi),
                    opnd(k, step),
                    it.join(", ")
                );
                region(o, k, body, depth + 1);
                let _ = writeln!(o, "{ind}}}");
                continue;
            }
            KOpKind::If {
                cond,
                then_region,
                else_region,
            } => {
                let _ = writeln!(o, "{ind}{lhs}if {}{ann} {{", opnd(k, cond));
                region(o, k, then_region, depth + 1);
                let _ = writeln!(o, "{ind}}} else {{");
                region(o, k, else_region, depth + 1);
                let _ = writeln!(o, "{ind}}}");
                continue;
            }
            KOpKind::Yield(vs) => format!("yield {}", list(k, vs)),
        };
        let _ = writeln!(o, "{ind}{lhs}{}{ann}", body.trim_end());
    }
}

/// Reflection as text: buffers and sizes, workspace liveness and offsets, parameter bindings, grids, barriers.
pub fn dump_reflection(r: &crate::Reflection) -> String {
    let mut o = String::new();
    for b in &r.inputs {
        let _ = writeln!(
            o,
            "input %{}: {}{:?} ({} bytes)",
            b.name, b.dtype, b.shape, b.bytes
        );
    }
    for b in &r.outputs {
        let _ = writeln!(
            o,
            "output %{}: {}{:?} ({} bytes)",
            b.name, b.dtype, b.shape, b.bytes
        );
    }
    let _ = writeln!(o, "workspace: {} bytes", r.workspace_bytes);
    for w in &r.workspace {
        let b = &w.buffer;
        let live = match w.live {
            Some((s, e)) => format!("live dispatches {s}..={e}, offset {}", w.offset),
            None => "unused".to_string(),
        };
        let _ = writeln!(
            o,
            "  %{}: {}{:?} ({} bytes), {live}",
            b.name, b.dtype, b.shape, b.bytes
        );
    }
    if let Some(d) = &r.param_domain {
        let _ = writeln!(o, "params @{d}:");
    }
    for p in &r.params {
        let b = &p.buffer;
        let layout = p
            .layout
            .as_ref()
            .map(|l| format!(" layout({l})"))
            .unwrap_or_default();
        let _ = writeln!(
            o,
            "  %{}: {}{:?} ({} bytes) = weights({}, {:?}){layout}",
            b.name, b.dtype, b.shape, b.bytes, p.input, p.key
        );
    }
    for (i, d) in r.dispatches.iter().enumerate() {
        let barrier = if d.barrier_before { "barrier, " } else { "" };
        let _ = writeln!(o, "dispatch {i}: {barrier}grid {:?} {}", d.grid, d.kernel);
    }
    o
}
