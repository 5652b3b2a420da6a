//! The kernel interpreter: runs a specialized [`Kernel`] over its grid against a table of byte buffers.

use std::borrow::Cow;

use loom_ir::Loc;
use loom_ir::kernel::{
    Access, DType, KImm, KIndex, KOp, KOpKind, KOperand, KParam, KRegion, KType, KValue, KValueDef,
    Kernel,
};

use crate::Error;
use crate::elem::{read_float, read_int, write_float, write_int};
use crate::float::{int_to_float, round_to};
use crate::ops;
use crate::tile::{Data, Fault, R, Tile, bad, describe, elements, wrap};
use loom_ir::kernel::{RunBounds, instance_allowance};

/// Regions nested deeper than this are refused (the interpreter recurses on regions and must not overflow its
/// stack on hostile IR); real kernels nest a handful deep.
const MAX_REGION_DEPTH: u32 = 64;

/// A buffer the kernel's parameters map to; several parameters may map to one slot (in-place dispatch).
#[derive(Debug)]
pub(crate) enum Slot<'a> {
    Ro(&'a [u8]),
    Rw(&'a mut [u8]),
}

impl Slot<'_> {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Slot::Ro(b) => b,
            Slot::Rw(b) => b,
        }
    }
}

pub(crate) fn kernel_at(kernel: &Kernel, loc: Loc) -> String {
    if loc == Loc::default() {
        format!("kernel `{}`", kernel.name)
    } else {
        format!("kernel `{}` at {}:{}", kernel.name, loc.line, loc.col)
    }
}

/// Runs every program instance of `kernel`, in row-major grid order; parameter `p` reads and writes
/// `slots[map[p]]`. The caller has checked that every mapped slot has exactly the parameter's byte size.
///
/// `bounds` (see `loom_ir::kernel::RunBounds`): the grid is checked against the step budget first; the flag
/// is looked at before every instance and every loop iteration, and each loop iteration costs one step of the
/// instance's allowance (`instance_allowance`); `stage` names the stage in those errors.
pub(crate) fn run(
    kernel: &Kernel,
    slots: &mut [Slot<'_>],
    map: &[usize],
    stage: &str,
    bounds: &RunBounds<'_>,
) -> Result<(), Error> {
    let [g0, g1, g2] = kernel.grid;
    let instances = g0.saturating_mul(g1).saturating_mul(g2);
    let over = || Error::BudgetExceeded {
        kernel: kernel.name.clone(),
        stage: stage.to_string(),
        budget: bounds.steps,
    };
    let Some(allowance) = instance_allowance(bounds.steps, instances) else {
        return Err(over());
    };
    let mut m = Machine {
        kernel,
        slots,
        map,
        env: Vec::new(),
        pid: [0; 3],
        depth: 0,
        left: allowance,
        stage,
        bounds: *bounds,
    };
    for p0 in 0..g0 {
        for p1 in 0..g1 {
            for p2 in 0..g2 {
                if bounds.cancelled() {
                    return Err(m.cancelled());
                }
                m.left = allowance;
                m.pid = [p0, p1, p2];
                // SSA values never outlive their program instance.
                m.env.clear();
                m.env.resize(kernel.values.len(), None);
                let yields = m
                    .run_region(&kernel.body)
                    .map_err(|f| m.error(f, Loc::default()))?;
                if !yields.is_empty() {
                    let e = bad!("the kernel body must end in an empty `yield`");
                    return Err(m.error(e, Loc::default()));
                }
            }
        }
    }
    Ok(())
}

struct Machine<'m, 'a> {
    kernel: &'m Kernel,
    slots: &'m mut [Slot<'a>],
    map: &'m [usize],
    env: Vec<Option<Tile>>,
    pid: [u64; 3],
    depth: u32,
    /// Loop iterations the current instance may still run.
    left: u64,
    stage: &'m str,
    bounds: RunBounds<'m>,
}

impl Machine<'_, '_> {
    fn cancelled(&self) -> Error {
        Error::Cancelled {
            kernel: self.kernel.name.clone(),
            stage: self.stage.to_string(),
        }
    }

