//! The `.loombc` codec: round trips, canonical form, the documented example, and rejection of bad input.

mod common;

use common::*;
use loom_ir::bytecode::{MAGIC, MAX_FILE_SIZE, MAX_NESTING};
use loom_ir::*;
use proptest::prelude::*;
use sha2::{Digest, Sha256};

fn round_trip(m: &Module) -> Vec<u8> {
    let b = encode(m);
    let back = decode(&b).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&back, m);
    assert_eq!(encode(&back), b, "encode(decode(b)) == b");
    b
}

/// Replaces the trailing digest so that a modified file gets past the digest check.
fn fix_digest(b: &mut [u8]) {
    let n = b.len() - 32;
    let d = Sha256::digest(&b[..n]);
    b[n..].copy_from_slice(&d);
}

fn kind(b: &[u8]) -> DecodeErrorKind {
    decode(b).unwrap_err().kind
}

#[test]
fn modules_round_trip() {
    round_trip(&sample_module());
    round_trip(&tiny_module());
    round_trip(&Module::default());
    on_small_stack(|| {
        round_trip(&nested_module(MAX_NESTING));
    });
}

#[test]
fn disassembly_round_trips_canonical_text() {
    let m = decode(&encode(&sample_module())).unwrap();
    verify_module(&m).unwrap();
    assert_eq!(print_module(&m), SAMPLE_TEXT);
}

#[test]
fn encoding_is_deterministic_and_sensitive() {
    let m = sample_module();
    assert_eq!(encode(&m), encode(&m.clone()));
    let mut other = m.clone();
    other.funcs[0].body.ops[0].loc.col += 1;
    assert_ne!(
        encode(&m),
        encode(&other),
        "locations are part of the encoding"
    );
    let mut other = m.clone();
    other.consts[4].value = Imm::F32(-0.0);
    let mut zero = m;
    zero.consts[4].value = Imm::F32(0.0);
    assert_ne!(
        encode(&zero),
        encode(&other),
        "float bits, not float equality"
    );
}

/// The worked example in the `bytecode` module docs.
#[test]
fn documented_example() {
    let mut b = Fb::default();
    let a = b.v("a", Type::I64);
    let mut f = b.func("f", 1, vec![Type::I64], vec![ret(vec![v(a)])]);
    f.loc = Loc { line: 1, col: 12 };
    f.body.ops[0].loc = Loc { line: 1, col: 38 };
    let m = Module {
        name: "m".into(),
        file: "m.loom".into(),
        funcs: vec![f],
        ..Module::default()
    };
    let bytes = round_trip(&m);
    #[rustfmt::skip]
    let expected: &[u8] = &[
        0x00, 0x6c, 0x6f, 0x6f, 0x6d, 0x62, 0x63, 0x0a, 0x01, 0x00, 0x01, 0x00,
        0x01, 0x0e, 0x04, 0x01, 0x6d, 0x01, 0x66, 0x06, 0x6d, 0x2e, 0x6c, 0x6f, 0x6f, 0x6d, 0x01, 0x61,
        0x02, 0x02, 0x01, 0x02,
        0x03, 0x01, 0x00,
        0x04, 0x01, 0x00,
        0x05, 0x01, 0x00,
        0x06, 0x01, 0x00,
        0x07, 0x10, 0x01, 0x01, 0x00, 0x00, 0x01, 0x00, 0x01, 0x00, 0x01, 0x00, 0x01, 0x07, 0x00, 0x01, 0x00, 0x00,
        0x08, 0x06, 0x02, 0x01, 0x0c, 0x03, 0x01, 0x26,
        0x09, 0x01, 0x00,
    ];
    assert_eq!(&bytes[..bytes.len() - 32], expected);
    assert_eq!(bytes.len(), 105);
    assert_eq!(&bytes[73..], Sha256::digest(expected).as_slice());
}

fn device_module() -> Module {
    let mut m = tiny_module();
    m.device = vec![
        DeviceItem {
            kind: DeviceKind::Kernel,
            name: "k".into(),
            exported: true,
            tparams: vec![TParam {
                name: "N".into(),
                kind: TParamKind::I64,
                default: Some(TValue::I64(4)),
            }],
            text: "export kernel @k<N: i64 = 4> grid(1)()\n{\n}".into(),
            loc: Loc { line: 3, col: 3 },
        },
        DeviceItem {
            kind: DeviceKind::Stage,
            name: "s".into(),
            exported: false,
            tparams: Vec::new(),
            text: "stage @s()\n{\n}".into(),
            loc: Loc { line: 7, col: 3 },
        },
    ];
    m
}

