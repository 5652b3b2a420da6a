//! Register assignment: use counts, one register per value, loop results sharing their iteration values' registers, and copy coalescing of yields.

use super::*;

impl Lowerer<'_> {
    /// Counts uses, then gives parameters the first registers, loop results their iteration values' registers,
    /// and every other value its own register.
    pub(super) fn assign_slots(&mut self) -> Res<()> {
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
    pub(super) fn coalesce_region(
        &mut self,
        r: &Region,
        fixed: &mut std::collections::HashSet<ValueId>,
    ) {
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

    pub(super) fn coalesce_yield(
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
    pub(super) fn op_reads(&self, op: &Op, s: Slot) -> bool {
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
}
