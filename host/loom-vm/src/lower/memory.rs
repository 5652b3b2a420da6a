//! Buffer and record memory operations: loads, stores (with offset folding), fields, byte ranges, copies, fills.

use super::*;
use loom_ir::Opcode as O;

impl Lowerer<'_> {
    /// Offset operand of a load/store. Folds a preceding single-use `add %x, K` into the displacement and, when
    /// `indexed`, a single-use scaled index: `add(%x, mul(%i, S))` or `mul(add(%x, %y), S)` (S in 1..=255).
    pub(super) fn offset(&mut self, o: &Operand, indexed: bool) -> Res<Addr> {
        if let Some(k) = self.k32(o, &Type::I64) {
            return Ok(Addr::Plain(self.const_s(0)?, k));
        }
        let Ok(Slot::S(mut cur)) = self.slot_or_err(o) else {
            return Ok(Addr::Plain(self.sreg(o, &Type::I64)?, 0));
        };
        let mut disp = 0;
        if let Some(Instr::AddK64 { d, a, k }) = self.last_def_of(cur) {
            if d == cur {
                self.pop_last();
                disp = k;
                cur = a;
            }
        }
        if !indexed {
            return Ok(Addr::Plain(cur, disp));
        }
        let scale = |k: i32| u8::try_from(k).ok().filter(|k| *k > 0);
        match self.last_def_of(cur) {
            Some(Instr::MulK64 { d, a: y, k }) if d == cur && scale(k).is_some() => {
                let sc = scale(k).unwrap_or(1);
                self.pop_last();
                if let Some(Instr::Add64 { d, a: x, b: y2 }) = self.last_def_of(y) {
                    if d == y {
                        self.pop_last();
                        return Ok(Addr::XS { x, y: y2, sc, disp });
                    }
                }
                let x = self.const_s(0)?;
                return Ok(Addr::X { x, y, sc, disp });
            }
            Some(Instr::Add64 { d, a, b }) if d == cur && a != b => {
                let n = self.code.len();
                if let (Some(Instr::MulK64 { d: m, a: y, k }), Some(Some(w))) = (
                    n.checked_sub(2).and_then(|i| self.code.get(i)).copied(),
                    n.checked_sub(2).and_then(|i| self.defs.get(i)).copied(),
                ) {
                    if (m == a || m == b)
                        && self.uses.get(w.0 as usize) == Some(&1)
                        && self.slot(w).ok() == Some(Slot::S(m))
                    {
                        if let Some(sc) = scale(k) {
                            let x = if m == a { b } else { a };
                            self.pop_last();
                            self.pop_last();
                            return Ok(Addr::X { x, y, sc, disp });
                        }
                    }
                }
            }
            _ => {}
        }
        Ok(Addr::Plain(cur, disp))
    }

    pub(super) fn slot_or_err(&self, o: &Operand) -> Res<Slot> {
        match o {
            Operand::Value(v) => self.slot(*v),
            _ => Err(self.invalid("not a value")),
        }
    }

    /// `buffer.new`.
    pub(super) fn lower_buffer_new(&mut self, op: &Op, os: &[Operand]) -> Res<()> {
        let d = self.dr(op)?;
        let len = self.sreg(&os[0], &Type::I64)?;
        self.emit(Instr::BufNew { d, len });
        Ok(())
    }

    /// `buffer.len`.
    pub(super) fn lower_buffer_len(&mut self, op: &Op, os: &[Operand]) -> Res<()> {
        let d = self.ds(op)?;
        let b = self.rreg(&os[0])?;
        self.emit(Instr::BufLen { d, b });
        Ok(())
    }

    /// Buffer loads, folding the offset computation into indexed forms where it can.
    pub(super) fn lower_load(&mut self, op: &Op, opc: Opcode, os: &[Operand]) -> Res<()> {
        let d = self.ds(op)?;
        let b = self.rreg(&os[0])?;
        let indexed = matches!(
            opc,
            O::LoadI32 | O::LoadU32 | O::LoadF32 | O::LoadI64 | O::LoadF64
        );
        let wide = matches!(opc, O::LoadI64 | O::LoadF64);
        let (off, disp) = match self.offset(&os[1], indexed)? {
            Addr::Plain(off, disp) => (off, disp),
            Addr::X { x, y, sc, disp } => {
                self.emit(if wide {
                    Instr::Ld64X {
                        d,
                        b,
                        x,
                        y,
                        sc,
                        disp,
                    }
                } else {
                    Instr::Ld32X {
                        d,
                        b,
                        x,
                        y,
                        sc,
                        disp,
                    }
                });
                return Ok(());
            }
            Addr::XS { x, y, sc, disp } => {
                self.emit(if wide {
                    Instr::Ld64XS {
                        d,
                        b,
                        x,
                        y,
                        sc,
                        disp,
                    }
                } else {
                    Instr::Ld32XS {
                        d,
                        b,
                        x,
                        y,
                        sc,
                        disp,
                    }
                });
                return Ok(());
            }
        };
        let ins = match opc {
            O::LoadI8 => Instr::Ld8s { d, b, off, disp },
            O::LoadU8 => Instr::Ld8u { d, b, off, disp },
            O::LoadI16 => Instr::Ld16s { d, b, off, disp },
            O::LoadU16 => Instr::Ld16u { d, b, off, disp },
            O::LoadI32 | O::LoadU32 | O::LoadF32 => Instr::Ld32 { d, b, off, disp },
            _ => Instr::Ld64 { d, b, off, disp },
        };
        self.emit(ins);
        Ok(())
    }

    /// Buffer stores, folding the offset computation into indexed forms where it can.
    pub(super) fn lower_store(&mut self, opc: Opcode, os: &[Operand]) -> Res<()> {
        let vt = match opc {
            O::StoreI64 => Type::I64,
            O::StoreF32 => Type::F32,
            O::StoreF64 => Type::F64,
            _ => Type::I32,
        };
        let b = self.rreg(&os[0])?;
        let v = self.sreg(&os[2], &vt)?;
        let indexed = !matches!(opc, O::StoreI8 | O::StoreI16);
        let wide = matches!(opc, O::StoreI64 | O::StoreF64);
        let (off, disp) = match self.offset(&os[1], indexed)? {
            Addr::Plain(off, disp) => (off, disp),
            Addr::X { x, y, sc, disp } => {
                self.emit(if wide {
                    Instr::St64X {
                        b,
                        x,
                        y,
                        v,
                        sc,
                        disp,
                    }
                } else {
                    Instr::St32X {
                        b,
                        x,
                        y,
                        v,
                        sc,
                        disp,
                    }
                });
                return Ok(());
            }
            Addr::XS { x, y, sc, disp } => {
                self.emit(if wide {
                    Instr::St64XS {
                        b,
                        x,
                        y,
                        v,
                        sc,
                        disp,
                    }
                } else {
                    Instr::St32XS {
                        b,
                        x,
                        y,
                        v,
                        sc,
                        disp,
                    }
                });
                return Ok(());
            }
        };
        let ins = match opc {
            O::StoreI8 => Instr::St8 { b, off, v, disp },
            O::StoreI16 => Instr::St16 { b, off, v, disp },
            O::StoreI32 | O::StoreF32 => Instr::St32 { b, off, v, disp },
            _ => Instr::St64 { b, off, v, disp },
        };
        self.emit(ins);
        Ok(())
    }

    /// Record field loads and stores (`load.field` / `store.field`).
    pub(super) fn lower_field_access(&mut self, op: &Op, opc: Opcode, os: &[Operand]) -> Res<()> {
        let Operand::Field(r, fi) = &os[2] else {
            return Err(self.invalid(format!("{opc}: operand 3 must be a field")));
        };
        let (size, off, ft) = self.record_field(*r, Some(*fi))?;
        let kind = ScalarKind::of(&ft).ok_or_else(|| self.invalid("record fields are scalars"))?;
        let (Ok(size), Ok(off)) = (u16::try_from(size), u16::try_from(off)) else {
            return Err(LoadError::Limit {
                func: self.f.name.clone(),
                message: "record larger than 65535 bytes".into(),
                loc: self.loc,
                file: self.file.to_string(),
            });
        };
        let b = self.rreg(&os[0])?;
        let idx = self.sreg(&os[1], &Type::I64)?;
        if opc == O::LoadField {
            let d = self.ds(op)?;
            self.emit(Instr::LdField {
                d,
                b,
                idx,
                size,
                off,
                kind,
            });
        } else {
            let v = self.sreg(&os[3], &ft)?;
            self.emit(Instr::StField {
                b,
                idx,
                v,
                size,
                off,
                kind,
            });
        }
        Ok(())
    }

    /// `record.size` / `record.offset`: layout constants.
    pub(super) fn lower_record_layout(&mut self, op: &Op, opc: Opcode, os: &[Operand]) -> Res<()> {
        let d = self.ds(op)?;
        let bits = match &os[0] {
            Operand::Record(r) => self.record_field(*r, None)?.0,
            Operand::Field(r, f) => self.record_field(*r, Some(*f))?.1,
            _ => return Err(self.invalid(format!("{opc} needs a record operand"))),
        };
        self.emit(Instr::ConstS { d, bits });
        Ok(())
    }

    /// `buffer.slice` and `str.from_buffer`: a new object from a byte range of a buffer.
    pub(super) fn lower_byte_range(&mut self, op: &Op, opc: Opcode, os: &[Operand]) -> Res<()> {
        let d = self.dr(op)?;
        let b = self.rreg(&os[0])?;
        let off = self.sreg(&os[1], &Type::I64)?;
        let len = self.sreg(&os[2], &Type::I64)?;
        self.emit(if opc == O::BufferSlice {
            Instr::BufSlice { d, b, off, len }
        } else {
            Instr::StrFromBuf { d, b, off, len }
        });
        Ok(())
    }

    /// `buffer.copy`.
    pub(super) fn lower_buffer_copy(&mut self, os: &[Operand]) -> Res<()> {
        let dst = self.rreg(&os[0])?;
        let doff = self.sreg(&os[1], &Type::I64)?;
        let src = self.rreg(&os[2])?;
        let soff = self.sreg(&os[3], &Type::I64)?;
        let len = self.sreg(&os[4], &Type::I64)?;
        self.emit(Instr::BufCopy {
            dst,
            doff,
            src,
            soff,
            len,
        });
        Ok(())
    }

    /// `buffer.fill`.
    pub(super) fn lower_buffer_fill(&mut self, os: &[Operand]) -> Res<()> {
        let b = self.rreg(&os[0])?;
        let off = self.sreg(&os[1], &Type::I64)?;
        let len = self.sreg(&os[2], &Type::I64)?;
        let byte = self.sreg(&os[3], &Type::I32)?;
        self.emit(Instr::BufFill { b, off, len, byte });
        Ok(())
    }

    /// `buffer.concat` / `str.concat`.
    pub(super) fn lower_concat(&mut self, op: &Op, opc: Opcode, os: &[Operand]) -> Res<()> {
        let d = self.dr(op)?;
        let a = self.rreg(&os[0])?;
        let b = self.rreg(&os[1])?;
        self.emit(if opc == O::BufferConcat {
            Instr::BufConcat { d, a, b }
        } else {
            Instr::StrConcat { d, a, b }
        });
        Ok(())
    }
}
