//! The `.loombc` container: the typed, structured IR of one [`Module`], encoded canonically.
//!
//! Like WebAssembly, `.loombc` keeps structured control flow: it stores the same SSA regions the canonical text
//! shows, and the VM derives its register code at load time, after [`verify_module`](crate::verify::verify_module).
//! A `.loombc` file is untrusted input (packages are uploaded over HTTP): [`decode`] enforces hard limits, never
//! allocates from an unchecked count, recurses at most [`MAX_NESTING`] regions deep and never panics.
//!
//! # Layout
//!
//! ```text
//! file    := magic major minor section* digest
//! magic   := 00 6c 6f 6f 6d 62 63 0a          "\0loombc\n" (the \n catches text-mode line-ending damage)
//! major   := u16 LE = 1                        a decoder accepts its own major and any minor <= its own
//! minor   := u16 LE = 1                        1 added section 9 (device items)
//! section := id:u8 len:uleb payload:[len bytes]
//! digest  := 32 bytes: SHA-256 of every byte before it
//! ```
//!
//! Sections 1..=9 each appear exactly once, in ascending id order, even when empty; a file of minor version 0
//! has sections 1..=8 only (it decodes with no device items, and its canonical form is checked without section
//! 9). Custom sections
//! (`id 0`, payload `name_len:uleb name:utf8 bytes...`) may appear anywhere between them; decoders skip them.
//!
//! | id | section | payload |
//! |----|---------|---------|
//! | 1 | strings | `n:uleb (len:uleb utf8)*n`, interned in first-use order (the order the sections below are written) |
//! | 2 | types   | `n:uleb type*n`, interned in first-use order, a list's element before the list |
//! | 3 | module  | `name:str` |
//! | 4 | decls   | `n:uleb (symbol:str tparams sig import:opt(str))*n` |
//! | 5 | records | `n:uleb (name:str exported:flag fields:list(name:str type))*n` |
//! | 6 | consts  | `n:uleb (name:str exported:flag value:imm)*n` |
//! | 7 | funcs   | `n:uleb func*n` |
//! | 8 | debug   | `file:str`, then a `loc` per decl, record and const, then per function: its `loc`, a `str` name per value, and a `loc` per op in pre-order (an op, then the ops of its regions) |
//! | 9 | device  | `n:uleb (kind:u8 name:str exported:flag tparams text:str loc)*n`: kernels (`0`), kfuncs (`1`) and stages (`2`) as canonical source text (since minor 1) |
//!
//! Building blocks (`uleb`/`sleb` are (un)signed LEB128, always minimal; `str` and `type` are `uleb` indices into
//! the string and type tables; `list(x)` is `n:uleb x*n`; `opt(x)` is a byte `0`, or `1` then `x`; `flag` is a byte
//! `0` or `1`):
//!
//! ```text
//! type     := 0 i1 | 1 i32 | 2 i64 | 3 f32 | 4 f64 | 5 str | 6 buffer | 7 elem:type (list<elem>, elem < own index)
//!           | 8 name:str (!name) | 9 name:str (?!name)
//! sig      := params:list(type) results:list(type)
//! tparams  := list(name:str kind default:opt(tvalue))
//! kind     := 0 i64 | 1 bool | 2 str | 3 dtype | 4 shape | 5 sig (func)
//! tvalue   := 0 sleb (i64) | 1 (false) | 2 (true) | 3 str | 4 str (dtype) | 5 list(sleb) (shape) | 6 callee (func)
//! targ     := tvalue | 7 uleb (forward the caller's template parameter)
//! callee   := 0 uleb (function) | 1 uleb (decl) | 2 uleb (template parameter)
//! imm      := 0x10 (false) | 0x11 (true) | 0x12 sleb (i32) | 0x13 sleb (i64) | 0x14 f32 bits:4 LE | 0x15 f64 bits:8 LE
//!           | 0x16 str | 0x17 type (null of that type)
//! operand  := 0x00 value:uleb | 0x01 tparam:uleb | 0x02 record:uleb | 0x03 record:uleb field:uleb | imm
//! func     := name:str exported:flag tparams values:list(type) params:list(value:uleb) results:list(type) body:region
//! region   := list(op)
//! op       := tag:u8 results:list(value:uleb) payload
//!   0 simple     opcode:uleb (index in Opcode::ALL) operands:list(operand) annotation:opt(type)
//!   1 call       callee targs:list(name:str targ) args:list(operand)
//!   2 if         cond:operand then:region else:region
//!   3 for        lo:operand hi:operand step:operand iv:uleb iters:list(uleb) inits:list(operand) body:region
//!   4 while      iters:list(uleb) inits:list(operand) cond:region body:region
//!   5 yield      list(operand)      6 condition operand      7 return list(operand)
//! loc      := line:uleb col:uleb
//! ```
//!
//! Floats are stored as their bits; non-finite immediates are rejected (the text form has no spelling for them).
//!
//! # Worked example
//!
//! `module @m { func @f(%a: i64) -> i64 { return %a } }` compiled from `m.loom`, with the function at 1:12 and the
//! `return` at 1:38, encodes to 105 bytes (the test `documented_example` checks this listing):
//!
//! ```text
//! 00 6c 6f 6f 6d 62 63 0a  01 00  01 00       magic, version 1.1
//! 01 0e  04  01 6d  01 66  06 6d 2e 6c 6f 6f 6d  01 61
//!                                             strings: 4 entries, in first-use order: "m" "f" "m.loom" "a"
//! 02 02  01  02                               types: 1 entry, i64
//! 03 01  00                                   module: name = string 0 ("m")
//! 04 01  00                                   decls: none
//! 05 01  00                                   records: none
//! 06 01  00                                   consts: none
//! 07 10  01                                   funcs: 1
//!        01 00 00                             name "f", not exported, no template parameters
//!        01 00  01 00  01 00                  values [i64], params [%0], results [i64]
//!        01  07 00 01 00 00                   body: 1 op: return, no results, 1 operand: value 0
//! 08 06  02  01 0c  03  01 26                 debug: file "m.loom", function at 1:12, value 0 named "a",
//!                                             the return at 1:38
//! 09 01  00                                   device: none
//! (32 bytes)                                  SHA-256 of the 73 bytes above
//! ```
//!
//! # Canonical form
//!
//! There is exactly one encoding per [`Module`]: minimal LEB128, fixed section order, tables in first-use order
//! with no unused or duplicate entries, no trailing bytes. [`decode`] enforces this by re-encoding what it read and
//! comparing, so `encode(&decode(b)?) == b` for every accepted `b` that has no custom section (custom sections are
//! the one thing a decoded module does not keep). The encoding is therefore usable as a cache key.
//!
//! [`encode`] writes any module as given; a module that breaks the limits below (or has a non-finite float) encodes
//! to bytes that [`decode`] rejects. Verified modules stay within the limits that the verifier also checks
//! (nesting, type depth, finite floats).

use crate::{
    Callee, Const, Decl, DeviceItem, DeviceKind, Function, Imm, Loc, Module, Op, OpKind, Opcode,
    Operand, Record, Region, Signature, TArg, TParam, TParamKind, TValue, Type, ValueDef, ValueId,
};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::mem::size_of;
use thiserror::Error;

/// The first 8 bytes of every `.loombc` file.
pub const MAGIC: [u8; 8] = *b"\0loombc\n";
/// The format's major version: a different major is unreadable.
pub const VERSION_MAJOR: u16 = 1;
/// The format's minor version: files with a minor up to this one are readable.
pub const VERSION_MINOR: u16 = 1;
/// Length of the trailing SHA-256 digest.
pub const DIGEST_LEN: usize = 32;

