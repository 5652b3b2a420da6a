//! The catalog: every module a program may link against (the primary program plus `definition.sources`).

use loom_ir::Module;
use loom_syntax::SourceFile;
use std::collections::HashMap;
use std::fmt;

/// One module of the catalog, with its source text when it was compiled from `.loom` (for excerpts).
#[derive(Debug)]
pub struct Entry {
    pub module: Module,
    pub source: Option<SourceFile>,
}

/// Modules by name. Module names are unique within a catalog.
#[derive(Debug, Default)]
pub struct Catalog {
    entries: Vec<Entry>,
    by_name: HashMap<String, usize>,
    /// The host's reference types, for the `.loom` sources this catalog compiles.
    ref_types: crate::RefTypes,
}

/// Why a module could not be added to a catalog. Each message is complete and names the file(s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogError {
    pub messages: Vec<String>,
}

impl fmt::Display for CatalogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for m in &self.messages {
            writeln!(f, "{}", m.trim_end())?;
        }
        Ok(())
    }
}

impl std::error::Error for CatalogError {}

impl Catalog {
    pub fn new() -> Catalog {
        Catalog::default()
    }

    /// A catalog whose `.loom` sources are compiled for a host that defines the reference types `ref_types`.
    pub fn with_ref_types(ref_types: crate::RefTypes) -> Catalog {
        Catalog {
            ref_types,
            ..Catalog::default()
        }
    }

    /// Adds a compiled module. Fails if another module of the same name is already present.
    pub fn add(
        &mut self,
        module: Module,
        source: Option<SourceFile>,
    ) -> Result<usize, CatalogError> {
        if let Some(&prev) = self.by_name.get(&module.name) {
            let other = &self.entries[prev].module.file;
            return Err(CatalogError {
                messages: vec![format!(
                    "{}: error: module @{} is defined twice in the catalog: here and in {other}",
                    module.file, module.name
                )],
            });
        }
        let idx = self.entries.len();
        self.by_name.insert(module.name.clone(), idx);
        self.entries.push(Entry { module, source });
        Ok(idx)
    }

    /// Compiles `.loom` text and adds it. Warnings are returned alongside the index.
    pub fn add_source(
        &mut self,
        file_name: &str,
        text: &str,
    ) -> Result<(usize, Vec<String>), CatalogError> {
        let (module, diags) = crate::compile_text_for(file_name, text, &self.ref_types);
        match module {
            Some(m) => {
                let idx = self.add(m, Some(SourceFile::new(file_name, text)))?;
                Ok((idx, diags))
            }
            None => Err(CatalogError { messages: diags }),
        }
    }

    /// Decodes and verifies `.loombc` bytes and adds the module. Nothing from the file is used unless both pass.
    pub fn add_bytecode(&mut self, file_name: &str, bytes: &[u8]) -> Result<usize, CatalogError> {
        let module = crate::load_bytecode(file_name, bytes)
            .map_err(|m| CatalogError { messages: vec![m] })?;
        self.add(module, None)
    }

    /// Adds a file by its extension: `.loombc` is bytecode, anything else is source text.
    pub fn add_file(
        &mut self,
        file_name: &str,
        bytes: &[u8],
    ) -> Result<(usize, Vec<String>), CatalogError> {
        if file_name.ends_with(".loombc") {
            return self.add_bytecode(file_name, bytes).map(|i| (i, Vec::new()));
        }
        match std::str::from_utf8(bytes) {
            Ok(text) => self.add_source(file_name, text),
            Err(e) => Err(CatalogError {
                messages: vec![format!(
                    "{file_name}: error: not UTF-8 text (byte {}): not a .loom source",
                    e.valid_up_to()
                )],
            }),
        }
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn find(&self, module_name: &str) -> Option<usize> {
        self.by_name.get(module_name).copied()
    }
}
