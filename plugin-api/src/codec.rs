//! Codec interfaces (ABI 1.1): streaming audio decoding, raw PCM resampling, image decode/encode.
//!
//! A [`PluginKind::CODEC`](crate::PluginKind::CODEC) plugin's [`LoomPlugin::codec`](crate::LoomPlugin::codec)
//! returns a [`Codec`], which hands out an [`AudioCodec`] and/or an [`ImageCodec`] (a plugin may provide either
//! or both; the other one is an error naming what is missing). Everything that crosses the boundary is plain
//! data: `#[repr(C)]` structs, [`RVec`], `RString`, and `#[repr(transparent)]` integer "enums" (such as
//! [`AudioContainer`]) so that a value from a newer host is an error in an older plugin, never undefined
//! behaviour.
//!
//! # Audio
//!
//! A decode session ([`AudioCodec::open_decoder`]) is configured once with a [`DecodeConfig`]: the container
//! expected (or [`AudioContainer::AUTO`]), the output channel count and rate (0 keeps the source's), a budget
//! on the total output samples (frames × output channels) and on the encoded input bytes, and the largest
//! chunk to return. Then:
//!
//! 1. [`AudioDecodeSession::push`] encoded bytes, in any chunking;
//! 2. [`AudioDecodeSession::finish`]: the explicit end of input; returns the source track's [`AudioSourceInfo`];
//! 3. [`AudioDecodeSession::next_chunk`] until it returns `None`.
//!
//! **Streaming** (ABI 1.4, no new method): `next_chunk` may also be called between pushes, before `finish`.
//! It then returns the chunks the bytes pushed so far can be decoded into, and a chunk of **0 frames** when
//! it needs more input (push more, or `finish`); the samples of the whole session are the same as without
//! such calls. A 0-frame chunk only ever comes before `finish`. Plugins built for 1.1-1.3 answer
//! `next_chunk` before `finish` with an error, so a host that streams checks the plugin's ABI minor (or
//! treats that error as "finish first").
//!
//! Chunks are **interleaved** F32 PCM (frame-major: `L0 R0 L1 R1 ...`) with their channel count and rate; each
//! holds between 1 and `max_chunk_frames` frames. Resampling is filtered (windowed sinc) with an exact
//! rational clock: a finished stream has `round(decoded_frames * out_rate / src_rate)` frames (halves up), so
//! the flush at end of stream never extends the duration. A session is `Send` (not `Sync`): it can move
//! between workers between calls.
//!
//! A raw resampling session ([`AudioCodec::open_resampler`]) takes interleaved F32 PCM with no container and
//! has the same clock: [`ResampleSession::process`] returns what is available so far (filter history is kept,
//! so any chunking gives identical output), [`ResampleSession::finish`] flushes the filter.
//!
//! # Images
//!
//! [`ImageCodec::decode`] reads PNG, JPEG or WebP into packed, row-major RGB8 or RGBA8 (no resizing), with the
//! EXIF orientation as metadata only; the header's `width * height` is checked against
//! [`ImageDecodeConfig::max_pixels`] before any pixel is decoded. [`ImageCodec::encode`] writes PNG, JPEG
//! (RGB8 only) or lossless WebP.

use abi_stable::std_types::{RBox, RBoxError, ROption, RResult, RSlice, RVec};
use abi_stable::{StableAbi, sabi_trait};

use crate::error;

/// A codec plugin's entry point as it crosses the boundary.
pub type CodecBox = Codec_TO<'static, RBox<()>>;
/// An audio codec as it crosses the boundary.
pub type AudioCodecBox = AudioCodec_TO<'static, RBox<()>>;
/// An audio decode session as it crosses the boundary.
pub type AudioDecodeSessionBox = AudioDecodeSession_TO<'static, RBox<()>>;
/// A raw PCM resampling session as it crosses the boundary.
pub type ResampleSessionBox = ResampleSession_TO<'static, RBox<()>>;
/// An image codec as it crosses the boundary.
pub type ImageCodecBox = ImageCodec_TO<'static, RBox<()>>;

/// The [`LoomPlugin::codec`](crate::LoomPlugin::codec) of a plugin that is not a codec: always an error.
pub extern "C" fn no_codec() -> RResult<CodecBox, RBoxError> {
    RResult::RErr(error("this plugin is not a codec plugin"))
}

/// A codec plugin's entry point: what it provides.
#[sabi_trait]
pub trait Codec: Send + Sync {
    /// The audio codec, or an error when the plugin has none.
    fn audio(&self) -> RResult<AudioCodec_TO<'static, RBox<()>>, RBoxError>;

