//! Translation of integer arithmetic, integer compares, float operations and conversions.

use super::*;

impl JitTranslator<'_, '_> {
    /// Integer arithmetic (checked, wrapping, immediate forms, division, min/max), bitwise ops and shifts. False: not
    /// one of these.
    pub(super) fn int_arith_instr(&mut self, ins: Instr, pc: usize) -> bool {
        macro_rules! ii {
            ($op:ident, $d:expr, $a:expr, $b:expr) => {{
                let (x, y) = (self.g($a), self.g($b));
                let v = self.b.ins().$op(x, y);
                self.set($d, v);
            }};
        }
        macro_rules! ii32 {
            ($op:ident, $d:expr, $a:expr, $b:expr) => {{
                let (x, y) = (self.g32($a), self.g32($b));
                let v = self.b.ins().$op(x, y);
                self.set32($d, v);
            }};
        }
        use Instr as I;
        use IntCC::*;
        match ins {
            I::Add32 { d, a, b } => self.chk_rr(d, a, b, 0, true, pc),
            I::Add64 { d, a, b } => self.chk_rr(d, a, b, 0, false, pc),
            I::Sub32 { d, a, b } => self.chk_rr(d, a, b, 1, true, pc),
            I::Sub64 { d, a, b } => self.chk_rr(d, a, b, 1, false, pc),
            I::Mul32 { d, a, b } => self.chk_rr(d, a, b, 2, true, pc),
            I::Mul64 { d, a, b } => self.chk_rr(d, a, b, 2, false, pc),
            I::AddK32 { d, a, k } => self.chk_rk(d, a, k, 0, true, pc),
            I::AddK64 { d, a, k } => self.chk_rk(d, a, k, 0, false, pc),
            I::SubK32 { d, a, k } => self.chk_rk(d, a, k, 1, true, pc),
            I::SubK64 { d, a, k } => self.chk_rk(d, a, k, 1, false, pc),
            I::MulK32 { d, a, k } => self.chk_rk(d, a, k, 2, true, pc),
            I::MulK64 { d, a, k } => self.chk_rk(d, a, k, 2, false, pc),
            I::AddW32 { d, a, b } | I::AddW64 { d, a, b } => {
                let (x, y) = (self.g(a), self.g(b));
                let v = self.b.ins().iadd(x, y);
                self.wrap(d, v, matches!(ins, I::AddW32 { .. }))
            }
            I::SubW32 { d, a, b } | I::SubW64 { d, a, b } => {
                let (x, y) = (self.g(a), self.g(b));
                let v = self.b.ins().isub(x, y);
                self.wrap(d, v, matches!(ins, I::SubW32 { .. }))
            }
            I::MulW32 { d, a, b } | I::MulW64 { d, a, b } => {
                let (x, y) = (self.g(a), self.g(b));
                let v = self.b.ins().imul(x, y);
                self.wrap(d, v, matches!(ins, I::MulW32 { .. }))
            }
            I::AddWK32 { d, a, k } | I::AddWK64 { d, a, k } => {
                let x = self.g(a);
                let v = self.b.ins().iadd_imm_s(x, k as i64);
                self.wrap(d, v, matches!(ins, I::AddWK32 { .. }))
            }
            I::MulWK32 { d, a, k } | I::MulWK64 { d, a, k } => {
                let x = self.g(a);
                let v = self.b.ins().imul_imm_s(x, k as i64);
                self.wrap(d, v, matches!(ins, I::MulWK32 { .. }))
            }
            I::MulAddW64 { d, a, b, c } => {
                let (x, y, z) = (self.g(a), self.g(b), self.g(c));
                let m = self.b.ins().imul(x, y);
                let v = self.b.ins().iadd(m, z);
                self.set(d, v)
            }
            I::MulKAddW64 { d, a, k, c } => {
                let (x, z) = (self.g(a), self.g(c));
                let m = self.b.ins().imul_imm_s(x, k as i64);
                let v = self.b.ins().iadd(m, z);
                self.set(d, v)
            }
            I::Div32 { d, a, b } => self.div(d, a, b, true, false, true, pc),
            I::Div64 { d, a, b } => self.div(d, a, b, true, false, false, pc),
            I::Rem32 { d, a, b } => self.div(d, a, b, true, true, true, pc),
            I::Rem64 { d, a, b } => self.div(d, a, b, true, true, false, pc),
            I::DivU32 { d, a, b } => self.div(d, a, b, false, false, true, pc),
            I::DivU64 { d, a, b } => self.div(d, a, b, false, false, false, pc),
            I::RemU32 { d, a, b } => self.div(d, a, b, false, true, true, pc),
            I::RemU64 { d, a, b } => self.div(d, a, b, false, true, false, pc),
            I::Min32 { d, a, b } => ii32!(smin, d, a, b),
            I::Min64 { d, a, b } => ii!(smin, d, a, b),
            I::Max32 { d, a, b } => ii32!(smax, d, a, b),
            I::Max64 { d, a, b } => ii!(smax, d, a, b),
            I::Neg32 { d, a } | I::Abs32 { d, a } => {
                let x = self.g32(a);
                let mn = self.k32(i32::MIN);
                let c = self.b.ins().icmp(Equal, x, mn);
                self.bail_if(c, pc);
                let v = if matches!(ins, I::Neg32 { .. }) {
                    self.b.ins().ineg(x)
                } else {
                    self.b.ins().iabs(x)
                };
                self.set32(d, v)
            }
            I::Neg64 { d, a } | I::Abs64 { d, a } => {
                let x = self.g(a);
                let c = self.b.ins().icmp_imm_s(Equal, x, i64::MIN);
                self.bail_if(c, pc);
                let v = if matches!(ins, I::Neg64 { .. }) {
                    self.b.ins().ineg(x)
                } else {
                    self.b.ins().iabs(x)
                };
                self.set(d, v)
            }
            I::And { d, a, b } => ii!(band, d, a, b),
            I::Or { d, a, b } => ii!(bor, d, a, b),
            I::Xor { d, a, b } => ii!(bxor, d, a, b),
            I::AndK { d, a, k } => {
                let x = self.g(a);
                let v = self.b.ins().band_imm_s(x, k as i64);
                self.set(d, v)
            }
            I::AndK64 { d, a, k } => {
                let x = self.g(a);
                let v = self.b.ins().band_imm_s(x, k as i64);
                self.set(d, v)
            }
            I::OrK { d, a, k } => {
                let x = self.g(a);
                let v = self.b.ins().bor_imm_s(x, k as i64);
                self.set(d, v)
            }
            I::XorK { d, a, k } => {
                let x = self.g(a);
                let v = self.b.ins().bxor_imm_s(x, k as i64);
                self.set(d, v)
            }
            I::Not1 { d, a } => {
                let x = self.g(a);
                let v = self.b.ins().bxor_imm_s(x, 1);
                self.set(d, v)
            }
            I::Not32 { d, a } => {
                let x = self.g32(a);
                let v = self.b.ins().bnot(x);
                self.set32(d, v)
            }
            I::Not64 { d, a } => {
                let x = self.g(a);
                let v = self.b.ins().bnot(x);
                self.set(d, v)
            }
            I::Shl32 { d, a, b } => ii32!(ishl, d, a, b),
            I::Shr32 { d, a, b } => ii32!(sshr, d, a, b),
            I::ShrU32 { d, a, b } => ii32!(ushr, d, a, b),
            I::Shl64 { d, a, b } => ii!(ishl, d, a, b),
            I::Shr64 { d, a, b } => ii!(sshr, d, a, b),
            I::ShrU64 { d, a, b } => ii!(ushr, d, a, b),
            I::ShlK32 { d, a, k } | I::ShrK32 { d, a, k } | I::ShrUK32 { d, a, k } => {
                let x = self.g32(a);
                let k = k as i64;
                let v = match ins {
                    I::ShlK32 { .. } => self.b.ins().ishl_imm_u(x, k),
                    I::ShrK32 { .. } => self.b.ins().sshr_imm_u(x, k),
                    _ => self.b.ins().ushr_imm_u(x, k),
                };
                self.set32(d, v)
            }
            I::ShlK64 { d, a, k } | I::ShrK64 { d, a, k } | I::ShrUK64 { d, a, k } => {
                let x = self.g(a);
                let k = k as i64;
                let v = match ins {
                    I::ShlK64 { .. } => self.b.ins().ishl_imm_u(x, k),
                    I::ShrK64 { .. } => self.b.ins().sshr_imm_u(x, k),
                    _ => self.b.ins().ushr_imm_u(x, k),
                };
                self.set(d, v)
            }
            _ => return false,
        }
        true
    }

