//! LEB128 edge cases, which the public API reaches only through whole files.

use super::*;

fn dec(bytes: &[u8]) -> Dec<'_> {
    Dec {
        buf: bytes,
        pos: 0,
        end: bytes.len(),
        strings: Vec::new(),
        types: Vec::new(),
        budget: MAX_DECODED_BYTES,
        ndecls: 0,
        nfuncs: 0,
        record_fields: Vec::new(),
        cur: FnCx::default(),
        early_func_refs: Vec::new(),
    }
}

#[test]
fn uleb_round_trips_and_is_minimal() {
    for v in [
        0u64,
        1,
        63,
        64,
        127,
        128,
        255,
        16383,
        16384,
        u32::MAX.into(),
        u64::MAX - 1,
        u64::MAX,
    ] {
        let mut out = Vec::new();
        uleb(&mut out, v);
        let mut d = dec(&out);
        assert_eq!(d.uleb("x").unwrap(), v);
        assert_eq!(d.pos, out.len());
    }
    assert_eq!(
        dec(&[0x80, 0x00]).uleb("x").unwrap_err().kind,
        DecodeErrorKind::NonMinimalLeb { what: "x" }
    );
    assert_eq!(
        dec(&[0xff, 0x80, 0x00]).uleb("x").unwrap_err().kind,
        DecodeErrorKind::NonMinimalLeb { what: "x" }
    );
    let too_big = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
    assert_eq!(
        dec(&too_big).uleb("x").unwrap_err().kind,
        DecodeErrorKind::Overflow { what: "x" }
    );
    let eleven = [
        0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00,
    ];
    assert!(dec(&eleven).uleb("x").is_err());
    assert!(matches!(
        dec(&[0x80]).uleb("x").unwrap_err().kind,
        DecodeErrorKind::Truncated { .. }
    ));
}

#[test]
fn sleb_round_trips_and_is_minimal() {
    let values = [
        0i64,
        1,
        -1,
        63,
        64,
        -64,
        -65,
        127,
        128,
        -128,
        8191,
        -8192,
        i32::MIN.into(),
        i32::MAX.into(),
        i64::MIN,
        i64::MAX,
        i64::MIN + 1,
        i64::MAX - 1,
        1 << 62,
        -(1 << 62),
    ];
    for v in values {
        let mut out = Vec::new();
        sleb(&mut out, v);
        let mut d = dec(&out);
        assert_eq!(d.sleb("x").unwrap(), v, "{v}: {out:x?}");
        assert_eq!(d.pos, out.len());
    }
    // 1 padded with a redundant sign byte; -1 likewise
    for bad in [&[0x81, 0x00][..], &[0xff, 0x7f], &[0xc0, 0xff, 0x7f]] {
        assert_eq!(
            dec(bad).sleb("x").unwrap_err().kind,
            DecodeErrorKind::NonMinimalLeb { what: "x" },
            "{bad:x?}"
        );
    }
    // 64 needs two bytes (0xc0 0x00): the 0x00 is not redundant
    assert_eq!(dec(&[0xc0, 0x00]).sleb("x").unwrap(), 64);
    let too_big = [0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01];
    assert_eq!(
        dec(&too_big).sleb("x").unwrap_err().kind,
        DecodeErrorKind::Overflow { what: "x" }
    );
}
