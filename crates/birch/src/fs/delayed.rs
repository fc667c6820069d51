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

use super::delayed_items::DelayedDir;
use super::root::RootCtx;
use crate::device::BlockDevice;
use crate::error::Result;
use crate::format::{item_type, Key};

impl<D: BlockDevice> RootCtx<'_, D> {
    /// Writes every pending dir-index change and inode update into the fs
    /// tree.
    pub(crate) fn flush_delayed_items(&mut self) -> Result<()> {
        if self.root.delayed.is_empty() {
            return Ok(());
        }
        let count = self.root.delayed.len() as u64;
        let dirs = std::mem::take(&mut self.root.delayed.dirs);
        let inodes = std::mem::take(&mut self.root.delayed.inodes);
        self.root.delayed.dir_items = 0;
        let mut dirs: Vec<_> = dirs.into_iter().collect();
        dirs.sort_by_key(|(ino, _)| *ino);
        for (dir, batch) in dirs {
            self.write_dir_batch(dir, batch)?;
        }
        for ino in inodes {
            self.write_inode_item(ino)?;
        }
        self.fs.stats.delayed_item_flushes += 1;
        self.fs.stats.delayed_items_flushed += count;
        Ok(())
    }

    /// Writes one directory's pending dir-index changes, and its inode
    /// item if dirty, into the fs tree: what a directory's fsync did before
    /// seed 003 (`Ablation::flush_delayed_dir_on_log`). Counted as a
    /// delayed-item flush.
    pub(crate) fn flush_delayed_dir(&mut self, dir: u64) -> Result<()> {
        let batch = self.root.delayed.take_dir(dir);
        let dirty = self.root.delayed.take_inode(dir);
        let count = batch
            .as_ref()
            .map_or(0, |b| b.insertions.len() + b.deletions.len())
            + usize::from(dirty);
        if let Some(batch) = batch {
            self.write_dir_batch(dir, batch)?;
        }
        if dirty {
            self.write_inode_item(dir)?;
        }
        if count > 0 {
            self.fs.stats.delayed_item_flushes += 1;
            self.fs.stats.delayed_items_flushed += count as u64;
        }
        Ok(())
    }

    /// Writes one inode's delayed item into the fs tree if it is dirty:
    /// what a full-sync fsync did before seed 001
    /// (`Ablation::flush_delayed_inode_on_full_log`). Counted as a
    /// delayed-item flush.
    pub(crate) fn flush_delayed_inode(&mut self, ino: u64) -> Result<()> {
        if self.root.delayed.take_inode(ino) {
            self.write_inode_item(ino)?;
            self.fs.stats.delayed_item_flushes += 1;
            self.fs.stats.delayed_items_flushed += 1;
        }
        Ok(())
    }

    fn write_dir_batch(&mut self, dir: u64, batch: DelayedDir) -> Result<()> {
        for index in batch.deletions {
            let key = Key::new(dir, item_type::DIR_INDEX, index);
            if self.fs.forest.delete(&mut self.root.tree, &key)?.is_none() {
                return Err(crate::Error::corrupt(crate::Corruption::general(format!(
                    "delayed deletion of {key}: no such item in the fs tree"
                ))));
            }
        }
        for (index, entry) in batch.insertions {
            self.fs.forest.insert(
                &mut self.root.tree,
                Key::new(dir, item_type::DIR_INDEX, index),
                entry.encode(),
            )?;
        }
        Ok(())
    }

    fn write_inode_item(&mut self, ino: u64) -> Result<()> {
        let item = self
            .root
            .inodes
            .get(&ino)
            .unwrap_or_else(|| panic!("dirty inode {ino} is not cached"))
            .item
            .encode();
        self.fs.forest.put(
            &mut self.root.tree,
            Key::new(ino, item_type::INODE_ITEM, 0),
            item,
        )?;
        Ok(())
    }
}
