//! The whole host pipeline (parse -> compile -> link -> VM load -> invoke under small limits) never panics on
//! mutated programs: uploaded packages are untrusted, so every stage must answer with diagnostics or traps.

use loom_compiler::{Catalog, Role};
use loom_tests::{files_with_ext, repo_root};
use proptest::prelude::*;
use std::sync::Arc;

fn corpus() -> Vec<String> {
    let mut out = Vec::new();
    for dir in ["tests/golden/compile", "packages/examples"] {
        for p in files_with_ext(&repo_root().join(dir), "loom") {
            out.push(std::fs::read_to_string(p).expect("fixture is readable"));
        }
    }
    out
}

/// Splits into whitespace-separated tokens, keeping line structure, so mutations stay close to real programs.
fn tokens(text: &str) -> Vec<String> {
    text.split_inclusive(|c: char| c.is_whitespace())
        .map(str::to_string)
        .collect()
}

/// Runs everything that can run; panics only if a stage panics.
fn pipeline(text: &str) {
    let role = Role::new(
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
    let mut cat = Catalog::new();
    let Ok((primary, _)) = cat.add_source("mutant.loom", text) else {
        return;
    };
    let bytes = loom_ir::bytecode::encode(&cat.entries()[primary].module);
    let decoded = loom_ir::bytecode::decode(&bytes).expect("our own encoding decodes");
    let _ = loom_ir::print::print_module(&decoded);
    let Ok(program) = loom_compiler::link(&cat, primary, &[], &role) else {
        return;
    };
    let test = Arc::new(loom_vm::testing::test_module(Some(Default::default())));
    let Ok(loaded) = loom_vm::Vm::load(
        &program,
        &[test],
        &["test"],
        &loom_vm::LoadLimits::default(),
    ) else {
        return;
    };
    let limits = loom_vm::InvokeLimits {
        fuel: 20_000,
        memory_bytes: 1 << 20,
        call_depth: 64,
        ..Default::default()
    };
    for name in loaded.exports() {
        let Some(sig) = loaded.signature(&name) else {
            continue;
        };
        // Zero-ish arguments of the right types where the types are simple; skip the rest.
        let args: Option<Vec<loom_vm::Value>> = sig
            .params
            .iter()
            .map(|t| match t {
                loom_ir::Type::I1 => Some(loom_vm::Value::I1(false)),
                loom_ir::Type::I32 => Some(loom_vm::Value::I32(3)),
                loom_ir::Type::I64 => Some(loom_vm::Value::I64(3)),
                loom_ir::Type::F32 => Some(loom_vm::Value::F32(0.5)),
                loom_ir::Type::F64 => Some(loom_vm::Value::F64(0.5)),
                loom_ir::Type::Str => Some(loom_vm::Value::str("x")),
                loom_ir::Type::Buffer => Some(loom_vm::Value::buffer(vec![0; 64])),
                _ => None,
            })
            .collect();
        if let Some(args) = args {
            let _ = loaded.invoke(&name, &args, &limits);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn mutated_programs_never_panic(
        file in any::<prop::sample::Index>(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), 0u8..4, any::<prop::sample::Index>()), 1..4),
    ) {
        let corpus = corpus();
        let mut toks = tokens(&corpus[file.index(corpus.len())]);
        for (at, kind, other) in edits {
            if toks.is_empty() {
                break;
            }
            let i = at.index(toks.len());
            let j = other.index(toks.len());
            match kind {
                0 => { toks.remove(i); }
                1 => { let t = toks[j].clone(); toks.insert(i, t); }
                2 => toks.swap(i, j),
                _ => { let t = toks[j].clone(); toks[i] = t; }
            }
        }
        pipeline(&toks.concat());
    }
}

/// Every unmutated fixture goes through the pipeline too (as a baseline that the harness itself is sound).
#[test]
fn corpus_runs_through_the_pipeline() {
    for text in corpus() {
        pipeline(&text);
    }
}