    /// One loop iteration's step (at the back-edge): the flag, then the instance's allowance.
    fn step(&mut self) -> R<()> {
        if self.bounds.cancelled() {
            return Err(Fault::Done(Box::new(self.cancelled())));
        }
        if self.left == 0 {
            return Err(Fault::Done(Box::new(Error::BudgetExceeded {
                kernel: self.kernel.name.clone(),
                stage: self.stage.to_string(),
                budget: self.bounds.steps,
            })));
        }
        self.left -= 1;
        Ok(())
    }

    /// Turns a fault into the public error, adding the kernel, op location and program id.
    fn error(&self, f: Fault, loc: Loc) -> Error {
        let kernel = self.kernel.name.clone();
        match f {
            Fault::Done(e) => *e,
            Fault::Malformed(message) => Error::Malformed {
                at: kernel_at(self.kernel, loc),
                message,
            },
            Fault::TileTooLarge(elements) => Error::TileTooLarge {
                kernel,
                loc,
                elements,
            },
            Fault::DivisionByZero => Error::DivisionByZero {
                kernel,
                loc,
                program_id: self.pid,
            },
            Fault::OutOfRange {
                param,
                index,
                dim,
                extent,
            } => Error::IndexOutOfRange {
                kernel,
                param: self
                    .kernel
                    .params
                    .get(param as usize)
                    .map(|p| p.name.clone())
                    .unwrap_or_default(),
                index,
                dim,
                extent,
                program_id: self.pid,
            },
        }
    }

    fn run_region(&mut self, region: &KRegion) -> R<Vec<Tile>> {
        if self.depth >= MAX_REGION_DEPTH {
            return Err(bad!("regions nested deeper than {MAX_REGION_DEPTH}"));
        }
        self.depth += 1;
        let r = self.region_ops(region);
        self.depth -= 1;
        r
    }

    fn region_ops(&mut self, region: &KRegion) -> R<Vec<Tile>> {
        let Some((last, body)) = region.ops.split_last() else {
            return Err(bad!("empty region (every region ends in `yield`)"));
        };
        for op in body {
            self.op(op)
                .map_err(|f| Fault::Done(Box::new(self.error(f, op.loc))))?;
        }
        let yields = match &last.kind {
            KOpKind::Yield(vals) if last.results.is_empty() => vals
                .iter()
                .map(|v| self.operand(v).map(Cow::into_owned))
                .collect::<R<Vec<_>>>(),
            KOpKind::Yield(_) => Err(bad!("`yield` has no results")),
            _ => Err(bad!("region does not end in `yield`")),
        };
        yields.map_err(|f| Fault::Done(Box::new(self.error(f, last.loc))))
    }

    fn op(&mut self, op: &KOp) -> R<()> {
        match &op.kind {
            KOpKind::Yield(_) => Err(bad!("`yield` before the end of its region")),
            KOpKind::Store {
                param,
                indices,
                value,
            } => {
                expect_results(op, 0)?;
                self.store(*param, indices, value)
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
                let lo = ops::int_scalar(&*self.operand(lo)?, "loop lower bound")?;
                let hi = ops::int_scalar(&*self.operand(hi)?, "loop upper bound")?;
                let step = ops::int_scalar(&*self.operand(step)?, "loop step")?;
                if step <= 0 {
                    return Err(bad!("loop step must be positive, got {step}"));
                }
                if inits.len() != iters.len() || op.results.len() != iters.len() {
                    return Err(bad!(
                        "loop has {} iteration values, {} initial values and {} results",
                        iters.len(),
                        inits.len(),
                        op.results.len()
                    ));
                }
                let mut cur = inits
                    .iter()
                    .map(|o| self.operand(o).map(Cow::into_owned))
                    .collect::<R<Vec<_>>>()?;
                let mut i = lo;
                while i < hi {
                    self.define(*iv, Tile::i64_scalar(i))?;
                    for (v, t) in iters.iter().zip(cur) {
                        self.define(*v, t)?;
                    }
                    cur = self.run_region(body)?;
                    if cur.len() != iters.len() {
                        return Err(bad!(
                            "loop body yields {} values for {} iteration values",
                            cur.len(),
                            iters.len()
                        ));
                    }
                    self.step()?;
                    // Past i64::MAX the loop is over (i would be >= hi).
                    let Some(next) = i.checked_add(step) else {
                        break;
                    };
                    i = next;
                }
                for (v, t) in op.results.iter().zip(cur) {
                    self.define(*v, t)?;
                }
                Ok(())
            }
            KOpKind::If {
                cond,
                then_region,
                else_region,
            } => {
                let c = self.operand(cond)?;
                let taken = match &c.data {
                    Data::I(v) if c.is_scalar() && c.dtype == DType::I1 => v[0] != 0,
                    _ => return Err(bad!("`if` condition must be an i1 scalar, got {c}")),
                };
                let vals = self.run_region(if taken { then_region } else { else_region })?;
                if vals.len() != op.results.len() {
                    return Err(bad!(
                        "`if` branch yields {} values for {} results",
                        vals.len(),
                        op.results.len()
                    ));
                }
                for (v, t) in op.results.iter().zip(vals) {
                    self.define(*v, t)?;
                }
                Ok(())
            }
            kind => {
                expect_results(op, 1)?;
                let t = self.compute(kind)?;
                self.define(op.results[0], t)
            }
        }
    }

