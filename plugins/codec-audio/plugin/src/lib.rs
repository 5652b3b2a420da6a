//! `audio-0001`: the audio codec plugin. A thin wrapper that puts `codec-audio` (symphonia decoding of WAV, MP3
//! and FLAC, rubato resampling with an exact clock) behind `loom-plugin-api`'s [`AudioCodec`]; no decoding or
//! resampling of its own.
//!
//! * Decode sessions: `codec_audio::AudioDecoder` with interleaved output; its blocks (one packet each, possibly
//!   empty inside the resampling filter) are re-cut into chunks of 1 to `max_chunk_frames` frames. Channel
//!   conversions: same count, any count to 1 (mean), 1 to any count (duplication). Decoding runs one packet
//!   per `next_chunk` call as needed. **Streaming** (ABI 1.4): `next_chunk` before `finish` decodes what
//!   the bytes pushed so far allow (`AudioDecoder::poll`: the stream opens once its headers have arrived,
//!   and a packet is read only with 256 KiB of received bytes ahead of the demuxer) and returns a chunk of
//!   **0 frames** when it needs more input; the output is the same as decoding the whole input after
//!   `finish`. Without such calls the whole input is buffered (up to `max_input_bytes`) and opened at
//!   `finish`.
//! * The expected container is checked from the first bytes at `finish`, or at the first streaming
//!   `next_chunk` once 12 bytes have arrived (`RIFF....WAVE`, `fLaC`, an MPEG frame sync or an ID3 tag); a
//!   mismatch is an error naming both.
//! * Resampling sessions: `codec_audio::Resampler`.
//!
//! Every entry point runs under `loom_plugin_api::guard` / `guard_probe`.

use abi_stable::export_root_module;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RBox, RBoxError, ROption, RResult, RSlice, RStr, RVec};
use codec_audio::{AudioDecoder, DecoderConfig, Layout, Next, Resampler};
use loom_plugin_api::{
    ABI_MAJOR, ABI_MINOR, AudioCodec, AudioCodec_TO, AudioCodecBox, AudioContainer,
    AudioDecodeSession, AudioDecodeSession_TO, AudioSourceInfo, Codec, Codec_TO, CodecBox,
    DecodeConfig, ImageCodecBox, LoomPlugin, LoomPlugin_Ref, PcmChunk, PluginKind, Probe,
    ResampleConfig, ResampleSession, ResampleSession_TO, guard, guard_probe, missing,
};

/// This plugin's id.
pub const PLUGIN_ID: &str = "audio-0001";

/// Frames per chunk when [`DecodeConfig::max_chunk_frames`] is 0.
pub const DEFAULT_CHUNK_FRAMES: u32 = 4096;

/// The exported root module.
#[export_root_module]
pub fn root_module() -> LoomPlugin_Ref {
    LoomPlugin {
        abi_major: ABI_MAJOR,
        abi_minor: ABI_MINOR,
        id: RStr::from_str(PLUGIN_ID),
        kind: PluginKind::CODEC,
        probe,
        hal: loom_plugin_api::no_hal,
        codec,
        profile: loom_plugin_api::no_profile,
        hal_files: loom_plugin_api::no_hal_files,
        profile_events: loom_plugin_api::no_profile_events,
        hal_open: loom_plugin_api::no_hal_open,
    }
    .leak_into_prefix()
}

extern "C" fn probe() -> Probe {
    guard_probe(|| {
        Probe::available(
            1,
            "audio codec: wav, mp3, flac decoding; raw f32 resampling",
        )
    })
}

extern "C" fn codec() -> RResult<CodecBox, RBoxError> {
    guard("audio-0001 codec", || {
        Ok::<_, String>(Codec_TO::from_value(Plugin, TD_Opaque))
    })
}

/// The codec entry point, for in-process use.
pub fn codec_box() -> CodecBox {
    Codec_TO::from_value(Plugin, TD_Opaque)
}

struct Plugin;

impl Codec for Plugin {
    fn audio(&self) -> RResult<AudioCodecBox, RBoxError> {
        guard("audio", || {
            Ok::<_, String>(AudioCodec_TO::from_value(Audio, TD_Opaque))
        })
    }

