//! The verifier: acceptance of well-formed modules, and one rejection per rule with its message.

mod common;

use common::*;
use loom_ir::*;

#[test]
fn sample_and_tiny_modules_verify() {
    verify_module(&sample_module()).unwrap();
    verify_module(&tiny_module()).unwrap();
}

/// Verifies `m` after `edit` and returns the error's message (asserting the item is `function @f` when given).
fn reject(mut m: Module, edit: impl FnOnce(&mut Module)) -> VerifyError {
    edit(&mut m);
    verify_module(&m).expect_err("the verifier should reject this module")
}

fn f_body(m: &mut Module) -> &mut Vec<Op> {
    &mut m.funcs[0].body.ops
}

#[test]
fn rejects_use_before_definition() {
    let e = reject(tiny_module(), |m| {
        // %0 = add %a, %late; %late = copy 1; return %0
        let late = ValueId(2);
        m.funcs[0].values.push(ValueDef {
            name: "late".into(),
            ty: Type::I64,
        });
        f_body(m)[0] = simple(Opcode::Add, &[ValueId(1)], vec![v(ValueId(0)), v(late)]);
        f_body(m).insert(1, simple(Opcode::Copy, &[late], vec![int(1)]));
    });
    assert_eq!(e.message, "%late is used before its definition");
    assert_eq!(e.item, "function @f");
    assert_eq!(e.loc, Loc::default());
    let e = reject(tiny_module(), |m| {
        f_body(m).insert(0, simple(Opcode::Neg, &[ValueId(1)], vec![v(ValueId(1))]));
        f_body(m).remove(1);
    });
    assert_eq!(e.message, "%0 is used before its definition");
}

#[test]
fn rejects_use_from_inner_region() {
    let mut m = tiny_module();
    let f = &mut m.funcs[0];
    let c = ValueId(f.values.len() as u32);
    f.values.push(ValueDef {
        name: "c".into(),
        ty: Type::I1,
    });
    let inner = ValueId(f.values.len() as u32);
    f.values.push(ValueDef {
        name: "inner".into(),
        ty: Type::I64,
    });
    f.body.ops = vec![
        simple(Opcode::CmpGt, &[c], vec![v(ValueId(0)), int(0)]),
        op(
            OpKind::If {
                cond: v(c),
                then_region: region(vec![
                    simple(Opcode::Add, &[inner], vec![v(ValueId(0)), int(1)]),
                    yld(vec![]),
                ]),
                else_region: region(vec![yld(vec![])]),
            },
            &[],
        ),
        simple(Opcode::Add, &[ValueId(1)], vec![v(inner), int(1)]),
        ret(vec![v(ValueId(1))]),
    ];
    f.body.ops[2].loc = Loc { line: 7, col: 9 };
    let e = verify_module(&m).unwrap_err();
    assert_eq!(
        e.message,
        "%inner is used outside the region that defines it"
    );
    assert_eq!(e.loc, Loc { line: 7, col: 9 });
    assert_eq!(
        e.to_string(),
        "function @f at 7:9: %inner is used outside the region that defines it"
    );
}

#[test]
fn rejects_type_mismatch() {
    let e = reject(tiny_module(), |m| {
        m.funcs[0].values[1].ty = Type::I32;
    });
    assert_eq!(e.message, "%0 has type i32, but add produces i64");
    let e = reject(tiny_module(), |m| {
        f_body(m)[0] = simple(
            Opcode::Add,
            &[ValueId(1)],
            vec![v(ValueId(0)), imm(Imm::F64(1.0))],
        );
    });
    assert_eq!(
        e.message,
        "add: operands must have the same type, found i64 and f64"
    );
    let e = reject(tiny_module(), |m| {
        f_body(m)[1] = ret(vec![imm(Imm::I32(1))]);
    });
    assert_eq!(e.message, "return: value 1 has type i32, expected i64");
}

#[test]
fn rejects_wrong_call_arity() {
    let e = reject(sample_module(), |m| {
        // `call @g(%a)` inside the first result-less if -> `call @g(%a, %a)`
        let OpKind::If { then_region, .. } = &mut f_body(m)[2].kind else {
            unreachable!()
        };
        let OpKind::Call { args, .. } = &mut then_region.ops[0].kind else {
            unreachable!()
        };
        args.push(args[0].clone());
    });
    assert_eq!(e.message, "call to @g gives 2 values, expected 1");
    let e = reject(sample_module(), |m| {
        let OpKind::Call { args, .. } = &mut f_body(m)[13].kind else {
            unreachable!()
        };
        args.pop();
    });
    assert_eq!(
        e.message,
        "call to @input.encode gives 2 values, expected 3"
    );
    let e = reject(sample_module(), |m| {
        f_body(m)[13].results.pop();
    });
    assert_eq!(
        e.message,
        "call to @input.encode produces 2 results, but the op defines 1"
    );
}

