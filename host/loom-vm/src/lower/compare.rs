//! Comparisons and `select`.

use super::*;
use loom_ir::Opcode as O;

impl Lowerer<'_> {
    /// Comparisons; an integer compare is remembered so a branch that is its only use can fuse with it.
    pub(super) fn lower_compare(&mut self, op: &Op, opc: Opcode, os: &[Operand]) -> Res<()> {
        let t = self.common_ty(os)?;
        let d = self.ds(op)?;
        if t.is_float() {
            let a = self.sreg(&os[0], &t)?;
            let b = self.sreg(&os[1], &t)?;
            let c = match opc {
                O::CmpEq => FloatCmp::Eq,
                O::CmpNe => FloatCmp::Ne,
                O::CmpLt => FloatCmp::Lt,
                O::CmpLe => FloatCmp::Le,
                O::CmpGt => FloatCmp::Gt,
                O::CmpGe => FloatCmp::Ge,
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
            O::CmpEq => IntCmp::Eq,
            O::CmpNe => IntCmp::Ne,
            O::CmpLt => IntCmp::Lt,
            O::CmpLe => IntCmp::Le,
            O::CmpGt => IntCmp::Gt,
            O::CmpGe => IntCmp::Ge,
            O::CmpUlt => IntCmp::Ult,
            O::CmpUle => IntCmp::Ule,
            O::CmpUgt => IntCmp::Ugt,
            _ => IntCmp::Uge,
        };
        let (mut x, mut y) = (&os[0], &os[1]);
        // Put an immediate on the right (mirroring the comparison).
        if self.k32(x, &t).is_some() && self.k32(y, &t).is_none() {
            std::mem::swap(&mut x, &mut y);
            kind = match kind {
                IntCmp::Lt => IntCmp::Gt,
                IntCmp::Gt => IntCmp::Lt,
                IntCmp::Le => IntCmp::Ge,
                IntCmp::Ge => IntCmp::Le,
                IntCmp::Ult => IntCmp::Ugt,
                IntCmp::Ugt => IntCmp::Ult,
                IntCmp::Ule => IntCmp::Uge,
                IntCmp::Uge => IntCmp::Ule,
                k => k,
            };
        }
        let signed = !matches!(kind, IntCmp::Ult | IntCmp::Ule | IntCmp::Ugt | IntCmp::Uge);
        // Eq/Ne immediates compare canonical bits against the sign-extended k: only valid for i32/i1 when
        // k >= 0.
        let kf = self.k32(y, &t).filter(|k| {
            signed
                && (w || t == Type::I32 || *k >= 0)
                && (w || *k >= 0 || !matches!(kind, IntCmp::Eq | IntCmp::Ne))
        });
        let a = self.sreg(x, &t)?;
        let (ins, b) = if let (Some(k), Operand::Value(_)) = (kf, x) {
            let ins = match (kind, w) {
                (IntCmp::Eq, _) => Instr::EqK { d, a, k },
                (IntCmp::Ne, _) => Instr::NeK { d, a, k },
                (IntCmp::Lt, false) => Instr::LtK32 { d, a, k },
                (IntCmp::Le, false) => Instr::LeK32 { d, a, k },
                (IntCmp::Gt, false) => Instr::GtK32 { d, a, k },
                (IntCmp::Ge, false) => Instr::GeK32 { d, a, k },
                (IntCmp::Lt, true) => Instr::LtK64 { d, a, k },
                (IntCmp::Le, true) => Instr::LeK64 { d, a, k },
                (IntCmp::Gt, true) => Instr::GtK64 { d, a, k },
                (IntCmp::Ge, true) => Instr::GeK64 { d, a, k },
                _ => return Err(self.invalid("unsigned immediate compare")),
            };
            (ins, Err(k))
        } else {
            let b = self.sreg(y, &t)?;
            let ins = match (kind, w) {
                (IntCmp::Eq, _) => Instr::Eq { d, a, b },
                (IntCmp::Ne, _) => Instr::Ne { d, a, b },
                (IntCmp::Ult, _) => Instr::Ult { d, a, b },
                (IntCmp::Ule, _) => Instr::Ule { d, a, b },
                (IntCmp::Ugt, _) => Instr::Ult { d, a: b, b: a },
                (IntCmp::Uge, _) => Instr::Ule { d, a: b, b: a },
                (IntCmp::Lt, false) => Instr::Lt32 { d, a, b },
                (IntCmp::Le, false) => Instr::Le32 { d, a, b },
                (IntCmp::Gt, false) => Instr::Lt32 { d, a: b, b: a },
                (IntCmp::Ge, false) => Instr::Le32 { d, a: b, b: a },
                (IntCmp::Lt, true) => Instr::Lt64 { d, a, b },
                (IntCmp::Le, true) => Instr::Le64 { d, a, b },
                (IntCmp::Gt, true) => Instr::Lt64 { d, a: b, b: a },
                (IntCmp::Ge, true) => Instr::Le64 { d, a: b, b: a },
            };
            (ins, Ok(b))
        };
        if t == Type::I1 && !matches!(kind, IntCmp::Eq | IntCmp::Ne) {
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
        Ok(())
    }

    /// `select`: a conditional move of scalars or references.
    pub(super) fn lower_select(&mut self, op: &Op, os: &[Operand]) -> Res<()> {
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
        Ok(())
    }
}
