//! Stable fault ids: every fault and warning the check reports carries one,
//! `birch check` prints it (`[dir-index-missing] corrupt: ...`), and tests
//! and scripts match on it instead of on the text. Each id belongs to one
//! pass; docs/CHECK.md lists every id with one line on what it means.

use super::pass_id;
use std::fmt;

/// The table of fault ids, grouped by the pass that reports them: it
/// generates [`FaultId`], its printed form and its pass.
macro_rules! fault_ids {
    ($(
        $pass:path => {
            $($(#[doc = $doc:literal])* $variant:ident = $id:literal,)*
        }
    )*) => {
        /// What a fault is, independent of its text (see the module doc).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum FaultId {
            $($($(#[doc = $doc])* $variant,)*)*
        }

        impl FaultId {
            /// Every fault id, grouped by pass in pass order.
            pub const ALL: &'static [FaultId] = &[$($(FaultId::$variant,)*)*];

            /// The id as printed: `dir-index-missing`.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($(FaultId::$variant => $id,)*)*
                }
            }

            /// The id of the pass that reports this fault.
            pub const fn pass(self) -> &'static str {
                match self {
                    $($(FaultId::$variant => $pass,)*)*
                }
            }
        }
    };
}

fault_ids! {
    pass_id::SUPERBLOCK => {
        /// The device ends before this superblock copy.
        SuperblockPastDeviceEnd = "superblock-past-device-end",
        /// Reading the copy failed.
        SuperblockUnreadable = "superblock-unreadable",
        /// The copy has no birch magic.
        SuperblockMagic = "superblock-magic",
        /// The copy's checksum does not match.
        SuperblockChecksum = "superblock-checksum",
        /// The copy names another location than where it is.
        SuperblockLocation = "superblock-location",
        /// The copy asks for something this version does not support.
        SuperblockUnsupported = "superblock-unsupported",
        /// (Warning) the other copy belongs to another filesystem.
        SuperblockOtherFilesystem = "superblock-other-filesystem",
        /// (Warning) the other copy is of an older generation.
        SuperblockStale = "superblock-stale",
        /// (Warning) the other copy points at an older log.
        SuperblockOlderLog = "superblock-older-log",
        /// Two copies of one generation differ.
        SuperblockCopiesDiffer = "superblock-copies-differ",
        /// The filesystem is larger than the device.
        FilesystemPastDeviceEnd = "filesystem-past-device-end",
        /// total_bytes is not a sector multiple or too small.
        TotalBytesInvalid = "total-bytes-invalid",
        /// bytes_used exceeds total_bytes.
        BytesUsedExceedsTotal = "bytes-used-exceeds-total",
        /// (Warning) log fields set without a log root.
        LogFieldsWithoutLog = "log-fields-without-log",
        /// Backup-root slots out of order.
        BackupRootOrder = "backup-root-order",
        /// The current generation's backup-root slot disagrees with the superblock.
        BackupRootMismatch = "backup-root-mismatch",
    }
    pass_id::TREE_STRUCTURE => {
        /// A node pointer lies outside the device or is unaligned.
        NodeOutsideDevice = "node-outside-device",
        /// Reading a node failed.
        NodeUnreadable = "node-unreadable",
        /// A node's checksum does not match.
        NodeChecksum = "node-checksum",
        /// A block without the node magic.
        NodeMagic = "node-magic",
        /// A node's header names another block.
        NodeBytenr = "node-bytenr",
        /// A node of another filesystem.
        NodeFsid = "node-fsid",
        /// A node level above the deepest tree.
        NodeLevelInvalid = "node-level-invalid",
        /// A node's item count does not fit it.
        NodeItemCount = "node-item-count",
        /// A leaf item's data lies outside the node or overlaps another's.
        NodeItemBounds = "node-item-bounds",
        /// Keys within a node do not strictly increase.
        NodeKeyOrder = "node-key-order",
        /// A child pointer that is not node aligned.
        NodeChildPointer = "node-child-pointer",
        /// A node owned by another tree than the one reaching it.
        NodeOwner = "node-owner",
        /// A node of another level than its parent expects.
        NodeLevel = "node-level",
        /// A node of another generation than its parent expects (a lost or misdirected write).
        NodeGeneration = "node-generation",
        /// A node newer than the superblock.
        NodeGenerationNewer = "node-generation-newer",
        /// An empty node below the root.
        NodeEmpty = "node-empty",
        /// A node's first key differs from its parent's key for it.
        NodeFirstKey = "node-first-key",
        /// A node's last key is not below the parent's next key.
        NodeLastKey = "node-last-key",
        /// A block reached twice within one tree (a cycle or a shared child).
        NodeReachedTwice = "node-reached-twice",
        /// A block of one tree reached from another (only subvolume trees share nodes).
        NodeCrossTree = "node-cross-tree",
        /// A root node also reached as another tree's root or child (S4).
        RootNodeShared = "root-node-shared",
        /// Two nodes overlap.
        NodeOverlap = "node-overlap",
        /// The root tree lacks the root item of the extent or fs tree.
        RootItemMissing = "root-item-missing",
        /// A root item for the root tree or a log tree in the root tree.
        RootItemForbidden = "root-item-forbidden",
        /// A root item newer than the superblock.
        RootItemGenerationNewer = "root-item-generation-newer",
        /// (Warning) a root item for a tree this version does not know.
        UnknownTree = "unknown-tree",
        /// (Warning) the newest log's one-flush sync did not reach the disk whole (a crash before its flush); the log before it, which a mount replays, is checked.
        LogIncomplete = "log-incomplete",
        /// The newest log did not reach the disk whole and the log before it is damaged.
        LogUnusable = "log-unusable",
        /// (Warning) a copy of a node the last log sync wrote did not reach the disk; the other copy holds the node (a read-write mount rewrites it).
        LogNodeCopyIncomplete = "log-node-copy-incomplete",
        /// A log of a subvolume that does not exist.
        LogOfUnknownSubvolume = "log-of-unknown-subvolume",
    }
    pass_id::ITEMS => {
        /// A key type byte that names no item type.
        ItemTypeUnknown = "item-type-unknown",
        /// An item type the tree may not hold.
        ItemWrongTree = "item-wrong-tree",
        /// A payload that does not decode for its type.
        ItemUndecodable = "item-undecodable",
        /// An inode or root item whose key offset is not 0.
        ItemKeyOffset = "item-key-offset",
        /// A log root tree item other than `(LOG ROOT_ITEM subvolume)`.
        LogRootItemKey = "log-root-item-key",
        /// A root or metadata item level above the deepest tree.
        ItemLevelTooHigh = "item-level-too-high",
        /// An fs item objectid below the first inode number.
        ObjectidReserved = "objectid-reserved",
        /// An fs-tree objectid at or above 2^40, where external inode numbers put the subvolume id (S7).
        InoOutOfRange = "ino-out-of-range",
        /// Something other than an orphan item under the orphan objectid.
        OrphanObjectidMisuse = "orphan-objectid-misuse",
        /// An orphan item under another objectid.
        OrphanItemMisplaced = "orphan-item-misplaced",
        /// An inode generation or transid newer than the superblock.
        InodeGenerationNewer = "inode-generation-newer",
        /// An inode with a flag bit birch never sets (chattr flags other than `SiadAD`).
        InodeFlagsUnknown = "inode-flags-unknown",
        /// An extent item generation newer than the superblock.
        ExtentGenerationNewer = "extent-generation-newer",
    }
    pass_id::EXTENT_REFS => {
        /// Under DUP, a node in the mirror half.
        NodeInMirrorHalf = "node-in-mirror-half",
        /// An extent of length 0.
        ExtentEmpty = "extent-empty",
        /// An extent not sector aligned.
        ExtentUnaligned = "extent-unaligned",
        /// An extent outside the allocatable range.
        ExtentOutOfRange = "extent-out-of-range",
        /// Two extents overlap.
        ExtentOverlap = "extent-overlap",
        /// bytes_used differs from what the extent items cover.
        BytesUsedMismatch = "bytes-used-mismatch",
        /// A tree node without a metadata item.
        NodeWithoutMetadataItem = "node-without-metadata-item",
        /// A metadata item's level differs from its node's.
        MetadataLevel = "metadata-level",
        /// A metadata item's owner differs from its node's tree.
        MetadataOwner = "metadata-owner",
        /// A metadata item's refs differ from the pointers to its node from distinct parent nodes and root items (S1).
        MetadataRefs = "metadata-refs",
        /// A shared node (more than one pointer) newer than the last snapshot of a subvolume reaching it (S3).
        SharedNodeAfterLastSnapshot = "shared-node-after-last-snapshot",
        /// A metadata item for a node of a tree the extent tree does not track.
        MetadataUntrackedTree = "metadata-untracked-tree",
        /// A metadata item no tree reaches.
        MetadataLeaked = "metadata-leaked",
        /// A file extent into space with no extent item.
        FileExtentWithoutExtentItem = "file-extent-without-extent-item",
        /// A file extent and its extent item disagree on the length.
        FileExtentLength = "file-extent-length",
        /// A data extent no file extent points to.
        DataExtentLeaked = "data-extent-leaked",
        /// A data extent's refs differ from the file extents pointing to it.
        DataExtentRefs = "data-extent-refs",
        /// (Warning) a data extent's owner is not among the inodes referencing it.
        DataExtentOwner = "data-extent-owner",
        /// A log tree node (or its mirror) overlaps an extent.
        LogNodeOverlap = "log-node-overlap",
        /// A log tree node (or its mirror) outside the allocatable range.
        LogNodeOutOfRange = "log-node-out-of-range",
    }
    pass_id::NAMESPACE => {
        /// The root directory inode is missing.
        RootDirMissing = "root-dir-missing",
        /// The root directory is not a directory.
        RootDirNotDirectory = "root-dir-not-directory",
        /// The root directory has no INODE_REF.
        RootDirWithoutRef = "root-dir-without-ref",
        /// The root directory has a name other than index 0 `..` in itself.
        RootDirName = "root-dir-name",
        /// An INODE_EXTREF name whose hash is not the key offset.
        ExtrefHash = "extref-hash",
        /// A DIR_ITEM name whose hash is not the key offset.
        DirItemHash = "dir-item-hash",
        /// An XATTR_ITEM name whose hash is not the key offset.
        XattrHash = "xattr-hash",
        /// One DIR_ITEM holds a name twice.
        DirItemNameTwice = "dir-item-name-twice",
        /// A name in more than one DIR_ITEM.
        DirItemTwice = "dir-item-twice",
        /// One XATTR_ITEM holds a name twice.
        XattrNameTwice = "xattr-name-twice",
        /// A `system.posix_acl_access` or `system.posix_acl_default` value
        /// that is not a valid ACL in the kernel's xattr format.
        AclMalformed = "acl-malformed",
        /// A DIR_INDEX below the first index 2, or at u64::MAX (no listing
        /// position follows it).
        DirIndexReserved = "dir-index-reserved",
        /// An inode lists one name twice.
        NameTwice = "name-twice",
        /// An inode named inside itself.
        NameInItself = "name-in-itself",
        /// A name whose parent is not a directory.
        ParentNotDirectory = "parent-not-directory",
        /// A name whose parent does not exist.
        ParentMissing = "parent-missing",
        /// An INODE_REF name without its DIR_ITEM.
        DirItemMissing = "dir-item-missing",
        /// A DIR_ITEM naming another inode than the one holding the name.
        DirItemWrongInode = "dir-item-wrong-inode",
        /// A DIR_ITEM whose file type differs from the inode's.
        DirItemWrongType = "dir-item-wrong-type",
        /// An INODE_REF name without its DIR_INDEX.
        DirIndexMissing = "dir-index-missing",
        /// A DIR_INDEX naming another name or inode than the INODE_REF.
        DirIndexWrongName = "dir-index-wrong-name",
        /// A DIR_INDEX whose file type differs from the inode's.
        DirIndexWrongType = "dir-index-wrong-type",
        /// A DIR_ITEM without the INODE_REF naming it back.
        DirItemWithoutRef = "dir-item-without-ref",
        /// A DIR_ITEM naming an inode that does not exist.
        DirItemDangling = "dir-item-dangling",
        /// A DIR_INDEX whose index differs from the INODE_REF's.
        DirIndexWrongIndex = "dir-index-wrong-index",
        /// A DIR_INDEX without the INODE_REF naming it back.
        DirIndexWithoutRef = "dir-index-without-ref",
        /// A DIR_INDEX naming an inode that does not exist.
        DirIndexDangling = "dir-index-dangling",
        /// A directory size other than the sum of its names' lengths.
        DirSize = "dir-size",
        /// An inode not reachable from the root directory.
        InodeUnreachable = "inode-unreachable",
        /// Items of an objectid without an INODE_ITEM.
        ItemsWithoutInode = "items-without-inode",
        /// An orphan item for an inode that does not exist.
        OrphanDangling = "orphan-dangling",
    }
    pass_id::NLINK => {
        /// A directory with more than one name.
        DirNames = "dir-names",
        /// A directory nlink other than 2 + subdirectories.
        DirNlink = "dir-nlink",
        /// An nlink other than the number of names.
        Nlink = "nlink",
        /// An inode with nlink 0 and no orphan item.
        UnlinkedWithoutOrphan = "unlinked-without-orphan",
    }
    pass_id::FILE_EXTENTS => {
        /// nbytes differs from what the file extents hold.
        Nbytes = "nbytes",
        /// A compressed file extent on an image without INCOMPAT_COMPRESSION.
        CompressedWithoutFeature = "compressed-without-feature",
        /// A symlink without its inline extent.
        SymlinkWithoutExtent = "symlink-without-extent",
        /// A symlink target length other than the inode size.
        SymlinkTargetSize = "symlink-target-size",
        /// A symlink target longer than the limit.
        SymlinkTargetTooLong = "symlink-target-too-long",
        /// A symlink extent that is not inline at offset 0.
        SymlinkExtentNotInline = "symlink-extent-not-inline",
        /// A symlink with more than one extent.
        SymlinkExtraExtent = "symlink-extra-extent",
        /// File extents on a directory or special file.
        ExtentsOnNonFile = "extents-on-non-file",
        /// An inline extent not at offset 0.
        InlineOffset = "inline-offset",
        /// An inline extent next to other extents.
        InlineNotAlone = "inline-not-alone",
        /// An inline extent longer than the limit.
        InlineTooLong = "inline-too-long",
        /// An inline extent longer than the file.
        InlinePastEof = "inline-past-eof",
        /// A non-inline extent at an unaligned file offset.
        FileOffsetUnaligned = "file-offset-unaligned",
        /// A regular extent past the end of the file.
        RegularPastEof = "regular-past-eof",
        /// Two file extents overlap.
        FileExtentOverlap = "file-extent-overlap",
        /// A file extent's end overflows.
        FileExtentOverflow = "file-extent-overflow",
    }
    pass_id::DATA_CSUMS => {
        /// An EXTENT_CSUM item under another objectid than EXTENT_CSUM_OBJECTID.
        CsumKey = "csum-key",
        /// A checksum item whose start is not sector aligned.
        CsumUnaligned = "csum-unaligned",
        /// A checksum tree on an image without the data checksums flag.
        CsumTreeWithoutFlag = "csum-tree-without-flag",
        /// A log checksum item on an image without the data checksums flag.
        CsumLogWithoutFlag = "csum-log-without-flag",
        /// The data checksums flag without a checksum tree.
        CsumTreeMissing = "csum-tree-missing",
        /// Checksums that do not lie within one data extent.
        CsumOutsideExtent = "csum-outside-extent",
        /// A block of a data extent in use without a checksum.
        CsumMissing = "csum-missing",
        /// Two checksum items overlap.
        CsumOverlap = "csum-overlap",
    }
    pass_id::SUBVOLUMES => {
        /// A subvolume item (root item of 256.., long root item, root ref, orphan root, default, link) on an image without INCOMPAT_SUBVOLUMES.
        SubvolWithoutFlag = "subvol-without-flag",
        /// A subvolume's root item is the short form although the image has INCOMPAT_SUBVOLUMES (S8).
        RootItemShort = "root-item-short",
        /// A long root item's fields disagree (transids, generations, zero uuid, refs of tree 5, drop progress of a live root) or a long item for a tree that is no subvolume (S8).
        RootItemFields = "root-item-fields",
        /// Two subvolumes have one uuid (S8).
        UuidTwice = "uuid-twice",
        /// A root ref, orphan root, link or default names an id that is no subvolume id (S8).
        SubvolIdOutOfRange = "subvol-id-out-of-range",
        /// A live subvolume or a ROOT_BACKREF without its ROOT_REF (S5).
        RootRefMissing = "root-ref-missing",
        /// A ROOT_REF without its ROOT_BACKREF (S5).
        RootBackrefMissing = "root-backref-missing",
        /// A ROOT_REF and its ROOT_BACKREF disagree, or a subvolume has more than one link (S5).
        RootRefMismatch = "root-ref-mismatch",
        /// A root reference whose parent or child has no root item or is dead (S5, S6).
        RootRefDangling = "root-ref-dangling",
        /// A root reference pair whose parent directory lacks the link DIR_ITEM or DIR_INDEX (S5).
        SubvolLinkMissing = "subvol-link-missing",
        /// A link entry that is not the link of a live subvolume's pair (S5).
        SubvolLinkDangling = "subvol-link-dangling",
        /// A subvolume that is its own ancestor through links (S5).
        SubvolLinkCycle = "subvol-link-cycle",
        /// A dead subvolume (refs 0) without its orphan-root item (S6).
        DeadRootWithoutOrphan = "dead-root-without-orphan",
        /// An orphan-root item for a live subvolume (S6).
        OrphanRootLive = "orphan-root-live",
        /// An orphan-root item for a subvolume that has no root item (S6).
        OrphanRootDangling = "orphan-root-dangling",
        /// The default-subvolume item names no live subvolume (S9).
        DefaultSubvolDangling = "default-subvol-dangling",
        /// A root-tree DIR_ITEM other than one `default` entry at the default-subvolume key.
        DefaultSubvolMalformed = "default-subvol-malformed",
        /// A log tree holds a subvolume link (S10).
        LogSubvolumeLink = "log-subvolume-link",
    }
    pass_id::DATA => {
        /// A data extent that could not be read: empty, unaligned, past the device's end, or a read error.
        DataUnreadable = "data-unreadable",
        /// A data extent with blocks that do not match their checksums.
        DataCsumMismatch = "data-csum-mismatch",
        /// A compressed extent its codec refuses, or whose recorded lengths are outside the format's limits.
        CompressedUndecodable = "compressed-undecodable",
        /// A compressed extent that decompresses to another length than its items record.
        CompressedLength = "compressed-length",
    }
}

impl fmt::Display for FaultId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn ids_are_unique_and_belong_to_a_pass() {
        let mut seen = HashSet::new();
        for id in FaultId::ALL {
            assert!(seen.insert(id.as_str()), "{id} twice");
            assert!(
                super::super::PASSES.iter().any(|p| p.id == id.pass()),
                "{id}: pass {}",
                id.pass()
            );
        }
    }

    #[test]
    fn every_id_is_documented() {
        let doc = include_str!("../../../../docs/CHECK.md");
        for id in FaultId::ALL {
            assert!(
                doc.contains(&format!("| `{id}` |")),
                "docs/CHECK.md has no row for {id}"
            );
        }
    }
}
