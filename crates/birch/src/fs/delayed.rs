//! Delayed items and the delayed inode.
//!
//! Directory-index insertions and deletions, and inode attribute updates,
//! are kept in memory per inode and written into the fs tree in one pass:
//! at commit, or by the background worker when too many accumulate. Lookup
//! (through DIR_ITEM, written at once) and readdir (which merges these
//! batches over the tree's DIR_INDEX items) see them before they are
//! flushed. The batches stay addressable per directory so that the
//! tree-log can log a directory straight from them without flushing
//! (seed 003).

use super::delayed_items::PendingBatch;
use super::root::RootCtx;
use crate::btree::Change;
use crate::device::BlockDevice;
use crate::error::Result;
use crate::format::{item_type, Key};

impl<D: BlockDevice> RootCtx<'_, D> {
    /// Writes every pending dir-index change and inode update into the fs
    /// tree.
    pub(crate) fn flush_delayed_items(&mut self) -> Result<()> {
        self.flush_delayed_batch(usize::MAX).map(|_| ())
    }

    /// Writes up to `limit` pending items into the fs tree (see
    /// [`DelayedItems::take_batch`](super::delayed_items::DelayedItems::take_batch)
    /// for which); returns how many it wrote. The background worker
    /// flushes in such batches, releasing the state lock between them.
    pub(crate) fn flush_delayed_batch(&mut self, limit: usize) -> Result<usize> {
        let batch = self.root.delayed.take_batch(limit);
        self.write_counted(batch)
    }

    /// Writes one directory's pending dir-index changes, and its inode
    /// item if dirty, into the fs tree: what a directory's fsync did before
    /// seed 003 (`Ablation::flush_delayed_dir_on_log`). Counted as a
    /// delayed-item flush.
    pub(crate) fn flush_delayed_dir(&mut self, dir: u64) -> Result<()> {
        let batch = PendingBatch {
            dirs: self
                .root
                .delayed
                .take_dir(dir)
                .map(|d| (dir, d))
                .into_iter()
                .collect(),
            inodes: self
                .root
                .delayed
                .take_inode(dir)
                .then_some(dir)
                .into_iter()
                .collect(),
        };
        self.write_counted(batch).map(|_| ())
    }

    /// Writes one inode's delayed item into the fs tree if it is dirty:
    /// what a full-sync fsync did before seed 001
    /// (`Ablation::flush_delayed_inode_on_full_log`). Counted as a
    /// delayed-item flush.
    pub(crate) fn flush_delayed_inode(&mut self, ino: u64) -> Result<()> {
        let batch = PendingBatch {
            dirs: Vec::new(),
            inodes: self
                .root
                .delayed
                .take_inode(ino)
                .then_some(ino)
                .into_iter()
                .collect(),
        };
        self.write_counted(batch).map(|_| ())
    }

    /// Writes `batch` into the fs tree and counts it as one delayed-item
    /// flush (if it holds anything); returns its items.
    fn write_counted(&mut self, batch: PendingBatch) -> Result<usize> {
        let count = batch.len();
        if count > 0 {
            self.write_pending(batch)?;
            self.fs.stats.delayed_item_flushes += 1;
            self.fs.stats.delayed_items_flushed += count as u64;
        }
        Ok(count)
    }

    /// Applies pending items to the fs tree as one sorted batch
    /// ([`Forest::apply_sorted`](crate::btree::Forest::apply_sorted)):
    /// each leaf they fall in is copied and merged once, not searched and
    /// shifted once per item (10,000 new files' items, flushed one by one,
    /// held the state lock for tens of milliseconds; docs/FUSE.md, "The
    /// directory fsync's tail").
    fn write_pending(&mut self, batch: PendingBatch) -> Result<()> {
        let mut changes: Vec<(Key, Change)> = Vec::with_capacity(batch.len());
        for (dir, d) in batch.dirs {
            for index in d.deletions {
                changes.push((Key::new(dir, item_type::DIR_INDEX, index), Change::Delete));
            }
            for (index, entry) in d.insertions {
                changes.push((
                    Key::new(dir, item_type::DIR_INDEX, index),
                    Change::Insert(entry.encode()),
                ));
            }
        }
        for ino in batch.inodes {
            let item = self
                .root
                .inodes
                .get(&ino)
                .unwrap_or_else(|| panic!("dirty inode {ino} is not cached"))
                .item
                .encode();
            changes.push((Key::new(ino, item_type::INODE_ITEM, 0), Change::Put(item)));
        }
        // A directory's deletions and insertions are apart in the list
        // (and an index is never both: indexes are not reused).
        changes.sort_by_key(|(key, _)| *key);
        let refused = self.fs.forest.apply_sorted(&mut self.root.tree, changes)?;
        match refused.first() {
            None => Ok(()),
            Some(key) => Err(crate::Error::corrupt(crate::Corruption::general(format!(
                "delayed change of {key} does not fit the fs tree ({} such): a deletion \
                 of an item it lacks, or an insertion of one it has",
                refused.len()
            )))),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::device::{BlockDevice, MemoryDevice};
    use crate::fs::{mkfs, Filesystem, MkfsOptions, MountOptions, RenameFlags};
    use std::sync::Arc;

    /// `dir`'s whole listing: (name, inode, position).
    fn listing<D: BlockDevice>(fs: &Filesystem<D>, dir: u64) -> Vec<(Vec<u8>, u64, u64)> {
        let mut all = Vec::new();
        let mut offset = 0;
        loop {
            let page = fs.readdir(dir, offset, 64).unwrap();
            let Some(last) = page.last() else {
                return all;
            };
            offset = last.next_offset;
            all.extend(page.into_iter().map(|e| (e.name, e.ino, e.next_offset)));
        }
    }

    /// The background worker writes delayed items into the tree a batch
    /// per state-lock hold (`Shared::flush_delayed_in_batches`), so a
    /// directory's changes can be half in the tree and half pending
    /// between two holds: deletions of committed entries, insertions,
    /// inode updates. Whatever the cut, the directory lists the same
    /// entries at the same positions, its next entry takes the next
    /// index, and the commit after the last batch holds what a whole
    /// flush writes.
    #[test]
    fn flush_in_batches_keeps_every_entry() {
        let dev = Arc::new(MemoryDevice::new(32 << 20));
        mkfs(dev.as_ref(), &MkfsOptions::default()).unwrap();
        let fs = Filesystem::open(dev.clone(), MountOptions::deterministic()).unwrap();
        let root = fs.root_ino();
        let dir = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
        let name = |prefix: &str, i: u32| format!("{prefix}{i}").into_bytes();
        for i in 0..300 {
            fs.create(dir, &name("c", i), 0o644, 0, 0).unwrap();
        }
        fs.sync().unwrap();
        for i in 0..150 {
            let (from, to) = (name("c", i), name("r", i));
            fs.rename(dir, &from, dir, &to, RenameFlags::default())
                .unwrap();
        }
        for i in 150..200 {
            fs.unlink(dir, &name("c", i)).unwrap();
        }
        for i in 0..200 {
            fs.create(dir, &name("n", i), 0o644, 0, 0).unwrap();
        }
        let expected = listing(&fs, dir);
        assert_eq!(expected.len(), 450);
        let pending = fs.lock().delayed_items();
        let mut batches = 0;
        loop {
            let written = fs.lock().top().flush_delayed_batch(37).unwrap();
            if written == 0 {
                break;
            }
            assert!(written <= 37, "a batch of {written} items");
            batches += 1;
            assert_eq!(listing(&fs, dir), expected, "after {batches} batches");
        }
        assert_eq!(fs.lock().delayed_items(), 0);
        assert_eq!(batches, pending.div_ceil(37), "{pending} items");
        let last = fs.create(dir, b"last", 0o644, 0, 0).unwrap().ino;
        let mut expected = expected;
        let after = listing(&fs, dir);
        assert_eq!(after.len(), expected.len() + 1);
        let (last_name, last_ino, last_position) = after.last().unwrap().clone();
        assert_eq!((last_name.as_slice(), last_ino), (&b"last"[..], last));
        assert!(last_position > expected.last().unwrap().2);
        expected.push((last_name, last_ino, last_position));
        fs.sync().unwrap();
        let committed = Arc::new(MemoryDevice::from_bytes(dev.snapshot()));
        drop(fs);
        let fs = Filesystem::open(committed, MountOptions::deterministic()).unwrap();
        let dir = fs.lookup(fs.root_ino(), b"d").unwrap().ino;
        assert_eq!(listing(&fs, dir), expected);
    }
}
