//! The device-item parser and the specializer never panic: mutated kernel sources (bytes deleted, inserted,
//! replaced, lines duplicated) either specialize or give diagnostics.

mod common;

use common::*;
use proptest::prelude::*;

const SOURCES: &[&str] = &[
    include_str!("../../../packages/motifs/gemm.loom"),
    include_str!("../../../packages/motifs/norm.loom"),
    include_str!("golden/kernel/ok_mlp.loom"),
];

const PIECES: &[&str] = &[
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    "<",
    ">",
    ",",
    ":",
    "=",
    "->",
    "%x",
    "@k",
    "tile.load",
    "for",
    "if",
    "yield",
    "\n",
    "-1",
    "1e9",
    "\"s\"",
    "cdiv(",
    "tile<[4], f32>",
    "%y[%r]",
    "call",
    "dispatch",
    "alloc",
];

fn mutate(src: &str, edits: &[(usize, u8, usize)]) -> String {
    let mut s: Vec<char> = src.chars().collect();
    for &(pos, kind, piece) in edits {
        if s.is_empty() {
            break;
        }
        let at = pos % s.len();
        match kind % 4 {
            0 => {
                let end = (at + 1 + piece % 8).min(s.len());
                s.drain(at..end);
            }
            1 => {
                let p = PIECES[piece % PIECES.len()];
                for (i, c) in p.chars().enumerate() {
                    s.insert(at + i, c);
                }
            }
            2 => s[at] = PIECES[piece % PIECES.len()].chars().next().unwrap_or(' '),
            _ => {
                // duplicate the line holding `at`
                let start = s[..at]
                    .iter()
                    .rposition(|&c| c == '\n')
                    .map_or(0, |i| i + 1);
                let end = s[at..]
                    .iter()
                    .position(|&c| c == '\n')
                    .map_or(s.len(), |i| at + i + 1);
                let line: Vec<char> = s[start..end].to_vec();
                for (i, c) in line.into_iter().enumerate() {
                    s.insert(end + i, c);
                }
            }
        }
    }
    s.into_iter().collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn mutated_sources_never_panic(src in 0..SOURCES.len(), edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<usize>()), 1..6)) {
        let text = mutate(SOURCES[src], &edits);
        let mut cat = motif_catalog();
        let name = "mutated.loom";
        // the module may clash with a motif module name or not compile at all: both are fine
        let Ok((m, _)) = cat.add_source(name, &text) else { return Ok(()); };
        let items: Vec<(loom_ir::DeviceKind, String)> = cat.entries()[m].module.device.iter().map(|d| (d.kind, d.name.clone())).collect();
        for (kind, item) in items {
            match kind {
                loom_ir::DeviceKind::Stage => { let _ = loom_kernel::specialize_stage(&cat, m, &item, &[]); }
                loom_ir::DeviceKind::Kernel => { let _ = loom_kernel::specialize_kernel(&cat, m, &item, &[]); }
                loom_ir::DeviceKind::Kfunc => {}
            }
        }
    }

    /// Item text alone, at any stored position, goes through `parse_item` without panicking.
    #[test]
    fn parse_item_never_panics(src in 0..SOURCES.len(), edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<usize>()), 0..8), line in 0u32..3_000_000, col in 0u32..20_000) {
        let text = mutate(SOURCES[src], &edits);
        // strip the module wrapper so the text is (roughly) one item, as stored
        let body = text.split_once('{').map_or(text.as_str(), |(_, b)| b);
        let _ = loom_kernel::parse_item("x.loom", line, col, body);
    }
}

#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    let mut expr = String::from("%x");
    for _ in 0..5000 {
        expr = format!("add({expr}, 1.0)");
    }
    let text = format!("kfunc @f(%x: f32) -> f32 {{\n  %y = {expr}\n  return %y\n}}");
    let r = std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(move || loom_kernel::parse_item("deep.loom", 1, 1, &text).map(|_| ()))
        .expect("thread")
        .join()
        .expect("no stack overflow");
    assert!(r.is_err());
    let mut chain = String::from("1");
    for _ in 0..5000 {
        chain.push_str(" + 1");
    }
    let text = format!("kernel @k grid({chain}) () {{\n}}");
    assert!(loom_kernel::parse_item("chain.loom", 1, 1, &text).is_err());
}
