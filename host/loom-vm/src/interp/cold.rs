//! The interpreter's cold path: instructions kept out of the hot dispatch loop (allocation, strings, lists,
//! opaque tuples, conversions, rare arithmetic), by family.

use super::*;

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(f) => return Err(f),
        }
    };
}
macro_rules! fault {
    ($f:expr) => {
        return Err($f)
    };
}

/// Instructions kept out of the hot loop: allocation, strings, lists, conversions, rare arithmetic. Keeping them
/// in a separate function keeps the interpreter loop's register pressure low.
#[inline(never)]
pub(super) fn cold(
    ins: Instr,
    p: &Inner,
    fc: &FuncCode,
    s: &mut [u64],
    r: &mut [u32],
    heap: &mut Heap,
    fuel: &mut u64,
) -> Result<(), Fault> {
    use Instr as I;
    let types = &p.types[..];
    match ins {
        I::StepCheck { .. }
        | I::Assert { .. }
        | I::Trap { .. }
        | I::ConstStr { .. }
        | I::SelR { .. } => control_and_constants(ins, p, s, r, heap),
        I::Div32 { .. }
        | I::Div64 { .. }
        | I::Rem32 { .. }
        | I::Rem64 { .. }
        | I::DivU32 { .. }
        | I::DivU64 { .. }
        | I::RemU32 { .. }
        | I::RemU64 { .. }
        | I::Neg32 { .. }
        | I::Neg64 { .. }
        | I::Abs32 { .. }
        | I::Abs64 { .. } => int_arith(ins, s),
        I::FBin { .. } | I::FUn { .. } | I::FCmp { .. } | I::Conv { .. } => float_ops(ins, s),
        I::BufNew { .. }
        | I::BufLen { .. }
        | I::LdField { .. }
        | I::StField { .. }
        | I::BufSlice { .. }
        | I::BufCopy { .. }
        | I::BufFill { .. }
        | I::BufConcat { .. } => buffer_ops(ins, s, r, heap, fuel),
        I::StrLen { .. }
        | I::StrConcat { .. }
        | I::StrEq { .. }
        | I::StrFromI64 { .. }
        | I::StrFromF64 { .. }
        | I::StrToBuf { .. }
        | I::StrFromBuf { .. }
        | I::StrParse { .. } => string_ops(ins, s, r, heap, fuel),
        I::ListNew { .. }
        | I::ListLen { .. }
        | I::ListGetS { .. }
        | I::ListGetR { .. }
        | I::ListSetS { .. }
        | I::ListSetR { .. }
        | I::ListPushS { .. }
        | I::ListPushR { .. } => list_ops(ins, s, r, heap),
        I::OpaqueNew { .. }
        | I::OpaqueGetS { .. }
        | I::OpaqueGetR { .. }
        | I::OpaqueLen { .. }
        | I::IsNull { .. }
        | I::Unwrap { .. } => opaque_and_ref_ops(ins, fc, s, r, heap, types),
        _ => Err(internal("instruction dispatched to the cold path")),
    }
}

/// `for` step checks, `assert`, `trap`, string constants and reference selects.
fn control_and_constants(
    ins: Instr,
    p: &Inner,
    s: &mut [u64],
    r: &mut [u32],
    heap: &mut Heap,
) -> Result<(), Fault> {
    use Instr as I;
    macro_rules! s {
        ($x:expr) => {
            s[$x as usize]
        };
    }
    macro_rules! i64_ {
        ($x:expr) => {
            (s[$x as usize] as i64)
        };
    }
    match ins {
        I::StepCheck { step } => {
            if i64_!(step) <= 0 {
                fault!(Fault::new(
                    TrapKind::BadStep,
                    format!("`for` step must be positive, got {}", i64_!(step))
                ));
            }
        }
        I::Assert { c, msg } => {
            if s!(c) & 1 == 0 {
                let m = tri!(heap.str(r[msg as usize])).to_string();
                fault!(Fault::new(TrapKind::SourceError, m));
            }
        }
        I::Trap { msg } => {
            let m = tri!(heap.str(r[msg as usize])).to_string();
            fault!(Fault::new(TrapKind::SourceError, m));
        }
        I::ConstStr { d, idx } => {
            let h = match heap.const_strs.get(idx as usize) {
                Some(&h) if h != 0 => h,
                Some(_) => {
                    let st = tri!(
                        p.strs
                            .get(idx as usize)
                            .cloned()
                            .ok_or_else(|| internal("string index"))
                    );
                    let h = tri!(heap.push(Obj::Str(st)));
                    heap.const_strs[idx as usize] = h;
                    h
                }
                None => fault!(internal("string index")),
            };
            r[d as usize] = h;
        }
        I::SelR { d, c, a, b } => {
            r[d as usize] = if s!(c) != 0 {
                r[a as usize]
            } else {
                r[b as usize]
            }
        }
        _ => return Err(internal("instruction dispatched to the cold path")),
    }
    Ok(())
}

