//! Log replay at mount: applies the log tree of a superblock that points at
//! one onto the committed fs tree, then the caller commits. The rules are in
//! docs/TREE-LOG.md, "Replay".

use super::decode::decode_item;
use super::inode_cache::Inode;
use super::log_choice;
use super::state::FsState;
use super::types::ReplayReport;
use crate::alloc::TransactionSpace;
use crate::btree::TreeRoot;
use crate::device::BlockDevice;
use crate::error::{Corruption, Error, Result};
use crate::format::{
    decode_inode_extrefs, decode_inode_refs, decode_xattrs, encode_xattrs, item_type, tree_id,
    DirEntry, FileExtent, FileType, InodeItem, ItemType, Key, LogRootRef, RootItem, Xattr,
    NODE_SIZE, ROOT_DIR_INO, SECTOR_SIZE,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};

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
    /// How many log items this group holds.
    items: usize,
}

/// What the passes of one subvolume's replay share.
struct Replay {
    /// The subvolume whose log this is.
    subvol: u64,
    /// Its log tree.
    log_tree: TreeRoot,
    /// The trees whose blocks the first pass reserves: the log tree, and
    /// the log root tree with the first subvolume's log.
    reserved_trees: Vec<TreeRoot>,
    /// Blocks of those trees, reserved by the first pass.
    log_blocks: Vec<u64>,
    /// Data extents claimed by this replay or an earlier subvolume's of
    /// the same log.
    claimed: BTreeSet<u64>,
    /// Every log item, until `group_by_inode` takes them.
    items: Vec<(Key, Vec<u8>)>,
    /// How many items the log holds.
    item_count: usize,
    /// Data extents (bytenr, length) the log's file extents point into.
    logged_extents: Vec<(u64, u64)>,
    /// The log's checksum items, set aside by `group_by_inode`.
    csum_items: Vec<(Key, Vec<u8>)>,
    /// Keys of the checksum items `replay_logged_csums` put back.
    csums_replayed: Vec<Key>,
    /// The log, by inode.
    logged: BTreeMap<u64, LoggedInode>,
    /// Names removed by `remove_logged_removals`: (dir, name, inode).
    removed: Vec<(u64, Vec<u8>, u64)>,
    /// Names added by `add_logged_entries`: (dir, name, inode).
    added: Vec<(u64, Vec<u8>, u64)>,
    /// Inodes whose counts the last pass recomputes.
    touched: BTreeSet<u64>,
    report: ReplayReport,
}

impl Replay {
    fn new(subvol: u64, log_tree: TreeRoot, reserved_trees: Vec<TreeRoot>) -> Replay {
        Replay {
            subvol,
            log_tree,
            reserved_trees,
            log_blocks: Vec::new(),
            claimed: BTreeSet::new(),
            items: Vec::new(),
            item_count: 0,
            logged_extents: Vec::new(),
            csum_items: Vec::new(),
            csums_replayed: Vec::new(),
            logged: BTreeMap::new(),
            removed: Vec::new(),
            added: Vec::new(),
            touched: BTreeSet::new(),
            report: ReplayReport::default(),
        }
    }
}

/// One step of replay: `run` changes the running transaction, `check`
/// then states what must hold after it (`Some(what is wrong)` if not: a
/// bug, and the replay is discarded like any other failure).
struct ReplayPass<D> {
    name: &'static str,
    run: fn(&mut FsState<D>, &mut Replay) -> Result<()>,
    check: fn(&mut FsState<D>, &Replay) -> Result<Option<String>>,
}

