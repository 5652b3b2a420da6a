//! Container/codec decoding (symphonia) into bounded F32 PCM.

use std::io::Cursor;

use symphonia::core::codecs::audio::{AudioDecoder as SymDecoder, AudioDecoderOptions};
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, FormatReader, TrackType};
use symphonia::core::io::{MediaSourceStream, MediaSourceStreamOptions};
use symphonia::core::meta::MetadataOptions;

use crate::{AudioError, Layout, PcmBlock, Resampler};

/// Output requirements of an [`AudioDecoder`] session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecoderConfig {
    /// Output rate in Hz; `None` keeps the source rate.
    pub out_rate: Option<u32>,
    /// Output channel count; `None` keeps the source channel count. Supported conversions:
    /// same count, any count to 1 (mean of all channels), 1 to any count (duplication).
    pub out_channels: Option<u16>,
    /// Layout of returned blocks.
    pub layout: Layout,
    /// Hard cap on the total output samples (frames × output channels) of the session.
    pub max_output_samples: u64,
    /// Hard cap on the encoded bytes accepted by [`AudioDecoder::push`].
    pub max_input_bytes: usize,
}

impl Default for DecoderConfig {
    fn default() -> Self {
        Self {
            out_rate: None,
            out_channels: None,
            layout: Layout::Interleaved,
            max_output_samples: 48_000 * 2 * 60 * 10,
            max_input_bytes: 256 << 20,
        }
    }
}

/// Facts about the decoded source track, available after [`AudioDecoder::finish`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceInfo {
    /// Source sample rate in Hz.
    pub rate: u32,
    /// Source channel count.
    pub channels: u16,
    /// Playable frames as stated by the container (after encoder delay/padding), if known.
    pub frames: Option<u64>,
    /// Encoder delay frames the decoder trims, if the container states them (MP3 LAME header).
    pub delay: Option<u32>,
    /// Encoder padding frames the decoder trims, if stated.
    pub padding: Option<u32>,
}

struct Active {
    reader: Box<dyn FormatReader>,
    decoder: Box<dyn SymDecoder>,
    track_id: u32,
    src_channels: usize,
    resampler: Resampler,
    scratch: Vec<f32>,
}

/// A decoding session: encoded WAV/MP3/FLAC bytes in, F32 PCM blocks out.
///
/// Use: [`push`](Self::push) encoded bytes (any chunking, or the whole file at once), then
/// [`finish`](Self::finish), then call [`next_block`](Self::next_block) until it returns
/// `Ok(None)`. Each `next_block` decodes one packet, so the work can be spread over calls and
/// workers; the session is `Send`.
///
/// Limitation: the container is opened at `finish()`. Symphonia's demuxers read from a
/// complete seekable source, so bytes pushed before `finish()` are only buffered (bounded by
/// [`DecoderConfig::max_input_bytes`]); decoding itself is incremental per packet.
///
/// The encoder delay and padding that the container states (LAME/Xing header for MP3) are
/// trimmed by symphonia's gapless mode, so the output covers exactly the original recording.
/// Resampling, when requested, follows [`Resampler`]'s exact clock: total output frames are
/// `round(decoded_frames * out_rate / src_rate)`.
pub struct AudioDecoder {
    cfg: DecoderConfig,
    input: Vec<u8>,
    active: Option<Active>,
    info: Option<SourceInfo>,
    emitted_samples: u64,
    done: bool,
}

impl std::fmt::Debug for AudioDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AudioDecoder")
            .field("cfg", &self.cfg)
            .field("buffered_bytes", &self.input.len())
            .field("info", &self.info)
            .field("emitted_samples", &self.emitted_samples)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

fn dec_err(e: impl std::fmt::Display) -> AudioError {
    AudioError::Decode(e.to_string())
}

impl AudioDecoder {
    /// A new session.
    pub fn new(cfg: DecoderConfig) -> Self {
        Self {
            cfg,
            input: Vec::new(),
            active: None,
            info: None,
            emitted_samples: 0,
            done: false,
        }
    }

