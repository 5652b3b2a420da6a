//! Container/codec decoding (symphonia) into bounded F32 PCM.

use std::io::{self, Cursor, Read, Seek, SeekFrom};
use std::sync::{Arc, Mutex};

use symphonia::core::codecs::audio::{AudioDecoder as SymDecoder, AudioDecoderOptions};
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, FormatReader, TrackType};
use symphonia::core::io::{MediaSource, MediaSourceStream, MediaSourceStreamOptions};
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
    /// Streaming (decoding before [`AudioDecoder::finish`]): a packet is read only while at least this
    /// many received bytes lie unread ahead of the demuxer, so that no packet of a well-formed stream
    /// runs past the bytes received so far (one that does is an error, never a truncated stream).
    pub stream_lookahead_bytes: usize,
}

impl Default for DecoderConfig {
    fn default() -> Self {
        Self {
            out_rate: None,
            out_channels: None,
            layout: Layout::Interleaved,
            max_output_samples: 48_000 * 2 * 60 * 10,
            max_input_bytes: 256 << 20,
            stream_lookahead_bytes: 256 << 10,
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
/// **Streaming**: between pushes, [`poll`](Self::poll) decodes what the bytes received so far
/// allow, before the input ends: the container is opened as soon as its headers have arrived
/// (a probe that runs out of bytes is retried after more arrive), then a packet is read only while
/// [`DecoderConfig::stream_lookahead_bytes`] received bytes lie unread ahead of the demuxer, and
/// the bytes it has consumed are released. [`Next::NeedInput`] says to push more. A stream that
/// is opened before `finish` is read as a non-seekable source; the output is the same as for the
/// whole file (tested bit for bit). Without `poll`, `finish` opens the whole input as a seekable
/// source, as before. A packet that runs past the received bytes (one larger than the
/// lookahead) is an error naming the lookahead.
///
/// The encoder delay and padding that the container states (LAME/Xing header for MP3) are
/// trimmed by symphonia's gapless mode, so the output covers exactly the original recording.
/// Resampling, when requested, follows [`Resampler`]'s exact clock: total output frames are
/// `round(decoded_frames * out_rate / src_rate)`.
pub struct AudioDecoder {
    cfg: DecoderConfig,
    input: Vec<u8>,
    /// Streaming: the received bytes the demuxer reads from, once `poll` has been called.
    stream: Option<Arc<Mutex<Received>>>,
    /// Streaming: a probe needs at least this many received bytes before it is tried (again).
    probe_at: usize,
    /// Total encoded bytes accepted.
    received: usize,
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
            stream: None,
            probe_at: 0,
            received: 0,
            active: None,
            info: None,
            emitted_samples: 0,
            done: false,
        }
    }

    /// Appends encoded bytes.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), AudioError> {
        if self.finished() {
            return Err(AudioError::State("decoder: push after finish"));
        }
        if self.received + bytes.len() > self.cfg.max_input_bytes {
            return Err(AudioError::InputCap {
                cap: self.cfg.max_input_bytes,
            });
        }
        self.received += bytes.len();
        match &self.stream {
            Some(r) => lock(r).bytes.extend_from_slice(bytes),
            None => self.input.extend_from_slice(bytes),
        }
        Ok(())
    }

    fn finished(&self) -> bool {
        self.done
            || match &self.stream {
                Some(r) => lock(r).finished,
                None => self.active.is_some(),
            }
    }