impl<D: BlockDevice> FsState<D> {
    /// Replay's passes, in order: each relies on the ones before it
    /// (docs/TREE-LOG.md, "Replay"). After bcachefs's recovery-pass table.
    const REPLAY_PASSES: [ReplayPass<D>; 9] = [
        ReplayPass {
            name: "reserve_log_blocks",
            run: Self::reserve_log_blocks,
            check: Self::log_blocks_reserved,
        },
        ReplayPass {
            name: "claim_logged_extents",
            run: Self::claim_logged_extents,
            check: Self::logged_extents_allocated,
        },
        ReplayPass {
            name: "group_by_inode",
            run: Self::group_by_inode,
            check: Self::every_item_grouped,
        },
        ReplayPass {
            name: "replay_inodes",
            run: Self::replay_inodes,
            check: Self::logged_inodes_cached,
        },
        ReplayPass {
            name: "replay_logged_csums",
            run: Self::replay_logged_csums,
            check: Self::replayed_csums_in_tree,
        },
        ReplayPass {
            name: "remove_logged_removals",
            run: Self::remove_logged_removals,
            check: Self::removed_names_gone,
        },
        ReplayPass {
            name: "replay_names",
            run: Self::replay_names,
            check: Self::only_logged_names_left,
        },
        ReplayPass {
            name: "add_logged_entries",
            run: Self::add_logged_entries,
            check: Self::added_names_found,
        },
        ReplayPass {
            name: "fix_touched_counts",
            run: Self::fix_touched_counts,
            check: Self::touched_inodes_named,
        },
    ];

    /// Replays the log the superblock points at into the running
    /// transaction: finds the log trees, then runs [`Self::REPLAY_PASSES`]
    /// in order, checking each one's outcome.
    pub(crate) fn replay_log(&mut self) -> Result<ReplayReport> {
        let store = self.info.forest.store().clone();
        let choice = log_choice::choose_log(store.device(), &self.info.superblock)?;
        if let Some(why) = &choice.newest_rejected {
            eprintln!(
                "birch: {why}; replaying {}",
                match choice.log {
                    Some(log) =>
                        format!("the log before it (log generation {})", log.log_generation),
                    None => "nothing: the last commit had no log".to_string(),
                }
            );
        }
        let Some(log) = choice.log else {
            return Ok(ReplayReport {
                newest_log_incomplete: true,
                ..Default::default()
            });
        };
        // Read repair judges the newest sync's nodes by their listed
        // checksums while replay reads them; once it is over they are
        // reserved, then freed by the replay's commit.
        store.expect_checksums(choice.manifest_checksums);
        self.info.replaying_log = true;
        let replayed = self.replay_from(log);
        self.info.replaying_log = false;
        store.expect_checksums(HashMap::new());
        let mut report = replayed?;
        report.newest_log_incomplete = choice.newest_rejected.is_some();
        Ok(report)
    }

    /// Replays the log whose root tree is at `log`: each subvolume's log
    /// tree into its subvolume, in id order (docs/SNAPSHOTS.md (e)). A log
    /// of a subvolume that is not live in the base commit is a corruption
    /// and discards the whole log (a log is never written for a subvolume
    /// created or deleted after its base).
    fn replay_from(&mut self, log: LogRootRef) -> Result<ReplayReport> {
        // Every node of a log carries the transaction after its base.
        let log_generation = self.info.superblock.generation + 1;
        let root_tree = TreeRoot {
            id: tree_id::LOG_ROOT,
            bytenr: log.bytenr,
            level: log.level,
            generation: log_generation,
            last_snapshot: 0,
        };
        let mut logs = Vec::new();
        for (key, data) in self
            .info
            .forest
            .collect_range(&root_tree, Key::MIN, Key::MAX)?
        {
            if key.objectid != tree_id::LOG || key.item_type != item_type::ROOT_ITEM {
                return Err(corrupt(format!(
                    "log root tree holds {key}, not a log tree"
                )));
            }
            let item = RootItem::decode(&data)
                .map_err(|e| corrupt(format!("log root item {key}: {e}")))?;
            match self.ctx(key.offset) {
                Ok(_) => {}
                Err(Error::NotFound) => {
                    return Err(corrupt(format!(
                        "log root tree holds a log of subvolume {}, which is not a live subvolume",
                        key.offset
                    )))
                }
                Err(e) => return Err(e),
            }
            logs.push((
                key.offset,
                TreeRoot {
                    id: tree_id::LOG,
                    bytenr: item.bytenr,
                    level: item.level,
                    generation: item.generation,
                    last_snapshot: 0,
                },
            ));
        }
        if logs.is_empty() {
            return Err(corrupt("log root tree holds no log tree".into()));
        }
        let mut report = ReplayReport::default();
        let mut claimed = BTreeSet::new();
        let mut reserved_trees = vec![root_tree];
        for (subvol, log_tree) in logs {
            reserved_trees.push(log_tree);
            let mut replay = Replay::new(subvol, log_tree, std::mem::take(&mut reserved_trees));
            replay.claimed = std::mem::take(&mut claimed);
            for pass in Self::REPLAY_PASSES {
                (pass.run)(self, &mut replay)?;
                if let Some(wrong) = (pass.check)(self, &replay)? {
                    return Err(corrupt(format!(
                        "after replay pass {} of subvolume {subvol}'s log: {wrong}",
                        pass.name
                    )));
                }
            }
            claimed = replay.claimed;
            report.add(&replay.report);
        }
        Ok(report)
    }

