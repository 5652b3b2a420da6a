//! Raw F32 PCM resampling with an exact rational clock.

use rubato::audioadapter_buffers::direct::InterleavedSlice;
use rubato::{
    Async, FixedAsync, Resampler as _, SincInterpolationParameters, SincInterpolationType,
    WindowFunction,
};

use crate::AudioError;

/// Input frames handed to the filter per call. Input is re-blocked to this size internally,
/// so the filter sees the same calls whatever the caller's chunking.
const BLOCK: usize = 1024;

/// Output length of a finished [`Resampler`] session for `input_frames` input frames:
/// `round(input_frames * out_rate / in_rate)` with halves rounded up, computed exactly in
/// integers as `floor((2 * input_frames * out_rate + in_rate) / (2 * in_rate))`.
pub fn expected_output_frames(input_frames: u64, in_rate: u32, out_rate: u32) -> u64 {
    let num = 2 * u128::from(input_frames) * u128::from(out_rate) + u128::from(in_rate);
    let den = 2 * u128::from(in_rate);
    u64::try_from(num / den).unwrap_or(u64::MAX)
}

/// A resampling session for raw interleaved F32 PCM with a fixed channel count.
///
/// Output frame `j` estimates the band-limited input signal at input time
/// `j * in_rate / out_rate` (frame 0 is aligned with input frame 0; the filter's group delay
/// is removed). The filter is a windowed sinc (Blackman-Harris, 256 taps, cubic interpolation
/// between 256 oversampled phases, cutoff chosen by `rubato` below the lower Nyquist rate).
///
/// * [`Resampler::process`] accepts any number of whole frames and returns the output that is
///   available so far; filter history is kept between calls, so any chunking of the input
///   gives bit-identical concatenated output.
/// * [`Resampler::finish`] is the explicit end of input: it flushes the filter's lookahead
///   (feeding zeros past the end) and stops exactly at
///   [`expected_output_frames`]`(total_input_frames, in_rate, out_rate)` frames, so EOF
///   never extends the duration.
///
/// Equal rates pass samples through unchanged.
pub struct Resampler {
    in_rate: u32,
    out_rate: u32,
    channels: usize,
    inner: Option<Box<Async<f32>>>,
    /// Input not yet handed to the filter (less than one block, interleaved).
    pending: Vec<f32>,
    /// Output frames still to discard for the filter's delay.
    delay_left: usize,
    /// Filter output not yet returned (interleaved).
    held: Vec<f32>,
    /// Scratch output buffer of the filter.
    scratch: Vec<f32>,
    input_frames: u64,
    emitted_frames: u64,
    finished: bool,
}

impl std::fmt::Debug for Resampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resampler")
            .field("in_rate", &self.in_rate)
            .field("out_rate", &self.out_rate)
            .field("channels", &self.channels)
            .field("input_frames", &self.input_frames)
            .field("emitted_frames", &self.emitted_frames)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

/// Half the filter length, in input frames: rubato's group delay.
const HALF_SINC: u64 = 128;
const MAX_LEAD: u64 = 8192;

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// `(lead input frames, delay output frames)`, see [`Resampler::new`].
fn align_lead(in_rate: u32, out_rate: u32) -> (usize, usize) {
    let g = gcd(u64::from(in_rate), u64::from(out_rate));
    let (p, q) = (u64::from(out_rate) / g, u64::from(in_rate) / g);
    let lead = if q <= MAX_LEAD {
        (q - HALF_SINC % q) % q
    } else {
        (0..MAX_LEAD)
            .min_by_key(|l| {
                let r = ((HALF_SINC + l) * p) % q;
                r.min(q - r)
            })
            .unwrap_or(0)
    };
    // rubato's first output frame already sits one output frame into that delay
    // (measured against the analytic signal and the reference in tests/audio.rs).
    let delay = (((HALF_SINC + lead) * p * 2 + q) / (2 * q)).saturating_sub(1);
    (lead as usize, delay as usize)
}

impl Resampler {
    /// A session converting `in_rate` to `out_rate` for `channels` interleaved channels.
    pub fn new(in_rate: u32, out_rate: u32, channels: usize) -> Result<Self, AudioError> {
        if in_rate == 0 || out_rate == 0 {
            return Err(AudioError::InvalidRate(format!("{in_rate} -> {out_rate}")));
        }
        if channels == 0 {
            return Err(AudioError::Channels { from: 0, to: 0 });
        }
        let (inner, delay) = if in_rate == out_rate {
            (None, 0)
        } else {
            let params = SincInterpolationParameters {
                sinc_len: 256,
                f_cutoff: None,
                oversampling_factor: 256,
                interpolation: SincInterpolationType::Cubic,
                window: WindowFunction::BlackmanHarris2,
            };
            let ratio = f64::from(out_rate) / f64::from(in_rate);
            let r = Async::<f32>::new_sinc(ratio, 1.0, &params, BLOCK, channels, FixedAsync::Input)
                .map_err(|e| AudioError::Resample(e.to_string()))?;
            (Some(Box::new(r)), 0)
        };
        // rubato delays the signal by SINC_LEN / 2 input frames and trims only the integer
        // part of that delay in output frames. Prime the filter with `lead` zero frames so
        // that the whole delay, (SINC_LEN / 2 + lead) * out / in, is an integer number of
        // output frames; discarding it then aligns output frame 0 with input frame 0
        // exactly. For rate pairs whose reduced denominator exceeds MAX_LEAD the best lead
        // in 0..MAX_LEAD is used (residual misalignment below one output frame / MAX_LEAD).
        let (lead, delay) = if inner.is_some() {
            align_lead(in_rate, out_rate)
        } else {
            (0, delay)
        };
        Ok(Self {
            in_rate,
            out_rate,
            channels,
            inner,
            pending: vec![0.0; lead * channels],
            delay_left: delay,
            held: Vec::new(),
            scratch: Vec::new(),
            input_frames: 0,
            emitted_frames: 0,
            finished: false,
        })
    }

