//! Hand-built modules shared by the `loom-ir` integration tests (no parser dependency: the IR is tested on its
//! own terms).
#![allow(dead_code, unreachable_pub)]

use loom_ir::opcode::opaque;
use loom_ir::*;

/// Collects the values of one function under construction.
#[derive(Default)]
pub struct Fb {
    pub values: Vec<ValueDef>,
}

impl Fb {
    pub fn v(&mut self, name: &str, ty: Type) -> ValueId {
        self.values.push(ValueDef {
            name: name.into(),
            ty,
        });
        ValueId(self.values.len() as u32 - 1)
    }

    pub fn func(self, name: &str, params: usize, results: Vec<Type>, body: Vec<Op>) -> Function {
        Function {
            name: name.into(),
            exported: false,
            tparams: vec![],
            params: (0..params as u32).map(ValueId).collect(),
            results,
            values: self.values,
            body: Region { ops: body },
            loc: Loc::default(),
        }
    }
}

pub fn v(id: ValueId) -> Operand {
    Operand::Value(id)
}
pub fn int(i: i64) -> Operand {
    Operand::Imm(Imm::I64(i))
}
pub fn imm(i: Imm) -> Operand {
    Operand::Imm(i)
}
pub fn s(text: &str) -> Operand {
    Operand::Imm(Imm::Str(text.into()))
}

pub fn op(kind: OpKind, results: &[ValueId]) -> Op {
    Op {
        kind,
        results: results.to_vec(),
        loc: Loc::default(),
    }
}

pub fn simple(opcode: Opcode, results: &[ValueId], operands: Vec<Operand>) -> Op {
    op(
        OpKind::Simple {
            opcode,
            operands,
            annotation: None,
        },
        results,
    )
}

pub fn annotated(opcode: Opcode, results: &[ValueId], operands: Vec<Operand>, ty: Type) -> Op {
    op(
        OpKind::Simple {
            opcode,
            operands,
            annotation: Some(ty),
        },
        results,
    )
}

pub fn call(
    callee: Callee,
    targs: Vec<(&str, TArg)>,
    args: Vec<Operand>,
    results: &[ValueId],
) -> Op {
    op(
        OpKind::Call {
            callee,
            targs: targs.into_iter().map(|(n, a)| (n.to_string(), a)).collect(),
            args,
        },
        results,
    )
}

pub fn ret(os: Vec<Operand>) -> Op {
    op(OpKind::Return(os), &[])
}
pub fn yld(os: Vec<Operand>) -> Op {
    op(OpKind::Yield(os), &[])
}
pub fn region(ops: Vec<Op>) -> Region {
    Region { ops }
}

pub fn nullable(name: &str) -> Type {
    Type::Ref {
        name: name.into(),
        nullable: true,
    }
}

fn sig(params: Vec<Type>, results: Vec<Type>) -> Signature {
    Signature { params, results }
}

pub fn tparam(name: &str, kind: TParamKind, default: Option<TValue>) -> TParam {
    TParam {
        name: name.into(),
        kind,
        default,
    }
}

/// Gives every item and op a distinct location (line = position in a pre-order walk), so that the debug
/// section is exercised.
pub fn number_locs(m: &mut Module) {
    fn region(r: &mut Region, line: &mut u32) {
        for op in &mut r.ops {
            *line += 1;
            op.loc = Loc {
                line: *line,
                col: 5,
            };
            match &mut op.kind {
                OpKind::If {
                    then_region,
                    else_region,
                    ..
                } => {
                    region(then_region, line);
                    region(else_region, line);
                }
                OpKind::For { body, .. } => region(body, line),
                OpKind::While {
                    cond_region, body, ..
                } => {
                    region(cond_region, line);
                    region(body, line);
                }
                _ => {}
            }
        }
    }
    let mut line = 1;
    for d in &mut m.decls {
        line += 1;
        d.loc = Loc { line, col: 3 };
    }
    for r in &mut m.records {
        line += 1;
        r.loc = Loc { line, col: 3 };
    }
    for c in &mut m.consts {
        line += 1;
        c.loc = Loc { line, col: 3 };
    }
    for f in &mut m.funcs {
        line += 1;
        f.loc = Loc { line, col: 3 };
        region(&mut f.body, &mut line);
    }
}

