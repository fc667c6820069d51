//! Data checksum items (docs/DATA-CHECKSUMS.md): key
//! `(EXTENT_CSUM_OBJECTID, EXTENT_CSUM, bytenr)`, payload one crc32c (u32
//! little-endian) per SECTOR_SIZE block of `[bytenr, bytenr + n × 4096)`.

use super::{item_type, Key, EXTENT_CSUM_OBJECTID, SECTOR_SIZE};

/// Bytes of one block's checksum.
pub const CSUM_SIZE: usize = 4;
/// Most blocks one item covers (4 MiB of data, a 4 KiB item): an extent's
/// items start at its bytenr and every `CSUMS_PER_ITEM` blocks after.
pub const CSUMS_PER_ITEM: u64 = 1024;

/// Key of the checksum item whose run starts at `bytenr`.
pub fn csum_key(bytenr: u64) -> Key {
    Key::new(EXTENT_CSUM_OBJECTID, item_type::EXTENT_CSUM, bytenr)
}

/// The checksum of one data block.
pub fn block_csum(block: &[u8]) -> u32 {
    crc32c::crc32c(block)
}

/// The payload of a checksum item for `data` (a whole number of blocks).
pub fn encode_csums(data: &[u8]) -> Vec<u8> {
    debug_assert!((data.len() as u64).is_multiple_of(SECTOR_SIZE));
    data.chunks(SECTOR_SIZE as usize)
        .flat_map(|block| block_csum(block).to_le_bytes())
        .collect()
}

/// Bytes of data a checksum item of `payload_len` bytes covers.
pub fn csum_item_span(payload_len: usize) -> u64 {
    (payload_len / CSUM_SIZE) as u64 * SECTOR_SIZE
}
