//! Codec conformance: the codec plugins of this build (`libcodec_audio_plugin.so`, `libcodec_image_plugin.so`,
//! built because they are dev-dependencies) are loaded through `loom-plugins` and checked on the committed audio
//! fixtures of `plugins/codec-audio/tests/fixtures`: exact decoded sample counts and rates for WAV, FLAC and MP3,
//! resampled streams identical to the `codec-audio` library's own result (whose accuracy against an independent
//! windowed-sinc reference is `codec-audio`'s own test), chunked pushes equal to one push, an EOF flush that
//! never extends the duration, the sample budget, an over-budget image rejected from its header alone, PNG
//! round trips, and junk input as a clear error rather than a panic.

use std::path::PathBuf;
use std::sync::OnceLock;

use codec_audio::{AudioDecoder, DecoderConfig, Resampler, expected_output_frames};
use loom_plugin_api::abi_stable::std_types::{RBoxError, ROption, RResult, RSlice};
use loom_plugin_api::{
    AudioCodecBox, AudioContainer, AudioSourceInfo, DecodeConfig, ImageCodecBox, ImageData,
    ImageDecodeConfig, ImageEncodeConfig, ImageFormat, PcmChunk, PixelFormat, PluginKind,
    ResampleConfig,
};
use loom_plugins::LoadedPlugin;

/// `target/<profile>`: the test binary is `target/<profile>/deps/integration-<hash>`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .and_then(|d| d.parent())
        .expect("profile dir")
        .to_path_buf()
}

/// The library `stem` of this build: `deps/` first (where cargo builds a dev-dependency's cdylib; the copy in
/// `target/<profile>/` is only refreshed by `cargo build -p` and may be stale).
fn library(stem: &str) -> PathBuf {
    let name = format!(
        "{}{stem}.{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_EXTENSION
    );
    [profile_dir().join("deps"), profile_dir()]
        .into_iter()
        .map(|d| d.join(&name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} is not in {} (is it a dev-dependency of tests/?)",
                profile_dir().display()
            )
        })
}

fn load(stem: &str, id: &str) -> LoadedPlugin {
    let p = loom_plugins::load_file(&library(stem)).unwrap_or_else(|e| panic!("{stem}: {e}"));
    assert_eq!(p.id, id);
    assert_eq!(p.kind, PluginKind::CODEC);
    assert!(p.has_codec_factory());
    p
}

fn ok<T>(what: &str, r: RResult<T, RBoxError>) -> T {
    r.into_result().unwrap_or_else(|e| panic!("{what}: {e}"))
}

fn err<T>(what: &str, r: RResult<T, RBoxError>) -> String {
    match r.into_result() {
        Ok(_) => panic!("{what}: expected an error"),
        Err(e) => e.to_string(),
    }
}

fn audio() -> &'static AudioCodecBox {
    static A: OnceLock<AudioCodecBox> = OnceLock::new();
    A.get_or_init(|| {
        let p = load("codec_audio_plugin", "audio-0001");
        let codec = p.codec().unwrap_or_else(|e| panic!("{e}"));
        ok("audio", codec.audio())
    })
}

fn images() -> &'static ImageCodecBox {
    static I: OnceLock<ImageCodecBox> = OnceLock::new();
    I.get_or_init(|| {
        let p = load("codec_image_plugin", "image-0001");
        let codec = p.codec().unwrap_or_else(|e| panic!("{e}"));
        ok("image", codec.image())
    })
}

