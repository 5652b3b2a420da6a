//! `tests/golden/compile/*.loom`: each compiles to either its canonical text (the disassembly of its bytecode)
//! or its rendered diagnostics, stored in `NAME.out`. For every fixture that compiles, the round trip holds:
//! text -> .loombc -> canonical text -> .loombc gives identical bytes and identical text, and a fixture whose name
//! starts with `canonical_` is already in canonical form (text -> .loombc -> text is the identity).

use loom_tests::{check_golden, files_with_ext, repo_root};

fn compile(name: &str, text: &str) -> Result<loom_ir::Module, String> {
    // Compiled against the server's host vocabulary (its reference types), as packages are.
    match loom_compiler::compile_text_for(name, text, &serve_runtime::abi::ref_types()) {
        (Some(m), warnings) => {
            if warnings.is_empty() {
                Ok(m)
            } else {
                Err(format!("warnings:\n{}", warnings.concat()))
            }
        }
        (None, diags) => Err(diags.concat()),
    }
}

/// Checks the bytecode round trip of one compiled module; returns the canonical text.
///
/// Source locations are part of the bytecode (traps report them), so a non-canonical source gives other bytes
/// than its canonical text; from the canonical text on, everything is a fixed point.
fn round_trip(name: &str, m: &loom_ir::Module) -> Result<String, String> {
    loom_ir::verify::verify_module(m)
        .map_err(|e| format!("{name}: compiled module does not verify: {e}"))?;
    let bytes = loom_ir::bytecode::encode(m);
    let decoded =
        loom_ir::bytecode::decode(&bytes).map_err(|e| format!("{name}: decode failed: {e}"))?;
    if decoded != *m {
        return Err(format!("{name}: decode(encode(m)) != m"));
    }
    if loom_ir::bytecode::encode(&decoded) != bytes {
        return Err(format!("{name}: encode(decode(b)) != b"));
    }
    let text = loom_ir::print::print_module(&decoded);
    let canon = compile(name, &text)
        .map_err(|e| format!("{name}: canonical text does not compile:\n{e}\n{text}"))?;
    let canon_bytes = loom_ir::bytecode::encode(&canon);
    let canon_text = loom_ir::print::print_module(
        &loom_ir::bytecode::decode(&canon_bytes).map_err(|e| e.to_string())?,
    );
    if canon_text != text {
        return Err(format!(
            "{name}: printing is not stable\n--- first\n{text}\n--- second\n{canon_text}"
        ));
    }
    let again = compile(name, &canon_text).map_err(|e| format!("{name}: {e}"))?;
    if loom_ir::bytecode::encode(&again) != canon_bytes {
        return Err(format!(
            "{name}: canonical text -> .loombc -> text -> .loombc changed the bytes\n{text}"
        ));
    }
    Ok(text)
}

#[test]
fn golden_compile() {
    let dir = repo_root().join("tests/golden/compile");
    let files = files_with_ext(&dir, "loom");
    assert!(
        files.len() >= 10,
        "expected the compile fixtures in {}",
        dir.display()
    );
    let mut failures = Vec::new();
    for path in files {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("?")
            .to_string();
        let text = std::fs::read_to_string(&path).expect("fixture is readable");
        let actual = match compile(&name, &text) {
            Ok(m) => match round_trip(&name, &m) {
                Ok(canonical) => {
                    if name.starts_with("canonical_") && canonical != text {
                        failures.push(format!(
                            "{name}: not canonical\n--- source\n{text}\n--- canonical\n{canonical}"
                        ));
                    }
                    canonical
                }
                Err(e) => {
                    failures.push(e);
                    continue;
                }
            },
            Err(diags) => diags,
        };
        if let Some(f) = check_golden(&path.with_extension("out"), &actual) {
            failures.push(f);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The example programs shipped in `packages/examples` compile and round-trip too.
#[test]
fn examples_round_trip() {
    for path in files_with_ext(&repo_root().join("packages/examples"), "loom") {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(&path).expect("example is readable");
        let m = compile(&name, &text).unwrap_or_else(|e| panic!("{name} does not compile:\n{e}"));
        round_trip(&name, &m).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Every fixture that compiles also links and loads in the VM: the VM's lowering accepts everything the
/// compiler produces. Imports are bound to stand-in natives that fail if called (nothing is invoked here).
#[test]
fn compiled_fixtures_load_in_the_vm() {
    use std::sync::Arc;
    let role = loom_compiler::Role::new(
        "all",
        &[
            "prepare",
            "input",
            "options",
            "runner",
            "parameters",
            "test",
        ],
    );
    let dirs = [
        repo_root().join("tests/golden/compile"),
        repo_root().join("packages/examples"),
    ];
    let mut loaded = 0;
    for path in dirs.iter().flat_map(|d| files_with_ext(d, "loom")) {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(&path).expect("fixture is readable");
        let mut cat = loom_compiler::Catalog::new();
        let Ok((primary, _)) = cat.add_source(&name, &text) else {
            continue;
        };
        // Fixtures that reference other modules (templates.loom) do not link alone; link_* goldens cover linking.
        let Ok(program) = loom_compiler::link(&cat, primary, &[], &role) else {
            continue;
        };
        let mut natives: Vec<(String, loom_vm::NativeModule)> = Vec::new();
        for d in &program.imports {
            let module = d.import.clone().expect("program imports are capabilities");
            let (_, func) = d.split_symbol();
            let idx = match natives.iter().position(|(n, _)| *n == module) {
                Some(i) => i,
                None => {
                    natives.push((module.clone(), loom_vm::NativeModule::new(&module)));
                    natives.len() - 1
                }
            };
            let m = std::mem::replace(&mut natives[idx].1, loom_vm::NativeModule::new(&module));
            natives[idx].1 = m.func(func, d.sig.clone(), 1, |_, _| {
                Err(loom_vm::NativeError::failed("stand-in"))
            });
        }
        let natives: Vec<Arc<loom_vm::NativeModule>> =
            natives.into_iter().map(|(_, m)| Arc::new(m)).collect();
        let granted: Vec<&str> = role.grants.iter().map(String::as_str).collect();
        loom_vm::Vm::load(
            &program,
            &natives,
            &granted,
            &loom_vm::LoadLimits::default(),
        )
        .unwrap_or_else(|e| panic!("{name}: the VM rejects a compiled program: {e}"));
        loaded += 1;
    }
    assert!(loaded >= 8, "only {loaded} fixtures loaded");
}
