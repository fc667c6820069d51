//! The codecs of compressed file extents (docs/COMPRESSION.md): zstd and
//! lz4 (block format), through maintained crates. This module turns bytes
//! into bytes; which data is compressed, and when, is the engine's.

use super::{MAX_INLINE_DATA, MAX_INLINE_RAM, SECTOR_SIZE};
use std::fmt;

/// Most file bytes one compressed extent holds (as btrfs): a read of one
/// block decompresses at most this much.
pub const MAX_COMPRESSED_RAM: u64 = 128 * 1024;

/// Highest zstd level the `compress=zstd:LEVEL` option takes (btrfs's).
pub const MAX_ZSTD_LEVEL: i32 = 15;
/// The zstd level without `:LEVEL` (btrfs's default).
pub const DEFAULT_ZSTD_LEVEL: i32 = 3;

/// A compressed extent's algorithm, as its item records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compression {
    /// zstd, one frame.
    Zstd,
    /// lz4 block format (no frame).
    Lz4,
}

impl Compression {
    /// The byte the item stores.
    pub fn to_byte(self) -> u8 {
        match self {
            Compression::Zstd => 1,
            Compression::Lz4 => 2,
        }
    }

    pub fn from_byte(byte: u8) -> Option<Compression> {
        match byte {
            1 => Some(Compression::Zstd),
            2 => Some(Compression::Lz4),
            _ => None,
        }
    }

    /// The name the mount option, the property and `birch dump` use.
    pub fn name(self) -> &'static str {
        match self {
            Compression::Zstd => "zstd",
            Compression::Lz4 => "lz4",
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The xattr that holds a file's or directory's compression property
/// (`birch property set PATH compression ...`, `setfattr -n
/// btrfs.compression`), btrfs's name (docs/COMPRESSION.md, "The
/// property").
pub const COMPRESSION_PROPERTY_XATTR: &[u8] = b"btrfs.compression";

/// A value of the compression property, as btrfs's
/// `prop_compression_validate` reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompressionProperty {
    /// `zstd` or `lz4`: compress with it, whatever `compress=` says.
    Algorithm(Compression),
    /// `none` or `no`: never compress (the NOCOMP inode flag), unless
    /// `compress-force`.
    Never,
}

impl CompressionProperty {
    /// Parses a non-empty property value; the error names what birch
    /// takes. btrfs's `lzo` and `zlib` are refused: birch has neither codec
    /// (lz4 is its fast one), and silently storing another algorithm
    /// than the one named would make `property get` lie.
    pub fn parse(value: &[u8]) -> Result<CompressionProperty, &'static str> {
        match value {
            b"zstd" => Ok(CompressionProperty::Algorithm(Compression::Zstd)),
            b"lz4" => Ok(CompressionProperty::Algorithm(Compression::Lz4)),
            b"none" | b"no" => Ok(CompressionProperty::Never),
            b"lzo" | b"zlib" => Err("compression property: birch compresses with zstd or lz4 (no lzo, no zlib)"),
            _ => Err("compression property: expected zstd, lz4, none or no (or an empty value to remove it)"),
        }
    }
}

/// Compresses `data` (at most [`MAX_COMPRESSED_RAM`] bytes, sector
/// aligned) with `algorithm` at `level` (zstd only). `None` when the
/// result does not save at least one sector: the data is then stored as
/// it is (btrfs's rule), and the caller counts the attempt.
pub fn compress(algorithm: Compression, level: i32, data: &[u8]) -> Option<Vec<u8>> {
    debug_assert!(data.len() as u64 <= MAX_COMPRESSED_RAM);
    let out = match algorithm {
        Compression::Zstd => zstd::bulk::compress(data, level).ok()?,
        Compression::Lz4 => lz4_flex::block::compress(data),
    };
    let on_disk = (out.len() as u64).next_multiple_of(SECTOR_SIZE);
    (!out.is_empty() && on_disk + SECTOR_SIZE <= data.len() as u64).then_some(out)
}

/// Compresses a small file's data (at most [`MAX_INLINE_RAM`] bytes, its
/// whole content) for a compressed inline extent: `Some` when the result
/// is smaller than the data and fits [`MAX_INLINE_DATA`] (btrfs's
/// `can_cow_file_range_inline` with a compressed size); otherwise the
/// file is stored as without compression.
pub fn compress_inline(algorithm: Compression, level: i32, data: &[u8]) -> Option<Vec<u8>> {
    debug_assert!(!data.is_empty() && data.len() as u64 <= MAX_INLINE_RAM);
    let out = match algorithm {
        Compression::Zstd => zstd::bulk::compress(data, level).ok()?,
        Compression::Lz4 => lz4_flex::block::compress(data),
    };
    (!out.is_empty() && out.len() < data.len() && out.len() <= MAX_INLINE_DATA).then_some(out)
}

