//! How one epoch is packed: which sequences advance and by how many tokens. A pure function of the sequences'
//! progress and the epoch's limits ([`plan_epoch`]), so the policy is tested on its own.
//!
//! The policy: sequences in admission order (the oldest first). A sequence that has tokens whose state is not
//! in its pages yet (a prompt, or the token it just drew) gets a span of as many of them as the epoch's
//! remaining token capacity allows; the epoch stops at its span or token capacity. A decoding sequence needs
//! one token, so every running sequence advances each epoch while new prompts fill what is left (continuous
//! batching), and a long prompt is processed in chunks instead of holding the decoders back (chunked
//! prefill): decoders are older than the prompts admitted after them, so they come first.
//!
//! Speculative verify: a decoder (one pending token) with proposed continuations (prompt lookup, see
//! [`propose`]) advances by its pending token and as many proposals as the remaining token capacity allows, in
//! one span that asks for the logits of each of its tokens; the server keeps the proposals its own draws agree
//! with.

/// One sequence as the planner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Tokens known (prompt and drawn).
    pub known: u32,
    /// Tokens whose state is committed to the sequence's pages.
    pub committed: u32,
    /// Proposed tokens after the known ones (speculative verify; 0: none).
    pub proposed: u32,
}

/// One span of the planned epoch: sequence `seq` (an index into the planner's input) advances by `count`
/// tokens from position `position`; `logits` when the span ends at the sequence's last known token (the next
/// token is then drawn from its logits). `verify` of the `count` tokens are proposals after the known ones (a
/// verifier span): the span then asks for the logits of its last `verify + 1` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedSpan {
    pub seq: usize,
    pub position: u32,
    pub count: u32,
    pub logits: bool,
    pub verify: u32,
    /// The span asks for the logits after every one of its tokens (scoring a prompt's known tokens).
    pub every_row: bool,
}

impl PlannedSpan {
    /// The logits rows the span asks for.
    pub fn logit_rows(&self) -> u32 {
        if self.every_row {
            self.count
        } else if self.logits {
            self.verify + 1
        } else {
            0
        }
    }
}

/// The spans of the next epoch (see the module doc), at most `spans` of them and `tokens` tokens in all; while
/// any sequence is decoding, prompts get at most `prefill` of those tokens (so that an epoch the decoders wait
/// for stays short: their inter-token latency is an epoch's duration).
pub fn plan_epoch(seqs: &[Progress], tokens: u32, spans: u32, prefill: u32) -> Vec<PlannedSpan> {
    let mut out = Vec::new();
    let mut left = tokens;
    let decoding = seqs
        .iter()
        .any(|p| p.committed > 0 && p.known == p.committed + 1);
    let mut prompt_left = if decoding { prefill } else { tokens };
    for (i, p) in seqs.iter().enumerate() {
        if left == 0 || out.len() as u32 >= spans {
            break;
        }
        let pending = p.known.saturating_sub(p.committed);
        if pending == 0 {
            continue;
        }
        let count = if pending == 1 {
            1
        } else {
            let c = pending.min(left).min(prompt_left);
            if c == 0 {
                continue;
            }
            prompt_left -= c;
            c
        };
        left -= count;
        // A decoder verifies its proposals in the same span, as many as the token capacity leaves room for.
        let verify = if pending == 1 {
            p.proposed.min(left)
        } else {
            0
        };
        left -= verify;
        out.push(PlannedSpan {
            seq: i,
            position: p.committed,
            count: count + verify,
            logits: p.committed + count == p.known,
            verify,
            every_row: false,
        });
    }
    out
}

