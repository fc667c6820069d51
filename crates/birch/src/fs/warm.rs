//! Warm-ups: the lookups a change will make, walked before it with node
//! cache misses deferred, so that the misses are read without the state
//! lock and the change finds its nodes cached (docs/SNAPSHOTS.md (f) item
//! 3, "Changes' misses"). A change cannot be rerun after a miss (it may
//! have changed the trees already), but a warm-up can: it only looks
//! things up. Each operation names what it will touch here; nothing
//! depends on a warm-up being right or complete: a node it did not read,
//! or one evicted before the change runs, is read by the change under the
//! lock, as before, and counted (`node_reads_locked`).

use super::file::WritebackBatch;
use super::root::RootCtx;
use super::state::FsState;
use super::transaction::Shared;
use super::types::InoSpace;
use crate::alloc::TransactionSpace;
use crate::device::BlockDevice;
use crate::error::Result;
use crate::format::{
    csum_key, item_type, name_hash, DirEntry, FileType, Key, ACL_ACCESS_XATTR, ACL_DEFAULT_XATTR,
    ORPHAN_OBJECTID, SECTOR_SIZE,
};
use crate::lock_order::RankedGuard;
use std::ops::ControlFlow;

/// Runs of one warm-up that may end in misses before the change runs
/// anyway (and reads what it still misses under the lock). A warm-up
/// walks on past a miss to what does not depend on the missing node, so
/// a cold change misses about once per tree level of its longest chain
/// of dependent lookups (a name, then the inode it names, then that
/// inode's items: three paths); this bounds a warm-up whose nodes keep
/// being evicted before it runs again, as `READ_RERUNS` bounds a
/// read-only request.
const WARM_UP_RERUNS: u32 = 32;

/// Distinct misses one run of a warm-up notes, all read in one pass
/// without the lock.
const WARM_UP_BATCH: usize = 1024;

/// What a change will look up: a read-only walk over the state, run
/// with misses deferred. Its result is not looked at.
pub(super) type WarmUp<'a, D> = &'a dyn Fn(&mut FsState<D>) -> Result<()>;

impl<D: BlockDevice> Shared<D> {
    /// Locks the state for a change once `warm` runs under the lock without
    /// a node cache miss: a run's misses are read into the cache with the
    /// lock dropped (under a reader ticket, as a read-only request's: R3)
    /// and `warm` runs again. The change then runs in the returned hold.
    /// After [`WARM_UP_RERUNS`] runs that missed, the lock is returned as
    /// it is. A node that fails to read is returned with the lock as the
    /// error: it is the change's, as its own read under the lock would have
    /// met it (a read that fails once and then succeeds, say, must not
    /// pass unreported).
    pub(super) fn lock_warmed(
        &self,
        warm: WarmUp<'_, D>,
    ) -> (RankedGuard<'_, FsState<D>>, Result<()>) {
        let mut runs = 0;
        loop {
            let mut state = self.lock_state();
            let info = &state.info;
            if info.shut_down || info.failed.is_some() || info.options.read_only {
                // The change refuses at once: nothing to warm.
                return (state, Ok(()));
            }
            let (_, misses) =
                crate::btree::deferring_all_misses(WARM_UP_BATCH, || warm(&mut state));
            if misses.is_empty() {
                return (state, Ok(()));
            }
            if runs == WARM_UP_RERUNS {
                state.info.stats.warm_up_fallbacks += 1;
                return (state, Ok(()));
            }
            runs += 1;
            state.info.stats.warm_up_reruns += 1;
            // The nodes were in their trees just now: until the ticket
            // drops, a commit that frees one cannot hand its block to new
            // data.
            let reader = state.info.forest.alloc_mut().start_read();
            drop(state);
            let loaded = misses
                .into_iter()
                .try_for_each(|miss| self.store.load_missed(miss));
            drop(reader);
            if loaded.is_err() {
                return (self.lock_state(), loaded);
            }
        }
    }
}

/// A warm-up for a change that walks nothing (yet).
pub(super) fn nothing<D: BlockDevice>(_: &mut FsState<D>) -> Result<()> {
    Ok(())
}

// Each walk below goes on past a lookup that failed (a miss, or any
// error: the change reports errors in its own order) to the lookups that
// do not depend on it: `let _ =` marks those.
impl<D: BlockDevice> FsState<D> {
    /// A new inode named `name` in `parent` (create, mknod, mkdir, symlink).
    pub(super) fn warm_create(&mut self, parent: u64, name: &[u8]) -> Result<()> {
        let (mut root, dir) = self.resolve(parent)?;
        root.warm_new_name(dir, name, None);
        // What the new inode inherits: the default ACL, the property.
        let _ = root.getxattr(dir, ACL_DEFAULT_XATTR);
        root.compression_property(dir).map(|_| ())
    }

