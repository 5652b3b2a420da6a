//! Round-trip, size-bound, orientation and robustness tests for `codec-image`.

use codec_image::{Error, Format, Image, PixelFormat, decode, encode};

fn pattern(width: u32, height: u32, format: PixelFormat) -> Image {
    let channels = format.channels();
    let mut pixels = Vec::with_capacity(width as usize * height as usize * channels);
    for y in 0..height {
        for x in 0..width {
            pixels.push((x * 37 % 256) as u8);
            pixels.push((y * 53 % 256) as u8);
            pixels.push(((x + y) * 7 % 256) as u8);
            if channels == 4 {
                pixels.push(((x * 13 + y * 31) % 256) as u8);
            }
        }
    }
    Image {
        width,
        height,
        format,
        orientation: 1,
        pixels,
    }
}

/// A smooth gradient, which JPEG reproduces closely.
fn smooth_rgb(width: u32, height: u32) -> Image {
    let mut pixels = Vec::new();
    for y in 0..height {
        for x in 0..width {
            pixels.push((x * 255 / (width - 1)) as u8);
            pixels.push((y * 255 / (height - 1)) as u8);
            pixels.push(((x + y) * 255 / (width + height - 2)) as u8);
        }
    }
    Image {
        width,
        height,
        format: PixelFormat::Rgb8,
        orientation: 1,
        pixels,
    }
}

#[test]
fn png_rgb8_roundtrip_exact() {
    let img = pattern(37, 23, PixelFormat::Rgb8);
    let bytes = encode(&img, Format::Png).unwrap();
    let back = decode(&bytes, u64::MAX).unwrap();
    assert_eq!(back, img);
}

#[test]
fn png_rgba8_roundtrip_exact() {
    let img = pattern(19, 41, PixelFormat::Rgba8);
    let bytes = encode(&img, Format::Png).unwrap();
    let back = decode(&bytes, u64::MAX).unwrap();
    assert_eq!(back, img);
}

#[test]
fn webp_lossless_roundtrip_exact() {
    for format in [PixelFormat::Rgb8, PixelFormat::Rgba8] {
        let img = pattern(33, 17, format);
        let bytes = encode(&img, Format::WebP).unwrap();
        assert_eq!(&bytes[..4], b"RIFF");
        let back = decode(&bytes, u64::MAX).unwrap();
        assert_eq!(back, img, "{format:?}");
    }
}

/// JPEG at quality 95 on a smooth gradient: mean absolute error per channel below 3 levels.
const JPEG_MAE_TOLERANCE: f64 = 3.0;

#[test]
fn jpeg_roundtrip_within_tolerance() {
    let img = smooth_rgb(64, 48);
    let bytes = encode(&img, Format::Jpeg { quality: 95 }).unwrap();
    let back = decode(&bytes, u64::MAX).unwrap();
    assert_eq!((back.width, back.height), (64, 48));
    assert_eq!(back.format, PixelFormat::Rgb8);
    assert_eq!(back.orientation, 1);
    assert_eq!(back.pixels.len(), img.pixels.len());
    let total: u64 = img
        .pixels
        .iter()
        .zip(&back.pixels)
        .map(|(a, b)| u64::from(a.abs_diff(*b)))
        .sum();
    let mae = total as f64 / img.pixels.len() as f64;
    assert!(mae < JPEG_MAE_TOLERANCE, "JPEG mean abs error {mae}");
}

#[test]
fn jpeg_rejects_rgba_and_bad_quality() {
    let rgba = pattern(4, 4, PixelFormat::Rgba8);
    assert!(matches!(
        encode(&rgba, Format::Jpeg { quality: 90 }),
        Err(Error::JpegAlpha)
    ));
    let rgb = pattern(4, 4, PixelFormat::Rgb8);
    assert!(matches!(
        encode(&rgb, Format::Jpeg { quality: 0 }),
        Err(Error::JpegQuality(0))
    ));
}

#[test]
fn encode_rejects_wrong_buffer_size() {
    let mut img = pattern(4, 4, PixelFormat::Rgb8);
    img.pixels.pop();
    assert!(matches!(
        encode(&img, Format::Png),
        Err(Error::BufferSize { .. })
    ));
}