    fn image(&self) -> RResult<ImageCodecBox, RBoxError> {
        RResult::RErr(missing(PLUGIN_ID, "image codec"))
    }
}

struct Audio;

impl AudioCodec for Audio {
    fn containers(&self) -> RVec<AudioContainer> {
        RVec::from(vec![
            AudioContainer::WAV,
            AudioContainer::MP3,
            AudioContainer::FLAC,
        ])
    }

    fn open_decoder(
        &self,
        config: DecodeConfig,
    ) -> RResult<AudioDecodeSession_TO<'static, RBox<()>>, RBoxError> {
        guard("open_decoder", || {
            DecodeSession::new(config).map(|s| AudioDecodeSession_TO::from_value(s, TD_Opaque))
        })
    }

    fn open_resampler(
        &self,
        config: ResampleConfig,
    ) -> RResult<ResampleSession_TO<'static, RBox<()>>, RBoxError> {
        guard("open_resampler", || {
            Resampler::new(
                config.in_rate,
                config.out_rate,
                usize::from(config.channels),
            )
            .map(|r| ResampleSession_TO::from_value(Resample(r), TD_Opaque))
            .map_err(|e| e.to_string())
        })
    }
}

/// Bytes kept for recognising the container.
const HEAD: usize = 12;

/// The container the first bytes announce (`AUTO` when they announce none this plugin knows, or an ID3 tag,
/// which may precede several formats).
fn sniff(head: &[u8]) -> AudioContainer {
    if head.len() >= 12 && &head[0..4] == b"RIFF" && &head[8..12] == b"WAVE" {
        AudioContainer::WAV
    } else if head.starts_with(b"fLaC") {
        AudioContainer::FLAC
    } else if head.len() >= 2 && head[0] == 0xFF && head[1] & 0xE0 == 0xE0 {
        AudioContainer::MP3
    } else {
        AudioContainer::AUTO
    }
}

struct DecodeSession {
    inner: AudioDecoder,
    expected: AudioContainer,
    found: AudioContainer,
    head: Vec<u8>,
    max_chunk_frames: usize,
    /// The current library block (interleaved) and how much of it was returned.
    block: Vec<f32>,
    taken: usize,
    rate: u32,
    channels: u16,
    finished: bool,
    /// The container check ran.
    sniffed: bool,
    ended: bool,
}

impl DecodeSession {
    fn new(c: DecodeConfig) -> Result<Self, String> {
        if !matches!(
            c.container,
            AudioContainer::AUTO | AudioContainer::WAV | AudioContainer::MP3 | AudioContainer::FLAC
        ) {
            return Err(format!(
                "unsupported audio {} (this plugin decodes wav, mp3 and flac)",
                c.container
            ));
        }
        let cfg = DecoderConfig {
            out_rate: (c.out_rate != 0).then_some(c.out_rate),
            out_channels: (c.out_channels != 0).then_some(c.out_channels),
            layout: Layout::Interleaved,
            max_output_samples: c.max_output_samples,
            max_input_bytes: usize::try_from(c.max_input_bytes).unwrap_or(usize::MAX),
            ..DecoderConfig::default()
        };
        let max_chunk = if c.max_chunk_frames == 0 {
            DEFAULT_CHUNK_FRAMES
        } else {
            c.max_chunk_frames
        };
        Ok(Self {
            inner: AudioDecoder::new(cfg),
            expected: c.container,
            found: AudioContainer::AUTO,
            head: Vec::with_capacity(HEAD),
            max_chunk_frames: max_chunk as usize,
            block: Vec::new(),
            taken: 0,
            rate: 0,
            channels: 0,
            finished: false,
            sniffed: false,
            ended: false,
        })
    }

    fn push(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.inner.push(bytes).map_err(|e| e.to_string())?;
        let n = (HEAD - self.head.len()).min(bytes.len());
        self.head.extend_from_slice(&bytes[..n]);
        Ok(())
    }

