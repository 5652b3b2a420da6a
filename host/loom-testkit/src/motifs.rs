//! The motif library (`packages/motifs/*.loom`) as a compiled catalog, for the tests of every crate that
//! specializes motif stages.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use loom_compiler::Catalog;

/// The repository's `packages/motifs` folder.
pub fn motifs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packages/motifs")
}

/// Every motif module, compiled once per test binary (file order is sorted, names are `motifs/FILE`).
/// A motif that does not compile panics with the compiler's diagnostics.
pub fn motif_catalog() -> &'static Catalog {
    static CAT: OnceLock<Catalog> = OnceLock::new();
    CAT.get_or_init(|| {
        let dir = motifs_dir();
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "loom"))
            .collect();
        files.sort();
        let mut cat = Catalog::new();
        for p in files {
            let text =
                std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let name = format!(
                "motifs/{}",
                p.file_name().and_then(|n| n.to_str()).unwrap_or("?")
            );
            if let Err(e) = cat.add_source(&name, &text) {
                panic!("{name} does not compile:\n{e}");
            }
        }
        cat
    })
}
