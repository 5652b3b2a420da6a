//! The status words of `loom-emit`'s kernels (the layout and the codes are in `loom-emit`'s crate doc), read
//! back by the GPU plugins after a dispatch and turned into the kernel contract's error text, the text
//! `hal-cpu` and `loom-reference` give for the same fault.
//!
//! One dispatch's block is [`STATUS_WORDS`] `u32`s: the error count, then the first error's code, two details,
//! a value and the program id (8 result words, zeroed by the host before the dispatch), then the two words the
//! host writes before it: the loop-iteration allowance of each program instance ([`allowance_word`]) and the
//! cancellation word (run-time bounds, ABI 1.5).
//!
//! | code | meaning | details |
//! |---|---|---|
//! | 1 | checked load out of range | parameter, dimension, index |
//! | 2 | integer division or remainder by zero | the op's source line, column |
//! | 3 | loop step <= 0 | the op's source line, column, the step (as i32) |
//! | 4 | (WGSL only) an i64 buffer element outside the i32 range | parameter, -, element |
//! | 5 | an instance used up its loop-iteration allowance | the loop's source line, column |
//! | 6 | the dispatch was cancelled | the loop's source line, column |

use loom_ir::kernel::{ExecError, Kernel, Stage, instance_allowance};

/// Words of one dispatch's status block (8 result words, then the allowance and cancellation words).
pub const STATUS_WORDS: usize = 10;
/// The result words of a block (zeroed before a dispatch).
pub const RESULT_WORDS: usize = 8;

/// Status word 8 of a dispatch of `kernel` under a step budget of `steps` (0: none): each instance's loop
/// allowance, at most `u32::MAX` (also "no budget"); `Err` with the contract's text when the grid alone is
/// over the budget (the dispatch must not run).
pub fn allowance_word(stage: &Stage, kernel: &Kernel, steps: u64) -> Result<u32, String> {
    let g = kernel.grid;
    let instances = g[0].saturating_mul(g[1]).saturating_mul(g[2]);
    match instance_allowance(steps, instances) {
        Some(a) => Ok(u32::try_from(a).unwrap_or(u32::MAX)),
        None => Err(ExecError::BudgetExceeded {
            kernel: kernel.name.clone(),
            stage: stage.name.clone(),
            budget: steps,
        }
        .to_string()),
    }
}

/// The contract's text for a dispatch of `stage` stopped by its cancellation flag before it ran.
pub fn cancelled(stage: &Stage) -> String {
    let kernel = stage
        .dispatches
        .first()
        .and_then(|d| stage.kernels.get(d.kernel as usize))
        .map_or("?", |k| k.name.as_str());
    ExecError::Cancelled {
        kernel: kernel.to_string(),
        stage: stage.name.clone(),
    }
    .to_string()
}

/// One dispatch's status block from `STATUS_WORDS * 4` little-endian bytes at `at` of `bytes`.
pub fn words_le(bytes: &[u8], at: usize) -> [u32; STATUS_WORDS] {
    let mut w = [0u32; STATUS_WORDS];
    for (j, x) in w.iter_mut().enumerate() {
        let o = at + 4 * j;
        *x = u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
    }
    w
}

/// The submission's error from the status blocks of a stage's dispatches, in stage order: the first dispatch
/// that reported an error gives it.
pub fn check_status(
    stage: &Stage,
    blocks: impl IntoIterator<Item = [u32; STATUS_WORDS]>,
) -> Result<(), String> {
    check_status_bounded(stage, blocks, 0)
}

/// [`check_status`] of dispatches that ran under a step budget of `steps` (named in the budget error).
pub fn check_status_bounded(
    stage: &Stage,
    blocks: impl IntoIterator<Item = [u32; STATUS_WORDS]>,
    steps: u64,
) -> Result<(), String> {
    for (di, w) in blocks.into_iter().enumerate() {
        if let Some(e) = status_error_bounded(stage, di, &w, steps) {
            return Err(e);
        }
    }
    Ok(())
}

/// The kernel contract's error for the status words of dispatch `di` of `stage` (`None`: no error).
pub fn status_error(stage: &Stage, di: usize, w: &[u32; STATUS_WORDS]) -> Option<String> {
    status_error_bounded(stage, di, w, 0)
}

