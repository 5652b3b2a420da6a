//! Shared helpers: catalogs of the motif library and of golden fixtures.

#![allow(dead_code, unreachable_pub)]

use loom_compiler::Catalog;
use loom_ir::TValue;
use std::path::{Path, PathBuf};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn loom_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.retain(|p| p.extension().is_some_and(|e| e == "loom"));
    v.sort();
    v
}

/// A catalog holding every motif module.
pub fn motif_catalog() -> Catalog {
    let mut cat = Catalog::new();
    for p in loom_files(&repo_root().join("packages/motifs")) {
        let text = std::fs::read_to_string(&p).expect("motif is readable");
        let name = format!(
            "motifs/{}",
            p.file_name().and_then(|n| n.to_str()).unwrap_or("?")
        );
        if let Err(e) = cat.add_source(&name, &text) {
            panic!("{name} does not compile:\n{e}");
        }
    }
    cat
}

pub fn module(cat: &Catalog, name: &str) -> usize {
    cat.find(name)
        .unwrap_or_else(|| panic!("no module @{name}"))
}

pub fn cfg(items: &[(&str, TValue)]) -> Vec<(String, TValue)> {
    items
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

pub fn int(v: i64) -> TValue {
    TValue::I64(v)
}