    /// Integer compares into a boolean register. False: not one of these.
    pub(super) fn int_compare_instr(&mut self, ins: Instr) -> bool {
        macro_rules! cmp {
            ($cc:expr, $d:expr, $x:expr, $y:expr) => {{
                let (x, y) = ($x, $y);
                let c = self.b.ins().icmp($cc, x, y);
                self.set_bool($d, c);
            }};
        }
        use Instr as I;
        use IntCC::*;
        match ins {
            I::Eq { d, a, b } => cmp!(Equal, d, self.g(a), self.g(b)),
            I::Ne { d, a, b } => cmp!(NotEqual, d, self.g(a), self.g(b)),
            I::Ult { d, a, b } => cmp!(UnsignedLessThan, d, self.g(a), self.g(b)),
            I::Ule { d, a, b } => cmp!(UnsignedLessThanOrEqual, d, self.g(a), self.g(b)),
            I::Lt32 { d, a, b } => cmp!(SignedLessThan, d, self.g32(a), self.g32(b)),
            I::Le32 { d, a, b } => cmp!(SignedLessThanOrEqual, d, self.g32(a), self.g32(b)),
            I::Lt64 { d, a, b } => cmp!(SignedLessThan, d, self.g(a), self.g(b)),
            I::Le64 { d, a, b } => cmp!(SignedLessThanOrEqual, d, self.g(a), self.g(b)),
            I::EqK { d, a, k } => cmp!(Equal, d, self.g(a), self.k64(k as i64)),
            I::NeK { d, a, k } => cmp!(NotEqual, d, self.g(a), self.k64(k as i64)),
            I::LtK32 { d, a, k } => cmp!(SignedLessThan, d, self.g32(a), self.k32(k)),
            I::LeK32 { d, a, k } => cmp!(SignedLessThanOrEqual, d, self.g32(a), self.k32(k)),
            I::GtK32 { d, a, k } => cmp!(SignedGreaterThan, d, self.g32(a), self.k32(k)),
            I::GeK32 { d, a, k } => cmp!(SignedGreaterThanOrEqual, d, self.g32(a), self.k32(k)),
            I::LtK64 { d, a, k } => cmp!(SignedLessThan, d, self.g(a), self.k64(k as i64)),
            I::LeK64 { d, a, k } => cmp!(SignedLessThanOrEqual, d, self.g(a), self.k64(k as i64)),
            I::GtK64 { d, a, k } => cmp!(SignedGreaterThan, d, self.g(a), self.k64(k as i64)),
            I::GeK64 { d, a, k } => {
                cmp!(SignedGreaterThanOrEqual, d, self.g(a), self.k64(k as i64))
            }
            _ => return false,
        }
        true
    }

