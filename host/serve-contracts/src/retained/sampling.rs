//! Server-side sampling for retained text: one [`Sampler`] per generated sequence (a request's choice), fed the
//! final-position logits of its row after each epoch. Everything that decides the next token lives here, in the
//! server, never in a package: the package returns logits; the server picks.
//!
//! The pipeline, in order (each step is skipped when its parameter has its neutral value):
//!
//! 1. `logit_bias`: `z[id] += bias`.
//! 2. `repetition_penalty` r (the CTRL/llama.cpp/vLLM form) over every token seen so far, prompt and
//!    generated: `z > 0 ? z / r : z * r`.
//! 3. `presence_penalty` and `frequency_penalty` (OpenAI's form) over generated tokens only:
//!    `z -= frequency * count + presence * (count > 0)`.
//! 4. `temperature` 0 (or `top_k` 1): the argmax (the lowest id among equal maxima); nothing is drawn.
//! 5. `z /= temperature`.
//! 6. `top_k`: the k largest (ties broken by lower id).
//! 7. `top_p`: the smallest prefix of the candidates by descending probability (ties by lower id) whose mass
//!    reaches `top_p` of the candidates' mass.
//! 8. `min_p`: candidates whose probability is below `min_p` times the largest one's are dropped.
//! 9. One draw from the remaining candidates, in descending-probability order, with the sequence's own
//!    random stream.
//!
//! **Reproducibility.** The random stream is a function of the request's `seed` and the choice index only
//! (SplitMix64 seeding xoshiro256++), advanced once per drawn token; nothing depends on batch neighbours, the
//! epoch a token was produced in, or thread timing. Given the same logits, a seeded request therefore samples
//! the same tokens alone and batched; the logits being the same is the kernels' side of that promise.
//!
//! **Log probabilities** (`logprobs`, `top_logprobs`) are those of the model's raw distribution,
//! `log_softmax(logits)` before any step above (what vLLM reports by default, and what makes them comparable
//! across sampling settings).

use std::collections::HashMap;

/// Most `top_logprobs` a request may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One sequence's sampling parameters (OpenAI / vLLM names and ranges).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 is greedy; at most 2.
    pub temperature: f32,
    /// 0: no limit.
    pub top_k: usize,
    /// In (0, 1]; 1: no limit.
    pub top_p: f32,
    /// In [0, 1]; 0: no limit.
    pub min_p: f32,
    /// In (0, 2]... (any positive value is accepted); 1: none.
    pub repetition_penalty: f32,
    /// In [-2, 2].
    pub presence_penalty: f32,
    /// In [-2, 2].
    pub frequency_penalty: f32,
    /// Token id -> bias in [-100, 100].
    pub logit_bias: Vec<(u32, f32)>,
    /// The random stream's seed.
    pub seed: u64,
    /// Report the chosen token's log probability.
    pub logprobs: bool,
    /// Also report this many most likely tokens (at most [`MAX_TOP_LOGPROBS`]).
    pub top_logprobs: usize,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0,
            logprobs: false,
            top_logprobs: 0,
        }
    }
}

impl SamplingParams {
    /// Checks every field against its range for a vocabulary of `vocab` ids; the error names the field (the
    /// OpenAI name) and what was expected.
    pub fn validate(&self, vocab: usize) -> Result<(), String> {
        let range = |name: &str, v: f32, lo: f32, hi: f32| {
            if v.is_finite() && (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(format!("`{name}` must be between {lo} and {hi}, got {v}"))
            }
        };
        range("temperature", self.temperature, 0.0, 2.0)?;
        if !(self.top_p.is_finite() && self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!(
                "`top_p` must be greater than 0 and at most 1, got {}",
                self.top_p
            ));
        }
        range("min_p", self.min_p, 0.0, 1.0)?;
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(format!(
                "`repetition_penalty` must be greater than 0, got {}",
                self.repetition_penalty
            ));
        }
        range("presence_penalty", self.presence_penalty, -2.0, 2.0)?;
        range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)?;
        for &(id, b) in &self.logit_bias {
            if id as usize >= vocab {
                return Err(format!(
                    "`logit_bias` names token {id}, but the vocabulary has {vocab} tokens"
                ));
            }
            range(&format!("logit_bias[{id}]"), b, -100.0, 100.0)?;
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(format!(
                "`top_logprobs` must be at most {MAX_TOP_LOGPROBS}, got {}",
                self.top_logprobs
            ));
        }
        Ok(())
    }

    fn greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }
}