/// Prompt lookup (n-gram speculation without a draft model): the tokens that followed the latest earlier
/// occurrence of the sequence's last `n` tokens, for the longest `n` in `min_n ..= max_n` that occurs, at most
/// `k` of them. Empty when none occurs.
pub fn propose(tokens: &[u32], k: usize, min_n: usize, max_n: usize) -> Vec<u32> {
    if k == 0 {
        return Vec::new();
    }
    for n in (min_n.max(1)..=max_n).rev() {
        if tokens.len() <= n {
            continue;
        }
        let tail = &tokens[tokens.len() - n..];
        // The latest occurrence that ends before the tail itself and has a continuation.
        if let Some(start) = (0..tokens.len() - n)
            .rev()
            .find(|&s| &tokens[s..s + n] == tail)
        {
            let from = start + n;
            let to = (from + k).min(tokens.len());
            return tokens[from..to].to_vec();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(known: u32, committed: u32) -> Progress {
        Progress {
            known,
            committed,
            proposed: 0,
        }
    }

    #[test]
    fn decoders_advance_and_a_long_prompt_is_chunked() {
        // Two decoding sequences (one pending token each) and a 1000-token prompt, 64 tokens an epoch.
        let seqs = [p(50, 49), p(20, 19), p(1000, 0)];
        let plan = plan_epoch(&seqs, 64, 8, 64);
        assert_eq!(
            plan,
            [
                PlannedSpan {
                    seq: 0,
                    position: 49,
                    count: 1,
                    logits: true,
                    verify: 0,
                    every_row: false
                },
                PlannedSpan {
                    seq: 1,
                    position: 19,
                    count: 1,
                    logits: true,
                    verify: 0,
                    every_row: false
                },
                PlannedSpan {
                    seq: 2,
                    position: 0,
                    count: 62,
                    logits: false,
                    verify: 0,
                    every_row: false
                },
            ]
        );
        // The prompt's last chunk asks for logits.
        let plan = plan_epoch(&[p(1000, 990)], 64, 8, 64);
        assert_eq!(
            plan,
            [PlannedSpan {
                seq: 0,
                position: 990,
                count: 10,
                logits: true,
                verify: 0,
                every_row: false
            }]
        );
    }

    #[test]
    fn span_and_token_capacities_are_separate_limits() {
        let seqs: Vec<Progress> = (0..10).map(|_| p(5, 4)).collect();
        assert_eq!(plan_epoch(&seqs, 100, 3, 100).len(), 3, "span capacity");
        let plan = plan_epoch(&[p(10, 0), p(10, 0)], 12, 8, 12);
        assert_eq!(
            plan.iter().map(|s| s.count).collect::<Vec<_>>(),
            [10, 2],
            "token capacity"
        );
        // Sequences with nothing pending take no span.
        let plan = plan_epoch(&[p(5, 5), p(3, 2)], 10, 1, 10);
        assert_eq!(
            plan,
            [PlannedSpan {
                seq: 1,
                position: 2,
                count: 1,
                logits: true,
                verify: 0,
                every_row: false
            }]
        );
        assert!(plan_epoch(&[], 10, 1, 10).is_empty());
    }

    #[test]
    fn decoders_verify_their_proposals_within_the_token_capacity() {
        let seqs = [
            Progress {
                known: 10,
                committed: 9,
                proposed: 3,
            },
            Progress {
                known: 40,
                committed: 0,
                proposed: 5,
            },
            Progress {
                known: 7,
                committed: 6,
                proposed: 4,
            },
        ];
        let plan = plan_epoch(&seqs, 8, 8, 8);
        // The first decoder: 1 pending + 3 proposals; the prompt ignores its proposals and takes the other 4.
        assert_eq!(
            plan,
            [
                PlannedSpan {
                    seq: 0,
                    position: 9,
                    count: 4,
                    logits: true,
                    verify: 3,
                    every_row: false
                },
                PlannedSpan {
                    seq: 1,
                    position: 0,
                    count: 4,
                    logits: false,
                    verify: 0,
                    every_row: false
                },
            ]
        );
        assert_eq!(plan[0].logit_rows(), 4);
        assert_eq!(plan[1].logit_rows(), 0);
        // A decoder with 2 tokens of room left verifies only 1 proposal.
        let plan = plan_epoch(&seqs[2..], 2, 8, 2);
        assert_eq!((plan[0].count, plan[0].verify), (2, 1));
    }

    #[test]
    fn prompt_lookup_proposes_what_followed_the_latest_match() {
        // "a b c d a b c" -> after "a b c" came "d a b c"; at most 2 of them.
        let t = [1, 2, 3, 4, 1, 2, 3];
        assert_eq!(propose(&t, 2, 1, 3), [4, 1]);
        assert_eq!(propose(&t, 10, 1, 3), [4, 1, 2, 3]);
        // The latest occurrence wins: "5 9" then "5 8", the tail "5" matches the later one.
        assert_eq!(propose(&[5, 9, 5, 8, 5], 1, 1, 3), [8]);
        // Longer n-grams first: the tail "2 5" occurs once, followed by 6 (the bare "5" later by 7).
        assert_eq!(propose(&[2, 5, 6, 5, 7, 2, 5], 1, 1, 2), [6]);
        // No match of at least min_n tokens, no proposal; nor with k = 0.
        assert!(propose(&[1, 2, 3, 4], 4, 1, 3).is_empty());
        assert!(propose(&[1, 2, 1, 3], 4, 2, 3).is_empty());
        assert!(propose(&t, 0, 1, 3).is_empty());
    }

    #[test]
    fn prompts_take_at_most_the_prefill_share_while_sequences_decode() {
        // Two decoders and two prompts, 256 tokens an epoch, 64 of them for prompts while anything decodes.
        let seqs = [p(50, 49), p(20, 19), p(100, 0), p(300, 0)];
        let plan = plan_epoch(&seqs, 256, 8, 64);
        assert_eq!(
            plan.iter().map(|s| (s.seq, s.count)).collect::<Vec<_>>(),
            [(0, 1), (1, 1), (2, 64)]
        );
        // Nothing decoding: the prompts take the whole epoch.
        let plan = plan_epoch(&seqs[2..], 256, 8, 64);
        assert_eq!(
            plan.iter().map(|s| (s.seq, s.count)).collect::<Vec<_>>(),
            [(0, 100), (1, 156)]
        );
        // A one-token prompt remainder is a prompt too, but a single pending token is always taken.
        let plan = plan_epoch(&[p(50, 49), p(10, 9)], 256, 8, 0);
        assert_eq!(plan.len(), 2);
    }
}
