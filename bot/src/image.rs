//! The one image pipeline: everything done to an image's bytes before a vision model sees
//! them. The agent runs it on photos members attach ([`crate::agent`], when it resolves the
//! image references of the current turn) and the `load_image` tool (parlor-toolsets) on the
//! images it loads, so both get the same checks, limits and downscaling. It owns:
//!
//! - **sniffing** ([`sniff`]): the format comes from the magic numbers, never a file name, a
//!   platform's MIME type or a server's word;
//! - **limits**: [`DEFAULT_MAX_BYTES`] and [`DEFAULT_MAX_SIDE`] for callers to enforce and
//!   configure; [`MAX_SIDE`], [`MAX_PIXELS`] and [`MAX_DECODE_BYTES`] enforced on the
//!   declared size before decoding ([`inspect`]) and while decoding; [`DECODE_BUDGET_MIB`]
//!   for all decodes of the process at once;
//! - **preparing** ([`prepare`], [`prepare_blocking`]): decode within the limits, downscale
//!   and re-encode when needed;
//! - **encoding** for the wire ([`Prepared::data_url`]).
//!
//! It knows nothing of where an image came from (platform download, URL fetch); fetching is
//! the caller's.
//!
//! The formats are the four that vision APIs accept: PNG, JPEG, GIF and WebP. Every image is
//! decoded, even one passed on unchanged: a file that only *starts* like a PNG is refused
//! here rather than by the provider, which would fail the whole request. An image that fits
//! (longest side within the limit, not rotated by EXIF, not a GIF, at most
//! [`PASS_THROUGH_BYTES`]) is sent as it came; any other is scaled to fit and re-encoded as
//! JPEG (quality [`JPEG_QUALITY`]), or as PNG when it has transparent pixels. GIFs are always
//! re-encoded (first frame) because providers refuse animated GIFs.
//!
//! Decoding is bounded, so a small file that inflates to gigabytes (a "decompression bomb":
//! a 243 KiB flat PNG declares 9000 × 9000 pixels) is refused, not decoded: the header's
//! dimensions are checked first ([`MAX_SIDE`] per side, [`MAX_PIXELS`] in all, the decoded
//! size within [`MAX_DECODE_BYTES`]), and the decoder itself gets that memory limit. One
//! image within the limits still costs up to [`MAX_DECODE_BYTES`], so N chats sending one
//! each would cost N times that: [`prepare_blocking`] takes the decoded size from a budget
//! of [`DECODE_BUDGET_MIB`] shared by the whole process and waits while it is spent. The
//! work is CPU-bound: async callers use [`prepare_blocking`], which runs it on a blocking
//! thread. The full-size image is scaled down before it is rotated (EXIF), so a rotation
//! never copies it.

use std::io::Cursor;

use image::codecs::jpeg::JpegEncoder;
use image::error::LimitErrorKind;
use image::metadata::Orientation;
use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, Limits};

/// Largest width or height decoded at all.
pub const MAX_SIDE: u32 = 16_384;
/// Most pixels decoded at all (40 megapixels: more than any phone camera's photo); a larger
/// image is refused on its declared size, before decoding.
pub const MAX_PIXELS: u64 = 40_000_000;
/// Most memory a decoder may allocate for one image: 40 megapixels of 8-bit RGBA.
pub const MAX_DECODE_BYTES: u64 = 160 * MIB;
/// Memory, in MiB, that all decodes of the process may hold at once ([`prepare_blocking`]
/// waits for its share): one image at the limit, or several smaller ones.
pub const DECODE_BUDGET_MIB: u32 = 160;
const MIB: u64 = 1024 * 1024;

/// The decode budget: one permit per MiB of decoded image. Process-wide because the memory
/// it guards is: every chat, `load_image` and MCP images draw from it.
static DECODING: tokio::sync::Semaphore =
    tokio::sync::Semaphore::const_new(DECODE_BUDGET_MIB as usize);
/// Largest image passed on without re-encoding; larger files are re-encoded (smaller
/// requests, and under every provider's per-image limit).
pub const PASS_THROUGH_BYTES: usize = 4 * 1024 * 1024;
/// JPEG quality of re-encoded images.
pub const JPEG_QUALITY: u8 = 85;
/// The smallest `image_max_side` honoured; below it images would be unreadable.
pub const MIN_TARGET_SIDE: u32 = 64;
/// Longest side sent to the model unless configured otherwise: the size above which the
/// common vision models scale an image down themselves, so larger only costs bandwidth.
pub const DEFAULT_MAX_SIDE: u32 = 1568;
/// Most bytes of an image downloaded or fetched unless configured otherwise (Telegram's
/// own limit for files a bot may download).
pub const DEFAULT_MAX_BYTES: u64 = 20 * 1024 * 1024;