    /// The single-result operations.
    fn compute(&self, kind: &KOpKind) -> R<Tile> {
        use KOpKind as K;
        match kind {
            K::ProgramId { axis } => {
                let p = self
                    .pid
                    .get(usize::from(*axis))
                    .ok_or_else(|| bad!("program_id axis {axis} (0..3)"))?;
                let p = i64::try_from(*p).map_err(|_| bad!("program id {p} exceeds i64"))?;
                Ok(Tile::i64_scalar(p))
            }
            K::Binary { op, a, b } => ops::binary(*op, &*self.operand(a)?, &*self.operand(b)?),
            K::Unary { op, a } => ops::unary(*op, &*self.operand(a)?),
            K::Cmp { op, a, b } => ops::cmp(*op, &*self.operand(a)?, &*self.operand(b)?),
            K::Select { cond, a, b } => ops::select(
                &*self.operand(cond)?,
                &*self.operand(a)?,
                &*self.operand(b)?,
            ),
            K::Cast { a, to } => ops::cast(&*self.operand(a)?, *to),
            K::Range { start, len } => ops::range(&*self.operand(start)?, *len),
            K::Full {
                value,
                shape,
                dtype,
            } => ops::full(&*self.operand(value)?, shape, *dtype),
            K::Broadcast { a, shape } => ops::broadcast(&*self.operand(a)?, shape),
            K::ExpandDims { a, axis } => ops::expand_dims(&*self.operand(a)?, *axis),
            K::Reshape { a, shape } => ops::reshape(&*self.operand(a)?, shape),
            K::Transpose { a } => ops::transpose(&*self.operand(a)?),
            K::Reduce { op, a, axis } => ops::reduce(*op, &*self.operand(a)?, *axis),
            K::Dot { a, b, acc } => {
                ops::dot(&*self.operand(a)?, &*self.operand(b)?, &*self.operand(acc)?)
            }
            K::Load {
                param,
                indices,
                fill,
            } => self.load(*param, indices, fill.as_ref()),
            K::Store { .. } | K::For { .. } | K::If { .. } | K::Yield(_) => {
                Err(bad!("internal: structured op reached `compute`"))
            }
        }
    }

    fn def(&self, v: KValue) -> R<&KValueDef> {
        self.kernel
            .values
            .get(v.0 as usize)
            .ok_or_else(|| bad!("value #{} does not exist", v.0))
    }

