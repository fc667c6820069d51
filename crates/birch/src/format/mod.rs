//! The on-disk format: byte layouts of the superblock, nodes, keys and items.
//!
//! This module knows bytes, not behaviour: every structure here has an
//! `encode` and a `decode` that validates what it reads and names what is
//! wrong. docs/FORMAT.md draws each layout.

mod acl;
mod bytes;
pub mod compression;
mod csum;
mod items;
mod key;
pub mod node;
pub mod send_stream;
mod superblock;

pub use acl::{
    Acl, AclEntry, ACL_ACCESS_XATTR, ACL_DEFAULT_XATTR, ACL_GROUP, ACL_GROUP_OBJ, ACL_MASK,
    ACL_OTHER, ACL_USER, ACL_USER_OBJ,
};
pub use compression::{
    verify_decompression, Compression, CompressionProperty, DecompressFault,
    COMPRESSION_PROPERTY_XATTR, MAX_COMPRESSED_RAM,
};
pub use csum::*;
pub use items::*;
pub use key::{item_type, item_type_name, ItemType, Key, TreeKind, UnknownItemType};
pub use node::{KeyPtr, LeafItem, Node, NodeBody, NodeError};
pub use superblock::{
    BackupRoot, LogManifest, LogRootRef, MetadataProfile, Superblock, SuperblockError,
    BACKUP_ROOTS_OFFSET, BACKUP_ROOT_COUNT, BACKUP_ROOT_SIZE, INCOMPAT_COMPRESSION,
    INCOMPAT_DATA_CSUMS, INCOMPAT_LOG_MANIFEST, INCOMPAT_METADATA_DUP, INCOMPAT_SUBVOLUMES,
    MAX_LOG_MANIFEST_NODES,
};

/// Allocation unit for data and metadata.
pub const SECTOR_SIZE: u64 = 4096;
/// Size of every B-tree node (btrfs's default nodesize).
pub const NODE_SIZE: usize = 16384;
/// Byte offsets of the superblock copies.
pub const SUPERBLOCK_OFFSETS: [u64; 2] = [64 * 1024, 256 * 1024];
pub const SUPERBLOCK_SIZE: usize = 4096;
/// Nothing below this offset is ever allocated (room for the superblocks).
pub const FIRST_ALLOCATABLE_BYTE: u64 = 1024 * 1024;
/// Smallest device mkfs accepts.
pub const MIN_DEVICE_BYTES: u64 = 16 * 1024 * 1024;

/// "BIRCHFS1", little-endian.
pub const SUPERBLOCK_MAGIC: u64 = u64::from_le_bytes(*b"BIRCHFS1");
/// "BNOD", little-endian.
pub const NODE_MAGIC: u32 = u32::from_le_bytes(*b"BNOD");

/// Tree ids (the `owner` of a node, and the objectid of its root item).
pub mod tree_id {
    pub const ROOT: u64 = 1;
    pub const EXTENT: u64 = 2;
    /// The top-level subvolume (the only one on an image without
    /// `INCOMPAT_SUBVOLUMES`).
    pub const FS: u64 = 5;
    /// Data checksums (docs/DATA-CHECKSUMS.md); only on images with
    /// `INCOMPAT_DATA_CSUMS`.
    pub const CSUM: u64 = 7;
    /// Owner of every log tree node; the log root tree names each log tree
    /// by the subvolume it logs.
    pub const LOG: u64 = u64::MAX - 6;
    pub const LOG_ROOT: u64 = u64::MAX - 7;
    /// Subvolumes other than 5 have ids `FIRST_SUBVOL..=LAST_SUBVOL`
    /// (docs/SNAPSHOTS.md (a)): the external inode number keeps the id in
    /// the 24 bits above an inode's 40.
    pub const FIRST_SUBVOL: u64 = 256;
    pub const LAST_SUBVOL: u64 = (1 << 24) - 1;

    /// Whether `id` names a subvolume tree: 5 or `FIRST_SUBVOL..=LAST_SUBVOL`.
    pub const fn is_subvolume(id: u64) -> bool {
        id == FS || (id >= FIRST_SUBVOL && id <= LAST_SUBVOL)
    }

    /// Whether a node owned by `owner` may be reached from tree `tree`:
    /// its own, or any subvolume's from a subvolume (a shared node keeps
    /// the owner that allocated it, docs/SNAPSHOTS.md (b)).
    pub fn may_reach(tree: u64, owner: u64) -> bool {
        owner == tree || (is_subvolume(tree) && is_subvolume(owner))
    }
}

/// The name of a tree id as reports print it: `fs(5)`, `extent(2)`.
pub fn tree_name(id: u64) -> String {
    let name = match id {
        tree_id::ROOT => "root",
        tree_id::EXTENT => "extent",
        tree_id::FS => "fs",
        tree_id::CSUM => "csum",
        tree_id::LOG => "log",
        tree_id::LOG_ROOT => "log-root",
        tree_id::FIRST_SUBVOL..=tree_id::LAST_SUBVOL => "subvol",
        _ => return id.to_string(),
    };
    format!("{name}({id})")
}