/// An image format recognized by its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `\x89PNG\r\n\x1a\n`
    Png,
    /// `FF D8 FF`
    Jpeg,
    /// `GIF87a` / `GIF89a`
    Gif,
    /// `RIFF....WEBP`
    Webp,
}

impl Kind {
    /// The MIME type.
    pub fn mime(self) -> &'static str {
        match self {
            Kind::Png => "image/png",
            Kind::Jpeg => "image/jpeg",
            Kind::Gif => "image/gif",
            Kind::Webp => "image/webp",
        }
    }

    fn format(self) -> ImageFormat {
        match self {
            Kind::Png => ImageFormat::Png,
            Kind::Jpeg => ImageFormat::Jpeg,
            Kind::Gif => ImageFormat::Gif,
            Kind::Webp => ImageFormat::WebP,
        }
    }
}

/// The format `bytes` start like, if any of the four: `image`'s own magic-number table,
/// narrowed to what the pipeline decodes.
pub fn sniff(bytes: &[u8]) -> Option<Kind> {
    match image::guess_format(bytes).ok()? {
        ImageFormat::Png => Some(Kind::Png),
        ImageFormat::Jpeg => Some(Kind::Jpeg),
        ImageFormat::Gif => Some(Kind::Gif),
        ImageFormat::WebP => Some(Kind::Webp),
        _ => None,
    }
}

/// An image ready to be sent to the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// The encoded image.
    pub bytes: Vec<u8>,
    /// Its MIME type.
    pub mime: &'static str,
    /// Width sent, in pixels.
    pub width: u32,
    /// Height sent, in pixels.
    pub height: u32,
    /// Width of the original (after EXIF rotation).
    pub original_width: u32,
    /// Height of the original (after EXIF rotation).
    pub original_height: u32,
    /// Whether the bytes were re-encoded (scaled, rotated, or converted).
    pub reencoded: bool,
}

impl Prepared {
    /// The image as a `data:` URL, the form a request's image part carries it in.
    pub fn data_url(&self) -> String {
        use base64::Engine as _;
        format!(
            "data:{};base64,{}",
            self.mime,
            base64::engine::general_purpose::STANDARD.encode(&self.bytes)
        )
    }
}

/// Why an image cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// Not one of the four formats, or broken.
    #[error("{0}")]
    NotAnImage(String),
    /// Too many pixels to decode safely.
    #[error("{0}")]
    TooLarge(String),
    /// The work itself failed (the blocking thread died); the details are in the log.
    #[error("{0}")]
    Internal(String),
}

/// What an image's header declares, read without decoding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Its format.
    pub kind: Kind,
    /// Width, in pixels (before EXIF rotation).
    pub width: u32,
    /// Height, in pixels (before EXIF rotation).
    pub height: u32,
    /// Bytes the decoded image takes.
    pub decoded_bytes: u64,
}

/// Reads the header of `bytes` and refuses it when decoding it would break a limit
/// ([`MAX_SIDE`], [`MAX_PIXELS`], [`MAX_DECODE_BYTES`]): the check that comes before any
/// pixel is decoded.
pub fn inspect(bytes: &[u8]) -> Result<Header, ImageError> {
    let kind = sniff(bytes).ok_or_else(|| ImageError::NotAnImage(not_an_image(bytes)))?;
    let decoder = open(bytes, kind)?;
    within_limits(kind, &decoder)
}

/// A decoder of `bytes` with the limits set; only the header has been read.
fn open(bytes: &[u8], kind: Kind) -> Result<impl ImageDecoder + '_, ImageError> {
    let mut reader = ImageReader::with_format(Cursor::new(bytes), kind.format());
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    limits.max_alloc = Some(MAX_DECODE_BYTES);
    reader.limits(limits);
    reader.into_decoder().map_err(|e| decode_error(kind, &e))
}

