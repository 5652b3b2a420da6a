//! How one epoch is packed: which sequences advance and by how many tokens. A pure function of the sequences'
//! progress and the epoch's limits ([`plan_epoch`]), so the policy is tested on its own.
//!
//! The policy: sequences in admission order (the oldest first). A sequence that has tokens whose state is not
//! in its pages yet (a prompt, or the token it just drew) gets a span of as many of them as the epoch's
//! remaining token capacity allows; the epoch stops at its span or token capacity. A decoding sequence needs
//! one token, so every running sequence advances each epoch while new prompts fill what is left (continuous
//! batching), and a long prompt is processed in chunks instead of holding the decoders back (chunked
//! prefill): decoders are older than the prompts admitted after them, so they come first.

/// One sequence as the planner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Tokens known (prompt and drawn).
    pub known: u32,
    /// Tokens whose state is committed to the sequence's pages.
    pub committed: u32,
}

/// One span of the planned epoch: sequence `seq` (an index into the planner's input) advances by `count`
/// tokens from position `position`; `logits` when the span ends at the sequence's last known token (the next
/// token is then drawn from its logits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedSpan {
    pub seq: usize,
    pub position: u32,
    pub count: u32,
    pub logits: bool,
}

/// The spans of the next epoch (see the module doc), at most `spans` of them and `tokens` tokens in all.
pub fn plan_epoch(seqs: &[Progress], tokens: u32, spans: u32) -> Vec<PlannedSpan> {
    let mut out = Vec::new();
    let mut left = tokens;
    for (i, p) in seqs.iter().enumerate() {
        if left == 0 || out.len() as u32 >= spans {
            break;
        }
        let pending = p.known.saturating_sub(p.committed);
        if pending == 0 {
            continue;
        }
        let count = pending.min(left);
        left -= count;
        out.push(PlannedSpan {
            seq: i,
            position: p.committed,
            count,
            logits: p.committed + count == p.known,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(known: u32, committed: u32) -> Progress {
        Progress { known, committed }
    }

    #[test]
    fn decoders_advance_and_a_long_prompt_is_chunked() {
        // Two decoding sequences (one pending token each) and a 1000-token prompt, 64 tokens an epoch.
        let seqs = [p(50, 49), p(20, 19), p(1000, 0)];
        let plan = plan_epoch(&seqs, 64, 8);
        assert_eq!(
            plan,
            [
                PlannedSpan {
                    seq: 0,
                    position: 49,
                    count: 1,
                    logits: true
                },
                PlannedSpan {
                    seq: 1,
                    position: 19,
                    count: 1,
                    logits: true
                },
                PlannedSpan {
                    seq: 2,
                    position: 0,
                    count: 62,
                    logits: false
                },
            ]
        );
        // The prompt's last chunk asks for logits.
        let plan = plan_epoch(&[p(1000, 990)], 64, 8);
        assert_eq!(
            plan,
            [PlannedSpan {
                seq: 0,
                position: 990,
                count: 10,
                logits: true
            }]
        );
    }

    #[test]
    fn span_and_token_capacities_are_separate_limits() {
        let seqs: Vec<Progress> = (0..10).map(|_| p(5, 4)).collect();
        assert_eq!(plan_epoch(&seqs, 100, 3).len(), 3, "span capacity");
        let plan = plan_epoch(&[p(10, 0), p(10, 0)], 12, 8);
        assert_eq!(
            plan.iter().map(|s| s.count).collect::<Vec<_>>(),
            [10, 2],
            "token capacity"
        );
        // Sequences with nothing pending take no span.
        let plan = plan_epoch(&[p(5, 5), p(3, 2)], 10, 1);
        assert_eq!(
            plan,
            [PlannedSpan {
                seq: 1,
                position: 2,
                count: 1,
                logits: true
            }]
        );
        assert!(plan_epoch(&[], 10, 1).is_empty());
    }
}
