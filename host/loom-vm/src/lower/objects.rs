//! Strings, lists, opaque tuples, `assert` and `trap`.

use super::*;
use loom_ir::Opcode as O;

impl Lowerer<'_> {
    /// `str.eq`.
    pub(super) fn lower_str_eq(&mut self, op: &Op, os: &[Operand]) -> Res<()> {
        let d = self.ds(op)?;
        let a = self.rreg(&os[0])?;
        let b = self.rreg(&os[1])?;
        self.emit(Instr::StrEq { d, a, b });
        Ok(())
    }

    /// Scalar queries of a reference: string/list/opaque lengths, `str.parse_i64`, `ref.is_null`.
    pub(super) fn lower_length_or_test(&mut self, op: &Op, opc: Opcode, os: &[Operand]) -> Res<()> {
        let d = self.ds(op)?;
        let a = self.rreg(&os[0])?;
        self.emit(match opc {
            O::StrLen => Instr::StrLen { d, a },
            O::StrParseI64 => Instr::StrParse { d, a },
            O::ListLen => Instr::ListLen { d, l: a },
            O::OpaqueLen => Instr::OpaqueLen { d, o: a },
            _ => Instr::IsNull { d, a },
        });
        Ok(())
    }

    /// `str.from_i64` / `str.from_f64`.
    pub(super) fn lower_str_from_number(
        &mut self,
        op: &Op,
        opc: Opcode,
        os: &[Operand],
    ) -> Res<()> {
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
        Ok(())
    }

    /// `str.to_buffer` and `ref.unwrap`: a reference from a reference.
    pub(super) fn lower_ref_to_ref(&mut self, op: &Op, opc: Opcode, os: &[Operand]) -> Res<()> {
        let d = self.dr(op)?;
        let a = self.rreg(&os[0])?;
        self.emit(if opc == O::StrToBuffer {
            Instr::StrToBuf { d, a }
        } else {
            Instr::Unwrap { d, a }
        });
        Ok(())
    }

    /// `list.new`.
    pub(super) fn lower_list_new(&mut self, op: &Op, os: &[Operand]) -> Res<()> {
        let d = self.dr(op)?;
        let cap = self.sreg(&os[0], &Type::I64)?;
        self.emit(Instr::ListNew { d, cap });
        Ok(())
    }

    /// `list.get`.
    pub(super) fn lower_list_get(&mut self, op: &Op, os: &[Operand]) -> Res<()> {
        let l = self.rreg(&os[0])?;
        let i = self.sreg(&os[1], &Type::I64)?;
        self.emit(match self.dst(op, 0)? {
            Slot::S(d) => Instr::ListGetS { d, l, i },
            Slot::R(d) => Instr::ListGetR { d, l, i },
        });
        Ok(())
    }

    /// `list.set` / `list.push`.
    pub(super) fn lower_list_set_or_push(&mut self, opc: Opcode, os: &[Operand]) -> Res<()> {
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
        Ok(())
    }

    /// `opaque.new`: a tuple of typed values.
    pub(super) fn lower_opaque_new(&mut self, op: &Op, os: &[Operand]) -> Res<()> {
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
        Ok(())
    }

    /// `opaque.get`: one typed value of a tuple.
    pub(super) fn lower_opaque_get(
        &mut self,
        op: &Op,
        os: &[Operand],
        ann: Option<&Type>,
    ) -> Res<()> {
        let t = ann.ok_or_else(|| self.invalid("opaque.get needs a type annotation"))?;
        let ty = self.tables.ty(t);
        let o = self.rreg(&os[0])?;
        let i = self.sreg(&os[1], &Type::I64)?;
        self.emit(match self.dst(op, 0)? {
            Slot::S(d) => Instr::OpaqueGetS { d, o, i, ty },
            Slot::R(d) => Instr::OpaqueGetR { d, o, i, ty },
        });
        Ok(())
    }

    /// `assert`.
    pub(super) fn lower_assert(&mut self, os: &[Operand]) -> Res<()> {
        let c = self.sreg(&os[0], &Type::I1)?;
        let msg = self.rreg(&os[1])?;
        self.emit(Instr::Assert { c, msg });
        Ok(())
    }

    /// `trap`.
    pub(super) fn lower_trap(&mut self, os: &[Operand]) -> Res<()> {
        let msg = self.rreg(&os[0])?;
        self.emit(Instr::Trap { msg });
        Ok(())
    }
}
