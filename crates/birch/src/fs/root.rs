//! The per-subvolume half of the engine's state (`Root`, btrfs's
//! `btrfs_root`): the inode cache, the delayed items and the next inode
//! number of one fs tree; and `RootCtx`, one root borrowed beside the
//! fs-wide state, which per-root operations take (docs/SNAPSHOTS.md, "The
//! engine split").

use super::delayed_items::DelayedItems;
use super::info::FsInfo;
use super::inode_cache::Inode;
use std::collections::HashMap;

/// One subvolume's state, behind the state lock (inside `FsState`). Its
/// tree's root is still `FsInfo::roots.fs` while there is only one.
pub(crate) struct Root {
    pub(super) inodes: HashMap<u64, Inode>,
    pub(super) delayed: DelayedItems,
    pub(super) next_ino: u64,
}

impl Root {
    pub(super) fn new(next_ino: u64) -> Root {
        Root {
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
