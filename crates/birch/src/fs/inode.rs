//! The in-memory inode cache. The cached `InodeItem` is the truth; the fs
//! tree's copy is updated by the delayed-inode flush.

use super::decode::decode_item;
use super::inode_cache::Inode;
use super::inode_cache::InodeLog;
use super::page_prefetch::ReadyPages;
use super::root::RootCtx;
use super::{Attr, SetAttr, SetTime};
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::format::{
    item_type, FileExtent, FileType, InodeItem, Key, Timespec, ORPHAN_OBJECTID, SECTOR_SIZE,
};
use std::collections::hash_map::Entry;
use std::collections::BTreeMap;
use std::ops::ControlFlow;

/// Clean inodes kept cached before eviction starts.
const INODE_CACHE_TARGET: usize = 64 * 1024;

impl<D: BlockDevice> RootCtx<'_, D> {
    /// The cached inode, loaded from the fs tree on first use. A cached
    /// inode costs one hash lookup: this runs several times per request,
    /// and a lookup followed by a second one to return it was 1-2 % of the
    /// daemon's CPU on dbench.
    pub(crate) fn inode(&mut self, ino: u64) -> Result<&mut Inode> {
        match self.root.inodes.entry(ino) {
            Entry::Occupied(cached) => Ok(cached.into_mut()),
            Entry::Vacant(slot) => {
                let key = Key::new(ino, item_type::INODE_ITEM, 0);
                let data = self
                    .fs
                    .forest
                    .get(&self.root.tree, &key)?
                    .ok_or(Error::NotFound)?;
                let item = decode_item(&key, InodeItem::decode(&data))?;
                Ok(slot.insert(Inode {
                    item,
                    open_count: 0,
                    next_index: None,
                    pages: BTreeMap::new(),
                    change_seq: 0,
                    // What was written back or logged before it was evicted
                    // is no longer known: its next log is a full one.
                    log: InodeLog {
                        full_sync: true,
                        ..Default::default()
                    },
                }))
            }
        }
    }

    pub(crate) fn inode_item(&mut self, ino: u64) -> Result<InodeItem> {
        Ok(self.inode(ino)?.item.clone())
    }

    /// Changes a cached inode and queues its item for the delayed flush.
    pub(crate) fn update_inode(&mut self, ino: u64, f: impl FnOnce(&mut InodeItem)) -> Result<()> {
        let transid = self.fs.forest.transid();
        let inode = self.inode(ino)?;
        f(&mut inode.item);
        inode.item.transid = transid;
        inode.change_seq += 1;
        self.root.delayed.inode_changed(ino);
        Ok(())
    }

    /// Registers a brand-new inode.
    pub(crate) fn add_new_inode(&mut self, item: InodeItem) -> u64 {
        let ino = self.root.next_ino;
        self.root.next_ino += 1;
        self.root.inodes.insert(
            ino,
            Inode {
                item,
                open_count: 0,
                next_index: None,
                pages: BTreeMap::new(),
                change_seq: 0,
                log: InodeLog::default(),
            },
        );
        self.root.delayed.inode_changed(ino);
        ino
    }

    pub(crate) fn new_inode_item(&self, mode: u32, uid: u32, gid: u32, rdev: u64) -> InodeItem {
        let now = Timespec::now();
        let transid = self.fs.forest.transid();
        InodeItem {
            generation: transid,
            transid,
            size: 0,
            nbytes: 0,
            nlink: if mode & libc::S_IFMT == libc::S_IFDIR {
                2
            } else {
                1
            },
            uid,
            gid,
            mode,
            rdev,
            flags: 0,
            atime: now,
            mtime: now,
            ctime: now,
            otime: now,
        }
    }

    pub(crate) fn getattr(&mut self, ino: u64) -> Result<Attr> {
        let inode = self.inode(ino)?;
        let dirty_bytes = inode.pages.len() as u64 * SECTOR_SIZE;
        let mut attr = Attr::from_item(ino, &inode.item, 0);
        // Count dirty data too, as other filesystems count delalloc, but
        // never more than the file could hold.
        attr.blocks = (inode.item.nbytes + dirty_bytes)
            .min(inode.item.size.div_ceil(SECTOR_SIZE) * SECTOR_SIZE)
            .max(inode.item.nbytes)
            .div_ceil(512);
        Ok(attr)
    }

    /// Changes the attributes `changes` sets; a truncate's partial last
    /// page comes from `ready` when it has it.
    pub(crate) fn setattr(
        &mut self,
        ino: u64,
        changes: &SetAttr,
        ready: &ReadyPages,
    ) -> Result<Attr> {
        let item = self.inode_item(ino)?;
        if let Some(size) = changes.size {
            match item.file_type() {
                FileType::Regular => self.truncate_file(ino, size, ready)?,
                FileType::Directory => return Err(Error::IsDir),
                _ => return Err(Error::InvalidArgument("size change of a non-regular file")),
            }
        }
        let now = Timespec::now();
        let resolve = |t: SetTime| match t {
            SetTime::Now => now,
            SetTime::At(t) => t,
        };
        self.update_inode(ino, |item| {
            if let Some(mode) = changes.mode {
                item.mode = (item.mode & libc::S_IFMT) | (mode & 0o7777);
            }
            if let Some(uid) = changes.uid {
                item.uid = uid;
            }
            if let Some(gid) = changes.gid {
                item.gid = gid;
            }
            if let Some(t) = changes.atime {
                item.atime = resolve(t);
            }
            if let Some(t) = changes.mtime {
                item.mtime = resolve(t);
            }
            item.ctime = changes.ctime.unwrap_or(now);
        })?;
        if let Some(mode) = changes.mode {
            self.chmod_acl(ino, mode)?;
        }
        self.getattr(ino)
    }

    pub(crate) fn open_inode(&mut self, ino: u64) -> Result<()> {
        self.inode(ino)?.open_count += 1;
        Ok(())
    }

    /// Drops an open handle; the last one of an unlinked inode destroys it.
    pub(crate) fn release_inode(&mut self, ino: u64) -> Result<()> {
        let inode = self.inode(ino)?;
        assert!(
            inode.open_count > 0,
            "release of inode {ino} that is not open"
        );
        inode.open_count -= 1;
        if inode.open_count == 0 && inode.item.nlink == 0 {
            if self.fs.failed.is_some() {
                // Read-only now: the orphan item makes the next mount finish it.
                return Ok(());
            }
            self.destroy_inode(ino)?;
            self.fs.forest.delete(
                &mut self.root.tree,
                &Key::new(ORPHAN_OBJECTID, item_type::ORPHAN_ITEM, ino),
            )?;
        }
        Ok(())
    }

    /// An inode lost its last name: free it now, or (if open) record it as
    /// an orphan so that a crash before the last close cannot leak it.
    pub(crate) fn inode_unlinked(&mut self, ino: u64) -> Result<()> {
        if self.inode(ino)?.open_count > 0 {
            self.fs.forest.put(
                &mut self.root.tree,
                Key::new(ORPHAN_OBJECTID, item_type::ORPHAN_ITEM, ino),
                Vec::new(),
            )?;
            Ok(())
        } else {
            self.destroy_inode(ino)
        }
    }

    /// Deletes every item of an inode with no names and drops its data.
    pub(crate) fn destroy_inode(&mut self, ino: u64) -> Result<()> {
        self.forget_logged_inode(ino)?;
        let keys = {
            let mut keys = Vec::new();
            self.fs.forest.scan(
                &self.root.tree,
                Key::new(ino, 0, 0),
                Key::new(ino, u8::MAX, u64::MAX),
                &mut |k, d| {
                    keys.push((*k, d.to_vec()));
                    Ok(ControlFlow::Continue(()))
                },
            )?;
            keys
        };
        for (key, data) in keys {
            if key.item_type == item_type::EXTENT_DATA {
                if let Some(disk) =
                    decode_item(&key, FileExtent::decode_at(&key, &data))?.disk_ref()
                {
                    self.drop_file_extent_ref(ino, disk)?;
                }
            }
            self.fs.forest.delete(&mut self.root.tree, &key)?;
        }
        // Its dirty pages go, and with them their reservations.
        self.discard_dirty_pages(ino)?;
        self.root.inodes.remove(&ino);
        self.root.delayed.forget_inode(ino);
        Ok(())
    }

    /// Finishes inodes left as orphans by a crash or an unclean stop.
    pub(crate) fn remove_orphans(&mut self) -> Result<usize> {
        let orphans = self.fs.forest.collect_range(
            &self.root.tree,
            Key::new(ORPHAN_OBJECTID, item_type::ORPHAN_ITEM, 0),
            Key::new(ORPHAN_OBJECTID, item_type::ORPHAN_ITEM, u64::MAX),
        )?;
        for (key, _) in &orphans {
            let ino = key.offset;
            // An O_TMPFILE file linked and fsynced after its orphan item
            // was committed: the log gave it its name, but only the next
            // commit drops the orphan item (btrfs treats it the same way).
            if self.inode(ino)?.item.nlink == 0 {
                self.destroy_inode(ino)?;
            }
            self.fs.forest.delete(&mut self.root.tree, key)?;
        }
        Ok(orphans.len())
    }

    /// Keeps the cache bounded: drops inodes with nothing pending.
    pub(crate) fn evict_clean_inodes(&mut self) {
        if self.root.inodes.len() <= INODE_CACHE_TARGET {
            return;
        }
        let delayed = &self.root.delayed;
        self.root.inodes.retain(|ino, inode| {
            inode.open_count > 0
                || !inode.pages.is_empty()
                || delayed.is_inode_dirty(*ino)
                || delayed.has_pending_dir(*ino)
        });
    }
}
