//! The canonical text printer: exact output.

mod common;

use common::*;
use loom_ir::*;

#[test]
fn sample_module_prints_canonically() {
    let text = print_module(&sample_module());
    if text != SAMPLE_TEXT {
        // a line diff is far easier to read than one giant string
        for (i, (a, b)) in text.lines().zip(SAMPLE_TEXT.lines()).enumerate() {
            assert_eq!(a, b, "line {}", i + 1);
        }
        assert_eq!(text, SAMPLE_TEXT);
    }
}

#[test]
fn tiny_module_prints_canonically() {
    let expected =
        "module @m {\n  func @f(%a: i64) -> i64 {\n    %0 = add %a, 1\n    return %0\n  }\n}\n";
    assert_eq!(print_module(&tiny_module()), expected);
}

#[test]
fn empty_module_and_groups() {
    let mut m = Module {
        name: "e".into(),
        ..Module::default()
    };
    assert_eq!(print_module(&m), "module @e {\n}\n");
    m.consts.push(Const {
        name: "A".into(),
        exported: false,
        value: Imm::F64(1e21),
        loc: Loc::default(),
    });
    m.consts.push(Const {
        name: "B".into(),
        exported: false,
        value: Imm::F64(-0.0),
        loc: Loc::default(),
    });
    assert_eq!(
        print_module(&m),
        "module @e {\n  const @A: f64 = 1e21\n  const @B: f64 = -0.0\n}\n"
    );
}

#[test]
fn unverified_ir_prints_without_panicking() {
    let mut m = tiny_module();
    m.funcs[0].params = vec![ValueId(99)];
    m.funcs[0].body.ops[0].results = vec![ValueId(7)];
    m.funcs[0].body.ops.push(call(
        Callee::Func(42),
        vec![("X", TArg::Forward(3))],
        vec![Operand::Field(9, 9)],
        &[],
    ));
    let text = print_module(&m);
    assert!(text.contains("<bad value 99>"), "{text}");
    assert!(
        text.contains("call <bad function 42><X = <bad template parameter 3>>(<bad field 9.9>)"),
        "{text}"
    );
}

#[test]
fn program_prints_for_debugging() {
    let m = tiny_module();
    let p = Program {
        files: vec!["m.loom".into()],
        funcs: vec![Function {
            name: "m.f".into(),
            ..m.funcs[0].clone()
        }],
        func_files: vec![0],
        imports: vec![],
        records: vec![],
        exports: vec![("f".into(), 0)],
    };
    verify_program(&p).unwrap();
    let text = print_program(&p);
    assert!(text.contains("// export f = @m.f"), "{text}");
    assert!(text.contains("func @m.f(%a: i64) -> i64 {"), "{text}");
}