/// Integer division and remainder, negation and absolute value: the checked forms that can trap.
fn int_arith(ins: Instr, s: &mut [u64]) -> Result<(), Fault> {
    use Instr as I;
    macro_rules! s {
        ($x:expr) => {
            s[$x as usize]
        };
    }
    macro_rules! i32_ {
        ($x:expr) => {
            (s[$x as usize] as i32)
        };
    }
    macro_rules! i64_ {
        ($x:expr) => {
            (s[$x as usize] as i64)
        };
    }
    macro_rules! w32 {
        ($d:expr, $v:expr) => {
            s[$d as usize] = ($v) as u32 as u64
        };
    }
    macro_rules! w64 {
        ($d:expr, $v:expr) => {
            s[$d as usize] = ($v) as u64
        };
    }
    macro_rules! chk32 {
        ($d:expr, $v:expr, $what:expr) => {
            match $v {
                Some(v) => w32!($d, v),
                None => fault!(ovf($what)),
            }
        };
    }
    macro_rules! chk64 {
        ($d:expr, $v:expr, $what:expr) => {
            match $v {
                Some(v) => w64!($d, v),
                None => fault!(ovf($what)),
            }
        };
    }
    match ins {
        I::Div32 { d, a, b } => {
            if i32_!(b) == 0 {
                fault!(div0("i32 div"));
            }
            chk32!(d, i32_!(a).checked_div(i32_!(b)), "i32 div")
        }
        I::Div64 { d, a, b } => {
            if i64_!(b) == 0 {
                fault!(div0("i64 div"));
            }
            chk64!(d, i64_!(a).checked_div(i64_!(b)), "i64 div")
        }
        I::Rem32 { d, a, b } => {
            if i32_!(b) == 0 {
                fault!(div0("i32 rem"));
            }
            chk32!(d, i32_!(a).checked_rem(i32_!(b)), "i32 rem")
        }
        I::Rem64 { d, a, b } => {
            if i64_!(b) == 0 {
                fault!(div0("i64 rem"));
            }
            chk64!(d, i64_!(a).checked_rem(i64_!(b)), "i64 rem")
        }
        I::DivU32 { d, a, b } => match (s!(a) as u32).checked_div(s!(b) as u32) {
            Some(v) => w32!(d, v),
            None => fault!(div0("i32 div.u")),
        },
        I::DivU64 { d, a, b } => match s!(a).checked_div(s!(b)) {
            Some(v) => w64!(d, v),
            None => fault!(div0("i64 div.u")),
        },
        I::RemU32 { d, a, b } => match (s!(a) as u32).checked_rem(s!(b) as u32) {
            Some(v) => w32!(d, v),
            None => fault!(div0("i32 rem.u")),
        },
        I::RemU64 { d, a, b } => match s!(a).checked_rem(s!(b)) {
            Some(v) => w64!(d, v),
            None => fault!(div0("i64 rem.u")),
        },
        I::Neg32 { d, a } => chk32!(d, i32_!(a).checked_neg(), "i32 neg"),
        I::Neg64 { d, a } => chk64!(d, i64_!(a).checked_neg(), "i64 neg"),
        I::Abs32 { d, a } => chk32!(d, i32_!(a).checked_abs(), "i32 abs"),
        I::Abs64 { d, a } => chk64!(d, i64_!(a).checked_abs(), "i64 abs"),
        _ => return Err(internal("instruction dispatched to the cold path")),
    }
    Ok(())
}

