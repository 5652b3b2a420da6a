//! Stage reflection: buffer sizes, workspace liveness and placement, parameter bindings, grids and barriers.
//!
//! **Workspace placement.** A workspace buffer is live from the first dispatch that uses it to the last one
//! (inclusive); a buffer no dispatch uses gets no memory. Buffers are placed in decreasing size (ties: by
//! index) with greedy first fit: each takes the lowest 256-byte-aligned offset at which it overlaps no
//! already-placed buffer whose live interval intersects its own. Buffers with disjoint intervals may share
//! bytes. The total is the highest end, rounded up to 256.
//!
//! **Barriers.** Dispatches run in order; a device may overlap consecutive dispatches unless a barrier
//! separates them. Each dispatch reads the buffers bound to its `read`/`readwrite` parameters and writes those
//! bound to `write`/`readwrite` ones. Walking the list, the pending reads and writes since the last barrier
//! are tracked; dispatch `i` needs `barrier_before[i]` when what it reads or writes overlaps a pending write
//! (RAW, WAW) or what it writes overlaps a pending read (WAR); the pending sets then restart from it.
//! Overlap is decided on memory, not names: inputs, outputs and parameters by identity, workspace buffers by
//! their placed byte ranges, so two aliased workspace buffers are ordered too. The first dispatch never needs
//! one.

use loom_ir::kernel::{Access, BufRef, DType, Stage, WorkspacePlacement};

pub use loom_ir::kernel::WORKSPACE_ALIGN;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferInfo {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkspaceInfo {
    pub buffer: BufferInfo,
    /// First and last dispatch using it (inclusive); `None` when unused.
    pub live: Option<(usize, usize)>,
    pub offset: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamInfo {
    pub buffer: BufferInfo,
    pub input: u32,
    pub key: String,
    pub layout: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DispatchInfo {
    pub kernel: String,
    pub grid: [u64; 3],
    pub barrier_before: bool,
}

/// What a host needs to run a stage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reflection {
    pub inputs: Vec<BufferInfo>,
    pub outputs: Vec<BufferInfo>,
    pub workspace: Vec<WorkspaceInfo>,
    pub workspace_bytes: u64,
    pub param_domain: Option<String>,
    pub params: Vec<ParamInfo>,
    pub dispatches: Vec<DispatchInfo>,
    /// One per dispatch (the same as `dispatches[i].barrier_before`).
    pub barrier_before: Vec<bool>,
}

fn info(name: &str, dtype: DType, shape: &[u64]) -> BufferInfo {
    BufferInfo {
        name: name.to_string(),
        dtype,
        shape: shape.to_vec(),
        bytes: dtype.bytes_for(shape).unwrap_or(0),
    }
}

/// Reflects a specialized stage (never fails: malformed indices count as unused).
pub fn reflect(stage: &Stage) -> Reflection {
    let inputs: Vec<BufferInfo> = stage
        .inputs
        .iter()
        .map(|b| info(&b.name, b.dtype, &b.shape))
        .collect();
    let outputs: Vec<BufferInfo> = stage
        .outputs
        .iter()
        .map(|b| info(&b.name, b.dtype, &b.shape))
        .collect();
    let params: Vec<ParamInfo> = stage
        .params
        .iter()
        .map(|p| ParamInfo {
            buffer: info(&p.name, p.dtype, &p.shape),
            input: p.input,
            key: p.key.clone(),
            layout: p.layout.clone(),
        })
        .collect();
    let WorkspacePlacement {
        live,
        offsets,
        sizes,
        total,
    } = stage.workspace_placement();
    let workspace: Vec<WorkspaceInfo> = stage
        .workspace
        .iter()
        .enumerate()
        .map(|(i, b)| WorkspaceInfo {
            buffer: info(&b.name, b.dtype, &b.shape),
            live: live[i],
            offset: offsets[i],
        })
        .collect();
    // barriers over memory regions
    #[derive(Clone, Copy)]
    enum Mem {
        Id(BufRef),
        Range(u64, u64),
    }
    let mem = |r: BufRef| match r {
        BufRef::Workspace(w) => {
            let (o, s) = (
                offsets.get(w as usize).copied().unwrap_or(0),
                sizes.get(w as usize).copied().unwrap_or(0),
            );
            Mem::Range(o, o.saturating_add(s))
        }
        other => Mem::Id(other),
    };
    let hit = |a: &Mem, b: &Mem| match (a, b) {
        (Mem::Id(x), Mem::Id(y)) => x == y,
        (Mem::Range(s1, e1), Mem::Range(s2, e2)) => s1 < e2 && s2 < e1,
        _ => false,
    };
    let any = |xs: &[Mem], ys: &[Mem]| xs.iter().any(|x| ys.iter().any(|y| hit(x, y)));
    let (mut pend_r, mut pend_w): (Vec<Mem>, Vec<Mem>) = (Vec::new(), Vec::new());
    let mut dispatches = Vec::new();
    let mut barrier_before = Vec::new();
    for d in &stage.dispatches {
        let k = stage.kernels.get(d.kernel as usize);
        let (mut rs, mut ws) = (Vec::new(), Vec::new());
        for (pi, a) in d.args.iter().enumerate() {
            let access = k
                .and_then(|k| k.params.get(pi))
                .map_or(Access::ReadWrite, |p| p.access);
            if access != Access::Write {
                rs.push(mem(*a));
            }
            if access != Access::Read {
                ws.push(mem(*a));
            }
        }
        let touched: Vec<Mem> = rs.iter().chain(&ws).copied().collect();
        let barrier = !dispatches.is_empty() && (any(&touched, &pend_w) || any(&ws, &pend_r));
        if barrier {
            pend_r.clear();
            pend_w.clear();
        }
        pend_r.extend(rs);
        pend_w.extend(ws);
        barrier_before.push(barrier);
        dispatches.push(DispatchInfo {
            kernel: k.map_or_else(|| "?".into(), |k| k.name.clone()),
            grid: k.map_or([0; 3], |k| k.grid),
            barrier_before: barrier,
        });
    }
    Reflection {
        inputs,
        outputs,
        workspace,
        workspace_bytes: total,
        param_domain: stage.param_domain.clone(),
        params,
        dispatches,
        barrier_before,
    }
}