/// Parses a tree name as [`tree_name`] prints it (`fs`, `fs(5)`, `5`,
/// `log-root`), for command lines.
pub fn parse_tree_name(s: &str) -> Option<u64> {
    let s = s.trim();
    let base = s.split('(').next().unwrap_or(s);
    let id = match base.to_ascii_lowercase().as_str() {
        "root" => tree_id::ROOT,
        "extent" => tree_id::EXTENT,
        "fs" => tree_id::FS,
        "csum" => tree_id::CSUM,
        "log" => tree_id::LOG,
        "log-root" | "log_root" | "logroot" => tree_id::LOG_ROOT,
        "subvol" => {
            let id: u64 = s.strip_prefix("subvol(")?.strip_suffix(')')?.parse().ok()?;
            return (tree_id::FIRST_SUBVOL..=tree_id::LAST_SUBVOL)
                .contains(&id)
                .then_some(id);
        }
        other => other.parse().ok()?,
    };
    if let Some(rest) = s.strip_prefix(base) {
        if !rest.is_empty() && rest != format!("({id})") {
            return None;
        }
    }
    Some(id)
}

/// Objectid of the orphan items (inodes with no names left, still open).
pub const ORPHAN_OBJECTID: u64 = u64::MAX - 5;
/// Objectid of the default-subvolume item in the root tree
/// ([`Key::default_subvol`], btrfs's BTRFS_ROOT_TREE_DIR_OBJECTID).
pub const DEFAULT_SUBVOL_OBJECTID: u64 = 6;
/// The name of the default-subvolume item's one entry.
pub const DEFAULT_SUBVOL_NAME: &[u8] = b"default";
/// Inode numbers inside a subvolume tree are below this (the external
/// inode number puts the subvolume id above them, docs/SNAPSHOTS.md (a)).
pub const MAX_SUBVOL_INO: u64 = 1 << 40;
/// Objectid of the checksum items (btrfs's EXTENT_CSUM_OBJECTID).
pub const EXTENT_CSUM_OBJECTID: u64 = u64::MAX - 9;
/// Inode number of a subvolume's root directory.
pub const ROOT_DIR_INO: u64 = 256;
/// First inode number handed out to a new file.
pub const FIRST_FREE_INO: u64 = 257;
/// First dir index a directory hands out (0 and 1 are "." and "..").
pub const FIRST_DIR_INDEX: u64 = 2;

/// Longest file name (bytes), as on every Linux filesystem.
pub const NAME_MAX: usize = 255;
/// Largest file data stored inline in the tree instead of in an extent
/// (for a compressed inline extent: its compressed bytes).
pub const MAX_INLINE_DATA: usize = 2048;
/// Largest file a compressed inline extent holds (what its bytes
/// decompress to): one sector, as btrfs's `can_cow_file_range_inline`
/// (docs/COMPRESSION.md, "Compressed inline extents").
pub const MAX_INLINE_RAM: u64 = SECTOR_SIZE;
/// Longest symlink target (PATH_MAX - 1); stored as an inline extent.
pub const SYMLINK_MAX: usize = 4095;
/// Largest file size (as btrfs: offsets must fit an i64). An inode item
/// claiming more is refused at decode.
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;
/// Where the last file extent may end: the end of the block that holds
/// the largest file's last byte (2^63). Extents cover whole blocks, so a
/// file of `MAX_FILE_SIZE` bytes has one ending one byte past its size.
pub const MAX_FILE_EXTENT_END: u64 = MAX_FILE_SIZE.next_multiple_of(SECTOR_SIZE);
/// Largest data extent writeback allocates.
pub const MAX_EXTENT_BYTES: u64 = 128 * 1024 * 1024;

/// crc32c of a name, used as the offset of dir items and xattr items.
pub fn name_hash(name: &[u8]) -> u64 {
    u64::from(crc32c::crc32c(name))
}

/// Offset of the INODE_EXTREF item holding the name `name` in `parent`:
/// the parent in the high half, so one parent's names sort together, and
/// the name's crc32c in the low half.
pub fn extref_hash(parent: u64, name: &[u8]) -> u64 {
    (u64::from(crc32c::crc32c(&parent.to_le_bytes())) << 32) | name_hash(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_names_round_trip() {
        for id in [
            tree_id::ROOT,
            tree_id::EXTENT,
            tree_id::FS,
            tree_id::CSUM,
            tree_id::LOG,
            tree_id::LOG_ROOT,
            77,
            256,
            tree_id::LAST_SUBVOL,
        ] {
            assert_eq!(parse_tree_name(&tree_name(id)), Some(id));
        }
        assert_eq!(tree_name(257), "subvol(257)");
        assert_eq!(tree_name(1 << 24), (1u64 << 24).to_string());
        assert_eq!(parse_tree_name("subvol(5)"), None);
        assert_eq!(parse_tree_name("subvol"), None);
        assert!(tree_id::is_subvolume(5) && tree_id::is_subvolume(256));
        assert!(!tree_id::is_subvolume(7) && !tree_id::is_subvolume(1 << 24));
        assert_eq!(parse_tree_name("fs"), Some(5));
        assert_eq!(parse_tree_name("fs(2)"), None);
        assert_eq!(parse_tree_name("nope"), None);
    }
}
