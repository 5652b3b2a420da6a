//! Unit tests for the lexer and parser internals: literal round-trips, the `-` rule, escapes, spans.

use proptest::prelude::*;

use crate::ast::{ConstExpr, Expr, Item, Operand, Stmt};
use crate::lexer::{TokKind, lex};
use crate::{Span, parse};

fn kinds(text: &str) -> Vec<TokKind> {
    let mut diags = Vec::new();
    let toks = lex(text, &mut diags);
    assert!(diags.is_empty(), "{text:?}: {diags:?}");
    toks.into_iter()
        .map(|t| t.kind)
        .filter(|k| *k != TokKind::Eof)
        .collect()
}

fn texts(text: &str) -> Vec<String> {
    let mut diags = Vec::new();
    lex(text, &mut diags)
        .into_iter()
        .filter(|t| t.kind != TokKind::Eof)
        .map(|t| t.text.to_string())
        .collect()
}

/// The single literal token of `text`.
fn one(text: &str) -> TokKind {
    let k = kinds(text);
    assert_eq!(k.len(), 1, "{text:?} -> {k:?}");
    k[0].clone()
}

proptest! {
    #[test]
    fn f64_debug_round_trips(x in any::<f64>().prop_filter("finite", |x| x.is_finite())) {
        let text = format!("{x:?}");
        match one(&text) {
            TokKind::Float(Some(v)) => prop_assert_eq!(v.to_bits(), x.to_bits(), "{}", text),
            // `{:?}` never prints an integer-looking float, but be exact about what we got
            other => prop_assert!(false, "{} -> {:?}", text, other),
        }
    }

    #[test]
    fn f32_debug_round_trips(x in any::<f32>().prop_filter("finite", |x| x.is_finite())) {
        let text = format!("{x:?}");
        match one(&text) {
            TokKind::Float(Some(v)) => prop_assert_eq!((v as f32).to_bits(), x.to_bits(), "{}", text),
            other => prop_assert!(false, "{} -> {:?}", text, other),
        }
    }

    #[test]
    fn i64_round_trips(x in any::<i64>()) {
        prop_assert_eq!(one(&x.to_string()), TokKind::Int(Some(x)));
        let hex = if x < 0 { format!("-0x{:x}", x.unsigned_abs()) } else { format!("0x{x:x}") };
        prop_assert_eq!(one(&hex), TokKind::Int(Some(x)));
    }
}

#[test]
fn float_edge_forms() {
    for (text, v) in [
        ("1.5", 1.5),
        ("-0.25", -0.25),
        ("1e-3", 1e-3),
        ("1e16", 1e16),
        ("2.5E+7", 2.5e7),
        ("1_000.5", 1000.5),
        ("5e-324", 5e-324),
        ("1.7976931348623157e308", f64::MAX),
    ] {
        assert_eq!(one(text), TokKind::Float(Some(v)), "{text}");
    }
    assert_eq!(one("-0.0"), TokKind::Float(Some(-0.0)));
    assert!(matches!(one("-0.0"), TokKind::Float(Some(v)) if v.is_sign_negative()));
}

#[test]
fn integer_edges() {
    assert_eq!(one("-9223372036854775808"), TokKind::Int(Some(i64::MIN)));
    assert_eq!(one("9223372036854775807"), TokKind::Int(Some(i64::MAX)));
    assert_eq!(one("-0x8000000000000000"), TokKind::Int(Some(i64::MIN)));
    assert_eq!(one("1_000"), TokKind::Int(Some(1000)));
    assert_eq!(one("0XFF"), TokKind::Int(Some(255)));
    for bad in [
        "9223372036854775808",
        "-9223372036854775809",
        "0x8000000000000000",
        "0x",
        "12ab",
    ] {
        let mut diags = Vec::new();
        let toks = lex(bad, &mut diags);
        assert_eq!(diags.len(), 1, "{bad}");
        assert_eq!(toks[0].kind, TokKind::Int(None), "{bad}");
        assert_eq!(diags[0].span, Span::new(0, bad.len()), "{bad}");
    }
}

#[test]
fn minus_is_a_sign_or_an_operator() {
    assert_eq!(texts("N-1"), ["N", "-", "1"]);
    assert_eq!(texts("N - 1"), ["N", "-", "1"]);
    assert_eq!(texts("N -1"), ["N", "-1"]);
    assert_eq!(
        texts("(2)-1 x[0]-1 %v-1 @c-1"),
        [
            "(", "2", ")", "-", "1", "x", "[", "0", "]", "-", "1", "%v", "-", "1", "@c", "-", "1"
        ]
    );
    assert_eq!(texts("return -1, -2.5"), ["return", "-1", ",", "-2.5"]);
    assert_eq!(
        texts("2*-1 a->b -x"),
        ["2", "*", "-1", "a", "->", "b", "-", "x"]
    );
}

