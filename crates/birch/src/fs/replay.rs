//! Log replay at mount: applies the log tree of a superblock that points at
//! one onto the committed fs tree, then the caller commits. The rules are in
//! docs/TREE-LOG.md, "Replay".

use super::inode::{decode_item, Inode};
use super::FsState;
use crate::btree::TreeRoot;
use crate::device::BlockDevice;
use crate::error::{Corruption, Error, Result};
use crate::format::{
    decode_inode_extrefs, decode_inode_refs, decode_xattrs, encode_xattrs, item_type, tree_id,
    DirEntry, FileExtent, FileType, InodeItem, ItemType, Key, RootItem, Xattr, ROOT_DIR_INO,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// What a replay did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReplayReport {
    pub inodes: u64,
    pub names_added: u64,
    pub names_removed: u64,
    pub extents: u64,
    pub inodes_deleted: u64,
    /// Logged names left out because their directory did not exist at
    /// replay. The logging side logs every new ancestor, so this should
    /// stay 0; it is counted to make a slip visible.
    pub names_without_parent: u64,
}

/// What a mount did with the log it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayOutcome {
    /// The whole log was applied.
    Replayed(ReplayReport),
    /// Replay failed and none of the log was applied: the last commit was
    /// mounted. The text says why.
    Discarded(String),
}

fn corrupt(reason: String) -> Error {
    Error::corrupt(Corruption {
        tree: Some(tree_id::LOG),
        block: None,
        slot: None,
        reason,
    })
}

/// One logged inode's items, grouped.
#[derive(Default)]
struct LoggedInode {
    item: Option<InodeItem>,
    /// (parent, name) pairs; `None` when the log does not hold its names.
    names: Option<Vec<(u64, Vec<u8>)>>,
    xattrs: Vec<Xattr>,
    extents: Vec<(u64, FileExtent)>,
    full_extents: bool,
    dir_added: Vec<DirEntry>,
    dir_removed: Vec<u64>,
}