pub const F: u32 = 0;
pub const G: u32 = 1;
pub const H: u32 = 2;
pub const DOUBLE: u32 = 3;

/// A module that uses every op kind, every immediate kind, every operand kind, templates and records.
pub fn sample_module() -> Module {
    let mut m = Module {
        name: "test.all".into(),
        file: "test/all.loom".into(),
        decls: sample_decls(),
        records: sample_records(),
        consts: sample_consts(),
        funcs: vec![sample_f(), sample_g(), sample_h(), sample_double()],
        device: Vec::new(),
    };
    number_locs(&mut m);
    m
}

/// The sample module's declarations: an import, a template definition reference, a HAL import.
fn sample_decls() -> Vec<Decl> {
    use Type::*;
    vec![
        Decl {
            symbol: "input.encode".into(),
            tparams: vec![],
            sig: sig(vec![Buffer, I32, I64], vec![Buffer, I64]),
            import: Some("input".into()),
            loc: Loc::default(),
        },
        Decl {
            symbol: "lib.scale".into(),
            tparams: vec![tparam("N", TParamKind::I64, None)],
            sig: sig(vec![I64], vec![I64]),
            import: None,
            loc: Loc::default(),
        },
        Decl {
            symbol: "hal.wait".into(),
            tparams: vec![],
            sig: sig(vec![nullable("hal.fence")], vec![]),
            import: Some("hal".into()),
            loc: Loc::default(),
        },
    ]
}

/// The sample module's records.
fn sample_records() -> Vec<Record> {
    use Type::*;
    vec![
        Record {
            name: "Range".into(),
            exported: false,
            fields: vec![("offset".into(), I64), ("length".into(), I64)],
            loc: Loc::default(),
        },
        Record {
            name: "Flags".into(),
            exported: true,
            fields: vec![("on".into(), I1), ("w".into(), F32)],
            loc: Loc::default(),
        },
    ]
}

/// The sample module's constants, one per immediate kind.
fn sample_consts() -> Vec<Const> {
    let konst = |name: &str, exported, value| Const {
        name: name.into(),
        exported,
        value,
        loc: Loc::default(),
    };
    let consts = vec![
        konst("MAX", false, Imm::I64(4096)),
        konst("NAME", true, Imm::Str("a\"b\\c\n\t\r\0\u{1}\u{7f}é".into())),
        konst("SMALL", false, Imm::I32(-7)),
        konst("ON", false, Imm::I1(true)),
        konst("HALF", false, Imm::F32(0.5)),
        konst("TINY", false, Imm::F64(1e-7)),
        konst("NONE", false, Imm::Null(nullable("hal.fence"))),
    ];
    consts
}