/// The rare float operations (`div`/`rem`/`min`/`max`, unary functions), float compares and conversions.
fn float_ops(ins: Instr, s: &mut [u64]) -> Result<(), Fault> {
    use Instr as I;
    macro_rules! s {
        ($x:expr) => {
            s[$x as usize]
        };
    }
    macro_rules! f32_ {
        ($x:expr) => {
            f32::from_bits(s[$x as usize] as u32)
        };
    }
    macro_rules! f64_ {
        ($x:expr) => {
            f64::from_bits(s[$x as usize])
        };
    }
    match ins {
        I::FBin { d, a, b, op, wide } => {
            let (x, y) = if wide {
                (f64_!(a), f64_!(b))
            } else {
                (f32_!(a) as f64, f32_!(b) as f64)
            };
            let v = match op {
                FloatBinary::Div => x / y,
                FloatBinary::Rem => x % y,
                FloatBinary::Min => fmin(x, y),
                FloatBinary::Max => fmax(x, y),
            };
            s[d as usize] = if wide {
                v.to_bits()
            } else {
                (v as f32).to_bits() as u64
            };
        }
        I::FUn { d, a, op, wide } => {
            let x = if wide { f64_!(a) } else { f32_!(a) as f64 };
            let v = match op {
                FloatUnary::Neg => -x,
                FloatUnary::Abs => x.abs(),
                FloatUnary::Sqrt => x.sqrt(),
                FloatUnary::Floor => x.floor(),
                FloatUnary::Ceil => x.ceil(),
                FloatUnary::Exp => x.exp(),
                FloatUnary::Log => x.ln(),
            };
            s[d as usize] = if wide {
                v.to_bits()
            } else {
                (v as f32).to_bits() as u64
            };
        }
        I::FCmp { d, a, b, op, wide } => {
            let (x, y) = if wide {
                (f64_!(a), f64_!(b))
            } else {
                (f32_!(a) as f64, f32_!(b) as f64)
            };
            let v = match op {
                FloatCmp::Eq => x == y,
                FloatCmp::Ne => x != y,
                FloatCmp::Lt => x < y,
                FloatCmp::Le => x <= y,
                FloatCmp::Gt => x > y,
                FloatCmp::Ge => x >= y,
            };
            s[d as usize] = v as u64;
        }
        I::Conv { d, a, op } => s[d as usize] = tri!(conv(op, s!(a))),
        _ => return Err(internal("instruction dispatched to the cold path")),
    }
    Ok(())
}