#[test]
fn device_items_round_trip() {
    let m = device_module();
    let b = round_trip(&m);
    verify::verify_module(&m).unwrap();
    // one byte changed in the kind tag is an unknown tag, not a silent reinterpretation
    let text = print_module(&m);
    assert!(
        text.contains("  export kernel @k<N: i64 = 4> grid(1)()\n  {\n  }\n"),
        "{text}"
    );
    assert!(b.len() > encode(&tiny_module()).len());
}

/// A file of format 1.0 (no section 9) still decodes, as a module without device items; a 1.0 file that
/// carries a section 9 is rejected.
#[test]
fn minor_version_0_files_decode() {
    let m = tiny_module();
    let mut b = encode(&m);
    let n = b.len() - 32;
    // drop `09 01 00` and set minor 0
    assert_eq!(&b[n - 3..n], &[0x09, 0x01, 0x00]);
    b.drain(n - 3..n);
    b[10] = 0;
    fix_digest(&mut b);
    assert_eq!(decode(&b).unwrap(), m);

    let mut with9 = encode(&m);
    with9[10] = 0;
    fix_digest(&mut with9);
    assert!(decode(&with9).is_err());
}

#[test]
fn duplicate_device_names_do_not_verify() {
    let mut m = device_module();
    m.device[1].name = "k".into();
    assert!(verify::verify_module(&m).is_err());
    let mut m = device_module();
    m.device[1].name = "f".into();
    assert!(
        verify::verify_module(&m).is_err(),
        "a device item may not share a function's name"
    );
}

#[test]
fn rejects_bad_headers() {
    let good = encode(&tiny_module());
    let mut b = good.clone();
    b[1] = b'L';
    assert_eq!(kind(&b), DecodeErrorKind::BadMagic);
    assert_eq!(
        kind(b"hello world, this is not bytecode at all....."),
        DecodeErrorKind::BadMagic
    );
    assert_eq!(kind(&[]), DecodeErrorKind::Truncated { what: "the magic" });

    let mut b = good.clone();
    b[8] = 2; // major 2
    let e = decode(&b).unwrap_err();
    assert_eq!(
        e.kind,
        DecodeErrorKind::UnsupportedVersion { major: 2, minor: 1 }
    );
    assert_eq!(
        e.to_string(),
        "invalid .loombc at byte 8: unsupported format version 2.1 (this decoder reads 1.0 to 1.1)"
    );
    let mut b = good.clone();
    b[10] = 2; // minor 2: newer than ours
    fix_digest(&mut b);
    assert_eq!(
        kind(&b),
        DecodeErrorKind::UnsupportedVersion { major: 1, minor: 2 }
    );

    let mut b = good.clone();
    let n = b.len();
    b[n - 1] ^= 1;
    let e = decode(&b).unwrap_err();
    assert_eq!(e.kind, DecodeErrorKind::DigestMismatch);
    assert_eq!(e.offset, n - 32);

    let mut big = MAGIC.to_vec();
    big.resize(MAX_FILE_SIZE + 1, 0);
    assert_eq!(
        kind(&big),
        DecodeErrorKind::TooLarge {
            len: MAX_FILE_SIZE + 1
        }
    );
}

#[test]
fn rejects_every_truncation() {
    let good = encode(&sample_module());
    for n in 0..good.len() {
        assert!(decode(&good[..n]).is_err(), "prefix of {n} bytes");
    }
    // and truncations with a valid digest, which reach the section parser
    let body_len = good.len() - 32;
    for n in 12..body_len {
        let mut b = good[..n].to_vec();
        b.extend_from_slice(&Sha256::digest(&b));
        assert!(decode(&b).is_err(), "body prefix of {n} bytes");
    }
}

#[test]
fn bit_flips_are_errors_not_panics() {
    let good = encode(&sample_module());
    for i in 0..good.len() {
        for bit in [0, 3, 7] {
            let mut b = good.clone();
            b[i] ^= 1 << bit;
            assert!(
                decode(&b).is_err(),
                "flip of bit {bit} at {i} went unnoticed"
            );
            if i < good.len() - 32 {
                // past the digest: the decoder proper must catch it or yield some other module
                fix_digest(&mut b);
                if let Ok(m) = decode(&b) {
                    assert_eq!(encode(&m), b, "accepted input must be canonical");
                    let _ = verify_module(&m);
                    let _ = print_module(&m);
                }
            }
        }
    }
}

