//! Names: lookup, create, link, unlink, rename, readdir.
//!
//! A name is three items: DIR_ITEM (parent, hash) for lookup and INODE_REF
//! (ino, parent) for the way back, both written to the tree at once, and
//! DIR_INDEX (parent, index) for readdir order, kept as a delayed item.

use super::decode::decode_item;
use super::delayed_items::DelayedDir;
use super::root::RootCtx;
use super::{Attr, DirListEntry, RenameFlags, WhiteoutOwner};
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::format::node::MAX_ITEM_DATA;
use crate::format::{
    decode_dir_items, decode_inode_extrefs, decode_inode_refs, encode_dir_items,
    encode_inode_extrefs, encode_inode_refs, extref_hash, item_type, name_hash, DirEntry,
    FileExtent, FileType, InodeExtrefEntry, InodeRefEntry, Key, Timespec, FIRST_DIR_INDEX,
    NAME_MAX, ROOT_DIR_INO, SYMLINK_MAX,
};
use std::ops::ControlFlow;

/// Where a plain rename moves the source's name to, and what it replaces.
struct Move<'a> {
    source: DirEntry,
    new_parent: u64,
    new_name: &'a [u8],
    target: Option<DirEntry>,
}

/// Most links one inode may have (as ext4's EXT4_LINK_MAX).
const LINK_MAX: u32 = 65000;

/// Rejects names no directory may hold.
pub(crate) fn validate_name(name: &[u8]) -> Result<()> {
    if name.is_empty() {
        return Err(Error::InvalidArgument("empty name"));
    }
    if name.len() > NAME_MAX {
        return Err(Error::NameTooLong);
    }
    if name.contains(&b'/') || name.contains(&0) {
        return Err(Error::InvalidArgument("name contains '/' or NUL"));
    }
    Ok(())
}

/// Rejects names that may not be created ("." and "..").
fn validate_new_name(name: &[u8]) -> Result<()> {
    validate_name(name)?;
    if name == b"." || name == b".." {
        return Err(Error::Exists);
    }
    Ok(())
}