/// `func @f`: templates, every simple op kind, structured control flow.
fn sample_f() -> Function {
    use Opcode::*;
    use Type::*;
    let f64_fn = || TParamKind::Func(sig(vec![I64], vec![I64]));
    let mut b = Fb::default();
    let a = b.v("a", I64);
    let buf = b.v("b", Buffer);
    let c = b.v("c", I1);
    let v0 = b.v("0", I64);
    let r = b.v("r", I64);
    let sres = b.v("s", I64);
    let i = b.v("i", I64);
    let acc = b.v("acc", I64);
    let t = b.v("t", I64);
    let j = b.v("j", I64);
    let j32 = b.v("j32", I32);
    let w = b.v("w", I64);
    let x = b.v("x", I64);
    let c2 = b.v("c2", I1);
    let y = b.v("y", I64);
    let u = b.v("u", I64);
    let u2 = b.v("u2", I64);
    let l = b.v("l", List(Box::new(I64)));
    let vv = b.v("v", I64);
    let sc = b.v("sc", I64);
    let e1 = b.v("e1", Buffer);
    let e2 = b.v("e2", I64);
    let sz = b.v("sz", I64);
    let off = b.v("off", I64);
    let fl = b.v("fl", I1);
    let h1 = b.v("h1", F32);
    let h2 = b.v("h2", F64);
    let st = b.v("st", Str);
    let s2 = b.v("s2", Str);
    let bb = b.v("bb", I1);
    let nn = b.v("nn", I1);
    let k = b.v("k", I32);
    let q = b.v("q", I32);
    let z = b.v("z", I64);
    let body = vec![
        simple(Mul, &[v0], vec![v(a), int(16)]),
        op(
            OpKind::If {
                cond: v(c),
                then_region: region(vec![yld(vec![v(v0)])]),
                else_region: region(vec![yld(vec![int(1)])]),
            },
            &[r],
        ),
        op(
            OpKind::If {
                cond: v(c),
                then_region: region(vec![
                    call(Callee::Func(G), vec![], vec![v(a)], &[]),
                    yld(vec![]),
                ]),
                else_region: region(vec![yld(vec![])]),
            },
            &[],
        ),
        op(
            OpKind::If {
                cond: imm(Imm::I1(false)),
                then_region: region(vec![
                    call(Callee::Func(G), vec![], vec![v(r)], &[]),
                    yld(vec![]),
                ]),
                else_region: region(vec![
                    call(Callee::Func(G), vec![], vec![int(2)], &[]),
                    yld(vec![]),
                ]),
            },
            &[],
        ),
        op(
            OpKind::For {
                lo: int(0),
                hi: v(a),
                step: int(2),
                iv: i,
                iters: vec![acc],
                inits: vec![int(0)],
                body: region(vec![simple(Add, &[t], vec![v(acc), v(i)]), yld(vec![v(t)])]),
            },
            &[sres],
        ),
        op(
            OpKind::For {
                lo: int(0),
                hi: Operand::TParam(0),
                step: int(1),
                iv: j,
                iters: vec![],
                inits: vec![],
                body: region(vec![
                    simple(TruncI32, &[j32], vec![v(j)]),
                    simple(StoreI32, &[], vec![v(buf), v(j), v(j32)]),
                    yld(vec![]),
                ]),
            },
            &[],
        ),
        op(
            OpKind::While {
                iters: vec![x],
                inits: vec![int(0)],
                cond_region: region(vec![
                    simple(CmpLt, &[c2], vec![v(x), int(10)]),
                    op(OpKind::Condition(v(c2)), &[]),
                ]),
                body: region(vec![simple(Add, &[y], vec![v(x), int(1)]), yld(vec![v(y)])]),
            },
            &[w],
        ),
        call(
            Callee::Func(H),
            vec![
                ("N", TArg::Value(TValue::I64(4))),
                ("F", TArg::Value(TValue::Func(Callee::Func(DOUBLE)))),
            ],
            vec![v(a)],
            &[u],
        ),
        call(
            Callee::Func(H),
            vec![("F", TArg::Forward(1))],
            vec![v(w)],
            &[u2],
        ),
        annotated(ListNew, &[l], vec![int(4)], List(Box::new(I64))),
        simple(ListPush, &[], vec![v(l), v(u)]),
        call(Callee::TParam(1), vec![], vec![v(a)], &[vv]),
        call(
            Callee::Decl(1),
            vec![("N", TArg::Forward(0))],
            vec![v(vv)],
            &[sc],
        ),
        call(
            Callee::Decl(0),
            vec![],
            vec![v(buf), imm(Imm::I32(4)), v(a)],
            &[e1, e2],
        ),
        simple(RecordSize, &[sz], vec![Operand::Record(0)]),
        simple(RecordOffset, &[off], vec![Operand::Field(0, 1)]),
        simple(LoadField, &[fl], vec![v(buf), int(0), Operand::Field(1, 0)]),
        simple(ConstF32, &[h1], vec![imm(Imm::F32(0.1))]),
        simple(ConstF64, &[h2], vec![imm(Imm::F64(-2.5e300))]),
        simple(ConstStr, &[st], vec![s("hi\n")]),
        simple(StrConcat, &[s2], vec![v(st), Operand::TParam(2)]),
        simple(And, &[bb], vec![v(c), Operand::TParam(3)]),
        simple(
            RefIsNull,
            &[nn],
            vec![imm(Imm::Null(nullable("hal.fence")))],
        ),
        call(
            Callee::Decl(2),
            vec![],
            vec![imm(Imm::Null(nullable("hal.fence")))],
            &[],
        ),
        simple(ConstI32, &[k], vec![imm(Imm::I32(i32::MIN))]),
        simple(AddWrap, &[q], vec![v(k), imm(Imm::I32(-3))]),
        simple(Select, &[z], vec![v(c), v(a), Operand::TParam(0)]),
        simple(Assert, &[], vec![v(bb), s("bad")]),
        ret(vec![v(e1), v(sres)]),
    ];
    let mut f = b.func("f", 3, vec![Buffer, I64], body);
    f.exported = true;
    f.tparams = vec![
        tparam("N", TParamKind::I64, Some(TValue::I64(4))),
        tparam("F", f64_fn(), None),
        tparam("S", TParamKind::Str, Some(TValue::Str("x".into()))),
        tparam("B", TParamKind::Bool, Some(TValue::Bool(true))),
        tparam("D", TParamKind::DType, Some(TValue::DType("f32".into()))),
        tparam("SH", TParamKind::Shape, Some(TValue::Shape(vec![2, -3]))),
    ];
    f
}

