//! `tests/golden/link/CASE/`: `main.loom` plus any other `*.loom` files form the catalog; the first line of
//! `main.loom` may say `// role: prepare|control|test|all` and `// roots: a b`. The expected output
//! `expected.out` is the linked closure (`print_program`) or the rendered link errors.

use loom_compiler::{Catalog, Role};
use loom_tests::{check_golden, files_with_ext, repo_root};

fn role(name: &str) -> Role {
    match name {
        "prepare" => serve_runtime::abi::prepare_role(),
        "control" => serve_runtime::abi::control_role(),
        "test" => Role::new("test", &["test"]),
        _ => Role::new(
            "all",
            &[
                "prepare",
                "input",
                "options",
                "runner",
                "parameters",
                "test",
            ],
        ),
    }
}

fn link_case(dir: &std::path::Path) -> String {
    let main_path = dir.join("main.loom");
    let main = std::fs::read_to_string(&main_path).expect("main.loom is readable");
    let header = |key: &str| {
        main.lines()
            .take(3)
            .find_map(|l| {
                l.strip_prefix(&format!("// {key}:"))
                    .map(|v| v.trim().to_string())
            })
            .unwrap_or_default()
    };
    let mut cat = Catalog::with_ref_types(serve_runtime::abi::ref_types());
    let mut out = String::new();
    let primary = match cat.add_source("main.loom", &main) {
        Ok((i, _)) => i,
        Err(e) => return e.to_string(),
    };
    for lib in files_with_ext(dir, "loom") {
        let name = lib
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("?")
            .to_string();
        if name == "main.loom" {
            continue;
        }
        let text = std::fs::read_to_string(&lib).expect("library is readable");
        // Libraries are also exercised as bytecode: a `.loombc` must link exactly like its source.
        let added = if name.starts_with("bc_") {
            let m = loom_compiler::compile_text_for(&name, &text, &serve_runtime::abi::ref_types())
                .0
                .expect("bc_ library compiles");
            let bc = loom_ir::bytecode::encode(&m);
            cat.add_bytecode(&name.replace(".loom", ".loombc"), &bc)
                .map(|_| ())
        } else {
            cat.add_source(&name, &text).map(|_| ())
        };
        if let Err(e) = added {
            out.push_str(&e.to_string());
        }
    }
    let roots_line = header("roots");
    let roots: Vec<&str> = roots_line.split_whitespace().collect();
    match loom_compiler::link(&cat, primary, &roots, &role(&header("role"))) {
        Ok(p) => out.push_str(&loom_ir::print::print_program(&p)),
        Err(errors) => errors.iter().for_each(|e| out.push_str(&e.to_string())),
    }
    out
}

#[test]
fn golden_link() {
    let root = repo_root().join("tests/golden/link");
    let mut cases: Vec<_> = std::fs::read_dir(&root)
        .expect("tests/golden/link exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    assert!(
        cases.len() >= 6,
        "expected the link fixtures in {}",
        root.display()
    );
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|dir| check_golden(&dir.join("expected.out"), &link_case(dir)))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
