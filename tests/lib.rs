//! Helpers for the integration tests: golden-file comparison with `LOOM_BLESS=1` re-blessing.

use std::path::{Path, PathBuf};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent; this is a bug")
        .to_path_buf()
}

/// Compares `actual` with the file at `expected_path`; with `LOOM_BLESS=1` writes it instead. Returns a
/// description of the mismatch, if any, so a test can report every failing fixture at once.
pub fn check_golden(expected_path: &Path, actual: &str) -> Option<String> {
    if std::env::var_os("LOOM_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(expected_path, actual).expect("writing a blessed golden file");
        return None;
    }
    let expected = std::fs::read_to_string(expected_path).unwrap_or_default();
    if expected == actual {
        return None;
    }
    Some(format!(
        "golden mismatch for {} (rerun with LOOM_BLESS=1 to accept)\n--- expected\n{expected}\n--- actual\n{actual}",
        expected_path.display()
    ))
}

/// Every file with extension `ext` directly in `dir`, sorted.
pub fn files_with_ext(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == ext))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}