/// A drawn token.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub token: u32,
    /// Its raw log probability, when asked for.
    pub logprob: Option<f32>,
    /// The most likely tokens with their raw log probabilities, most likely first (ties by lower id).
    pub top: Vec<(u32, f32)>,
}

/// The random stream of one sequence: xoshiro256++ seeded by SplitMix64 from (seed, stream).
#[derive(Debug, Clone)]
pub struct Rng([u64; 4]);

impl Rng {
    pub fn new(seed: u64, stream: u64) -> Rng {
        let mut x = seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03);
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng([next(), next(), next(), next()])
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let r = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        r
    }

    /// Uniform in [0, 1), 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Orders (id, score) by descending score, then ascending id: the one order every step uses.
fn desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The `k` best of `items` in [`desc`] order (a selection, then a sort of the k).
fn best(items: &mut Vec<(u32, f32)>, k: usize) {
    if k < items.len() {
        items.select_nth_unstable_by(k, desc);
        items.truncate(k);
    }
    items.sort_unstable_by(desc);
}

/// One generated sequence's sampler: its parameters, random stream and token history.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    /// Generated tokens and their counts (presence/frequency penalties).
    generated: HashMap<u32, u32>,
    /// Every token seen, prompt and generated (repetition penalty).
    seen: Vec<u32>,
    seen_set: std::collections::HashSet<u32>,
    z: Vec<f32>,
    cand: Vec<(u32, f32)>,
}