fn fixture(name: &str) -> Vec<u8> {
    let p = loom_tests::repo_root()
        .join("plugins/codec-audio/tests/fixtures")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn config() -> DecodeConfig {
    DecodeConfig {
        container: AudioContainer::AUTO,
        out_channels: 0,
        out_rate: 0,
        max_output_samples: 48_000 * 2 * 60,
        max_input_bytes: 64 << 20,
        max_chunk_frames: 0,
    }
}

/// What a session gave: its source facts, its chunks' (rate, channels) and the concatenated samples.
struct Decoded {
    info: AudioSourceInfo,
    rate: u32,
    channels: u16,
    chunk_frames: Vec<usize>,
    samples: Vec<f32>,
}

impl Decoded {
    fn frames(&self) -> usize {
        self.samples.len() / usize::from(self.channels)
    }
}

/// Decodes `bytes` through the plugin, pushed in parts of `part` bytes.
fn decode(bytes: &[u8], cfg: DecodeConfig, part: usize) -> Decoded {
    let mut s = ok("open_decoder", audio().open_decoder(cfg));
    for p in bytes.chunks(part.max(1)) {
        ok("push", s.push(RSlice::from_slice(p)));
    }
    let info = ok("finish", s.finish());
    let (mut rate, mut channels) = (0, 0);
    let mut chunk_frames = Vec::new();
    let mut samples = Vec::new();
    while let ROption::RSome(PcmChunk {
        rate: r,
        channels: c,
        samples: x,
    }) = ok("next_chunk", s.next_chunk())
    {
        assert!(
            rate == 0 || (rate, channels) == (r, c),
            "chunks change format"
        );
        (rate, channels) = (r, c);
        assert!(
            !x.is_empty() && x.len() % usize::from(c) == 0,
            "ragged chunk"
        );
        chunk_frames.push(x.len() / usize::from(c));
        samples.extend_from_slice(&x);
    }
    // The end is sticky.
    assert!(ok("next_chunk", s.next_chunk()).is_none());
    Decoded {
        info,
        rate,
        channels,
        chunk_frames,
        samples,
    }
}

/// The library's own result for the same request.
fn direct(bytes: &[u8], out_rate: Option<u32>, out_channels: Option<u16>) -> Vec<f32> {
    let cfg = DecoderConfig {
        out_rate,
        out_channels,
        ..DecoderConfig::default()
    };
    AudioDecoder::decode_all(bytes, cfg)
        .unwrap_or_else(|e| panic!("{e}"))
        .1
        .samples
}

#[test]
fn lossless_counts_and_rates_are_exact() {
    for (name, container, rate, ch) in [
        ("sine16k_mono.wav", AudioContainer::WAV, 16_000u32, 1u16),
        ("sine16k_mono.flac", AudioContainer::FLAC, 16_000, 1),
        ("sine22k_stereo.wav", AudioContainer::WAV, 22_050, 2),
        ("sine22k_stereo.flac", AudioContainer::FLAC, 22_050, 2),
    ] {
        let bytes = fixture(name);
        let d = decode(
            &bytes,
            DecodeConfig {
                container,
                ..config()
            },
            usize::MAX,
        );
        assert_eq!(d.info.container, container, "{name}");
        assert_eq!((d.info.rate, d.info.channels), (rate, ch), "{name}");
        assert_eq!((d.rate, d.channels), (rate, ch), "{name}");
        assert_eq!(d.frames(), (rate / 2) as usize, "{name}: frames");
        assert_eq!(d.samples, direct(&bytes, None, None), "{name}");
    }
}

/// MP3: the 22.05 and 44.1 kHz files carry a LAME header whose delay and padding are trimmed, so they decode to
/// exactly the original rate / 2 frames; for the 16 kHz file symphonia states none (see `codec-audio`'s test),
/// so it decodes to whole 576-frame MPEG granules covering the original.
#[test]
fn mp3_counts_and_rates_are_exact() {
    for (name, rate, ch, gapless) in [
        ("sine16k_mono.mp3", 16_000u32, 1u16, false),
        ("sine22k_stereo.mp3", 22_050, 2, true),
        ("sine44k_mono.mp3", 44_100, 1, true),
    ] {
        let bytes = fixture(name);
        let d = decode(
            &bytes,
            DecodeConfig {
                container: AudioContainer::MP3,
                ..config()
            },
            usize::MAX,
        );
        assert_eq!(d.info.container, AudioContainer::MP3, "{name}");
        assert_eq!((d.rate, d.channels), (rate, ch), "{name}");
        let n = (rate / 2) as usize;
        if gapless {
            assert_eq!(d.info.frames, ROption::RSome(n as u64), "{name}");
            assert!(d.info.delay.is_some() && d.info.padding.is_some(), "{name}");
            assert_eq!(d.frames(), n, "{name}");
        } else {
            assert_eq!(d.frames() % 576, 0, "{name}: {}", d.frames());
            assert!(d.frames() >= n, "{name}: {}", d.frames());
        }
        assert_eq!(d.samples, direct(&bytes, None, None), "{name}");
    }
}

#[test]
fn resampled_streams_equal_the_library_and_keep_the_clock() {
    for (name, src_rate, out_rate, out_ch) in [
        ("sine16k_mono.wav", 16_000u32, 22_050u32, 0u16),
        ("sine16k_mono.flac", 16_000, 48_000, 2),
        ("sine22k_stereo.flac", 22_050, 16_000, 1),
        ("sine22k_stereo.wav", 22_050, 48_000, 0),
        ("sine44k_mono.mp3", 44_100, 16_000, 0),
    ] {
        let bytes = fixture(name);
        let d = decode(
            &bytes,
            DecodeConfig {
                out_rate,
                out_channels: out_ch,
                ..config()
            },
            usize::MAX,
        );
        let src_frames = (src_rate / 2) as u64;
        assert_eq!(d.info.rate, src_rate, "{name}");
        assert_eq!(d.rate, out_rate, "{name}");
        assert_eq!(
            d.frames() as u64,
            expected_output_frames(src_frames, src_rate, out_rate),
            "{name} -> {out_rate}"
        );
        let want = direct(&bytes, Some(out_rate), (out_ch != 0).then_some(out_ch));
        assert_eq!(
            d.samples, want,
            "{name} -> {out_rate}: differs from the library"
        );
    }
}

#[test]
fn chunked_pushes_and_small_chunks_give_the_same_samples() {
    for name in [
        "sine22k_stereo.flac",
        "sine16k_mono.mp3",
        "sine22k_stereo.wav",
    ] {
        let bytes = fixture(name);
        let cfg = DecodeConfig {
            out_rate: 24_000,
            ..config()
        };
        let whole = decode(&bytes, cfg, usize::MAX);
        for (part, max_chunk) in [(1usize, 0u32), (777, 100), (4096, 1)] {
            let d = decode(
                &bytes,
                DecodeConfig {
                    max_chunk_frames: max_chunk,
                    ..cfg
                },
                part,
            );
            let bound = if max_chunk == 0 {
                4096
            } else {
                max_chunk as usize
            };
            assert!(
                d.chunk_frames.iter().all(|&f| (1..=bound).contains(&f)),
                "{name}: a chunk over {bound} frames"
            );
            assert_eq!(d.samples, whole.samples, "{name}: parts of {part} bytes");
        }
    }
}

#[test]
fn eof_flush_does_not_extend_duration() {
    // Decode sessions: with and without resampling, nothing past the source's duration.
    let bytes = fixture("sine16k_mono.wav");
    let plain = decode(&bytes, config(), usize::MAX);
    assert_eq!(plain.frames(), 8_000);
    for out_rate in [22_050u32, 44_100, 8_000, 11_025] {
        let d = decode(
            &bytes,
            DecodeConfig {
                out_rate,
                ..config()
            },
            usize::MAX,
        );
        assert_eq!(
            d.frames() as u64,
            expected_output_frames(8_000, 16_000, out_rate)
        );
        assert!(d.frames() as u64 * 16_000 <= 8_000 * u64::from(out_rate) + 8_000);
    }
    // Raw resampling: the flush stops at round(N * out / in), whatever the chunking, and equals the library.
    let x: Vec<f32> = (0..5_000 * 2)
        .map(|i| ((i / 2) as f32 * 0.013 + (i % 2) as f32).sin() * 0.5)
        .collect();
    for (in_rate, out_rate) in [(16_000u32, 22_050u32), (44_100, 16_000), (8_000, 8_000)] {
        let cfg = ResampleConfig {
            in_rate,
            out_rate,
            channels: 2,
        };
        let mut r = ok("open_resampler", audio().open_resampler(cfg));
        let mut y = Vec::new();
        for part in x.chunks(2 * 333) {
            y.extend_from_slice(&ok("process", r.process(RSlice::from_slice(part))));
        }
        let before = y.len();
        y.extend_from_slice(&ok("finish", r.finish()));
        let want = expected_output_frames(5_000, in_rate, out_rate) as usize;
        assert_eq!(y.len(), want * 2, "{in_rate} -> {out_rate}");
        assert!(before <= y.len());
        let mut lib = Resampler::new(in_rate, out_rate, 2).unwrap();
        let mut z = lib.process(&x).unwrap();
        z.extend(lib.finish().unwrap());
        assert_eq!(y, z, "{in_rate} -> {out_rate}: differs from the library");
        // Finished means finished.
        assert!(
            err(
                "process after finish",
                r.process(RSlice::from_slice(&[0.0, 0.0]))
            )
            .contains("after finish")
        );
    }
}

#[test]
fn audio_budgets_and_junk_are_clear_errors() {
    let bytes = fixture("sine16k_mono.flac");
    // The sample budget: 8000 samples fit exactly, 5000 do not.
    let d = decode(
        &bytes,
        DecodeConfig {
            max_output_samples: 8_000,
            ..config()
        },
        usize::MAX,
    );
    assert_eq!(d.samples.len(), 8_000);
    let mut s = ok(
        "open",
        audio().open_decoder(DecodeConfig {
            max_output_samples: 5_000,
            ..config()
        }),
    );
    ok("push", s.push(RSlice::from_slice(&bytes)));
    ok("finish", s.finish());
    let e = loop {
        match s.next_chunk().into_result() {
            Ok(ROption::RSome(_)) => {}
            Ok(ROption::RNone) => panic!("the budget was not enforced"),
            Err(e) => break e.to_string(),
        }
    };
    assert!(e.contains("cap of 5000 samples"), "{e}");
    // The input budget.
    let mut s = ok(
        "open",
        audio().open_decoder(DecodeConfig {
            max_input_bytes: 100,
            ..config()
        }),
    );
    let e = err("push", s.push(RSlice::from_slice(&bytes)));
    assert!(e.contains("cap of 100 bytes"), "{e}");
    // Junk.
    let mut s = ok("open", audio().open_decoder(config()));
    ok(
        "push",
        s.push(RSlice::from_slice(b"definitely not audio, just text")),
    );
    let e = err("finish", s.finish());
    assert!(e.starts_with("decode: "), "{e}");
    assert!(!e.contains("panicked"), "{e}");
    // The wrong container, found at `finish`, or while streaming at the first `next_chunk` with enough bytes.
    for streaming in [false, true] {
        let mut s = ok(
            "open",
            audio().open_decoder(DecodeConfig {
                container: AudioContainer::FLAC,
                ..config()
            }),
        );
        let wav = fixture("sine16k_mono.wav");
        let n = if streaming { 100 } else { wav.len() };
        ok("push", s.push(RSlice::from_slice(&wav[..n])));
        let e = if streaming {
            err("next_chunk", s.next_chunk())
        } else {
            err("finish", s.finish())
        };
        assert_eq!(e, "decode: expected a flac stream, the data is wav");
    }
    let e = err(
        "open_resampler",
        audio().open_resampler(ResampleConfig {
            in_rate: 0,
            out_rate: 16_000,
            channels: 1,
        }),
    );
    assert!(e.contains("invalid sample rate"), "{e}");
    let mut r = ok(
        "open_resampler",
        audio().open_resampler(ResampleConfig {
            in_rate: 16_000,
            out_rate: 8_000,
            channels: 2,
        }),
    );
    let e = err("process", r.process(RSlice::from_slice(&[0.0, 0.0, 0.0])));
    assert!(e.contains("not a whole number of 2-channel frames"), "{e}");
}

/// A mono 16 kHz 16-bit WAV of `seconds` seconds of a sawtooth, written here.
fn long_wav(seconds: usize) -> Vec<u8> {
    let data: Vec<u8> = (0..16_000 * seconds)
        .flat_map(|i| ((((i * 7) % 65_536) as i32 - 32_768) as i16).to_le_bytes())
        .collect();
    let mut w = Vec::new();
    w.extend_from_slice(b"RIFF");
    w.extend_from_slice(&(36 + data.len() as u32).to_le_bytes());
    w.extend_from_slice(b"WAVEfmt ");
    for x in [
        16u32.to_le_bytes(),
        [1, 0, 1, 0],
        16_000u32.to_le_bytes(),
        32_000u32.to_le_bytes(),
        [2, 0, 16, 0],
    ] {
        w.extend_from_slice(&x);
    }
    w.extend_from_slice(b"data");
    w.extend_from_slice(&(data.len() as u32).to_le_bytes());
    w.extend_from_slice(&data);
    w
}

/// Streaming (ABI 1.4): `next_chunk` between pushes returns decoded chunks before `finish` and a 0-frame
/// chunk when it needs more input; the samples equal the library's whole-file decode, resampled or not.
#[test]
fn streamed_decoding_starts_before_finish_and_equals_the_whole_input() {
    let wav = long_wav(24);
    for out_rate in [0, 8_000] {
        let cfg = DecodeConfig {
            out_rate,
            ..config()
        };
        let mut s = ok("open_decoder", audio().open_decoder(cfg));
        let mut samples = Vec::new();
        let (mut before, mut waits) = (0, 0);
        for p in wav.chunks(4096) {
            ok("push", s.push(RSlice::from_slice(p)));
            loop {
                let c = ok("next_chunk", s.next_chunk())
                    .into_option()
                    .expect("not the end");
                if c.samples.is_empty() {
                    waits += 1;
                    break;
                }
                before += c.samples.len();
                samples.extend_from_slice(&c.samples);
            }
        }
        let info = ok("finish", s.finish());
        assert_eq!((info.rate, info.channels), (16_000, 1));
        while let ROption::RSome(c) = ok("next_chunk", s.next_chunk()) {
            assert!(!c.samples.is_empty(), "a 0-frame chunk after finish");
            samples.extend_from_slice(&c.samples);
        }
        let want = direct(&wav, (out_rate != 0).then_some(out_rate), None);
        assert!(
            waits > 0 && before * 2 > want.len(),
            "{before} of {} samples before finish",
            want.len()
        );
        assert_eq!(samples.len(), want.len());
        assert!(
            samples
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
    }
}

fn pattern(width: u32, height: u32, format: PixelFormat) -> ImageData {
    let ch = format.channels() as u32;
    let pixels: Vec<u8> = (0..width * height * ch)
        .map(|i| ((i * 37 + i / 7) % 251) as u8)
        .collect();
    ImageData {
        width,
        height,
        format,
        orientation: 1,
        source: ImageFormat::PNG,
        pixels: pixels.into(),
    }
}

fn encode(img: &ImageData, format: ImageFormat) -> Vec<u8> {
    let cfg = ImageEncodeConfig {
        format,
        quality: 90,
    };
    ok("encode", images().encode(img, cfg)).into_vec()
}

fn decode_image(bytes: &[u8], max_pixels: u64) -> RResult<ImageData, RBoxError> {
    images().decode(RSlice::from_slice(bytes), ImageDecodeConfig { max_pixels })
}

#[test]
fn png_and_webp_round_trips_are_exact() {
    for format in [PixelFormat::RGB8, PixelFormat::RGBA8] {
        let img = pattern(37, 23, format);
        for container in [ImageFormat::PNG, ImageFormat::WEBP] {
            let bytes = encode(&img, container);
            let back = ok("decode", decode_image(&bytes, 37 * 23));
            assert_eq!(back.source, container);
            assert_eq!(
                ImageData {
                    source: ImageFormat::PNG,
                    ..back
                },
                img,
                "{container} {format:?}"
            );
        }
    }
    // JPEG is lossy: geometry and format only.
    let img = pattern(16, 8, PixelFormat::RGB8);
    let back = ok(
        "decode",
        decode_image(&encode(&img, ImageFormat::JPEG), 128),
    );
    assert_eq!(
        (back.width, back.height, back.format, back.source),
        (16, 8, PixelFormat::RGB8, ImageFormat::JPEG)
    );
    assert_eq!(
        images().decode_formats().into_vec(),
        vec![ImageFormat::PNG, ImageFormat::JPEG, ImageFormat::WEBP]
    );
}

fn crc32(data: &[u8]) -> u32 {
    let mut c = 0xFFFF_FFFFu32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 == 1 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

fn chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut out = (data.len() as u32).to_be_bytes().to_vec();
    let body: Vec<u8> = kind.iter().chain(data).copied().collect();
    out.extend_from_slice(&body);
    out.extend_from_slice(&crc32(&body).to_be_bytes());
    out
}

#[test]
fn over_budget_image_is_rejected_from_its_header() {
    // A PNG header claiming 60000 x 50000 RGB pixels followed by an IDAT of two bytes (the start of a zlib
    // stream, nowhere near 9 GB of pixels): rejected for its size, so the check ran on the header, before any
    // pixel was decoded (decoding would fail on the missing data).
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&60_000u32.to_be_bytes());
    ihdr.extend_from_slice(&50_000u32.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend(chunk(b"IHDR", &ihdr));
    png.extend(chunk(b"IDAT", &[0x78, 0x9c]));
    png.extend(chunk(b"IEND", &[]));
    let e = err("decode", decode_image(&png, 1 << 24));
    assert_eq!(
        e,
        "image is 60000x50000 = 3000000000 pixels, over the limit of 16777216 pixels"
    );
    // A real image one pixel over the budget is rejected the same way; at the budget it decodes.
    let bytes = encode(&pattern(10, 10, PixelFormat::RGB8), ImageFormat::PNG);
    assert!(err("decode", decode_image(&bytes, 99)).contains("over the limit of 99 pixels"));
    ok("decode", decode_image(&bytes, 100));
}

#[test]
fn image_junk_and_misuse_are_clear_errors() {
    let e = err("decode", decode_image(b"not an image at all", u64::MAX));
    assert_eq!(e, "unrecognised image format (expected PNG, JPEG or WebP)");
    let bytes = encode(&pattern(10, 10, PixelFormat::RGBA8), ImageFormat::PNG);
    let e = err("decode", decode_image(&bytes[..bytes.len() / 2], u64::MAX));
    assert!(e.contains("Png") && !e.contains("panicked"), "{e}");
    let e = err(
        "encode",
        images().encode(
            &pattern(4, 4, PixelFormat::RGBA8),
            ImageEncodeConfig {
                format: ImageFormat::JPEG,
                quality: 90,
            },
        ),
    );
    assert!(e.contains("JPEG cannot store"), "{e}");
    let mut short = pattern(4, 4, PixelFormat::RGB8);
    short.pixels.truncate(5);
    let e = err(
        "encode",
        images().encode(
            &short,
            ImageEncodeConfig {
                format: ImageFormat::PNG,
                quality: 0,
            },
        ),
    );
    assert!(e.contains("pixel buffer is 5 bytes"), "{e}");
}

#[test]
fn codec_plugins_are_not_hals_and_say_what_they_lack() {
    let a = load("codec_audio_plugin", "audio-0001");
    let i = load("codec_image_plugin", "image-0001");
    let e = a.hal().err().expect("a codec is not a HAL").to_string();
    assert!(e.contains("is a codec plugin, not a HAL"), "{e}");
    let ic = i.codec().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(err("audio", ic.audio()), "image-0001 has no audio codec");
    let ac = a.codec().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(err("image", ac.image()), "audio-0001 has no image codec");
    assert_eq!(
        audio().containers().into_vec(),
        vec![
            AudioContainer::WAV,
            AudioContainer::MP3,
            AudioContainer::FLAC
        ]
    );
    // A HAL plugin (ABI 1.1) has the codec field, and the loader refuses to use it as a codec.
    let cpu = loom_plugins::load_file(&library("hal_cpu")).unwrap_or_else(|e| panic!("{e}"));
    assert!(cpu.has_codec_factory());
    let e = cpu.codec().err().expect("a HAL is not a codec").to_string();
    assert_eq!(e, "plugin `cpu-0001` is a hal plugin, not a codec");
}

/// A plugin built before ABI 1.1 (its root module has no `codec` field) still loads: abi_stable refuses it
/// against the current root-module type, so the loader checks it against `abi_1_0::LoomPlugin` and reads the
/// appended field as absent.
#[test]
fn abi_1_0_plugins_still_load_without_a_codec_factory() {
    let p = loom_plugins::load_file(&library("loom_test_plugin_abi10"))
        .unwrap_or_else(|e| panic!("an ABI 1.0 plugin is rejected: {e}"));
    assert_eq!(
        (p.id.as_str(), p.kind, p.abi),
        ("abi10-0001", PluginKind::HAL, (1, 0))
    );
    assert!(!p.has_codec_factory());
    let e = p.hal().err().expect("its hal factory answers").to_string();
    assert_eq!(
        e,
        "plugin `abi10-0001`: the ABI 1.0 test plugin opens no devices"
    );
    let e = p.codec().err().expect("a HAL").to_string();
    assert_eq!(e, "plugin `abi10-0001` is a hal plugin, not a codec");
}
