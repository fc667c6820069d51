//! The state the state lock guards: the fs-wide `FsInfo` and the loaded
//! subvolume roots (docs/SNAPSHOTS.md, "The engine split").

use super::info::FsInfo;
use super::root::{next_free_ino, Root, RootCtx, SubvolRecord};
use crate::btree::TreeRoot;
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::format::tree_id;
use crate::format::{item_type, Key, SubvolRootItem};
use std::collections::BTreeMap;

/// Everything the running transaction knows, behind the state lock.
/// Operations that span roots (commit, replay, writeback over the dirty
/// queue) are its methods; the rest take an `FsInfo` or a `RootCtx`.
pub(crate) struct FsState<D> {
    pub(super) info: FsInfo<D>,
    pub(super) subvols: Subvols,
}

/// The loaded subvolume roots, by id. The top-level subvolume (id 5) is
/// always loaded and is a field of its own, so that code that only knows
/// it (replay, the orphan pass) can borrow its parts beside the fs-wide
/// state's; the others are loaded on first use (`FsState::ctx`) and stay
/// loaded until unmount.
pub(crate) struct Subvols {
    pub(super) top: Root,
    pub(super) others: BTreeMap<u64, Root>,
    /// Deleted subvolumes the cleaner has yet to drop, front first
    /// (docs/SNAPSHOTS.md (d)); never in `others`.
    pub(super) dead: BTreeMap<u64, DeadRoot>,
}

/// A deleted subvolume (refs 0, an orphan-root item): its tree, which no
/// longer changes but for the cleaner's drop, and its root item, whose
/// `drop_progress` says how far the drop got. The seal writes the item
/// like a live root's until the cleaner deletes it.
pub(crate) struct DeadRoot {
    pub(super) tree: TreeRoot,
    pub(super) item: SubvolRootItem,
}

impl Subvols {
    pub(super) fn get_mut(&mut self, id: u64) -> Option<&mut Root> {
        if id == tree_id::FS {
            Some(&mut self.top)
        } else {
            self.others.get_mut(&id)
        }
    }

    /// Every loaded root, the top-level subvolume first.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Root> {
        std::iter::once(&self.top).chain(self.others.values())
    }

    /// Every loaded root, the top-level subvolume first.
    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = &mut Root> {
        std::iter::once(&mut self.top).chain(self.others.values_mut())
    }

    /// The loaded roots' fs trees and root items, which the seal records.
    pub(super) fn records(&self) -> Vec<SubvolRecord> {
        self.iter()
            .map(Root::record)
            .chain(self.dead.values().map(|d| SubvolRecord {
                tree: d.tree,
                item: Some(d.item),
            }))
            .collect()
    }
}

impl<D> FsState<D> {
    pub(super) fn new(info: FsInfo<D>, top: Root) -> FsState<D> {
        FsState {
            info,
            subvols: Subvols {
                top,
                others: BTreeMap::new(),
                dead: BTreeMap::new(),
            },
        }
    }

    /// Subvolume `id` beside the fs-wide state, its root read from the
    /// root tree on first use. NotFound: no such subvolume.
    pub(super) fn ctx(&mut self, id: u64) -> Result<RootCtx<'_, D>>
    where
        D: BlockDevice,
    {
        // The id comes from a request's inode number: the extent and
        // checksum trees have root items too, and must never load as one.
        // A deleted subvolume's tree is the cleaner's alone: nothing may
        // read or change it (its numbers are stale).
        if !tree_id::is_subvolume(id) || self.subvols.dead.contains_key(&id) {
            return Err(Error::NotFound);
        }
        if self.subvols.get_mut(id).is_none() {
            let key = Key::new(id, item_type::ROOT_ITEM, 0);
            let Some(data) = self.info.forest.get(&self.info.roots.root, &key)? else {
                return Err(Error::NotFound);
            };
            let record = SubvolRecord::decode(id, &data, self.info.superblock.subvolumes)?;
            if record.item.is_some_and(|i| i.refs == 0) {
                return Err(Error::NotFound);
            }
            let next_ino = next_free_ino(&self.info.forest, &record.tree)?;
            self.subvols
                .others
                .insert(id, Root::new(record.tree, record.item, next_ino));
        }
        let root = self.subvols.get_mut(id).ok_or(Error::NotFound)?;
        Ok(RootCtx {
            fs: &mut self.info,
            root,
        })
    }

    /// Subvolume `id` for a change: every operation that changes a
    /// subvolume resolves its root here, so a read-only subvolume refuses
    /// them all with EROFS (docs/SNAPSHOTS.md, (g)).
    pub(super) fn writable(&mut self, id: u64) -> Result<RootCtx<'_, D>>
    where
        D: BlockDevice,
    {
        let ctx = self.ctx(id)?;
        if ctx.root.is_readonly() {
            return Err(Error::ReadOnly);
        }
        Ok(ctx)
    }

    /// Runs `f` on every loaded root in turn (the commit's writeback,
    /// delayed-item flush and cache eviction).
    pub(super) fn for_each_root(
        &mut self,
        mut f: impl FnMut(RootCtx<'_, D>) -> Result<()>,
    ) -> Result<()> {
        for root in self.subvols.iter_mut() {
            f(RootCtx {
                fs: &mut self.info,
                root,
            })?;
        }
        Ok(())
    }

    /// The top-level subvolume beside the fs-wide state.
    pub(super) fn top(&mut self) -> RootCtx<'_, D> {
        RootCtx {
            fs: &mut self.info,
            root: &mut self.subvols.top,
        }
    }
}
