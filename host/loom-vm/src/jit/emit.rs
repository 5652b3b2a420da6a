//! The translator's building blocks: register variables, fuel, exits, branches, checked arithmetic, buffer
//! access and conversions.

use super::*;

impl JitTranslator<'_, '_> {
    pub(super) fn var(&mut self, r: R) -> Variable {
        match self.vars[r as usize] {
            Some(v) => v,
            None => {
                let v = self.b.declare_var(I64);
                self.vars[r as usize] = Some(v);
                v
            }
        }
    }
    pub(super) fn g(&mut self, r: R) -> Value {
        let v = self.var(r);
        self.b.use_var(v)
    }
    pub(super) fn g32(&mut self, r: R) -> Value {
        let x = self.g(r);
        self.b.ins().ireduce(I32, x)
    }
    pub(super) fn set(&mut self, r: R, x: Value) {
        let v = self.var(r);
        self.b.ins().store(win(), x, self.sp, r as i32 * 8);
        self.b.def_var(v, x);
    }
    pub(super) fn set32(&mut self, r: R, x: Value) {
        let x = self.b.ins().uextend(I64, x);
        self.set(r, x);
    }
    pub(super) fn set_bool(&mut self, r: R, c: Value) {
        let x = self.b.ins().uextend(I64, c);
        self.set(r, x);
    }
    pub(super) fn k64(&mut self, k: i64) -> Value {
        self.b.ins().iconst(I64, k)
    }
    pub(super) fn k32(&mut self, k: i32) -> Value {
        self.b.ins().iconst(I32, k as u32 as i64)
    }
    pub(super) fn pcv(&mut self, pc: usize) -> Value {
        self.b.ins().iconst(I32, pc as i64)
    }
    /// Leaves for the interpreter at `pc` when `c` holds; continues in a new block otherwise.
    pub(super) fn bail_if(&mut self, c: Value, pc: usize) {
        let cont = self.b.create_block();
        let bail = self.bail_block(pc);
        self.b.ins().brif(c, bail, &[], cont, &[]);
        self.b.switch_to_block(cont);
    }
    /// The cold block that leaves for the interpreter at `pc` (one per pc; filled at the end).
    pub(super) fn bail_block(&mut self, pc: usize) -> Block {
        if let Some(blk) = self.bails[pc] {
            return blk;
        }
        let blk = self.b.create_block();
        self.b.set_cold_block(blk);
        self.bails[pc] = Some(blk);
        blk
    }
    pub(super) fn exit_at(&mut self, pc: usize) {
        let pv = self.pcv(pc);
        self.b.ins().jump(self.exit, &[BlockArg::Value(pv)]);
    }
    pub(super) fn charge(&mut self, n: u64, pc: usize) {
        if n == 0 {
            return;
        }
        let f = self.b.use_var(self.fuel);
        let c = self
            .b
            .ins()
            .icmp_imm_s(IntCC::UnsignedLessThan, f, n as i64);
        self.bail_if(c, pc);
        let f2 = self.b.ins().iadd_imm_s(f, -(n as i64));
        self.b.def_var(self.fuel, f2);
    }
    pub(super) fn block(&self, pc: u32) -> Block {
        self.blocks[pc as usize].expect("jump targets are leaders")
    }
    /// `if c { charge tf; goto target } else { charge f; fall through }`.
    pub(super) fn jif(&mut self, c: Value, target: u32, f: u16, tf: u16, pc: usize) -> bool {
        let (tb, fb) = (self.b.create_block(), self.b.create_block());
        self.b.ins().brif(c, tb, &[], fb, &[]);
        self.b.switch_to_block(tb);
        self.charge(tf as u64, pc);
        let tgt = self.block(target);
        self.b.ins().jump(tgt, &[]);
        self.b.switch_to_block(fb);
        self.charge(f as u64, pc);
        true
    }
    pub(super) fn jcmp(
        &mut self,
        cc: IntCC,
        a: R,
        b: R,
        w32: bool,
        target: u32,
        f: u16,
        tf: u16,
        pc: usize,
    ) {
        let (x, y) = if w32 {
            (self.g32(a), self.g32(b))
        } else {
            (self.g(a), self.g(b))
        };
        let c = self.b.ins().icmp(cc, x, y);
        self.jif(c, target, f, tf, pc);
    }
    pub(super) fn jcmpk(
        &mut self,
        cc: IntCC,
        a: R,
        k: i32,
        w32: bool,
        target: u32,
        f: u16,
        tf: u16,
        pc: usize,
    ) {
        let (x, y) = if w32 {
            (self.g32(a), self.k32(k))
        } else {
            (self.g(a), self.k64(k as i64))
        };
        let c = self.b.ins().icmp(cc, x, y);
        self.jif(c, target, f, tf, pc);
    }
    pub(super) fn for_loop(&mut self, iv: R, hi: R, step: Value, target: u32, f: u32, pc: usize) {
        let x = self.g(iv);
        let (nv, of) = self.b.ins().sadd_overflow(x, step);
        let (c1, fall) = (self.b.create_block(), self.b.create_block());
        self.b.ins().brif(of, fall, &[], c1, &[]);
        self.b.switch_to_block(c1);
        // The interpreter writes `iv` before reading `hi`: the same register reads the new value.
        let h = if hi == iv { nv } else { self.g(hi) };
        let lt = self.b.ins().icmp(IntCC::SignedLessThan, nv, h);
        let (take, stay) = (self.b.create_block(), self.b.create_block());
        self.b.ins().brif(lt, take, &[], stay, &[]);
        self.b.switch_to_block(take);
        self.charge(f as u64, pc);
        self.set(iv, nv);
        let tgt = self.block(target);
        self.b.ins().jump(tgt, &[]);
        self.b.switch_to_block(stay);
        self.set(iv, nv);
        self.b.ins().jump(fall, &[]);
        self.b.switch_to_block(fall);
    }
    /// Checked binary op: bails on overflow.
    pub(super) fn chk(&mut self, d: R, x: Value, y: Value, op: u8, w32: bool, pc: usize) {
        let (v, of) = match op {
            0 => self.b.ins().sadd_overflow(x, y),
            1 => self.b.ins().ssub_overflow(x, y),
            _ => self.b.ins().smul_overflow(x, y),
        };
        self.bail_if(of, pc);
        if w32 {
            self.set32(d, v)
        } else {
            self.set(d, v)
        }
    }
    pub(super) fn chk_rr(&mut self, d: R, a: R, b: R, op: u8, w32: bool, pc: usize) {
        let (x, y) = if w32 {
            (self.g32(a), self.g32(b))
        } else {
            (self.g(a), self.g(b))
        };
        self.chk(d, x, y, op, w32, pc);
    }
    pub(super) fn chk_rk(&mut self, d: R, a: R, k: i32, op: u8, w32: bool, pc: usize) {
        let (x, y) = if w32 {
            (self.g32(a), self.k32(k))
        } else {
            (self.g(a), self.k64(k as i64))
        };
        self.chk(d, x, y, op, w32, pc);
    }
    pub(super) fn div(&mut self, d: R, a: R, b: R, signed: bool, rem: bool, w32: bool, pc: usize) {
        let (x, y) = if w32 {
            (self.g32(a), self.g32(b))
        } else {
            (self.g(a), self.g(b))
        };
        let z = self.b.ins().icmp_imm_s(IntCC::Equal, y, 0);
        self.bail_if(z, pc);
        let v = if signed {
            let (min, m1) = if w32 {
                (self.k32(i32::MIN), self.k32(-1))
            } else {
                (self.k64(i64::MIN), self.k64(-1))
            };
            let m1 = self.b.ins().icmp(IntCC::Equal, y, m1);
            let mn = self.b.ins().icmp(IntCC::Equal, x, min);
            let o = self.b.ins().band(m1, mn);
            self.bail_if(o, pc);
            if rem {
                self.b.ins().srem(x, y)
            } else {
                self.b.ins().sdiv(x, y)
            }
        } else if rem {
            self.b.ins().urem(x, y)
        } else {
            self.b.ins().udiv(x, y)
        };
        if w32 {
            self.set32(d, v)
        } else {
            self.set(d, v)
        }
    }
    pub(super) fn wrap(&mut self, d: R, v: Value, w32: bool) {
        if w32 {
            let t = self.b.ins().ireduce(I32, v);
            self.set32(d, t)
        } else {
            self.set(d, v)
        }
    }
    pub(super) fn f32v(&mut self, r: R) -> Value {
        let x = self.g32(r);
        self.b.ins().bitcast(F32, MemFlagsData::new(), x)
    }
    pub(super) fn f64v(&mut self, r: R) -> Value {
        let x = self.g(r);
        self.b.ins().bitcast(F64, MemFlagsData::new(), x)
    }
    /// `f32` operands widened to `f64` (as the interpreter's cold path does), or `f64` operands.
    pub(super) fn fwide(&mut self, r: R, wide: bool) -> Value {
        if wide {
            self.f64v(r)
        } else {
            let x = self.f32v(r);
            self.b.ins().fpromote(F64, x)
        }
    }
    pub(super) fn set_f64(&mut self, d: R, v: Value) {
        let x = self.b.ins().bitcast(I64, MemFlagsData::new(), v);
        self.set(d, x)
    }
    pub(super) fn set_f32(&mut self, d: R, v: Value) {
        let x = self.b.ins().bitcast(I32, MemFlagsData::new(), v);
        self.set32(d, x)
    }
    /// Result of a cold-path float op computed in `f64`.
    pub(super) fn set_fwide(&mut self, d: R, v: Value, wide: bool) {
        if wide {
            self.set_f64(d, v)
        } else {
            let n = self.b.ins().fdemote(F32, v);
            self.set_f32(d, n)
        }
    }
    pub(super) fn rload(&mut self, r: R) -> Value {
        self.b.ins().load(I32, win(), self.rp, r as i32 * 4)
    }
    pub(super) fn rstore(&mut self, d: R, h: Value) {
        self.b.ins().store(win(), h, self.rp, d as i32 * 4);
        if let Some(c) = self.cache[d as usize] {
            let z = self.b.ins().iconst(I64, 0);
            self.b.def_var(c.rptr, z);
            self.b.def_var(c.wptr, z);
        }
    }
    /// Data pointer and length of the buffer in `r[b]` (writable when `write`).
    pub(super) fn buf(&mut self, b: R, write: bool, pc: usize) -> (Value, Value) {
        let c = self.cache[b as usize].expect("buffer registers have caches");
        let var = if write { c.wptr } else { c.rptr };
        let cur = self.b.use_var(var);
        let (slow, join) = (self.b.create_block(), self.b.create_block());
        self.b.set_cold_block(slow);
        let z = self.b.ins().icmp_imm_s(IntCC::Equal, cur, 0);
        self.b.ins().brif(z, slow, &[], join, &[]);
        self.b.switch_to_block(slow);
        let h = self.rload(b);
        let w = self.b.ins().iconst(I32, write as i64);
        let call = self.b.ins().call(self.h_buf, &[self.ctx, h, w]);
        let ok = self.b.inst_results(call)[0];
        let bad = self.b.ins().icmp_imm_s(IntCC::Equal, ok, 0);
        self.bail_if(bad, pc);
        let p = self.b.ins().load(I64, win(), self.ctx, CTX_PTR);
        let l = self.b.ins().load(I64, win(), self.ctx, CTX_LEN);
        if write {
            // A copy-on-write may have moved this handle's data: every cached read pointer may be stale.
            let zero = self.b.ins().iconst(I64, 0);
            for x in &self.caches {
                self.b.def_var(x.rptr, zero);
            }
            self.b.def_var(c.wptr, p);
        }
        self.b.def_var(c.rptr, p);
        self.b.def_var(c.len, l);
        self.b.ins().jump(join, &[]);
        self.b.switch_to_block(join);
        let p = self.b.use_var(var);
        let l = self.b.use_var(c.len);
        (p, l)
    }
    /// Address of `n` bytes at offset `o` of the buffer in `r[b]`, bounds-checked (bails when out of bounds).
    pub(super) fn addr(&mut self, b: R, o: Value, n: i64, write: bool, pc: usize) -> Value {
        let (p, l) = self.buf(b, write, pc);
        let neg = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, o, 0);
        let end = self.b.ins().iadd_imm_s(o, n);
        let past = self.b.ins().icmp(IntCC::UnsignedGreaterThan, end, l);
        let bad = self.b.ins().bor(neg, past);
        self.bail_if(bad, pc);
        self.b.ins().iadd(p, o)
    }
    pub(super) fn ea(&mut self, off: R, disp: i32, pc: usize) -> Value {
        let x = self.g(off);
        self.add_disp(x, disp, pc)
    }
    pub(super) fn ea_x(
        &mut self,
        x: R,
        y: R,
        sc: u8,
        disp: i32,
        scaled_sum: bool,
        pc: usize,
    ) -> Value {
        let (xv, yv) = (self.g(x), self.g(y));
        let s = self.k64(sc as i64);
        let o = if scaled_sum {
            let (t, of1) = self.b.ins().sadd_overflow(xv, yv);
            self.bail_if(of1, pc);
            let (o, of2) = self.b.ins().smul_overflow(t, s);
            self.bail_if(of2, pc);
            o
        } else {
            let (t, of1) = self.b.ins().smul_overflow(yv, s);
            self.bail_if(of1, pc);
            let (o, of2) = self.b.ins().sadd_overflow(xv, t);
            self.bail_if(of2, pc);
            o
        };
        self.add_disp(o, disp, pc)
    }
    pub(super) fn add_disp(&mut self, o: Value, disp: i32, pc: usize) -> Value {
        if disp == 0 {
            return o;
        }
        let k = self.k64(disp as i64);
        let (v, of) = self.b.ins().sadd_overflow(o, k);
        self.bail_if(of, pc);
        v
    }
    /// Loads `n` bytes (`kind`: 0 unsigned, 1 signed-to-i32) into `s[d]`.
    pub(super) fn load(&mut self, d: R, b: R, o: Value, n: i64, signed: bool, pc: usize) {
        let a = self.addr(b, o, n, false, pc);
        let f = heapf();
        let v = match (n, signed) {
            (1, false) => self.b.ins().uload8(I64, f, a, 0),
            (2, false) => self.b.ins().uload16(I64, f, a, 0),
            (4, _) => self.b.ins().uload32(f, a, 0),
            (8, _) => self.b.ins().load(I64, f, a, 0),
            (1, true) => {
                let x = self.b.ins().sload8(I32, f, a, 0);
                self.b.ins().uextend(I64, x)
            }
            _ => {
                let x = self.b.ins().sload16(I32, f, a, 0);
                self.b.ins().uextend(I64, x)
            }
        };
        self.set(d, v);
    }
    pub(super) fn store(&mut self, b: R, o: Value, v: R, n: i64, pc: usize) {
        let a = self.addr(b, o, n, true, pc);
        let x = self.g(v);
        let f = heapf();
        match n {
            1 => self.b.ins().istore8(f, x, a, 0),
            2 => self.b.ins().istore16(f, x, a, 0),
            4 => self.b.ins().istore32(f, x, a, 0),
            _ => self.b.ins().store(f, x, a, 0),
        };
    }
    pub(super) fn field_off(&mut self, idx: R, size: u16, off: u16, pc: usize) -> Value {
        let x = self.g(idx);
        let s = self.k64(size as i64);
        let (m, of1) = self.b.ins().smul_overflow(x, s);
        let k = self.k64(off as i64);
        let (o, of2) = self.b.ins().sadd_overflow(m, k);
        let of = self.b.ins().bor(of1, of2);
        self.bail_if(of, pc);
        o
    }
    pub(super) fn conv(&mut self, d: R, a: R, op: Conv, pc: usize) {
        let (from, to) = match op {
            Conv::TruncI32 => {
                let x = self.g32(a);
                return self.set32(d, x);
            }
            Conv::To { from, to } => (from, to),
        };
        /// The source value widened exactly: to i64 or to f64.
        enum Widened {
            Int(Value),
            Float(Value),
        }
        let w = match from {
            ScalarKind::I1 => {
                let x = self.g(a);
                Widened::Int(self.b.ins().band_imm_s(x, 1))
            }
            ScalarKind::I32 => {
                let x = self.g32(a);
                Widened::Int(self.b.ins().sextend(I64, x))
            }
            ScalarKind::I64 => Widened::Int(self.g(a)),
            ScalarKind::F32 => {
                let x = self.f32v(a);
                Widened::Float(self.b.ins().fpromote(F64, x))
            }
            ScalarKind::F64 => Widened::Float(self.f64v(a)),
        };
        match (to, w) {
            (ScalarKind::I32, Widened::Int(v)) => {
                let n = self.b.ins().ireduce(I32, v);
                let back = self.b.ins().sextend(I64, n);
                let bad = self.b.ins().icmp(IntCC::NotEqual, back, v);
                self.bail_if(bad, pc);
                self.set32(d, n);
            }
            (ScalarKind::I64, Widened::Int(v)) => self.set(d, v),
            (ScalarKind::I32 | ScalarKind::I64, Widened::Float(v)) => {
                let (lo, hi) = if to == ScalarKind::I32 {
                    (-2147483648.0, 2147483648.0)
                } else {
                    (-9223372036854775808.0, 9223372036854775808.0)
                };
                let t = self.b.ins().trunc(v);
                let lo = self.b.ins().f64const(lo);
                let hi = self.b.ins().f64const(hi);
                let ge = self.b.ins().fcmp(FloatCC::GreaterThanOrEqual, t, lo);
                let lt = self.b.ins().fcmp(FloatCC::LessThan, t, hi);
                let ok = self.b.ins().band(ge, lt);
                let bad = self.b.ins().icmp_imm_s(IntCC::Equal, ok, 0);
                self.bail_if(bad, pc);
                let i = self.b.ins().fcvt_to_sint_sat(I64, t);
                self.wrap(d, i, to == ScalarKind::I32);
            }
            (ScalarKind::F32, Widened::Int(v)) => {
                let f = self.b.ins().fcvt_from_sint(F32, v);
                self.set_f32(d, f);
            }
            (ScalarKind::F64, Widened::Int(v)) => {
                let f = self.b.ins().fcvt_from_sint(F64, v);
                self.set_f64(d, f);
            }
            (ScalarKind::F32, Widened::Float(v)) => {
                let r = self.b.ins().fdemote(F32, v);
                if from == ScalarKind::F64 {
                    // finite input whose f32 rounding is infinite: the interpreter traps
                    let inf = self.b.ins().f32const(f32::INFINITY);
                    let ra = self.b.ins().fabs(r);
                    let rinf = self.b.ins().fcmp(FloatCC::Equal, ra, inf);
                    let vinf = self.b.ins().f64const(f64::INFINITY);
                    let va = self.b.ins().fabs(v);
                    let vfin = self.b.ins().fcmp(FloatCC::NotEqual, va, vinf);
                    let bad = self.b.ins().band(rinf, vfin);
                    self.bail_if(bad, pc);
                }
                self.set_f32(d, r);
            }
            (ScalarKind::F64, Widened::Float(v)) => self.set_f64(d, v),
            (ScalarKind::I1, _) => self.exit_at_mid(pc),
        }
    }
    /// An unconditional exit in the middle of a block (the rest of the block is unreachable but well-formed).
    pub(super) fn exit_at_mid(&mut self, pc: usize) {
        let t = self.b.ins().iconst(I8, 1);
        self.bail_if(t, pc);
    }
}
