//! The motif library (`packages/motifs/*.loom`) as a compiled catalog, for the tests of every crate that
//! specializes motif stages.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use loom_compiler::Catalog;

/// The repository's `packages/motifs` folder.
pub fn motifs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packages/motifs")
}

/// The given package sources (paths under the repository's `packages/`, which also name them in the
/// catalog), compiled in that order: a model package's kernels with the motifs they call. A file that is
/// missing or does not compile panics with the compiler's diagnostics.
pub fn package_catalog(files: &[&str]) -> Catalog {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packages");
    let mut cat = Catalog::new();
    for f in files {
        let text = std::fs::read_to_string(root.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        if let Err(e) = cat.add_source(f, &text) {
            panic!("{f} does not compile:\n{e}");
        }
    }
    cat
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

/// A stage copying a GGUF-quantised `[R, C]` buffer of `dtype` into f32 through masked `[BR, BC]` tile loads.
pub fn dequant_stage(dtype: &str, cfg: &[(&str, i64)]) -> loom_ir::kernel::Stage {
    let text = format!(
        "module @qload {{
  export kernel @deq<R: i64, C: i64, BR: i64, BC: i64> grid(cdiv(R, BR), cdiv(C, BC))
      (%w: buffer<{dtype}, [R, C]> read, %y: buffer<f32, [R, C]> write)
  {{
    %rr = tile.range mul(program_id(0), BR), BR
    %rc = tile.range mul(program_id(1), BC), BC
    %v = tile.load %w[%rr, %rc], 0.0
    tile.store %y[%rr, %rc], %v
  }}
  export stage @s<R: i64, C: i64, BR: i64, BC: i64>
      (%w: buffer<{dtype}, [R, C]> input, %y: buffer<f32, [R, C]> output)
  {{
    dispatch @deq<R = R, C = C, BR = BR, BC = BC>(%w, %y)
  }}
}}
"
    );
    let mut cat = Catalog::new();
    if let Err(e) = cat.add_source("qload.loom", &text) {
        panic!("qload.loom:\n{e}");
    }
    let cfg: Vec<(String, loom_ir::TValue)> = cfg
        .iter()
        .map(|(k, v)| (k.to_string(), loom_ir::TValue::I64(*v)))
        .collect();
    loom_kernel::specialize_stage(&cat, cat.find("qload").expect("module"), "s", &cfg)
        .unwrap_or_else(|e| panic!("qload {dtype}: {}", e.join("")))
}
