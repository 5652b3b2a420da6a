//! Robustness: the parser never panics, always terminates, reports deep nesting instead of overflowing the
//! stack, and keeps its diagnostics' spans inside the text. Inputs: arbitrary strings, arbitrary bytes
//! (lossy UTF-8), and the golden fixtures with random token and character mutations.

use loom_syntax::{Diagnostic, SourceFile, parse};
use proptest::prelude::*;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/golden/parse");

/// Every golden fixture's text (valid and invalid ones).
fn fixtures() -> Vec<String> {
    let mut paths: Vec<_> = std::fs::read_dir(DIR)
        .expect("golden dir exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "loom"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| std::fs::read_to_string(p).expect("fixture is UTF-8"))
        .collect()
}

/// Parses, then checks what must hold for any input: spans inside the text, rendering works.
fn check(text: &str) -> Vec<Diagnostic> {
    let (_module, diags) = parse(text);
    let source = SourceFile::new("fuzz.loom", text);
    for d in &diags {
        assert!(d.span.start <= d.span.end, "inverted span in {d:?}");
        assert!(
            d.span.end as usize <= text.len(),
            "span past the end in {d:?}"
        );
        assert!(!d.message.is_empty());
        let _ = source.render(d);
    }
    diags
}

/// Splits text into pieces: runs of whitespace, words/numbers/sigiled names, and single other characters,
/// so that mutations act on whole tokens.
fn pieces(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut cur = String::new();
    let class = |c: char| {
        if c.is_whitespace() {
            0
        } else if c.is_alphanumeric() || matches!(c, '_' | '.' | '@' | '%' | '!') {
            1
        } else {
            2
        }
    };
    for c in text.chars() {
        let joins = cur
            .chars()
            .last()
            .is_some_and(|l| class(l) == class(c) && class(c) != 2);
        if !joins && !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
        }
        cur.push(c);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

const VOCAB: &[&str] = &[
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    "<",
    ">",
    ",",
    ":",
    "=",
    "->",
    "?",
    "-",
    "+",
    "*",
    "/",
    "%",
    "-1",
    "0x",
    "1e",
    "\"",
    "\"\\",
    "\\u{",
    "%x",
    "@f",
    "!r",
    "N",
    "func",
    "func.decl",
    "export",
    "type",
    "record",
    "const",
    "kernel",
    "stage",
    "module",
    "return",
    "yield",
    "condition",
    "call",
    "if",
    "else",
    "for",
    "to",
    "step",
    "iter",
    "while",
    "do",
    "list",
    "i64",
    "true",
    "null",
    "import",
    "\n",
    " ",
    "//",
    "é",
    "\0",
];

#[derive(Clone, Debug)]
enum Mutation {
    Delete(usize),
    Insert(usize, usize),
    Replace(usize, usize),
    Duplicate(usize),
    Swap(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::Delete),
        (any::<usize>(), 0..VOCAB.len()).prop_map(|(i, v)| Mutation::Insert(i, v)),
        (any::<usize>(), 0..VOCAB.len()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        any::<usize>().prop_map(Mutation::Duplicate),
        (any::<usize>(), any::<usize>()).prop_map(|(i, j)| Mutation::Swap(i, j)),
    ]
}

fn mutate(text: &str, muts: &[Mutation]) -> String {
    let mut p = pieces(text);
    for m in muts {
        if p.is_empty() {
            p.push(String::new());
        }
        let n = p.len();
        match *m {
            Mutation::Delete(i) => {
                p.remove(i % n);
            }
            Mutation::Insert(i, v) => p.insert(i % (n + 1), VOCAB[v].to_string()),
            Mutation::Replace(i, v) => p[i % n] = VOCAB[v].to_string(),
            Mutation::Duplicate(i) => {
                let x = p[i % n].clone();
                p.insert(i % n, x);
            }
            Mutation::Swap(i, j) => p.swap(i % n, j % n),
        }
    }
    p.concat()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn never_panics_on_arbitrary_strings(text in ".{0,400}") {
        check(&text);
    }

    #[test]
    fn never_panics_on_loom_like_strings(text in "[a-z@%!\"\\\\(){}\\[\\]<>,:=?+*/ \n0-9.eEx_-]{0,300}") {
        check(&text);
    }

    #[test]
    fn never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        check(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn never_panics_on_mutated_fixtures(
        which in any::<usize>(),
        muts in proptest::collection::vec(mutation(), 1..8),
    ) {
        let all = fixtures();
        let text = mutate(&all[which % all.len()], &muts);
        check(&text);
    }

    #[test]
    fn never_panics_on_char_edits(
        which in any::<usize>(),
        edits in proptest::collection::vec((any::<usize>(), any::<char>(), any::<bool>()), 1..6),
    ) {
        let all = fixtures();
        let mut chars: Vec<char> = all[which % all.len()].chars().collect();
        for (at, c, insert) in edits {
            let n = chars.len().max(1);
            if insert || chars.is_empty() {
                chars.insert(at % (chars.len() + 1), c);
            } else {
                chars.remove(at % n);
            }
        }
        let text: String = chars.into_iter().collect();
        check(&text);
    }

    /// Truncating a valid program anywhere gives diagnostics, never a panic, and (except at the very end
    /// or inside a trailing comment) at least one diagnostic.
    #[test]
    fn truncated_fixtures_report(which in any::<usize>(), cut in any::<usize>()) {
        let all = fixtures();
        let text = &all[which % all.len()];
        let cut = text.char_indices().map(|(i, _)| i).nth(cut % text.chars().count().max(1)).unwrap_or(0);
        check(&text[..cut]);
    }
}

/// Runs `f` on a thread with a deliberately small stack, so that unbounded recursion fails the test
/// instead of depending on the test harness's stack size.
fn on_small_stack(f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(f)
        .expect("spawn")
        .join()
        .expect("parse on a 1 MiB stack");
}

fn assert_too_deep(text: String) {
    on_small_stack(move || {
        let diags = check(&text);
        assert!(
            diags.iter().any(|d| d.message.contains("nesting too deep")),
            "no nesting diagnostic among {:?}",
            diags.iter().map(|d| &d.message).collect::<Vec<_>>()
        );
        // one report, not one per level
        assert!(diags.len() < 20, "{} diagnostics", diags.len());
    });
}

const DEEP: usize = 100_000;

#[test]
fn deep_parens_in_const_expr() {
    let text = format!(
        "module @m {{ const @X: i64 = {}1{} }}",
        "(".repeat(DEEP),
        ")".repeat(DEEP)
    );
    assert_too_deep(text);
}

#[test]
fn deep_unclosed_parens() {
    assert_too_deep(format!("module @m {{ const @X: i64 = {}", "(".repeat(DEEP)));
}

#[test]
fn deep_blocks_in_function() {
    let text = format!("module @m {{ func @f() {{ {} }} }}", "{".repeat(DEEP));
    on_small_stack(move || {
        let diags = check(&text);
        assert!(!diags.is_empty());
    });
    // `{` cannot start a statement; deeply nested `if`s are the real nesting of blocks
    let text = format!(
        "module @m {{ func @f(%c: i1) {{ {} return }} }}",
        "if %c { ".repeat(DEEP)
    );
    assert_too_deep(text);
}

#[test]
fn deep_braces_everywhere() {
    assert_too_deep(format!("module @m {{ kernel @k() {} ", "{".repeat(DEEP)));
    assert_too_deep(format!(
        "module @m {{ kernel @k() {}{} }}",
        "{(".repeat(DEEP / 2),
        ")}".repeat(DEEP / 2)
    ));
    on_small_stack(|| {
        check(&"{".repeat(DEEP));
        check(&"}".repeat(DEEP));
        check(&"((((".repeat(DEEP / 4));
    });
}

#[test]
fn deep_nested_operands() {
    let text = format!(
        "module @m {{ func @f() {{ %x = add {}1{}\n return }} }}",
        "f(".repeat(DEEP),
        ")".repeat(DEEP)
    );
    assert_too_deep(text);
}

#[test]
fn deep_types_lists_and_negations() {
    assert_too_deep(format!(
        "module @m {{ func @f(%x: {}i64{}) {{ return }} }}",
        "list<".repeat(DEEP),
        ">".repeat(DEEP)
    ));
    assert_too_deep(format!(
        "module @m {{ const @X: i64 = {}1{} }}",
        "[".repeat(DEEP),
        "]".repeat(DEEP)
    ));
    assert_too_deep(format!(
        "module @m {{ const @X: i64 = {}1 }}",
        "- ".repeat(DEEP)
    ));
}

#[test]
fn long_operator_chains_are_bounded() {
    // a left-leaning chain is built in a loop, but dropping it recurses on its height
    assert_too_deep(format!(
        "module @m {{ const @X: i64 = 1{} }}",
        " + 1".repeat(DEEP)
    ));
    assert_too_deep(format!(
        "module @m {{ const @X: i64 = {}1{} }}",
        "(1 + ".repeat(DEEP / 2),
        ")".repeat(DEEP / 2)
    ));
}

#[test]
fn huge_flat_inputs_are_fine() {
    on_small_stack(|| {
        let body = "  %x = add %a, 1\n".repeat(50_000);
        let text = format!("module @m {{ func @f(%a: i64) {{\n{body}  return\n}} }}");
        assert!(check(&text).is_empty());
        let many = format!(
            "module @m {{ func @f() {{ %x = f {} }} }}",
            "1, ".repeat(100_000)
        );
        check(&many);
        // garbage: the diagnostics are capped
        let junk = "$ ".repeat(100_000);
        let diags = check(&junk);
        assert!(diags.len() <= 501, "{}", diags.len());
        assert!(
            diags
                .last()
                .is_some_and(|d| d.message.starts_with("too many errors"))
        );
    });
}