#[test]
fn words_symbols_values_refs() {
    assert_eq!(
        texts("func.decl buffer.load.i64 @m.f %0 %acc_1 !hal.buffer ?!x a.  b"),
        [
            "func.decl",
            "buffer.load.i64",
            "@m.f",
            "%0",
            "%acc_1",
            "!hal.buffer",
            "?",
            "!x",
            "a",
            ".",
            "b"
        ]
    );
    assert_eq!(texts("a % b // comment\n%"), ["a", "%", "b", "%"]);
}

#[test]
fn string_escapes() {
    let s = |text: &str| match one(text) {
        TokKind::Str { value, ok: true } => value,
        other => panic!("{text}: {other:?}"),
    };
    assert_eq!(s(r#""a\n\t\r\\\"\0""#), "a\n\t\r\\\"\0");
    assert_eq!(
        s(r#""\x41\x7f\u{e9}\u{10FFFF}""#),
        "A\u{7f}\u{e9}\u{10FFFF}"
    );
    for bad in [
        r#""\q""#,
        r#""\x80""#,
        r#""\xg0""#,
        r#""\u{}""#,
        r#""\u{d800}""#,
        r#""\u{110000}""#,
        "\"open",
        "\"a\\",
    ] {
        let mut diags = Vec::new();
        let toks = lex(bad, &mut diags);
        assert_eq!(diags.len(), 1, "{bad}: {diags:?}");
        assert!(
            matches!(toks[0].kind, TokKind::Str { ok: false, .. }),
            "{bad}"
        );
    }
}

#[test]
fn unknown_runs_are_one_diagnostic() {
    let mut diags = Vec::new();
    let toks = lex("a $#é& b", &mut diags);
    assert_eq!(diags.len(), 1);
    assert_eq!(toks.len(), 4); // a, unknown, b, eof
    assert_eq!(toks[1].text, "$#é&");
}

#[test]
fn spans_point_at_the_source() {
    let text = "module @m {\n  func @f(%a: i64) -> i64 {\n    %x = add mul(%a, 2), -1\n    return %x\n  }\n}\n";
    let (m, diags) = parse(text);
    assert!(diags.is_empty(), "{diags:?}");
    let at = |s: Span| &text[s.start as usize..s.end as usize];
    let Some(Item::Func(f)) = m.items.first() else {
        panic!("{m:?}")
    };
    assert_eq!(at(f.name.span), "@f");
    assert_eq!(f.name.text, "f");
    assert_eq!(at(f.params[0].name.span), "%a");
    assert_eq!(at(f.params[0].ty.span()), "i64");
    assert!(at(f.span).starts_with("func @f") && at(f.span).ends_with('}'));
    let Stmt::Let {
        results,
        expr:
            Expr::Op {
                name,
                operands,
                span,
                ..
            },
        ..
    } = &f.body.stmts[0]
    else {
        panic!("{:?}", f.body.stmts[0])
    };
    assert_eq!(at(results[0].span), "%x");
    assert_eq!(at(name.span), "add");
    assert_eq!(at(*span), "add mul(%a, 2), -1");
    assert_eq!(at(operands[0].span()), "mul(%a, 2)");
    assert!(matches!(operands[1], Operand::Int(-1, _)));
    assert_eq!(at(operands[1].span()), "-1");
}

#[test]
fn const_subtraction_forms() {
    for text in ["N-1", "N - 1", "N -1"] {
        let src = format!("module @m {{ const @C: i64 = {text} }}");
        let (m, diags) = parse(&src);
        assert!(diags.is_empty(), "{text}: {diags:?}");
        let Some(Item::Const(c)) = m.items.first() else {
            panic!()
        };
        let ConstExpr::Binary { op: '-', rhs, .. } = &c.value else {
            panic!("{text}: {:?}", c.value)
        };
        assert!(matches!(**rhs, ConstExpr::Int(1, _)), "{text}: {rhs:?}");
        assert_eq!(
            &src[rhs.span().start as usize..rhs.span().end as usize],
            "1"
        );
    }
}

#[test]
fn zero_operand_ops_end_at_the_line() {
    let text = "module @m {\n func @f() {\n  %l = list.empty\n  trap \"x\"\n  %a = f\n  %b, %c = g N\n  return\n }\n}";
    let (m, diags) = parse(text);
    assert!(diags.is_empty(), "{diags:?}");
    let Some(Item::Func(f)) = m.items.first() else {
        panic!()
    };
    assert_eq!(f.body.stmts.len(), 5);
    let Stmt::Let {
        expr: Expr::Op { operands, .. },
        ..
    } = &f.body.stmts[0]
    else {
        panic!()
    };
    assert!(operands.is_empty());
}
