//! Translation of buffer allocation, length and the load/store forms.

use super::*;
use crate::interp::BULK_FUEL_SHIFT;

impl JitTranslator<'_, '_> {
    /// `buffer.new`, `buffer.len` and the buffer load/store forms (plain, indexed, record fields). False: not one of
    /// these.
    pub(super) fn memory_instr(&mut self, ins: Instr, pc: usize) -> bool {
        use Instr as I;
        use IntCC::*;
        match ins {
            I::BufNew { d, len } => {
                // Bulk fuel (`interp::bulk_fuel`): checked before the allocation and charged after it, so a bail
                // (no fuel, a negative length, no memory) leaves the fuel for the interpreter to charge itself.
                let n = self.g(len);
                let cost = self.b.ins().ushr_imm_s(n, BULK_FUEL_SHIFT as i64);
                let f = self.b.use_var(self.fuel);
                let short = self.b.ins().icmp(UnsignedLessThan, f, cost);
                self.bail_if(short, pc);
                let call = self.b.ins().call(self.h_new, &[self.ctx, n]);
                let h = self.b.inst_results(call)[0];
                let c = self.b.ins().icmp_imm_s(Equal, h, 0);
                self.bail_if(c, pc);
                let f = self.b.use_var(self.fuel);
                let f2 = self.b.ins().isub(f, cost);
                self.b.def_var(self.fuel, f2);
                self.rstore(d, h)
            }
            I::BufLen { d, b } => {
                let (_, l) = self.buf(b, false, pc);
                self.set(d, l)
            }
            I::Ld8s { d, b, off, disp } => {
                let o = self.ea(off, disp, pc);
                self.load(d, b, o, 1, true, pc)
            }
            I::Ld8u { d, b, off, disp } => {
                let o = self.ea(off, disp, pc);
                self.load(d, b, o, 1, false, pc)
            }
            I::Ld16s { d, b, off, disp } => {
                let o = self.ea(off, disp, pc);
                self.load(d, b, o, 2, true, pc)
            }
            I::Ld16u { d, b, off, disp } => {
                let o = self.ea(off, disp, pc);
                self.load(d, b, o, 2, false, pc)
            }
            I::Ld32 { d, b, off, disp } => {
                let o = self.ea(off, disp, pc);
                self.load(d, b, o, 4, false, pc)
            }
            I::Ld64 { d, b, off, disp } => {
                let o = self.ea(off, disp, pc);
                self.load(d, b, o, 8, false, pc)
            }
            I::St8 { b, off, v, disp } => {
                let o = self.ea(off, disp, pc);
                self.store(b, o, v, 1, pc)
            }
            I::St16 { b, off, v, disp } => {
                let o = self.ea(off, disp, pc);
                self.store(b, o, v, 2, pc)
            }
            I::St32 { b, off, v, disp } => {
                let o = self.ea(off, disp, pc);
                self.store(b, o, v, 4, pc)
            }
            I::St64 { b, off, v, disp } => {
                let o = self.ea(off, disp, pc);
                self.store(b, o, v, 8, pc)
            }
            I::Ld32X {
                d,
                b,
                x,
                y,
                sc,
                disp,
            } => {
                let o = self.ea_x(x, y, sc, disp, false, pc);
                self.load(d, b, o, 4, false, pc)
            }
            I::Ld32XS {
                d,
                b,
                x,
                y,
                sc,
                disp,
            } => {
                let o = self.ea_x(x, y, sc, disp, true, pc);
                self.load(d, b, o, 4, false, pc)
            }
            I::Ld64X {
                d,
                b,
                x,
                y,
                sc,
                disp,
            } => {
                let o = self.ea_x(x, y, sc, disp, false, pc);
                self.load(d, b, o, 8, false, pc)
            }
            I::Ld64XS {
                d,
                b,
                x,
                y,
                sc,
                disp,
            } => {
                let o = self.ea_x(x, y, sc, disp, true, pc);
                self.load(d, b, o, 8, false, pc)
            }
            I::St32X {
                b,
                x,
                y,
                v,
                sc,
                disp,
            } => {
                let o = self.ea_x(x, y, sc, disp, false, pc);
                self.store(b, o, v, 4, pc)
            }
            I::St32XS {
                b,
                x,
                y,
                v,
                sc,
                disp,
            } => {
                let o = self.ea_x(x, y, sc, disp, true, pc);
                self.store(b, o, v, 4, pc)
            }
            I::St64X {
                b,
                x,
                y,
                v,
                sc,
                disp,
            } => {
                let o = self.ea_x(x, y, sc, disp, false, pc);
                self.store(b, o, v, 8, pc)
            }
            I::St64XS {
                b,
                x,
                y,
                v,
                sc,
                disp,
            } => {
                let o = self.ea_x(x, y, sc, disp, true, pc);
                self.store(b, o, v, 8, pc)
            }
            I::LdField {
                d,
                b,
                idx,
                size,
                off,
                kind,
            } => {
                let o = self.field_off(idx, size, off, pc);
                match kind {
                    ScalarKind::I1 => {
                        let a = self.addr(b, o, 1, false, pc);
                        let x = self.b.ins().uload8(I64, heapf(), a, 0);
                        let c = self.b.ins().icmp_imm_s(NotEqual, x, 0);
                        self.set_bool(d, c)
                    }
                    ScalarKind::I32 | ScalarKind::F32 => self.load(d, b, o, 4, false, pc),
                    ScalarKind::I64 | ScalarKind::F64 => self.load(d, b, o, 8, false, pc),
                }
            }
            I::StField {
                b,
                idx,
                v,
                size,
                off,
                kind,
            } => {
                let o = self.field_off(idx, size, off, pc);
                let n = match kind {
                    ScalarKind::I1 => 1,
                    ScalarKind::I32 | ScalarKind::F32 => 4,
                    ScalarKind::I64 | ScalarKind::F64 => 8,
                };
                self.store(b, o, v, n, pc)
            }
            _ => return false,
        }
        true
    }
}