    /// The image codec, or an error when the plugin has none.
    #[sabi(last_prefix_field)]
    fn image(&self) -> RResult<ImageCodec_TO<'static, RBox<()>>, RBoxError>;
}

/// An audio container, as a plain integer (unknown values are an error in the plugin).
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AudioContainer(pub u32);

impl AudioContainer {
    /// Detect the container from the bytes.
    pub const AUTO: AudioContainer = AudioContainer(0);
    /// RIFF WAVE (PCM).
    pub const WAV: AudioContainer = AudioContainer(1);
    /// MPEG-1/2 layer III.
    pub const MP3: AudioContainer = AudioContainer(2);
    /// FLAC.
    pub const FLAC: AudioContainer = AudioContainer(3);

    /// A short name for messages (`"auto"`, `"wav"`, `"mp3"`, `"flac"`, `"unknown"`).
    pub fn name(self) -> &'static str {
        match self {
            AudioContainer::AUTO => "auto",
            AudioContainer::WAV => "wav",
            AudioContainer::MP3 => "mp3",
            AudioContainer::FLAC => "flac",
            _ => "unknown",
        }
    }
}

/// How a decode session is opened.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeConfig {
    /// The container the bytes must be ([`AudioContainer::AUTO`]: whatever the plugin detects).
    pub container: AudioContainer,
    /// Output channel count; 0 keeps the source's. Plugins document which conversions they support.
    pub out_channels: u16,
    /// Output rate in Hz; 0 keeps the source's.
    pub out_rate: u32,
    /// The sample budget: most output samples (frames × output channels) of the whole session; more is an
    /// error naming the budget.
    pub max_output_samples: u64,
    /// Most encoded bytes [`AudioDecodeSession::push`] accepts in total.
    pub max_input_bytes: u64,
    /// Most frames in one [`PcmChunk`] (0: the plugin's default, 4096).
    pub max_chunk_frames: u32,
}

/// Facts about a decoded source track, returned by [`AudioDecodeSession::finish`].
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub struct AudioSourceInfo {
    /// The container that was found.
    pub container: AudioContainer,
    /// Source sample rate in Hz.
    pub rate: u32,
    /// Source channel count.
    pub channels: u16,
    /// Playable frames as the container states them (after encoder delay and padding), if it does.
    pub frames: ROption<u64>,
    /// Encoder delay frames trimmed, if the container states them.
    pub delay: ROption<u32>,
    /// Encoder padding frames trimmed, if the container states them.
    pub padding: ROption<u32>,
}

/// A chunk of decoded F32 PCM, **interleaved** (frame-major).
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct PcmChunk {
    /// Sample rate in Hz.
    pub rate: u32,
    /// Channel count.
    pub channels: u16,
    /// `frames * channels` samples, interleaved.
    pub samples: RVec<f32>,
}

impl PcmChunk {
    /// Frames (samples per channel).
    pub fn frames(&self) -> usize {
        self.samples.len() / usize::from(self.channels.max(1))
    }
}

/// How a raw PCM resampling session is opened.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResampleConfig {
    /// Input rate in Hz.
    pub in_rate: u32,
    /// Output rate in Hz.
    pub out_rate: u32,
    /// Channel count (input and output are interleaved).
    pub channels: u16,
}

/// An audio codec: opens decode and resampling sessions.
#[sabi_trait]
pub trait AudioCodec: Send + Sync {
    /// The containers [`open_decoder`](AudioCodec::open_decoder) accepts.
    fn containers(&self) -> RVec<AudioContainer>;

    /// A streaming decode session.
    fn open_decoder(
        &self,
        config: DecodeConfig,
    ) -> RResult<AudioDecodeSession_TO<'static, RBox<()>>, RBoxError>;

    /// A raw PCM resampling session (no container).
    #[sabi(last_prefix_field)]
    fn open_resampler(
        &self,
        config: ResampleConfig,
    ) -> RResult<ResampleSession_TO<'static, RBox<()>>, RBoxError>;
}