    /// Float arithmetic, float compares and conversions. False: not one of these.
    pub(super) fn float_instr(&mut self, ins: Instr, pc: usize) -> bool {
        macro_rules! fop {
            ($op:ident, $d:expr, $a:expr, $b:expr, $w:expr) => {{
                if $w {
                    let (x, y) = (self.f64v($a), self.f64v($b));
                    let v = self.b.ins().$op(x, y);
                    self.set_f64($d, v);
                } else {
                    let (x, y) = (self.f32v($a), self.f32v($b));
                    let v = self.b.ins().$op(x, y);
                    self.set_f32($d, v);
                }
            }};
        }
        use Instr as I;
        match ins {
            I::FAdd32 { d, a, b } => fop!(fadd, d, a, b, false),
            I::FAdd64 { d, a, b } => fop!(fadd, d, a, b, true),
            I::FSub32 { d, a, b } => fop!(fsub, d, a, b, false),
            I::FSub64 { d, a, b } => fop!(fsub, d, a, b, true),
            I::FMul32 { d, a, b } => fop!(fmul, d, a, b, false),
            I::FMul64 { d, a, b } => fop!(fmul, d, a, b, true),
            I::FBin { d, a, b, op, wide } => {
                let (x, y) = (self.fwide(a, wide), self.fwide(b, wide));
                let v = match op {
                    FloatBinary::Div => self.b.ins().fdiv(x, y),
                    _ => unreachable!("ineligible"),
                };
                self.set_fwide(d, v, wide)
            }
            I::FUn { d, a, op, wide } => {
                let x = self.fwide(a, wide);
                let v = match op {
                    FloatUnary::Neg => self.b.ins().fneg(x),
                    FloatUnary::Abs => self.b.ins().fabs(x),
                    FloatUnary::Sqrt => self.b.ins().sqrt(x),
                    _ => unreachable!("ineligible"),
                };
                self.set_fwide(d, v, wide)
            }
            I::FCmp { d, a, b, op, wide } => {
                let (x, y) = (self.fwide(a, wide), self.fwide(b, wide));
                let cc = match op {
                    FloatCmp::Eq => FloatCC::Equal,
                    FloatCmp::Ne => FloatCC::NotEqual,
                    FloatCmp::Lt => FloatCC::LessThan,
                    FloatCmp::Le => FloatCC::LessThanOrEqual,
                    FloatCmp::Gt => FloatCC::GreaterThan,
                    FloatCmp::Ge => FloatCC::GreaterThanOrEqual,
                };
                let c = self.b.ins().fcmp(cc, x, y);
                self.set_bool(d, c)
            }
            I::Conv { d, a, op } => self.conv(d, a, op, pc),
            _ => return false,
        }
        true
    }
}