fn within_limits(kind: Kind, decoder: &impl ImageDecoder) -> Result<Header, ImageError> {
    let (width, height) = decoder.dimensions();
    let pixels = u64::from(width) * u64::from(height);
    if pixels > MAX_PIXELS {
        return Err(ImageError::TooLarge(format!(
            "the image is too large to read: {width} × {height} pixels is {} megapixels, \
             more than the {} read",
            pixels.div_ceil(1_000_000),
            MAX_PIXELS / 1_000_000
        )));
    }
    let decoded_bytes = decoder.total_bytes();
    if decoded_bytes > MAX_DECODE_BYTES {
        return Err(too_much_memory());
    }
    Ok(Header {
        kind,
        width,
        height,
        decoded_bytes,
    })
}

fn too_much_memory() -> ImageError {
    ImageError::TooLarge(format!(
        "the image is too large to read: decoding it would need more than {} MB of memory",
        MAX_DECODE_BYTES / MIB
    ))
}

/// [`prepare`] on a blocking thread, so that decoding a large photo does not hold up the
/// async runtime's workers, and within the process's decode budget: the header is checked
/// first, then the decoded size is taken from [`DECODE_BUDGET_MIB`] (waiting while other
/// decodes hold it) until the decode is done.
pub async fn prepare_blocking(bytes: Vec<u8>, max_side: u32) -> Result<Prepared, ImageError> {
    let header = inspect(&bytes)?;
    let mib = header
        .decoded_bytes
        .div_ceil(MIB)
        .clamp(1, u64::from(DECODE_BUDGET_MIB));
    let permits = u32::try_from(mib).unwrap_or(DECODE_BUDGET_MIB);
    let Ok(budget) = DECODING.acquire_many(permits).await else {
        // The semaphore is never closed; answer as for a dead thread all the same.
        return Err(failed());
    };
    tokio::task::spawn_blocking(move || {
        let _budget = budget;
        prepare(bytes, max_side)
    })
    .await
    .unwrap_or_else(|error| {
        tracing::error!(%error, "image preparation task failed");
        Err(failed())
    })
}

fn failed() -> ImageError {
    ImageError::Internal("the image could not be processed; the error was logged".to_owned())
}

/// Checks, decodes and (when needed) downscales `bytes` so that the longest side is at most
/// `max_side` pixels (values below [`MIN_TARGET_SIDE`] count as that). See the module docs.
/// It holds no share of the decode budget: async callers use [`prepare_blocking`].
pub fn prepare(bytes: Vec<u8>, max_side: u32) -> Result<Prepared, ImageError> {
    let max_side = max_side.max(MIN_TARGET_SIDE);
    let kind = sniff(&bytes).ok_or_else(|| ImageError::NotAnImage(not_an_image(&bytes)))?;
    let mut decoder = open(&bytes, kind)?;
    let header = within_limits(kind, &decoder)?;
    let orientation = decoder.orientation().unwrap_or(Orientation::NoTransforms);
    let mut img = DynamicImage::from_decoder(decoder).map_err(|e| decode_error(kind, &e))?;
    let (original_width, original_height) = if swaps_sides(orientation) {
        (header.height, header.width)
    } else {
        (header.width, header.height)
    };
    let fits = original_width.max(original_height) <= max_side;
    if fits
        && orientation == Orientation::NoTransforms
        && kind != Kind::Gif
        && bytes.len() <= PASS_THROUGH_BYTES
    {
        return Ok(Prepared {
            bytes,
            mime: kind.mime(),
            width: original_width,
            height: original_height,
            original_width,
            original_height,
            reencoded: false,
        });
    }
    if !fits {
        // `thumbnail` averages the source pixels of each target pixel: a good downscale, and
        // fast (integer arithmetic), which matters for a 40-megapixel photo. The bound is a
        // square, so scaling before rotating gives the same size as after.
        img = img.thumbnail(max_side, max_side);
    }
    img.apply_orientation(orientation);
    let (bytes, mime) = encode(&img)?;
    Ok(Prepared {
        bytes,
        mime,
        width: img.width(),
        height: img.height(),
        original_width,
        original_height,
        reencoded: true,
    })
}

