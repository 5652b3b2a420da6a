//! `image-0001`: the image codec plugin. A thin wrapper that puts `codec-image` (PNG/JPEG/WebP decoding into
//! packed RGB8/RGBA8 with a header-checked pixel budget and EXIF orientation; PNG/JPEG/lossless WebP encoding)
//! behind `loom-plugin-api`'s [`ImageCodec`]; no decoding or encoding of its own. Errors keep the library's
//! text. Every entry point runs under `loom_plugin_api::guard` / `guard_probe`.

use abi_stable::export_root_module;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RBoxError, RResult, RSlice, RStr, RVec};
use codec_image::{Format, Image, SourceFormat};
use loom_plugin_api::{
    ABI_MAJOR, ABI_MINOR, AudioCodecBox, Codec, Codec_TO, CodecBox, ImageCodec, ImageCodec_TO,
    ImageCodecBox, ImageData, ImageDecodeConfig, ImageEncodeConfig, ImageFormat, LoomPlugin,
    LoomPlugin_Ref, PixelFormat, PluginKind, Probe, guard, guard_probe, missing,
};

/// This plugin's id.
pub const PLUGIN_ID: &str = "image-0001";

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
            "image codec: png, jpeg, webp decoding to rgb8/rgba8; png, jpeg, webp encoding",
        )
    })
}

extern "C" fn codec() -> RResult<CodecBox, RBoxError> {
    guard("image-0001 codec", || {
        Ok::<_, String>(Codec_TO::from_value(Plugin, TD_Opaque))
    })
}

struct Plugin;

impl Codec for Plugin {
    fn audio(&self) -> RResult<AudioCodecBox, RBoxError> {
        RResult::RErr(missing(PLUGIN_ID, "audio codec"))
    }

    fn image(&self) -> RResult<ImageCodecBox, RBoxError> {
        guard("image", || {
            Ok::<_, String>(ImageCodec_TO::from_value(Images, TD_Opaque))
        })
    }
}

struct Images;

fn source(f: SourceFormat) -> ImageFormat {
    match f {
        SourceFormat::Png => ImageFormat::PNG,
        SourceFormat::Jpeg => ImageFormat::JPEG,
        SourceFormat::WebP => ImageFormat::WEBP,
    }
}

fn decode(bytes: &[u8], config: ImageDecodeConfig) -> Result<ImageData, codec_image::Error> {
    let src = codec_image::source_format(bytes)?;
    let img = codec_image::decode(bytes, config.max_pixels)?;
    Ok(ImageData {
        width: img.width,
        height: img.height,
        format: match img.format {
            codec_image::PixelFormat::Rgb8 => PixelFormat::RGB8,
            codec_image::PixelFormat::Rgba8 => PixelFormat::RGBA8,
        },
        orientation: img.orientation,
        source: source(src),
        pixels: RVec::from(img.pixels),
    })
}

fn encode(image: &ImageData, config: ImageEncodeConfig) -> Result<Vec<u8>, String> {
    let format = match image.format {
        PixelFormat::RGB8 => codec_image::PixelFormat::Rgb8,
        PixelFormat::RGBA8 => codec_image::PixelFormat::Rgba8,
        other => return Err(format!("unsupported pixel format {}", other.0)),
    };
    let out = match config.format {
        ImageFormat::PNG => Format::Png,
        ImageFormat::JPEG => Format::Jpeg {
            quality: config.quality,
        },
        ImageFormat::WEBP => Format::WebP,
        other => return Err(format!("unsupported output {other}")),
    };
    let img = Image {
        width: image.width,
        height: image.height,
        format,
        orientation: image.orientation,
        pixels: image.pixels.to_vec(),
    };
    codec_image::encode(&img, out).map_err(|e| e.to_string())
}

impl ImageCodec for Images {
    fn decode_formats(&self) -> RVec<ImageFormat> {
        RVec::from(vec![ImageFormat::PNG, ImageFormat::JPEG, ImageFormat::WEBP])
    }

    fn decode(
        &self,
        bytes: RSlice<'_, u8>,
        config: ImageDecodeConfig,
    ) -> RResult<ImageData, RBoxError> {
        guard("decode", || decode(bytes.as_slice(), config))
    }

    fn encode(&self, image: &ImageData, config: ImageEncodeConfig) -> RResult<RVec<u8>, RBoxError> {
        guard("encode", || encode(image, config).map(RVec::from))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_formats_are_errors() {
        let img = ImageData {
            width: 1,
            height: 1,
            format: PixelFormat(9),
            orientation: 1,
            source: ImageFormat::PNG,
            pixels: RVec::from(vec![0, 0, 0]),
        };
        let cfg = ImageEncodeConfig {
            format: ImageFormat::PNG,
            quality: 0,
        };
        let e = Images.encode(&img, cfg).into_result().unwrap_err();
        assert!(e.to_string().contains("pixel format 9"), "{e}");
        let img = ImageData {
            format: PixelFormat::RGB8,
            ..img
        };
        let cfg = ImageEncodeConfig {
            format: ImageFormat(42),
            quality: 0,
        };
        let e = Images.encode(&img, cfg).into_result().unwrap_err();
        assert!(e.to_string().contains("image format 42"), "{e}");
    }
}
