//! Arithmetic: binary and unary integer and float operations, immediate forms and multiply-add fusion.

use super::*;
use loom_ir::Opcode as O;

impl Lowerer<'_> {
    /// Fuses `add.wrap(mul.wrap(a, b), c)` (the `mul` single-use and right before) into one instruction.
    pub(super) fn fuse_muladd(&mut self, ins: Instr) -> Instr {
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

    /// Binary arithmetic, bitwise and shift operations (integer and float), with immediate forms.
    pub(super) fn lower_binary(&mut self, op: &Op, opc: Opcode, os: &[Operand]) -> Res<()> {
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
                    op: FloatBinary::Div,
                    wide: w,
                },
                (O::Rem, _) => Instr::FBin {
                    d,
                    a,
                    b,
                    op: FloatBinary::Rem,
                    wide: w,
                },
                (O::Min, _) => Instr::FBin {
                    d,
                    a,
                    b,
                    op: FloatBinary::Min,
                    wide: w,
                },
                (O::Max, _) => Instr::FBin {
                    d,
                    a,
                    b,
                    op: FloatBinary::Max,
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
        let (x, y) = if commut && self.k32(&os[0], &t).is_some() && self.k32(&os[1], &t).is_none() {
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
                (O::And, _) if kb <= u32::MAX as u64 => Some(Instr::AndK { d, a, k: kb as u32 }),
                (O::And, true) => Some(Instr::AndK64 { d, a, k }),
                (O::Or, _) if kb <= u32::MAX as u64 => Some(Instr::OrK { d, a, k: kb as u32 }),
                (O::Xor, _) if kb <= u32::MAX as u64 => Some(Instr::XorK { d, a, k: kb as u32 }),
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
        Ok(())
    }

    /// Unary arithmetic: integer negate/abs/not and the float unary functions.
    pub(super) fn lower_unary(&mut self, op: &Op, opc: Opcode, os: &[Operand]) -> Res<()> {
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
                    O::Neg => FloatUnary::Neg,
                    O::Abs => FloatUnary::Abs,
                    O::Sqrt => FloatUnary::Sqrt,
                    O::Floor => FloatUnary::Floor,
                    O::Ceil => FloatUnary::Ceil,
                    O::Exp => FloatUnary::Exp,
                    O::Log => FloatUnary::Log,
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
        Ok(())
    }
}