/// Largest accepted file.
pub const MAX_FILE_SIZE: usize = 64 << 20;
/// Largest string (names, string immediates, the file name).
pub const MAX_STRING_LEN: usize = 1 << 20;
/// Most entries in the string table.
pub const MAX_STRINGS: usize = 1 << 20;
/// Most entries in the type table.
pub const MAX_TYPES: usize = 1 << 16;
/// Deepest type (`list<list<...>>`), counting the outermost.
pub const MAX_TYPE_DEPTH: usize = 32;
/// Most decls, records, consts, functions or device items (each).
pub const MAX_ITEMS: usize = 1 << 16;
/// Most values in one function.
pub const MAX_VALUES_PER_FUNCTION: usize = 1 << 20;
/// Most ops in one function, nested regions included.
pub const MAX_OPS_PER_FUNCTION: usize = 1 << 20;
/// Most entries in any other list: operands, results, params, iters, targs, fields, tparams, shape dims.
pub const MAX_LIST_LEN: usize = 1 << 16;
/// Deepest region nesting: a function body is depth 0, the regions of an op in it depth 1, and so on.
pub const MAX_NESTING: usize = 256;
/// Most memory a decoded module may take (approximate: struct sizes plus string and type payloads). Small
/// encodings expand (an op is a few bytes on disk and a few hundred in memory; a string index clones the string),
/// so this bounds the expansion, not just the file size.
pub const MAX_DECODED_BYTES: usize = 256 << 20;

const HEADER_LEN: usize = MAGIC.len() + 4;

const SEC_CUSTOM: u8 = 0;
const SECTION_NAMES: [&str; 10] = [
    "custom", "strings", "types", "module", "decls", "records", "consts", "funcs", "debug",
    "device",
];
const LAST_SECTION: u8 = 9;
/// The last section of a minor-version-0 file.
const LAST_SECTION_V0: u8 = 8;

// device item kinds
const DEV_KERNEL: u8 = 0;
const DEV_KFUNC: u8 = 1;
const DEV_STAGE: u8 = 2;

// type tags
const TY_I1: u8 = 0;
const TY_I32: u8 = 1;
const TY_I64: u8 = 2;
const TY_F32: u8 = 3;
const TY_F64: u8 = 4;
const TY_STR: u8 = 5;
const TY_BUFFER: u8 = 6;
const TY_LIST: u8 = 7;
const TY_REF: u8 = 8;
const TY_NREF: u8 = 9;

// template parameter kinds
const KIND_I64: u8 = 0;
const KIND_BOOL: u8 = 1;
const KIND_STR: u8 = 2;
const KIND_DTYPE: u8 = 3;
const KIND_SHAPE: u8 = 4;
const KIND_FUNC: u8 = 5;

// template values / args
const TV_I64: u8 = 0;
const TV_FALSE: u8 = 1;
const TV_TRUE: u8 = 2;
const TV_STR: u8 = 3;
const TV_DTYPE: u8 = 4;
const TV_SHAPE: u8 = 5;
const TV_FUNC: u8 = 6;
const TARG_FORWARD: u8 = 7;

// callees
const CALLEE_FUNC: u8 = 0;
const CALLEE_DECL: u8 = 1;
const CALLEE_TPARAM: u8 = 2;

// operands and immediates (one tag space, so an immediate operand costs no extra byte)
const OPND_VALUE: u8 = 0x00;
const OPND_TPARAM: u8 = 0x01;
const OPND_RECORD: u8 = 0x02;
const OPND_FIELD: u8 = 0x03;
const IMM_FALSE: u8 = 0x10;
const IMM_TRUE: u8 = 0x11;
const IMM_I32: u8 = 0x12;
const IMM_I64: u8 = 0x13;
const IMM_F32: u8 = 0x14;
const IMM_F64: u8 = 0x15;
const IMM_STR: u8 = 0x16;
const IMM_NULL: u8 = 0x17;

// op tags
const OP_SIMPLE: u8 = 0;
const OP_CALL: u8 = 1;
const OP_IF: u8 = 2;
const OP_FOR: u8 = 3;
const OP_WHILE: u8 = 4;
const OP_YIELD: u8 = 5;
const OP_CONDITION: u8 = 6;
const OP_RETURN: u8 = 7;

// ---------------------------------------------------------------------------------------------------------------
// Encoder

fn uleb(out: &mut Vec<u8>, v: u64) {
    crate::leb::write_uleb(out, v);
}

fn sleb(out: &mut Vec<u8>, v: i64) {
    crate::leb::write_sleb(out, v);
}

fn len(out: &mut Vec<u8>, n: usize) {
    uleb(out, n as u64);
}

/// Interning tables, filled in the order the sections are written (that order is the canonical "first use").
#[derive(Default)]
struct Enc<'m> {
    strings: Vec<&'m str>,
    string_ix: HashMap<&'m str, u32>,
    /// The type table's entries, already encoded.
    types: Vec<u8>,
    ntypes: u32,
    type_ix: HashMap<&'m Type, u32>,
}

impl<'m> Enc<'m> {
    fn str(&mut self, out: &mut Vec<u8>, s: &'m str) {
        let i = match self.string_ix.get(s) {
            Some(&i) => i,
            None => {
                let i = self.strings.len() as u32;
                self.strings.push(s);
                self.string_ix.insert(s, i);
                i
            }
        };
        uleb(out, i.into());
    }

    fn type_index(&mut self, t: &'m Type) -> u32 {
        if let Some(&i) = self.type_ix.get(t) {
            return i;
        }
        let mut entry = Vec::new();
        match t {
            Type::I1 => entry.push(TY_I1),
            Type::I32 => entry.push(TY_I32),
            Type::I64 => entry.push(TY_I64),
            Type::F32 => entry.push(TY_F32),
            Type::F64 => entry.push(TY_F64),
            Type::Str => entry.push(TY_STR),
            Type::Buffer => entry.push(TY_BUFFER),
            Type::List(elem) => {
                // why: the element goes first, so a list entry only refers backwards and decoding needs no recursion
                let e = self.type_index(elem);
                entry.push(TY_LIST);
                uleb(&mut entry, e.into());
            }
            Type::Ref { name, nullable } => {
                entry.push(if *nullable { TY_NREF } else { TY_REF });
                self.str(&mut entry, name);
            }
        }
        self.types.extend_from_slice(&entry);
        let i = self.ntypes;
        self.ntypes += 1;
        self.type_ix.insert(t, i);
        i
    }

    fn ty(&mut self, out: &mut Vec<u8>, t: &'m Type) {
        let i = self.type_index(t);
        uleb(out, i.into());
    }

    fn types(&mut self, out: &mut Vec<u8>, ts: &'m [Type]) {
        len(out, ts.len());
        for t in ts {
            self.ty(out, t);
        }
    }

    fn sig(&mut self, out: &mut Vec<u8>, s: &'m Signature) {
        self.types(out, &s.params);
        self.types(out, &s.results);
    }

