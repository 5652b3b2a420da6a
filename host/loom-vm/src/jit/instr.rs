//! Translation of one instruction: the dispatch by instruction family, control flow and moves.

use super::*;

impl JitTranslator<'_, '_> {
    /// Translates the instruction at `pc`, by instruction family; returns false when it ends the block with a
    /// terminator.
    pub(super) fn instr(&mut self, pc: usize) -> bool {
        let ins = self.fc.code[pc];
        if !translated(&ins) {
            // The interpreter executes it (a call, a native, a string or list op, ...) and re-enters at pc + 1.
            self.exit_at(pc);
            return false;
        }
        if let Some(open) = self.control_instr(ins, pc) {
            return open;
        }
        if let Some(open) = self.branch_instr(ins, pc) {
            return open;
        }
        if let Some(open) = self.branch_imm_instr(ins, pc) {
            return open;
        }
        if self.move_instr(ins, pc) {
            return true;
        }
        if self.int_arith_instr(ins, pc) {
            return true;
        }
        if self.int_compare_instr(ins) {
            return true;
        }
        if self.float_instr(ins, pc) {
            return true;
        }
        if self.memory_instr(ins, pc) {
            return true;
        }
        // Not translated (filtered above).
        self.exit_at(pc);
        false
    }

    /// Fuel, unconditional jumps, loop latches, the step check and `ret`. `None`: not one of these; `Some(open)`:
    /// translated, `open` false when it ended the block.
    pub(super) fn control_instr(&mut self, ins: Instr, pc: usize) -> Option<bool> {
        use Instr as I;
        use IntCC::*;
        match ins {
            I::Fuel { n } => self.charge(n as u64, pc),
            I::Jump { target, fuel } => {
                self.charge(fuel as u64, pc);
                let t = self.block(target);
                self.b.ins().jump(t, &[]);
                return Some(false);
            }
            I::Jz {
                c,
                target,
                fuel,
                tfuel,
            } => {
                let x = self.g(c);
                let z = self.b.ins().icmp_imm_s(Equal, x, 0);
                self.jif(z, target, fuel, tfuel, pc);
            }
            I::ForLoop {
                iv,
                hi,
                step,
                target,
                fuel,
            } => {
                let s = self.g(step);
                self.for_loop(iv, hi, s, target, fuel, pc);
            }
            I::ForLoopK {
                iv,
                hi,
                step,
                target,
                fuel,
            } => {
                let s = self.k64(step as i64);
                self.for_loop(iv, hi, s, target, fuel, pc);
            }
            I::StepCheck { step } => {
                let x = self.g(step);
                let c = self.b.ins().icmp_imm_s(SignedLessThanOrEqual, x, 0);
                self.bail_if(c, pc);
            }
            I::Ret { .. } => {
                self.exit_at(pc);
                return Some(false);
            }
            _ => return None,
        }
        Some(true)
    }