    /// Checks the first bytes against the expected container (once); a mismatch ends the session.
    fn check_container(&mut self) -> Result<(), String> {
        if self.sniffed {
            return Ok(());
        }
        self.sniffed = true;
        self.found = sniff(&self.head);
        if self.expected != AudioContainer::AUTO
            && self.found != self.expected
            && !self.head.starts_with(b"ID3")
        {
            self.finished = true;
            self.ended = true;
            return Err(match self.found {
                AudioContainer::AUTO => format!(
                    "decode: expected a {} stream, the data does not start like one",
                    self.expected
                ),
                found => format!(
                    "decode: expected a {} stream, the data is {found}",
                    self.expected
                ),
            });
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<AudioSourceInfo, String> {
        if !self.finished {
            self.check_container()?;
        }
        let info = self.inner.finish().map_err(|e| e.to_string())?;
        self.finished = true;
        let container = match (self.found, self.expected) {
            (AudioContainer::AUTO, e) => e,
            (f, _) => f,
        };
        Ok(AudioSourceInfo {
            container,
            rate: info.rate,
            channels: info.channels,
            frames: info.frames.into(),
            delay: info.delay.into(),
            padding: info.padding.into(),
        })
    }

    fn next_chunk(&mut self) -> Result<Option<PcmChunk>, String> {
        let need_input = |s: &Self| {
            Ok(Some(PcmChunk {
                rate: s.rate,
                channels: s.channels,
                samples: RVec::new(),
            }))
        };
        if !self.finished && !self.ended {
            if self.head.len() < HEAD {
                return need_input(self);
            }
            self.check_container()?;
        }
        loop {
            let ch = usize::from(self.channels.max(1));
            if self.taken < self.block.len() {
                let n = (self.block.len() - self.taken).min(self.max_chunk_frames * ch);
                let samples = self.block[self.taken..self.taken + n].to_vec();
                self.taken += n;
                return Ok(Some(PcmChunk {
                    rate: self.rate,
                    channels: self.channels,
                    samples: RVec::from(samples),
                }));
            }
            if self.ended {
                return Ok(None);
            }
            match self.inner.poll() {
                Ok(Next::Block(b)) => {
                    self.rate = b.rate;
                    self.channels = b.channels;
                    self.block = b.samples;
                    self.taken = 0;
                }
                Ok(Next::NeedInput) => return need_input(self),
                Ok(Next::End) => self.ended = true,
                Err(e) => {
                    self.ended = true;
                    return Err(e.to_string());
                }
            }
        }
    }
}

impl AudioDecodeSession for DecodeSession {
    fn push(&mut self, bytes: RSlice<'_, u8>) -> RResult<(), RBoxError> {
        guard("push", || DecodeSession::push(self, bytes.as_slice()))
    }

    fn finish(&mut self) -> RResult<AudioSourceInfo, RBoxError> {
        guard("finish", || DecodeSession::finish(self))
    }

    fn next_chunk(&mut self) -> RResult<ROption<PcmChunk>, RBoxError> {
        guard("next_chunk", || {
            DecodeSession::next_chunk(self).map(ROption::from)
        })
    }
}

struct Resample(Resampler);

impl ResampleSession for Resample {
    fn process(&mut self, input: RSlice<'_, f32>) -> RResult<RVec<f32>, RBoxError> {
        guard("process", || {
            self.0
                .process(input.as_slice())
                .map(RVec::from)
                .map_err(|e| e.to_string())
        })
    }

    fn finish(&mut self) -> RResult<RVec<f32>, RBoxError> {
        guard("finish", || {
            self.0.finish().map(RVec::from).map_err(|e| e.to_string())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniffs_containers() {
        assert_eq!(sniff(b"RIFF\0\0\0\0WAVEfmt "), AudioContainer::WAV);
        assert_eq!(sniff(b"fLaC\0\0\0\x22"), AudioContainer::FLAC);
        assert_eq!(sniff(&[0xFF, 0xFB, 0x90, 0x64]), AudioContainer::MP3);
        assert_eq!(sniff(b"hello"), AudioContainer::AUTO);
    }

    #[test]
    fn unknown_container_value_is_an_error() {
        let cfg = DecodeConfig {
            container: AudioContainer(77),
            out_channels: 0,
            out_rate: 0,
            max_output_samples: 1,
            max_input_bytes: 1,
            max_chunk_frames: 0,
        };
        let e = Audio.open_decoder(cfg).into_result().err().unwrap();
        assert!(e.to_string().contains("container 77"), "{e}");
    }
}