/// Decompresses `src` (the compressed bytes, exactly) into `dst`, which
/// must come out exactly full. An error names what is wrong, for a
/// corruption report: the bytes come from the disk.
pub fn decompress(algorithm: Compression, src: &[u8], dst: &mut [u8]) -> Result<(), String> {
    let got = match algorithm {
        Compression::Zstd => zstd::bulk::Decompressor::new()
            .and_then(|mut d| d.decompress_to_buffer(src, dst))
            .map_err(|e| format!("zstd: {e}"))?,
        Compression::Lz4 => {
            lz4_flex::block::decompress_into(src, dst).map_err(|e| format!("lz4: {e}"))?
        }
    };
    if got != dst.len() {
        return Err(format!(
            "{algorithm} data decompresses to {got} bytes, not the recorded {}",
            dst.len()
        ));
    }
    Ok(())
}

/// Why a compressed extent's bytes do not give back its recorded data
/// ([`verify_decompression`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecompressFault {
    /// The recorded uncompressed length is above [`MAX_COMPRESSED_RAM`]:
    /// nothing was allocated or decompressed.
    OverLimit,
    /// The codec refused the bytes; its message.
    Codec(String),
    /// A valid stream of another length: the length it declares or gives,
    /// or `None` when it gives more than the recorded length.
    Length(Option<u64>),
}

impl fmt::Display for DecompressFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecompressFault::OverLimit => write!(
                f,
                "the recorded length is above the {MAX_COMPRESSED_RAM}-byte chunk limit"
            ),
            DecompressFault::Codec(e) => f.write_str(e),
            DecompressFault::Length(Some(n)) => write!(f, "the data decompresses to {n} bytes"),
            DecompressFault::Length(None) => f.write_str("the data decompresses to more bytes"),
        }
    }
}

