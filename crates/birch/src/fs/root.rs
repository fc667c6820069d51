//! The per-subvolume half of the engine's state (`Root`, btrfs's
//! `btrfs_root`): the inode cache, the delayed items and the next inode
//! number of one fs tree; and `RootCtx`, one root borrowed beside the
//! fs-wide state, which per-root operations take (docs/SNAPSHOTS.md, "The
//! engine split").

use super::delayed_items::DelayedItems;
use super::info::FsInfo;
use super::inode_cache::Inode;
use crate::btree::{Forest, TreeRoot};
use crate::device::BlockDevice;
use crate::error::{Corruption, Error, Result};
use crate::format::{
    item_type, Key, RootItem, SubvolRootItem, FIRST_FREE_INO, ORPHAN_OBJECTID,
    SUBVOL_ROOT_ITEM_SIZE,
};
use std::collections::HashMap;

/// One subvolume's state, behind the state lock (inside `FsState`): its
/// fs tree's root (the seal records it in the root tree), and what the
/// running transaction holds for it.
pub(crate) struct Root {
    pub(super) tree: TreeRoot,
    /// The long root item's other fields (flags, uuids, times), on an
    /// image with subvolumes; `None`: tree 5 on an image without them,
    /// whose root item stays in the short form.
    pub(super) item: Option<SubvolRootItem>,
    pub(super) inodes: HashMap<u64, Inode>,
    pub(super) delayed: DelayedItems,
    pub(super) next_ino: u64,
}

impl Root {
    pub(super) fn new(tree: TreeRoot, item: Option<SubvolRootItem>, next_ino: u64) -> Root {
        Root {
            tree,
            item,
            inodes: HashMap::new(),
            delayed: DelayedItems::default(),
            next_ino,
        }
    }
}

/// One root and the fs-wide state, borrowed side by side: what an
/// operation on one subvolume may touch.
pub(crate) struct RootCtx<'a, D> {
    pub(super) fs: &'a mut FsInfo<D>,
    pub(super) root: &'a mut Root,
}

impl Root {
    /// The root item the seal writes for this root: the long form (with
    /// the tree's `last_snapshot`) once the image has subvolumes.
    pub(super) fn record(&self) -> SubvolRecord {
        SubvolRecord {
            tree: self.tree,
            item: self.item,
        }
    }

    pub(super) fn is_readonly(&self) -> bool {
        self.item.is_some_and(|i| i.is_readonly())
    }

    /// Deleted (refs 0, an orphan-root item) while inodes of it were held:
    /// loaded still, for those inodes (docs/SNAPSHOTS.md (d) step 3).
    pub(super) fn is_deleted(&self) -> bool {
        self.item.is_some_and(|i| i.refs == 0)
    }

    /// Whether a front end holds an inode of this root (an open handle, a
    /// lookup the kernel has not forgotten: `open_inode`).
    pub(super) fn is_held(&self) -> bool {
        self.inodes.values().any(|i| i.open_count > 0)
    }
}

/// A subvolume's fs tree and the rest of its long root item, for the seal.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SubvolRecord {
    pub tree: TreeRoot,
    pub item: Option<SubvolRootItem>,
}

impl SubvolRecord {
    pub(super) fn encode(&self) -> Vec<u8> {
        let short = RootItem {
            bytenr: self.tree.bytenr,
            generation: self.tree.generation,
            level: self.tree.level,
        };
        match self.item {
            None => short.encode(),
            Some(item) => SubvolRootItem {
                root: short,
                last_snapshot: self.tree.last_snapshot,
                ..item
            }
            .encode(),
        }
    }

    /// Reads subvolume `id`'s root item, in either form (the long form
    /// only where the image has subvolumes).
    pub(super) fn decode(id: u64, data: &[u8], subvolumes: bool) -> Result<SubvolRecord> {
        let key = Key::new(id, item_type::ROOT_ITEM, 0);
        let bad = |e: String| Error::corrupt(Corruption::general(format!("root item {key}: {e}")));
        let (short, item) = if data.len() == SUBVOL_ROOT_ITEM_SIZE && subvolumes {
            let long = SubvolRootItem::decode(data).map_err(|e| bad(e.to_string()))?;
            (long.root, Some(long))
        } else {
            (
                RootItem::decode(data).map_err(|e| bad(e.to_string()))?,
                None,
            )
        };
        Ok(SubvolRecord {
            tree: TreeRoot {
                id,
                bytenr: short.bytenr,
                level: short.level,
                generation: short.generation,
                last_snapshot: item.map_or(0, |i| i.last_snapshot),
            },
            item,
        })
    }
}

/// The inode number after the highest one a subvolume's tree uses (at
/// least `FIRST_FREE_INO`): each subvolume numbers its inodes itself.
pub(super) fn next_free_ino<D: BlockDevice>(forest: &Forest<D>, tree: &TreeRoot) -> Result<u64> {
    Ok(
        match forest.last_at_or_before(tree, &Key::new(ORPHAN_OBJECTID - 1, u8::MAX, u64::MAX))? {
            Some((k, _)) => (k.objectid + 1).max(FIRST_FREE_INO),
            None => FIRST_FREE_INO,
        },
    )
}
