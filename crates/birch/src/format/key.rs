use super::bytes::{put_u64, Reader, ShortRead};
use super::NODE_SIZE;
use std::fmt;

/// Every item in every tree is addressed by `(objectid, type, offset)`,
/// ordered field by field.
///
/// The type stays a byte here: the B-tree orders and searches keys of any
/// byte (range ends use 0 and 255), and keys are built from the
/// [`item_type`] constants. Code that acts on what an item *is* takes the
/// typed view, [`ItemType::of`], and matches on it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Key {
    pub objectid: u64,
    pub item_type: u8,
    pub offset: u64,
}

/// The kinds of tree, as far as what their leaves may hold goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TreeKind {
    /// The root tree: the ROOT_ITEMs of the other trees.
    Root,
    Extent,
    /// A subvolume's tree (the fs tree).
    Fs,
    /// The log root tree: one ROOT_ITEM per log tree.
    LogRoot,
    /// A log tree: a subvolume's items, plus replay instructions.
    Log,
    /// The checksum tree: the crc32c of every data block
    /// (docs/DATA-CHECKSUMS.md).
    Csum,
}

/// The table of item types: one row per type gives its variant, its code
/// on disk (btrfs's numbering, so dumps read alike), the name dumps and
/// keys print, and the trees that may hold it. It generates [`ItemType`],
/// the [`item_type`] constants keys are built from, and the lookups below.
///
/// Adding a type is one row here; every operation on types then fails to
/// compile until it handles the new one: [`super::Item::decode`] (decode
/// and validate the payload), `print::item_body` (print) and the checker's
/// `collect_item` (check), all matches without a default arm.
macro_rules! item_types {
    ($(
        $(#[doc = $doc:literal])*
        $variant:ident = $code:literal, $constant:ident, in [$($home:ident),+];
    )*) => {
        /// What an item is, decoded from its key's type byte (see
        /// [`ItemType::of`]).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[repr(u8)]
        pub enum ItemType {
            $($(#[doc = $doc])* $variant = $code,)*
        }

        /// Item type codes, for building keys (`Key::new(ino,
        /// item_type::INODE_ITEM, 0)`).
        pub mod item_type {
            $($(#[doc = $doc])* pub const $constant: u8 = $code;)*
        }

        impl ItemType {
            /// Every item type, in key order.
            pub const ALL: &'static [ItemType] = &[$(ItemType::$variant),*];

            /// The type a key byte names, if any.
            pub const fn from_code(code: u8) -> Option<ItemType> {
                match code {
                    $($code => Some(ItemType::$variant),)*
                    _ => None,
                }
            }

            /// `INODE_ITEM`, as dumps and keys print it.
            pub const fn name(self) -> &'static str {
                match self {
                    $(ItemType::$variant => stringify!($constant),)*
                }
            }

            /// The trees that may hold items of this type.
            pub const fn homes(self) -> &'static [TreeKind] {
                match self {
                    $(ItemType::$variant => &[$(TreeKind::$home),+],)*
                }
            }
        }
    };
}

item_types! {
    InodeItem = 1, INODE_ITEM, in [Fs, Log];
    InodeRef = 12, INODE_REF, in [Fs, Log];
    /// A name that did not fit its parent's INODE_REF item (thousands of
    /// hard links in one directory), keyed by `extref_hash(parent, name)`.
    InodeExtref = 13, INODE_EXTREF, in [Fs, Log];
    XattrItem = 24, XATTR_ITEM, in [Fs, Log];
    /// Under objectid `ORPHAN_OBJECTID`: in an fs tree, an inode with no
    /// names left (offset: the inode); in the root tree, a dead subvolume
    /// the cleaner must drop (offset: its id, [`crate::format::Key::orphan_root`]).
    OrphanItem = 48, ORPHAN_ITEM, in [Fs, Root];
    /// Log trees only: this entry of the directory was removed.
    DirLogIndex = 72, DIR_LOG_INDEX, in [Log];
    /// Log trees only: this inode's extents in the log are complete.
    LogFullExtents = 75, LOG_FULL_EXTENTS, in [Log];
    /// Log trees only: this committed inode lost every name (replay
    /// removes its names and so deletes it).
    LogUnlinked = 76, LOG_UNLINKED, in [Log];
    /// Not in log trees: a logged directory's entries are its DIR_INDEX
    /// items (replay adds each name whole). In the root tree only the
    /// default-subvolume item ([`crate::format::Key::default_subvol`]).
    DirItem = 84, DIR_ITEM, in [Fs, Root];
    DirIndex = 96, DIR_INDEX, in [Fs, Log];
    ExtentData = 108, EXTENT_DATA, in [Fs, Log];
    /// The crc32c of each 4 KiB block of a run of data starting at the
    /// key offset (docs/DATA-CHECKSUMS.md); a log tree carries those of
    /// the extents it logs.
    ExtentCsum = 128, EXTENT_CSUM, in [Csum, Log];
    RootItem = 132, ROOT_ITEM, in [Root, LogRoot];
    /// `(child, ROOT_BACKREF, parent)`: subvolume `child` is linked in a
    /// directory of `parent` ([`crate::format::Key::root_backref`]; payload a `RootRef`).
    RootBackref = 144, ROOT_BACKREF, in [Root];
    /// `(parent, ROOT_REF, child)`: the forward half of the pair
    /// ([`crate::format::Key::root_ref`]; the same `RootRef` payload).
    RootRef = 156, ROOT_REF, in [Root];
    ExtentItem = 168, EXTENT_ITEM, in [Extent];
    MetadataItem = 169, METADATA_ITEM, in [Extent];
}

/// A key whose type byte names no item type: on disk, corruption (the
/// caller names where the key was).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownItemType(pub u8);

impl fmt::Display for UnknownItemType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown item type {}", self.0)
    }
}

impl ItemType {
    /// The typed view of `key`'s type byte.
    pub const fn of(key: &Key) -> Result<ItemType, UnknownItemType> {
        match ItemType::from_code(key.item_type) {
            Some(t) => Ok(t),
            None => Err(UnknownItemType(key.item_type)),
        }
    }

    pub const fn code(self) -> u8 {
        self as u8
    }

    /// Whether a tree of `kind` may hold items of this type.
    pub fn may_live_in(self, kind: TreeKind) -> bool {
        self.homes().contains(&kind)
    }

    /// For an extent tree item, the bytes it accounts for, from its key
    /// alone: a data extent's length is the key offset, a tree node's is
    /// [`NODE_SIZE`]. None for every other type.
    pub fn extent_len(self, key: &Key) -> Option<u64> {
        match self {
            ItemType::ExtentItem => Some(key.offset),
            ItemType::MetadataItem => Some(NODE_SIZE as u64),
            ItemType::InodeItem
            | ItemType::InodeRef
            | ItemType::InodeExtref
            | ItemType::XattrItem
            | ItemType::OrphanItem
            | ItemType::DirLogIndex
            | ItemType::LogFullExtents
            | ItemType::LogUnlinked
            | ItemType::DirItem
            | ItemType::DirIndex
            | ItemType::ExtentData
            | ItemType::ExtentCsum
            | ItemType::RootItem
            | ItemType::RootBackref
            | ItemType::RootRef => None,
        }
    }
}

/// The name of a type byte (`UNKNOWN` for a byte that names none).
pub fn item_type_name(t: u8) -> &'static str {
    ItemType::from_code(t).map_or("UNKNOWN", ItemType::name)
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

    /// `(parent, ROOT_REF, child)` in the root tree: `parent`'s side of
    /// the link of subvolume `child` (docs/SNAPSHOTS.md (a)).
    pub const fn root_ref(parent: u64, child: u64) -> Key {
        Key::new(parent, item_type::ROOT_REF, child)
    }

    /// `(child, ROOT_BACKREF, parent)` in the root tree: `child`'s side of
    /// its link.
    pub const fn root_backref(child: u64, parent: u64) -> Key {
        Key::new(child, item_type::ROOT_BACKREF, parent)
    }

    /// `(ORPHAN_OBJECTID, ORPHAN_ITEM, id)` in the root tree: subvolume
    /// `id` is dead (root item refs 0) and waits for the cleaner.
    pub const fn orphan_root(id: u64) -> Key {
        Key::new(super::ORPHAN_OBJECTID, item_type::ORPHAN_ITEM, id)
    }

    /// `(DEFAULT_SUBVOL_OBJECTID, DIR_ITEM, name_hash("default"))` in the
    /// root tree: one dir entry naming the default subvolume (absent: 5).
    pub fn default_subvol() -> Key {
        Key::new(
            super::DEFAULT_SUBVOL_OBJECTID,
            item_type::DIR_ITEM,
            super::name_hash(super::DEFAULT_SUBVOL_NAME),
        )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_decodes_to_its_type_and_back() {
        let mut known = 0;
        for code in 0..=u8::MAX {
            let key = Key::new(1, code, 0);
            match ItemType::of(&key) {
                Ok(t) => {
                    known += 1;
                    assert_eq!(t.code(), code);
                    assert_eq!(item_type_name(code), t.name());
                    assert!(!t.homes().is_empty(), "{}", t.name());
                }
                Err(e) => {
                    assert_eq!(e, UnknownItemType(code));
                    assert_eq!(item_type_name(code), "UNKNOWN");
                }
            }
        }
        assert_eq!(known, ItemType::ALL.len());
        assert!(ItemType::ALL.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(ItemType::InodeItem.code(), item_type::INODE_ITEM);
        assert_eq!(ItemType::MetadataItem.name(), "METADATA_ITEM");
        assert!(ItemType::DirLogIndex.may_live_in(TreeKind::Log));
        assert!(!ItemType::DirLogIndex.may_live_in(TreeKind::Fs));
        assert!(ItemType::RootRef.may_live_in(TreeKind::Root));
        assert!(!ItemType::RootBackref.may_live_in(TreeKind::Fs));
    }

    #[test]
    fn subvolume_keys_have_btrfs_shapes() {
        assert_eq!(Key::root_ref(5, 256), Key::new(5, 156, 256));
        assert_eq!(Key::root_backref(256, 5), Key::new(256, 144, 5));
        assert_eq!(
            Key::orphan_root(257),
            Key::new(crate::format::ORPHAN_OBJECTID, 48, 257)
        );
        let d = Key::default_subvol();
        assert_eq!((d.objectid, d.item_type), (6, 84));
        assert_eq!(d.offset, crate::format::name_hash(b"default"));
        assert_eq!(ItemType::of(&Key::root_ref(5, 256)), Ok(ItemType::RootRef));
    }
}