#[test]
fn rejects_missing_terminator() {
    let e = reject(tiny_module(), |m| {
        f_body(m).pop();
    });
    assert_eq!(e.message, "function body must end in `return`, found `add`");
    let e = reject(tiny_module(), |m| {
        f_body(m).clear();
    });
    assert_eq!(e.message, "function body is empty: it must end in `return`");
    let e = reject(sample_module(), |m| {
        let OpKind::If { else_region, .. } = &mut f_body(m)[1].kind else {
            unreachable!()
        };
        else_region.ops.clear();
    });
    assert_eq!(e.message, "else region is empty: it must end in `yield`");
    let e = reject(sample_module(), |m| {
        let OpKind::While { cond_region, .. } = &mut f_body(m)[6].kind else {
            unreachable!()
        };
        cond_region.ops[1] = yld(vec![]);
    });
    assert_eq!(
        e.message,
        "while condition region must end in `condition`, found `yield`"
    );
}

#[test]
fn rejects_terminator_in_the_middle() {
    let e = reject(tiny_module(), |m| {
        f_body(m).insert(0, ret(vec![v(ValueId(0))]));
    });
    assert_eq!(e.message, "`return` must be the last op of its region");
    let e = reject(sample_module(), |m| {
        let OpKind::For { body, .. } = &mut f_body(m)[4].kind else {
            unreachable!()
        };
        body.ops.insert(0, yld(vec![int(0)]));
    });
    assert_eq!(e.message, "`yield` must be the last op of its region");
}

#[test]
fn rejects_bad_template_arguments() {
    // %u = call @h<N = 4, F = @double>(%a) is op 7
    fn targs(m: &mut Module) -> &mut Vec<(String, TArg)> {
        let OpKind::Call { targs, .. } = &mut f_body(m)[7].kind else {
            unreachable!()
        };
        targs
    }
    let e = reject(sample_module(), |m| {
        targs(m)[0].1 = TArg::Value(TValue::Str("4".into()))
    });
    assert_eq!(
        e.message,
        "template argument N of @h: expected a value of kind i64, found a str"
    );
    let e = reject(sample_module(), |m| targs(m)[0].0 = "M".into());
    assert_eq!(e.message, "@h has no template parameter M");
    let e = reject(sample_module(), |m| {
        targs(m)[1].1 = TArg::Value(TValue::Func(Callee::Func(G)))
    });
    assert_eq!(
        e.message,
        "template argument F of @h: @g has signature (i64), expected (i64) -> i64"
    );
    let e = reject(sample_module(), |m| targs(m)[1].1 = TArg::Forward(2));
    assert_eq!(
        e.message,
        "template argument F of @h: forwarded parameter S has kind str, expected func(i64) -> i64"
    );
    let e = reject(sample_module(), |m| {
        let dup = targs(m)[0].clone();
        targs(m).push(dup);
    });
    assert_eq!(e.message, "template argument N is given twice");
    // @lib.scale<N: i64> has no default
    let e = reject(sample_module(), |m| {
        let OpKind::Call { targs, .. } = &mut f_body(m)[12].kind else {
            unreachable!()
        };
        targs.clear();
    });
    assert_eq!(
        e.message,
        "call to @lib.scale is missing template argument N"
    );
}

#[test]
fn rejects_structural_problems() {
    let e = reject(tiny_module(), |m| f_body(m)[0].results.push(ValueId(0)));
    assert_eq!(e.message, "add produces 1 result, but the op defines 2");
    let e = reject(tiny_module(), |m| f_body(m)[0].results = vec![ValueId(0)]);
    assert_eq!(e.message, "%a is defined more than once");
    let e = reject(tiny_module(), |m| f_body(m)[0].results = vec![ValueId(5)]);
    assert_eq!(
        e.message,
        "value #5 is out of range (the function has 2 values)"
    );
    let e = reject(tiny_module(), |m| {
        m.funcs[0].values.push(ValueDef {
            name: "unused".into(),
            ty: Type::I64,
        })
    });
    assert_eq!(e.message, "%unused is never defined");
    let e = reject(tiny_module(), |m| m.funcs[0].values[1].name = "a".into());
    assert_eq!(e.message, "value name %a is used twice");
    let e = reject(tiny_module(), |m| m.funcs[0].values[1].name = "a-b".into());
    assert_eq!(e.message, "invalid value name \"a-b\"");
    let e = reject(tiny_module(), |m| m.funcs.push(m.funcs[0].clone()));
    assert_eq!(e.message, "the symbol @f is defined more than once");
    let e = reject(tiny_module(), |m| m.funcs[0].params = vec![ValueId(1)]);
    assert_eq!(e.message, "parameter 1 must be value #0, found #1");
    let e = reject(tiny_module(), |m| {
        f_body(m)[0] = simple(
            Opcode::Add,
            &[ValueId(1)],
            vec![v(ValueId(0)), imm(Imm::I64(1)), int(2)],
        )
    });
    assert_eq!(e.message, "add takes 2 operands, found 3");
    let e = reject(tiny_module(), |m| {
        f_body(m)[0] = simple(
            Opcode::ConstF64,
            &[ValueId(1)],
            vec![imm(Imm::F64(f64::NAN))],
        );
        m.funcs[0].values[1].ty = Type::F64;
    });
    assert_eq!(
        e.message,
        "non-finite float immediate NaN (it has no text form)"
    );
    let e = reject(tiny_module(), |m| {
        f_body(m)[0] = simple(
            Opcode::RefIsNull,
            &[ValueId(1)],
            vec![imm(Imm::Null(Type::I64))],
        );
    });
    assert_eq!(
        e.message,
        "null must have a nullable reference type, found i64"
    );
}