    /// A new name for `ino` (link).
    pub(super) fn warm_link(&mut self, ino: u64, new_parent: u64, new_name: &[u8]) -> Result<()> {
        InoSpace::same_subvolume(ino, new_parent)?;
        let (_, dir) = InoSpace::split(new_parent);
        let (mut root, ino) = self.resolve(ino)?;
        root.warm_new_name(dir, new_name, Some(ino));
        if root.inode(ino)?.item.nlink == 0 {
            // An O_TMPFILE file's first name drops its orphan item.
            root.warm_key(Key::new(ORPHAN_OBJECTID, item_type::ORPHAN_ITEM, ino))?;
        }
        Ok(())
    }

    /// `name` removed from `parent` (unlink, rmdir).
    pub(super) fn warm_remove(&mut self, parent: u64, name: &[u8]) -> Result<()> {
        let (mut root, dir) = self.resolve(parent)?;
        root.warm_removed_name(dir, name, true).map(|_| ())
    }

    /// A rename (any flags) within one subvolume: both names go, the
    /// source's and the target's inode take their new names; a directory
    /// moved elsewhere walks the new parent's ancestry.
    pub(super) fn warm_rename(
        &mut self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
    ) -> Result<()> {
        InoSpace::same_subvolume(parent, new_parent)?;
        let (_, new_dir) = InoSpace::split(new_parent);
        let (mut root, dir) = self.resolve(parent)?;
        // The source keeps its inode; a target replaced loses a link.
        let source = root.warm_removed_name(dir, name, false);
        let target = root.warm_removed_name(new_dir, new_name, true);
        if let Ok(Some(source)) = source.as_ref().map(|e| e.as_ref().filter(|e| !e.subvolume)) {
            root.warm_new_name(new_dir, new_name, Some(source.ino));
            if source.file_type == FileType::Directory && dir != new_dir {
                let _ = root.is_within(new_dir, source.ino);
            }
        }
        // An exchange gives the source's name to the target.
        if let Ok(Some(target)) = target.as_ref().map(|e| e.as_ref().filter(|e| !e.subvolume)) {
            root.warm_new_name(dir, name, Some(target.ino));
        }
        Ok(())
    }

    /// A setattr: the inode, its access ACL for a chmod, and for a
    /// truncate to `size` the extents it drops.
    pub(super) fn warm_setattr(&mut self, ino: u64, chmod: bool, size: Option<u64>) -> Result<()> {
        let (mut root, ino) = self.resolve(ino)?;
        let _ = root.inode(ino);
        if chmod {
            let _ = root.getxattr(ino, ACL_ACCESS_XATTR);
        }
        if let Some(size) = size {
            let start = size.div_ceil(SECTOR_SIZE) * SECTOR_SIZE;
            let _ = root.warm_key(Key::new(ino, item_type::EXTENT_DATA, start));
            root.extents_overlapping(ino, start, u64::MAX)?;
        }
        Ok(())
    }

    /// An xattr `name` of `ino` set or removed (ACLs and the compression
    /// property too: the same item).
    pub(super) fn warm_xattr(&mut self, ino: u64, name: &[u8]) -> Result<()> {
        let (mut root, ino) = self.resolve(ino)?;
        let _ = root.inode(ino);
        root.warm_key(Key::new(ino, item_type::XATTR_ITEM, name_hash(name)))
    }

    /// fsync's log of `ino`: its inode, names and xattrs, and the extents
    /// the log copies (all of them for a full log, else those of the
    /// ranges written since the last).
    pub(super) fn warm_fsync(&mut self, ino: u64) -> Result<()> {
        let (mut root, ino) = self.resolve(ino)?;
        let inode = root.inode(ino)?;
        let regular = inode.item.file_type() == FileType::Regular;
        let full = inode.log.full_sync;
        let ranges = inode.log.dirty_ranges.clone();
        let _ = root.warm_items(ino, item_type::XATTR_ITEM);
        if regular && full {
            root.warm_items(ino, u8::MAX)?;
        } else if regular {
            for (start, end) in ranges {
                let _ = root.extents_overlapping(ino, start, end);
            }
        }
        Ok(())
    }

    /// A writeback's publish (after its write, before it takes the lock
    /// to publish): each chunk's file extent item, the extents it
    /// replaces, and its checksums' place in the checksum tree.
    pub(super) fn warm_publish(&mut self, batch: &WritebackBatch) -> Result<()> {
        for queued in batch.inodes() {
            let Some(in_flight) = self.info.writebacks.get(queued) else {
                continue;
            };
            let chunks: Vec<(u64, u64, u64)> = in_flight
                .chunks
                .iter()
                .map(|c| (c.file_offset, c.bytes.len() as u64, c.bytenr))
                .collect();
            let Ok((mut root, ino)) = self.resolve(queued) else {
                continue;
            };
            for (file_offset, len, bytenr) in chunks {
                let _ = root.warm_key(Key::new(ino, item_type::EXTENT_DATA, file_offset));
                let _ = root.extents_overlapping(ino, file_offset, file_offset + len);
                if let Some(csum) = &root.fs.roots.csum {
                    let _ = root.fs.forest.warm_path(csum, &csum_key(bytenr));
                }
            }
        }
        Ok(())
    }