    fn tparams(&mut self, out: &mut Vec<u8>, tps: &'m [TParam]) {
        len(out, tps.len());
        for tp in tps {
            self.str(out, &tp.name);
            match &tp.kind {
                TParamKind::I64 => out.push(KIND_I64),
                TParamKind::Bool => out.push(KIND_BOOL),
                TParamKind::Str => out.push(KIND_STR),
                TParamKind::DType => out.push(KIND_DTYPE),
                TParamKind::Shape => out.push(KIND_SHAPE),
                TParamKind::Func(sig) => {
                    out.push(KIND_FUNC);
                    self.sig(out, sig);
                }
            }
            match &tp.default {
                None => out.push(0),
                Some(v) => {
                    out.push(1);
                    self.tvalue(out, v);
                }
            }
        }
    }

    fn tvalue(&mut self, out: &mut Vec<u8>, v: &'m TValue) {
        match v {
            TValue::I64(i) => {
                out.push(TV_I64);
                sleb(out, *i);
            }
            TValue::Bool(b) => out.push(if *b { TV_TRUE } else { TV_FALSE }),
            TValue::Str(s) => {
                out.push(TV_STR);
                self.str(out, s);
            }
            TValue::DType(s) => {
                out.push(TV_DTYPE);
                self.str(out, s);
            }
            TValue::Shape(dims) => {
                out.push(TV_SHAPE);
                len(out, dims.len());
                for d in dims {
                    sleb(out, *d);
                }
            }
            TValue::Func(c) => {
                out.push(TV_FUNC);
                callee(out, c);
            }
        }
    }

    fn imm(&mut self, out: &mut Vec<u8>, imm: &'m Imm) {
        match imm {
            Imm::I1(b) => out.push(if *b { IMM_TRUE } else { IMM_FALSE }),
            Imm::I32(v) => {
                out.push(IMM_I32);
                sleb(out, (*v).into());
            }
            Imm::I64(v) => {
                out.push(IMM_I64);
                sleb(out, *v);
            }
            Imm::F32(v) => {
                out.push(IMM_F32);
                out.extend_from_slice(&v.to_bits().to_le_bytes());
            }
            Imm::F64(v) => {
                out.push(IMM_F64);
                out.extend_from_slice(&v.to_bits().to_le_bytes());
            }
            Imm::Str(s) => {
                out.push(IMM_STR);
                self.str(out, s);
            }
            Imm::Null(t) => {
                out.push(IMM_NULL);
                self.ty(out, t);
            }
        }
    }

    fn operand(&mut self, out: &mut Vec<u8>, o: &'m Operand) {
        match o {
            Operand::Value(v) => {
                out.push(OPND_VALUE);
                uleb(out, v.0.into());
            }
            Operand::TParam(i) => {
                out.push(OPND_TPARAM);
                uleb(out, (*i).into());
            }
            Operand::Record(r) => {
                out.push(OPND_RECORD);
                uleb(out, (*r).into());
            }
            Operand::Field(r, f) => {
                out.push(OPND_FIELD);
                uleb(out, (*r).into());
                uleb(out, (*f).into());
            }
            Operand::Imm(imm) => self.imm(out, imm),
        }
    }

    fn operands(&mut self, out: &mut Vec<u8>, os: &'m [Operand]) {
        len(out, os.len());
        for o in os {
            self.operand(out, o);
        }
    }

    fn region(&mut self, out: &mut Vec<u8>, r: &'m Region) {
        len(out, r.ops.len());
        for op in &r.ops {
            self.op(out, op);
        }
    }

    fn op(&mut self, out: &mut Vec<u8>, op: &'m Op) {
        let tag = match &op.kind {
            OpKind::Simple { .. } => OP_SIMPLE,
            OpKind::Call { .. } => OP_CALL,
            OpKind::If { .. } => OP_IF,
            OpKind::For { .. } => OP_FOR,
            OpKind::While { .. } => OP_WHILE,
            OpKind::Yield(_) => OP_YIELD,
            OpKind::Condition(_) => OP_CONDITION,
            OpKind::Return(_) => OP_RETURN,
        };
        out.push(tag);
        value_ids(out, &op.results);
        match &op.kind {
            OpKind::Simple {
                opcode,
                operands,
                annotation,
            } => {
                uleb(out, *opcode as u64);
                self.operands(out, operands);
                match annotation {
                    None => out.push(0),
                    Some(t) => {
                        out.push(1);
                        self.ty(out, t);
                    }
                }
            }
            OpKind::Call {
                callee: c,
                targs,
                args,
            } => {
                callee(out, c);
                len(out, targs.len());
                for (name, arg) in targs {
                    self.str(out, name);
                    match arg {
                        TArg::Value(v) => self.tvalue(out, v),
                        TArg::Forward(i) => {
                            out.push(TARG_FORWARD);
                            uleb(out, (*i).into());
                        }
                    }
                }
                self.operands(out, args);
            }
            OpKind::If {
                cond,
                then_region,
                else_region,
            } => {
                self.operand(out, cond);
                self.region(out, then_region);
                self.region(out, else_region);
            }
            OpKind::For {
                lo,
                hi,
                step,
                iv,
                iters,
                inits,
                body,
            } => {
                self.operand(out, lo);
                self.operand(out, hi);
                self.operand(out, step);
                uleb(out, iv.0.into());
                value_ids(out, iters);
                self.operands(out, inits);
                self.region(out, body);
            }
            OpKind::While {
                iters,
                inits,
                cond_region,
                body,
            } => {
                value_ids(out, iters);
                self.operands(out, inits);
                self.region(out, cond_region);
                self.region(out, body);
            }
            OpKind::Yield(os) | OpKind::Return(os) => self.operands(out, os),
            OpKind::Condition(o) => self.operand(out, o),
        }
    }

    fn func(&mut self, out: &mut Vec<u8>, f: &'m Function) {
        self.str(out, &f.name);
        out.push(f.exported.into());
        self.tparams(out, &f.tparams);
        len(out, f.values.len());
        for v in &f.values {
            self.ty(out, &v.ty);
        }
        value_ids(out, &f.params);
        self.types(out, &f.results);
        self.region(out, &f.body);
    }

    fn region_locs(&mut self, out: &mut Vec<u8>, r: &'m Region) {
        for op in &r.ops {
            loc(out, op.loc);
            match &op.kind {
                OpKind::If {
                    then_region,
                    else_region,
                    ..
                } => {
                    self.region_locs(out, then_region);
                    self.region_locs(out, else_region);
                }
                OpKind::For { body, .. } => self.region_locs(out, body),
                OpKind::While {
                    cond_region, body, ..
                } => {
                    self.region_locs(out, cond_region);
                    self.region_locs(out, body);
                }
                _ => {}
            }
        }
    }
}

fn callee(out: &mut Vec<u8>, c: &Callee) {
    let (tag, i) = match c {
        Callee::Func(i) => (CALLEE_FUNC, i),
        Callee::Decl(i) => (CALLEE_DECL, i),
        Callee::TParam(i) => (CALLEE_TPARAM, i),
    };
    out.push(tag);
    uleb(out, (*i).into());
}

fn value_ids(out: &mut Vec<u8>, ids: &[ValueId]) {
    len(out, ids.len());
    for v in ids {
        uleb(out, v.0.into());
    }
}

fn loc(out: &mut Vec<u8>, l: Loc) {
    uleb(out, l.line.into());
    uleb(out, l.col.into());
}

