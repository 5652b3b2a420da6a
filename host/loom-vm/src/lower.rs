//! Lowering: structured SSA IR → register bytecode (see the crate doc for the protocol).
//!
//! One pass per function. Every SSA value gets its own register in its bank (no liveness-based reuse: frames
//! are a few hundred registers at most); results of `for`/`while` share the registers of their iteration values,
//! so loop exits need no moves, and a value yielded into a loop register or `if` result is computed directly into
//! that register when nothing later reads the register's old value (copy coalescing), so most yields are free. Scalar immediates that cannot be folded
//! into an instruction are hoisted into "constant registers" set once by a prologue at function entry, so loops
//! never re-materialize constants.

use crate::LoadLimits;
use crate::code::*;
use crate::error::LoadError;
use loom_ir::{
    Callee, Function, Imm, Loc, Op, OpKind, Opcode, Operand, Program, Region, Type, ValueId,
};
use std::collections::HashMap;
use std::sync::Arc;

/// Program-wide interned types and strings.
#[derive(Debug, Default)]
pub(crate) struct Tables {
    pub(crate) types: Vec<Type>,
    type_ids: HashMap<Type, u32>,
    pub(crate) strs: Vec<Arc<str>>,
    str_ids: HashMap<String, u32>,
}

impl Tables {
    pub(crate) fn ty(&mut self, t: &Type) -> u32 {
        if let Some(&i) = self.type_ids.get(t) {
            return i;
        }
        let i = self.types.len() as u32;
        self.types.push(t.clone());
        self.type_ids.insert(t.clone(), i);
        i
    }
    fn str(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.str_ids.get(s) {
            return i;
        }
        let i = self.strs.len() as u32;
        self.strs.push(Arc::from(s));
        self.str_ids.insert(s.to_string(), i);
        i
    }
}

type Res<T> = Result<T, LoadError>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CmpK {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Ult,
    Ule,
    Ugt,
    Uge,
}

impl CmpK {
    fn negate(self) -> CmpK {
        use CmpK::*;
        match self {
            Eq => Ne,
            Ne => Eq,
            Lt => Ge,
            Ge => Lt,
            Le => Gt,
            Gt => Le,
            Ult => Uge,
            Uge => Ult,
            Ule => Ugt,
            Ugt => Ule,
        }
    }
}

/// The last integer compare emitted, kept so an `if`/`condition` that is its only use can fuse with it.
#[derive(Clone, Copy, Debug)]
struct LastCmp {
    v: ValueId,
    at: usize,
    kind: CmpK,
    wide: bool,
    a: R,
    b: Result<R, i32>,
}

/// A load/store offset.
#[derive(Clone, Copy, Debug)]
enum Addr {
    /// `s[r] + disp`
    Plain(R, i32),
    /// `s[x] + s[y] * sc + disp`
    X { x: R, y: R, sc: u8, disp: i32 },
    /// `(s[x] + s[y]) * sc + disp`
    XS { x: R, y: R, sc: u8, disp: i32 },
}

/// Constant reference registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum KR {
    Str(u32),
    Null,
}

struct L<'a> {
    prog: &'a Program,
    f: &'a Function,
    file: &'a str,
    tables: &'a mut Tables,
    limits: &'a LoadLimits,
    slots: Vec<Option<Slot>>,
    uses: Vec<u32>,
    n_s: u32,
    n_r: u32,
    code: Vec<Instr>,
    locs: Vec<Loc>,
    loc: Loc,
    kconst_s: HashMap<u64, R>,
    kconst_r: HashMap<KR, R>,
    prologue: Vec<Instr>,
    tmp_s: Option<R>,
    tmp_r: Option<R>,
    calls: Vec<CallSite>,
    natives: Vec<NativeSite>,
    rets: Vec<Box<[Slot]>>,
    opaques: Vec<Box<[(u32, Slot)]>>,
    last_cmp: Option<LastCmp>,
    /// The IR value each emitted instruction defines (parallel to `code`), for peephole fusion: an instruction
    /// may be folded into a later one only if it is the definition of a single-use operand.
    defs: Vec<Option<ValueId>>,
    cur_def: Option<ValueId>,
}

fn is_structured(op: &Op) -> bool {
    matches!(
        op.kind,
        OpKind::If { .. } | OpKind::For { .. } | OpKind::While { .. }
    )
}

/// Fuel of the block starting at `ops[start]`: ops up to and including the next structured op or terminator.
fn seg_cost(ops: &[Op], start: usize) -> u32 {
    let mut n = 0u32;
    for op in ops.iter().skip(start) {
        n = n.saturating_add(1);
        if is_structured(op) {
            break;
        }
    }
    n
}

fn ends_in_return(ops: &[Op]) -> bool {
    matches!(ops.last().map(|o| &o.kind), Some(OpKind::Return(_)))
}

/// Fuel charged on entry to a region: its first block, plus `extra` (the enclosing continuation block) when the
/// region is one straight block that falls through to that continuation.
fn entry_cost(r: &Region, extra: u32) -> u32 {
    let straight = !r.ops.iter().any(is_structured);
    let c = seg_cost(&r.ops, 0);
    if straight && !ends_in_return(&r.ops) {
        c.saturating_add(extra)
    } else {
        c
    }
}

/// Parameter slots of a function signature: scalars and references numbered separately, in order.
pub(crate) fn param_slots(params: &[Type]) -> Vec<Slot> {
    let (mut s, mut r) = (0u16, 0u16);
    params
        .iter()
        .map(|t| {
            if t.is_scalar() {
                s = s.wrapping_add(1);
                Slot::S(s.wrapping_sub(1))
            } else {
                r = r.wrapping_add(1);
                Slot::R(r.wrapping_sub(1))
            }
        })
        .collect()
}

pub(crate) fn lower_function(
    prog: &Program,
    fi: usize,
    tables: &mut Tables,
    limits: &LoadLimits,
) -> Res<FuncCode> {
    let f = &prog.funcs[fi];
    let file_idx = prog.func_files.get(fi).copied().unwrap_or(0);
    let file = prog
        .files
        .get(file_idx as usize)
        .map(String::as_str)
        .unwrap_or("<unknown>");
    let mut l = L {
        prog,
        f,
        file,
        tables,
        limits,
        slots: vec![None; f.values.len()],
        uses: vec![0; f.values.len()],
        n_s: 0,
        n_r: 0,
        code: Vec::new(),
        locs: Vec::new(),
        loc: f.loc,
        kconst_s: HashMap::new(),
        kconst_r: HashMap::new(),
        prologue: Vec::new(),
        tmp_s: None,
        tmp_r: None,
        calls: Vec::new(),
        natives: Vec::new(),
        rets: Vec::new(),
        opaques: Vec::new(),
        last_cmp: None,
        defs: Vec::new(),
        cur_def: None,
    };
    if !f.tparams.is_empty() {
        return Err(l.invalid("templates must be instantiated before loading"));
    }
    l.assign_slots()?;
    let entry_fuel = entry_cost(&f.body, 0);
    if let Some(t) = l.lower_block(&f.body.ops, 0)? {
        l.loc = t.loc;
        return Err(l.invalid("the function body must end in `return`"));
    }
    let (body_code, body_locs) =
        thread_latches(std::mem::take(&mut l.code), std::mem::take(&mut l.locs));
    l.code = body_code;
    l.locs = body_locs;
    // Prepend the constant prologue and shift every jump target past it.
    let shift = l.prologue.len() as u32;
    let mut code = std::mem::take(&mut l.prologue);
    let mut locs = vec![f.loc; code.len()];
    for mut ins in l.code.drain(..) {
        if let Some(t) = ins.target_mut() {
            *t += shift;
        }
        code.push(ins);
    }
    locs.append(&mut l.locs);
    if code.len() as u64 > limits.max_code_per_function as u64 {
        return Err(LoadError::Limit {
            func: f.name.clone(),
            message: format!(
                "function lowers to {} instructions, above the limit of {}",
                code.len(),
                limits.max_code_per_function
            ),
            loc: f.loc,
            file: file.to_string(),
        });
    }
    let param_types: Vec<Type> = f
        .params
        .iter()
        .map(|v| f.values.get(v.0 as usize).map(|d| d.ty.clone()))
        .collect::<Option<_>>()
        .ok_or_else(|| l.invalid("parameter out of range"))?;
    let params = f
        .params
        .iter()
        .map(|v| l.slot(*v))
        .collect::<Res<Vec<_>>>()?;
    Ok(FuncCode {
        name: f.name.clone(),
        file: file_idx,
        loc: f.loc,
        code,
        locs,
        n_s: l.n_s,
        n_r: l.n_r,
        params,
        param_types,
        result_types: f.results.clone(),
        entry_fuel,
        calls: l.calls,
        natives: l.natives,
        rets: l.rets,
        opaques: l.opaques,
    })
}

/// Latch duplication: a fuel-free `Jump` to a `ForLoop` (an `if` branch rejoining at a loop's latch) becomes a
/// copy of the `ForLoop` followed by a `Jump` past the original, so the common path takes one dispatch instead of
/// two. Fuel and semantics are unchanged: the copy charges and jumps exactly like the original.
fn thread_latches(code: Vec<Instr>, locs: Vec<Loc>) -> (Vec<Instr>, Vec<Loc>) {
    let latch = |ins: &Instr| match *ins {
        Instr::Jump { target, fuel: 0 } => match code.get(target as usize) {
            Some(Instr::ForLoop { .. } | Instr::ForLoopK { .. }) => Some(target),
            _ => None,
        },
        _ => None,
    };
    if !code.iter().any(|i| latch(i).is_some()) {
        return (code, locs);
    }
    let mut newpc = Vec::with_capacity(code.len() + 1);
    let mut n = 0u32;
    for ins in &code {
        newpc.push(n);
        n += if latch(ins).is_some() { 2 } else { 1 };
    }
    newpc.push(n);
    let map = |t: u32| newpc.get(t as usize).copied().unwrap_or(t);
    let mut out = Vec::with_capacity(n as usize);
    let mut out_locs = Vec::with_capacity(n as usize);
    for (i, ins) in code.iter().enumerate() {
        let loc = locs.get(i).copied().unwrap_or_default();
        if let Some(t) = latch(ins) {
            let mut f = code[t as usize];
            if let Some(ft) = f.target_mut() {
                *ft = map(*ft);
            }
            out.push(f);
            out_locs.push(locs.get(t as usize).copied().unwrap_or(loc));
            out.push(Instr::Jump {
                target: map(t + 1),
                fuel: 0,
            });
            out_locs.push(loc);
        } else {
            let mut ins = *ins;
            if let Some(t) = ins.target_mut() {
                *t = map(*t);
            }
            out.push(ins);
            out_locs.push(loc);
        }
    }
    (out, out_locs)
}

