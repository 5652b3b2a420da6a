//! Fuzz target: arbitrary bytes -> lossy UTF-8 -> `loom_syntax::parse`. The parser must never panic, and
//! every diagnostic must render (its span lies inside the text).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (_module, diags) = loom_syntax::parse(&text);
    let source = loom_syntax::SourceFile::new("fuzz.loom", text.as_ref());
    for d in &diags {
        assert!(d.span.start <= d.span.end && d.span.end as usize <= text.len());
        let _ = source.render(d);
    }
});
