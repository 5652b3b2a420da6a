//! Audio codecs for loom-serve.
//!
//! Two session types, both `Send` so that any worker can continue a session that another
//! worker started:
//!
//! * [`Resampler`]: raw interleaved F32 PCM in, filtered (windowed-sinc, `rubato`) resampled
//!   F32 PCM out, with an exact rational sample clock and filter history kept across arbitrary
//!   input chunk boundaries. No codec dependency is involved.
//! * [`AudioDecoder`]: WAV, MP3 or FLAC bytes in (via `symphonia`), bounded F32 PCM out at a
//!   requested rate and channel count.

mod decoder;
mod resampler;

pub use decoder::{AudioDecoder, DecoderConfig, Next, SourceInfo};
pub use resampler::{Resampler, expected_output_frames};

/// Memory layout of a [`PcmBlock`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// Frame-major: `L0 R0 L1 R1 ...`.
    #[default]
    Interleaved,
    /// Channel-major, planes stored back to back: `L0 L1 ... R0 R1 ...`.
    Planar,
}

/// A block of decoded F32 PCM.
#[derive(Debug, Clone, PartialEq)]
pub struct PcmBlock {
    /// Sample rate in Hz.
    pub rate: u32,
    /// Number of channels.
    pub channels: u16,
    /// Layout of `samples`.
    pub layout: Layout,
    /// `frames() * channels` samples.
    pub samples: Vec<f32>,
}

impl PcmBlock {
    /// Number of frames (samples per channel).
    pub fn frames(&self) -> usize {
        self.samples.len() / usize::from(self.channels.max(1))
    }

    /// One channel's samples, whatever the layout.
    pub fn channel(&self, c: usize) -> Vec<f32> {
        let ch = usize::from(self.channels);
        let frames = self.frames();
        match self.layout {
            Layout::Interleaved => self.samples.iter().skip(c).step_by(ch).copied().collect(),
            Layout::Planar => self.samples[c * frames..(c + 1) * frames].to_vec(),
        }
    }
}

/// Errors of the audio codecs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AudioError {
    /// A sample rate of zero, or rates that cannot be handled.
    #[error("invalid sample rate: {0}")]
    InvalidRate(String),
    /// Zero channels, or a channel conversion that is not supported.
    #[error("unsupported channel conversion from {from} to {to} channels")]
    Channels {
        /// Source channel count.
        from: usize,
        /// Requested channel count.
        to: usize,
    },
    /// Input whose length is not a multiple of the channel count.
    #[error("input of {len} samples is not a whole number of {channels}-channel frames")]
    RaggedInput {
        /// Samples given.
        len: usize,
        /// Channel count.
        channels: usize,
    },
    /// The total decoded output would exceed the configured cap.
    #[error("decoded output exceeds the cap of {cap} samples")]
    OutputCap {
        /// The cap, in samples (frames × channels).
        cap: u64,
    },
    /// More encoded input than the configured cap.
    #[error("encoded input exceeds the cap of {cap} bytes")]
    InputCap {
        /// The cap, in bytes.
        cap: usize,
    },
    /// Session used after `finish()` or before it where that is not allowed.
    #[error("session state: {0}")]
    State(&'static str),
    /// Unknown container or codec, or malformed data.
    #[error("decode: {0}")]
    Decode(String),
    /// Error inside the resampler.
    #[error("resampler: {0}")]
    Resample(String),
}