impl L<'_> {
    fn invalid(&self, msg: impl Into<String>) -> LoadError {
        LoadError::Invalid {
            func: self.f.name.clone(),
            message: msg.into(),
            loc: self.loc,
            file: self.file.to_string(),
        }
    }

    fn new_reg(&mut self, scalar: bool) -> Res<R> {
        let n = if scalar { &mut self.n_s } else { &mut self.n_r };
        if *n >= self.limits.max_registers.min(u16::MAX as u32) {
            let (func, file, loc, max) = (
                self.f.name.clone(),
                self.file.to_string(),
                self.f.loc,
                self.limits.max_registers,
            );
            return Err(LoadError::Limit {
                func,
                message: format!(
                    "needs more than {max} {} registers per frame",
                    if scalar { "scalar" } else { "reference" }
                ),
                loc,
                file,
            });
        }
        *n += 1;
        Ok((*n - 1) as R)
    }

    fn new_slot(&mut self, t: &Type) -> Res<Slot> {
        Ok(if t.is_scalar() {
            Slot::S(self.new_reg(true)?)
        } else {
            Slot::R(self.new_reg(false)?)
        })
    }

    fn vty(&self, v: ValueId) -> Res<&Type> {
        self.f
            .values
            .get(v.0 as usize)
            .map(|d| &d.ty)
            .ok_or_else(|| self.invalid(format!("value {} out of range", v.0)))
    }

    fn slot(&self, v: ValueId) -> Res<Slot> {
        self.slots
            .get(v.0 as usize)
            .copied()
            .flatten()
            .ok_or_else(|| self.invalid(format!("value {} has no register", v.0)))
    }

    /// Counts uses, then gives parameters the first registers, loop results their iteration values' registers,
    /// and every other value its own register.
    fn assign_slots(&mut self) -> Res<()> {
        let mut alias: Vec<(ValueId, ValueId)> = Vec::new();
        let mut stack: Vec<&Region> = vec![&self.f.body];
        let count = |o: &Operand, uses: &mut Vec<u32>| {
            if let Operand::Value(v) = o {
                if let Some(u) = uses.get_mut(v.0 as usize) {
                    *u += 1;
                }
            }
        };
        while let Some(r) = stack.pop() {
            for op in &r.ops {
                match &op.kind {
                    OpKind::Simple { operands, .. } => {
                        operands.iter().for_each(|o| count(o, &mut self.uses))
                    }
                    OpKind::Call { args, .. } => args.iter().for_each(|o| count(o, &mut self.uses)),
                    OpKind::If {
                        cond,
                        then_region,
                        else_region,
                    } => {
                        count(cond, &mut self.uses);
                        stack.push(then_region);
                        stack.push(else_region);
                    }
                    OpKind::For {
                        lo,
                        hi,
                        step,
                        iters,
                        inits,
                        body,
                        ..
                    } => {
                        for o in [lo, hi, step].into_iter().chain(inits) {
                            count(o, &mut self.uses);
                        }
                        if iters.len() != op.results.len() {
                            return Err(
                                self.invalid("`for` must have one result per iteration value")
                            );
                        }
                        alias.extend(op.results.iter().copied().zip(iters.iter().copied()));
                        stack.push(body);
                    }
                    OpKind::While {
                        iters,
                        inits,
                        cond_region,
                        body,
                    } => {
                        inits.iter().for_each(|o| count(o, &mut self.uses));
                        if iters.len() != op.results.len() {
                            return Err(
                                self.invalid("`while` must have one result per iteration value")
                            );
                        }
                        alias.extend(op.results.iter().copied().zip(iters.iter().copied()));
                        stack.push(cond_region);
                        stack.push(body);
                    }
                    OpKind::Yield(os) | OpKind::Return(os) => {
                        os.iter().for_each(|o| count(o, &mut self.uses))
                    }
                    OpKind::Condition(o) => count(o, &mut self.uses),
                }
            }
        }
        let f = self.f;
        for p in &f.params {
            let t = self.vty(*p)?.clone();
            let s = self.new_slot(&t)?;
            match self.slots.get_mut(p.0 as usize) {
                Some(x) if x.is_none() => *x = Some(s),
                _ => return Err(self.invalid("duplicate or out-of-range parameter")),
            }
        }
        let aliased: std::collections::HashSet<ValueId> = alias.iter().map(|(r, _)| *r).collect();
        for (i, d) in f.values.iter().enumerate() {
            if self.slots[i].is_none() && !aliased.contains(&ValueId(i as u32)) {
                self.slots[i] = Some(self.new_slot(&d.ty)?);
            }
        }
        for (res, iter) in alias {
            let s = self.slot(iter)?;
            if self.vty(res)?.is_scalar() != self.vty(iter)?.is_scalar() {
                return Err(
                    self.invalid("a loop result and its iteration value have different types")
                );
            }
            match self.slots.get_mut(res.0 as usize) {
                Some(x) if x.is_none() => *x = Some(s),
                _ => return Err(self.invalid("a loop result is defined twice")),
            }
        }
        let mut fixed: std::collections::HashSet<ValueId> = aliased;
        fixed.extend(f.params.iter().copied());
        self.coalesce_region(&f.body, &mut fixed);
        Ok(())
    }

    /// Copy coalescing: a value `u` defined by op `j` of a region whose terminator yields it into a target
    /// register `T` (a loop's iteration value or an `if`'s result) is given register `T` itself when nothing after
    /// op `j` reads `T`'s old value. The yield's move then disappears. Outer regions are processed first so an
    /// `if` result already sharing a loop register is seen as that register by its branches.
    fn coalesce_region(&mut self, r: &Region, fixed: &mut std::collections::HashSet<ValueId>) {
        for op in &r.ops {
            match &op.kind {
                OpKind::If {
                    then_region,
                    else_region,
                    ..
                } => {
                    self.coalesce_yield(then_region, &op.results, fixed);
                    self.coalesce_yield(else_region, &op.results, fixed);
                    self.coalesce_region(then_region, fixed);
                    self.coalesce_region(else_region, fixed);
                }
                OpKind::For { iters, body, .. } => {
                    self.coalesce_yield(body, iters, fixed);
                    self.coalesce_region(body, fixed);
                }
                OpKind::While {
                    iters,
                    cond_region,
                    body,
                    ..
                } => {
                    self.coalesce_yield(body, iters, fixed);
                    self.coalesce_region(cond_region, fixed);
                    self.coalesce_region(body, fixed);
                }
                _ => {}
            }
        }
    }

    fn coalesce_yield(
        &mut self,
        r: &Region,
        targets: &[ValueId],
        fixed: &mut std::collections::HashSet<ValueId>,
    ) {
        let Some((term, body)) = r.ops.split_last() else {
            return;
        };
        let OpKind::Yield(os) = &term.kind else {
            return;
        };
        for (i, (o, t)) in os.iter().zip(targets).enumerate() {
            let Operand::Value(u) = o else { continue };
            let (Ok(ts), Ok(us)) = (self.slot(*t), self.slot(*u)) else {
                continue;
            };
            if ts == us || fixed.contains(u) {
                continue;
            }
            let Some(j) = body.iter().position(|op| op.results.contains(u)) else {
                continue;
            };
            // Nothing after the definition may read the target register, and no other yield operand may.
            let later_reads = body[j + 1..].iter().any(|op| self.op_reads(op, ts));
            let other_yield_reads = os.iter().enumerate().any(|(k, o)| {
                k != i && matches!(o, Operand::Value(w) if self.slot(*w).ok() == Some(ts))
            });
            if later_reads || other_yield_reads {
                continue;
            }
            if let Some(x) = self.slots.get_mut(u.0 as usize) {
                *x = Some(ts);
                fixed.insert(*u);
            }
        }
    }

    /// Whether `op` (including nested regions) reads a value living in register `s`.
    fn op_reads(&self, op: &Op, s: Slot) -> bool {
        let rd = |o: &Operand| matches!(o, Operand::Value(v) if self.slot(*v).ok() == Some(s));
        let region = |r: &Region| r.ops.iter().any(|o| self.op_reads(o, s));
        match &op.kind {
            OpKind::Simple { operands, .. } => operands.iter().any(rd),
            OpKind::Call { args, .. } => args.iter().any(rd),
            OpKind::If {
                cond,
                then_region,
                else_region,
            } => rd(cond) || region(then_region) || region(else_region),
            OpKind::For {
                lo,
                hi,
                step,
                inits,
                body,
                ..
            } => rd(lo) || rd(hi) || rd(step) || inits.iter().any(rd) || region(body),
            OpKind::While {
                inits,
                cond_region,
                body,
                ..
            } => inits.iter().any(rd) || region(cond_region) || region(body),
            OpKind::Yield(os) | OpKind::Return(os) => os.iter().any(rd),
            OpKind::Condition(o) => rd(o),
        }
    }

    // ---- emission ----

    fn emit(&mut self, i: Instr) -> usize {
        self.code.push(i);
        self.locs.push(self.loc);
        self.defs.push(self.cur_def);
        self.code.len() - 1
    }
    fn pc(&self) -> u32 {
        self.code.len() as u32
    }
    fn patch(&mut self, at: Option<usize>, target: u32) {
        if let Some(t) = at
            .and_then(|at| self.code.get_mut(at))
            .and_then(Instr::target_mut)
        {
            *t = target;
        }
    }
    fn fuel(&mut self, n: u32) {
        if n > 0 {
            self.emit(Instr::Fuel { n });
        }
    }

    // ---- operands ----

    fn imm_bits(&self, imm: &Imm, want: &Type) -> Res<u64> {
        let bad = || self.invalid(format!("immediate {imm:?} does not fit type {want}"));
        Ok(match (imm, want) {
            (Imm::I1(b), Type::I1) => *b as u64,
            (Imm::I32(v), Type::I32) => *v as u32 as u64,
            (Imm::I64(v), Type::I32) => i32::try_from(*v).map_err(|_| bad())? as u32 as u64,
            (Imm::I32(v), Type::I64) => *v as i64 as u64,
            (Imm::I64(v), Type::I64) => *v as u64,
            (Imm::F32(v), Type::F32) => v.to_bits() as u64,
            (Imm::F64(v), Type::F32) => (*v as f32).to_bits() as u64,
            (Imm::F32(v), Type::F64) => (*v as f64).to_bits(),
            (Imm::F64(v), Type::F64) => v.to_bits(),
            (Imm::I32(v), Type::F64) => (*v as f64).to_bits(),
            (Imm::I64(v), Type::F64) => (*v as f64).to_bits(),
            (Imm::I32(v), Type::F32) => (*v as f32).to_bits() as u64,
            (Imm::I64(v), Type::F32) => (*v as f32).to_bits() as u64,
            _ => return Err(bad()),
        })
    }

    /// The integer value of an immediate operand of integer type `t`, if it fits an `i32` field.
    fn k32(&self, o: &Operand, t: &Type) -> Option<i32> {
        let v: i64 = match o {
            Operand::Imm(Imm::I32(v)) => *v as i64,
            Operand::Imm(Imm::I64(v)) => *v,
            _ => return None,
        };
        match t {
            Type::I32 | Type::I64 => i32::try_from(v).ok(),
            _ => None,
        }
    }

    fn const_s(&mut self, bits: u64) -> Res<R> {
        if let Some(&r) = self.kconst_s.get(&bits) {
            return Ok(r);
        }
        let d = self.new_reg(true)?;
        self.prologue.push(Instr::ConstS { d, bits });
        self.kconst_s.insert(bits, d);
        Ok(d)
    }

    fn const_r(&mut self, k: KR) -> Res<R> {
        if let Some(&r) = self.kconst_r.get(&k) {
            return Ok(r);
        }
        let d = self.new_reg(false)?;
        self.prologue.push(match k {
            KR::Str(idx) => Instr::ConstStr { d, idx },
            KR::Null => Instr::ConstNull { d },
        });
        self.kconst_r.insert(k, d);
        Ok(d)
    }

    fn record_field(&self, r: u32, fld: Option<u32>) -> Res<(u64, u64, Type)> {
        let rec = self
            .prog
            .records
            .get(r as usize)
            .ok_or_else(|| self.invalid(format!("record {r} out of range")))?;
        let (offs, size) = rec.layout();
        match fld {
            None => Ok((size, 0, Type::I64)),
            Some(fi) => {
                let off = offs
                    .get(fi as usize)
                    .copied()
                    .ok_or_else(|| self.invalid("record field out of range"))?;
                let t = rec
                    .fields
                    .get(fi as usize)
                    .map(|(_, t)| t.clone())
                    .ok_or_else(|| self.invalid("record field out of range"))?;
                Ok((size, off, t))
            }
        }
    }

    /// A scalar operand as a register.
    fn sreg(&mut self, o: &Operand, want: &Type) -> Res<R> {
        match o {
            Operand::Value(v) => match self.slot(*v)? {
                Slot::S(r) => Ok(r),
                Slot::R(_) => Err(self.invalid(format!("value {} is not a scalar", v.0))),
            },
            Operand::Imm(i) => {
                let bits = self.imm_bits(i, want)?;
                self.const_s(bits)
            }
            Operand::Record(r) => {
                let (size, _, _) = self.record_field(*r, None)?;
                self.const_s(size)
            }
            Operand::Field(r, f) => {
                let (_, off, _) = self.record_field(*r, Some(*f))?;
                self.const_s(off)
            }
            Operand::TParam(_) => {
                Err(self.invalid("template parameter operand in a linked program"))
            }
        }
    }

    /// A reference operand as a register.
    fn rreg(&mut self, o: &Operand) -> Res<R> {
        match o {
            Operand::Value(v) => match self.slot(*v)? {
                Slot::R(r) => Ok(r),
                Slot::S(_) => Err(self.invalid(format!("value {} is not a reference", v.0))),
            },
            Operand::Imm(Imm::Str(s)) => {
                let idx = self.tables.str(s);
                self.const_r(KR::Str(idx))
            }
            Operand::Imm(Imm::Null(_)) => self.const_r(KR::Null),
            _ => Err(self.invalid("expected a reference operand")),
        }
    }

    fn slot_of(&mut self, o: &Operand, want: &Type) -> Res<Slot> {
        if want.is_scalar() {
            Ok(Slot::S(self.sreg(o, want)?))
        } else {
            Ok(Slot::R(self.rreg(o)?))
        }
    }

    fn opnd_ty(&self, o: &Operand) -> Option<Type> {
        match o {
            Operand::Value(v) => self.vty(*v).ok().cloned(),
            Operand::Imm(i) => Some(i.ty()),
            Operand::Record(_) => Some(Type::I64),
            Operand::Field(r, f) => self.record_field(*r, Some(*f)).ok().map(|x| x.2),
            Operand::TParam(_) => None,
        }
    }

    /// The operation type of same-typed operands: the first value's type, else the first immediate's.
    fn common_ty(&self, os: &[Operand]) -> Res<Type> {
        os.iter()
            .find_map(|o| {
                if let Operand::Value(v) = o {
                    self.vty(*v).ok().cloned()
                } else {
                    None
                }
            })
            .or_else(|| os.first().and_then(|o| self.opnd_ty(o)))
            .ok_or_else(|| self.invalid("cannot type operands"))
    }

    // ---- moves ----

    fn tmp(&mut self, scalar: bool) -> Res<R> {
        let t = if scalar { self.tmp_s } else { self.tmp_r };
        if let Some(t) = t {
            return Ok(t);
        }
        let t = self.new_reg(scalar)?;
        if scalar {
            self.tmp_s = Some(t)
        } else {
            self.tmp_r = Some(t)
        }
        Ok(t)
    }

    fn mov(&mut self, d: Slot, s: Slot) -> Res<()> {
        match (d, s) {
            (Slot::S(d), Slot::S(a)) => self.emit(Instr::MovS { d, a }),
            (Slot::R(d), Slot::R(a)) => self.emit(Instr::MovR { d, a }),
            _ => return Err(self.invalid("move between register banks")),
        };
        Ok(())
    }

    /// Emits a parallel move (all sources read before any destination is written), breaking cycles with a
    /// scratch register.
    fn parallel_move(&mut self, moves: Vec<(Slot, Slot)>) -> Res<()> {
        let mut pending: Vec<(Slot, Slot)> = moves.into_iter().filter(|(d, s)| d != s).collect();
        while !pending.is_empty() {
            if let Some(i) = pending
                .iter()
                .position(|(d, _)| !pending.iter().any(|(_, s)| s == d))
            {
                let (d, s) = pending.remove(i);
                self.mov(d, s)?;
                continue;
            }
            // Every destination is still needed as a source: save one destination's value, redirect its readers.
            let (d, _) = pending[0];
            let t = match d {
                Slot::S(_) => Slot::S(self.tmp(true)?),
                Slot::R(_) => Slot::R(self.tmp(false)?),
            };
            self.mov(t, d)?;
            for m in pending.iter_mut() {
                if m.1 == d {
                    m.1 = t;
                }
            }
        }
        Ok(())
    }

    fn yield_into(&mut self, operands: &[Operand], dsts: &[ValueId]) -> Res<()> {
        if operands.len() != dsts.len() {
            return Err(self.invalid(format!(
                "yield of {} values where {} are expected",
                operands.len(),
                dsts.len()
            )));
        }
        let mut moves = Vec::with_capacity(dsts.len());
        for (o, d) in operands.iter().zip(dsts) {
            let t = self.vty(*d)?.clone();
            let s = self.slot_of(o, &t)?;
            moves.push((self.slot(*d)?, s));
        }
        self.parallel_move(moves)
    }

    // ---- regions ----

    /// Lowers a region's ops. Returns its `yield`/`condition` terminator for the caller to handle (`return` is
    /// handled here). `extra` is fuel the region must charge when its last block starts (the enclosing
    /// continuation block), merged into a nested structured op's exit.
    fn lower_block<'o>(&mut self, ops: &'o [Op], extra: u32) -> Res<Option<&'o Op>> {
        let Some((term, body)) = ops.split_last() else {
            return Err(self.invalid("empty region"));
        };
        let extra = if ends_in_return(ops) { 0 } else { extra };
        for (i, op) in body.iter().enumerate() {
            self.loc = op.loc;
            if is_structured(op) {
                let rest = &ops[i + 1..];
                let mut k = seg_cost(rest, 0);
                if !rest.iter().any(is_structured) {
                    k = k.saturating_add(extra);
                }
                self.lower_structured(op, k)?;
            } else {
                self.lower_op(op)?;
            }
        }
        self.loc = term.loc;
        match &term.kind {
            OpKind::Return(os) => {
                let f = self.f;
                if os.len() != f.results.len() {
                    return Err(self.invalid("return arity does not match the function's results"));
                }
                let mut slots = Vec::with_capacity(os.len());
                for (o, t) in os.iter().zip(&f.results) {
                    slots.push(self.slot_of(o, t)?);
                }
                let site = self.rets.len() as u32;
                self.rets.push(slots.into());
                self.emit(Instr::Ret { site });
                Ok(None)
            }
            OpKind::Yield(_) | OpKind::Condition(_) => Ok(Some(term)),
            _ => Err(self.invalid("region does not end in a terminator")),
        }
    }

    /// Emits "jump to (patched later) when `cond` is false, else charge `fuel` and fall through". The branch's
    /// taken-path charge starts at 0 (see [`L::set_taken_fuel`]).
    fn branch_false(&mut self, cond: &Operand, fuel: u32) -> Res<Option<usize>> {
        match cond {
            Operand::Imm(Imm::I1(true)) => {
                self.fuel(fuel);
                return Ok(None);
            }
            Operand::Imm(Imm::I1(false)) => {
                return Ok(Some(self.emit(Instr::Jump { target: 0, fuel: 0 })));
            }
            _ => {}
        }
        // Branch fuel is a u16; a larger block is charged by a separate `Fuel` after the branch.
        let (fuel, spill) = match u16::try_from(fuel) {
            Ok(f) => (f, 0),
            Err(_) => (0, fuel),
        };
        let (target, tfuel) = (0, 0);
        if let (Operand::Value(v), Some(lc)) = (cond, self.last_cmp) {
            if lc.v == *v && lc.at + 1 == self.code.len() && self.uses.get(v.0 as usize) == Some(&1)
            {
                self.code.pop();
                self.locs.pop();
                self.defs.pop();
                let a = lc.a;
                let k = lc.kind.negate();
                // `(x & mask) ==/!= 0` where the `and` is single-use and right before: test-and-branch.
                if let (Err(0), CmpK::Eq | CmpK::Ne, Some(at)) =
                    (lc.b, k, self.code.len().checked_sub(1))
                {
                    if let (Some(Instr::AndK { d, a: src, k: mask }), Some(Some(w))) =
                        (self.code.get(at).copied(), self.defs.get(at).copied())
                    {
                        if d == a
                            && self.uses.get(w.0 as usize) == Some(&1)
                            && self.slot(w).ok() == Some(Slot::S(d))
                        {
                            self.code.pop();
                            self.locs.pop();
                            self.defs.pop();
                            let a = src;
                            let ins = if k == CmpK::Eq {
                                Instr::JTestZ {
                                    a,
                                    mask,
                                    target,
                                    fuel,
                                    tfuel,
                                }
                            } else {
                                Instr::JTestNz {
                                    a,
                                    mask,
                                    target,
                                    fuel,
                                    tfuel,
                                }
                            };
                            self.last_cmp = None;
                            let at = self.emit(ins);
                            self.fuel(spill);
                            return Ok(Some(at));
                        }
                    }
                }
                macro_rules! j {
                    ($v:ident, $b:expr) => {
                        Instr::$v {
                            a,
                            b: $b,
                            target,
                            fuel,
                            tfuel,
                        }
                    };
                }
                macro_rules! jk {
                    ($v:ident, $k:expr) => {
                        Instr::$v {
                            a,
                            k: $k,
                            target,
                            fuel,
                            tfuel,
                        }
                    };
                }
                let ins = match lc.b {
                    Ok(b) => match (k, lc.wide) {
                        (CmpK::Eq, _) => j!(JEq, b),
                        (CmpK::Ne, _) => j!(JNe, b),
                        (CmpK::Ult, _) => j!(JUlt, b),
                        (CmpK::Ule, _) => j!(JUle, b),
                        (CmpK::Ugt, _) => j!(JUgt, b),
                        (CmpK::Uge, _) => j!(JUge, b),
                        (CmpK::Lt, true) => j!(JLt64, b),
                        (CmpK::Le, true) => j!(JLe64, b),
                        (CmpK::Gt, true) => j!(JGt64, b),
                        (CmpK::Ge, true) => j!(JGe64, b),
                        (CmpK::Lt, false) => j!(JLt32, b),
                        (CmpK::Le, false) => j!(JLe32, b),
                        (CmpK::Gt, false) => j!(JGt32, b),
                        (CmpK::Ge, false) => j!(JGe32, b),
                    },
                    Err(k32) => match (k, lc.wide) {
                        (CmpK::Eq, _) => jk!(JEqK, k32),
                        (CmpK::Ne, _) => jk!(JNeK, k32),
                        (CmpK::Lt, true) => jk!(JLtK64, k32),
                        (CmpK::Le, true) => jk!(JLeK64, k32),
                        (CmpK::Gt, true) => jk!(JGtK64, k32),
                        (CmpK::Ge, true) => jk!(JGeK64, k32),
                        (CmpK::Lt, false) => jk!(JLtK32, k32),
                        (CmpK::Le, false) => jk!(JLeK32, k32),
                        (CmpK::Gt, false) => jk!(JGtK32, k32),
                        (CmpK::Ge, false) => jk!(JGeK32, k32),
                        _ => {
                            return Err(
                                self.invalid("unsigned compare with an immediate cannot fuse")
                            );
                        }
                    },
                };
                self.last_cmp = None;
                let at = self.emit(ins);
                self.fuel(spill);
                return Ok(Some(at));
            }
        }
        let c = self.sreg(cond, &Type::I1)?;
        let at = self.emit(Instr::Jz {
            c,
            target,
            fuel,
            tfuel,
        });
        self.fuel(spill);
        Ok(Some(at))
    }

    /// Makes the branch at `at` charge `n` when taken (the block at its target); emits `Fuel { n }` at the current
    /// pc (the branch's target) when the branch cannot carry it. Only for targets nothing else jumps to.
    fn set_taken_fuel(&mut self, at: Option<usize>, n: u32) {
        if n == 0 {
            return;
        }
        let slot = at.and_then(|at| self.code.get_mut(at));
        let done = match slot {
            Some(Instr::Jump { fuel, .. }) if *fuel == 0 => {
                *fuel = n;
                true
            }
            Some(
                Instr::Jz { tfuel, .. }
                | Instr::JEq { tfuel, .. }
                | Instr::JNe { tfuel, .. }
                | Instr::JUlt { tfuel, .. }
                | Instr::JUle { tfuel, .. }
                | Instr::JUgt { tfuel, .. }
                | Instr::JUge { tfuel, .. }
                | Instr::JLt64 { tfuel, .. }
                | Instr::JLe64 { tfuel, .. }
                | Instr::JGt64 { tfuel, .. }
                | Instr::JGe64 { tfuel, .. }
                | Instr::JLt32 { tfuel, .. }
                | Instr::JLe32 { tfuel, .. }
                | Instr::JGt32 { tfuel, .. }
                | Instr::JGe32 { tfuel, .. }
                | Instr::JEqK { tfuel, .. }
                | Instr::JNeK { tfuel, .. }
                | Instr::JLtK64 { tfuel, .. }
                | Instr::JLeK64 { tfuel, .. }
                | Instr::JGtK64 { tfuel, .. }
                | Instr::JGeK64 { tfuel, .. }
                | Instr::JLtK32 { tfuel, .. }
                | Instr::JLeK32 { tfuel, .. }
                | Instr::JGtK32 { tfuel, .. }
                | Instr::JGeK32 { tfuel, .. }
                | Instr::JTestNz { tfuel, .. }
                | Instr::JTestZ { tfuel, .. },
            ) if *tfuel == 0 => match u16::try_from(n) {
                Ok(n) => {
                    *tfuel = n;
                    true
                }
                Err(_) => false,
            },
            _ => false,
        };
        if !done {
            self.fuel(n);
        }
    }

    fn lower_structured(&mut self, op: &Op, k: u32) -> Res<()> {
        match &op.kind {
            OpKind::If {
                cond,
                then_region,
                else_region,
            } => {
                let br = self.branch_false(cond, entry_cost(then_region, k))?;
                let mut jend = None;
                if let Some(t) = self.lower_block(&then_region.ops, k)? {
                    let OpKind::Yield(os) = &t.kind else {
                        return Err(self.invalid("`if` region must end in yield"));
                    };
                    self.yield_into(os, &op.results)?;
                    self.loc = op.loc;
                    jend = Some(self.emit(Instr::Jump { target: 0, fuel: 0 }));
                }
                let else_pc = self.pc();
                self.patch(br, else_pc);
                // Only `br` reaches the else block: it charges the else block's entry when taken.
                self.set_taken_fuel(br, entry_cost(else_region, k));
                if let Some(t) = self.lower_block(&else_region.ops, k)? {
                    let OpKind::Yield(os) = &t.kind else {
                        return Err(self.invalid("`if` region must end in yield"));
                    };
                    self.yield_into(os, &op.results)?;
                }
                let end = self.pc();
                self.patch(jend, end);
            }
            OpKind::For {
                lo,
                hi,
                step,
                iv,
                iters,
                inits,
                body,
            } => {
                if *self.vty(*iv)? != Type::I64 {
                    return Err(self.invalid("the VM supports `for` over i64 only"));
                }
                let Slot::S(ivr) = self.slot(*iv)? else {
                    return Err(self.invalid("bad induction variable"));
                };
                let lo_r = self.sreg(lo, &Type::I64)?;
                let hi_r = self.sreg(hi, &Type::I64)?;
                let step_r = self.sreg(step, &Type::I64)?;
                if !matches!(self.k32(step, &Type::I64), Some(s) if s > 0) {
                    self.emit(Instr::StepCheck { step: step_r });
                }
                let mut moves = vec![(Slot::S(ivr), Slot::S(lo_r))];
                if inits.len() != iters.len() {
                    return Err(self.invalid("`for` needs one initial value per iteration value"));
                }
                for (o, it) in inits.iter().zip(iters) {
                    let t = self.vty(*it)?.clone();
                    moves.push((self.slot(*it)?, self.slot_of(o, &t)?));
                }
                self.parallel_move(moves)?;
                let body_cost = entry_cost(body, 0);
                let (fuel, spill) = match u16::try_from(body_cost) {
                    Ok(f) => (f, 0),
                    Err(_) => (0, body_cost),
                };
                let pre = self.emit(Instr::JGe64 {
                    a: ivr,
                    b: hi_r,
                    target: 0,
                    fuel,
                    tfuel: 0,
                });
                self.fuel(spill);
                let top = self.pc();
                if let Some(t) = self.lower_block(&body.ops, 0)? {
                    let OpKind::Yield(os) = &t.kind else {
                        return Err(self.invalid("`for` body must end in yield"));
                    };
                    self.yield_into(os, iters)?;
                    self.loc = op.loc;
                    let kstep = self
                        .k32(step, &Type::I64)
                        .and_then(|k| u16::try_from(k).ok())
                        .filter(|k| *k > 0);
                    self.emit(match kstep {
                        Some(step) => Instr::ForLoopK {
                            iv: ivr,
                            hi: hi_r,
                            step,
                            target: top,
                            fuel: body_cost,
                        },
                        None => Instr::ForLoop {
                            iv: ivr,
                            hi: hi_r,
                            step: step_r,
                            target: top,
                            fuel: body_cost,
                        },
                    });
                }
                let exit = self.pc();
                self.patch(Some(pre), exit);
                self.loc = op.loc;
                self.fuel(k);
            }
            OpKind::While {
                iters,
                inits,
                cond_region,
                body,
            } => {
                if inits.len() != iters.len() {
                    return Err(self.invalid("`while` needs one initial value per iteration value"));
                }
                let mut moves = Vec::new();
                for (o, it) in inits.iter().zip(iters) {
                    let t = self.vty(*it)?.clone();
                    moves.push((self.slot(*it)?, self.slot_of(o, &t)?));
                }
                self.parallel_move(moves)?;
                let cond_cost = entry_cost(cond_region, 0);
                self.fuel(cond_cost);
                let top = self.pc();
                let Some(t) = self.lower_block(&cond_region.ops, 0)? else {
                    // The condition region returned: nothing loops.
                    return Ok(());
                };
                let OpKind::Condition(c) = &t.kind else {
                    return Err(self.invalid("`while` condition region must end in `condition`"));
                };
                let br = self.branch_false(c, entry_cost(body, 0))?;
                if let Some(t) = self.lower_block(&body.ops, 0)? {
                    let OpKind::Yield(os) = &t.kind else {
                        return Err(self.invalid("`while` body must end in yield"));
                    };
                    self.yield_into(os, iters)?;
                    self.loc = op.loc;
                    self.emit(Instr::Jump {
                        target: top,
                        fuel: cond_cost,
                    });
                }
                let exit = self.pc();
                self.patch(br, exit);
                self.loc = op.loc;
                // Only `br` leaves the loop: it charges the continuation when taken.
                self.set_taken_fuel(br, k);
            }
            _ => return Err(self.invalid("not a structured op")),
        }
        Ok(())
    }

    fn dst(&self, op: &Op, i: usize) -> Res<Slot> {
        let v = op
            .results
            .get(i)
            .ok_or_else(|| self.invalid("missing result"))?;
        self.slot(*v)
    }
    fn ds(&self, op: &Op) -> Res<R> {
        match self.dst(op, 0)? {
            Slot::S(r) => Ok(r),
            Slot::R(_) => Err(self.invalid("expected a scalar result")),
        }
    }
    fn dr(&self, op: &Op) -> Res<R> {
        match self.dst(op, 0)? {
            Slot::R(r) => Ok(r),
            Slot::S(_) => Err(self.invalid("expected a reference result")),
        }
    }

    fn lower_op(&mut self, op: &Op) -> Res<()> {
        match &op.kind {
            OpKind::Simple {
                opcode,
                operands,
                annotation,
            } => {
                self.cur_def = op.results.first().copied();
                let r = self.lower_simple(op, *opcode, operands, annotation.as_ref());
                self.cur_def = None;
                r
            }
            OpKind::Call { callee, args, .. } => {
                match callee {
                    Callee::Func(fi) => {
                        let g = self
                            .prog
                            .funcs
                            .get(*fi as usize)
                            .ok_or_else(|| self.invalid("callee out of range"))?;
                        let sig = g.signature();
                        if sig.params.len() != args.len() || sig.results.len() != op.results.len() {
                            return Err(self.invalid(format!(
                                "call of @{} with the wrong number of arguments or results",
                                g.name
                            )));
                        }
                        let pslots = param_slots(&sig.params);
                        let (mut sargs, mut rargs) = (Vec::new(), Vec::new());
                        for ((a, t), p) in args.iter().zip(&sig.params).zip(pslots) {
                            match (self.slot_of(a, t)?, p) {
                                (Slot::S(x), Slot::S(y)) => sargs.push((x, y)),
                                (Slot::R(x), Slot::R(y)) => rargs.push((x, y)),
                                _ => return Err(self.invalid("argument bank mismatch")),
                            }
                        }
                        let results = op
                            .results
                            .iter()
                            .map(|v| self.slot(*v))
                            .collect::<Res<Vec<_>>>()?;
                        let site = self.calls.len() as u32;
                        self.calls.push(CallSite {
                            callee: *fi,
                            sargs: sargs.into(),
                            rargs: rargs.into(),
                            results: results.into(),
                        });
                        self.emit(Instr::Call { site });
                    }
                    Callee::Decl(di) => {
                        let d = self
                            .prog
                            .imports
                            .get(*di as usize)
                            .ok_or_else(|| self.invalid("import out of range"))?;
                        if d.sig.params.len() != args.len()
                            || d.sig.results.len() != op.results.len()
                        {
                            return Err(self.invalid(format!(
                                "call of @{} with the wrong number of arguments or results",
                                d.symbol
                            )));
                        }
                        let mut sl = Vec::new();
                        for (a, t) in args.iter().zip(&d.sig.params) {
                            sl.push(self.slot_of(a, t)?);
                        }
                        let results = op
                            .results
                            .iter()
                            .map(|v| self.slot(*v))
                            .collect::<Res<Vec<_>>>()?;
                        let site = self.natives.len() as u32;
                        self.natives.push(NativeSite {
                            import: *di,
                            args: sl.into(),
                            results: results.into(),
                        });
                        self.emit(Instr::CallNative { site });
                    }
                    Callee::TParam(_) => {
                        return Err(
                            self.invalid("call of a template parameter in a linked program")
                        );
                    }
                }
                Ok(())
            }
            _ => Err(self.invalid("terminator in the middle of a region")),
        }
    }

    /// The last emitted instruction, if it is the definition of the single-use value living in scalar register
    /// `r` (so it can be folded into its only user, emitted next).
    fn last_def_of(&self, r: R) -> Option<Instr> {
        let ins = *self.code.last()?;
        let w = (*self.defs.last()?)?;
        (self.uses.get(w.0 as usize) == Some(&1) && self.slot(w).ok() == Some(Slot::S(r)))
            .then_some(ins)
    }

    fn pop_last(&mut self) {
        self.code.pop();
        self.locs.pop();
        self.defs.pop();
    }

    /// Offset operand of a load/store. Folds a preceding single-use `add %x, K` into the displacement and, when
    /// `indexed`, a single-use scaled index: `add(%x, mul(%i, S))` or `mul(add(%x, %y), S)` (S in 1..=255).
    fn offset(&mut self, o: &Operand, indexed: bool) -> Res<Addr> {
        if let Some(k) = self.k32(o, &Type::I64) {
            return Ok(Addr::Plain(self.const_s(0)?, k));
        }
        let Ok(Slot::S(mut cur)) = self.slot_or_err(o) else {
            return Ok(Addr::Plain(self.sreg(o, &Type::I64)?, 0));
        };
        let mut disp = 0;
        if let Some(Instr::AddK64 { d, a, k }) = self.last_def_of(cur) {
            if d == cur {
                self.pop_last();
                disp = k;
                cur = a;
            }
        }
        if !indexed {
            return Ok(Addr::Plain(cur, disp));
        }
        let scale = |k: i32| u8::try_from(k).ok().filter(|k| *k > 0);
        match self.last_def_of(cur) {
            Some(Instr::MulK64 { d, a: y, k }) if d == cur && scale(k).is_some() => {
                let sc = scale(k).unwrap_or(1);
                self.pop_last();
                if let Some(Instr::Add64 { d, a: x, b: y2 }) = self.last_def_of(y) {
                    if d == y {
                        self.pop_last();
                        return Ok(Addr::XS { x, y: y2, sc, disp });
                    }
                }
                let x = self.const_s(0)?;
                return Ok(Addr::X { x, y, sc, disp });
            }
            Some(Instr::Add64 { d, a, b }) if d == cur && a != b => {
                let n = self.code.len();
                if let (Some(Instr::MulK64 { d: m, a: y, k }), Some(Some(w))) = (
                    n.checked_sub(2).and_then(|i| self.code.get(i)).copied(),
                    n.checked_sub(2).and_then(|i| self.defs.get(i)).copied(),
                ) {
                    if (m == a || m == b)
                        && self.uses.get(w.0 as usize) == Some(&1)
                        && self.slot(w).ok() == Some(Slot::S(m))
                    {
                        if let Some(sc) = scale(k) {
                            let x = if m == a { b } else { a };
                            self.pop_last();
                            self.pop_last();
                            return Ok(Addr::X { x, y, sc, disp });
                        }
                    }
                }
            }
            _ => {}
        }
        Ok(Addr::Plain(cur, disp))
    }

    fn slot_or_err(&self, o: &Operand) -> Res<Slot> {
        match o {
            Operand::Value(v) => self.slot(*v),
            _ => Err(self.invalid("not a value")),
        }
    }

    /// Fuses `add.wrap(mul.wrap(a, b), c)` (the `mul` single-use and right before) into one instruction.
    fn fuse_muladd(&mut self, ins: Instr) -> Instr {
        if let Instr::AddW64 { d, a, b } = ins {
            for (m, c) in [(a, b), (b, a)] {
                if m == c {
                    continue;
                }
                match self.last_def_of(m) {
                    Some(Instr::MulW64 { d: md, a: x, b: y }) if md == m => {
                        self.pop_last();
                        return Instr::MulAddW64 { d, a: x, b: y, c };
                    }
                    Some(Instr::MulWK64 { d: md, a: x, k }) if md == m => {
                        self.pop_last();
                        return Instr::MulKAddW64 { d, a: x, k, c };
                    }
                    _ => {}
                }
            }
        }
        ins
    }

    fn lower_simple(
        &mut self,
        op: &Op,
        opc: Opcode,
        os: &[Operand],
        ann: Option<&Type>,
    ) -> Res<()> {
        use Opcode as O;
        let need = |n: usize, me: &Self| -> Res<()> {
            if os.len() == n {
                Ok(())
            } else {
                Err(me.invalid(format!("{opc} takes {n} operands")))
            }
        };
        let arity = match opc {
            O::Neg | O::Abs | O::Not | O::Sqrt | O::Floor | O::Ceil | O::Exp | O::Log | O::Copy => {
                1
            }
            O::ConstI1 | O::ConstI32 | O::ConstI64 | O::ConstF32 | O::ConstF64 | O::ConstStr => 1,
            O::ConvI32 | O::ConvI64 | O::ConvUI64 | O::ConvF32 | O::ConvF64 | O::TruncI32 => 1,
            O::BitcastI32 | O::BitcastI64 | O::BitcastF32 | O::BitcastF64 => 1,
            O::BufferNew
            | O::BufferLen
            | O::RecordSize
            | O::RecordOffset
            | O::StrLen
            | O::StrFromI64 => 1,
            O::StrFromF64
            | O::StrToBuffer
            | O::StrParseI64
            | O::ListNew
            | O::ListLen
            | O::OpaqueLen => 1,
            O::RefIsNull | O::RefUnwrap | O::Trap => 1,
            O::Select
            | O::StoreI8
            | O::StoreI16
            | O::StoreI32
            | O::StoreI64
            | O::StoreF32
            | O::StoreF64 => 3,
            O::BufferSlice | O::LoadField | O::StrFromBuffer | O::ListSet => 3,
            O::BufferFill | O::StoreField => 4,
            O::BufferCopy => 5,
            O::OpaqueNew => os.len(),
            _ => 2,
        };
        need(arity, self)?;
        self.last_cmp = None;
        match opc {
            O::Add
            | O::Sub
            | O::Mul
            | O::Div
            | O::Rem
            | O::Min
            | O::Max
            | O::AddWrap
            | O::SubWrap
            | O::MulWrap
            | O::DivU
            | O::RemU
            | O::And
            | O::Or
            | O::Xor
            | O::Shl
            | O::Shr
            | O::ShrU => {
                let t = self.common_ty(os)?;
                let d = self.ds(op)?;
                if t.is_float() {
                    let a = self.sreg(&os[0], &t)?;
                    let b = self.sreg(&os[1], &t)?;
                    let w = t == Type::F64;
                    let ins = match (opc, w) {
                        (O::Add, false) => Instr::FAdd32 { d, a, b },
                        (O::Add, true) => Instr::FAdd64 { d, a, b },
                        (O::Sub, false) => Instr::FSub32 { d, a, b },
                        (O::Sub, true) => Instr::FSub64 { d, a, b },
                        (O::Mul, false) => Instr::FMul32 { d, a, b },
                        (O::Mul, true) => Instr::FMul64 { d, a, b },
                        (O::Div, _) => Instr::FBin {
                            d,
                            a,
                            b,
                            op: FBin::Div,
                            wide: w,
                        },
                        (O::Rem, _) => Instr::FBin {
                            d,
                            a,
                            b,
                            op: FBin::Rem,
                            wide: w,
                        },
                        (O::Min, _) => Instr::FBin {
                            d,
                            a,
                            b,
                            op: FBin::Min,
                            wide: w,
                        },
                        (O::Max, _) => Instr::FBin {
                            d,
                            a,
                            b,
                            op: FBin::Max,
                            wide: w,
                        },
                        _ => return Err(self.invalid(format!("{opc} is not defined on {t}"))),
                    };
                    self.emit(ins);
                    return Ok(());
                }
                let w = match t {
                    Type::I64 => true,
                    Type::I32 | Type::I1 => false,
                    _ => return Err(self.invalid(format!("{opc} is not defined on {t}"))),
                };
                let commut = matches!(
                    opc,
                    O::Add | O::Mul | O::AddWrap | O::MulWrap | O::And | O::Or | O::Xor
                );
                let (x, y) =
                    if commut && self.k32(&os[0], &t).is_some() && self.k32(&os[1], &t).is_none() {
                        (&os[1], &os[0])
                    } else {
                        (&os[0], &os[1])
                    };
                if let (Operand::Value(_), Some(k)) = (x, self.k32(y, &t)) {
                    let a = self.sreg(x, &t)?;
                    let sh = (k as u32 & if w { 63 } else { 31 }) as u8;
                    let kb = if w { k as i64 as u64 } else { k as u32 as u64 };
                    let ins = match (opc, w) {
                        (O::Add, false) => Some(Instr::AddK32 { d, a, k }),
                        (O::Add, true) => Some(Instr::AddK64 { d, a, k }),
                        (O::Sub, false) => Some(Instr::SubK32 { d, a, k }),
                        (O::Sub, true) => Some(Instr::SubK64 { d, a, k }),
                        (O::Mul, false) => Some(Instr::MulK32 { d, a, k }),
                        (O::Mul, true) => Some(Instr::MulK64 { d, a, k }),
                        (O::AddWrap, false) => Some(Instr::AddWK32 { d, a, k }),
                        (O::AddWrap, true) => Some(Instr::AddWK64 { d, a, k }),
                        (O::MulWrap, false) => Some(Instr::MulWK32 { d, a, k }),
                        (O::MulWrap, true) => Some(Instr::MulWK64 { d, a, k }),
                        (O::Shl, false) => Some(Instr::ShlK32 { d, a, k: sh }),
                        (O::Shl, true) => Some(Instr::ShlK64 { d, a, k: sh }),
                        (O::Shr, false) => Some(Instr::ShrK32 { d, a, k: sh }),
                        (O::Shr, true) => Some(Instr::ShrK64 { d, a, k: sh }),
                        (O::ShrU, false) => Some(Instr::ShrUK32 { d, a, k: sh }),
                        (O::ShrU, true) => Some(Instr::ShrUK64 { d, a, k: sh }),
                        (O::And, _) if kb <= u32::MAX as u64 => {
                            Some(Instr::AndK { d, a, k: kb as u32 })
                        }
                        (O::And, true) => Some(Instr::AndK64 { d, a, k }),
                        (O::Or, _) if kb <= u32::MAX as u64 => {
                            Some(Instr::OrK { d, a, k: kb as u32 })
                        }
                        (O::Xor, _) if kb <= u32::MAX as u64 => {
                            Some(Instr::XorK { d, a, k: kb as u32 })
                        }
                        _ => None,
                    };
                    if let Some(ins) = ins {
                        self.emit(ins);
                        return Ok(());
                    }
                }
                let a = self.sreg(x, &t)?;
                let b = self.sreg(y, &t)?;
                let ins = match (opc, w) {
                    (O::Add, false) => Instr::Add32 { d, a, b },
                    (O::Add, true) => Instr::Add64 { d, a, b },
                    (O::Sub, false) => Instr::Sub32 { d, a, b },
                    (O::Sub, true) => Instr::Sub64 { d, a, b },
                    (O::Mul, false) => Instr::Mul32 { d, a, b },
                    (O::Mul, true) => Instr::Mul64 { d, a, b },
                    (O::AddWrap, false) => Instr::AddW32 { d, a, b },
                    (O::AddWrap, true) => Instr::AddW64 { d, a, b },
                    (O::SubWrap, false) => Instr::SubW32 { d, a, b },
                    (O::SubWrap, true) => Instr::SubW64 { d, a, b },
                    (O::MulWrap, false) => Instr::MulW32 { d, a, b },
                    (O::MulWrap, true) => Instr::MulW64 { d, a, b },
                    (O::Div, false) => Instr::Div32 { d, a, b },
                    (O::Div, true) => Instr::Div64 { d, a, b },
                    (O::Rem, false) => Instr::Rem32 { d, a, b },
                    (O::Rem, true) => Instr::Rem64 { d, a, b },
                    (O::DivU, false) => Instr::DivU32 { d, a, b },
                    (O::DivU, true) => Instr::DivU64 { d, a, b },
                    (O::RemU, false) => Instr::RemU32 { d, a, b },
                    (O::RemU, true) => Instr::RemU64 { d, a, b },
                    (O::Min, false) => Instr::Min32 { d, a, b },
                    (O::Min, true) => Instr::Min64 { d, a, b },
                    (O::Max, false) => Instr::Max32 { d, a, b },
                    (O::Max, true) => Instr::Max64 { d, a, b },
                    (O::And, _) => Instr::And { d, a, b },
                    (O::Or, _) => Instr::Or { d, a, b },
                    (O::Xor, _) => Instr::Xor { d, a, b },
                    (O::Shl, false) => Instr::Shl32 { d, a, b },
                    (O::Shl, true) => Instr::Shl64 { d, a, b },
                    (O::Shr, false) => Instr::Shr32 { d, a, b },
                    (O::Shr, true) => Instr::Shr64 { d, a, b },
                    (O::ShrU, false) => Instr::ShrU32 { d, a, b },
                    (O::ShrU, true) => Instr::ShrU64 { d, a, b },
                    _ => return Err(self.invalid(format!("{opc} is not defined on {t}"))),
                };
                if t == Type::I1 && !matches!(opc, O::And | O::Or | O::Xor) {
                    return Err(self.invalid(format!("{opc} is not defined on i1")));
                }
                let ins = self.fuse_muladd(ins);
                self.emit(ins);
            }
            O::Neg | O::Abs | O::Not | O::Sqrt | O::Floor | O::Ceil | O::Exp | O::Log => {
                let t = self.common_ty(os)?;
                let d = self.ds(op)?;
                let a = self.sreg(&os[0], &t)?;
                let ins = match (opc, &t) {
                    (O::Neg, Type::I32) => Instr::Neg32 { d, a },
                    (O::Neg, Type::I64) => Instr::Neg64 { d, a },
                    (O::Abs, Type::I32) => Instr::Abs32 { d, a },
                    (O::Abs, Type::I64) => Instr::Abs64 { d, a },
                    (O::Not, Type::I1) => Instr::Not1 { d, a },
                    (O::Not, Type::I32) => Instr::Not32 { d, a },
                    (O::Not, Type::I64) => Instr::Not64 { d, a },
                    (_, Type::F32 | Type::F64) => {
                        let u = match opc {
                            O::Neg => FUn::Neg,
                            O::Abs => FUn::Abs,
                            O::Sqrt => FUn::Sqrt,
                            O::Floor => FUn::Floor,
                            O::Ceil => FUn::Ceil,
                            O::Exp => FUn::Exp,
                            O::Log => FUn::Log,
                            _ => return Err(self.invalid(format!("{opc} is not defined on {t}"))),
                        };
                        Instr::FUn {
                            d,
                            a,
                            op: u,
                            wide: t == Type::F64,
                        }
                    }
                    _ => return Err(self.invalid(format!("{opc} is not defined on {t}"))),
                };
                self.emit(ins);
            }
            O::CmpEq
            | O::CmpNe
            | O::CmpLt
            | O::CmpLe
            | O::CmpGt
            | O::CmpGe
            | O::CmpUlt
            | O::CmpUle
            | O::CmpUgt
            | O::CmpUge => {
                let t = self.common_ty(os)?;
                let d = self.ds(op)?;
                if t.is_float() {
                    let a = self.sreg(&os[0], &t)?;
                    let b = self.sreg(&os[1], &t)?;
                    let c = match opc {
                        O::CmpEq => FCmp::Eq,
                        O::CmpNe => FCmp::Ne,
                        O::CmpLt => FCmp::Lt,
                        O::CmpLe => FCmp::Le,
                        O::CmpGt => FCmp::Gt,
                        O::CmpGe => FCmp::Ge,
                        _ => return Err(self.invalid(format!("{opc} is not defined on {t}"))),
                    };
                    self.emit(Instr::FCmp {
                        d,
                        a,
                        b,
                        op: c,
                        wide: t == Type::F64,
                    });
                    return Ok(());
                }
                if !matches!(t, Type::I1 | Type::I32 | Type::I64) {
                    return Err(self.invalid(format!("{opc} is not defined on {t}")));
                }
                let w = t == Type::I64;
                let mut kind = match opc {
                    O::CmpEq => CmpK::Eq,
                    O::CmpNe => CmpK::Ne,
                    O::CmpLt => CmpK::Lt,
                    O::CmpLe => CmpK::Le,
                    O::CmpGt => CmpK::Gt,
                    O::CmpGe => CmpK::Ge,
                    O::CmpUlt => CmpK::Ult,
                    O::CmpUle => CmpK::Ule,
                    O::CmpUgt => CmpK::Ugt,
                    _ => CmpK::Uge,
                };
                let (mut x, mut y) = (&os[0], &os[1]);
                // Put an immediate on the right (mirroring the comparison).
                if self.k32(x, &t).is_some() && self.k32(y, &t).is_none() {
                    std::mem::swap(&mut x, &mut y);
                    kind = match kind {
                        CmpK::Lt => CmpK::Gt,
                        CmpK::Gt => CmpK::Lt,
                        CmpK::Le => CmpK::Ge,
                        CmpK::Ge => CmpK::Le,
                        CmpK::Ult => CmpK::Ugt,
                        CmpK::Ugt => CmpK::Ult,
                        CmpK::Ule => CmpK::Uge,
                        CmpK::Uge => CmpK::Ule,
                        k => k,
                    };
                }
                let signed = !matches!(kind, CmpK::Ult | CmpK::Ule | CmpK::Ugt | CmpK::Uge);
                // Eq/Ne immediates compare canonical bits against the sign-extended k: only valid for i32/i1 when
                // k >= 0.
                let kf = self.k32(y, &t).filter(|k| {
                    signed
                        && (w || t == Type::I32 || *k >= 0)
                        && (w || *k >= 0 || !matches!(kind, CmpK::Eq | CmpK::Ne))
                });
                let a = self.sreg(x, &t)?;
                let (ins, b) = if let (Some(k), Operand::Value(_)) = (kf, x) {
                    let ins = match (kind, w) {
                        (CmpK::Eq, _) => Instr::EqK { d, a, k },
                        (CmpK::Ne, _) => Instr::NeK { d, a, k },
                        (CmpK::Lt, false) => Instr::LtK32 { d, a, k },
                        (CmpK::Le, false) => Instr::LeK32 { d, a, k },
                        (CmpK::Gt, false) => Instr::GtK32 { d, a, k },
                        (CmpK::Ge, false) => Instr::GeK32 { d, a, k },
                        (CmpK::Lt, true) => Instr::LtK64 { d, a, k },
                        (CmpK::Le, true) => Instr::LeK64 { d, a, k },
                        (CmpK::Gt, true) => Instr::GtK64 { d, a, k },
                        (CmpK::Ge, true) => Instr::GeK64 { d, a, k },
                        _ => return Err(self.invalid("unsigned immediate compare")),
                    };
                    (ins, Err(k))
                } else {
                    let b = self.sreg(y, &t)?;
                    let ins = match (kind, w) {
                        (CmpK::Eq, _) => Instr::Eq { d, a, b },
                        (CmpK::Ne, _) => Instr::Ne { d, a, b },
                        (CmpK::Ult, _) => Instr::Ult { d, a, b },
                        (CmpK::Ule, _) => Instr::Ule { d, a, b },
                        (CmpK::Ugt, _) => Instr::Ult { d, a: b, b: a },
                        (CmpK::Uge, _) => Instr::Ule { d, a: b, b: a },
                        (CmpK::Lt, false) => Instr::Lt32 { d, a, b },
                        (CmpK::Le, false) => Instr::Le32 { d, a, b },
                        (CmpK::Gt, false) => Instr::Lt32 { d, a: b, b: a },
                        (CmpK::Ge, false) => Instr::Le32 { d, a: b, b: a },
                        (CmpK::Lt, true) => Instr::Lt64 { d, a, b },
                        (CmpK::Le, true) => Instr::Le64 { d, a, b },
                        (CmpK::Gt, true) => Instr::Lt64 { d, a: b, b: a },
                        (CmpK::Ge, true) => Instr::Le64 { d, a: b, b: a },
                    };
                    (ins, Ok(b))
                };
                if t == Type::I1 && !matches!(kind, CmpK::Eq | CmpK::Ne) {
                    return Err(self.invalid(format!("{opc} is not defined on i1")));
                }
                let at = self.emit(ins);
                if let Some(v) = op.results.first() {
                    self.last_cmp = Some(LastCmp {
                        v: *v,
                        at,
                        kind,
                        wide: w,
                        a,
                        b,
                    });
                }
                return Ok(());
            }
            O::Select => {
                let t = self.common_ty(&os[1..])?;
                let c = self.sreg(&os[0], &Type::I1)?;
                match self.dst(op, 0)? {
                    Slot::S(d) => {
                        let a = self.sreg(&os[1], &t)?;
                        let b = self.sreg(&os[2], &t)?;
                        self.emit(Instr::SelS { d, c, a, b });
                    }
                    Slot::R(d) => {
                        let a = self.rreg(&os[1])?;
                        let b = self.rreg(&os[2])?;
                        self.emit(Instr::SelR { d, c, a, b });
                    }
                }
            }
            O::Copy
            | O::ConstI1
            | O::ConstI32
            | O::ConstI64
            | O::ConstF32
            | O::ConstF64
            | O::ConstStr => {
                let d = self.dst(op, 0)?;
                let t = self.vty(op.results[0])?.clone();
                match (d, &os[0]) {
                    (Slot::S(d), Operand::Imm(i)) => {
                        let bits = self.imm_bits(i, &t)?;
                        self.emit(Instr::ConstS { d, bits });
                    }
                    (Slot::R(d), Operand::Imm(Imm::Str(s))) => {
                        let idx = self.tables.str(s);
                        self.emit(Instr::ConstStr { d, idx });
                    }
                    (Slot::R(d), Operand::Imm(Imm::Null(_))) => {
                        self.emit(Instr::ConstNull { d });
                    }
                    (d, o) => {
                        let s = self.slot_of(o, &t)?;
                        self.mov(d, s)?;
                    }
                }
            }
            O::ConvI32
            | O::ConvI64
            | O::ConvF32
            | O::ConvF64
            | O::ConvUI64
            | O::TruncI32
            | O::BitcastI32
            | O::BitcastI64
            | O::BitcastF32
            | O::BitcastF64 => {
                let from = self
                    .opnd_ty(&os[0])
                    .ok_or_else(|| self.invalid("cannot type operand"))?;
                let d = self.ds(op)?;
                let a = self.sreg(&os[0], &from)?;
                let fk = SK::of(&from)
                    .ok_or_else(|| self.invalid(format!("{opc}: cannot convert from {from}")))?;
                let ins = match opc {
                    // Canonical bits make these plain moves.
                    O::BitcastI32 | O::BitcastI64 | O::BitcastF32 | O::BitcastF64 | O::ConvUI64 => {
                        Instr::MovS { d, a }
                    }
                    O::TruncI32 => Instr::Conv {
                        d,
                        a,
                        op: Conv::TruncI32,
                    },
                    _ => {
                        let to = match opc {
                            O::ConvI32 => SK::I32,
                            O::ConvI64 => SK::I64,
                            O::ConvF32 => SK::F32,
                            _ => SK::F64,
                        };
                        if to == fk {
                            Instr::MovS { d, a }
                        } else {
                            Instr::Conv {
                                d,
                                a,
                                op: Conv::To { from: fk, to },
                            }
                        }
                    }
                };
                self.emit(ins);
            }
            O::BufferNew => {
                let d = self.dr(op)?;
                let len = self.sreg(&os[0], &Type::I64)?;
                self.emit(Instr::BufNew { d, len });
            }
            O::BufferLen => {
                let d = self.ds(op)?;
                let b = self.rreg(&os[0])?;
                self.emit(Instr::BufLen { d, b });
            }
            O::LoadI8
            | O::LoadU8
            | O::LoadI16
            | O::LoadU16
            | O::LoadI32
            | O::LoadU32
            | O::LoadI64
            | O::LoadF32
            | O::LoadF64 => {
                let d = self.ds(op)?;
                let b = self.rreg(&os[0])?;
                let indexed = matches!(
                    opc,
                    O::LoadI32 | O::LoadU32 | O::LoadF32 | O::LoadI64 | O::LoadF64
                );
                let wide = matches!(opc, O::LoadI64 | O::LoadF64);
                let (off, disp) = match self.offset(&os[1], indexed)? {
                    Addr::Plain(off, disp) => (off, disp),
                    Addr::X { x, y, sc, disp } => {
                        self.emit(if wide {
                            Instr::Ld64X {
                                d,
                                b,
                                x,
                                y,
                                sc,
                                disp,
                            }
                        } else {
                            Instr::Ld32X {
                                d,
                                b,
                                x,
                                y,
                                sc,
                                disp,
                            }
                        });
                        return Ok(());
                    }
                    Addr::XS { x, y, sc, disp } => {
                        self.emit(if wide {
                            Instr::Ld64XS {
                                d,
                                b,
                                x,
                                y,
                                sc,
                                disp,
                            }
                        } else {
                            Instr::Ld32XS {
                                d,
                                b,
                                x,
                                y,
                                sc,
                                disp,
                            }
                        });
                        return Ok(());
                    }
                };
                let ins = match opc {
                    O::LoadI8 => Instr::Ld8s { d, b, off, disp },
                    O::LoadU8 => Instr::Ld8u { d, b, off, disp },
                    O::LoadI16 => Instr::Ld16s { d, b, off, disp },
                    O::LoadU16 => Instr::Ld16u { d, b, off, disp },
                    O::LoadI32 | O::LoadU32 | O::LoadF32 => Instr::Ld32 { d, b, off, disp },
                    _ => Instr::Ld64 { d, b, off, disp },
                };
                self.emit(ins);
            }
            O::StoreI8 | O::StoreI16 | O::StoreI32 | O::StoreI64 | O::StoreF32 | O::StoreF64 => {
                let vt = match opc {
                    O::StoreI64 => Type::I64,
                    O::StoreF32 => Type::F32,
                    O::StoreF64 => Type::F64,
                    _ => Type::I32,
                };
                let b = self.rreg(&os[0])?;
                let v = self.sreg(&os[2], &vt)?;
                let indexed = !matches!(opc, O::StoreI8 | O::StoreI16);
                let wide = matches!(opc, O::StoreI64 | O::StoreF64);
                let (off, disp) = match self.offset(&os[1], indexed)? {
                    Addr::Plain(off, disp) => (off, disp),
                    Addr::X { x, y, sc, disp } => {
                        self.emit(if wide {
                            Instr::St64X {
                                b,
                                x,
                                y,
                                v,
                                sc,
                                disp,
                            }
                        } else {
                            Instr::St32X {
                                b,
                                x,
                                y,
                                v,
                                sc,
                                disp,
                            }
                        });
                        return Ok(());
                    }
                    Addr::XS { x, y, sc, disp } => {
                        self.emit(if wide {
                            Instr::St64XS {
                                b,
                                x,
                                y,
                                v,
                                sc,
                                disp,
                            }
                        } else {
                            Instr::St32XS {
                                b,
                                x,
                                y,
                                v,
                                sc,
                                disp,
                            }
                        });
                        return Ok(());
                    }
                };
                let ins = match opc {
                    O::StoreI8 => Instr::St8 { b, off, v, disp },
                    O::StoreI16 => Instr::St16 { b, off, v, disp },
                    O::StoreI32 | O::StoreF32 => Instr::St32 { b, off, v, disp },
                    _ => Instr::St64 { b, off, v, disp },
                };
                self.emit(ins);
            }
            O::LoadField | O::StoreField => {
                let Operand::Field(r, fi) = &os[2] else {
                    return Err(self.invalid(format!("{opc}: operand 3 must be a field")));
                };
                let (size, off, ft) = self.record_field(*r, Some(*fi))?;
                let kind = SK::of(&ft).ok_or_else(|| self.invalid("record fields are scalars"))?;
                let (Ok(size), Ok(off)) = (u16::try_from(size), u16::try_from(off)) else {
                    return Err(LoadError::Limit {
                        func: self.f.name.clone(),
                        message: "record larger than 65535 bytes".into(),
                        loc: self.loc,
                        file: self.file.to_string(),
                    });
                };
                let b = self.rreg(&os[0])?;
                let idx = self.sreg(&os[1], &Type::I64)?;
                if opc == O::LoadField {
                    let d = self.ds(op)?;
                    self.emit(Instr::LdField {
                        d,
                        b,
                        idx,
                        size,
                        off,
                        kind,
                    });
                } else {
                    let v = self.sreg(&os[3], &ft)?;
                    self.emit(Instr::StField {
                        b,
                        idx,
                        v,
                        size,
                        off,
                        kind,
                    });
                }
            }
            O::RecordSize | O::RecordOffset => {
                let d = self.ds(op)?;
                let bits = match &os[0] {
                    Operand::Record(r) => self.record_field(*r, None)?.0,
                    Operand::Field(r, f) => self.record_field(*r, Some(*f))?.1,
                    _ => return Err(self.invalid(format!("{opc} needs a record operand"))),
                };
                self.emit(Instr::ConstS { d, bits });
            }
            O::BufferSlice | O::StrFromBuffer => {
                let d = self.dr(op)?;
                let b = self.rreg(&os[0])?;
                let off = self.sreg(&os[1], &Type::I64)?;
                let len = self.sreg(&os[2], &Type::I64)?;
                self.emit(if opc == O::BufferSlice {
                    Instr::BufSlice { d, b, off, len }
                } else {
                    Instr::StrFromBuf { d, b, off, len }
                });
            }
            O::BufferCopy => {
                let dst = self.rreg(&os[0])?;
                let doff = self.sreg(&os[1], &Type::I64)?;
                let src = self.rreg(&os[2])?;
                let soff = self.sreg(&os[3], &Type::I64)?;
                let len = self.sreg(&os[4], &Type::I64)?;
                self.emit(Instr::BufCopy {
                    dst,
                    doff,
                    src,
                    soff,
                    len,
                });
            }
            O::BufferFill => {
                let b = self.rreg(&os[0])?;
                let off = self.sreg(&os[1], &Type::I64)?;
                let len = self.sreg(&os[2], &Type::I64)?;
                let byte = self.sreg(&os[3], &Type::I32)?;
                self.emit(Instr::BufFill { b, off, len, byte });
            }
            O::BufferConcat | O::StrConcat => {
                let d = self.dr(op)?;
                let a = self.rreg(&os[0])?;
                let b = self.rreg(&os[1])?;
                self.emit(if opc == O::BufferConcat {
                    Instr::BufConcat { d, a, b }
                } else {
                    Instr::StrConcat { d, a, b }
                });
            }
            O::StrEq => {
                let d = self.ds(op)?;
                let a = self.rreg(&os[0])?;
                let b = self.rreg(&os[1])?;
                self.emit(Instr::StrEq { d, a, b });
            }
            O::StrLen | O::StrParseI64 | O::ListLen | O::OpaqueLen | O::RefIsNull => {
                let d = self.ds(op)?;
                let a = self.rreg(&os[0])?;
                self.emit(match opc {
                    O::StrLen => Instr::StrLen { d, a },
                    O::StrParseI64 => Instr::StrParse { d, a },
                    O::ListLen => Instr::ListLen { d, l: a },
                    O::OpaqueLen => Instr::OpaqueLen { d, o: a },
                    _ => Instr::IsNull { d, a },
                });
            }
            O::StrFromI64 | O::StrFromF64 => {
                let d = self.dr(op)?;
                let t = if opc == O::StrFromI64 {
                    Type::I64
                } else {
                    Type::F64
                };
                let a = self.sreg(&os[0], &t)?;
                self.emit(if opc == O::StrFromI64 {
                    Instr::StrFromI64 { d, a }
                } else {
                    Instr::StrFromF64 { d, a }
                });
            }
            O::StrToBuffer | O::RefUnwrap => {
                let d = self.dr(op)?;
                let a = self.rreg(&os[0])?;
                self.emit(if opc == O::StrToBuffer {
                    Instr::StrToBuf { d, a }
                } else {
                    Instr::Unwrap { d, a }
                });
            }
            O::ListNew => {
                let d = self.dr(op)?;
                let cap = self.sreg(&os[0], &Type::I64)?;
                self.emit(Instr::ListNew { d, cap });
            }
            O::ListGet => {
                let l = self.rreg(&os[0])?;
                let i = self.sreg(&os[1], &Type::I64)?;
                self.emit(match self.dst(op, 0)? {
                    Slot::S(d) => Instr::ListGetS { d, l, i },
                    Slot::R(d) => Instr::ListGetR { d, l, i },
                });
            }
            O::ListSet | O::ListPush => {
                let lt = self
                    .opnd_ty(&os[0])
                    .ok_or_else(|| self.invalid("cannot type list operand"))?;
                let Type::List(et) = lt else {
                    return Err(self.invalid(format!("{opc} needs a list")));
                };
                let l = self.rreg(&os[0])?;
                let vo = if opc == O::ListSet { &os[2] } else { &os[1] };
                let v = self.slot_of(vo, &et)?;
                let ins = if opc == O::ListSet {
                    let i = self.sreg(&os[1], &Type::I64)?;
                    match v {
                        Slot::S(v) => Instr::ListSetS { l, i, v },
                        Slot::R(v) => Instr::ListSetR { l, i, v },
                    }
                } else {
                    match v {
                        Slot::S(v) => Instr::ListPushS { l, v },
                        Slot::R(v) => Instr::ListPushR { l, v },
                    }
                };
                self.emit(ins);
            }
            O::OpaqueNew => {
                let d = self.dr(op)?;
                let mut items = Vec::with_capacity(os.len());
                for o in os {
                    let t = self
                        .opnd_ty(o)
                        .ok_or_else(|| self.invalid("cannot type opaque.new operand"))?;
                    let s = self.slot_of(o, &t)?;
                    items.push((self.tables.ty(&t), s));
                }
                let site = self.opaques.len() as u32;
                self.opaques.push(items.into());
                self.emit(Instr::OpaqueNew { d, site });
            }
            O::OpaqueGet => {
                let t = ann.ok_or_else(|| self.invalid("opaque.get needs a type annotation"))?;
                let ty = self.tables.ty(t);
                let o = self.rreg(&os[0])?;
                let i = self.sreg(&os[1], &Type::I64)?;
                self.emit(match self.dst(op, 0)? {
                    Slot::S(d) => Instr::OpaqueGetS { d, o, i, ty },
                    Slot::R(d) => Instr::OpaqueGetR { d, o, i, ty },
                });
            }
            O::Assert => {
                let c = self.sreg(&os[0], &Type::I1)?;
                let msg = self.rreg(&os[1])?;
                self.emit(Instr::Assert { c, msg });
            }
            O::Trap => {
                let msg = self.rreg(&os[0])?;
                self.emit(Instr::Trap { msg });
            }
        }
        Ok(())
    }
}
