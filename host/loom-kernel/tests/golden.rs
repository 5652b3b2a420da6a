//! `tests/golden/kernel/*.loom`: each fixture with a `// specialize: STAGE KEY=VALUE...` first line is
//! specialized (its catalog holds the motif library and every fixture module) and its dump plus reflection,
//! or its rendered diagnostics, must equal `NAME.out`. `LOOM_BLESS=1` rewrites the `.out` files.

mod common;

use common::*;
use loom_ir::TValue;
use std::path::Path;

fn parse_config(words: &[&str]) -> Vec<(String, TValue)> {
    words
        .iter()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| {
            let value = if let Ok(i) = v.parse::<i64>() {
                TValue::I64(i)
            } else if v == "true" || v == "false" {
                TValue::Bool(v == "true")
            } else if let Some(s) = v.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
                TValue::Str(s.to_string())
            } else {
                TValue::DType(v.to_string())
            };
            (k.to_string(), value)
        })
        .collect()
}

fn check_golden(path: &Path, actual: &str) -> Option<String> {
    if std::env::var_os("LOOM_BLESS").is_some() {
        std::fs::write(path, actual).expect("golden file is writable");
        return None;
    }
    let expected = std::fs::read_to_string(path).unwrap_or_default();
    (expected != actual).then(|| {
        format!("{}: output differs (LOOM_BLESS=1 rewrites it)\n--- expected\n{expected}\n--- actual\n{actual}", path.display())
    })
}

#[test]
fn golden_kernel() {
    let dir = repo_root().join("host/loom-kernel/tests/golden/kernel");
    let files = loom_files(&dir);
    assert!(
        files.len() >= 10,
        "expected the kernel fixtures in {}",
        dir.display()
    );
    let mut cat = motif_catalog();
    let mut cases = Vec::new();
    for path in &files {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("?")
            .to_string();
        let text = std::fs::read_to_string(path).expect("fixture is readable");
        let (idx, _) = cat
            .add_source(&name, &text)
            .unwrap_or_else(|e| panic!("{name} does not compile:\n{e}"));
        let first = text.lines().next().unwrap_or("");
        if let Some(spec) = first.strip_prefix("// specialize:") {
            let words: Vec<&str> = spec.split_whitespace().collect();
            if let Some((stage, rest)) = words.split_first() {
                cases.push((path.clone(), idx, stage.to_string(), parse_config(rest)));
            }
        }
    }
    let mut failures = Vec::new();
    for (path, idx, stage, config) in cases {
        let actual = match loom_kernel::specialize_stage(&cat, idx, &stage, &config) {
            Ok(s) => format!(
                "{}\n--- reflection\n{}",
                loom_kernel::dump_stage(&s),
                loom_kernel::dump_reflection(&loom_kernel::reflect(&s))
            ),
            Err(e) => e.concat(),
        };
        if let Some(f) = check_golden(&path.with_extension("out"), &actual) {
            failures.push(f);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