/// `func @g`: a result-less `while`, opaque state, `trap`.
fn sample_g() -> Function {
    use Opcode::*;
    use Type::*;
    let mut b = Fb::default();
    let a = b.v("a", I64);
    let o = b.v("o", opaque());
    let o1 = b.v("o1", I64);
    let cc = b.v("cc", I1);
    let body = vec![
        simple(OpaqueNew, &[o], vec![v(a), s("x")]),
        annotated(OpaqueGet, &[o1], vec![v(o), int(0)], I64),
        op(
            OpKind::While {
                iters: vec![],
                inits: vec![],
                cond_region: region(vec![
                    simple(CmpGt, &[cc], vec![v(o1), int(i64::MIN)]),
                    op(OpKind::Condition(v(cc)), &[]),
                ]),
                body: region(vec![simple(Trap, &[], vec![s("loop")]), yld(vec![])]),
            },
            &[],
        ),
        ret(vec![]),
    ];
    b.func("g", 1, vec![], body)
}

/// `func @h<N: i64 = 1, F: func(i64) -> i64>(%a: i64) -> i64`: a call of a template parameter.
fn sample_h() -> Function {
    use Opcode::*;
    use Type::*;
    let f64_fn = || TParamKind::Func(sig(vec![I64], vec![I64]));
    let mut b = Fb::default();
    let a = b.v("a", I64);
    let p = b.v("0", I64);
    let m = b.v("1", I64);
    let body = vec![
        call(Callee::TParam(1), vec![], vec![v(a)], &[p]),
        simple(Mul, &[m], vec![v(p), Operand::TParam(0)]),
        ret(vec![v(m)]),
    ];
    let mut h = b.func("h", 1, vec![I64], body);
    h.tparams = vec![
        tparam("N", TParamKind::I64, Some(TValue::I64(1))),
        tparam("F", f64_fn(), Some(TValue::Func(Callee::Func(DOUBLE)))),
    ];
    h
}

/// `func @double`.
fn sample_double() -> Function {
    use Opcode::*;
    use Type::*;
    let mut b = Fb::default();
    let a = b.v("a", I64);
    let d = b.v("0", I64);
    b.func(
        "double",
        1,
        vec![I64],
        vec![simple(Add, &[d], vec![v(a), v(a)]), ret(vec![v(d)])],
    )
}

