//! Control flow: regions, `return`, conditional branches (fused with a preceding compare where it can), `if`, `for` and `while`, and the fuel each block charges.

use super::*;

impl Lowerer<'_> {
    /// Lowers a region's ops. Returns its `yield`/`condition` terminator for the caller to handle (`return` is
    /// handled here). `extra` is fuel the region must charge when its last block starts (the enclosing
    /// continuation block), merged into a nested structured op's exit.
    pub(super) fn lower_block<'o>(&mut self, ops: &'o [Op], extra: u32) -> Res<Option<&'o Op>> {
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
    /// taken-path charge starts at 0 (see [`Lowerer::set_taken_fuel`]).
    pub(super) fn branch_false(&mut self, cond: &Operand, fuel: u32) -> Res<Option<usize>> {
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
                if let (Err(0), IntCmp::Eq | IntCmp::Ne, Some(at)) =
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
                            let ins = if k == IntCmp::Eq {
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
                        (IntCmp::Eq, _) => j!(JEq, b),
                        (IntCmp::Ne, _) => j!(JNe, b),
                        (IntCmp::Ult, _) => j!(JUlt, b),
                        (IntCmp::Ule, _) => j!(JUle, b),
                        (IntCmp::Ugt, _) => j!(JUgt, b),
                        (IntCmp::Uge, _) => j!(JUge, b),
                        (IntCmp::Lt, true) => j!(JLt64, b),
                        (IntCmp::Le, true) => j!(JLe64, b),
                        (IntCmp::Gt, true) => j!(JGt64, b),
                        (IntCmp::Ge, true) => j!(JGe64, b),
                        (IntCmp::Lt, false) => j!(JLt32, b),
                        (IntCmp::Le, false) => j!(JLe32, b),
                        (IntCmp::Gt, false) => j!(JGt32, b),
                        (IntCmp::Ge, false) => j!(JGe32, b),
                    },
                    Err(k32) => match (k, lc.wide) {
                        (IntCmp::Eq, _) => jk!(JEqK, k32),
                        (IntCmp::Ne, _) => jk!(JNeK, k32),
                        (IntCmp::Lt, true) => jk!(JLtK64, k32),
                        (IntCmp::Le, true) => jk!(JLeK64, k32),
                        (IntCmp::Gt, true) => jk!(JGtK64, k32),
                        (IntCmp::Ge, true) => jk!(JGeK64, k32),
                        (IntCmp::Lt, false) => jk!(JLtK32, k32),
                        (IntCmp::Le, false) => jk!(JLeK32, k32),
                        (IntCmp::Gt, false) => jk!(JGtK32, k32),
                        (IntCmp::Ge, false) => jk!(JGeK32, k32),
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
    pub(super) fn set_taken_fuel(&mut self, at: Option<usize>, n: u32) {
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

    pub(super) fn lower_structured(&mut self, op: &Op, k: u32) -> Res<()> {
        match &op.kind {
            OpKind::If { .. } => self.lower_if(op, k),
            OpKind::For { .. } => self.lower_for(op, k),
            OpKind::While { .. } => self.lower_while(op, k),
            _ => Err(self.invalid("not a structured op")),
        }
    }

    /// `if`: a branch on the condition (fused with its compare where it can), the two regions and their yields.
    fn lower_if(&mut self, op: &Op, k: u32) -> Res<()> {
        let OpKind::If {
            cond,
            then_region,
            else_region,
        } = &op.kind
        else {
            return Err(self.invalid("not a structured op"));
        };
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
        Ok(())
    }

    /// `for` over i64: initial moves, a guard before the first iteration, the body and the `ForLoop` latch.
    fn lower_for(&mut self, op: &Op, k: u32) -> Res<()> {
        let OpKind::For {
            lo,
            hi,
            step,
            iv,
            iters,
            inits,
            body,
        } = &op.kind
        else {
            return Err(self.invalid("not a structured op"));
        };
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
        Ok(())
    }

    /// `while`: initial moves, the condition region, a branch out of the loop, the body and a jump back.
    fn lower_while(&mut self, op: &Op, k: u32) -> Res<()> {
        let OpKind::While {
            iters,
            inits,
            cond_region,
            body,
        } = &op.kind
        else {
            return Err(self.invalid("not a structured op"));
        };
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
        Ok(())
    }
}