#[test]
fn rejects_bad_loops() {
    let e = reject(sample_module(), |m| {
        let OpKind::For { step, .. } = &mut f_body(m)[4].kind else {
            unreachable!()
        };
        *step = imm(Imm::I32(2));
    });
    assert_eq!(
        e.message,
        "for step has type i32, expected i64 (the induction variable's type)"
    );
    let e = reject(sample_module(), |m| {
        let OpKind::For { step, .. } = &mut f_body(m)[4].kind else {
            unreachable!()
        };
        *step = int(0);
    });
    assert_eq!(e.message, "for step must be positive, found 0");
    let e = reject(sample_module(), |m| {
        let OpKind::While { inits, .. } = &mut f_body(m)[6].kind else {
            unreachable!()
        };
        inits.clear();
    });
    assert_eq!(e.message, "while has 1 iter values but 0 initial values");
    let e = reject(sample_module(), |m| {
        let OpKind::While { body, .. } = &mut f_body(m)[6].kind else {
            unreachable!()
        };
        body.ops[1] = yld(vec![imm(Imm::I1(true))]);
    });
    assert_eq!(e.message, "yield: value 1 has type i1, expected i64");
    let e = reject(sample_module(), |m| {
        // the condition region's %c2 is not visible in the body
        let OpKind::While { body, .. } = &mut f_body(m)[6].kind else {
            unreachable!()
        };
        body.ops[0] = simple(Opcode::Not, &[ValueId(14)], vec![v(ValueId(13))]);
    });
    assert_eq!(e.message, "%c2 is used outside the region that defines it");
}

#[test]
fn deep_nesting_is_bounded_without_overflowing() {
    on_small_stack(|| {
        verify_module(&nested_module(256)).unwrap();
        let e = verify_module(&nested_module(257)).unwrap_err();
        assert_eq!(e.message, "regions nest deeper than 256");
        // far beyond the limit: still an error, not a stack overflow
        let e = verify_module(&nested_module(5000)).unwrap_err();
        assert_eq!(e.message, "regions nest deeper than 256");
    });
}

#[test]
fn program_rules() {
    let m = sample_module();
    let mut g = m.funcs[G as usize].clone();
    g.name = "test.all.g".into();
    let p = Program {
        files: vec!["a.loom".into()],
        funcs: vec![g],
        func_files: vec![0],
        imports: vec![m.decls[2].clone()],
        records: m.records.clone(),
        exports: vec![("g".into(), 0)],
    };
    verify_program(&p).unwrap();

    let mut bad = p.clone();
    bad.exports[0].1 = 3;
    assert_eq!(
        verify_program(&bad).unwrap_err().message,
        "export g names function #3, which is out of range"
    );
    let mut bad = p.clone();
    bad.imports[0].import = None;
    assert_eq!(
        verify_program(&bad).unwrap_err().message,
        "a linked program may only import capabilities (`import(\"...\")`)"
    );
    let mut bad = p.clone();
    bad.funcs[0].tparams = m.funcs[H as usize].tparams.clone();
    assert_eq!(
        verify_program(&bad).unwrap_err().message,
        "a linked program cannot have template parameters"
    );
    let mut bad = p.clone();
    bad.funcs[0].body.ops[0] = simple(Opcode::OpaqueNew, &[ValueId(1)], vec![Operand::TParam(0)]);
    assert_eq!(
        verify_program(&bad).unwrap_err().message,
        "template parameter operand in a linked program"
    );
    let mut bad = p;
    bad.func_files[0] = 1;
    assert_eq!(
        verify_program(&bad).unwrap_err().message,
        "function #0 names file #1, which is out of range"
    );
}