    /// Streaming: decodes the next packet if the bytes received so far hold it (see the type's doc).
    /// After [`finish`](Self::finish) this is [`next_block`](Self::next_block): `Block` or `End`.
    pub fn poll(&mut self) -> Result<Next, AudioError> {
        if self.finished() {
            return Ok(match self.next_block()? {
                Some(b) => Next::Block(b),
                None => Next::End,
            });
        }
        let r = match &self.stream {
            Some(r) => r.clone(),
            None => {
                let r = Arc::new(Mutex::new(Received {
                    bytes: std::mem::take(&mut self.input),
                    base: 0,
                    finished: false,
                    starved: false,
                    pos: 0,
                }));
                self.stream = Some(r.clone());
                r
            }
        };
        if self.active.is_none() {
            let have = lock(&r).bytes.len();
            if have < self.probe_at.max(1) {
                return Ok(Next::NeedInput);
            }
            let src = StreamSource {
                r: r.clone(),
                pos: 0,
            };
            let opened = self.open(Box::new(src));
            let starved = std::mem::replace(&mut lock(&r).starved, false);
            match opened {
                // The headers were not all here yet (whether or not the probe noticed): try again, from
                // the first byte, once the received bytes have doubled.
                _ if starved => {
                    self.active = None;
                    self.info = None;
                    self.probe_at = have * 2;
                    return Ok(Next::NeedInput);
                }
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
        let ahead = {
            let g = lock(&r);
            g.base + g.bytes.len() as u64 - g.read_pos()
        };
        if ahead < self.cfg.stream_lookahead_bytes as u64 {
            return Ok(Next::NeedInput);
        }
        match self.next_block()? {
            Some(b) => Ok(Next::Block(b)),
            None => Ok(Next::End),
        }
    }

    /// Ends the input and opens the container; returns the source track's facts.
    pub fn finish(&mut self) -> Result<SourceInfo, AudioError> {
        if self.finished() {
            return Err(AudioError::State("decoder: finish called twice"));
        }
        if let Some(r) = &self.stream {
            lock(r).finished = true;
            if let Some(info) = &self.info {
                return Ok(info.clone());
            }
            // Never opened while streaming: the received bytes are the whole input.
            let src = StreamSource {
                r: r.clone(),
                pos: 0,
            };
            return self.open(Box::new(src));
        }
        let bytes = std::mem::take(&mut self.input);
        self.open(Box::new(Cursor::new(bytes)))
    }

    /// Probes the container and opens its default audio track's decoder.
    fn open(&mut self, source: Box<dyn MediaSource>) -> Result<SourceInfo, AudioError> {
        let mss = MediaSourceStream::new(source, MediaSourceStreamOptions::default());
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

    /// Encoded bytes held by the session: everything pushed, until streaming has opened the stream;
    /// then only those the demuxer has not read yet (released 64 KiB at a time).
    pub fn buffered_bytes(&self) -> usize {
        match &self.stream {
            Some(r) => lock(r).bytes.len(),
            None => self.input.len(),
        }
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
            let packet = a.reader.next_packet();
            if let Some(r) = &self.stream {
                let mut g = lock(r);
                if g.starved {
                    self.done = true;
                    self.active = None;
                    return Err(AudioError::Decode(format!(
                        "streamed input: a packet runs past the {} bytes received so far \
                         (more than the {}-byte lookahead)",
                        self.received, self.cfg.stream_lookahead_bytes
                    )));
                }
                g.release();
            }
            match packet.map_err(dec_err)? {
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

/// What [`AudioDecoder::poll`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Decoded output (may be empty: a packet whose output is still inside the resampling filter).
    Block(PcmBlock),
    /// Push more bytes (or `finish`) first.
    NeedInput,
    /// The stream has ended and every sample was returned.
    End,
}

/// The bytes a streaming session has received and not yet released: `bytes[0]` is stream byte `base`.
#[derive(Debug)]
struct Received {
    bytes: Vec<u8>,
    base: u64,
    /// `finish` was called: reading at the end is the end of the stream.
    finished: bool,
    /// A read found no bytes before `finish`: the demuxer's state can no longer be trusted.
    starved: bool,
    /// How far the demuxer's source has read (stream position).
    pos: u64,
}

impl Received {
    fn read_pos(&self) -> u64 {
        self.pos.max(self.base)
    }

    /// Drops the bytes the source has read (the demuxer keeps what it may re-read in its own buffer).
    fn release(&mut self) {
        let n = (self.pos.saturating_sub(self.base) as usize).min(self.bytes.len());
        if n >= 64 << 10 {
            self.bytes.drain(..n);
            self.base += n as u64;
        }
    }
}

fn lock(r: &Mutex<Received>) -> std::sync::MutexGuard<'_, Received> {
    r.lock().unwrap_or_else(|e| e.into_inner())
}

/// Most bytes one read of a [`StreamSource`] returns.
const READ_CAP: usize = 4096;

/// The demuxer's view of a streaming session's bytes: non-seekable; a read at the end before `finish`
/// marks the session starved (and reads 0 bytes, which the demuxer takes as the end).
struct StreamSource {
    r: Arc<Mutex<Received>>,
    pos: u64,
}

impl Read for StreamSource {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut g = lock(&self.r);
        if self.pos < g.base {
            return Err(io::Error::other("streamed input: bytes already released"));
        }
        let at = (self.pos - g.base) as usize;
        // At most READ_CAP per call, so the demuxer's buffer holds little more than what it is parsing
        // and the source position measures the demuxer's progress (the lookahead test relies on it).
        let n = g
            .bytes
            .len()
            .saturating_sub(at)
            .min(buf.len())
            .min(READ_CAP);
        if n == 0 && !buf.is_empty() && !g.finished {
            g.starved = true;
        }
        buf[..n].copy_from_slice(&g.bytes[at..at + n]);
        self.pos += n as u64;
        g.pos = self.pos;
        Ok(n)
    }
}

impl Seek for StreamSource {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        match to {
            SeekFrom::Current(0) => Ok(self.pos),
            _ => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "streamed input is not seekable",
            )),
        }
    }
}

impl MediaSource for StreamSource {
    fn is_seekable(&self) -> bool {
        false
    }

    fn byte_len(&self) -> Option<u64> {
        let g = lock(&self.r);
        g.finished.then(|| g.base + g.bytes.len() as u64)
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