impl<D: BlockDevice> FsState<D> {
    /// Replays the log the superblock points at into the running
    /// transaction.
    pub(crate) fn replay_log(&mut self) -> Result<ReplayReport> {
        let sb = self.superblock.clone();
        let log_generation = sb.generation + 1;
        let root_tree = TreeRoot {
            id: tree_id::LOG_ROOT,
            bytenr: sb.log_root_bytenr,
            level: sb.log_root_level,
            generation: log_generation,
        };
        let key = Key::new(tree_id::LOG, item_type::ROOT_ITEM, tree_id::FS);
        let data = self
            .forest
            .get(&root_tree, &key)?
            .ok_or_else(|| corrupt("log root tree has no log of the fs tree".into()))?;
        let item = RootItem::decode(&data).map_err(|e| corrupt(format!("log root item: {e}")))?;
        let log_tree = TreeRoot {
            id: tree_id::LOG,
            bytenr: item.bytenr,
            level: item.level,
            generation: item.generation,
        };

        // 1. Nothing may be allocated over the log or the data it names.
        for tree in [&root_tree, &log_tree] {
            for block in self.forest.tree_blocks(tree)? {
                if !self.forest.alloc.reserve_log_block(block) {
                    return Err(corrupt(format!(
                        "log node {block} overlaps allocated space"
                    )));
                }
            }
        }
        let items = self.forest.collect_range(&log_tree, Key::MIN, Key::MAX)?;
        let mut claimed = BTreeSet::new();
        for (key, data) in &items {
            if key.item_type != item_type::EXTENT_DATA {
                continue;
            }
            let Some(disk) = decode_item(key, FileExtent::decode(data))?.disk_ref() else {
                continue;
            };
            let extent_key = Key::new(
                disk.disk_bytenr,
                item_type::EXTENT_ITEM,
                disk.disk_num_bytes,
            );
            if claimed.contains(&disk.disk_bytenr)
                || self.forest.get(&self.roots.extent, &extent_key)?.is_some()
            {
                continue;
            }
            if !self
                .forest
                .alloc
                .free_space()
                .is_free(disk.disk_bytenr, disk.disk_num_bytes)
            {
                return Err(corrupt(format!(
                    "logged extent {extent_key} overlaps allocated space"
                )));
            }
            self.forest.alloc.claim_logged_extent(
                disk.disk_bytenr,
                disk.disk_num_bytes,
                key.objectid,
            );
            claimed.insert(disk.disk_bytenr);
        }

        // 2. Group the log by inode; checksum items (and the extents the
        // log names, which they must lie in) aside.
        let mut logged: BTreeMap<u64, LoggedInode> = BTreeMap::new();
        let mut csum_items = Vec::new();
        let mut logged_extents = BTreeMap::new();
        for (key, data) in items {
            let logged_type = ItemType::of(&key)
                .map_err(|unknown| corrupt(format!("{unknown} at {key} in the log")))?;
            if logged_type == ItemType::ExtentCsum {
                csum_items.push((key, data));
                continue;
            }
            let entry = logged.entry(key.objectid).or_default();
            match logged_type {
                ItemType::InodeItem => {
                    entry.item = Some(decode_item(&key, InodeItem::decode(&data))?)
                }
                ItemType::InodeRef => {
                    let names = entry.names.get_or_insert_with(Vec::new);
                    names.extend(
                        decode_item(&key, decode_inode_refs(&data))?
                            .into_iter()
                            .map(|r| (key.offset, r.name)),
                    );
                }
                ItemType::InodeExtref => {
                    let names = entry.names.get_or_insert_with(Vec::new);
                    names.extend(
                        decode_item(&key, decode_inode_extrefs(&data))?
                            .into_iter()
                            .map(|e| (e.parent, e.name)),
                    );
                }
                ItemType::XattrItem => entry
                    .xattrs
                    .extend(decode_item(&key, decode_xattrs(&data))?),
                ItemType::ExtentData => {
                    let extent = decode_item(&key, FileExtent::decode(&data))?;
                    if let Some(disk) = extent.disk_ref() {
                        logged_extents.insert(disk.disk_bytenr, disk.disk_num_bytes);
                    }
                    entry.extents.push((key.offset, extent));
                }
                ItemType::LogFullExtents => entry.full_extents = true,
                // Its names are logged, and there are none.
                ItemType::LogUnlinked => {
                    entry.names.get_or_insert_with(Vec::new);
                }
                ItemType::DirIndex => entry
                    .dir_added
                    .push(decode_item(&key, DirEntry::decode(&data))?),
                ItemType::DirLogIndex => entry.dir_removed.push(key.offset),
                // Checksum items were taken aside above.
                ItemType::ExtentCsum
                | ItemType::OrphanItem
                | ItemType::DirItem
                | ItemType::RootItem
                | ItemType::ExtentItem
                | ItemType::MetadataItem => {
                    return Err(corrupt(format!(
                        "unexpected item type {} at {key} in the log",
                        logged_type.code()
                    )))
                }
            }
        }
        let mut report = ReplayReport::default();
        let mut touched: BTreeSet<u64> = BTreeSet::new();

        // 3. Inodes: items, xattrs, extents.
        for (&ino, log) in &logged {
            let Some(item) = &log.item else { continue };
            report.inodes += 1;
            touched.insert(ino);
            self.next_ino = self.next_ino.max(ino + 1);
            match self.inode(ino) {
                Ok(inode) => inode.item = item.clone(),
                Err(Error::NotFound) => {
                    self.inodes.insert(
                        ino,
                        Inode {
                            item: item.clone(),
                            open_count: 0,
                            next_index: None,
                            pages: BTreeMap::new(),
                            change_seq: 0,
                            log: Default::default(),
                        },
                    );
                }
                Err(e) => return Err(e),
            }
            self.update_inode(ino, |_| {})?;
            self.replace_xattrs(ino, &log.xattrs)?;
            if log.full_extents {
                self.drop_extents(ino, 0, u64::MAX)?;
            }
            for (offset, extent) in &log.extents {
                let end = match extent {
                    FileExtent::Inline { .. } => crate::format::SECTOR_SIZE,
                    e => offset + e.len(),
                };
                self.drop_extents(ino, *offset, end)?;
                match extent {
                    FileExtent::Inline { .. } => self.forest.insert(
                        &mut self.roots.fs,
                        Key::new(ino, item_type::EXTENT_DATA, 0),
                        extent.encode(),
                    )?,
                    _ => self.insert_file_extent(ino, *offset, extent.clone())?,
                }
                report.extents += 1;
            }
        }

        self.replay_csums(csum_items, &logged_extents)?;

        // 4. Entries removed from logged directories.
        for (&dir, log) in &logged {
            for &index in &log.dir_removed {
                let key = Key::new(dir, item_type::DIR_INDEX, index);
                let Some(data) = self.forest.get(&self.roots.fs, &key)? else {
                    continue;
                };
                let entry = decode_item(&key, DirEntry::decode(&data))?;
                self.remove_name(dir, &entry.name, entry.ino)?;
                report.names_removed += 1;
                touched.extend([dir, entry.ino]);
            }
        }

        // 5. Logged inodes' names become exactly their logged names.
        let exists = |s: &mut Self, ino: u64| match s.inode(ino) {
            Ok(_) => Ok(true),
            Err(Error::NotFound) => Ok(false),
            Err(e) => Err(e),
        };
        for (&ino, log) in &logged {
            let Some(wanted) = &log.names else { continue };
            if !exists(self, ino)? {
                continue;
            }
            let file_type = self.inode(ino)?.item.file_type();
            let current = self.names_of(ino)?;
            touched.insert(ino);
            for (parent, name) in &current {
                if !wanted.contains(&(*parent, name.clone())) {
                    self.remove_name(*parent, name, ino)?;
                    report.names_removed += 1;
                    touched.insert(*parent);
                }
            }
            for (parent, name) in wanted {
                if *parent == ino || current.contains(&(*parent, name.clone())) {
                    continue;
                }
                if !exists(self, *parent)?
                    || self.inode(*parent)?.item.file_type() != FileType::Directory
                {
                    report.names_without_parent += 1;
                    continue;
                }
                if let Some(other) = self.find_entry(*parent, name)? {
                    self.remove_name(*parent, name, other.ino)?;
                    report.names_removed += 1;
                    touched.insert(other.ino);
                }
                self.add_name(*parent, name, ino, file_type)?;
                report.names_added += 1;
                touched.extend([*parent, ino]);
            }
        }

        // 6. Entries added to logged directories.
        for (&dir, log) in &logged {
            if log.dir_added.is_empty() || !exists(self, dir)? {
                continue;
            }
            for entry in &log.dir_added {
                if !exists(self, entry.ino)? || self.find_entry(dir, &entry.name)?.is_some() {
                    continue;
                }
                // An inode whose names are logged has them all in the log.
                let named = logged.get(&entry.ino).and_then(|l| l.names.as_ref());
                if named.is_some_and(|names| !names.contains(&(dir, entry.name.clone()))) {
                    continue;
                }
                let file_type = self.inode(entry.ino)?.item.file_type();
                self.add_name(dir, &entry.name, entry.ino, file_type)?;
                report.names_added += 1;
                touched.extend([dir, entry.ino]);
            }
        }

        // 7. Link counts, directory sizes and byte counts of everything
        // touched; an inode left without a name goes.
        for ino in touched {
            if !exists(self, ino)? {
                continue;
            }
            if self.fix_counts(ino)? {
                report.inodes_deleted += 1;
            }
        }
        Ok(report)
    }