/// JPEG for opaque images, PNG when a pixel is transparent.
fn encode(img: &DynamicImage) -> Result<(Vec<u8>, &'static str), ImageError> {
    let mut out = Vec::new();
    let transparent = img.color().has_alpha() && img.to_rgba8().pixels().any(|p| p.0[3] < 255);
    let failed = |e: image::ImageError| {
        tracing::error!(error = %e, "re-encoding an image failed");
        ImageError::NotAnImage("the image could not be re-encoded".to_owned())
    };
    if transparent {
        DynamicImage::ImageRgba8(img.to_rgba8())
            .write_to(&mut Cursor::new(&mut out), ImageFormat::Png)
            .map_err(failed)?;
        Ok((out, Kind::Png.mime()))
    } else {
        JpegEncoder::new_with_quality(&mut out, JPEG_QUALITY)
            .encode_image(&img.to_rgb8())
            .map_err(failed)?;
        Ok((out, Kind::Jpeg.mime()))
    }
}

/// Whether `orientation` turns the image a quarter, so that its sides swap.
fn swaps_sides(orientation: Orientation) -> bool {
    matches!(
        orientation,
        Orientation::Rotate90
            | Orientation::Rotate270
            | Orientation::Rotate90FlipH
            | Orientation::Rotate270FlipH
    )
}

fn decode_error(kind: Kind, error: &image::ImageError) -> ImageError {
    match error {
        image::ImageError::Limits(limit) => match limit.kind() {
            LimitErrorKind::DimensionError => ImageError::TooLarge(format!(
                "the image is too large to read: it has more than {MAX_SIDE} pixels on a side"
            )),
            _ => too_much_memory(),
        },
        other => ImageError::NotAnImage(format!(
            "the data starts like a {} image but cannot be decoded ({other})",
            kind.mime()
        )),
    }
}

