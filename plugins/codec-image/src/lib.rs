//! Image codecs for loom-serve.
//!
//! [`decode`] detects PNG, JPEG or WebP from the bytes, checks the header dimensions against a pixel
//! bound *before* any pixel data is decoded, and returns packed `Rgb8` or `Rgba8` pixels plus the
//! EXIF orientation (metadata only; pixels are never rotated). [`encode`] writes an [`Image`] back
//! as PNG, JPEG (RGB8 only) or lossless WebP.

use std::io::Cursor;

use image::codecs::jpeg::{JpegDecoder, JpegEncoder};
use image::codecs::png::{PngDecoder, PngEncoder};
use image::codecs::webp::{WebPDecoder, WebPEncoder};
use image::{DynamicImage, ExtendedColorType, ImageDecoder, ImageEncoder, ImageFormat, Limits};

/// Container format a source image was decoded from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceFormat {
    Png,
    Jpeg,
    WebP,
}

/// Layout of [`Image::pixels`]: packed, row-major, 8 bits per channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PixelFormat {
    /// 3 bytes per pixel: R, G, B.
    Rgb8,
    /// 4 bytes per pixel: R, G, B, A (straight alpha).
    Rgba8,
}

impl PixelFormat {
    /// Bytes per pixel.
    pub fn channels(self) -> usize {
        match self {
            PixelFormat::Rgb8 => 3,
            PixelFormat::Rgba8 => 4,
        }
    }
}

/// A decoded image (or one to encode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub width: u32,
    pub height: u32,
    pub format: PixelFormat,
    /// EXIF orientation, 1-8; 1 when the file carries none. Metadata only.
    pub orientation: u8,
    /// `width * height * format.channels()` bytes, packed row-major.
    pub pixels: Vec<u8>,
}

/// Output format for [`encode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Png,
    /// Baseline JPEG at `quality` (1-100). RGB8 input only.
    Jpeg {
        quality: u8,
    },
    /// Lossless WebP.
    WebP,
}

/// Errors from [`decode`] and [`encode`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unrecognised image format (expected PNG, JPEG or WebP)")]
    UnknownFormat,
    #[error("unsupported image format {0:?} (expected PNG, JPEG or WebP)")]
    UnsupportedFormat(ImageFormat),
    #[error("image is {width}x{height} = {pixels} pixels, over the limit of {max_pixels} pixels")]
    TooLarge {
        width: u32,
        height: u32,
        pixels: u64,
        max_pixels: u64,
    },
    #[error("image has zero size ({width}x{height})")]
    Empty { width: u32, height: u32 },
    #[error("JPEG encoding needs RGB8 pixels; RGBA8 has alpha, which JPEG cannot store")]
    JpegAlpha,
    #[error("JPEG quality must be 1-100, got {0}")]
    JpegQuality(u8),
    #[error("pixel buffer is {actual} bytes, but {width}x{height} {format:?} needs {expected}")]
    BufferSize {
        width: u32,
        height: u32,
        format: PixelFormat,
        expected: u64,
        actual: usize,
    },
    #[error("{format:?} image is truncated: {what}")]
    Truncated {
        format: SourceFormat,
        what: &'static str,
    },
    #[error("failed to decode {format:?} image: {source}")]
    Decode {
        format: SourceFormat,
        #[source]
        source: image::ImageError,
    },
    #[error("failed to encode image as {format:?}: {source}")]
    Encode {
        format: Format,
        #[source]
        source: image::ImageError,
    },
}

/// The container `bytes` are in, from their signature (what [`decode`] reads them as).
pub fn source_format(bytes: &[u8]) -> Result<SourceFormat, Error> {
    match image::guess_format(bytes) {
        Ok(ImageFormat::Png) => Ok(SourceFormat::Png),
        Ok(ImageFormat::Jpeg) => Ok(SourceFormat::Jpeg),
        Ok(ImageFormat::WebP) => Ok(SourceFormat::WebP),
        Ok(other) => Err(Error::UnsupportedFormat(other)),
        Err(_) => Err(Error::UnknownFormat),
    }
}

/// Decodes PNG, JPEG or WebP `bytes` into packed RGB8/RGBA8 pixels.
///
/// The header dimensions are checked against `max_pixels` before any pixel data is decoded.
pub fn decode(bytes: &[u8], max_pixels: u64) -> Result<Image, Error> {
    let source = source_format(bytes)?;
    let err = |source_err| Error::Decode {
        format: source,
        source: source_err,
    };
    let cursor = Cursor::new(bytes);
    match source {
        SourceFormat::Png => finish(
            PngDecoder::with_limits(cursor, Limits::no_limits()).map_err(err)?,
            bytes,
            source,
            max_pixels,
        ),
        SourceFormat::Jpeg => finish(
            JpegDecoder::new(cursor).map_err(err)?,
            bytes,
            source,
            max_pixels,
        ),
        SourceFormat::WebP => finish(
            WebPDecoder::new(cursor).map_err(err)?,
            bytes,
            source,
            max_pixels,
        ),
    }
}