    fn replace_xattrs(&mut self, ino: u64, xattrs: &[Xattr]) -> Result<()> {
        for (key, _) in self.forest.collect_range(
            &self.roots.fs,
            Key::new(ino, item_type::XATTR_ITEM, 0),
            Key::new(ino, item_type::XATTR_ITEM, u64::MAX),
        )? {
            self.forest.delete(&mut self.roots.fs, &key)?;
        }
        let mut buckets: HashMap<u64, Vec<Xattr>> = HashMap::new();
        for x in xattrs {
            buckets
                .entry(crate::format::name_hash(&x.name))
                .or_default()
                .push(x.clone());
        }
        for (hash, bucket) in buckets {
            self.forest.put(
                &mut self.roots.fs,
                Key::new(ino, item_type::XATTR_ITEM, hash),
                encode_xattrs(&bucket),
            )?;
        }
        Ok(())
    }

    /// Recomputes nlink (and, for a directory, its size; for a file, its
    /// byte count) from the trees. Deletes the inode if it has no name left.
    /// Returns whether it was deleted.
    fn fix_counts(&mut self, ino: u64) -> Result<bool> {
        let names = if ino == ROOT_DIR_INO {
            1
        } else {
            self.names_of(ino)?.len() as u32
        };
        let file_type = self.inode(ino)?.item.file_type();
        if file_type == FileType::Directory {
            let entries = self.readdir(ino, 0, usize::MAX)?;
            if names == 0 {
                if !entries.is_empty() {
                    return Err(corrupt(format!(
                        "replay left directory {ino}, which has entries, without a name"
                    )));
                }
                self.destroy_inode(ino)?;
                return Ok(true);
            }
            let subdirs = entries
                .iter()
                .filter(|e| e.file_type == FileType::Directory)
                .count() as u32;
            let size: u64 = entries.iter().map(|e| e.name.len() as u64).sum();
            self.update_inode(ino, |i| {
                i.nlink = 2 + subdirs;
                i.size = size;
            })?;
            return Ok(false);
        }
        if names == 0 {
            self.destroy_inode(ino)?;
            return Ok(true);
        }
        let mut nbytes = 0;
        for (key, data) in self.forest.collect_range(
            &self.roots.fs,
            Key::new(ino, item_type::EXTENT_DATA, 0),
            Key::new(ino, item_type::EXTENT_DATA, u64::MAX),
        )? {
            nbytes += decode_item(&key, FileExtent::decode(&data))?.len();
        }
        self.update_inode(ino, |i| {
            i.nlink = names;
            i.nbytes = nbytes;
        })?;
        Ok(false)
    }
}