/// Everything but the digest.
fn encode_body(m: &Module) -> Vec<u8> {
    let mut e = Enc::default();
    let mut module = Vec::new();
    e.str(&mut module, &m.name);

    let mut decls = Vec::new();
    len(&mut decls, m.decls.len());
    for d in &m.decls {
        e.str(&mut decls, &d.symbol);
        e.tparams(&mut decls, &d.tparams);
        e.sig(&mut decls, &d.sig);
        match &d.import {
            None => decls.push(0),
            Some(s) => {
                decls.push(1);
                e.str(&mut decls, s);
            }
        }
    }

    let mut records = Vec::new();
    len(&mut records, m.records.len());
    for r in &m.records {
        e.str(&mut records, &r.name);
        records.push(r.exported.into());
        len(&mut records, r.fields.len());
        for (name, t) in &r.fields {
            e.str(&mut records, name);
            e.ty(&mut records, t);
        }
    }

    let mut consts = Vec::new();
    len(&mut consts, m.consts.len());
    for c in &m.consts {
        e.str(&mut consts, &c.name);
        consts.push(c.exported.into());
        e.imm(&mut consts, &c.value);
    }

    let mut funcs = Vec::new();
    len(&mut funcs, m.funcs.len());
    for f in &m.funcs {
        e.func(&mut funcs, f);
    }

    let mut debug = Vec::new();
    e.str(&mut debug, &m.file);
    for d in &m.decls {
        loc(&mut debug, d.loc);
    }
    for r in &m.records {
        loc(&mut debug, r.loc);
    }
    for c in &m.consts {
        loc(&mut debug, c.loc);
    }
    for f in &m.funcs {
        loc(&mut debug, f.loc);
        for v in &f.values {
            e.str(&mut debug, &v.name);
        }
        e.region_locs(&mut debug, &f.body);
    }

    // why after debug: strings are interned in the order sections are written, and section 9 came last
    let mut device = Vec::new();
    len(&mut device, m.device.len());
    for d in &m.device {
        device.push(match d.kind {
            DeviceKind::Kernel => DEV_KERNEL,
            DeviceKind::Kfunc => DEV_KFUNC,
            DeviceKind::Stage => DEV_STAGE,
        });
        e.str(&mut device, &d.name);
        device.push(d.exported.into());
        e.tparams(&mut device, &d.tparams);
        e.str(&mut device, &d.text);
        loc(&mut device, d.loc);
    }

    let mut strings = Vec::new();
    len(&mut strings, e.strings.len());
    for s in &e.strings {
        len(&mut strings, s.len());
        strings.extend_from_slice(s.as_bytes());
    }
    let mut types = Vec::new();
    uleb(&mut types, e.ntypes.into());
    types.extend_from_slice(&e.types);

    let sections = [
        strings, types, module, decls, records, consts, funcs, debug, device,
    ];
    let total: usize = sections.iter().map(|s| s.len() + 11).sum();
    let mut out = Vec::with_capacity(HEADER_LEN + total + DIGEST_LEN);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION_MAJOR.to_le_bytes());
    out.extend_from_slice(&VERSION_MINOR.to_le_bytes());
    for (i, payload) in sections.iter().enumerate() {
        out.push(i as u8 + 1);
        len(&mut out, payload.len());
        out.extend_from_slice(payload);
    }
    out
}

/// Encodes a module canonically (see the module docs). Infallible: limits are the decoder's business.
pub fn encode(m: &Module) -> Vec<u8> {
    let mut out = encode_body(m);
    let digest = Sha256::digest(&out);
    out.extend_from_slice(&digest);
    out
}

// ---------------------------------------------------------------------------------------------------------------
// Decoder

/// Why a `.loombc` file was rejected, and where. Always the file's fault (or its producer's), never a bug here.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("invalid .loombc at byte {offset}: {kind}")]
pub struct DecodeError {
    /// Byte offset in the file where the problem was found.
    pub offset: usize,
    pub kind: DecodeErrorKind,
}

