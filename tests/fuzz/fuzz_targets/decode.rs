//! Fuzz target: arbitrary bytes -> `loom_ir::decode` -> `verify_module`. Neither may panic; whatever decodes
//! must re-encode to the same bytes (canonical form) unless it carried custom sections, and must print.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(module) = loom_ir::decode(data) {
        let _ = loom_ir::verify_module(&module);
        let _ = loom_ir::print_module(&module);
        let again = loom_ir::encode(&module);
        // custom sections are dropped on decode, so only a file without them must come back byte for byte
        if again.len() == data.len() {
            assert_eq!(again, data);
        }
    }
});