#[test]
fn over_size_rejected_real_image() {
    let img = pattern(100, 100, PixelFormat::Rgb8);
    for format in [Format::Png, Format::WebP, Format::Jpeg { quality: 80 }] {
        let bytes = encode(&img, format).unwrap();
        let err = decode(&bytes, 9999).unwrap_err();
        assert!(
            matches!(
                err,
                Error::TooLarge {
                    width: 100,
                    height: 100,
                    pixels: 10_000,
                    max_pixels: 9999
                }
            ),
            "{format:?}: {err}"
        );
        let msg = err.to_string();
        assert!(msg.contains("10000") && msg.contains("9999"), "{msg}");
        assert!(decode(&bytes, 10_000).is_ok());
    }
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn over_size_rejected_from_header_only() {
    // A real 2x2 PNG whose IHDR is rewritten to claim 100000x100000 (CRC fixed up). Its pixel
    // data is far too small for that size, so reaching TooLarge proves the check ran on the header.
    let img = pattern(2, 2, PixelFormat::Rgb8);
    let mut bytes = encode(&img, Format::Png).unwrap();
    // Signature (8) + IHDR length (4) + "IHDR" (4) + width (4) + height (4).
    assert_eq!(&bytes[12..16], b"IHDR");
    bytes[16..20].copy_from_slice(&100_000u32.to_be_bytes());
    bytes[20..24].copy_from_slice(&100_000u32.to_be_bytes());
    let crc = crc32(&bytes[12..29]);
    bytes[29..33].copy_from_slice(&crc.to_be_bytes());
    let err = decode(&bytes, 1 << 20).unwrap_err();
    assert!(
        matches!(
            err,
            Error::TooLarge {
                width: 100_000,
                height: 100_000,
                pixels: 10_000_000_000,
                max_pixels: 1_048_576
            }
        ),
        "{err}"
    );
}

/// Splices an APP1 Exif segment with a little-endian TIFF IFD holding Orientation (0x0112)
/// right after SOI.
fn with_exif_orientation(jpeg: &[u8], orientation: u16) -> Vec<u8> {
    let mut tiff = Vec::new();
    tiff.extend_from_slice(b"II*\0");
    tiff.extend_from_slice(&8u32.to_le_bytes()); // IFD0 offset
    tiff.extend_from_slice(&1u16.to_le_bytes()); // one entry
    tiff.extend_from_slice(&0x0112u16.to_le_bytes()); // Orientation
    tiff.extend_from_slice(&3u16.to_le_bytes()); // SHORT
    tiff.extend_from_slice(&1u32.to_le_bytes()); // count
    tiff.extend_from_slice(&orientation.to_le_bytes());
    tiff.extend_from_slice(&[0, 0]); // value padding
    tiff.extend_from_slice(&0u32.to_le_bytes()); // no next IFD
    let mut payload = b"Exif\0\0".to_vec();
    payload.extend_from_slice(&tiff);
    let len = u16::try_from(payload.len() + 2).unwrap();

    assert_eq!(&jpeg[..2], &[0xFF, 0xD8]);
    let mut out = jpeg[..2].to_vec();
    out.extend_from_slice(&[0xFF, 0xE1]);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&payload);
    out.extend_from_slice(&jpeg[2..]);
    out
}

#[test]
fn jpeg_exif_orientation_is_reported() {
    let img = smooth_rgb(16, 8);
    let jpeg = encode(&img, Format::Jpeg { quality: 90 }).unwrap();
    let plain = decode(&jpeg, u64::MAX).unwrap();
    assert_eq!(plain.orientation, 1);

    let tagged = decode(&with_exif_orientation(&jpeg, 6), u64::MAX).unwrap();
    assert_eq!(tagged.orientation, 6);
    // Orientation is metadata only: pixels and dimensions are unchanged.
    assert_eq!((tagged.width, tagged.height), (16, 8));
    assert_eq!(tagged.pixels, plain.pixels);

    for o in 1..=8u16 {
        let got = decode(&with_exif_orientation(&jpeg, o), u64::MAX).unwrap();
        assert_eq!(u16::from(got.orientation), o);
    }
}

#[test]
fn unknown_format_is_a_clear_error() {
    for bytes in [&b""[..], b"hello world, not an image", &[0u8; 64]] {
        let err = decode(bytes, u64::MAX).unwrap_err();
        assert!(matches!(err, Error::UnknownFormat), "{err}");
        assert!(err.to_string().contains("PNG, JPEG or WebP"));
    }
}

#[test]
fn every_truncation_errors_without_panicking() {
    // `decode` requires PNG's IEND and JPEG's EOI, so even a cut that only loses the trailer is
    // an error (the underlying decoders alone would accept some of these).
    let img = pattern(8, 6, PixelFormat::Rgb8);
    let inputs = [
        encode(&img, Format::Png).unwrap(),
        encode(&img, Format::Jpeg { quality: 75 }).unwrap(),
        encode(&img, Format::WebP).unwrap(),
        with_exif_orientation(&encode(&img, Format::Jpeg { quality: 75 }).unwrap(), 6),
    ];
    for full in &inputs {
        assert!(decode(full, u64::MAX).is_ok());
        for len in 0..full.len() {
            assert!(
                decode(&full[..len], u64::MAX).is_err(),
                "truncation to {len} of {} bytes decoded",
                full.len()
            );
        }
    }
}

#[test]
fn garbage_after_valid_magic_errors_without_panicking() {
    let img = pattern(8, 6, PixelFormat::Rgba8);
    let png = encode(&img, Format::Png).unwrap();
    let webp = encode(&img, Format::WebP).unwrap();
    let jpeg = encode(
        &pattern(8, 6, PixelFormat::Rgb8),
        Format::Jpeg { quality: 75 },
    )
    .unwrap();
    let mut state = 0x1234_5678u32;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        state
    };
    for full in [&png, &webp, &jpeg] {
        for _ in 0..300 {
            let mut bytes = full.clone();
            // Corrupt a few bytes past the magic.
            for _ in 0..4 {
                let i = 12 + (next() as usize % (bytes.len() - 12));
                bytes[i] = next() as u8;
            }
            if let Ok(out) = decode(&bytes, u64::MAX) {
                assert_eq!(
                    out.pixels.len(),
                    out.width as usize * out.height as usize * out.format.channels()
                );
            }
        }
    }
}