/// [`status_error`] of a dispatch that ran under a step budget of `steps`.
pub fn status_error_bounded(
    stage: &Stage,
    di: usize,
    w: &[u32; STATUS_WORDS],
    steps: u64,
) -> Option<String> {
    if w[0] == 0 {
        return None;
    }
    let kernel = stage
        .dispatches
        .get(di)
        .and_then(|d| stage.kernels.get(d.kernel as usize));
    let name = kernel.map_or("?", |k| k.name.as_str()).to_string();
    let program_id = [u64::from(w[5]), u64::from(w[6]), u64::from(w[7])];
    let (a, b, c) = (w[2] as usize, w[3] as usize, w[4] as i32);
    Some(match w[1] {
        1 => {
            let p = kernel.and_then(|k| k.params.get(a));
            ExecError::IndexOutOfRange {
                kernel: name,
                param: p.map_or_else(|| format!("#{a}"), |p| p.name.clone()),
                index: i64::from(c),
                dim: b,
                extent: p.and_then(|p| p.shape.get(b)).copied().unwrap_or(0),
                program_id,
            }
            .to_string()
        }
        2 => ExecError::DivisionByZero {
            kernel: name,
            loc: loom_ir::Loc {
                line: w[2],
                col: w[3],
            },
            program_id,
        }
        .to_string(),
        3 => ExecError::Malformed {
            at: if (w[2], w[3]) == (0, 0) {
                format!("kernel `{name}`")
            } else {
                format!("kernel `{name}` at {}:{}", w[2], w[3])
            },
            message: format!("loop step must be positive, got {c}"),
        }
        .to_string(),
        4 => {
            let p = kernel.and_then(|k| k.params.get(a));
            format!(
                "kernel `{name}`: element {c} of `{}` is outside the i32 range the WGSL backend emulates i64 with, \
                 in program {program_id:?}",
                p.map_or_else(|| format!("#{a}"), |p| p.name.clone())
            )
        }
        5 => ExecError::BudgetExceeded {
            kernel: name,
            stage: stage.name.clone(),
            budget: steps,
        }
        .to_string(),
        6 => ExecError::Cancelled {
            kernel: name,
            stage: stage.name.clone(),
        }
        .to_string(),
        code => format!("kernel `{name}`: device error code {code} in program {program_id:?}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty_stage() -> Stage {
        Stage {
            name: "s".into(),
            inputs: vec![],
            outputs: vec![],
            workspace: vec![],
            param_domain: None,
            params: vec![],
            kernels: vec![],
            dispatches: vec![],
        }
    }

    #[test]
    fn status_words_become_the_contracts_errors() {
        assert_eq!(status_error(&empty_stage(), 0, &[0; 10]), None);
        let e = status_error(&empty_stage(), 0, &[1, 9, 0, 0, 0, 1, 2, 3, 0, 0]).unwrap();
        assert!(
            e.contains("device error code 9") && e.contains("[1, 2, 3]"),
            "{e}"
        );
    }

    #[test]
    fn the_first_failed_dispatch_gives_the_error() {
        let s = empty_stage();
        assert!(check_status(&s, [[0; 10], [0; 10]]).is_ok());
        let e = check_status(
            &s,
            [
                [0; 10],
                [1, 7, 0, 0, 0, 0, 0, 0, 0, 0],
                [1, 8, 0, 0, 0, 0, 0, 0, 0, 0],
            ],
        );
        assert!(e.unwrap_err().contains("device error code 7"));
        let mut bytes = vec![0u8; 80];
        bytes[32..36].copy_from_slice(&5u32.to_le_bytes());
        bytes[60..64].copy_from_slice(&0x0102_0304u32.to_le_bytes());
        assert_eq!(
            words_le(&bytes, 32),
            [5, 0, 0, 0, 0, 0, 0, 0x0102_0304, 0, 0]
        );
    }

    #[test]
    fn budget_and_cancel_codes_become_the_contracts_errors() {
        let s = empty_stage();
        let e = status_error_bounded(&s, 0, &[1, 5, 3, 4, 0, 0, 0, 0, 9, 0], 77).unwrap();
        assert_eq!(e, "kernel `?` of stage `s` exceeded its budget of 77 steps");
        let e = status_error(&s, 0, &[1, 6, 3, 4, 0, 0, 0, 0, 9, 1]).unwrap();
        assert_eq!(e, "kernel `?` of stage `s` was cancelled");
        let k = loom_ir::kernel::Kernel {
            name: "k".into(),
            params: vec![],
            grid: [4, 1, 1],
            values: vec![],
            body: loom_ir::kernel::KRegion { ops: vec![] },
            file: String::new(),
        };
        assert_eq!(allowance_word(&s, &k, 0), Ok(u32::MAX));
        assert_eq!(allowance_word(&s, &k, 40), Ok(9));
        assert_eq!(
            allowance_word(&s, &k, 3).unwrap_err(),
            "kernel `k` of stage `s` exceeded its budget of 3 steps"
        );
    }
}