/// Splices `replacement` over `range` of the body of `good` and fixes the section length and digest.
fn patch_section(
    good: &[u8],
    section_start: usize,
    at: usize,
    remove: usize,
    insert: &[u8],
) -> Vec<u8> {
    let mut b = good[..good.len() - 32].to_vec();
    b.splice(at..at + remove, insert.iter().copied());
    // the section's one-byte length follows its id
    let len = &mut b[section_start + 1];
    *len = (*len as usize + insert.len() - remove) as u8;
    b.extend_from_slice(&Sha256::digest(&b));
    b
}

#[test]
fn rejects_non_canonical_encodings() {
    let good = encode(&tiny_module());
    // strings section at 12: `01 len 04 01 'm' ...`: pad the count 04 to 84 00
    let b = patch_section(&good, 12, 14, 1, &[0x84, 0x00]);
    let e = decode(&b).unwrap_err();
    assert_eq!(
        e.kind,
        DecodeErrorKind::NonMinimalLeb {
            what: "string table"
        }
    );
    assert_eq!(e.offset, 14);

    // an unused extra string at the end of the table
    let strings_len = good[13] as usize;
    let mut b = patch_section(&good, 12, 14 + strings_len, 0, &[0x01, b'z']);
    b[14] += 1;
    fix_digest(&mut b);
    assert_eq!(kind(&b), DecodeErrorKind::NonCanonical);

    // the same module with "m" and "f" swapped in the table (and in the references): not first-use order
    let mut b = good.clone();
    assert_eq!(&b[15..19], &[0x01, b'm', 0x01, b'f']);
    b[16] = b'f';
    b[18] = b'm';
    let module_at = 14 + strings_len + 4; // after the one-entry types section
    assert_eq!(&b[module_at..module_at + 3], &[3, 1, 0]);
    b[module_at + 2] = 1;
    let funcs_at = module_at + 3 + 9; // after three empty sections
    assert_eq!(&b[funcs_at..funcs_at + 4], &[7, b[funcs_at + 1], 1, 1]);
    b[funcs_at + 3] = 0;
    fix_digest(&mut b);
    let e = decode(&b).unwrap_err();
    assert_eq!(e.kind, DecodeErrorKind::NonCanonical);
    assert_eq!(e.offset, 16);

    // an unknown section, and a second strings section, after the last one
    let mut b = good[..good.len() - 32].to_vec();
    b.extend_from_slice(&[10, 0]);
    b.extend_from_slice(&Sha256::digest(&b));
    assert!(matches!(
        kind(&b),
        DecodeErrorKind::UnknownSection { id: 10 }
    ));
    let mut b = good[..good.len() - 32].to_vec();
    b.extend_from_slice(&[1, 0]);
    b.extend_from_slice(&Sha256::digest(&b));
    assert_eq!(kind(&b), DecodeErrorKind::SectionOrder { name: "strings" });
}

#[test]
fn custom_sections_are_skipped() {
    let m = tiny_module();
    let good = encode(&m);
    let mut b = good[..12].to_vec();
    b.extend_from_slice(&[0, 5, 3, b'a', b'b', b'c', 0xff]); // custom "abc" with one payload byte
    b.extend_from_slice(&good[12..good.len() - 32]);
    b.extend_from_slice(&[0, 1, 0]); // custom "" at the end
    b.extend_from_slice(&Sha256::digest(&b));
    assert_eq!(decode(&b).unwrap(), m);
    // a custom section whose name is not UTF-8
    let mut b = good[..12].to_vec();
    b.extend_from_slice(&[0, 2, 1, 0xff]);
    b.extend_from_slice(&good[12..good.len() - 32]);
    b.extend_from_slice(&Sha256::digest(&b));
    assert_eq!(
        kind(&b),
        DecodeErrorKind::InvalidUtf8 {
            what: "a custom section name"
        }
    );
}

#[test]
fn rejects_missing_and_unknown_parts() {
    let good = encode(&tiny_module());
    // only the header and the digest
    let mut b = good[..12].to_vec();
    b.extend_from_slice(&Sha256::digest(&b));
    assert_eq!(
        kind(&b),
        DecodeErrorKind::MissingSection { name: "strings" }
    );

    // unknown opcode: tiny's `add` is opcode 0 right after `00 01 01` (simple, one result %1)
    let body = &good[..good.len() - 32];
    let at = body
        .windows(4)
        .position(|w| w == [0x00, 0x01, 0x01, 0x00])
        .unwrap()
        + 3;
    let mut b = good.clone();
    b[at] = 0x7f;
    fix_digest(&mut b);
    let e = decode(&b).unwrap_err();
    assert_eq!(e.kind, DecodeErrorKind::UnknownOpcode { code: 0x7f });
    assert_eq!(e.offset, at);

    // value index out of range: the result %1 -> %9
    let mut b = good.clone();
    b[at - 1] = 9;
    fix_digest(&mut b);
    assert_eq!(
        kind(&b),
        DecodeErrorKind::IndexOutOfRange {
            what: "value",
            index: 9,
            len: 2
        }
    );
}