/// What `print_module(&sample_module())` must give.
pub const SAMPLE_TEXT: &str = r#"module @test.all {
  func.decl @input.encode(buffer, i32, i64) -> (buffer, i64) import("input")
  func.decl @lib.scale<N: i64>(i64) -> i64
  func.decl @hal.wait(?!hal.fence) import("hal")

  type @Range = record { offset: i64, length: i64 }
  export type @Flags = record { on: i1, w: f32 }

  const @MAX: i64 = 4096
  export const @NAME: str = "a\"b\\c\n\t\r\0\u{1}\u{7f}é"
  const @SMALL: i32 = -7
  const @ON: i1 = true
  const @HALF: f32 = 0.5
  const @TINY: f64 = 1e-7
  const @NONE: ?!hal.fence = null

  export func @f<N: i64 = 4, F: func(i64) -> i64, S: str = "x", B: bool = true, D: dtype = f32, SH: shape = [2, -3]>(%a: i64, %b: buffer, %c: i1) -> (buffer, i64) {
    %0 = mul %a, 16
    %r = if %c -> i64 {
      yield %0
    } else {
      yield 1
    }
    if %c {
      call @g(%a)
    }
    if false {
      call @g(%r)
    } else {
      call @g(2)
    }
    %s = for %i = 0 to %a step 2 iter(%acc = 0 : i64) -> i64 {
      %t = add %acc, %i
      yield %t
    }
    for %j = 0 to N {
      %j32 = trunc.i32 %j
      buffer.store.i32 %b, %j, %j32
    }
    %w = while iter(%x = 0 : i64) -> i64 {
      %c2 = cmp.lt %x, 10
      condition %c2
    } do {
      %y = add %x, 1
      yield %y
    }
    %u = call @h<N = 4, F = @double>(%a)
    %u2 = call @h<F = F>(%w)
    %l = list.new 4 : list<i64>
    list.push %l, %u
    %v = call F(%a)
    %sc = call @lib.scale<N = N>(%v)
    %e1, %e2 = call @input.encode(%b, 4, %a)
    %sz = record.size @Range
    %off = record.offset @Range.length
    %fl = buffer.load.field %b, 0, @Flags.on
    %h1 = const.f32 0.1
    %h2 = const.f64 -2.5e300
    %st = const.str "hi\n"
    %s2 = str.concat %st, S
    %bb = and %c, B
    %nn = ref.is_null null
    call @hal.wait(null)
    %k = const.i32 -2147483648
    %q = add.wrap %k, -3
    %z = select %c, %a, N
    assert %bb, "bad"
    return %e1, %s
  }

  func @g(%a: i64) {
    %o = opaque.new %a, "x"
    %o1 = opaque.get %o, 0 : i64
    while {
      %cc = cmp.gt %o1, -9223372036854775808
      condition %cc
    } do {
      trap "loop"
    }
    return
  }

  func @h<N: i64 = 1, F: func(i64) -> i64 = @double>(%a: i64) -> i64 {
    %0 = call F(%a)
    %1 = mul %0, N
    return %1
  }

  func @double(%a: i64) -> i64 {
    %0 = add %a, %a
    return %0
  }
}
"#;

/// A small valid module: `func @f(%a: i64) -> i64 { %0 = add %a, 1; return %0 }`.
pub fn tiny_module() -> Module {
    let mut b = Fb::default();
    let a = b.v("a", Type::I64);
    let r = b.v("0", Type::I64);
    let f = b.func(
        "f",
        1,
        vec![Type::I64],
        vec![
            simple(Opcode::Add, &[r], vec![v(a), int(1)]),
            ret(vec![v(r)]),
        ],
    );
    let mut m = Module {
        name: "m".into(),
        file: "m.loom".into(),
        funcs: vec![f],
        ..Module::default()
    };
    number_locs(&mut m);
    m
}

/// `tiny_module` with `depth` nested result-less `if`/`for`/`while` ops (cycling) in front of its body.
pub fn nested_module(depth: usize) -> Module {
    let mut m = tiny_module();
    let f = &mut m.funcs[0];
    let mut inner = region(vec![yld(vec![])]);
    for k in 0..depth {
        let kind = match k % 3 {
            0 => OpKind::If {
                cond: imm(Imm::I1(true)),
                then_region: inner,
                else_region: region(vec![yld(vec![])]),
            },
            1 => {
                f.values.push(ValueDef {
                    name: format!("i{k}"),
                    ty: Type::I64,
                });
                OpKind::For {
                    lo: int(0),
                    hi: int(1),
                    step: int(1),
                    iv: ValueId(f.values.len() as u32 - 1),
                    iters: vec![],
                    inits: vec![],
                    body: inner,
                }
            }
            _ => OpKind::While {
                iters: vec![],
                inits: vec![],
                cond_region: region(vec![op(OpKind::Condition(imm(Imm::I1(false))), &[])]),
                body: inner,
            },
        };
        inner = region(vec![op(kind, &[]), yld(vec![])]);
    }
    let mut ops = inner.ops;
    ops.pop();
    f.body.ops.splice(0..0, ops);
    m
}

/// Runs `f` on a thread with a 1 MiB stack: deep nesting must fit well within the usual 2 MiB.
pub fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(f)
        .expect("spawn a test thread")
        .join()
        .expect("the test thread panicked")
}