impl<D: BlockDevice> RootCtx<'_, D> {
    pub(crate) fn require_dir(&mut self, ino: u64) -> Result<()> {
        if self.inode(ino)?.item.file_type() != FileType::Directory {
            return Err(Error::NotDir);
        }
        Ok(())
    }

    /// The root directory of a deleted subvolume is a removed directory,
    /// as the kernel marks one (`S_DEAD`) after rmdir and btrfs's delete:
    /// no lookup, listing, new name or removal in it (ENOENT). Its other
    /// directories, reached through inodes still held, work as before.
    fn require_live_dir(&mut self, dir: u64) -> Result<()> {
        self.require_dir(dir)?;
        if dir == ROOT_DIR_INO && self.root.is_deleted() {
            return Err(Error::NotFound);
        }
        Ok(())
    }

    /// The entry `name` in directory `dir`, if any.
    pub(crate) fn find_entry(&mut self, dir: u64, name: &[u8]) -> Result<Option<DirEntry>> {
        self.require_live_dir(dir)?;
        validate_name(name)?;
        let key = Key::new(dir, item_type::DIR_ITEM, name_hash(name));
        let Some(data) = self.fs.forest.get(&self.root.tree, &key)? else {
            return Ok(None);
        };
        Ok(decode_item(&key, decode_dir_items(&data))?
            .into_iter()
            .find(|e| e.name == name))
    }

    pub(crate) fn lookup(&mut self, parent: u64, name: &[u8]) -> Result<Attr> {
        let ino = match name {
            b"." => {
                self.require_dir(parent)?;
                parent
            }
            b".." => self.dir_parent(parent)?,
            _ => self.find_entry(parent, name)?.ok_or(Error::NotFound)?.ino,
        };
        self.getattr(ino)
    }

    /// A directory's parent, from its single INODE_REF.
    pub(crate) fn dir_parent(&mut self, dir: u64) -> Result<u64> {
        self.require_dir(dir)?;
        if dir == ROOT_DIR_INO {
            return Ok(ROOT_DIR_INO);
        }
        let mut parent = None;
        self.fs.forest.scan(
            &self.root.tree,
            Key::new(dir, item_type::INODE_REF, 0),
            Key::new(dir, item_type::INODE_REF, u64::MAX),
            &mut |k, _| {
                parent = Some(k.offset);
                Ok(ControlFlow::Break(()))
            },
        )?;
        parent.ok_or_else(|| {
            Error::corrupt(crate::Corruption::general(format!(
                "directory {dir} has no parent reference"
            )))
        })
    }

    pub(crate) fn next_dir_index(&mut self, dir: u64) -> Result<u64> {
        let next = self.peek_dir_index(dir)?;
        // u64::MAX itself is never handed out: it is peek's "none left".
        let after = next
            .checked_add(1)
            .ok_or(Error::DirIndexesExhausted { dir })?;
        self.inode(dir)?.next_index = Some(after);
        Ok(next)
    }

    /// Fails with [`Error::DirIndexesExhausted`] (EOVERFLOW) unless `count`
    /// more names can be added to `dir`. A directory whose last index is
    /// near 2^64 (only a crafted image has one: each name takes the next
    /// index and 2^64 names do not fit on a device) takes no more names;
    /// an operation checks this before it changes anything, so the refusal
    /// leaves the filesystem as it was.
    pub(crate) fn require_dir_indexes(&mut self, dir: u64, count: u64) -> Result<()> {
        // The indexes handed out are next..next + count, all below
        // u64::MAX (peek's "none left").
        match self.peek_dir_index(dir)?.checked_add(count) {
            Some(_) => Ok(()),
            None => Err(Error::DirIndexesExhausted { dir }),
        }
    }

    /// The index [`next_dir_index`](Self::next_dir_index) will hand out next
    /// (u64::MAX: none left, see [`require_dir_indexes`](Self::require_dir_indexes)).
    pub(crate) fn peek_dir_index(&mut self, dir: u64) -> Result<u64> {
        if let Some(next) = self.inode(dir)?.next_index {
            return Ok(next);
        }
        let last = self.fs.forest.last_at_or_before(
            &self.root.tree,
            &Key::new(dir, item_type::DIR_INDEX, u64::MAX),
        )?;
        let mut next = match last {
            // Saturating: an on-disk index of u64::MAX leaves none free.
            Some((k, _)) if k.objectid == dir && k.item_type == item_type::DIR_INDEX => {
                k.offset.saturating_add(1)
            }
            _ => FIRST_DIR_INDEX,
        };
        if let Some(pending) = self
            .root
            .delayed
            .dir(dir)
            .and_then(|d| d.insertions.keys().next_back())
        {
            next = next.max(pending.saturating_add(1));
        }
        self.inode(dir)?.next_index = Some(next);
        Ok(next)
    }

    /// Adds the name `name` in `parent` for `ino`; returns its dir index.
    pub(crate) fn add_name(
        &mut self,
        parent: u64,
        name: &[u8],
        ino: u64,
        file_type: FileType,
    ) -> Result<u64> {
        let ref_key = Key::new(ino, item_type::INODE_REF, parent);
        let mut refs = match self.fs.forest.get(&self.root.tree, &ref_key)? {
            Some(data) => decode_item(&ref_key, decode_inode_refs(&data))?,
            None => Vec::new(),
        };
        let index = self.next_dir_index(parent)?;
        refs.push(InodeRefEntry {
            index,
            name: name.to_vec(),
        });
        let refs = encode_inode_refs(&refs);
        let ref_full = refs.len() > MAX_ITEM_DATA;
        let dir_key = Key::new(parent, item_type::DIR_ITEM, name_hash(name));
        let mut entries = match self.fs.forest.get(&self.root.tree, &dir_key)? {
            Some(data) => decode_item(&dir_key, decode_dir_items(&data))?,
            None => Vec::new(),
        };
        let entry = DirEntry {
            ino,
            file_type,
            name: name.to_vec(),
            subvolume: false,
        };
        entries.push(entry.clone());
        let entries = encode_dir_items(&entries);
        if entries.len() > MAX_ITEM_DATA {
            return Err(Error::TooManyLinks);
        }
        if ref_full {
            self.add_extref(ino, parent, name, index)?;
        } else {
            self.fs.forest.put(&mut self.root.tree, ref_key, refs)?;
        }
        self.fs.forest.put(&mut self.root.tree, dir_key, entries)?;
        self.root.delayed.insert_index(parent, index, entry.clone());
        let now = (!self.fs.replaying_log).then(Timespec::now);
        self.update_inode(parent, |p| {
            p.size += name.len() as u64;
            if let Some(now) = now {
                p.mtime = now;
                p.ctime = now;
            }
        })?;
        self.log_names_changed(ino)?;
        self.log_entry_added(parent, index, &entry)?;
        Ok(index)
    }

    /// Records a name of `ino` whose parent's INODE_REF item is full in an
    /// INODE_EXTREF item (btrfs's extended refs): an inode can then have
    /// up to `LINK_MAX` names in one directory.
    fn add_extref(&mut self, ino: u64, parent: u64, name: &[u8], index: u64) -> Result<()> {
        let key = Key::new(ino, item_type::INODE_EXTREF, extref_hash(parent, name));
        let mut entries = match self.fs.forest.get(&self.root.tree, &key)? {
            Some(data) => decode_item(&key, decode_inode_extrefs(&data))?,
            None => Vec::new(),
        };
        entries.push(InodeExtrefEntry {
            parent,
            index,
            name: name.to_vec(),
        });
        let encoded = encode_inode_extrefs(&entries);
        // Only names whose hashes collide share an item.
        if encoded.len() > MAX_ITEM_DATA {
            return Err(Error::TooManyLinks);
        }
        self.fs.forest.put(&mut self.root.tree, key, encoded)
    }

    /// Removes the extended ref of `name` in `parent`; returns its index,
    /// or `None` when there is none.
    fn remove_extref(&mut self, ino: u64, parent: u64, name: &[u8]) -> Result<Option<u64>> {
        let key = Key::new(ino, item_type::INODE_EXTREF, extref_hash(parent, name));
        let Some(data) = self.fs.forest.get(&self.root.tree, &key)? else {
            return Ok(None);
        };
        let mut entries = decode_item(&key, decode_inode_extrefs(&data))?;
        let Some(pos) = entries
            .iter()
            .position(|e| e.parent == parent && e.name == name)
        else {
            return Ok(None);
        };
        let index = entries.remove(pos).index;
        if entries.is_empty() {
            self.fs.forest.delete(&mut self.root.tree, &key)?;
        } else {
            self.fs
                .forest
                .put(&mut self.root.tree, key, encode_inode_extrefs(&entries))?;
        }
        Ok(Some(index))
    }

    /// `(parent, name)` of every name of `ino` in the fs tree: its
    /// INODE_REF items, then its INODE_EXTREF items.
    pub(crate) fn names_of(&self, ino: u64) -> Result<Vec<(u64, Vec<u8>)>> {
        let mut names = Vec::new();
        for (key, data) in self.fs.forest.collect_range(
            &self.root.tree,
            Key::new(ino, item_type::INODE_REF, 0),
            Key::new(ino, item_type::INODE_EXTREF, u64::MAX),
        )? {
            if key.item_type == item_type::INODE_REF {
                names.extend(
                    decode_item(&key, decode_inode_refs(&data))?
                        .into_iter()
                        .map(|r| (key.offset, r.name)),
                );
            } else {
                names.extend(
                    decode_item(&key, decode_inode_extrefs(&data))?
                        .into_iter()
                        .map(|e| (e.parent, e.name)),
                );
            }
        }
        Ok(names)
    }

    /// Removes `name` from directory `dir`'s DIR_ITEM (names whose hashes
    /// collide share one item; it goes with its last name) and returns the
    /// entry removed: None when there was no such name.
    pub(super) fn remove_dir_item(&mut self, dir: u64, name: &[u8]) -> Result<Option<DirEntry>> {
        let dir_key = Key::new(dir, item_type::DIR_ITEM, name_hash(name));
        let Some(data) = self.fs.forest.get(&self.root.tree, &dir_key)? else {
            return Ok(None);
        };
        let mut entries = decode_item(&dir_key, decode_dir_items(&data))?;
        let Some(pos) = entries.iter().position(|e| e.name == name) else {
            return Ok(None);
        };
        let removed = entries.remove(pos);
        if entries.is_empty() {
            self.fs.forest.delete(&mut self.root.tree, &dir_key)?;
        } else {
            self.fs
                .forest
                .put(&mut self.root.tree, dir_key, encode_dir_items(&entries))?;
        }
        Ok(Some(removed))
    }

    /// Removes the name `name` of `ino` from `parent`.
    pub(crate) fn remove_name(&mut self, parent: u64, name: &[u8], ino: u64) -> Result<()> {
        let ref_key = Key::new(ino, item_type::INODE_REF, parent);
        let missing = || {
            Error::corrupt(crate::Corruption::general(format!(
                "name {:?} of inode {ino} in {parent}: no matching inode ref",
                String::from_utf8_lossy(name)
            )))
        };
        let in_ref = match self.fs.forest.get(&self.root.tree, &ref_key)? {
            Some(data) => {
                let mut refs = decode_item(&ref_key, decode_inode_refs(&data))?;
                match refs.iter().position(|r| r.name == name) {
                    Some(pos) => {
                        let index = refs.remove(pos).index;
                        if refs.is_empty() {
                            self.fs.forest.delete(&mut self.root.tree, &ref_key)?;
                        } else {
                            self.fs.forest.put(
                                &mut self.root.tree,
                                ref_key,
                                encode_inode_refs(&refs),
                            )?;
                        }
                        Some(index)
                    }
                    None => None,
                }
            }
            None => None,
        };
        let index = match in_ref {
            Some(index) => index,
            None => self.remove_extref(ino, parent, name)?.ok_or_else(missing)?,
        };
        self.remove_dir_item(parent, name)?.ok_or_else(missing)?;
        let committed = self.root.delayed.delete_index(parent, index, ino, name);
        let now = (!self.fs.replaying_log).then(Timespec::now);
        self.update_inode(parent, |p| {
            // Saturating: during log replay a directory's item comes from
            // the log before its entries do (replay recounts it at the end).
            p.size = p.size.saturating_sub(name.len() as u64);
            if let Some(now) = now {
                p.mtime = now;
                p.ctime = now;
            }
        })?;
        if self.log_entry_removed(parent, index, committed)? {
            // The logged directory will drop this name at replay: the inode
            // must take its remaining (or new, for a rename) names along.
            self.log_exists(ino)
        } else {
            self.log_names_changed(ino)
        }
    }

    // The arguments of a FUSE MKNOD request plus the owner: bundling them
    // would only move the list into a struct built at each call.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn create_node(
        &mut self,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        uid: u32,
        gid: u32,
        rdev: u64,
    ) -> Result<Attr> {
        validate_new_name(name)?;
        #[cfg(debug_assertions)]
        if panics_on_create(name) {
            panic!(
                "BIRCH_TEST_PANIC_ON_CREATE: create of {:?}",
                String::from_utf8_lossy(name)
            );
        }
        self.ensure_space(0)?;
        let file_type =
            FileType::from_mode(mode).ok_or(Error::InvalidArgument("mode has no file type"))?;
        if self.find_entry(parent, name)?.is_some() {
            return Err(Error::Exists);
        }
        if file_type == FileType::Directory && self.inode(parent)?.item.nlink >= LINK_MAX {
            return Err(Error::TooManyLinks);
        }
        self.require_dir_indexes(parent, 1)?;
        let ino = self.insert_new_node(parent, name, file_type, mode, umask, (uid, gid), rdev)?;
        self.getattr(ino)
    }

    /// The changes of [`Self::create_node`] once checked (a free name, a
    /// dir index, space): a new inode of `file_type` under `name`,
    /// inheriting `parent`'s default ACL. Returns its number.
    #[allow(clippy::too_many_arguments)]
    fn insert_new_node(
        &mut self,
        parent: u64,
        name: &[u8],
        file_type: FileType,
        mode: u32,
        umask: u32,
        (uid, gid): (u32, u32),
        rdev: u64,
    ) -> Result<u64> {
        let (mode, acls) = self.acl_at_create(parent, mode, umask)?;
        let mut item = self.new_inode_item(mode, uid, gid, rdev);
        item.flags |= self.inherited_flags(parent)?;
        let ino = self.add_new_inode(item);
        // Before the name: a logged parent logs the new inode with it.
        self.store_inherited_acls(ino, acls)?;
        self.inherit_compression_property(parent, ino, file_type)?;
        self.add_name(parent, name, ino, file_type)?;
        if file_type == FileType::Directory {
            self.update_inode(parent, |p| p.nlink += 1)?;
        }
        Ok(ino)
    }

    pub(crate) fn symlink(
        &mut self,
        parent: u64,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        if target.is_empty() {
            return Err(Error::NotFound);
        }
        if target.len() > SYMLINK_MAX {
            return Err(Error::NameTooLong);
        }
        let attr = self.create_node(parent, name, libc::S_IFLNK | 0o777, 0, uid, gid, 0)?;
        let ino = attr.ino;
        self.fs.forest.insert(
            &mut self.root.tree,
            Key::new(ino, item_type::EXTENT_DATA, 0),
            FileExtent::Inline {
                data: target.to_vec(),
            }
            .encode(),
        )?;
        self.update_inode(ino, |i| {
            i.size = target.len() as u64;
            i.nbytes = target.len() as u64;
        })?;
        // A logged parent logged the new name before the target existed.
        self.log_exists_again(ino)?;
        self.getattr(ino)
    }

    pub(crate) fn readlink(&mut self, ino: u64) -> Result<Vec<u8>> {
        if self.inode(ino)?.item.file_type() != FileType::Symlink {
            return Err(Error::InvalidArgument("not a symlink"));
        }
        let key = Key::new(ino, item_type::EXTENT_DATA, 0);
        let data = self.fs.forest.get(&self.root.tree, &key)?.ok_or_else(|| {
            Error::corrupt(crate::Corruption::general(format!(
                "symlink {ino} has no target item"
            )))
        })?;
        match decode_item(&key, FileExtent::decode_at(&key, &data))? {
            FileExtent::Inline { data } => Ok(data),
            _ => Err(Error::corrupt(crate::Corruption::general(format!(
                "symlink {ino} target is not inline"
            )))),
        }
    }

    pub(crate) fn link(&mut self, ino: u64, new_parent: u64, new_name: &[u8]) -> Result<Attr> {
        // The kernel's order: the new name first (EEXIST), then the inode.
        validate_new_name(new_name)?;
        if self.find_entry(new_parent, new_name)?.is_some() {
            return Err(Error::Exists);
        }
        let item = self.inode_item(ino)?;
        if item.file_type() == FileType::Directory {
            return Err(Error::NotPermitted);
        }
        if item.nlink >= LINK_MAX {
            return Err(Error::TooManyLinks);
        }
        self.ensure_space(0)?;
        self.require_dir_indexes(new_parent, 1)?;
        self.add_name(new_parent, new_name, ino, item.file_type())?;
        let now = Timespec::now();
        self.update_inode(ino, |i| {
            i.nlink += 1;
            i.ctime = now;
        })?;
        self.inode(ino)?.log.linked_trans = self.fs.forest.transid();
        if item.nlink == 0 {
            // An O_TMPFILE file (linkat) takes its first name.
            self.inode_relinked(ino)?;
        }
        self.getattr(ino)
    }

    /// Drops one link of `ino` (whose name is already removed).
    fn drop_link(&mut self, ino: u64) -> Result<()> {
        let now = Timespec::now();
        let is_dir = self.inode(ino)?.item.file_type() == FileType::Directory;
        self.update_inode(ino, |i| {
            // A directory's own "." link goes with its name.
            i.nlink = if is_dir { 0 } else { i.nlink - 1 };
            i.ctime = now;
        })?;
        if self.inode(ino)?.item.nlink == 0 {
            self.inode_unlinked(ino)?;
        }
        Ok(())
    }

    pub(crate) fn unlink(&mut self, parent: u64, name: &[u8]) -> Result<()> {
        let entry = self.find_entry(parent, name)?.ok_or(Error::NotFound)?;
        if entry.file_type == FileType::Directory {
            return Err(Error::IsDir);
        }
        self.remove_name(parent, name, entry.ino)?;
        self.drop_link(entry.ino)
    }

    pub(crate) fn is_dir_empty(&mut self, dir: u64) -> Result<bool> {
        if self
            .root
            .delayed
            .dir(dir)
            .is_some_and(|d| !d.insertions.is_empty())
        {
            return Ok(false);
        }
        let empty_batch = DelayedDir::default();
        let deletions = &self.root.delayed.dir(dir).unwrap_or(&empty_batch).deletions;
        let mut empty = true;
        self.fs.forest.scan(
            &self.root.tree,
            Key::new(dir, item_type::DIR_INDEX, 0),
            Key::new(dir, item_type::DIR_INDEX, u64::MAX),
            &mut |k, _| {
                if deletions.contains(&k.offset) {
                    return Ok(ControlFlow::Continue(()));
                }
                empty = false;
                Ok(ControlFlow::Break(()))
            },
        )?;
        Ok(empty)
    }

    pub(crate) fn rmdir(&mut self, parent: u64, name: &[u8]) -> Result<()> {
        if name == b"." {
            return Err(Error::InvalidArgument("rmdir of \".\""));
        }
        if name == b".." {
            return Err(Error::NotEmpty);
        }
        let entry = self.find_entry(parent, name)?.ok_or(Error::NotFound)?;
        if entry.file_type != FileType::Directory {
            return Err(Error::NotDir);
        }
        if !self.is_dir_empty(entry.ino)? {
            return Err(Error::NotEmpty);
        }
        self.note_rmdir(parent, entry.ino)?;
        self.remove_name(parent, name, entry.ino)?;
        self.update_inode(parent, |p| p.nlink -= 1)?;
        self.drop_link(entry.ino)
    }

    /// Whether `dir` is `ancestor` or lies below it.
    pub(super) fn is_within(&mut self, dir: u64, ancestor: u64) -> Result<bool> {
        let mut cur = dir;
        for _ in 0..=u16::MAX {
            if cur == ancestor {
                return Ok(true);
            }
            if cur == ROOT_DIR_INO {
                return Ok(false);
            }
            cur = self.dir_parent(cur)?;
        }
        Err(Error::corrupt(crate::Corruption::general(format!(
            "directory {dir}: parent chain does not reach the root"
        ))))
    }

    /// rename(2), with RENAME_EXCHANGE and RENAME_NOREPLACE: checks in the
    /// kernel's order, then exchanges the two names or moves the source's
    /// name over the target's.
    pub(crate) fn rename(
        &mut self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        if flags.exchange && flags.no_replace {
            return Err(Error::InvalidArgument(
                "RENAME_EXCHANGE with RENAME_NOREPLACE",
            ));
        }
        if flags.exchange && flags.whiteout.is_some() {
            return Err(Error::InvalidArgument(
                "RENAME_EXCHANGE with RENAME_WHITEOUT",
            ));
        }
        if name == b"." || name == b".." {
            return Err(Error::InvalidArgument("rename of \".\" or \"..\""));
        }
        // Checks in the kernel's order (do_renameat2): the source must
        // exist, then the new name is looked at, then the flags, then the
        // ancestry traps, then the types.
        let source = self.find_entry(parent, name)?.ok_or(Error::NotFound)?;
        validate_new_name(new_name).map_err(|e| {
            if matches!(e, Error::Exists) {
                Error::InvalidArgument("rename onto \".\" or \"..\"")
            } else {
                e
            }
        })?;
        let target = self.find_entry(new_parent, new_name)?;
        match (&target, flags) {
            (None, RenameFlags { exchange: true, .. }) => return Err(Error::NotFound),
            (
                Some(_),
                RenameFlags {
                    no_replace: true, ..
                },
            ) => return Err(Error::Exists),
            _ => {}
        }
        if source.file_type == FileType::Directory && self.is_within(new_parent, source.ino)? {
            return Err(Error::InvalidArgument(
                "directory moved into its own subtree",
            ));
        }
        if let Some(t) = &target {
            if t.file_type == FileType::Directory && self.is_within(parent, t.ino)? {
                // The target is an ancestor of the source.
                return Err(if flags.exchange {
                    Error::InvalidArgument("directory exchanged with its own ancestor")
                } else {
                    Error::NotEmpty
                });
            }
        }
        self.ensure_space(0)?;
        if flags.exchange && parent == new_parent {
            self.require_dir_indexes(parent, 2)?;
        } else if flags.whiteout.is_some() && parent == new_parent {
            // The moved name and the whiteout.
            self.require_dir_indexes(parent, 2)?;
        } else {
            self.require_dir_indexes(new_parent, 1)?;
            if flags.exchange || flags.whiteout.is_some() {
                self.require_dir_indexes(parent, 1)?;
            }
        }
        if flags.exchange {
            let target = target.expect("checked above");
            self.rename_exchange(parent, name, source, new_parent, new_name, target)
        } else {
            let moved = Move {
                source,
                new_parent,
                new_name,
                target,
            };
            self.rename_move(parent, name, moved, flags.whiteout)
        }
    }

    /// RENAME_EXCHANGE once checked: `source` and `target` swap names.
    fn rename_exchange(
        &mut self,
        parent: u64,
        name: &[u8],
        source: DirEntry,
        new_parent: u64,
        new_name: &[u8],
        target: DirEntry,
    ) -> Result<()> {
        if source.ino == target.ino {
            return Ok(());
        }
        let now = Timespec::now();
        self.remove_name(parent, name, source.ino)?;
        self.remove_name(new_parent, new_name, target.ino)?;
        self.add_name(new_parent, new_name, source.ino, source.file_type)?;
        self.add_name(parent, name, target.ino, target.file_type)?;
        if parent != new_parent {
            let delta = |e: &DirEntry| i64::from(e.file_type == FileType::Directory);
            let shift = delta(&source) - delta(&target);
            self.update_inode(parent, |p| p.nlink = (i64::from(p.nlink) - shift) as u32)?;
            self.update_inode(new_parent, |p| {
                p.nlink = (i64::from(p.nlink) + shift) as u32
            })?;
        }
        for ino in [source.ino, target.ino] {
            self.update_inode(ino, |i| i.ctime = now)?;
            self.inode(ino)?.log.renamed_trans = self.fs.forest.transid();
        }
        Ok(())
    }

    /// A plain rename once checked: the source's name moves to
    /// `new_parent/new_name`, replacing `target` if there is one. With
    /// `whiteout`, a new whiteout takes the source's name (RENAME_WHITEOUT,
    /// as btrfs's `btrfs_whiteout_for_rename`): it is added like any new
    /// inode, so a logged directory logs it with the name (docs/TREE-LOG.md
    /// "Keeping logged objects current").
    fn rename_move(
        &mut self,
        parent: u64,
        name: &[u8],
        moved: Move<'_>,
        whiteout: Option<WhiteoutOwner>,
    ) -> Result<()> {
        let Move {
            source,
            new_parent,
            new_name,
            target,
        } = moved;
        let now = Timespec::now();
        let source_is_dir = source.file_type == FileType::Directory;
        if let Some(target) = &target {
            if target.ino == source.ino {
                // Two names of one inode: POSIX says do nothing.
                return Ok(());
            }
            let target_is_dir = target.file_type == FileType::Directory;
            match (source_is_dir, target_is_dir) {
                (true, false) => return Err(Error::NotDir),
                (false, true) => return Err(Error::IsDir),
                (true, true) if !self.is_dir_empty(target.ino)? => return Err(Error::NotEmpty),
                _ => {}
            }
            if target_is_dir {
                self.note_rmdir(new_parent, target.ino)?;
            }
            self.remove_name(new_parent, new_name, target.ino)?;
            if target_is_dir {
                self.update_inode(new_parent, |p| p.nlink -= 1)?;
            }
            self.drop_link(target.ino)?;
        }
        self.remove_name(parent, name, source.ino)?;
        self.add_name(new_parent, new_name, source.ino, source.file_type)?;
        if source_is_dir && parent != new_parent {
            self.update_inode(parent, |p| p.nlink -= 1)?;
            self.update_inode(new_parent, |p| p.nlink += 1)?;
        }
        self.update_inode(source.ino, |i| i.ctime = now)?;
        self.inode(source.ino)?.log.renamed_trans = self.fs.forest.transid();
        if let Some(owner) = whiteout {
            // The kernel's whiteout: a character device 0:0 with no
            // permission bits (WHITEOUT_MODE, WHITEOUT_DEV). `rename`
            // checked its dir index; its space is the rename's.
            self.insert_new_node(
                parent,
                name,
                FileType::CharDevice,
                libc::S_IFCHR,
                0,
                (owner.uid, owner.gid),
                0,
            )?;
        }
        Ok(())
    }

    pub(crate) fn readdir(
        &mut self,
        dir: u64,
        offset: u64,
        limit: usize,
    ) -> Result<Vec<DirListEntry>> {
        self.require_live_dir(dir)?;
        let start = offset.max(FIRST_DIR_INDEX);
        let empty = DelayedDir::default();
        let pending = self.root.delayed.dir(dir).unwrap_or(&empty);
        let mut inserts = pending.insertions.range(start..).peekable();
        let mut out: Vec<DirListEntry> = Vec::new();
        let listed = |index: u64, e: &DirEntry| DirListEntry {
            ino: e.ino,
            next_offset: index + 1,
            file_type: e.file_type,
            name: e.name.clone(),
        };
        let mut err = None;
        // Up to u64::MAX - 1: an entry there has a listing position after
        // it (`index + 1`). The engine never hands out u64::MAX (see
        // `next_dir_index`); a crafted image's entry there is not listed
        // (`birch check` reports it) rather than listed forever.
        self.fs.forest.scan(
            &self.root.tree,
            Key::new(dir, item_type::DIR_INDEX, start),
            Key::new(dir, item_type::DIR_INDEX, u64::MAX - 1),
            &mut |k, data| {
                while let Some((&index, entry)) = inserts.next_if(|(&index, _)| index < k.offset) {
                    if out.len() >= limit {
                        return Ok(ControlFlow::Break(()));
                    }
                    out.push(listed(index, entry));
                }
                if out.len() >= limit {
                    return Ok(ControlFlow::Break(()));
                }
                if pending.deletions.contains(&k.offset) {
                    return Ok(ControlFlow::Continue(()));
                }
                match DirEntry::decode(data) {
                    // The decoded name moves into the listing: no second copy.
                    Ok(e) => out.push(DirListEntry {
                        ino: e.ino,
                        next_offset: k.offset + 1,
                        file_type: e.file_type,
                        name: e.name,
                    }),
                    Err(e) => {
                        err = Some(decode_item::<()>(k, Err(e)).unwrap_err());
                        return Ok(ControlFlow::Break(()));
                    }
                }
                Ok(ControlFlow::Continue(()))
            },
        )?;
        if let Some(e) = err {
            return Err(e);
        }
        out.extend(
            inserts
                .take(limit.saturating_sub(out.len()))
                .map(|(&index, entry)| listed(index, entry)),
        );
        out.truncate(limit);
        Ok(out)
    }
}

/// Debug and test builds only (release builds have no such hook): whether a
/// create of `name` is to panic with the state lock held, as a bug would,
/// because the environment variable `BIRCH_TEST_PANIC_ON_CREATE` (read
/// once per process) names it. The mount test of a panic inside a request
/// uses it (crates/birch-cli/tests/mount_failure.rs; docs/IO-ERRORS.md,
/// "Panics"): crafted images no longer reach a panic to test with.
#[cfg(debug_assertions)]
fn panics_on_create(name: &[u8]) -> bool {
    use std::os::unix::ffi::OsStringExt;
    static NAME: std::sync::OnceLock<Option<Vec<u8>>> = std::sync::OnceLock::new();
    NAME.get_or_init(|| std::env::var_os("BIRCH_TEST_PANIC_ON_CREATE").map(|n| n.into_vec()))
        .as_deref()
        == Some(name)
}