    /// Input rate in Hz.
    pub fn in_rate(&self) -> u32 {
        self.in_rate
    }

    /// Output rate in Hz.
    pub fn out_rate(&self) -> u32 {
        self.out_rate
    }

    /// Channel count.
    pub fn channels(&self) -> usize {
        self.channels
    }

    /// Input frames accepted so far.
    pub fn input_frames(&self) -> u64 {
        self.input_frames
    }

    /// Output frames returned so far.
    pub fn output_frames(&self) -> u64 {
        self.emitted_frames
    }

    /// Feeds interleaved input; returns the interleaved output available so far.
    pub fn process(&mut self, input: &[f32]) -> Result<Vec<f32>, AudioError> {
        if self.finished {
            return Err(AudioError::State("resampler: process after finish"));
        }
        if !input.len().is_multiple_of(self.channels) {
            return Err(AudioError::RaggedInput {
                len: input.len(),
                channels: self.channels,
            });
        }
        self.input_frames += (input.len() / self.channels) as u64;
        if self.inner.is_none() {
            self.emitted_frames = self.input_frames;
            return Ok(input.to_vec());
        }
        self.pending.extend_from_slice(input);
        let block = BLOCK * self.channels;
        let mut start = 0;
        while self.pending.len() - start >= block {
            let chunk: Vec<f32> = self.pending[start..start + block].to_vec();
            self.run_block(&chunk)?;
            start += block;
        }
        self.pending.drain(..start);
        // Never return more than the shortest possible final length, so that `finish` can
        // always stop at the exact length.
        let bound = expected_output_frames(self.input_frames, self.in_rate, self.out_rate);
        Ok(self.emit_up_to(bound))
    }

    /// Ends the input; returns the remaining output. Afterwards the session has produced
    /// exactly [`expected_output_frames`] frames in total.
    pub fn finish(&mut self) -> Result<Vec<f32>, AudioError> {
        if self.finished {
            return Err(AudioError::State("resampler: finish called twice"));
        }
        self.finished = true;
        let total = expected_output_frames(self.input_frames, self.in_rate, self.out_rate);
        if self.inner.is_none() {
            return Ok(Vec::new());
        }
        let block = BLOCK * self.channels;
        let mut tail = std::mem::take(&mut self.pending);
        tail.resize(block, 0.0);
        self.run_block(&tail)?;
        let zeros = vec![0.0f32; block];
        // Each zero block yields about BLOCK * ratio frames; the bound guards against a
        // misbehaving filter.
        let mut guard = 0;
        while self.emitted_frames + ((self.held.len() / self.channels) as u64) < total {
            self.run_block(&zeros)?;
            guard += 1;
            if guard > 1_000_000 {
                return Err(AudioError::Resample("flush did not converge".into()));
            }
        }
        Ok(self.emit_up_to(total))
    }

    fn run_block(&mut self, chunk: &[f32]) -> Result<(), AudioError> {
        let Some(inner) = self.inner.as_mut() else {
            return Ok(());
        };
        let ch = self.channels;
        let out_max = inner.output_frames_max();
        self.scratch.resize(out_max * ch, 0.0);
        let input = InterleavedSlice::new(chunk, ch, BLOCK)
            .map_err(|e| AudioError::Resample(e.to_string()))?;
        let mut output = InterleavedSlice::new_mut(&mut self.scratch[..], ch, out_max)
            .map_err(|e| AudioError::Resample(e.to_string()))?;
        let (_, produced) = inner
            .process_into_buffer(&input, &mut output, None)
            .map_err(|e| AudioError::Resample(e.to_string()))?;
        let skip = self.delay_left.min(produced);
        self.delay_left -= skip;
        self.held
            .extend_from_slice(&self.scratch[skip * ch..produced * ch]);
        Ok(())
    }

    fn emit_up_to(&mut self, bound_frames: u64) -> Vec<f32> {
        let avail = (self.held.len() / self.channels) as u64;
        let n = avail.min(bound_frames.saturating_sub(self.emitted_frames));
        self.emitted_frames += n;
        let n = usize::try_from(n).unwrap_or(usize::MAX) * self.channels;
        let out: Vec<f32> = self.held.drain(..n).collect();
        if self.finished {
            self.held.clear();
        }
        out
    }
}