impl Sampler {
    /// A sampler for choice `stream` of a request with `params`, whose prompt is `prompt`.
    pub fn new(params: SamplingParams, stream: u64, prompt: &[u32]) -> Sampler {
        let rng = Rng::new(params.seed, stream);
        let mut s = Sampler {
            params,
            rng,
            generated: HashMap::new(),
            seen: Vec::new(),
            seen_set: Default::default(),
            z: Vec::new(),
            cand: Vec::new(),
        };
        for &t in prompt {
            s.see(t);
        }
        s
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    fn see(&mut self, t: u32) {
        if self.seen_set.insert(t) {
            self.seen.push(t);
        }
    }

    /// Records `token` as generated (done by [`Sampler::sample`]; call it for a token chosen elsewhere).
    pub fn accept(&mut self, token: u32) {
        *self.generated.entry(token).or_default() += 1;
        self.see(token);
    }

    /// Whether steps 1-3 change any logit (else the raw logits are drawn from as they are).
    fn adjusts(&self) -> bool {
        let p = &self.params;
        !p.logit_bias.is_empty()
            || (p.repetition_penalty != 1.0 && !self.seen.is_empty())
            || ((p.presence_penalty != 0.0 || p.frequency_penalty != 0.0)
                && !self.generated.is_empty())
    }

    /// Steps 1-3: the adjusted logits in `self.z`.
    fn adjust(&mut self, logits: &[f32]) {
        self.z.clear();
        self.z.extend_from_slice(logits);
        let z = &mut self.z;
        for &(id, b) in &self.params.logit_bias {
            if let Some(x) = z.get_mut(id as usize) {
                *x += b;
            }
        }
        let r = self.params.repetition_penalty;
        if r != 1.0 {
            for &t in &self.seen {
                if let Some(x) = z.get_mut(t as usize) {
                    *x = if *x > 0.0 { *x / r } else { *x * r };
                }
            }
        }
        let (pres, freq) = (self.params.presence_penalty, self.params.frequency_penalty);
        if pres != 0.0 || freq != 0.0 {
            for (&t, &c) in &self.generated {
                if let Some(x) = z.get_mut(t as usize) {
                    *x -= freq * c as f32 + pres;
                }
            }
        }
    }

    /// The distribution the next draw is made from (steps 1-8), as (id, probability) in draw order
    /// (descending probability, ties by lower id), probabilities summing to 1. Greedy settings give one
    /// candidate with probability 1. Does not advance the random stream.
    pub fn distribution(&mut self, logits: &[f32]) -> Vec<(u32, f64)> {
        self.candidates(logits);
        let total: f64 = self.cand.iter().map(|c| c.1 as f64).sum();
        self.cand
            .iter()
            .map(|&(id, p)| (id, p as f64 / total))
            .collect()
    }

    /// Steps 1-8 into `self.cand` as (id, unnormalised probability) in draw order.
    fn candidates(&mut self, logits: &[f32]) {
        // The logits are copied only where steps 1-3 change them (a row is 49,152 floats for SmolLM2, and an
        // epoch of 16 decoding streams draws from 16 rows).
        let adjusted = self.adjusts();
        if adjusted {
            self.adjust(logits);
        }
        self.cand.clear();
        let z = if adjusted { &self.z[..] } else { logits };
        if self.params.greedy() || z.len() <= 1 {
            self.cand.push((argmax(z) as u32, 1.0));
            return;
        }
        let inv_t = 1.0 / self.params.temperature;
        self.cand
            .extend(z.iter().enumerate().map(|(i, &x)| (i as u32, x * inv_t)));
        // NaN logits never win: they sort last and get probability 0.
        for c in &mut self.cand {
            if c.1.is_nan() {
                c.1 = f32::NEG_INFINITY;
            }
        }
        let k = self.params.top_k;
        let top_p = self.params.top_p;
        // The mass top_p is measured against, relative to the best candidate, when not all candidates
        // stay in `cand` (the nucleus search below keeps only a head).
        let mut full_mass = None;
        if k > 0 {
            best(&mut self.cand, k);
        } else if top_p < 1.0 {
            // Sort only as much as the nucleus needs: the best 64, then 4x more until the mass is reached.
            let zmax = self
                .cand
                .iter()
                .map(|c| c.1)
                .fold(f32::NEG_INFINITY, f32::max);
            let mass: f64 = self.cand.iter().map(|c| ((c.1 - zmax) as f64).exp()).sum();
            let mut n = 64;
            loop {
                let mut head = self.cand.clone();
                best(&mut head, n);
                let head_mass: f64 = head.iter().map(|c| ((c.1 - zmax) as f64).exp()).sum();
                if head_mass >= top_p as f64 * mass || n >= self.cand.len() {
                    self.cand = head;
                    full_mass = Some(mass);
                    break;
                }
                n *= 4;
            }
        } else {
            self.cand.sort_unstable_by(desc);
        }
        // Probabilities relative to the best candidate (exp(z - zmax)), in draw order.
        let zmax = self.cand[0].1;
        for c in &mut self.cand {
            c.1 = (c.1 - zmax).exp();
        }
        if top_p < 1.0 {
            let total = full_mass.unwrap_or_else(|| self.cand.iter().map(|c| c.1 as f64).sum());
            let want = top_p as f64 * total;
            let mut acc = 0.0;
            let mut keep = self.cand.len();
            for (i, c) in self.cand.iter().enumerate() {
                acc += c.1 as f64;
                if acc >= want {
                    keep = i + 1;
                    break;
                }
            }
            self.cand.truncate(keep);
        }
        let min_p = self.params.min_p;
        if min_p > 0.0 {
            // The best candidate has relative probability 1.
            let keep = self.cand.iter().take_while(|c| c.1 >= min_p).count();
            self.cand.truncate(keep.max(1));
        }
    }

    /// Draws the next token from `logits` (one row of the model's output, `vocab` long) and records it.
    pub fn sample(&mut self, logits: &[f32]) -> Sample {
        let (logprob, top) = if self.params.logprobs || self.params.top_logprobs > 0 {
            raw_logprobs(logits, self.params.top_logprobs)
        } else {
            (None, Vec::new())
        };
        self.candidates(logits);
        let token = if self.cand.len() == 1 {
            self.cand[0].0
        } else {
            let total: f64 = self.cand.iter().map(|c| c.1 as f64).sum();
            let mut u = self.rng.next_f64() * total;
            let mut pick = self.cand[self.cand.len() - 1].0;
            for c in &self.cand {
                u -= c.1 as f64;
                if u < 0.0 {
                    pick = c.0;
                    break;
                }
            }
            pick
        };
        self.accept(token);
        Sample {
            token,
            logprob: logprob.map(|lse| logits[token as usize] - lse),
            top,
        }
    }
}

/// `token` as a sample of `logits` with its raw log probability and the `top` best tokens' (scoring a known
/// token: the server's prompt log probabilities).
pub fn score(logits: &[f32], token: u32, top: usize) -> Sample {
    let (lse, top) = raw_logprobs(logits, top);
    Sample {
        token,
        logprob: lse.map(|lse| logits[token as usize] - lse),
        top,
    }
}

/// The log-sum-exp of `logits` and the `n` best tokens with their log probabilities.
fn raw_logprobs(logits: &[f32], n: usize) -> (Option<f32>, Vec<(u32, f32)>) {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let s: f64 = logits.iter().map(|&x| ((x - m) as f64).exp()).sum();
    let lse = m + s.ln() as f32;
    let mut top: Vec<(u32, f32)> = Vec::new();
    if n > 0 {
        top = logits
            .iter()
            .enumerate()
            .map(|(i, &x)| (i as u32, x))
            .collect();
        best(&mut top, n);
        for t in &mut top {
            t.1 -= lse;
        }
    }
    (Some(lse), top)
}

/// The index of the first largest value of `z`, NaN never winning (the last index when all are NaN; 0 when `z`
/// is empty): the greedy draw, once per row of 49,152 logits for SmolLM2. Both passes are written to
/// vectorise: the maximum 16 lanes at a time (`x > m`, a single `maxps`, which a NaN never passes), then its
/// first position 16 values at a time (a chunk's compares or-ed together, and only the chunk that holds it
/// searched one by one).
fn argmax(z: &[f32]) -> usize {
    #[inline(always)]
    fn larger(m: f32, x: f32) -> f32 {
        if x > m { x } else { m }
    }
    let mut lanes = [f32::NEG_INFINITY; 16];
    let chunks = z.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            *m = larger(*m, x);
        }
    }
    let m = tail
        .iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |a, &b| larger(a, b));
    let mut base = 0;
    for c in z.chunks(16) {
        if c.iter().fold(false, |hit, &x| hit | (x == m)) {
            return base + c.iter().position(|&x| x == m).unwrap_or(0);
        }
        base += c.len();
    }
    z.len().saturating_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An independent, naive implementation of the documented pipeline: full sorts, f64 throughout.
    fn naive(
        p: &SamplingParams,
        logits: &[f32],
        prompt: &[u32],
        generated: &[u32],
    ) -> Vec<(u32, f64)> {
        let mut z: Vec<f64> = logits.iter().map(|&x| x as f64).collect();
        for &(id, b) in &p.logit_bias {
            if let Some(x) = z.get_mut(id as usize) {
                *x += b as f64;
            }
        }
        let r = p.repetition_penalty as f64;
        let mut seen: Vec<u32> = prompt.iter().chain(generated).copied().collect();
        seen.sort();
        seen.dedup();
        for t in seen {
            let x = &mut z[t as usize];
            *x = if *x > 0.0 { *x / r } else { *x * r };
        }
        for (t, x) in z.iter_mut().enumerate() {
            let c = generated.iter().filter(|&&g| g as usize == t).count() as f64;
            if c > 0.0 {
                *x -= p.frequency_penalty as f64 * c + p.presence_penalty as f64;
            }
        }
        let mut order: Vec<usize> = (0..z.len()).collect();
        order.sort_by(|&a, &b| z[b].total_cmp(&z[a]).then(a.cmp(&b)));
        if p.temperature == 0.0 || p.top_k == 1 {
            return vec![(order[0] as u32, 1.0)];
        }
        let t = p.temperature as f64;
        if p.top_k > 0 {
            order.truncate(p.top_k);
        }
        let zmax = z[order[0]];
        let mut probs: Vec<(u32, f64)> = order
            .iter()
            .map(|&i| (i as u32, ((z[i] - zmax) / t).exp()))
            .collect();
        let total: f64 = probs.iter().map(|x| x.1).sum();
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let mut keep = probs.len();
            for (i, x) in probs.iter().enumerate() {
                acc += x.1;
                if acc >= p.top_p as f64 * total {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
        }
        if p.min_p > 0.0 {
            let best = probs[0].1;
            let keep = probs
                .iter()
                .take_while(|x| x.1 >= p.min_p as f64 * best)
                .count();
            probs.truncate(keep.max(1));
        }
        let total: f64 = probs.iter().map(|x| x.1).sum();
        probs.into_iter().map(|(i, x)| (i, x / total)).collect()
    }

    fn logits(rng: &mut Rng, n: usize, spread: f64) -> Vec<f32> {
        (0..n)
            .map(|_| ((rng.next_f64() - 0.5) * spread) as f32)
            .collect()
    }

    #[test]
    fn the_distribution_matches_a_naive_implementation() {
        let mut rng = Rng::new(7, 0);
        let settings = [
            SamplingParams::default(),
            SamplingParams {
                temperature: 0.7,
                top_k: 40,
                ..Default::default()
            },
            SamplingParams {
                temperature: 1.3,
                top_p: 0.9,
                ..Default::default()
            },
            SamplingParams {
                temperature: 0.8,
                top_p: 0.5,
                min_p: 0.05,
                top_k: 100,
                ..Default::default()
            },
            SamplingParams {
                min_p: 0.2,
                repetition_penalty: 1.3,
                presence_penalty: 0.5,
                frequency_penalty: 0.7,
                logit_bias: vec![(3, 5.0), (10, -100.0)],
                ..Default::default()
            },
            SamplingParams {
                temperature: 0.0,
                repetition_penalty: 0.8,
                ..Default::default()
            },
        ];
        for (case, p) in settings.iter().enumerate() {
            for n in [2usize, 17, 300, 5000] {
                let l = logits(&mut rng, n, 12.0);
                let prompt: Vec<u32> = (0..5).map(|_| (rng.next_u64() % n as u64) as u32).collect();
                let generated: Vec<u32> =
                    (0..6).map(|_| (rng.next_u64() % n as u64) as u32).collect();
                let mut s = Sampler::new(p.clone(), 0, &prompt);
                for &g in &generated {
                    s.accept(g);
                }
                let got = s.distribution(&l);
                let want = naive(p, &l, &prompt, &generated);
                assert_eq!(got.len(), want.len(), "case {case}, n {n}");
                for (g, w) in got.iter().zip(&want) {
                    assert_eq!(g.0, w.0, "case {case}, n {n}");
                    assert!(
                        (g.1 - w.1).abs() < 1e-5,
                        "case {case}, n {n}: {g:?} vs {w:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn draws_follow_the_distribution() {
        let l: Vec<f32> = vec![2.0, 1.0, 0.5, 0.0, -1.0, -3.0];
        let p = SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            seed: 42,
            ..Default::default()
        };
        let want = Sampler::new(p.clone(), 0, &[]).distribution(&l);
        let mut counts = [0usize; 6];
        let draws = 40_000;
        let mut s = Sampler::new(p, 0, &[]);
        for _ in 0..draws {
            // A fresh history each draw: only the random stream advances.
            s.generated.clear();
            s.seen.clear();
            s.seen_set.clear();
            counts[s.sample(&l).token as usize] += 1;
        }
        for (id, prob) in want {
            let f = counts[id as usize] as f64 / draws as f64;
            // 5 standard deviations of a binomial frequency.
            let sd = (prob * (1.0 - prob) / draws as f64).sqrt();
            assert!((f - prob).abs() < 5.0 * sd + 1e-9, "{id}: {f} vs {prob}");
        }
        let kept: usize = counts.iter().filter(|&&c| c > 0).count();
        assert!(kept < 6, "top_p dropped the tail: {counts:?}");
    }

    #[test]
    fn seeded_streams_are_reproducible_and_independent() {
        let l: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32 / 25.0).collect();
        let p = SamplingParams {
            temperature: 1.0,
            seed: 1234,
            ..Default::default()
        };
        let run = |stream: u64| {
            let mut s = Sampler::new(p.clone(), stream, &[]);
            (0..64).map(|_| s.sample(&l).token).collect::<Vec<_>>()
        };
        assert_eq!(run(0), run(0));
        assert_ne!(run(0), run(1), "choices of one request draw differently");
        let other = SamplingParams {
            seed: 1235,
            ..p.clone()
        };
        let mut s = Sampler::new(other, 0, &[]);
        let b: Vec<u32> = (0..64).map(|_| s.sample(&l).token).collect();
        assert_ne!(run(0), b);
    }

    #[test]
    fn the_vectorised_argmax_is_the_first_maximum_nan_never_winning() {
        let scalar = |z: &[f32]| {
            let mut arg = 0usize;
            for (i, &x) in z.iter().enumerate() {
                if x > z[arg] || z[arg].is_nan() {
                    arg = i;
                }
            }
            arg
        };
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for len in [1usize, 2, 15, 16, 17, 33, 100, 49152] {
            for case in 0..8 {
                let mut z: Vec<f32> = (0..len).map(|_| (next() % 7) as f32 - 3.0).collect();
                match case {
                    1 => z.iter_mut().step_by(3).for_each(|x| *x = f32::NAN),
                    2 => z.iter_mut().for_each(|x| *x = f32::NAN),
                    3 => z.iter_mut().for_each(|x| *x = f32::NEG_INFINITY),
                    4 => z[len - 1] = f32::INFINITY,
                    5 => z[0] = f32::NAN,
                    _ => {}
                }
                assert_eq!(argmax(&z), scalar(&z), "len {len} case {case}");
            }
        }
    }

    #[test]
    fn greedy_is_the_lowest_argmax_and_logprobs_are_raw() {
        let l = vec![1.0f32, 3.0, 3.0, -2.0];
        let p = SamplingParams {
            temperature: 0.0,
            logprobs: true,
            top_logprobs: 3,
            logit_bias: vec![(0, 1.5)],
            ..Default::default()
        };
        let s = Sampler::new(p, 0, &[]).sample(&l);
        assert_eq!(s.token, 1);
        let lse = (l.iter().map(|&x| (x as f64).exp()).sum::<f64>()).ln();
        assert!((s.logprob.unwrap() as f64 - (3.0 - lse)).abs() < 1e-6);
        let ids: Vec<u32> = s.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 2, 0], "raw order, before the bias");
        // A bias large enough changes the greedy choice.
        let p = SamplingParams {
            temperature: 0.0,
            logit_bias: vec![(3, 6.0)],
            ..Default::default()
        };
        assert_eq!(Sampler::new(p, 0, &[]).sample(&l).token, 3);
    }

    #[test]
    fn validation_names_the_field() {
        let bad = [
            (
                SamplingParams {
                    temperature: 2.5,
                    ..Default::default()
                },
                "`temperature`",
            ),
            (
                SamplingParams {
                    top_p: 0.0,
                    ..Default::default()
                },
                "`top_p`",
            ),
            (
                SamplingParams {
                    min_p: f32::NAN,
                    ..Default::default()
                },
                "`min_p`",
            ),
            (
                SamplingParams {
                    logit_bias: vec![(50, 1.0)],
                    ..Default::default()
                },
                "token 50",
            ),
            (
                SamplingParams {
                    top_logprobs: 21,
                    ..Default::default()
                },
                "`top_logprobs`",
            ),
        ];
        for (p, want) in bad {
            let e = p.validate(50).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
        SamplingParams::default().validate(50).unwrap();
    }
}