/// A streaming decode session: `push`* then `finish` then `next_chunk` until `None` (see the module doc).
#[sabi_trait]
pub trait AudioDecodeSession: Send {
    /// Appends encoded bytes (an error after `finish`, or past [`DecodeConfig::max_input_bytes`]).
    fn push(&mut self, bytes: RSlice<'_, u8>) -> RResult<(), RBoxError>;

    /// The explicit end of input: opens the stream and returns the source track's facts.
    fn finish(&mut self) -> RResult<AudioSourceInfo, RBoxError>;

    /// The next chunk (1 to `max_chunk_frames` frames), or `None` at the end (the resampler's flush is
    /// included before it). An error once the session's output would exceed its sample budget. Before
    /// `finish` (streaming, ABI 1.4): what the bytes so far allow, and a 0-frame chunk when more input is
    /// needed (see the module doc).
    #[sabi(last_prefix_field)]
    fn next_chunk(&mut self) -> RResult<ROption<PcmChunk>, RBoxError>;
}

/// A raw PCM resampling session with an exact rational clock (see the module doc).
#[sabi_trait]
pub trait ResampleSession: Send {
    /// Feeds whole interleaved frames; returns the interleaved output available so far.
    fn process(&mut self, input: RSlice<'_, f32>) -> RResult<RVec<f32>, RBoxError>;

    /// The explicit end of input: returns the rest, after which exactly
    /// `round(input_frames * out_rate / in_rate)` frames have been returned.
    #[sabi(last_prefix_field)]
    fn finish(&mut self) -> RResult<RVec<f32>, RBoxError>;
}

/// An image container format, as a plain integer (unknown values are an error in the plugin).
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ImageFormat(pub u32);

impl ImageFormat {
    /// PNG.
    pub const PNG: ImageFormat = ImageFormat(1);
    /// JPEG (baseline when encoding).
    pub const JPEG: ImageFormat = ImageFormat(2);
    /// WebP (lossless when encoding).
    pub const WEBP: ImageFormat = ImageFormat(3);

    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            ImageFormat::PNG => "png",
            ImageFormat::JPEG => "jpeg",
            ImageFormat::WEBP => "webp",
            _ => "unknown",
        }
    }
}

/// Layout of [`ImageData::pixels`]: packed, row-major, 8 bits per channel.
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PixelFormat(pub u32);

impl PixelFormat {
    /// 3 bytes per pixel: R, G, B.
    pub const RGB8: PixelFormat = PixelFormat(1);
    /// 4 bytes per pixel: R, G, B, A (straight alpha).
    pub const RGBA8: PixelFormat = PixelFormat(2);

    /// Bytes per pixel (0 for an unknown format).
    pub fn channels(self) -> usize {
        match self {
            PixelFormat::RGB8 => 3,
            PixelFormat::RGBA8 => 4,
            _ => 0,
        }
    }
}

/// How an image is decoded.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageDecodeConfig {
    /// The pixel budget: a header with `width * height` above it is rejected before any pixel is decoded.
    pub max_pixels: u64,
}

/// A decoded image, or one to encode.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct ImageData {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Layout of `pixels`.
    pub format: PixelFormat,
    /// EXIF orientation 1-8 (1 when the file has none). Metadata only: pixels are never rotated. Not written
    /// by [`ImageCodec::encode`].
    pub orientation: u8,
    /// The container decoded from (ignored by [`ImageCodec::encode`]).
    pub source: ImageFormat,
    /// `width * height * format.channels()` bytes, packed row-major.
    pub pixels: RVec<u8>,
}

/// How an image is encoded.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageEncodeConfig {
    /// The output container.
    pub format: ImageFormat,
    /// JPEG quality 1-100 (ignored for PNG and WebP).
    pub quality: u8,
}

/// An image codec.
#[sabi_trait]
pub trait ImageCodec: Send + Sync {
    /// The formats [`decode`](ImageCodec::decode) reads.
    fn decode_formats(&self) -> RVec<ImageFormat>;

    /// Decodes PNG, JPEG or WebP bytes (the format is detected from the bytes).
    fn decode(
        &self,
        bytes: RSlice<'_, u8>,
        config: ImageDecodeConfig,
    ) -> RResult<ImageData, RBoxError>;

    /// Encodes `image`.
    #[sabi(last_prefix_field)]
    fn encode(&self, image: &ImageData, config: ImageEncodeConfig) -> RResult<RVec<u8>, RBoxError>;
}

/// The default text of a missing capability, e.g. `"image-0001 has no audio codec"`.
pub fn missing(plugin: &str, what: &str) -> RBoxError {
    error(format_args!("{plugin} has no {what}"))
}

impl std::fmt::Display for AudioContainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            "unknown" => write!(f, "container {}", self.0),
            n => f.write_str(n),
        }
    }
}

impl std::fmt::Display for ImageFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            "unknown" => write!(f, "image format {}", self.0),
            n => f.write_str(n),
        }
    }
}