/// `image`'s decoders are lenient about a missing end: zune-jpeg fills a truncated scan with
/// grey, `png` accepts a missing IEND and image-webp a missing pad byte. A cut-off upload should
/// be an error, so require the end marker (or the full RIFF length) here.
fn check_complete(bytes: &[u8], format: SourceFormat) -> Result<(), Error> {
    fn contains(hay: &[u8], needle: &[u8]) -> bool {
        hay.windows(needle.len()).any(|w| w == needle)
    }
    match format {
        SourceFormat::Png => {
            // IEND always has length 0 and the fixed CRC AE 42 60 82.
            const IEND: &[u8] = b"\0\0\0\0IEND\xAE\x42\x60\x82";
            if !contains(bytes, IEND) {
                return Err(Error::Truncated {
                    format,
                    what: "no IEND chunk",
                });
            }
        }
        SourceFormat::Jpeg => {
            // Entropy-coded data byte-stuffs 0xFF, so FF D9 after the last SOS (FF DA) is the
            // main image's EOI; an embedded EXIF thumbnail's markers all come before it.
            let last_sos = bytes.windows(2).rposition(|w| w == [0xFF, 0xDA]);
            let has_eoi = last_sos.is_some_and(|i| contains(&bytes[i + 2..], &[0xFF, 0xD9]));
            if !has_eoi {
                return Err(Error::Truncated {
                    format,
                    what: "no EOI marker after the last scan",
                });
            }
        }
        SourceFormat::WebP => {
            // The RIFF header gives the file size; image-webp tolerates a missing final pad byte.
            let riff_len = bytes
                .get(4..8)
                .map(|b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])) + 8);
            if riff_len.is_none_or(|n| (bytes.len() as u64) < n) {
                return Err(Error::Truncated {
                    format,
                    what: "shorter than its RIFF size",
                });
            }
        }
    }
    Ok(())
}

fn finish<D: ImageDecoder>(
    mut decoder: D,
    bytes: &[u8],
    source: SourceFormat,
    max_pixels: u64,
) -> Result<Image, Error> {
    let err = |source_err| Error::Decode {
        format: source,
        source: source_err,
    };
    let (width, height) = decoder.dimensions();
    let pixels = u64::from(width) * u64::from(height);
    if pixels > max_pixels {
        return Err(Error::TooLarge {
            width,
            height,
            pixels,
            max_pixels,
        });
    }
    if pixels == 0 {
        return Err(Error::Empty { width, height });
    }
    check_complete(bytes, source)?;
    // Bound decoder-side allocations: the decoded buffer (at most 16 bytes/pixel for 16-bit
    // RGBA) plus the default slack for metadata and intermediate buffers.
    let mut limits = Limits::default();
    limits.max_image_width = Some(width);
    limits.max_image_height = Some(height);
    let default_alloc = limits.max_alloc.unwrap_or(u64::MAX);
    limits.max_alloc = Some(default_alloc.saturating_add(pixels.saturating_mul(16)));
    decoder.set_limits(limits).map_err(err)?;

    let orientation = decoder.orientation().map_err(err)?.to_exif();
    let has_alpha = decoder.color_type().has_alpha();
    let dynamic = DynamicImage::from_decoder(decoder).map_err(err)?;
    let (format, pixels) = if has_alpha {
        (PixelFormat::Rgba8, dynamic.into_rgba8().into_raw())
    } else {
        (PixelFormat::Rgb8, dynamic.into_rgb8().into_raw())
    };
    Ok(Image {
        width,
        height,
        format,
        orientation,
        pixels,
    })
}

/// Encodes `image` as `format`. Orientation is not written.
pub fn encode(image: &Image, format: Format) -> Result<Vec<u8>, Error> {
    let expected =
        u64::from(image.width) * u64::from(image.height) * image.format.channels() as u64;
    if image.pixels.len() as u64 != expected {
        return Err(Error::BufferSize {
            width: image.width,
            height: image.height,
            format: image.format,
            expected,
            actual: image.pixels.len(),
        });
    }
    if image.width == 0 || image.height == 0 {
        return Err(Error::Empty {
            width: image.width,
            height: image.height,
        });
    }
    let color = match image.format {
        PixelFormat::Rgb8 => ExtendedColorType::Rgb8,
        PixelFormat::Rgba8 => ExtendedColorType::Rgba8,
    };
    let mut out = Vec::new();
    let result = match format {
        Format::Png => {
            PngEncoder::new(&mut out).write_image(&image.pixels, image.width, image.height, color)
        }
        Format::Jpeg { quality } => {
            if image.format != PixelFormat::Rgb8 {
                return Err(Error::JpegAlpha);
            }
            if !(1..=100).contains(&quality) {
                return Err(Error::JpegQuality(quality));
            }
            JpegEncoder::new_with_quality(&mut out, quality).write_image(
                &image.pixels,
                image.width,
                image.height,
                color,
            )
        }
        Format::WebP => WebPEncoder::new_lossless(&mut out).write_image(
            &image.pixels,
            image.width,
            image.height,
            color,
        ),
    };
    result.map_err(|source| Error::Encode { format, source })?;
    Ok(out)
}