    /// Takes the log's own nodes out of the free map: nothing this
    /// transaction allocates may overwrite the log before the commit that
    /// supersedes it. A node on space already in use means the log is
    /// damaged.
    fn reserve_log_blocks(&mut self, replay: &mut Replay) -> Result<()> {
        for tree in &replay.reserved_trees {
            for block in self.info.forest.tree_blocks(tree)? {
                if !self.info.forest.alloc_mut().reserve_log_block(block) {
                    return Err(corrupt(format!(
                        "log node {block} overlaps allocated space"
                    )));
                }
                replay.log_blocks.push(block);
            }
        }
        Ok(())
    }

    /// After [`Self::reserve_log_blocks`]: no log node is free.
    fn log_blocks_reserved(&mut self, replay: &Replay) -> Result<Option<String>> {
        let alloc = self.info.forest.alloc();
        Ok(replay
            .log_blocks
            .iter()
            .find(|&&b| alloc.is_free(b, NODE_SIZE as u64))
            .map(|b| format!("log node {b} is still free")))
    }

    /// Reads the log's items and claims each data extent its file extents
    /// point into that the extent tree does not record (written in the
    /// logged transaction): it becomes an extent of this transaction, so
    /// nothing else is allocated over logged data. An unrecorded extent
    /// that is not free means the log is damaged.
    fn claim_logged_extents(&mut self, replay: &mut Replay) -> Result<()> {
        replay.items = self
            .info
            .forest
            .collect_range(&replay.log_tree, Key::MIN, Key::MAX)?;
        replay.item_count = replay.items.len();
        for (key, data) in &replay.items {
            if key.item_type != item_type::EXTENT_DATA {
                continue;
            }
            let Some(disk) = decode_item(key, FileExtent::decode_at(key, data))?.disk_ref() else {
                continue;
            };
            replay
                .logged_extents
                .push((disk.disk_bytenr, disk.disk_num_bytes));
            let extent_key = Key::new(
                disk.disk_bytenr,
                item_type::EXTENT_ITEM,
                disk.disk_num_bytes,
            );
            if replay.claimed.contains(&disk.disk_bytenr)
                || self
                    .info
                    .forest
                    .get(&self.info.roots.extent, &extent_key)?
                    .is_some()
            {
                continue;
            }
            if !self
                .info
                .forest
                .alloc()
                .is_free(disk.disk_bytenr, disk.disk_num_bytes)
            {
                return Err(corrupt(format!(
                    "logged extent {extent_key} overlaps allocated space"
                )));
            }
            self.info.forest.alloc_mut().claim_logged_extent(
                disk.disk_bytenr,
                disk.disk_num_bytes,
                key.objectid,
            );
            replay.claimed.insert(disk.disk_bytenr);
        }
        Ok(())
    }

    /// After [`Self::claim_logged_extents`]: no logged data extent is free.
    fn logged_extents_allocated(&mut self, replay: &Replay) -> Result<Option<String>> {
        let alloc = self.info.forest.alloc();
        Ok(replay
            .logged_extents
            .iter()
            .find(|&&(bytenr, len)| alloc.is_free(bytenr, len))
            .map(|(bytenr, len)| format!("logged data extent {bytenr}+{len} is still free")))
    }

