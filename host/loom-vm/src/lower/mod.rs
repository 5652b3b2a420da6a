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

mod arith;
mod calls;
mod compare;
mod control;
mod memory;
mod objects;
mod slots;
mod values;

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

/// The kind of an integer comparison (signed or unsigned), as fused into compare-and-branch instructions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IntCmp {
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

impl IntCmp {
    fn negate(self) -> IntCmp {
        use IntCmp::*;
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
    kind: IntCmp,
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

/// The value of a constant reference register (set once by the prologue): a string constant or `null`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum ConstRef {
    Str(u32),
    Null,
}

/// The lowering of one function from structured SSA IR to register bytecode: its register assignment, the code
/// emitted so far and the tables it adds to.
struct Lowerer<'a> {
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
    kconst_r: HashMap<ConstRef, R>,
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
    let mut l = Lowerer {
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

impl Lowerer<'_> {
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

    fn const_r(&mut self, k: ConstRef) -> Res<R> {
        if let Some(&r) = self.kconst_r.get(&k) {
            return Ok(r);
        }
        let d = self.new_reg(false)?;
        self.prologue.push(match k {
            ConstRef::Str(idx) => Instr::ConstStr { d, idx },
            ConstRef::Null => Instr::ConstNull { d },
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
                self.const_r(ConstRef::Str(idx))
            }
            Operand::Imm(Imm::Null(_)) => self.const_r(ConstRef::Null),
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
            OpKind::Call { callee, args, .. } => self.lower_call(op, callee, args),
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

    /// A simple (non-structured, non-call) op: checks its arity, then lowers it by op family (see the
    /// submodules).
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
            | O::ShrU => self.lower_binary(op, opc, os),
            O::Neg | O::Abs | O::Not | O::Sqrt | O::Floor | O::Ceil | O::Exp | O::Log => {
                self.lower_unary(op, opc, os)
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
            | O::CmpUge => self.lower_compare(op, opc, os),
            O::Select => self.lower_select(op, os),
            O::Copy
            | O::ConstI1
            | O::ConstI32
            | O::ConstI64
            | O::ConstF32
            | O::ConstF64
            | O::ConstStr => self.lower_copy_or_const(op, os),
            O::ConvI32
            | O::ConvI64
            | O::ConvF32
            | O::ConvF64
            | O::ConvUI64
            | O::TruncI32
            | O::BitcastI32
            | O::BitcastI64
            | O::BitcastF32
            | O::BitcastF64 => self.lower_conversion(op, opc, os),
            O::BufferNew => self.lower_buffer_new(op, os),
            O::BufferLen => self.lower_buffer_len(op, os),
            O::LoadI8
            | O::LoadU8
            | O::LoadI16
            | O::LoadU16
            | O::LoadI32
            | O::LoadU32
            | O::LoadI64
            | O::LoadF32
            | O::LoadF64 => self.lower_load(op, opc, os),
            O::StoreI8 | O::StoreI16 | O::StoreI32 | O::StoreI64 | O::StoreF32 | O::StoreF64 => {
                self.lower_store(opc, os)
            }
            O::LoadField | O::StoreField => self.lower_field_access(op, opc, os),
            O::RecordSize | O::RecordOffset => self.lower_record_layout(op, opc, os),
            O::BufferSlice | O::StrFromBuffer => self.lower_byte_range(op, opc, os),
            O::BufferCopy => self.lower_buffer_copy(os),
            O::BufferFill => self.lower_buffer_fill(os),
            O::BufferConcat | O::StrConcat => self.lower_concat(op, opc, os),
            O::StrEq => self.lower_str_eq(op, os),
            O::StrLen | O::StrParseI64 | O::ListLen | O::OpaqueLen | O::RefIsNull => {
                self.lower_length_or_test(op, opc, os)
            }
            O::StrFromI64 | O::StrFromF64 => self.lower_str_from_number(op, opc, os),
            O::StrToBuffer | O::RefUnwrap => self.lower_ref_to_ref(op, opc, os),
            O::ListNew => self.lower_list_new(op, os),
            O::ListGet => self.lower_list_get(op, os),
            O::ListSet | O::ListPush => self.lower_list_set_or_push(opc, os),
            O::OpaqueNew => self.lower_opaque_new(op, os),
            O::OpaqueGet => self.lower_opaque_get(op, os, ann),
            O::Assert => self.lower_assert(os),
            O::Trap => self.lower_trap(os),
        }
    }
}
