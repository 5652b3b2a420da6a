//! The result plan `prepare_batch` returns: the output buffer's size, its live prefix, and which rows of the
//! live prefix belong to which request (layout in `docs/serving/finite.md`).

use super::Rows;
use serve_runtime::{Error, Result};

/// Little-endian i64 at record index `i` of `b`.
fn i64_at(b: &[u8], i: usize) -> Option<i64> {
    b.get(i * 8..i * 8 + 8)
        .map(|s| i64::from_le_bytes(s.try_into().unwrap_or([0; 8])))
}

/// A parsed result plan (see `docs/serving/finite.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultPlan {
    pub output_bytes: u64,
    pub live_bytes: u64,
    /// Per request: (first row, row count).
    pub requests: Vec<(usize, usize)>,
    /// Per row: (byte offset, byte width) within the live prefix.
    pub rows: Vec<(u64, u64)>,
}

impl ResultPlan {
    /// Parses and checks a plan for `n` requests: every row lies inside the live prefix, which lies inside
    /// the output; widths are whole f32 values; each request's rows fit `result_capacity` bytes.
    pub fn parse(b: &[u8], n: usize, result_capacity: i64) -> Result<ResultPlan> {
        let bad = |m: String| Error::Program(format!("prepare_batch result plan: {m}"));
        let h = |i: usize| i64_at(b, i).ok_or_else(|| bad(format!("truncated at record {i}")));
        let output_bytes = h(0)?;
        let live_bytes = h(1)?;
        let n_req = h(2)?;
        let n_rows = h(3)?;
        if output_bytes <= 0 || live_bytes < 0 || live_bytes > output_bytes {
            return Err(bad(format!(
                "output {output_bytes} bytes, live prefix {live_bytes}: need 0 <= live <= output, output > 0"
            )));
        }
        if n_req != n as i64 {
            return Err(bad(format!("{n_req} requests, the cohort has {n}")));
        }
        if !(0..=1 << 20).contains(&n_rows) {
            return Err(bad(format!("{n_rows} rows")));
        }
        let want = (4 + 2 * n + 2 * n_rows as usize) * 8;
        if b.len() != want {
            return Err(bad(format!(
                "{} bytes, expected {want} for {n} requests and {n_rows} rows",
                b.len()
            )));
        }
        let mut requests = Vec::with_capacity(n);
        for r in 0..n {
            let first = h(4 + 2 * r)?;
            let count = h(5 + 2 * r)?;
            if first < 0 || count < 0 || first + count > n_rows {
                return Err(bad(format!(
                    "request {r}: rows {first}..{} are outside 0..{n_rows}",
                    first + count
                )));
            }
            requests.push((first as usize, count as usize));
        }
        let base = 4 + 2 * n;
        let mut rows = Vec::with_capacity(n_rows as usize);
        for i in 0..n_rows as usize {
            let off = h(base + 2 * i)?;
            let width = h(base + 2 * i + 1)?;
            if off < 0 || width < 0 || width % 4 != 0 || off % 4 != 0 || off + width > live_bytes {
                return Err(bad(format!(
                    "row {i}: bytes {off}+{width} must be 4-aligned whole f32 values inside the {live_bytes}-byte live prefix"
                )));
            }
            rows.push((off as u64, width as u64));
        }
        for (r, &(first, count)) in requests.iter().enumerate() {
            let bytes: u64 = rows[first..first + count].iter().map(|r| r.1).sum();
            if bytes as i64 > result_capacity {
                return Err(bad(format!(
                    "request {r}: {bytes} result bytes, over the declared result capacity {result_capacity}"
                )));
            }
        }
        Ok(ResultPlan {
            output_bytes: output_bytes as u64,
            live_bytes: live_bytes as u64,
            requests,
            rows,
        })
    }

    /// Each request's rows from the downloaded live prefix.
    pub fn split(&self, live: &[u8]) -> Vec<Rows> {
        self.requests
            .iter()
            .map(|&(first, count)| {
                self.rows[first..first + count]
                    .iter()
                    .map(|&(off, w)| {
                        live[off as usize..(off + w) as usize]
                            .chunks_exact(4)
                            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                            .collect()
                    })
                    .collect()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(records: &[i64]) -> Vec<u8> {
        records.iter().flat_map(|r| r.to_le_bytes()).collect()
    }

    #[test]
    fn a_plan_maps_rows_to_requests() {
        // 64-byte output, 24 live bytes; request 0 has rows 0..2, request 1 row 2.
        let b = plan(&[64, 24, 2, 3, 0, 2, 2, 1, 0, 8, 8, 8, 16, 8]);
        let p = ResultPlan::parse(&b, 2, 16).unwrap();
        assert_eq!(p.requests, vec![(0, 2), (2, 1)]);
        let live: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
        assert_eq!(
            p.split(&live),
            vec![vec![vec![0.0, 1.0], vec![2.0, 3.0]], vec![vec![4.0, 5.0]]]
        );
    }

    #[test]
    fn bad_plans_are_program_errors_naming_the_problem() {
        let cases: &[(&[i64], usize, &str)] = &[
            (&[64, 80, 1, 0, 0, 0], 1, "need 0 <= live <= output"),
            (
                &[64, 8, 2, 0, 0, 0, 0, 0],
                1,
                "2 requests, the cohort has 1",
            ),
            (
                &[64, 8, 1, 1, 0, 2, 0, 8],
                1,
                "request 0: rows 0..2 are outside 0..1",
            ),
            (
                &[64, 8, 1, 1, 0, 1, 4, 8],
                1,
                "row 0: bytes 4+8 must be 4-aligned",
            ),
            (&[64, 8, 1, 1, 0, 1, 0, 6], 1, "row 0: bytes 0+6"),
            (&[64, 8, 1, 1, 0, 1], 1, "48 bytes, expected 64"),
            (
                &[64, 64, 1, 1, 0, 1, 0, 64],
                1,
                "over the declared result capacity 32",
            ),
        ];
        for (records, n, want) in cases {
            let e = ResultPlan::parse(&plan(records), *n, 32).unwrap_err();
            assert!(matches!(e, Error::Program(_)), "{e}");
            assert!(e.to_string().contains(want), "{records:?}: {e}");
        }
    }
}