    /// Sorts the log's items by inode into [`LoggedInode`]s, checksum items
    /// aside. An item type the logging side never writes means the log is
    /// damaged.
    fn group_by_inode(&mut self, replay: &mut Replay) -> Result<()> {
        for (key, data) in std::mem::take(&mut replay.items) {
            let logged_type = ItemType::of(&key)
                .map_err(|unknown| corrupt(format!("{unknown} at {key} in the log")))?;
            if logged_type == ItemType::ExtentCsum {
                replay.csum_items.push((key, data));
                continue;
            }
            let entry = replay.logged.entry(key.objectid).or_default();
            entry.items += 1;
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
                ItemType::ExtentData => entry.extents.push((
                    key.offset,
                    decode_item(&key, FileExtent::decode_at(&key, &data))?,
                )),
                ItemType::LogFullExtents => entry.full_extents = true,
                // Its names are logged, and there are none.
                ItemType::LogUnlinked => {
                    entry.names.get_or_insert_with(Vec::new);
                }
                ItemType::DirIndex => {
                    let added = decode_item(&key, DirEntry::decode(&data))?;
                    // A log never holds a subvolume link (docs/SNAPSHOTS.md
                    // (a)): replaying one would name another tree's
                    // inode in this one.
                    if added.subvolume {
                        return Err(corrupt(format!(
                            "log item {key} is a link to subvolume {}: a log never holds one",
                            added.ino
                        )));
                    }
                    entry.dir_added.push(added)
                }
                ItemType::DirLogIndex => entry.dir_removed.push(key.offset),
                // Checksum items were taken aside above.
                ItemType::ExtentCsum
                | ItemType::OrphanItem
                | ItemType::DirItem
                | ItemType::RootItem
                | ItemType::RootBackref
                | ItemType::RootRef
                | ItemType::ExtentItem
                | ItemType::MetadataItem => {
                    return Err(corrupt(format!(
                        "unexpected item type {} at {key} in the log",
                        logged_type.code()
                    )))
                }
            }
        }
        Ok(())
    }

    /// After [`Self::group_by_inode`]: every item the log holds landed in
    /// one inode's group.
    fn every_item_grouped(&mut self, replay: &Replay) -> Result<Option<String>> {
        let grouped: usize =
            replay.logged.values().map(|l| l.items).sum::<usize>() + replay.csum_items.len();
        Ok((grouped != replay.item_count)
            .then(|| format!("{grouped} of the log's {} items grouped", replay.item_count)))
    }

    /// Each logged inode with an inode item gets that item, its logged
    /// xattrs (replacing the committed ones) and its logged extents (over
    /// the committed ones; all of them dropped first when the log holds
    /// the complete set, `LOG_FULL_EXTENTS`). An inode the fs tree does
    /// not have yet is created.
    fn replay_inodes(&mut self, replay: &mut Replay) -> Result<()> {
        for (&ino, log) in &replay.logged {
            let Some(item) = &log.item else { continue };
            replay.report.inodes += 1;
            replay.touched.insert(ino);
            let root = self.ctx(replay.subvol)?;
            root.root.next_ino = root.root.next_ino.max(ino + 1);
            let mut root = self.ctx(replay.subvol)?;
            match root.inode(ino) {
                Ok(inode) => inode.item = item.clone(),
                Err(Error::NotFound) => {
                    root.root.inodes.insert(
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
            self.ctx(replay.subvol)?.update_inode(ino, |_| {})?;
            self.replace_xattrs(replay.subvol, ino, &log.xattrs)?;
            if log.full_extents {
                self.ctx(replay.subvol)?.drop_extents(ino, 0, u64::MAX)?;
            }
            for (offset, extent) in &log.extents {
                let end = match extent.is_inline() {
                    true => SECTOR_SIZE,
                    false => offset + extent.len(),
                };
                self.ctx(replay.subvol)?.drop_extents(ino, *offset, end)?;
                match extent {
                    FileExtent::Inline { .. } | FileExtent::InlineCompressed { .. } => {
                        let root = self.ctx(replay.subvol)?;
                        root.fs.forest.insert(
                            &mut root.root.tree,
                            Key::new(ino, item_type::EXTENT_DATA, 0),
                            extent.encode(),
                        )?
                    }
                    _ => {
                        self.ctx(replay.subvol)?
                            .insert_file_extent(ino, *offset, extent.clone())?
                    }
                }
                replay.report.extents += 1;
            }
        }
        Ok(())
    }

    /// After [`Self::replay_inodes`]: every inode the log holds an item of
    /// is in the inode cache.
    fn logged_inodes_cached(&mut self, replay: &Replay) -> Result<Option<String>> {
        let root = self.ctx(replay.subvol)?;
        Ok(replay
            .logged
            .iter()
            .find(|(ino, log)| log.item.is_some() && !root.root.inodes.contains_key(ino))
            .map(|(ino, _)| format!("logged inode {ino} is not cached")))
    }

    /// Puts the log's checksum items into the checksum tree, those of the
    /// data extents the log's file extents point into (docs/DATA-CHECKSUMS.md).
    fn replay_logged_csums(&mut self, replay: &mut Replay) -> Result<()> {
        let extents: BTreeMap<u64, u64> = replay.logged_extents.iter().copied().collect();
        let items = std::mem::take(&mut replay.csum_items);
        replay.csums_replayed = self.ctx(replay.subvol)?.fs.replay_csums(items, &extents)?;
        Ok(())
    }

    /// After [`Self::replay_logged_csums`]: each checksum item it put back
    /// is in the checksum tree.
    fn replayed_csums_in_tree(&mut self, replay: &Replay) -> Result<Option<String>> {
        let Some(root) = self.info.roots.csum else {
            return Ok(replay
                .csums_replayed
                .first()
                .map(|key| format!("checksum item {key} replayed without a checksum tree")));
        };
        for key in &replay.csums_replayed {
            if self.info.forest.get(&root, key)?.is_none() {
                return Ok(Some(format!(
                    "replayed checksum item {key} is not in the checksum tree"
                )));
            }
        }
        Ok(None)
    }

    /// Removes the entries the log records as removed from logged
    /// directories (DIR_LOG_INDEX) that the committed directory still has.
    fn remove_logged_removals(&mut self, replay: &mut Replay) -> Result<()> {
        for (&dir, log) in &replay.logged {
            for &index in &log.dir_removed {
                let key = Key::new(dir, item_type::DIR_INDEX, index);
                let root = self.ctx(replay.subvol)?;
                let Some(data) = root.fs.forest.get(&root.root.tree, &key)? else {
                    continue;
                };
                let entry = decode_item(&key, DirEntry::decode(&data))?;
                self.ctx(replay.subvol)?
                    .remove_name(dir, &entry.name, entry.ino)?;
                replay.report.names_removed += 1;
                replay.touched.extend([dir, entry.ino]);
                replay.removed.push((dir, entry.name, entry.ino));
            }
        }
        Ok(())
    }

    /// After [`Self::remove_logged_removals`]: no removed name still
    /// names the inode it named.
    fn removed_names_gone(&mut self, replay: &Replay) -> Result<Option<String>> {
        for (dir, name, ino) in &replay.removed {
            if self
                .ctx(replay.subvol)?
                .find_entry(*dir, name)?
                .is_some_and(|e| e.ino == *ino)
            {
                return Ok(Some(format!(
                    "directory {dir} still names inode {ino} {:?}",
                    String::from_utf8_lossy(name)
                )));
            }
        }
        Ok(None)
    }

    /// Each logged inode whose names the log holds gets exactly those
    /// names: names it has that the log lacks go, logged names it lacks
    /// are added (taking the name from whatever inode holds it now) in
    /// parents that exist as directories.
    fn replay_names(&mut self, replay: &mut Replay) -> Result<()> {
        let report = &mut replay.report;
        let touched = &mut replay.touched;
        for (&ino, log) in &replay.logged {
            let Some(wanted) = &log.names else { continue };
            if !self.exists(replay.subvol, ino)? {
                continue;
            }
            let file_type = self.ctx(replay.subvol)?.inode(ino)?.item.file_type();
            let current = self.ctx(replay.subvol)?.names_of(ino)?;
            touched.insert(ino);
            for (parent, name) in &current {
                if !wanted.contains(&(*parent, name.clone())) {
                    self.ctx(replay.subvol)?.remove_name(*parent, name, ino)?;
                    report.names_removed += 1;
                    touched.insert(*parent);
                }
            }
            for (parent, name) in wanted {
                if *parent == ino || current.contains(&(*parent, name.clone())) {
                    continue;
                }
                if !self.exists(replay.subvol, *parent)?
                    || self.ctx(replay.subvol)?.inode(*parent)?.item.file_type()
                        != FileType::Directory
                {
                    report.names_without_parent += 1;
                    continue;
                }
                if let Some(other) = self.ctx(replay.subvol)?.find_entry(*parent, name)? {
                    self.ctx(replay.subvol)?
                        .remove_name(*parent, name, other.ino)?;
                    report.names_removed += 1;
                    touched.insert(other.ino);
                }
                self.ctx(replay.subvol)?
                    .add_name(*parent, name, ino, file_type)?;
                report.names_added += 1;
                touched.extend([*parent, ino]);
            }
        }
        Ok(())
    }

    /// After [`Self::replay_names`]: an inode whose names the log holds
    /// has no name the log lacks.
    fn only_logged_names_left(&mut self, replay: &Replay) -> Result<Option<String>> {
        for (&ino, log) in &replay.logged {
            let Some(wanted) = &log.names else { continue };
            if !self.exists(replay.subvol, ino)? {
                continue;
            }
            if let Some((parent, name)) = self
                .ctx(replay.subvol)?
                .names_of(ino)?
                .into_iter()
                .find(|n| !wanted.contains(n))
            {
                return Ok(Some(format!(
                    "inode {ino} keeps the unlogged name {:?} in {parent}",
                    String::from_utf8_lossy(&name)
                )));
            }
        }
        Ok(None)
    }

    /// Adds the entries the log records as added to logged directories
    /// (DIR_INDEX) whose inode exists and whose name is free, unless the
    /// log holds that inode's names and this is not one of them.
    fn add_logged_entries(&mut self, replay: &mut Replay) -> Result<()> {
        for (&dir, log) in &replay.logged {
            if log.dir_added.is_empty() || !self.exists(replay.subvol, dir)? {
                continue;
            }
            for entry in &log.dir_added {
                if !self.exists(replay.subvol, entry.ino)?
                    || self
                        .ctx(replay.subvol)?
                        .find_entry(dir, &entry.name)?
                        .is_some()
                {
                    continue;
                }
                // An inode whose names are logged has them all in the log.
                let named = replay.logged.get(&entry.ino).and_then(|l| l.names.as_ref());
                if named.is_some_and(|names| !names.contains(&(dir, entry.name.clone()))) {
                    continue;
                }
                let file_type = self.ctx(replay.subvol)?.inode(entry.ino)?.item.file_type();
                self.ctx(replay.subvol)?
                    .add_name(dir, &entry.name, entry.ino, file_type)?;
                replay.report.names_added += 1;
                replay.touched.extend([dir, entry.ino]);
                replay.added.push((dir, entry.name.clone(), entry.ino));
            }
        }
        Ok(())
    }

    /// After [`Self::add_logged_entries`]: every added name names its inode.
    fn added_names_found(&mut self, replay: &Replay) -> Result<Option<String>> {
        for (dir, name, ino) in &replay.added {
            if self
                .ctx(replay.subvol)?
                .find_entry(*dir, name)?
                .is_none_or(|e| e.ino != *ino)
            {
                return Ok(Some(format!(
                    "directory {dir} does not name inode {ino} {:?}",
                    String::from_utf8_lossy(name)
                )));
            }
        }
        Ok(None)
    }

    /// Recomputes link counts, directory sizes and byte counts of every
    /// inode replay touched; one left without a name is deleted.
    fn fix_touched_counts(&mut self, replay: &mut Replay) -> Result<()> {
        for &ino in &replay.touched {
            if !self.exists(replay.subvol, ino)? {
                continue;
            }
            if self.fix_counts(replay.subvol, ino)? {
                replay.report.inodes_deleted += 1;
            }
        }
        Ok(())
    }

    /// After [`Self::fix_touched_counts`]: every touched inode still there
    /// has a link.
    fn touched_inodes_named(&mut self, replay: &Replay) -> Result<Option<String>> {
        for &ino in &replay.touched {
            if self.exists(replay.subvol, ino)?
                && self.ctx(replay.subvol)?.inode(ino)?.item.nlink == 0
            {
                return Ok(Some(format!("inode {ino} is left with no link")));
            }
        }
        Ok(None)
    }

    /// Whether `ino` exists (in the cache or the fs tree).
    fn exists(&mut self, subvol: u64, ino: u64) -> Result<bool> {
        match self.ctx(subvol)?.inode(ino) {
            Ok(_) => Ok(true),
            Err(Error::NotFound) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn replace_xattrs(&mut self, subvol: u64, ino: u64, xattrs: &[Xattr]) -> Result<()> {
        let root = self.ctx(subvol)?;
        for (key, _) in root.fs.forest.collect_range(
            &root.root.tree,
            Key::new(ino, item_type::XATTR_ITEM, 0),
            Key::new(ino, item_type::XATTR_ITEM, u64::MAX),
        )? {
            root.fs.forest.delete(&mut root.root.tree, &key)?;
        }
        let mut buckets: HashMap<u64, Vec<Xattr>> = HashMap::new();
        for x in xattrs {
            buckets
                .entry(crate::format::name_hash(&x.name))
                .or_default()
                .push(x.clone());
        }
        for (hash, bucket) in buckets {
            root.fs.forest.put(
                &mut root.root.tree,
                Key::new(ino, item_type::XATTR_ITEM, hash),
                encode_xattrs(&bucket),
            )?;
        }
        Ok(())
    }

    /// Recomputes nlink (and, for a directory, its size; for a file, its
    /// byte count) from the trees. Deletes the inode if it has no name left.
    /// Returns whether it was deleted.
    fn fix_counts(&mut self, subvol: u64, ino: u64) -> Result<bool> {
        let names = if ino == ROOT_DIR_INO {
            1
        } else {
            self.ctx(subvol)?.names_of(ino)?.len() as u32
        };
        let file_type = self.ctx(subvol)?.inode(ino)?.item.file_type();
        if file_type == FileType::Directory {
            let entries = self.ctx(subvol)?.readdir(ino, 0, usize::MAX)?;
            if names == 0 {
                if !entries.is_empty() {
                    return Err(corrupt(format!(
                        "replay left directory {ino}, which has entries, without a name"
                    )));
                }
                self.ctx(subvol)?.destroy_inode(ino)?;
                return Ok(true);
            }
            let subdirs = entries
                .iter()
                .filter(|e| e.file_type == FileType::Directory)
                .count() as u32;
            let size: u64 = entries.iter().map(|e| e.name.len() as u64).sum();
            self.ctx(subvol)?.update_inode(ino, |i| {
                i.nlink = 2 + subdirs;
                i.size = size;
            })?;
            return Ok(false);
        }
        if names == 0 {
            self.ctx(subvol)?.destroy_inode(ino)?;
            return Ok(true);
        }
        let mut nbytes = 0;
        let root = self.ctx(subvol)?;
        for (key, data) in root.fs.forest.collect_range(
            &root.root.tree,
            Key::new(ino, item_type::EXTENT_DATA, 0),
            Key::new(ino, item_type::EXTENT_DATA, u64::MAX),
        )? {
            nbytes += decode_item(&key, FileExtent::decode_at(&key, &data))?.nbytes();
        }
        self.ctx(subvol)?.update_inode(ino, |i| {
            i.nlink = names;
            i.nbytes = nbytes;
        })?;
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::Replay;
    use crate::device::MemoryDevice;
    use crate::fs::{mkfs, Filesystem, MkfsOptions, MountOptions};

    /// The checks after the name passes see what they claim to: a name
    /// still there, a name missing.
    #[test]
    fn name_pass_checks_find_a_wrong_outcome() {
        let dev = MemoryDevice::new(16 << 20);
        mkfs(&dev, &MkfsOptions::default()).unwrap();
        let fs = Filesystem::open(dev, MountOptions::deterministic()).unwrap();
        let root = fs.root_ino();
        let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
        let mut state = fs.lock();
        let tree = state.subvols.top.tree;
        let mut replay = Replay::new(tree.id, tree, Vec::new());
        replay.removed.push((root, b"f".to_vec(), f));
        replay.added.push((root, b"g".to_vec(), f));
        let still_there = state.removed_names_gone(&replay).unwrap();
        assert!(still_there.is_some_and(|w| w.contains("still names inode")));
        let missing = state.added_names_found(&replay).unwrap();
        assert!(missing.is_some_and(|w| w.contains("does not name inode")));

        let tree = state.subvols.top.tree;
        let mut replay = Replay::new(tree.id, tree, Vec::new());
        replay.removed.push((root, b"g".to_vec(), f));
        replay.added.push((root, b"f".to_vec(), f));
        assert_eq!(state.removed_names_gone(&replay).unwrap(), None);
        assert_eq!(state.added_names_found(&replay).unwrap(), None);
    }
}