/// Decompresses `src` (a compressed extent's `compressed_len` bytes) and
/// verifies it gives exactly `ram_bytes` bytes, telling a codec error from
/// a valid stream of another length (`birch check --verify-data`). The
/// lengths come from the disk: at most `MAX_COMPRESSED_RAM + 1` bytes are
/// allocated, whatever they say.
pub fn verify_decompression(
    algorithm: Compression,
    src: &[u8],
    ram_bytes: u64,
) -> Result<(), DecompressFault> {
    if ram_bytes > MAX_COMPRESSED_RAM {
        return Err(DecompressFault::OverLimit);
    }
    // One byte more than recorded: a longer stream shows as such.
    let mut dst = vec![0u8; ram_bytes as usize + 1];
    let got = match algorithm {
        Compression::Zstd => {
            // The frame's own header declares its length (bulk::compress
            // writes it): a different one is a length fault even when the
            // stream is longer than the buffer.
            if let Ok(Some(declared)) = zstd::zstd_safe::get_frame_content_size(src) {
                if declared != ram_bytes {
                    return Err(DecompressFault::Length(Some(declared)));
                }
            }
            zstd::bulk::Decompressor::new()
                .and_then(|mut d| d.decompress_to_buffer(src, &mut dst))
                .map_err(|e| DecompressFault::Codec(format!("zstd: {e}")))?
        }
        Compression::Lz4 => match lz4_flex::block::decompress_into(src, &mut dst) {
            Ok(got) => got,
            Err(lz4_flex::block::DecompressError::OutputTooSmall { .. }) => {
                return Err(DecompressFault::Length(None))
            }
            Err(e) => return Err(DecompressFault::Codec(format!("lz4: {e}"))),
        },
    };
    if got as u64 != ram_bytes {
        return Err(DecompressFault::Length(
            (got as u64 <= ram_bytes).then_some(got as u64),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_codecs_round_trip_and_refuse_what_does_not_shrink() {
        let text: Vec<u8> = b"birch compresses text well. "
            .iter()
            .cycle()
            .take(MAX_COMPRESSED_RAM as usize)
            .copied()
            .collect();
        let mut noise = vec![0u8; MAX_COMPRESSED_RAM as usize];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for b in noise.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        for algorithm in [Compression::Zstd, Compression::Lz4] {
            let packed = compress(algorithm, DEFAULT_ZSTD_LEVEL, &text).unwrap();
            assert!(packed.len() < text.len() / 4, "{algorithm}");
            let mut back = vec![0u8; text.len()];
            decompress(algorithm, &packed, &mut back).unwrap();
            assert_eq!(back, text);
            assert!(compress(algorithm, DEFAULT_ZSTD_LEVEL, &noise).is_none());
            // A recorded length that does not match, or damaged bytes, is
            // an error, never a panic.
            let mut short = vec![0u8; text.len() - 4096];
            assert!(decompress(algorithm, &packed, &mut short).is_err());
            let mut long = vec![0u8; text.len() + 4096];
            assert!(decompress(algorithm, &packed, &mut long).is_err());
            let mut damaged = packed.clone();
            for b in damaged.iter_mut().take(16) {
                *b ^= 0x5a;
            }
            let _ = decompress(algorithm, &damaged, &mut back);
            assert!(decompress(algorithm, &packed[..packed.len() / 2], &mut back).is_err());
        }
        assert_eq!(Compression::from_byte(3), None);
        assert_eq!(
            CompressionProperty::parse(b"lz4"),
            Ok(CompressionProperty::Algorithm(Compression::Lz4))
        );
        assert_eq!(
            CompressionProperty::parse(b"none"),
            Ok(CompressionProperty::Never)
        );
        for bad in [&b"lzo"[..], b"zlib", b"zstd:3", b"", b"ZSTD"] {
            assert!(CompressionProperty::parse(bad).is_err(), "{bad:?}");
        }
        for c in [Compression::Zstd, Compression::Lz4] {
            assert_eq!(Compression::from_byte(c.to_byte()), Some(c));
        }
    }

    #[test]
    fn inline_compression_keeps_only_what_shrinks_into_the_inline_limit() {
        let text: Vec<u8> = b"small text file. "
            .iter()
            .cycle()
            .take(4096)
            .copied()
            .collect();
        let mut noise = vec![0u8; 3000];
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for b in noise.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        for algorithm in [Compression::Zstd, Compression::Lz4] {
            for len in [100, 2048, 2049, 4096] {
                let packed = compress_inline(algorithm, DEFAULT_ZSTD_LEVEL, &text[..len])
                    .unwrap_or_else(|| panic!("{algorithm} {len}"));
                assert!(packed.len() < len && packed.len() <= MAX_INLINE_DATA);
                let mut back = vec![0u8; len];
                decompress(algorithm, &packed, &mut back).unwrap();
                assert_eq!(back, &text[..len]);
            }
            // Random bytes do not shrink; a few bytes grow (frame headers).
            assert_eq!(compress_inline(algorithm, DEFAULT_ZSTD_LEVEL, &noise), None);
            assert_eq!(
                compress_inline(algorithm, DEFAULT_ZSTD_LEVEL, b"tiny"),
                None
            );
        }
    }

    #[test]
    fn verify_decompression_tells_codec_errors_from_other_lengths() {
        let data: Vec<u8> = b"a chunk of text to compress. "
            .iter()
            .cycle()
            .take(64 << 10)
            .copied()
            .collect();
        for algorithm in [Compression::Zstd, Compression::Lz4] {
            let packed = compress(algorithm, DEFAULT_ZSTD_LEVEL, &data).unwrap();
            assert_eq!(verify_decompression(algorithm, &packed, 64 << 10), Ok(()));
            // Recorded longer than the data: the length it gives.
            assert_eq!(
                verify_decompression(algorithm, &packed, 128 << 10),
                Err(DecompressFault::Length(Some(64 << 10))),
                "{algorithm}"
            );
            // Recorded shorter: zstd's header says how long, lz4 only more.
            let shorter = verify_decompression(algorithm, &packed, 32 << 10);
            let expected = match algorithm {
                Compression::Zstd => DecompressFault::Length(Some(64 << 10)),
                Compression::Lz4 => DecompressFault::Length(None),
            };
            assert_eq!(shorter, Err(expected), "{algorithm}");
            assert!(matches!(
                verify_decompression(algorithm, &packed[..packed.len() / 2], 64 << 10),
                Err(DecompressFault::Codec(_) | DecompressFault::Length(_))
            ));
            assert_eq!(
                verify_decompression(algorithm, &packed, MAX_COMPRESSED_RAM + 1),
                Err(DecompressFault::OverLimit)
            );
        }
        // The other codec's stream.
        let zstd = compress(Compression::Zstd, DEFAULT_ZSTD_LEVEL, &data).unwrap();
        assert!(verify_decompression(Compression::Lz4, &zstd, 64 << 10).is_err());
    }
}
