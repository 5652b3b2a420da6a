//! Golden tests: every `tests/golden/parse/NAME.loom` is parsed and its dump (tree, then rendered
//! diagnostics) compared with `NAME.parse`. `LOOM_BLESS=1 cargo test -p loom-syntax --test golden` rewrites
//! the expected files instead.

use std::path::{Path, PathBuf};

use loom_syntax::{SourceFile, dump, parse};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/golden/parse");

/// The expected-file text for one fixture: the tree dump, a separator, the rendered diagnostics.
fn render(name: &str, text: &str) -> String {
    let (module, diags) = parse(text);
    let source = SourceFile::new(format!("{name}.loom"), text);
    let mut out = dump(&module, &source);
    out.push_str(&format!("-- diagnostics: {}\n", diags.len()));
    for d in &diags {
        out.push_str(&source.render(d));
    }
    out
}

fn fixtures() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(DIR)
        .expect("golden dir exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "loom"))
        .collect();
    v.sort();
    v
}

#[test]
fn golden_parse() {
    let bless = std::env::var("LOOM_BLESS").is_ok_and(|v| v == "1");
    let files = fixtures();
    assert!(files.len() >= 10, "expected the golden fixtures in {DIR}");
    let mut failures = Vec::new();
    for path in &files {
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("?");
        let text = std::fs::read_to_string(path).expect("fixture is UTF-8");
        let got = render(name, &text);
        let expected_path = Path::new(DIR).join(format!("{name}.parse"));
        if bless {
            std::fs::write(&expected_path, &got).expect("write expected file");
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if expected != got {
            failures.push(format!(
                "--- {name}.parse (expected)\n{expected}\n--- got\n{got}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} golden file(s) differ (rerun with LOOM_BLESS=1 to accept):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Fixtures whose name starts with `ok_` or that are listed here must parse without diagnostics.
#[test]
fn valid_fixtures_have_no_diagnostics() {
    for path in fixtures() {
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("?");
        if !name.starts_with("ok_") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("fixture is UTF-8");
        let (_, diags) = parse(&text);
        let source = SourceFile::new(format!("{name}.loom"), text.as_str());
        let rendered: Vec<String> = diags.iter().map(|d| source.render(d)).collect();
        assert!(diags.is_empty(), "{name}: {}", rendered.join(""));
    }
}