    fn operand(&self, o: &KOperand) -> R<Cow<'_, Tile>> {
        match o {
            KOperand::Value(v) => match self.env.get(v.0 as usize) {
                Some(Some(t)) => Ok(Cow::Borrowed(t)),
                Some(None) => Err(bad!("%{} is used before it is defined", self.def(*v)?.name)),
                None => Err(bad!("value #{} does not exist", v.0)),
            },
            KOperand::Imm(imm, dtype) => immediate(*imm, *dtype).map(Cow::Owned),
        }
    }

    /// Binds `v` to `t` after checking `t` against `v`'s declared type: the declared types are part of the IR
    /// contract, and a front end that declares one type and computes another is caught here.
    fn define(&mut self, v: KValue, t: Tile) -> R<()> {
        let def = self.def(v)?;
        let (shape, dtype): (&[u32], DType) = match &def.ty {
            KType::Scalar(d) => (&[], *d),
            KType::Tile { shape, dtype } => (shape, *dtype),
        };
        let same_shape = shape.len() == t.shape.len()
            && shape.iter().zip(&t.shape).all(|(&a, &b)| a as usize == b);
        if dtype != t.dtype || !same_shape {
            let mut declared = String::new();
            let _ = describe(&mut declared, &ops::shape_of(shape), dtype);
            return Err(bad!(
                "%{} is declared {declared} but its operation produces {t}",
                def.name
            ));
        }
        let slot = self
            .env
            .get_mut(v.0 as usize)
            .ok_or_else(|| bad!("value #{} does not exist", v.0))?;
        *slot = Some(t);
        Ok(())
    }

    fn param(&self, p: u32) -> R<&KParam> {
        self.kernel
            .params
            .get(p as usize)
            .ok_or_else(|| bad!("parameter #{p} does not exist"))
    }

    fn slot_index(&self, p: u32) -> R<usize> {
        self.map
            .get(p as usize)
            .copied()
            .ok_or_else(|| bad!("parameter #{p} is not bound to a buffer"))
    }

    /// Resolves the index operands of a load/store: the accessed tile's shape and, for every element in
    /// row-major order, its flat buffer element index (`None` when any index is outside the buffer). With
    /// `checked`, an index outside the buffer is an error instead.
    fn addresses(
        &self,
        param: u32,
        indices: &[KIndex],
        checked: bool,
    ) -> R<(Vec<usize>, Vec<Option<usize>>)> {
        let p = self.param(param)?;
        if indices.len() != p.shape.len() {
            return Err(bad!(
                "`{}` has {} dimensions but {} indices are given",
                p.name,
                p.shape.len(),
                indices.len()
            ));
        }
        let mut strides = vec![1usize; p.shape.len()];
        for d in (0..p.shape.len().saturating_sub(1)).rev() {
            // The buffer's byte size was checked against its shape, so these products fit.
            strides[d] = strides[d + 1].saturating_mul(p.shape[d + 1] as usize);
        }
        let mut shape = Vec::new();
        let mut acc: Vec<Option<usize>> = vec![Some(0)];
        for (d, ix) in indices.iter().enumerate() {
            let t = self.operand(ix)?;
            let vals = match &t.data {
                Data::I(v) if t.dtype == DType::I64 && t.shape.len() <= 1 => v,
                _ => {
                    return Err(bad!(
                        "index {d} of `{}` must be an i64 scalar or 1-D i64 tile, got {t}",
                        p.name
                    ));
                }
            };
            if let [n] = t.shape[..] {
                shape.push(n);
            }
            elements(&shape)?;
            let extent = p.shape[d];
            let offs: Vec<Option<usize>> = vals
                .iter()
                .map(|&i| (i >= 0 && (i as u64) < extent).then(|| i as usize * strides[d]))
                .collect();
            if checked {
                if let Some(k) = offs.iter().position(Option::is_none) {
                    return Err(Fault::OutOfRange {
                        param,
                        index: vals[k],
                        dim: d,
                        extent,
                    });
                }
            }
            acc = acc
                .iter()
                .flat_map(|&a| offs.iter().map(move |&o| a.zip(o).map(|(a, o)| a + o)))
                .collect();
        }
        Ok((shape, acc))
    }

    fn load(&self, param: u32, indices: &[KIndex], fill: Option<&KOperand>) -> R<Tile> {
        let p = self.param(param)?;
        if p.access == Access::Write {
            return Err(bad!("load from write-only parameter `{}`", p.name));
        }
        // Quantised buffers dequantise to f32.
        let dtype = if p.dtype.is_quantized() {
            DType::F32
        } else {
            p.dtype
        };
        let fill = match fill {
            Some(f) => {
                let t = self.operand(f)?.into_owned();
                ops::check_fill(&t, dtype, "load fill")?;
                Some(t.data)
            }
            None => None,
        };
        let (shape, offsets) = self.addresses(param, indices, fill.is_none())?;
        let slot = self
            .slots
            .get(self.slot_index(param)?)
            .ok_or_else(|| bad!("no buffer for `{}`", p.name))?;
        let bytes = slot.bytes();
        let short = || bad!("internal: element outside the buffer of `{}`", p.name);
        // A checked load has no out-of-range element, so its (absent) fill is never read.
        let data = if dtype.is_float() {
            let fill = if let Some(Data::F(v)) = &fill {
                v[0]
            } else {
                f64::NAN
            };
            let v = offsets.iter().map(|o| {
                o.map_or(Ok(fill), |g| {
                    read_float(p.dtype, bytes, g).ok_or_else(short)
                })
            });
            Data::F(v.collect::<R<_>>()?)
        } else {
            let fill = if let Some(Data::I(v)) = &fill {
                v[0]
            } else {
                0
            };
            let v = offsets
                .iter()
                .map(|o| o.map_or(Ok(fill), |g| read_int(p.dtype, bytes, g).ok_or_else(short)));
            Data::I(v.collect::<R<_>>()?)
        };
        Ok(Tile { dtype, shape, data })
    }

    /// Writes the in-range elements of a value, in row-major order (if indices repeat, the last write wins;
    /// devices leave that unspecified).
    fn store(&mut self, param: u32, indices: &[KIndex], value: &KOperand) -> R<()> {
        let p = self.param(param)?;
        if p.access == Access::Read {
            return Err(bad!("store to read-only parameter `{}`", p.name));
        }
        if p.dtype.is_quantized() {
            return Err(bad!(
                "store to `{}`: quantised buffers ({}) are read-only",
                p.name,
                p.dtype
            ));
        }
        let (dtype, name) = (p.dtype, p.name.clone());
        let (shape, offsets) = self.addresses(param, indices, false)?;
        let v = self.operand(value)?.into_owned();
        if v.dtype != dtype || v.shape != shape {
            let mut want = String::new();
            let _ = describe(&mut want, &shape, dtype);
            return Err(bad!("store to `{name}` needs a {want} value, got {v}"));
        }
        let idx = self.slot_index(param)?;
        let Some(Slot::Rw(bytes)) = self.slots.get_mut(idx) else {
            return Err(bad!(
                "store to `{name}`, which is bound to a read-only buffer"
            ));
        };
        let short = || bad!("internal: element outside the buffer of `{name}`");
        match &v.data {
            Data::F(x) => {
                for (o, &x) in offsets.iter().zip(x) {
                    if let Some(g) = o {
                        write_float(dtype, bytes, *g, x).ok_or_else(short)?;
                    }
                }
            }
            Data::I(x) => {
                for (o, &x) in offsets.iter().zip(x) {
                    if let Some(g) = o {
                        write_int(dtype, bytes, *g, x).ok_or_else(short)?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn expect_results(op: &KOp, n: usize) -> R<()> {
    if op.results.len() != n {
        return Err(bad!(
            "operation has {} results, expected {n}",
            op.results.len()
        ));
    }
    Ok(())
}

/// An immediate as a scalar tile of its tagged dtype. Float immediates are rounded to the dtype; integer
/// immediates must fit their integer dtype (or are converted to a float dtype); `i1` takes a bool (or 0/1).
pub(crate) fn immediate(imm: KImm, dtype: DType) -> R<Tile> {
    ops::check_value_dtype(dtype)?;
    let t = match imm {
        KImm::F64(x) if dtype.is_float() => Tile::float(dtype, vec![], vec![round_to(dtype, x)]),
        KImm::I64(x) if dtype.is_float() => {
            Tile::float(dtype, vec![], vec![int_to_float(dtype, x)])
        }
        KImm::I64(x) if wrap(dtype, x) == x => Tile::int(dtype, vec![], vec![x]),
        KImm::I1(b) if dtype == DType::I1 => Tile::int(dtype, vec![], vec![i64::from(b)]),
        _ => return Err(bad!("immediate {imm:?} is not a {dtype} value")),
    };
    Ok(t)
}
