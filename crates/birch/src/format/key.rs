use super::bytes::{put_u64, Reader, ShortRead};
use std::fmt;

/// Every item in every tree is addressed by `(objectid, type, offset)`,
/// ordered field by field.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Key {
    pub objectid: u64,
    pub item_type: u8,
    pub offset: u64,
}

/// Item type codes (btrfs's numbering, so dumps read alike).
pub mod item_type {
    pub const INODE_ITEM: u8 = 1;
    pub const INODE_REF: u8 = 12;
    /// A name that did not fit its parent's INODE_REF item (thousands of
    /// hard links in one directory), keyed by `extref_hash(parent, name)`.
    pub const INODE_EXTREF: u8 = 13;
    pub const XATTR_ITEM: u8 = 24;
    pub const ORPHAN_ITEM: u8 = 48;
    pub const DIR_LOG_INDEX: u8 = 72;
    /// Log trees only: this inode's extents in the log are complete.
    pub const LOG_FULL_EXTENTS: u8 = 75;
    /// Log trees only: this committed inode lost every name (replay
    /// removes its names and so deletes it).
    pub const LOG_UNLINKED: u8 = 76;
    pub const DIR_ITEM: u8 = 84;
    pub const DIR_INDEX: u8 = 96;
    pub const EXTENT_DATA: u8 = 108;
    /// Checksum tree (and log trees): crc32c of each 4 KiB block of a run
    /// of data starting at the key offset (docs/DATA-CHECKSUMS.md).
    pub const EXTENT_CSUM: u8 = 128;
    pub const ROOT_ITEM: u8 = 132;
    pub const EXTENT_ITEM: u8 = 168;
    pub const METADATA_ITEM: u8 = 169;
}

pub fn item_type_name(t: u8) -> &'static str {
    use item_type::*;
    match t {
        INODE_ITEM => "INODE_ITEM",
        INODE_REF => "INODE_REF",
        INODE_EXTREF => "INODE_EXTREF",
        XATTR_ITEM => "XATTR_ITEM",
        ORPHAN_ITEM => "ORPHAN_ITEM",
        DIR_LOG_INDEX => "DIR_LOG_INDEX",
        LOG_FULL_EXTENTS => "LOG_FULL_EXTENTS",
        LOG_UNLINKED => "LOG_UNLINKED",
        DIR_ITEM => "DIR_ITEM",
        DIR_INDEX => "DIR_INDEX",
        EXTENT_DATA => "EXTENT_DATA",
        EXTENT_CSUM => "EXTENT_CSUM",
        ROOT_ITEM => "ROOT_ITEM",
        EXTENT_ITEM => "EXTENT_ITEM",
        METADATA_ITEM => "METADATA_ITEM",
        _ => "UNKNOWN",
    }
}

impl Key {
    pub const ENCODED_SIZE: usize = 17;
    pub const MIN: Key = Key {
        objectid: 0,
        item_type: 0,
        offset: 0,
    };
    pub const MAX: Key = Key {
        objectid: u64::MAX,
        item_type: u8::MAX,
        offset: u64::MAX,
    };

    pub const fn new(objectid: u64, item_type: u8, offset: u64) -> Key {
        Key {
            objectid,
            item_type,
            offset,
        }
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        put_u64(out, self.objectid);
        out.push(self.item_type);
        put_u64(out, self.offset);
    }

    pub(crate) fn decode(r: &mut Reader) -> Result<Key, ShortRead> {
        Ok(Key {
            objectid: r.u64()?,
            item_type: r.u8()?,
            offset: r.u64()?,
        })
    }

    /// The smallest key greater than this one.
    pub fn successor(&self) -> Option<Key> {
        if self.offset < u64::MAX {
            Some(Key {
                offset: self.offset + 1,
                ..*self
            })
        } else if self.item_type < u8::MAX {
            Some(Key {
                item_type: self.item_type + 1,
                offset: 0,
                ..*self
            })
        } else if self.objectid < u64::MAX {
            Some(Key {
                objectid: self.objectid + 1,
                item_type: 0,
                offset: 0,
            })
        } else {
            None
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "({} {} {})",
            self.objectid,
            item_type_name(self.item_type),
            self.offset
        )
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