    /// The commit's seal (before it takes the lock to seal): its flush of
    /// delayed items, and the extent items of the extents whose counts
    /// changed.
    pub(super) fn warm_seal(&mut self) -> Result<()> {
        self.warm_delayed_items()?;
        let keys = self.info.forest.alloc().delayed_item_keys();
        self.info.forest.warm_sorted(&self.info.roots.extent, &keys);
        Ok(())
    }

    /// A flush of delayed items (the seal's, or the worker's when too
    /// many accumulate): the dir indexes and inode items it writes in
    /// every loaded root.
    pub(super) fn warm_delayed_items(&mut self) -> Result<()> {
        for root in self.subvols.iter() {
            let dirs = root.delayed.dirs.iter().flat_map(|(&dir, batch)| {
                let indexes = batch.deletions.iter().chain(batch.insertions.keys());
                indexes.map(move |&index| Key::new(dir, item_type::DIR_INDEX, index))
            });
            let inodes =
                (root.delayed.inodes.iter()).map(|&ino| Key::new(ino, item_type::INODE_ITEM, 0));
            let mut keys: Vec<Key> = dirs.chain(inodes).collect();
            keys.sort_unstable();
            self.info.forest.warm_sorted(&root.tree, &keys);
        }
        Ok(())
    }
}

impl<D: BlockDevice> RootCtx<'_, D> {
    /// The nodes a change of the item at `key` in this root's fs tree
    /// reads ([`crate::btree::Forest::warm_path`]).
    fn warm_key(&mut self, key: Key) -> Result<()> {
        self.fs.forest.warm_path(&self.root.tree, &key).map(|_| ())
    }

    /// Every item of `ino` of a type up to `last_type`: what deleting the
    /// inode, or logging it, reads.
    fn warm_items(&mut self, ino: u64, last_type: u8) -> Result<()> {
        let _ = self.warm_key(Key::new(ino, item_type::INODE_ITEM, 0));
        self.fs.forest.scan(
            &self.root.tree,
            Key::new(ino, 0, 0),
            Key::new(ino, last_type, u64::MAX),
            &mut |_, _| Ok(ControlFlow::Continue(())),
        )
    }

    /// A name `name` added to `dir` for `ino` (`None`: the inode a create
    /// makes next): the directory's inode and next dir index, the name's
    /// DIR_ITEM, the inode's INODE_REF.
    fn warm_new_name(&mut self, dir: u64, name: &[u8], ino: Option<u64>) {
        let _ = self.warm_key(Key::new(dir, item_type::DIR_ITEM, name_hash(name)));
        let _ = self.peek_dir_index(dir);
        let ino = ino.unwrap_or(self.root.next_ino);
        let _ = self.warm_key(Key::new(ino, item_type::INODE_REF, dir));
    }

    /// A name `name` removed from `dir`: the directory's inode, the name's
    /// DIR_ITEM, the inode it names and its INODE_REF; if the inode loses
    /// the link (`unlinks`: not a rename's source), a directory's entries
    /// (it must be empty) and for the last link its every item (deleted
    /// with it) or, open, its orphan item. Returns the entry.
    fn warm_removed_name(
        &mut self,
        dir: u64,
        name: &[u8],
        unlinks: bool,
    ) -> Result<Option<DirEntry>> {
        let _ = self.warm_key(Key::new(dir, item_type::DIR_ITEM, name_hash(name)));
        let Some(entry) = self.find_entry(dir, name)? else {
            return Ok(None);
        };
        if entry.subvolume {
            return Ok(Some(entry));
        }
        let _ = self.warm_key(Key::new(entry.ino, item_type::INODE_REF, dir));
        // Missed: the next run goes on from here.
        let Ok(inode) = self.inode(entry.ino) else {
            return Ok(Some(entry));
        };
        let (nlink, open) = (inode.item.nlink, inode.open_count > 0);
        if !unlinks {
            return Ok(Some(entry));
        }
        let is_dir = entry.file_type == FileType::Directory;
        if is_dir {
            let _ = self.is_dir_empty(entry.ino);
        }
        let last_link = is_dir || nlink <= 1;
        if last_link && open {
            self.warm_key(Key::new(ORPHAN_OBJECTID, item_type::ORPHAN_ITEM, entry.ino))?;
        } else if last_link {
            self.warm_items(entry.ino, u8::MAX)?;
        }
        Ok(Some(entry))
    }
}