/// Buffer allocation, length, record fields, slices, copies, fills and concatenation.
/// Buffer operations; the bulk ones charge [`bulk_fuel`] for the bytes they touch before touching them.
fn buffer_ops(
    ins: Instr,
    s: &mut [u64],
    r: &mut [u32],
    heap: &mut Heap,
    fuel: &mut u64,
) -> Result<(), Fault> {
    use Instr as I;
    macro_rules! s {
        ($x:expr) => {
            s[$x as usize]
        };
    }
    macro_rules! i64_ {
        ($x:expr) => {
            (s[$x as usize] as i64)
        };
    }
    match ins {
        I::BufNew { d, len } => {
            let n = i64_!(len);
            if n < 0 {
                fault!(Fault::new(
                    TrapKind::OutOfBounds,
                    format!("buffer.new of negative length {n}")
                ));
            }
            let h = tri!(heap.alloc_zeroed_buf(n as u64, Some(fuel)));
            r[d as usize] = h;
        }
        I::BufLen { d, b } => s[d as usize] = tri!(heap.buf(r[b as usize])).len() as u64,
        I::LdField {
            d,
            b,
            idx,
            size,
            off,
            kind,
        } => {
            let o = match i64_!(idx)
                .checked_mul(size as i64)
                .and_then(|x| x.checked_add(off as i64))
            {
                Some(o) => o,
                None => fault!(ovf("record field offset")),
            };
            let bytes = tri!(heap.buf(r[b as usize]));
            let v = match kind {
                ScalarKind::I1 => get::<1>(bytes, o).map(|a| (a[0] != 0) as u64),
                ScalarKind::I32 | ScalarKind::F32 => {
                    get::<4>(bytes, o).map(|a| u32::from_le_bytes(a) as u64)
                }
                ScalarKind::I64 | ScalarKind::F64 => get::<8>(bytes, o).map(u64::from_le_bytes),
            };
            match v {
                Some(v) => s[d as usize] = v,
                None => fault!(oob(
                    "buffer.load.field",
                    o,
                    if kind == ScalarKind::I1 {
                        1
                    } else if matches!(kind, ScalarKind::I32 | ScalarKind::F32) {
                        4
                    } else {
                        8
                    },
                    bytes.len()
                )),
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
            let o = match i64_!(idx)
                .checked_mul(size as i64)
                .and_then(|x| x.checked_add(off as i64))
            {
                Some(o) => o,
                None => fault!(ovf("record field offset")),
            };
            let val = s!(v);
            let bytes = tri!(heap.buf_mut(r[b as usize]));
            let (ok, n) = match kind {
                ScalarKind::I1 => (put::<1>(bytes, o, [val as u8]), 1),
                ScalarKind::I32 | ScalarKind::F32 => {
                    (put::<4>(bytes, o, (val as u32).to_le_bytes()), 4)
                }
                ScalarKind::I64 | ScalarKind::F64 => (put::<8>(bytes, o, val.to_le_bytes()), 8),
            };
            if !ok {
                fault!(oob("buffer.store.field", o, n, bytes.len()));
            }
        }
        I::BufSlice { d, b, off, len } => {
            let bytes = tri!(heap.buf(r[b as usize]));
            let rg = tri!(range("buffer.slice", s!(off), s!(len), bytes.len()));
            let n = rg.len() as u64;
            tri!(bulk_fuel(fuel, n));
            tri!(heap.charge(n));
            let v = tri!(heap.buf(r[b as usize]))[rg].to_vec();
            r[d as usize] = tri!(heap.push(Obj::Buf(Buf::Owned(v))));
        }
        I::BufCopy {
            dst,
            doff,
            src,
            soff,
            len,
        } => {
            let sb = tri!(heap.buf(r[src as usize]));
            let srg = tri!(range("buffer.copy source", s!(soff), s!(len), sb.len()));
            let db_len = tri!(heap.buf(r[dst as usize])).len();
            let drg = tri!(range("buffer.copy destination", s!(doff), s!(len), db_len));
            tri!(bulk_fuel(fuel, drg.len() as u64));
            if r[src as usize] == r[dst as usize] {
                let db = tri!(heap.buf_mut(r[dst as usize]));
                db.copy_within(srg, drg.start);
            } else {
                // Copy out of the source first: the heap cannot lend two buffers at once.
                let tmp: Vec<u8> = sb[srg].to_vec();
                let db = tri!(heap.buf_mut(r[dst as usize]));
                db[drg].copy_from_slice(&tmp);
            }
        }
        I::BufFill { b, off, len, byte } => {
            let x = s!(byte) as u8;
            let (o, l) = (s!(off), s!(len));
            let bytes = tri!(heap.buf_mut(r[b as usize]));
            let rg = tri!(range("buffer.fill", o, l, bytes.len()));
            tri!(bulk_fuel(fuel, rg.len() as u64));
            bytes[rg].fill(x);
        }
        I::BufConcat { d, a, b } => {
            let (x, y) = (
                tri!(heap.buf(r[a as usize])).len(),
                tri!(heap.buf(r[b as usize])).len(),
            );
            tri!(bulk_fuel(fuel, (x + y) as u64));
            tri!(heap.charge((x + y) as u64));
            let mut v = tri!(crate::heap::with_capacity(x + y));
            v.extend_from_slice(tri!(heap.buf(r[a as usize])));
            v.extend_from_slice(tri!(heap.buf(r[b as usize])));
            r[d as usize] = tri!(heap.push(Obj::Buf(Buf::Owned(v))));
        }
        _ => return Err(internal("instruction dispatched to the cold path")),
    }
    Ok(())
}

/// String operations.
/// String operations; those that build or convert strings charge [`bulk_fuel`] for their bytes.
fn string_ops(
    ins: Instr,
    s: &mut [u64],
    r: &mut [u32],
    heap: &mut Heap,
    fuel: &mut u64,
) -> Result<(), Fault> {
    use Instr as I;
    macro_rules! s {
        ($x:expr) => {
            s[$x as usize]
        };
    }
    macro_rules! i64_ {
        ($x:expr) => {
            (s[$x as usize] as i64)
        };
    }
    macro_rules! f64_ {
        ($x:expr) => {
            f64::from_bits(s[$x as usize])
        };
    }
    macro_rules! w64 {
        ($d:expr, $v:expr) => {
            s[$d as usize] = ($v) as u64
        };
    }
    match ins {
        I::StrLen { d, a } => s[d as usize] = tri!(heap.str(r[a as usize])).len() as u64,
        I::StrConcat { d, a, b } => {
            let (x, y) = (
                tri!(heap.str(r[a as usize])).clone(),
                tri!(heap.str(r[b as usize])).clone(),
            );
            tri!(bulk_fuel(fuel, (x.len() + y.len()) as u64));
            tri!(heap.charge((x.len() + y.len()) as u64));
            let st: Arc<str> = Arc::from(format!("{x}{y}"));
            r[d as usize] = tri!(heap.push(Obj::Str(st)));
        }
        I::StrEq { d, a, b } => {
            let v = tri!(heap.str(r[a as usize])) == tri!(heap.str(r[b as usize]));
            s[d as usize] = v as u64;
        }
        I::StrFromI64 { d, a } => {
            tri!(heap.charge(20));
            r[d as usize] = tri!(heap.push(Obj::Str(Arc::from(i64_!(a).to_string()))));
        }
        I::StrFromF64 { d, a } => {
            let t = f64_!(a).to_string();
            tri!(heap.charge(t.len() as u64));
            r[d as usize] = tri!(heap.push(Obj::Str(Arc::from(t))));
        }
        I::StrToBuf { d, a } => {
            let st = tri!(heap.str(r[a as usize])).clone();
            tri!(bulk_fuel(fuel, st.len() as u64));
            tri!(heap.charge(st.len() as u64));
            r[d as usize] = tri!(heap.push(Obj::Buf(Buf::Owned(st.as_bytes().to_vec()))));
        }
        I::StrFromBuf { d, b, off, len } => {
            let bytes = tri!(heap.buf(r[b as usize]));
            let rg = tri!(range("str.from_buffer", s!(off), s!(len), bytes.len()));
            tri!(bulk_fuel(fuel, rg.len() as u64));
            let st: Arc<str> = match std::str::from_utf8(&bytes[rg.clone()]) {
                Ok(t) => Arc::from(t),
                Err(e) => fault!(Fault::new(
                    TrapKind::InvalidUtf8,
                    format!(
                        "str.from_buffer: invalid UTF-8 at byte {} of the range at offset {}",
                        e.valid_up_to(),
                        rg.start
                    )
                )),
            };
            tri!(heap.charge(st.len() as u64));
            r[d as usize] = tri!(heap.push(Obj::Str(st)));
        }
        I::StrParse { d, a } => {
            let st = tri!(heap.str(r[a as usize]));
            match st.parse::<i64>() {
                Ok(v) => w64!(d, v),
                Err(_) => {
                    let shown: String = st.chars().take(40).collect();
                    fault!(Fault::new(
                        TrapKind::BadConversion,
                        format!("str.parse_i64: {shown:?} is not an i64")
                    ))
                }
            }
        }
        _ => return Err(internal("instruction dispatched to the cold path")),
    }
    Ok(())
}

/// List operations.
fn list_ops(ins: Instr, s: &mut [u64], r: &mut [u32], heap: &mut Heap) -> Result<(), Fault> {
    use Instr as I;
    macro_rules! s {
        ($x:expr) => {
            s[$x as usize]
        };
    }
    macro_rules! i64_ {
        ($x:expr) => {
            (s[$x as usize] as i64)
        };
    }
    match ins {
        I::ListNew { d, cap } => {
            let want = i64_!(cap).max(0) as u64;
            // The capacity is a hint: clamp it to what the cap still allows.
            let room = heap
                .cap
                .saturating_sub(heap.used)
                .saturating_sub(OBJ_OVERHEAD)
                / 8;
            let n = want.min(room).min(1 << 24);
            tri!(heap.charge(n * 8));
            let items = tri!(crate::heap::with_capacity(n as usize));
            r[d as usize] = tri!(heap.push(Obj::List(items)));
        }
        I::ListLen { d, l } => s[d as usize] = tri!(heap.list(r[l as usize])).len() as u64,
        I::ListGetS { d, l, i } | I::ListGetR { d, l, i } => {
            let list = tri!(heap.list(r[l as usize]));
            let ix = i64_!(i);
            let Some(&v) = usize::try_from(ix).ok().and_then(|x| list.get(x)) else {
                fault!(Fault::new(
                    TrapKind::OutOfBounds,
                    format!(
                        "list.get: index {ix} out of bounds of a list of length {}",
                        list.len()
                    )
                ));
            };
            if matches!(ins, I::ListGetS { .. }) {
                s[d as usize] = v
            } else {
                r[d as usize] = v as u32
            }
        }
        I::ListSetS { l, i, v } | I::ListSetR { l, i, v } => {
            let val = if matches!(ins, I::ListSetS { .. }) {
                s!(v)
            } else {
                r[v as usize] as u64
            };
            let ix = i64_!(i);
            let list = tri!(heap.list_mut(r[l as usize]));
            let n = list.len();
            match usize::try_from(ix).ok().and_then(|x| list.get_mut(x)) {
                Some(slot) => *slot = val,
                None => fault!(Fault::new(
                    TrapKind::OutOfBounds,
                    format!("list.set: index {ix} out of bounds of a list of length {n}")
                )),
            }
        }
        I::ListPushS { l, v } | I::ListPushR { l, v } => {
            let val = if matches!(ins, I::ListPushS { .. }) {
                s!(v)
            } else {
                r[v as usize] as u64
            };
            let h = r[l as usize];
            let (len, cap) = {
                let list = tri!(heap.list(h));
                (list.len(), list.capacity())
            };
            if len == cap {
                let new_cap = (cap * 2).max(4);
                tri!(heap.charge(((new_cap - cap) * 8) as u64));
                tri!(heap.list_mut(h)).reserve_exact(new_cap - len);
            }
            tri!(heap.list_mut(h)).push(val);
        }
        _ => return Err(internal("instruction dispatched to the cold path")),
    }
    Ok(())
}

/// Opaque tuples, `ref.is_null` and `ref.unwrap`.
fn opaque_and_ref_ops(
    ins: Instr,
    fc: &FuncCode,
    s: &mut [u64],
    r: &mut [u32],
    heap: &mut Heap,
    types: &[Type],
) -> Result<(), Fault> {
    use Instr as I;
    macro_rules! i64_ {
        ($x:expr) => {
            (s[$x as usize] as i64)
        };
    }
    match ins {
        I::OpaqueNew { d, site } => {
            let Some(items) = fc.opaques.get(site as usize) else {
                fault!(internal("opaque site"))
            };
            tri!(heap.charge(items.len() as u64 * 16));
            let vals: Box<[(u32, u64)]> = items
                .iter()
                .map(|(t, sl)| {
                    (
                        *t,
                        match *sl {
                            Slot::S(x) => s[x as usize],
                            Slot::R(x) => r[x as usize] as u64,
                        },
                    )
                })
                .collect();
            r[d as usize] = tri!(heap.push(Obj::Opaque(vals)));
        }
        I::OpaqueGetS { d, o, i, ty } | I::OpaqueGetR { d, o, i, ty } => {
            let v = tri!(opaque_get(heap, r[o as usize], i64_!(i), ty, types));
            if matches!(ins, I::OpaqueGetS { .. }) {
                s[d as usize] = v
            } else {
                r[d as usize] = v as u32
            }
        }
        I::OpaqueLen { d, o } => {
            s[d as usize] = match heap.objs.get(r[o as usize] as usize) {
                Some(Obj::Opaque(v)) => v.len() as u64,
                Some(Obj::HostOpaque(v)) => v.len() as u64,
                _ => fault!(internal("opaque.len of a non-opaque")),
            }
        }
        I::IsNull { d, a } => s[d as usize] = (r[a as usize] == 0) as u64,
        I::Unwrap { d, a } => {
            if r[a as usize] == 0 {
                fault!(Fault::new(TrapKind::NullReference, "ref.unwrap of null"));
            }
            r[d as usize] = r[a as usize];
        }
        _ => return Err(internal("instruction dispatched to the cold path")),
    }
    Ok(())
}