#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum DecodeErrorKind {
    #[error("the file is {len} bytes, over the limit of {MAX_FILE_SIZE}")]
    TooLarge { len: usize },
    #[error("bad magic: not a .loombc file")]
    BadMagic,
    #[error(
        "unsupported format version {major}.{minor} (this decoder reads {VERSION_MAJOR}.0 to {VERSION_MAJOR}.{VERSION_MINOR})"
    )]
    UnsupportedVersion { major: u16, minor: u16 },
    #[error("unexpected end of input while reading {what}")]
    Truncated { what: &'static str },
    #[error("digest mismatch: the file is corrupt or was modified")]
    DigestMismatch,
    #[error("non-minimal LEB128 encoding of {what}")]
    NonMinimalLeb { what: &'static str },
    #[error("{what} is out of range")]
    Overflow { what: &'static str },
    #[error("unknown section id {id}")]
    UnknownSection { id: u8 },
    #[error("section {name} appears twice or out of order")]
    SectionOrder { name: &'static str },
    #[error("missing section {name}")]
    MissingSection { name: &'static str },
    #[error("{extra} unread bytes at the end of section {name}")]
    SectionTrailing { name: &'static str, extra: usize },
    #[error("invalid UTF-8 in {what}")]
    InvalidUtf8 { what: &'static str },
    #[error("unknown {what} tag {tag:#04x}")]
    UnknownTag { what: &'static str, tag: u8 },
    #[error("unknown opcode {code}")]
    UnknownOpcode { code: u64 },
    #[error("{what} index {index} is out of range (there are {len})")]
    IndexOutOfRange {
        what: &'static str,
        index: u64,
        len: usize,
    },
    #[error("{what}: {count} is over the limit of {limit}")]
    LimitExceeded {
        what: &'static str,
        count: u64,
        limit: usize,
    },
    #[error("the decoded module would need more than {MAX_DECODED_BYTES} bytes of memory")]
    MemoryLimit,
    #[error("regions nest deeper than {MAX_NESTING}")]
    TooDeep,
    #[error("a type nests deeper than {MAX_TYPE_DEPTH}")]
    TypeTooDeep,
    #[error("non-finite float immediate (it has no text form)")]
    NonFiniteFloat,
    #[error("non-canonical encoding (the canonical encoder writes different bytes from here)")]
    NonCanonical,
}

type R<T> = Result<T, DecodeError>;

/// Per-function decoding context: the ranges that value and template-parameter indices must fall in.
#[derive(Default)]
struct FnCx {
    nvalues: usize,
    ntparams: usize,
    ops: usize,
}

/// A structured op whose regions are still being decoded.
struct OpenOp {
    /// Its regions are placeholders until filled, in order.
    kind: OpKind,
    results: Vec<ValueId>,
    filled: u8,
}

impl OpenOp {
    /// Stores the next region; true when the op is complete.
    fn fill(&mut self, r: Region) -> bool {
        let slot = match (&mut self.kind, self.filled) {
            (OpKind::If { then_region, .. }, 0) => then_region,
            (OpKind::If { else_region, .. }, _) => else_region,
            (OpKind::For { body, .. }, _) => body,
            (OpKind::While { cond_region, .. }, 0) => cond_region,
            (OpKind::While { body, .. }, _) => body,
            // only structured ops are opened
            _ => return true,
        };
        *slot = r;
        self.filled += 1;
        let need = match self.kind {
            OpKind::For { .. } => 1,
            _ => 2,
        };
        self.filled >= need
    }
}

enum Started {
    Leaf(Op),
    Open(OpenOp),
}

struct Dec<'a> {
    buf: &'a [u8],
    pos: usize,
    /// End of the current section's payload.
    end: usize,
    strings: Vec<&'a str>,
    /// Decoded types with their approximate memory cost (charged on every clone).
    types: Vec<(Type, usize)>,
    budget: usize,
    ndecls: usize,
    nfuncs: usize,
    /// Field count of each record, for `@R.f` operands.
    record_fields: Vec<usize>,
    cur: FnCx,
    /// Function indices seen before the function count was known (decl template defaults): (offset, index).
    early_func_refs: Vec<(usize, u64)>,
}

impl<'a> Dec<'a> {
    fn err_at(&self, offset: usize, kind: DecodeErrorKind) -> DecodeError {
        DecodeError { offset, kind }
    }

    fn err(&self, kind: DecodeErrorKind) -> DecodeError {
        self.err_at(self.pos, kind)
    }

    fn charge(&mut self, bytes: usize) -> R<()> {
        match self.budget.checked_sub(bytes) {
            Some(left) => {
                self.budget = left;
                Ok(())
            }
            None => Err(self.err(DecodeErrorKind::MemoryLimit)),
        }
    }

    fn byte(&mut self, what: &'static str) -> R<u8> {
        if self.pos >= self.end {
            return Err(self.err(DecodeErrorKind::Truncated { what }));
        }
        let b = self.buf[self.pos];
        self.pos += 1;
        Ok(b)
    }

    fn bytes(&mut self, n: usize, what: &'static str) -> R<&'a [u8]> {
        if n > self.end - self.pos {
            return Err(self.err(DecodeErrorKind::Truncated { what }));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn uleb(&mut self, what: &'static str) -> R<u64> {
        let start = self.pos;
        crate::leb::read_uleb(self.buf, &mut self.pos, self.end)
            .map_err(|e| self.leb_err(start, e, what))
    }

    fn sleb(&mut self, what: &'static str) -> R<i64> {
        let start = self.pos;
        crate::leb::read_sleb(self.buf, &mut self.pos, self.end)
            .map_err(|e| self.leb_err(start, e, what))
    }

    fn leb_err(&self, start: usize, e: crate::leb::LebError, what: &'static str) -> DecodeError {
        use crate::leb::LebError;
        match e {
            LebError::Truncated => self.err(DecodeErrorKind::Truncated { what }),
            LebError::Overflow => self.err_at(start, DecodeErrorKind::Overflow { what }),
            LebError::NonMinimal => self.err_at(start, DecodeErrorKind::NonMinimalLeb { what }),
        }
    }

    fn u32(&mut self, what: &'static str) -> R<u32> {
        let at = self.pos;
        let v = self.uleb(what)?;
        u32::try_from(v).map_err(|_| self.err_at(at, DecodeErrorKind::Overflow { what }))
    }

    fn index(&mut self, n: usize, what: &'static str) -> R<u32> {
        let at = self.pos;
        let v = self.uleb(what)?;
        if v >= n as u64 {
            return Err(self.err_at(
                at,
                DecodeErrorKind::IndexOutOfRange {
                    what,
                    index: v,
                    len: n,
                },
            ));
        }
        // n <= every limit < 2^32
        Ok(v as u32)
    }

    /// A list length: within `limit` and within the bytes left (every element takes at least one byte).
    fn count(&mut self, limit: usize, what: &'static str) -> R<usize> {
        let at = self.pos;
        let n = self.uleb(what)?;
        if n > limit as u64 {
            return Err(self.err_at(
                at,
                DecodeErrorKind::LimitExceeded {
                    what,
                    count: n,
                    limit,
                },
            ));
        }
        if n > (self.end - self.pos) as u64 {
            return Err(self.err_at(at, DecodeErrorKind::Truncated { what }));
        }
        Ok(n as usize)
    }

    fn list<T>(
        &mut self,
        limit: usize,
        what: &'static str,
        mut item: impl FnMut(&mut Self) -> R<T>,
    ) -> R<Vec<T>> {
        let n = self.count(limit, what)?;
        self.charge(n.saturating_mul(size_of::<T>()))?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(item(self)?);
        }
        Ok(v)
    }

    fn flag(&mut self, what: &'static str) -> R<bool> {
        match self.byte(what)? {
            0 => Ok(false),
            1 => Ok(true),
            tag => Err(self.err_at(self.pos - 1, DecodeErrorKind::UnknownTag { what, tag })),
        }
    }

    fn string(&mut self) -> R<String> {
        let i = self.index(self.strings.len(), "string")?;
        let s = self.strings[i as usize];
        self.charge(s.len())?;
        Ok(s.to_owned())
    }

    fn ty(&mut self) -> R<Type> {
        let i = self.index(self.types.len(), "type")?;
        let cost = self.types[i as usize].1;
        self.charge(cost)?;
        Ok(self.types[i as usize].0.clone())
    }

    fn types_list(&mut self) -> R<Vec<Type>> {
        self.list(MAX_LIST_LEN, "type list", |d| d.ty())
    }

    fn sig(&mut self) -> R<Signature> {
        Ok(Signature {
            params: self.types_list()?,
            results: self.types_list()?,
        })
    }

    // ---- tables

    fn strings_section(&mut self) -> R<()> {
        let n = self.count(MAX_STRINGS, "string table")?;
        self.charge(n.saturating_mul(size_of::<&str>()))?;
        self.strings.reserve_exact(n);
        for _ in 0..n {
            let at = self.pos;
            let len = self.uleb("string length")?;
            if len > MAX_STRING_LEN as u64 {
                return Err(self.err_at(
                    at,
                    DecodeErrorKind::LimitExceeded {
                        what: "string length",
                        count: len,
                        limit: MAX_STRING_LEN,
                    },
                ));
            }
            let at = self.pos;
            let bytes = self.bytes(len as usize, "string")?;
            let s = std::str::from_utf8(bytes)
                .map_err(|_| self.err_at(at, DecodeErrorKind::InvalidUtf8 { what: "a string" }))?;
            self.strings.push(s);
        }
        Ok(())
    }

    fn types_section(&mut self) -> R<()> {
        let n = self.count(MAX_TYPES, "type table")?;
        self.charge(n.saturating_mul(size_of::<(Type, usize)>()))?;
        self.types.reserve_exact(n);
        // depth of each entry, to bound `list<list<...>>` (its clone and drop recurse)
        let mut depths: Vec<usize> = Vec::with_capacity(n);
        for _ in 0..n {
            let at = self.pos;
            let tag = self.byte("type")?;
            let (t, cost, depth) = match tag {
                TY_I1 => (Type::I1, 0, 1),
                TY_I32 => (Type::I32, 0, 1),
                TY_I64 => (Type::I64, 0, 1),
                TY_F32 => (Type::F32, 0, 1),
                TY_F64 => (Type::F64, 0, 1),
                TY_STR => (Type::Str, 0, 1),
                TY_BUFFER => (Type::Buffer, 0, 1),
                TY_LIST => {
                    // only backward references: no cycles, no recursion
                    let e = self.index(self.types.len(), "list element type")? as usize;
                    let depth = depths[e] + 1;
                    if depth > MAX_TYPE_DEPTH {
                        return Err(self.err_at(at, DecodeErrorKind::TypeTooDeep));
                    }
                    let (elem, elem_cost) = &self.types[e];
                    (
                        Type::List(Box::new(elem.clone())),
                        elem_cost + size_of::<Type>(),
                        depth,
                    )
                }
                TY_REF | TY_NREF => {
                    let i = self.index(self.strings.len(), "string")?;
                    let name = self.strings[i as usize];
                    (
                        Type::Ref {
                            name: name.to_owned(),
                            nullable: tag == TY_NREF,
                        },
                        name.len(),
                        1,
                    )
                }
                tag => {
                    return Err(self.err_at(at, DecodeErrorKind::UnknownTag { what: "type", tag }));
                }
            };
            self.charge(cost)?;
            self.types.push((t, cost));
            depths.push(depth);
        }
        Ok(())
    }

    // ---- items

    fn tparams(&mut self) -> R<Vec<TParam>> {
        self.list(MAX_LIST_LEN, "template parameters", |d| {
            let name = d.string()?;
            let at = d.pos;
            let kind = match d.byte("template parameter kind")? {
                KIND_I64 => TParamKind::I64,
                KIND_BOOL => TParamKind::Bool,
                KIND_STR => TParamKind::Str,
                KIND_DTYPE => TParamKind::DType,
                KIND_SHAPE => TParamKind::Shape,
                KIND_FUNC => TParamKind::Func(d.sig()?),
                tag => {
                    return Err(d.err_at(
                        at,
                        DecodeErrorKind::UnknownTag {
                            what: "template parameter kind",
                            tag,
                        },
                    ));
                }
            };
            let default = if d.flag("default flag")? {
                let at = d.pos;
                let tag = d.byte("template value")?;
                Some(d.tvalue(tag, at)?)
            } else {
                None
            };
            Ok(TParam {
                name,
                kind,
                default,
            })
        })
    }

    fn tvalue(&mut self, tag: u8, at: usize) -> R<TValue> {
        Ok(match tag {
            TV_I64 => TValue::I64(self.sleb("template i64")?),
            TV_FALSE => TValue::Bool(false),
            TV_TRUE => TValue::Bool(true),
            TV_STR => TValue::Str(self.string()?),
            TV_DTYPE => TValue::DType(self.string()?),
            TV_SHAPE => TValue::Shape(self.list(MAX_LIST_LEN, "shape", |d| d.sleb("shape dim"))?),
            TV_FUNC => TValue::Func(self.callee()?),
            tag => {
                return Err(self.err_at(
                    at,
                    DecodeErrorKind::UnknownTag {
                        what: "template value",
                        tag,
                    },
                ));
            }
        })
    }

    fn callee(&mut self) -> R<Callee> {
        let at = self.pos;
        Ok(match self.byte("callee")? {
            CALLEE_FUNC => {
                if self.nfuncs == usize::MAX {
                    // decls come before funcs: check this index once the function count is known
                    let at = self.pos;
                    let i = self.u32("function index")?;
                    self.early_func_refs.push((at, i.into()));
                    Callee::Func(i)
                } else {
                    Callee::Func(self.index(self.nfuncs, "function")?)
                }
            }
            CALLEE_DECL => Callee::Decl(self.index(self.ndecls, "decl")?),
            CALLEE_TPARAM => Callee::TParam(self.index(self.cur.ntparams, "template parameter")?),
            tag => {
                return Err(self.err_at(
                    at,
                    DecodeErrorKind::UnknownTag {
                        what: "callee",
                        tag,
                    },
                ));
            }
        })
    }

    fn decls_section(&mut self) -> R<Vec<Decl>> {
        let n = self.count(MAX_ITEMS, "decls")?;
        self.ndecls = n;
        self.charge(n.saturating_mul(size_of::<Decl>()))?;
        let mut decls = Vec::with_capacity(n);
        for _ in 0..n {
            let symbol = self.string()?;
            let tparams = self.tparams()?;
            let sig = self.sig()?;
            let import = if self.flag("import flag")? {
                Some(self.string()?)
            } else {
                None
            };
            decls.push(Decl {
                symbol,
                tparams,
                sig,
                import,
                loc: Loc::default(),
            });
        }
        Ok(decls)
    }

    fn records_section(&mut self) -> R<Vec<Record>> {
        let records = self.list(MAX_ITEMS, "records", |d| {
            let name = d.string()?;
            let exported = d.flag("export flag")?;
            let fields = d.list(MAX_LIST_LEN, "record fields", |d| {
                Ok((d.string()?, d.ty()?))
            })?;
            Ok(Record {
                name,
                exported,
                fields,
                loc: Loc::default(),
            })
        })?;
        self.record_fields = records.iter().map(|r| r.fields.len()).collect();
        Ok(records)
    }

    fn consts_section(&mut self) -> R<Vec<Const>> {
        self.list(MAX_ITEMS, "consts", |d| {
            let name = d.string()?;
            let exported = d.flag("export flag")?;
            let at = d.pos;
            let tag = d.byte("constant value")?;
            let value = d.imm(tag, at)?;
            Ok(Const {
                name,
                exported,
                value,
                loc: Loc::default(),
            })
        })
    }

    fn imm(&mut self, tag: u8, at: usize) -> R<Imm> {
        Ok(match tag {
            IMM_FALSE => Imm::I1(false),
            IMM_TRUE => Imm::I1(true),
            IMM_I32 => {
                let at = self.pos;
                let v = self.sleb("i32 immediate")?;
                Imm::I32(i32::try_from(v).map_err(|_| {
                    self.err_at(
                        at,
                        DecodeErrorKind::Overflow {
                            what: "i32 immediate",
                        },
                    )
                })?)
            }
            IMM_I64 => Imm::I64(self.sleb("i64 immediate")?),
            IMM_F32 => {
                let at = self.pos;
                let b = self.bytes(4, "f32 immediate")?;
                let v = f32::from_bits(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                if !v.is_finite() {
                    return Err(self.err_at(at, DecodeErrorKind::NonFiniteFloat));
                }
                Imm::F32(v)
            }
            IMM_F64 => {
                let at = self.pos;
                let b = self.bytes(8, "f64 immediate")?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                let v = f64::from_bits(u64::from_le_bytes(a));
                if !v.is_finite() {
                    return Err(self.err_at(at, DecodeErrorKind::NonFiniteFloat));
                }
                Imm::F64(v)
            }
            IMM_STR => Imm::Str(self.string()?),
            IMM_NULL => Imm::Null(self.ty()?),
            tag => {
                return Err(self.err_at(
                    at,
                    DecodeErrorKind::UnknownTag {
                        what: "immediate",
                        tag,
                    },
                ));
            }
        })
    }

    fn value_id(&mut self) -> R<ValueId> {
        Ok(ValueId(self.index(self.cur.nvalues, "value")?))
    }

    fn value_ids(&mut self) -> R<Vec<ValueId>> {
        self.list(MAX_LIST_LEN, "value list", |d| d.value_id())
    }

    fn operand(&mut self) -> R<Operand> {
        let at = self.pos;
        Ok(match self.byte("operand")? {
            OPND_VALUE => Operand::Value(self.value_id()?),
            OPND_TPARAM => Operand::TParam(self.index(self.cur.ntparams, "template parameter")?),
            OPND_RECORD => Operand::Record(self.index(self.record_fields.len(), "record")?),
            OPND_FIELD => {
                let r = self.index(self.record_fields.len(), "record")?;
                let f = self.index(self.record_fields[r as usize], "record field")?;
                Operand::Field(r, f)
            }
            tag @ IMM_FALSE..=IMM_NULL => Operand::Imm(self.imm(tag, at)?),
            tag => {
                return Err(self.err_at(
                    at,
                    DecodeErrorKind::UnknownTag {
                        what: "operand",
                        tag,
                    },
                ));
            }
        })
    }

    fn operands(&mut self) -> R<Vec<Operand>> {
        self.list(MAX_LIST_LEN, "operands", |d| d.operand())
    }

    /// Reads a region's op count and makes room for its ops.
    fn start_region(&mut self, depth: usize) -> R<(Vec<Op>, usize)> {
        if depth > MAX_NESTING {
            return Err(self.err(DecodeErrorKind::TooDeep));
        }
        let at = self.pos;
        let n = self.count(MAX_OPS_PER_FUNCTION, "ops")?;
        self.cur.ops += n;
        if self.cur.ops > MAX_OPS_PER_FUNCTION {
            return Err(self.err_at(
                at,
                DecodeErrorKind::LimitExceeded {
                    what: "ops in one function",
                    count: self.cur.ops as u64,
                    limit: MAX_OPS_PER_FUNCTION,
                },
            ));
        }
        self.charge(n.saturating_mul(size_of::<Op>()))?;
        Ok((Vec::with_capacity(n), n))
    }

    /// Decodes a function body with an explicit stack of open regions rather than recursion: a recursive decoder
    /// needs several KiB of stack per nesting level in debug builds, and [`MAX_NESTING`] levels must fit on
    /// any thread.
    fn body(&mut self) -> R<Region> {
        // regions being filled, innermost last: (ops so far, ops left); `open[i]` owns `regions[i + 1]`
        let mut regions = vec![self.start_region(0)?];
        let mut open: Vec<OpenOp> = Vec::new();
        loop {
            let Some((_, left)) = regions.last_mut() else {
                return Err(self.err(DecodeErrorKind::TooDeep)); // unreachable: the body is never popped here
            };
            if *left > 0 {
                *left -= 1;
                match self.op()? {
                    Started::Leaf(op) => {
                        if let Some((ops, _)) = regions.last_mut() {
                            ops.push(op);
                        }
                    }
                    Started::Open(o) => {
                        open.push(o);
                        regions.push(self.start_region(regions.len())?);
                    }
                }
                continue;
            }
            let Some((ops, _)) = regions.pop() else {
                return Err(self.err(DecodeErrorKind::TooDeep));
            };
            let region = Region { ops };
            let Some(mut o) = open.pop() else {
                return Ok(region);
            };
            if o.fill(region) {
                if let Some((ops, _)) = regions.last_mut() {
                    ops.push(Op {
                        kind: o.kind,
                        results: o.results,
                        loc: Loc::default(),
                    });
                }
            } else {
                open.push(o);
                regions.push(self.start_region(regions.len())?);
            }
        }
    }

    /// Reads an op up to its first region.
    fn op(&mut self) -> R<Started> {
        let at = self.pos;
        let tag = self.byte("op")?;
        let results = self.value_ids()?;
        let leaf = |kind| {
            Ok(Started::Leaf(Op {
                kind,
                results: Vec::new(),
                loc: Loc::default(),
            }))
        };
        let started = match tag {
            OP_SIMPLE => {
                let at = self.pos;
                let code = self.uleb("opcode")?;
                let opcode = *usize::try_from(code)
                    .ok()
                    .and_then(|c| Opcode::ALL.get(c))
                    .ok_or_else(|| self.err_at(at, DecodeErrorKind::UnknownOpcode { code }))?;
                let operands = self.operands()?;
                let annotation = if self.flag("annotation flag")? {
                    Some(self.ty()?)
                } else {
                    None
                };
                leaf(OpKind::Simple {
                    opcode,
                    operands,
                    annotation,
                })
            }
            OP_CALL => {
                let callee = self.callee()?;
                let targs = self.list(MAX_LIST_LEN, "template arguments", |d| {
                    let name = d.string()?;
                    let at = d.pos;
                    let arg = match d.byte("template argument")? {
                        TARG_FORWARD => {
                            TArg::Forward(d.index(d.cur.ntparams, "template parameter")?)
                        }
                        tag => TArg::Value(d.tvalue(tag, at)?),
                    };
                    Ok((name, arg))
                })?;
                let args = self.operands()?;
                leaf(OpKind::Call {
                    callee,
                    targs,
                    args,
                })
            }
            OP_IF => Ok(Started::Open(OpenOp {
                kind: OpKind::If {
                    cond: self.operand()?,
                    then_region: Region::default(),
                    else_region: Region::default(),
                },
                results: Vec::new(),
                filled: 0,
            })),
            OP_FOR => Ok(Started::Open(OpenOp {
                kind: OpKind::For {
                    lo: self.operand()?,
                    hi: self.operand()?,
                    step: self.operand()?,
                    iv: self.value_id()?,
                    iters: self.value_ids()?,
                    inits: self.operands()?,
                    body: Region::default(),
                },
                results: Vec::new(),
                filled: 0,
            })),
            OP_WHILE => Ok(Started::Open(OpenOp {
                kind: OpKind::While {
                    iters: self.value_ids()?,
                    inits: self.operands()?,
                    cond_region: Region::default(),
                    body: Region::default(),
                },
                results: Vec::new(),
                filled: 0,
            })),
            OP_YIELD => leaf(OpKind::Yield(self.operands()?)),
            OP_CONDITION => leaf(OpKind::Condition(self.operand()?)),
            OP_RETURN => leaf(OpKind::Return(self.operands()?)),
            tag => Err(self.err_at(at, DecodeErrorKind::UnknownTag { what: "op", tag })),
        };
        started.map(|s| match s {
            Started::Leaf(mut op) => {
                op.results = results;
                Started::Leaf(op)
            }
            Started::Open(mut o) => {
                o.results = results;
                Started::Open(o)
            }
        })
    }

    fn funcs_section(&mut self) -> R<Vec<Function>> {
        let n = self.count(MAX_ITEMS, "functions")?;
        self.nfuncs = n;
        if let Some(&(at, index)) = self.early_func_refs.iter().find(|(_, i)| *i >= n as u64) {
            return Err(self.err_at(
                at,
                DecodeErrorKind::IndexOutOfRange {
                    what: "function",
                    index,
                    len: n,
                },
            ));
        }
        self.charge(n.saturating_mul(size_of::<Function>()))?;
        let mut funcs = Vec::with_capacity(n);
        for _ in 0..n {
            self.cur = FnCx::default();
            let name = self.string()?;
            let exported = self.flag("export flag")?;
            let tparams = self.tparams()?;
            self.cur.ntparams = tparams.len();
            let values = self.list(MAX_VALUES_PER_FUNCTION, "values", |d| {
                Ok(ValueDef {
                    name: String::new(),
                    ty: d.ty()?,
                })
            })?;
            self.cur.nvalues = values.len();
            let params = self.value_ids()?;
            let results = self.types_list()?;
            let body = self.body()?;
            funcs.push(Function {
                name,
                exported,
                tparams,
                params,
                results,
                values,
                body,
                loc: Loc::default(),
            });
        }
        self.cur = FnCx::default();
        Ok(funcs)
    }

    fn device_section(&mut self) -> R<Vec<DeviceItem>> {
        self.cur = FnCx::default();
        self.list(MAX_ITEMS, "device items", |d| {
            let at = d.pos;
            let kind = match d.byte("device item kind")? {
                DEV_KERNEL => DeviceKind::Kernel,
                DEV_KFUNC => DeviceKind::Kfunc,
                DEV_STAGE => DeviceKind::Stage,
                tag => {
                    return Err(d.err_at(
                        at,
                        DecodeErrorKind::UnknownTag {
                            what: "device item kind",
                            tag,
                        },
                    ));
                }
            };
            let name = d.string()?;
            let exported = d.flag("export flag")?;
            let tparams = d.tparams()?;
            let text = d.string()?;
            let loc = d.loc()?;
            Ok(DeviceItem {
                kind,
                name,
                exported,
                tparams,
                text,
                loc,
            })
        })
    }

    fn loc(&mut self) -> R<Loc> {
        Ok(Loc {
            line: self.u32("line")?,
            col: self.u32("column")?,
        })
    }

    fn debug_section(&mut self, m: &mut Module) -> R<()> {
        m.file = self.string()?;
        for d in &mut m.decls {
            d.loc = self.loc()?;
        }
        for r in &mut m.records {
            r.loc = self.loc()?;
        }
        for c in &mut m.consts {
            c.loc = self.loc()?;
        }
        for f in &mut m.funcs {
            f.loc = self.loc()?;
            for v in &mut f.values {
                v.name = self.string()?;
            }
            self.region_locs(&mut f.body)?;
        }
        Ok(())
    }

    /// Recursion is bounded: the regions were built at most [`MAX_NESTING`] deep.
    fn region_locs(&mut self, r: &mut Region) -> R<()> {
        for op in &mut r.ops {
            op.loc = self.loc()?;
            match &mut op.kind {
                OpKind::If {
                    then_region,
                    else_region,
                    ..
                } => {
                    self.region_locs(then_region)?;
                    self.region_locs(else_region)?;
                }
                OpKind::For { body, .. } => self.region_locs(body)?,
                OpKind::While {
                    cond_region, body, ..
                } => {
                    self.region_locs(cond_region)?;
                    self.region_locs(body)?;
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Decodes a `.loombc` file. Accepts exactly the canonical encodings of modules (plus custom sections, which
/// are skipped); checks structure and indices but not types or scoping: run
/// [`verify_module`](crate::verify::verify_module) on the result before using it.
pub fn decode(buf: &[u8]) -> Result<Module, DecodeError> {
    let at = |offset, kind| DecodeError { offset, kind };
    if buf.len() > MAX_FILE_SIZE {
        return Err(at(0, DecodeErrorKind::TooLarge { len: buf.len() }));
    }
    let magic_len = buf.len().min(MAGIC.len());
    if buf[..magic_len] != MAGIC[..magic_len] {
        return Err(at(0, DecodeErrorKind::BadMagic));
    }
    if buf.len() < HEADER_LEN {
        let what = if buf.len() < MAGIC.len() {
            "the magic"
        } else {
            "the version"
        };
        return Err(at(buf.len(), DecodeErrorKind::Truncated { what }));
    }
    let major = u16::from_le_bytes([buf[8], buf[9]]);
    let minor = u16::from_le_bytes([buf[10], buf[11]]);
    if major != VERSION_MAJOR || minor > VERSION_MINOR {
        return Err(at(
            MAGIC.len(),
            DecodeErrorKind::UnsupportedVersion { major, minor },
        ));
    }
    if buf.len() < HEADER_LEN + DIGEST_LEN {
        return Err(at(
            buf.len(),
            DecodeErrorKind::Truncated { what: "the digest" },
        ));
    }
    let body_end = buf.len() - DIGEST_LEN;
    let digest = Sha256::digest(&buf[..body_end]);
    if digest.as_slice() != &buf[body_end..] {
        return Err(at(body_end, DecodeErrorKind::DigestMismatch));
    }

    let mut d = Dec {
        buf,
        pos: HEADER_LEN,
        end: body_end,
        strings: Vec::new(),
        types: Vec::new(),
        budget: MAX_DECODED_BYTES,
        ndecls: 0,
        nfuncs: usize::MAX,
        record_fields: Vec::new(),
        cur: FnCx::default(),
        early_func_refs: Vec::new(),
    };

    // Frame the sections first; `kept` are the byte ranges that the canonical re-encoding must reproduce.
    let mut payloads = [(0usize, 0usize); LAST_SECTION as usize + 1];
    // why not the header: a file from an older minor version is still canonical in every other byte
    let mut kept = Vec::new();
    let mut next = 1u8;
    while d.pos < body_end {
        let start = d.pos;
        let id = d.byte("section id")?;
        let len_at = d.pos;
        let len = d.uleb("section length")?;
        if len > (body_end - d.pos) as u64 {
            return Err(d.err_at(len_at, DecodeErrorKind::Truncated { what: "a section" }));
        }
        let payload = (d.pos, d.pos + len as usize);
        d.pos = payload.1;
        if id == SEC_CUSTOM {
            d.pos = payload.0;
            d.end = payload.1;
            let n = d.count(MAX_STRING_LEN, "custom section name")?;
            let name_at = d.pos;
            let name = d.bytes(n, "custom section name")?;
            if std::str::from_utf8(name).is_err() {
                return Err(d.err_at(
                    name_at,
                    DecodeErrorKind::InvalidUtf8 {
                        what: "a custom section name",
                    },
                ));
            }
            d.pos = payload.1;
            d.end = body_end;
            continue;
        }
        if id > LAST_SECTION {
            return Err(d.err_at(start, DecodeErrorKind::UnknownSection { id }));
        }
        if id < next {
            return Err(d.err_at(
                start,
                DecodeErrorKind::SectionOrder {
                    name: SECTION_NAMES[id as usize],
                },
            ));
        }
        if id > next {
            return Err(d.err_at(
                start,
                DecodeErrorKind::MissingSection {
                    name: SECTION_NAMES[next as usize],
                },
            ));
        }
        payloads[id as usize] = payload;
        kept.push((start, payload.1));
        next += 1;
    }
    let last = if minor == 0 {
        LAST_SECTION_V0
    } else {
        LAST_SECTION
    };
    if next > last + 1 {
        // a minor-0 file has no section 9: it cannot carry device items
        return Err(d.err_at(
            body_end,
            DecodeErrorKind::UnknownSection { id: LAST_SECTION },
        ));
    }
    if next <= last {
        return Err(d.err_at(
            body_end,
            DecodeErrorKind::MissingSection {
                name: SECTION_NAMES[next as usize],
            },
        ));
    }

    let mut m = Module::default();
    for id in 1..=last {
        let (start, end) = payloads[id as usize];
        d.pos = start;
        d.end = end;
        match id {
            1 => d.strings_section()?,
            2 => d.types_section()?,
            3 => m.name = d.string()?,
            4 => m.decls = d.decls_section()?,
            5 => m.records = d.records_section()?,
            6 => m.consts = d.consts_section()?,
            7 => m.funcs = d.funcs_section()?,
            8 => d.debug_section(&mut m)?,
            _ => m.device = d.device_section()?,
        }
        if d.pos != end {
            return Err(d.err(DecodeErrorKind::SectionTrailing {
                name: SECTION_NAMES[id as usize],
                extra: end - d.pos,
            }));
        }
    }

    // Canonical check: the canonical encoder must write exactly the bytes we kept.
    let mut canonical = encode_body(&m);
    if minor == 0 {
        // why: a minor-0 file ends after section 8; the module has no device items, so section 9 is `09 01 00`
        canonical.truncate(canonical.len().saturating_sub(3));
    }
    let mut ci = HEADER_LEN;
    for &(start, end) in &kept {
        let have = &buf[start..end];
        let want = canonical.get(ci..).unwrap_or(&[]);
        if let Some(k) = have.iter().zip(want).position(|(a, b)| a != b) {
            return Err(at(start + k, DecodeErrorKind::NonCanonical));
        }
        if want.len() < have.len() {
            return Err(at(start + want.len(), DecodeErrorKind::NonCanonical));
        }
        ci += have.len();
    }
    if ci != canonical.len() {
        return Err(at(body_end, DecodeErrorKind::NonCanonical));
    }
    Ok(m)
}

#[cfg(test)]
mod tests;