#[test]
fn rejects_non_finite_floats_and_deep_nesting() {
    let mut m = tiny_module();
    m.consts.push(Const {
        name: "X".into(),
        exported: false,
        value: Imm::F64(f64::INFINITY),
        loc: Loc::default(),
    });
    assert_eq!(kind(&encode(&m)), DecodeErrorKind::NonFiniteFloat);
    m.consts[0].value = Imm::F32(f32::NAN);
    assert_eq!(kind(&encode(&m)), DecodeErrorKind::NonFiniteFloat);

    on_small_stack(|| {
        assert_eq!(
            kind(&encode(&nested_module(MAX_NESTING + 1))),
            DecodeErrorKind::TooDeep
        );
        assert_eq!(
            kind(&encode(&nested_module(3000))),
            DecodeErrorKind::TooDeep
        );
    });
}

#[test]
fn rejects_deep_types() {
    let mut t = Type::I64;
    for _ in 0..40 {
        t = Type::List(Box::new(t));
    }
    let mut m = tiny_module();
    m.funcs[0].values[1].ty = t;
    assert_eq!(kind(&encode(&m)), DecodeErrorKind::TypeTooDeep);
}

#[test]
fn huge_counts_do_not_allocate() {
    let good = encode(&tiny_module());
    let rest = &good[14 + good[13] as usize..good.len() - 32];
    let with_strings = |strings: &[u8]| {
        let mut b = good[..12].to_vec();
        b.extend_from_slice(strings);
        b.extend_from_slice(rest);
        b.extend_from_slice(&Sha256::digest(&b));
        b
    };
    // a strings section claiming 2^20 strings in 3 bytes
    let e = decode(&with_strings(&[1, 3, 0x80, 0x80, 0x40])).unwrap_err();
    assert_eq!(
        e.kind,
        DecodeErrorKind::Truncated {
            what: "string table"
        }
    );
    assert_eq!(e.offset, 14);
    // over the limit
    let e = decode(&with_strings(&[1, 5, 0xff, 0xff, 0xff, 0xff, 0x0f])).unwrap_err();
    assert!(
        matches!(
            e.kind,
            DecodeErrorKind::LimitExceeded {
                what: "string table",
                ..
            }
        ),
        "{e}"
    );
    // a string claiming 1 MiB + 1
    let e = decode(&with_strings(&[1, 5, 1, 0x81, 0x80, 0x40, 0])).unwrap_err();
    assert!(
        matches!(
            e.kind,
            DecodeErrorKind::LimitExceeded {
                what: "string length",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn decoded_modules_verify_or_fail_cleanly() {
    let m = decode(&encode(&sample_module())).unwrap();
    verify_module(&m).unwrap();
    let mut bad = sample_module();
    bad.funcs[0].values[3].ty = Type::F64;
    let m = decode(&encode(&bad)).unwrap();
    assert_eq!(
        verify_module(&m).unwrap_err().message,
        "%0 has type f64, but mul produces i64"
    );
}

fn mutations() -> impl Strategy<Value = Vec<(usize, u8)>> {
    prop::collection::vec((any::<usize>(), any::<u8>()), 1..8)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn decode_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode(&bytes);
        // with a valid header and digest, so the section parser sees the bytes
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&[1, 0, 0, 0]);
        b.extend_from_slice(&bytes);
        b.extend_from_slice(&Sha256::digest(&b));
        if let Ok(m) = decode(&b) {
            let _ = verify_module(&m);
        }
    }

    #[test]
    fn decode_never_panics_on_mutations(muts in mutations(), fix in any::<bool>(), cut in any::<Option<usize>>()) {
        let good = encode(&sample_module());
        let mut b = good[..good.len() - 32].to_vec();
        for (at, byte) in muts {
            let i = at % b.len();
            b[i] = byte;
        }
        if let Some(c) = cut {
            b.truncate(12 + c % (b.len() - 12));
        }
        if fix {
            b.extend_from_slice(&Sha256::digest(&b));
        } else {
            b.extend_from_slice(&good[good.len() - 32..]);
        }
        if let Ok(m) = decode(&b) {
            prop_assert_eq!(encode(&m), b);
            let _ = verify_module(&m);
            let _ = print_module(&m);
        }
    }
}