    /// Conditional branches on registers: `jz`, the fused register-register compare-and-branch forms and the bit
    /// tests. `None`: not one of these; `Some(open)`: translated, `open` false when it ended the block.
    pub(super) fn branch_instr(&mut self, ins: Instr, pc: usize) -> Option<bool> {
        use Instr as I;
        use IntCC::*;
        match ins {
            I::JEq {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(Equal, a, b, false, target, fuel, tfuel, pc),
            I::JNe {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(NotEqual, a, b, false, target, fuel, tfuel, pc),
            I::JUlt {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(UnsignedLessThan, a, b, false, target, fuel, tfuel, pc),
            I::JUle {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(
                UnsignedLessThanOrEqual,
                a,
                b,
                false,
                target,
                fuel,
                tfuel,
                pc,
            ),
            I::JUgt {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(UnsignedGreaterThan, a, b, false, target, fuel, tfuel, pc),
            I::JUge {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(
                UnsignedGreaterThanOrEqual,
                a,
                b,
                false,
                target,
                fuel,
                tfuel,
                pc,
            ),
            I::JLt64 {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(SignedLessThan, a, b, false, target, fuel, tfuel, pc),
            I::JLe64 {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(SignedLessThanOrEqual, a, b, false, target, fuel, tfuel, pc),
            I::JGt64 {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(SignedGreaterThan, a, b, false, target, fuel, tfuel, pc),
            I::JGe64 {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(
                SignedGreaterThanOrEqual,
                a,
                b,
                false,
                target,
                fuel,
                tfuel,
                pc,
            ),
            I::JLt32 {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(SignedLessThan, a, b, true, target, fuel, tfuel, pc),
            I::JLe32 {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(SignedLessThanOrEqual, a, b, true, target, fuel, tfuel, pc),
            I::JGt32 {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(SignedGreaterThan, a, b, true, target, fuel, tfuel, pc),
            I::JGe32 {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(
                SignedGreaterThanOrEqual,
                a,
                b,
                true,
                target,
                fuel,
                tfuel,
                pc,
            ),
            I::JTestNz {
                a,
                mask,
                target,
                fuel,
                tfuel,
            }
            | I::JTestZ {
                a,
                mask,
                target,
                fuel,
                tfuel,
            } => {
                let x = self.g(a);
                let m = self.b.ins().band_imm_s(x, mask as i64);
                let cc = if matches!(ins, I::JTestNz { .. }) {
                    NotEqual
                } else {
                    Equal
                };
                let c = self.b.ins().icmp_imm_s(cc, m, 0);
                self.jif(c, target, fuel, tfuel, pc);
            }
            _ => return None,
        }
        Some(true)
    }

    /// Fused compare-with-immediate-and-branch forms. `None`: not one of these; `Some(open)`: translated, `open`
    /// false when it ended the block.
    pub(super) fn branch_imm_instr(&mut self, ins: Instr, pc: usize) -> Option<bool> {
        use Instr as I;
        use IntCC::*;
        match ins {
            I::JEqK {
                a,
                k,
                target,
                fuel,
                tfuel,
            } => self.jcmpk(Equal, a, k, false, target, fuel, tfuel, pc),
            I::JNeK {
                a,
                k,
                target,
                fuel,
                tfuel,
            } => self.jcmpk(NotEqual, a, k, false, target, fuel, tfuel, pc),
            I::JLtK64 {
                a,
                k,
                target,
                fuel,
                tfuel,
            } => self.jcmpk(SignedLessThan, a, k, false, target, fuel, tfuel, pc),
            I::JLeK64 {
                a,
                k,
                target,
                fuel,
                tfuel,
            } => self.jcmpk(SignedLessThanOrEqual, a, k, false, target, fuel, tfuel, pc),
            I::JGtK64 {
                a,
                k,
                target,
                fuel,
                tfuel,
            } => self.jcmpk(SignedGreaterThan, a, k, false, target, fuel, tfuel, pc),
            I::JGeK64 {
                a,
                k,
                target,
                fuel,
                tfuel,
            } => self.jcmpk(
                SignedGreaterThanOrEqual,
                a,
                k,
                false,
                target,
                fuel,
                tfuel,
                pc,
            ),
            I::JLtK32 {
                a,
                k,
                target,
                fuel,
                tfuel,
            } => self.jcmpk(SignedLessThan, a, k, true, target, fuel, tfuel, pc),
            I::JLeK32 {
                a,
                k,
                target,
                fuel,
                tfuel,
            } => self.jcmpk(SignedLessThanOrEqual, a, k, true, target, fuel, tfuel, pc),
            I::JGtK32 {
                a,
                k,
                target,
                fuel,
                tfuel,
            } => self.jcmpk(SignedGreaterThan, a, k, true, target, fuel, tfuel, pc),
            I::JGeK32 {
                a,
                k,
                target,
                fuel,
                tfuel,
            } => self.jcmpk(
                SignedGreaterThanOrEqual,
                a,
                k,
                true,
                target,
                fuel,
                tfuel,
                pc,
            ),
            _ => return None,
        }
        Some(true)
    }

    /// Scalar and reference moves, constants, selects and `null` tests. False: not one of these.
    pub(super) fn move_instr(&mut self, ins: Instr, pc: usize) -> bool {
        use Instr as I;
        use IntCC::*;
        match ins {
            I::MovS { d, a } => {
                let x = self.g(a);
                self.set(d, x)
            }
            I::MovR { d, a } => {
                let h = self.rload(a);
                self.rstore(d, h)
            }
            I::ConstS { d, bits } => {
                let x = self.k64(bits as i64);
                self.set(d, x)
            }
            I::ConstNull { d } => {
                let z = self.b.ins().iconst(I32, 0);
                self.rstore(d, z)
            }
            I::SelS { d, c, a, b } => {
                let (cv, x, y) = (self.g(c), self.g(a), self.g(b));
                let v = self.b.ins().select(cv, x, y);
                self.set(d, v)
            }
            I::SelR { d, c, a, b } => {
                let cv = self.g(c);
                let (x, y) = (self.rload(a), self.rload(b));
                let v = self.b.ins().select(cv, x, y);
                self.rstore(d, v)
            }
            I::IsNull { d, a } => {
                let h = self.rload(a);
                let c = self.b.ins().icmp_imm_s(Equal, h, 0);
                self.set_bool(d, c)
            }
            I::Unwrap { d, a } => {
                let h = self.rload(a);
                let c = self.b.ins().icmp_imm_s(Equal, h, 0);
                self.bail_if(c, pc);
                self.rstore(d, h)
            }
            _ => return false,
        }
        true
    }
}