    /// Appends encoded bytes.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), AudioError> {
        if self.active.is_some() || self.done {
            return Err(AudioError::State("decoder: push after finish"));
        }
        if self.input.len() + bytes.len() > self.cfg.max_input_bytes {
            return Err(AudioError::InputCap {
                cap: self.cfg.max_input_bytes,
            });
        }
        self.input.extend_from_slice(bytes);
        Ok(())
    }

    /// Ends the input and opens the container; returns the source track's facts.
    pub fn finish(&mut self) -> Result<SourceInfo, AudioError> {
        if self.active.is_some() || self.done {
            return Err(AudioError::State("decoder: finish called twice"));
        }
        let bytes = std::mem::take(&mut self.input);
        let mss = MediaSourceStream::new(
            Box::new(Cursor::new(bytes)),
            MediaSourceStreamOptions::default(),
        );
        let reader = symphonia::default::get_probe()
            .probe(
                &Hint::new(),
                mss,
                FormatOptions::default(),
                MetadataOptions::default(),
            )
            .map_err(dec_err)?;
        let track = reader
            .default_track(TrackType::Audio)
            .ok_or_else(|| AudioError::Decode("no audio track".into()))?;
        let params = track
            .codec_params
            .as_ref()
            .and_then(|p| p.audio())
            .ok_or_else(|| AudioError::Decode("no audio codec parameters".into()))?
            .clone();
        let rate = params
            .sample_rate
            .ok_or_else(|| AudioError::Decode("unknown sample rate".into()))?;
        let src_channels = params
            .channels
            .as_ref()
            .map(|c| c.count())
            .ok_or_else(|| AudioError::Decode("unknown channel count".into()))?;
        let info = SourceInfo {
            rate,
            channels: u16::try_from(src_channels).map_err(dec_err)?,
            frames: track.num_frames,
            delay: track.delay,
            padding: track.padding,
        };
        let track_id = track.id;
        let decoder = symphonia::default::get_codecs()
            .make_audio_decoder(&params, &AudioDecoderOptions::default())
            .map_err(dec_err)?;
        let out_ch = usize::from(self.cfg.out_channels.unwrap_or(info.channels));
        if out_ch == 0 || !(out_ch == src_channels || out_ch == 1 || src_channels == 1) {
            return Err(AudioError::Channels {
                from: src_channels,
                to: out_ch,
            });
        }
        let resampler = Resampler::new(rate, self.cfg.out_rate.unwrap_or(rate), out_ch)?;
        self.active = Some(Active {
            reader,
            decoder,
            track_id,
            src_channels,
            resampler,
            scratch: Vec::new(),
        });
        self.info = Some(info.clone());
        Ok(info)
    }

    /// Source facts, once [`finish`](Self::finish) succeeded.
    pub fn source_info(&self) -> Option<&SourceInfo> {
        self.info.as_ref()
    }

    /// Total output samples returned so far.
    pub fn output_samples(&self) -> u64 {
        self.emitted_samples
    }

    /// Decodes the next packet; `Ok(None)` at the end. Blocks may be empty (a packet whose
    /// output is still inside the resampling filter).
    pub fn next_block(&mut self) -> Result<Option<PcmBlock>, AudioError> {
        if self.done {
            return Ok(None);
        }
        let Some(a) = self.active.as_mut() else {
            return Err(AudioError::State("decoder: next_block before finish"));
        };
        let out_ch = a.resampler.channels();
        let out = loop {
            match a.reader.next_packet().map_err(dec_err)? {
                None => {
                    let out = a.resampler.finish()?;
                    self.done = true;
                    break out;
                }
                Some(packet) if packet.track_id != a.track_id => continue,
                Some(packet) => {
                    let buf = a.decoder.decode(&packet).map_err(dec_err)?;
                    a.scratch.clear();
                    buf.copy_to_vec_interleaved(&mut a.scratch);
                    let conv = convert_channels(&a.scratch, a.src_channels, out_ch);
                    break a.resampler.process(&conv)?;
                }
            }
        };
        self.emitted_samples += out.len() as u64;
        if self.emitted_samples > self.cfg.max_output_samples {
            self.done = true;
            self.active = None;
            return Err(AudioError::OutputCap {
                cap: self.cfg.max_output_samples,
            });
        }
        if self.done {
            self.active = None;
        }
        let channels = u16::try_from(out_ch).map_err(dec_err)?;
        let rate = self
            .cfg
            .out_rate
            .or(self.info.as_ref().map(|i| i.rate))
            .unwrap_or(0);
        let samples = match self.cfg.layout {
            Layout::Interleaved => out,
            Layout::Planar => to_planar(&out, out_ch),
        };
        Ok(Some(PcmBlock {
            rate,
            channels,
            layout: self.cfg.layout,
            samples,
        }))
    }

    /// Convenience: decodes a whole file into one block.
    pub fn decode_all(
        bytes: &[u8],
        cfg: DecoderConfig,
    ) -> Result<(SourceInfo, PcmBlock), AudioError> {
        let layout = cfg.layout;
        let mut s = Self::new(DecoderConfig {
            layout: Layout::Interleaved,
            ..cfg
        });
        s.push(bytes)?;
        let info = s.finish()?;
        let mut all = Vec::new();
        let mut channels = 0;
        let mut rate = 0;
        while let Some(b) = s.next_block()? {
            channels = b.channels;
            rate = b.rate;
            all.extend_from_slice(&b.samples);
        }
        let samples = match layout {
            Layout::Interleaved => all,
            Layout::Planar => to_planar(&all, usize::from(channels)),
        };
        Ok((
            info,
            PcmBlock {
                rate,
                channels,
                layout,
                samples,
            },
        ))
    }
}

fn convert_channels(x: &[f32], from: usize, to: usize) -> Vec<f32> {
    if from == to {
        return x.to_vec();
    }
    if to == 1 {
        let inv = 1.0 / from as f32;
        return x
            .chunks_exact(from)
            .map(|f| f.iter().sum::<f32>() * inv)
            .collect();
    }
    // from == 1: duplicate.
    x.iter().flat_map(|&s| std::iter::repeat_n(s, to)).collect()
}

fn to_planar(x: &[f32], ch: usize) -> Vec<f32> {
    let frames = x.len() / ch.max(1);
    let mut out = Vec::with_capacity(x.len());
    for c in 0..ch {
        out.extend((0..frames).map(|f| x[f * ch + c]));
    }
    out
}