/// What the data looks like instead, for the model.
fn not_an_image(bytes: &[u8]) -> String {
    let head = String::from_utf8_lossy(&bytes[..bytes.len().min(16)]).to_lowercase();
    let looks_like = if bytes.is_empty() {
        " (it is empty)"
    } else if head.trim_start().starts_with('<') {
        " (it looks like HTML or XML, e.g. an error page or an SVG)"
    } else if head.trim_start().starts_with('{') {
        " (it looks like JSON)"
    } else {
        ""
    };
    format!("the data is not a PNG, JPEG, GIF or WebP image{looks_like}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{ImageBuffer, Rgb, Rgba};

    fn png(width: u32, height: u32) -> Vec<u8> {
        let img = ImageBuffer::from_fn(width, height, |x, y| Rgb([x as u8, y as u8, 128]));
        let mut out = Vec::new();
        DynamicImage::ImageRgb8(img)
            .write_to(&mut Cursor::new(&mut out), ImageFormat::Png)
            .unwrap();
        out
    }

    #[test]
    fn sniff_knows_the_four_formats_by_their_first_bytes() {
        assert_eq!(sniff(&png(2, 2)), Some(Kind::Png));
        assert_eq!(sniff(&[0xFF, 0xD8, 0xFF, 0xE0]), Some(Kind::Jpeg));
        assert_eq!(sniff(b"GIF89a...."), Some(Kind::Gif));
        assert_eq!(sniff(b"RIFF\0\0\0\0WEBPVP8 "), Some(Kind::Webp));
        assert_eq!(sniff(b"RIFF\0\0\0\0WAVE"), None);
        assert_eq!(sniff(b"<html>"), None);
        assert_eq!(sniff(b""), None);
    }

    #[test]
    fn a_small_image_passes_unchanged() {
        let bytes = png(40, 30);
        let prepared = prepare(bytes.clone(), 1568).unwrap();
        assert_eq!(prepared.bytes, bytes);
        assert_eq!((prepared.width, prepared.height), (40, 30));
        assert_eq!(prepared.mime, "image/png");
        assert!(!prepared.reencoded);
    }

    #[test]
    fn the_data_url_carries_the_mime_and_the_base64_of_the_bytes() {
        let prepared = Prepared {
            bytes: vec![1, 2, 3],
            mime: "image/png",
            width: 1,
            height: 1,
            original_width: 1,
            original_height: 1,
            reencoded: false,
        };
        assert_eq!(prepared.data_url(), "data:image/png;base64,AQID");
    }

    #[test]
    fn a_large_image_is_scaled_to_the_longest_side_and_becomes_jpeg() {
        let prepared = prepare(png(400, 300), 100).unwrap();
        assert_eq!((prepared.width, prepared.height), (100, 75));
        assert_eq!(
            (prepared.original_width, prepared.original_height),
            (400, 300)
        );
        assert_eq!(prepared.mime, "image/jpeg");
        assert_eq!(sniff(&prepared.bytes), Some(Kind::Jpeg));
        assert!(prepared.reencoded);
    }

    #[test]
    fn transparency_is_kept_as_png() {
        let img = ImageBuffer::from_fn(200, 100, |x, _| Rgba([0, 0, 0, (x % 256) as u8]));
        let mut bytes = Vec::new();
        DynamicImage::ImageRgba8(img)
            .write_to(&mut Cursor::new(&mut bytes), ImageFormat::Png)
            .unwrap();
        let prepared = prepare(bytes, 100).unwrap();
        assert_eq!(prepared.mime, "image/png");
        assert_eq!((prepared.width, prepared.height), (100, 50));
    }

    #[test]
    fn a_gif_is_always_reencoded() {
        let img = ImageBuffer::from_fn(8, 8, |_, _| Rgba([10, 20, 30, 255]));
        let mut bytes = Vec::new();
        DynamicImage::ImageRgba8(img)
            .write_to(&mut Cursor::new(&mut bytes), ImageFormat::Gif)
            .unwrap();
        let prepared = prepare(bytes, 1568).unwrap();
        assert_eq!(prepared.mime, "image/jpeg");
        assert!(prepared.reencoded);
    }

    #[test]
    fn broken_or_foreign_data_is_not_an_image() {
        let mut truncated = png(50, 50);
        truncated.truncate(40);
        assert!(matches!(
            prepare(truncated, 1568),
            Err(ImageError::NotAnImage(m)) if m.contains("cannot be decoded")
        ));
        assert!(matches!(
            prepare(b"<!doctype html><p>hi".to_vec(), 1568),
            Err(ImageError::NotAnImage(m)) if m.contains("HTML")
        ));
    }

    /// A PNG that is only a header declaring `width` × `height` pixels of `color_type`
    /// (0 grey, 2 RGB, 6 RGBA) at `depth` bits: decoding it would fail at once, so a
    /// `TooLarge` answer proves the refusal came from the header.
    fn png_header(width: u32, height: u32, color_type: u8, depth: u8) -> Vec<u8> {
        let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut ihdr = b"IHDR".to_vec();
        ihdr.extend_from_slice(&width.to_be_bytes());
        ihdr.extend_from_slice(&height.to_be_bytes());
        ihdr.extend_from_slice(&[depth, color_type, 0, 0, 0]);
        bytes.extend_from_slice(&13u32.to_be_bytes());
        bytes.extend_from_slice(&ihdr);
        bytes.extend_from_slice(&crc32(&ihdr).to_be_bytes());
        // The start of the pixel data (a zlib header and nothing after it): the decoder
        // reads up to here before it knows the image.
        let idat = b"IDAT\x78\x9c";
        bytes.extend_from_slice(&2u32.to_be_bytes());
        bytes.extend_from_slice(idat);
        bytes.extend_from_slice(&crc32(idat).to_be_bytes());
        bytes
    }

    #[test]
    fn a_decompression_bomb_is_refused_before_decoding() {
        // Past the side limit.
        let bytes = png_header(100_000, 100_000, 2, 8);
        assert!(matches!(prepare(bytes, 1568), Err(ImageError::TooLarge(_))));
        // Within it, but 100 megapixels: 100 MB of grey, which a memory limit alone let
        // through to the decoder.
        let bytes = png_header(10_000, 10_000, 0, 8);
        let refused = inspect(&bytes).unwrap_err();
        assert!(
            matches!(&refused, ImageError::TooLarge(m) if m.contains("100 megapixels")),
            "{refused:?}"
        );
        assert_eq!(prepare(bytes, 1568).unwrap_err(), refused);
        // 40 megapixels pass the pixel budget, but not at 16 bits of RGBA (320 MB).
        let header = inspect(&png_header(8000, 5000, 2, 8)).unwrap();
        assert_eq!(header.decoded_bytes, 120_000_000);
        assert!(matches!(
            inspect(&png_header(8000, 5000, 6, 16)),
            Err(ImageError::TooLarge(m)) if m.contains("memory")
        ));
    }

    fn crc32(data: &[u8]) -> u32 {
        let mut crc = 0xFFFF_FFFFu32;
        for &byte in data {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }
}
