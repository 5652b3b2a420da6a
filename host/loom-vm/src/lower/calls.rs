//! Calls: of Loom functions (a call site with the argument and result registers) and of native imports.

use super::*;

impl Lowerer<'_> {
    /// A call of a Loom function or of a native import.
    pub(super) fn lower_call(&mut self, op: &Op, callee: &Callee, args: &[Operand]) -> Res<()> {
        match callee {
            Callee::Func(fi) => {
                let g = self
                    .prog
                    .funcs
                    .get(*fi as usize)
                    .ok_or_else(|| self.invalid("callee out of range"))?;
                let sig = g.signature();
                if sig.params.len() != args.len() || sig.results.len() != op.results.len() {
                    return Err(self.invalid(format!(
                        "call of @{} with the wrong number of arguments or results",
                        g.name
                    )));
                }
                let pslots = param_slots(&sig.params);
                let (mut sargs, mut rargs) = (Vec::new(), Vec::new());
                for ((a, t), p) in args.iter().zip(&sig.params).zip(pslots) {
                    match (self.slot_of(a, t)?, p) {
                        (Slot::S(x), Slot::S(y)) => sargs.push((x, y)),
                        (Slot::R(x), Slot::R(y)) => rargs.push((x, y)),
                        _ => return Err(self.invalid("argument bank mismatch")),
                    }
                }
                let results = op
                    .results
                    .iter()
                    .map(|v| self.slot(*v))
                    .collect::<Res<Vec<_>>>()?;
                let site = self.calls.len() as u32;
                self.calls.push(CallSite {
                    callee: *fi,
                    sargs: sargs.into(),
                    rargs: rargs.into(),
                    results: results.into(),
                });
                self.emit(Instr::Call { site });
            }
            Callee::Decl(di) => {
                let d = self
                    .prog
                    .imports
                    .get(*di as usize)
                    .ok_or_else(|| self.invalid("import out of range"))?;
                if d.sig.params.len() != args.len() || d.sig.results.len() != op.results.len() {
                    return Err(self.invalid(format!(
                        "call of @{} with the wrong number of arguments or results",
                        d.symbol
                    )));
                }
                let mut sl = Vec::new();
                for (a, t) in args.iter().zip(&d.sig.params) {
                    sl.push(self.slot_of(a, t)?);
                }
                let results = op
                    .results
                    .iter()
                    .map(|v| self.slot(*v))
                    .collect::<Res<Vec<_>>>()?;
                let site = self.natives.len() as u32;
                self.natives.push(NativeSite {
                    import: *di,
                    args: sl.into(),
                    results: results.into(),
                });
                self.emit(Instr::CallNative { site });
            }
            Callee::TParam(_) => {
                return Err(self.invalid("call of a template parameter in a linked program"));
            }
        }
        Ok(())
    }
}
