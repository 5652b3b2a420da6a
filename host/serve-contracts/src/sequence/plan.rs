//! The byte-placement plan an `encode_epoch` returns, and the capture ranges a `capture_epoch` returns: their
//! encodings and every rule the server checks before a byte moves (each violation names the record).
//!
//! A **placement plan** is a view (offset, length) of a buffer holding little-endian u64 records of five
//! words, [`RECORD_BYTES`] each: `{source_binding, source_offset, target_binding, target_offset, length}`.
//! Source binding 0 is the metadata packet and 1 the input packet `encode_epoch` returned; target binding 0 is
//! the stage's metadata buffer and 1 its input buffer (its first two inputs, kept on the device across epochs).
//! A record places `length` bytes of the source at `source_offset` into the target at `target_offset`. Rules:
//! bindings are 0 or 1; both ranges lie inside their buffers; nonempty records are ordered by target binding,
//! then target offset, and their target ranges do not overlap (records are independent placements, not an
//! ordered sequence of copies); source ranges may repeat; empty records are allowed anywhere and place nothing.
//!
//! A **capture** is a buffer of little-endian i64 triples `[span_ordinal, output_offset, byte_length]`, grouped
//! in submitted span order (ordinals never decrease), every span with at least one nonempty range, every range
//! inside the epoch's output buffer; a span's ranges concatenate in order.

/// Bytes of one placement record (five u64 words).
pub const RECORD_BYTES: usize = 40;
/// Bytes of one capture triple (three i64 words).
pub const CAPTURE_BYTES: usize = 24;

/// One checked placement: `length` bytes from `source` at `source_offset` to `target` at `target_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub source: usize,
    pub source_offset: u64,
    pub target: usize,
    pub target_offset: u64,
    pub length: u64,
}

const SOURCE_NAMES: [&str; 2] = ["metadata packet", "input packet"];
const TARGET_NAMES: [&str; 2] = ["metadata buffer", "input buffer"];

fn word(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
}

/// Reads and checks the plan at `offset .. offset + length` of `plan`, against the two source packets' sizes
/// and the two target buffers' sizes. Returns the nonempty placements in plan order.
pub fn placements(
    plan: &[u8],
    offset: i64,
    length: i64,
    sources: [u64; 2],
    targets: [u64; 2],
) -> Result<Vec<Placement>, String> {
    let end = offset
        .checked_add(length)
        .filter(|_| offset >= 0 && length >= 0);
    let Some(end) = end.filter(|&e| e as u64 <= plan.len() as u64) else {
        return Err(format!(
            "the transfer plan view {offset}+{length} is outside the {}-byte plan buffer",
            plan.len()
        ));
    };
    let view = &plan[offset as usize..end as usize];
    if !view.len().is_multiple_of(RECORD_BYTES) {
        return Err(format!(
            "the transfer plan view is {} bytes, not a whole number of {RECORD_BYTES}-byte records",
            view.len()
        ));
    }
    let mut out: Vec<Placement> = Vec::new();
    for (i, r) in view.chunks_exact(RECORD_BYTES).enumerate() {
        let [sb, so, tb, to, len] = [0, 1, 2, 3, 4].map(|k| word(r, k));
        let bad = |m: String| Err(format!("transfer plan record {i}: {m}"));
        if sb > 1 {
            return bad(format!(
                "source binding {sb}: expected 0 (metadata) or 1 (input)"
            ));
        }
        if tb > 1 {
            return bad(format!(
                "target binding {tb}: expected 0 (metadata) or 1 (input)"
            ));
        }
        let (sb, tb) = (sb as usize, tb as usize);
        if so.checked_add(len).is_none_or(|e| e > sources[sb]) {
            return bad(format!(
                "source bytes {so}+{len} are outside the {}-byte {}",
                sources[sb], SOURCE_NAMES[sb]
            ));
        }
        if to.checked_add(len).is_none_or(|e| e > targets[tb]) {
            return bad(format!(
                "target bytes {to}+{len} are outside the {}-byte {}",
                targets[tb], TARGET_NAMES[tb]
            ));
        }
        if len == 0 {
            continue;
        }
        if let Some(p) = out.last() {
            if (tb, to) < (p.target, p.target_offset) {
                return bad(format!(
                    "targets {} bytes {to}.. after {} bytes {}..: nonempty records must be ordered by target \
                     binding and offset",
                    TARGET_NAMES[tb], TARGET_NAMES[p.target], p.target_offset
                ));
            }
            if tb == p.target && to < p.target_offset + p.length {
                return bad(format!(
                    "target {} bytes {to}+{len} overlap the previous record's {}+{}",
                    TARGET_NAMES[tb], p.target_offset, p.length
                ));
            }
        }
        out.push(Placement {
            source: sb,
            source_offset: so,
            target: tb,
            target_offset: to,
            length: len,
        });
    }
    Ok(out)
}

/// One checked capture range: `length` bytes of the output at `offset` belong to span `span`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capture {
    pub span: usize,
    pub offset: u64,
    pub length: u64,
}

