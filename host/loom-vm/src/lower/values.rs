//! Constants, copies and scalar conversions.

use super::*;
use loom_ir::Opcode as O;

impl Lowerer<'_> {
    /// `copy` and the constants: an immediate into its register, or a move.
    pub(super) fn lower_copy_or_const(&mut self, op: &Op, os: &[Operand]) -> Res<()> {
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
        Ok(())
    }

    /// Conversions and bitcasts between scalar types.
    pub(super) fn lower_conversion(&mut self, op: &Op, opc: Opcode, os: &[Operand]) -> Res<()> {
        let from = self
            .opnd_ty(&os[0])
            .ok_or_else(|| self.invalid("cannot type operand"))?;
        let d = self.ds(op)?;
        let a = self.sreg(&os[0], &from)?;
        let fk = ScalarKind::of(&from)
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
                    O::ConvI32 => ScalarKind::I32,
                    O::ConvI64 => ScalarKind::I64,
                    O::ConvF32 => ScalarKind::F32,
                    _ => ScalarKind::F64,
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
        Ok(())
    }
}