/// Reads and checks a capture for an epoch of `spans` spans whose output buffer has `output_bytes` bytes.
/// Returns the nonempty ranges in order.
pub fn captures(bytes: &[u8], spans: usize, output_bytes: u64) -> Result<Vec<Capture>, String> {
    if !bytes.len().is_multiple_of(CAPTURE_BYTES) {
        return Err(format!(
            "{} bytes, not a whole number of {CAPTURE_BYTES}-byte triples",
            bytes.len()
        ));
    }
    let mut out: Vec<Capture> = Vec::new();
    let mut seen = vec![false; spans];
    let mut last = 0usize;
    for (i, r) in bytes.chunks_exact(CAPTURE_BYTES).enumerate() {
        let [s, off, len] = [0, 1, 2].map(|k| word(r, k) as i64);
        let bad = |m: String| Err(format!("range {i}: {m}"));
        if s < 0 || s as u64 >= spans as u64 {
            return bad(format!("span ordinal {s}: the epoch has {spans} spans"));
        }
        let s = s as usize;
        if s < last {
            return bad(format!(
                "span {s} after span {last}: ranges must be grouped in submitted span order"
            ));
        }
        last = s;
        if off < 0
            || len < 0
            || (off as u64)
                .checked_add(len as u64)
                .is_none_or(|e| e > output_bytes)
        {
            return bad(format!(
                "bytes {off}+{len} are outside the {output_bytes}-byte output"
            ));
        }
        if len == 0 {
            continue;
        }
        seen[s] = true;
        out.push(Capture {
            span: s,
            offset: off as u64,
            length: len as u64,
        });
    }
    if let Some(s) = seen.iter().position(|&x| !x) {
        return Err(format!(
            "span {s} has no nonempty range (every span needs at least one)"
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(records: &[[u64; 5]]) -> Vec<u8> {
        records
            .iter()
            .flat_map(|r| r.iter().flat_map(|w| w.to_le_bytes()))
            .collect()
    }

    fn check(records: &[[u64; 5]]) -> Result<Vec<Placement>, String> {
        let p = plan(records);
        placements(&p, 0, p.len() as i64, [64, 32], [1024, 128])
    }

    #[test]
    fn independent_offsets_repeated_sources_and_empty_records_are_accepted() {
        let got = check(&[
            [0, 0, 0, 512, 16],
            [0, 0, 0, 600, 16],
            [1, 8, 0, 900, 0],
            [1, 0, 1, 0, 32],
        ])
        .unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(
            got[1],
            Placement {
                source: 0,
                source_offset: 0,
                target: 0,
                target_offset: 600,
                length: 16
            }
        );
        // A view inside a larger buffer.
        let mut p = vec![0xAA; 8];
        p.extend(plan(&[[1, 0, 1, 96, 32]]));
        p.extend([0xBB; 8]);
        assert_eq!(
            placements(&p, 8, 40, [64, 32], [1024, 128]).unwrap()[0].target_offset,
            96
        );
    }

    #[test]
    fn every_violation_names_its_record() {
        let e = |r: &[[u64; 5]]| check(r).unwrap_err();
        assert!(
            e(&[[0, 0, 0, 0, 8], [2, 0, 0, 8, 8]])
                .starts_with("transfer plan record 1: source binding 2")
        );
        assert!(e(&[[0, 0, 3, 0, 8]]).contains("record 0: target binding 3"));
        assert!(
            e(&[[1, 30, 1, 0, 8]])
                .contains("source bytes 30+8 are outside the 32-byte input packet")
        );
        assert!(
            e(&[[0, 0, 1, 124, 8]])
                .contains("target bytes 124+8 are outside the 128-byte input buffer")
        );
        assert!(e(&[[0, u64::MAX, 0, 0, 8]]).contains("outside"));
        assert!(e(&[[0, 0, 0, 64, 8], [0, 0, 0, 0, 8]]).contains(
            "record 1: targets metadata buffer bytes 0.. after metadata buffer bytes 64.."
        ));
        assert!(e(&[[0, 0, 1, 0, 8], [0, 0, 0, 0, 8]]).contains("must be ordered"));
        assert!(e(&[[0, 0, 0, 0, 16], [0, 0, 0, 8, 8]]).contains(
            "record 1: target metadata buffer bytes 8+8 overlap the previous record's 0+16"
        ));
        let p = plan(&[[0, 0, 0, 0, 8]]);
        assert!(
            placements(&p, 8, 40, [64, 32], [1024, 128])
                .unwrap_err()
                .contains("view 8+40 is outside the 40-byte plan buffer")
        );
        assert!(
            placements(&p, 0, 36, [64, 32], [1024, 128])
                .unwrap_err()
                .contains("not a whole number")
        );
        assert!(placements(&p, -8, 8, [64, 32], [1024, 128]).is_err());
    }

    fn triples(t: &[[i64; 3]]) -> Vec<u8> {
        t.iter()
            .flat_map(|r| r.iter().flat_map(|w| w.to_le_bytes()))
            .collect()
    }

    #[test]
    fn captures_are_grouped_nonempty_and_inside_the_output() {
        let ok = captures(
            &triples(&[[0, 0, 8], [0, 64, 0], [0, 32, 4], [1, 8, 8]]),
            2,
            128,
        )
        .unwrap();
        assert_eq!(ok.len(), 3);
        assert_eq!(
            ok[1],
            Capture {
                span: 0,
                offset: 32,
                length: 4
            }
        );
        let e = |t: &[[i64; 3]], n| captures(&triples(t), n, 128).unwrap_err();
        assert!(
            e(&[[0, 0, 8], [2, 0, 8]], 2)
                .contains("range 1: span ordinal 2: the epoch has 2 spans")
        );
        assert!(e(&[[1, 0, 8], [0, 0, 8]], 2).contains("grouped in submitted span order"));
        assert!(
            e(&[[0, 120, 16], [1, 0, 8]], 2)
                .contains("range 0: bytes 120+16 are outside the 128-byte output")
        );
        assert!(e(&[[0, -1, 8]], 1).contains("outside"));
        assert!(e(&[[0, 0, 8], [1, 0, 0]], 2).contains("span 1 has no nonempty range"));
        assert!(
            captures(&[0; 20], 1, 128)
                .unwrap_err()
                .contains("whole number")
        );
    }
}
