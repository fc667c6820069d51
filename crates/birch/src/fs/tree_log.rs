//! The tree-log: fsync by logging one inode (or directory) into a
//! per-subvolume log tree instead of committing. docs/TREE-LOG.md is the
//! design; this file is the logging half (replay is in replay.rs, the log
//! sync protocol in log_sync.rs).

use super::decode::decode_item;
use super::delayed_items::RetiredRecords;
use super::log_state::{FallbackReason, LogTrees, NewNameSync};
use super::root::RootCtx;
use super::state::FsState;
use crate::alloc::TransactionSpace;
use crate::btree::{DataRef, TreeKind, TreeRoot};
use crate::device::BlockDevice;
use crate::error::Result;
use crate::format::{
    item_type, tree_id, DirEntry, FileExtent, FileType, InodeItem, Key, LeafItem, RootItem,
};
use std::collections::BTreeMap;
use std::time::Instant;

/// The log trees are the forest's [`TreeKind::Logged`] trees: written by
/// log syncs, never recorded in the extent tree. Subvolume trees are
/// [`TreeKind::Shareable`] (docs/SNAPSHOTS.md (b)).
pub(super) fn tree_kind(tree: u64) -> TreeKind {
    if tree == tree_id::LOG || tree == tree_id::LOG_ROOT {
        TreeKind::Logged
    } else if tree_id::is_subvolume(tree) {
        TreeKind::Shareable
    } else {
        TreeKind::Committed
    }
}

/// The data extent reference a leaf item of a subvolume tree holds: a
/// Regular, Prealloc or Compressed `EXTENT_DATA` (an undecodable one holds none, and
/// `birch check` reports it).
pub(super) fn leaf_data_ref(item: &LeafItem) -> Option<DataRef> {
    if item.key.item_type != item_type::EXTENT_DATA {
        return None;
    }
    match FileExtent::decode_at(&item.key, &item.data).ok()? {
        FileExtent::Regular {
            disk_bytenr,
            disk_num_bytes,
            ..
        }
        | FileExtent::Prealloc {
            disk_bytenr,
            disk_num_bytes,
            ..
        }
        | FileExtent::Compressed {
            disk_bytenr,
            disk_num_bytes,
            ..
        } => Some(DataRef {
            bytenr: disk_bytenr,
            num_bytes: disk_num_bytes,
            owner: item.key.objectid,
        }),
        FileExtent::Inline { .. } | FileExtent::InlineCompressed { .. } => None,
    }
}

/// What an fsync needs after logging.
pub(crate) enum LogOutcome {
    /// Already durable: nothing to wait for.
    Nothing,
    /// Durable once this log transaction is.
    Logged(u64),
    /// The log cannot express it (the reason is counted): commit.
    NeedCommit,
}

/// Deepest chain of new directories logged as ancestors.
const MAX_NEW_ANCESTORS: usize = 64;

fn full_range(ino: u64, t: u8) -> (Key, Key) {
    (Key::new(ino, t, 0), Key::new(ino, t, u64::MAX))
}

impl<D: BlockDevice> RootCtx<'_, D> {
    /// The commit the running transaction's log is relative to. (While a
    /// commit is being written, that is the one in flight, not the last
    /// durable one.)
    fn committed_generation(&self) -> u64 {
        self.fs.forest.transid() - 1
    }

    /// Whether the inode was created in the running transaction (so the
    /// committed tree does not have it).
    fn is_new(&mut self, ino: u64) -> Result<bool> {
        Ok(self.inode(ino)?.item.generation > self.committed_generation())
    }

    /// This root's log tree, if it was logged into in this transaction.
    fn own_log(&self) -> Option<&TreeRoot> {
        let trees = self.fs.log.trees.as_ref()?;
        trees.logs.get(&self.root.tree.id)
    }

    /// This root's log tree (and the log root tree), created on first use
    /// in this transaction.
    fn own_log_created(&mut self) -> Result<TreeRoot> {
        if let Some(log) = self.own_log() {
            return Ok(*log);
        }
        // The first log of a transaction is allocated before the log root
        // tree, so a log sync of one root writes its log's nodes first (the
        // layout log syncs had before there was a log per root).
        let log = self.fs.forest.create_tree(tree_id::LOG)?;
        if self.fs.log.trees.is_none() {
            let root = self.fs.forest.create_tree(tree_id::LOG_ROOT)?;
            self.fs.log.trees = Some(LogTrees {
                logs: BTreeMap::new(),
                root,
            });
        }
        let id = self.root.tree.id;
        if let Some(trees) = self.fs.log.trees.as_mut() {
            trees.logs.insert(id, log);
        }
        Ok(log)
    }

    /// Stores this root's log tree after a change moved its root node.
    fn set_own_log(&mut self, log: TreeRoot) {
        let id = self.root.tree.id;
        if let Some(trees) = self.fs.log.trees.as_mut() {
            trees.logs.insert(id, log);
        }
    }

    fn log_put(&mut self, key: Key, data: Vec<u8>) -> Result<()> {
        // A logged extent brings its checksums (docs/DATA-CHECKSUMS.md).
        if key.item_type == item_type::EXTENT_DATA {
            for (csum_key, csums) in self.fs.csums_to_log(&key, &data)? {
                self.log_put(csum_key, csums)?;
            }
        }
        let mut log = self.own_log_created()?;
        let result = self.fs.forest.put(&mut log, key, data);
        self.set_own_log(log);
        result
    }

    fn log_delete(&mut self, key: &Key) -> Result<()> {
        let Some(mut log) = self.own_log().copied() else {
            return Ok(());
        };
        let result = self.fs.forest.delete(&mut log, key).map(|_| ());
        self.set_own_log(log);
        result
    }

    fn log_items(&self, start: Key, end: Key) -> Result<Vec<(Key, Vec<u8>)>> {
        match self.own_log() {
            Some(log) => self.fs.forest.collect_range(log, start, end),
            None => Ok(Vec::new()),
        }
    }

    fn log_delete_range(&mut self, start: Key, end: Key) -> Result<()> {
        for (key, _) in self.log_items(start, end)? {
            self.log_delete(&key)?;
        }
        Ok(())
    }

    /// Copies the fs tree's items in `[start, end]` into the log.
    fn log_copy_range(&mut self, start: Key, end: Key) -> Result<()> {
        for (key, data) in self.fs.forest.collect_range(&self.root.tree, start, end)? {
            self.log_put(key, data)?;
        }
        Ok(())
    }

    fn log_inode_item(&mut self, ino: u64, item: InodeItem) -> Result<()> {
        self.log_put(Key::new(ino, item_type::INODE_ITEM, 0), item.encode())
    }

    /// Logs the inode's current names, replacing what the log had. From
    /// now on name changes of this inode update the log.
    ///
    /// Replay gives a logged inode exactly its logged names and takes each
    /// of them from whichever inode held it in the last commit. So every
    /// other inode involved in a name this inode took or gave up in this
    /// transaction is logged too (its names, in exists mode), or replay
    /// would strip it of a durable name without giving it its new one:
    /// - the committed owner of a name this inode now has (rename away
    ///   and reuse, rename over, link): `mv a/foo a/bar; touch a/foo;
    ///   fsync a/foo` must keep `a/bar`;
    /// - the inode now holding a committed name this inode gave up:
    ///   `mv d/foo d/bar; touch d/foo; fsync d/bar` keeps the new `d/foo`.
    ///
    /// Those inodes' own names may involve further inodes (swaps through
    /// a third name, chains of renames): a worklist follows them all.
    pub(crate) fn log_names(&mut self, ino: u64) -> Result<()> {
        let transid = self.fs.forest.transid();
        self.log_own_names(ino)?;
        let mut todo = self.name_conflicts(ino)?;
        while let Some(other) = todo.pop() {
            let live = match self.inode(other) {
                Ok(i) => i.item.nlink > 0,
                Err(crate::Error::NotFound) => false,
                Err(e) => return Err(e),
            };
            // An unlinked inode has no name to keep; one whose names are
            // logged is kept current by the hooks (invariant L1).
            if !live || self.inode(other)?.log.names_logged_trans == transid {
                continue;
            }
            self.fs.log_stats.name_conflict_logs += 1;
            self.log_exists_item(other)?;
            self.log_own_names(other)?;
            if let Some(reason) = self.log_new_ancestors(other)? {
                // Its new name would be unreachable at replay while its
                // committed one is taken: no log may be synced until the
                // commit.
                self.fs.log.force_commit.get_or_insert(reason);
            }
            todo.extend(self.name_conflicts(other)?);
        }
        Ok(())
    }

    /// Copies the inode's current names (INODE_REF and INODE_EXTREF items,
    /// adjacent in key order) into the log (nothing else).
    fn log_own_names(&mut self, ino: u64) -> Result<()> {
        let start = Key::new(ino, item_type::INODE_REF, 0);
        let end = Key::new(ino, item_type::INODE_EXTREF, u64::MAX);
        // Nothing of this inode in the log yet: nothing to drop (seed 001).
        let logged_before = self.inode(ino)?.log.names_logged_trans == self.fs.forest.transid();
        if logged_before {
            self.log_delete_range(start, end)?;
        }
        self.log_copy_range(start, end)?;
        // A committed inode with no name left would keep its committed
        // names at replay (the log holds no name item of it): the marker
        // says it has none (generic/764). Once it has a name again (an
        // O_TMPFILE-style relink), its name items say so.
        let unlinked = Key::new(ino, item_type::LOG_UNLINKED, 0);
        if self.inode(ino)?.item.nlink == 0 && !self.is_new(ino)? {
            self.log_put(unlinked, Vec::new())?;
        } else if logged_before {
            self.log_delete(&unlinked)?;
        }
        self.inode(ino)?.log.names_logged_trans = self.fs.forest.transid();
        Ok(())
    }

    /// The other inodes whose names replay would change along with
    /// `ino`'s (see [`Self::log_names`]).
    fn name_conflicts(&mut self, ino: u64) -> Result<Vec<u64>> {
        let mut others = Vec::new();
        for (parent, name) in self.names_of(ino)? {
            if let Some(owner) = self.root.delayed.committed_owner_removed(parent, &name) {
                if owner != ino {
                    others.push(owner);
                }
            }
        }
        for (dir, name) in self.root.delayed.committed_names_removed(ino).to_vec() {
            match self.find_entry(dir, &name) {
                Ok(Some(entry)) if entry.ino != ino => others.push(entry.ino),
                Ok(_) | Err(crate::Error::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(others)
    }

    /// Logs that the inode exists with its names: what a directory's
    /// new entry, or a new name of a logged inode, needs at replay. A new
    /// inode gets an item (empty, for a file: its data is not promised);
    /// one whose state is logged keeps that.
    pub(crate) fn log_exists(&mut self, ino: u64) -> Result<()> {
        self.log_exists_item(ino)?;
        self.log_names(ino)
    }

    /// The item half of [`Self::log_exists`].
    fn log_exists_item(&mut self, ino: u64) -> Result<()> {
        let transid = self.fs.forest.transid();
        if self.is_new(ino)? && self.inode(ino)?.log.state_logged_trans != transid {
            let mut item = self.inode(ino)?.item.clone();
            match item.file_type() {
                FileType::Directory => {}
                // A symlink is nothing without its target: log it whole.
                FileType::Symlink => {
                    let (start, end) = full_range(ino, item_type::EXTENT_DATA);
                    self.log_copy_range(start, end)?;
                }
                _ => {
                    item.size = 0;
                    item.nbytes = 0;
                }
            }
            self.log_inode_item(ino, item)?;
        }
        Ok(())
    }

    /// Logs `ino` in exists mode again if its names are in the log: for an
    /// inode that changed after a hook logged it (a symlink whose target is
    /// written after its name).
    pub(crate) fn log_exists_again(&mut self, ino: u64) -> Result<()> {
        if self.own_log().is_some()
            && self.inode(ino)?.log.names_logged_trans == self.fs.forest.transid()
        {
            self.log_exists(ino)?;
        }
        Ok(())
    }

    /// Logs, in exists mode, every directory on the way from `ino` up to
    /// one the committed tree has, so `ino` has a reachable name after
    /// replay. Ancestors are not marked as state-logged (seed 000): a
    /// later fsync of one still logs its entries.
    pub(crate) fn log_new_ancestors(&mut self, ino: u64) -> Result<Option<FallbackReason>> {
        let transid = self.fs.forest.transid();
        let mut todo = self.parents_of(ino)?;
        let mut depth = 0;
        while let Some(dir) = todo.pop() {
            if !self.is_new(dir)? || self.inode(dir)?.log.names_logged_trans == transid {
                continue;
            }
            depth += 1;
            if depth > MAX_NEW_ANCESTORS {
                return Ok(Some(FallbackReason::AncestorChain));
            }
            self.log_exists(dir)?;
            todo.extend(self.parents_of(dir)?);
        }
        Ok(None)
    }

    /// Whether a directory above `ino` (on any of its paths) was renamed in
    /// this transaction. A renamed directory stays in the inode cache until
    /// the commit (it is dirty), so only cached ones need looking at.
    fn ancestor_renamed(&mut self, ino: u64) -> Result<bool> {
        let transid = self.fs.forest.transid();
        let mut todo = self.parents_of(ino)?;
        let mut seen = std::collections::HashSet::new();
        while let Some(dir) = todo.pop() {
            if !seen.insert(dir) {
                continue;
            }
            if self
                .root
                .inodes
                .get(&dir)
                .is_some_and(|i| i.log.renamed_trans == transid)
            {
                return Ok(true);
            }
            if dir != crate::format::ROOT_DIR_INO {
                todo.extend(self.parents_of(dir)?);
            }
        }
        Ok(false)
    }

    /// The directories `ino` has names in.
    fn parents_of(&self, ino: u64) -> Result<Vec<u64>> {
        let mut parents: Vec<u64> = self
            .names_of(ino)?
            .into_iter()
            .map(|(parent, _)| parent)
            .filter(|&parent| parent != ino)
            .collect();
        parents.sort_unstable();
        parents.dedup();
        Ok(parents)
    }

    /// Logs a file (or symlink, device, fifo): item from memory (seed 001),
    /// names, xattrs, and its extents in full or just the written ranges.
    fn log_file(&mut self, ino: u64) -> Result<()> {
        let transid = self.fs.forest.transid();
        let item = self.inode(ino)?.item.clone();
        let log = self.inode(ino)?.log.clone();
        let first_this_trans = log.state_logged_trans != transid;
        let full = log.full_sync || (first_this_trans && self.is_new(ino)?);
        if full && self.fs.options.ablation.flush_delayed_inode_on_full_log {
            // Seed 001 switched off (docs/ABLATION.md): the delayed inode
            // goes into the fs tree first; the log still takes the item
            // from memory.
            self.flush_delayed_inode(ino)?;
        }
        self.log_inode_item(ino, item)?;
        self.log_xattrs(ino, !first_this_trans)?;
        let (es, ee) = full_range(ino, item_type::EXTENT_DATA);
        if full {
            // First log in this transaction: nothing logged to drop (seed 001).
            if !first_this_trans {
                self.log_delete_range(es, ee)?;
            }
            self.log_copy_range(es, ee)?;
            self.log_put(Key::new(ino, item_type::LOG_FULL_EXTENTS, 0), Vec::new())?;
            self.fs.log_stats.full_logs += 1;
        } else {
            let ranges = if log.ranges_trans == transid {
                log.dirty_ranges
            } else {
                Vec::new()
            };
            for (start, end) in ranges {
                self.log_extent_range(ino, start, end)?;
            }
            self.fs.log_stats.fast_logs += 1;
        }
        let seq = self.inode(ino)?.change_seq;
        let inode = self.inode(ino)?;
        inode.log.state_logged_trans = transid;
        inode.log.logged_change_seq = seq;
        inode.log.full_sync = false;
        inode.log.dirty_ranges.clear();
        inode.log.ranges_trans = transid;
        self.log_names(ino)
    }

    /// Copies the inode's xattrs into the log: replay replaces a logged
    /// inode's xattrs with the logged ones. `replace`: the log may hold
    /// older ones (the inode's state was logged in this transaction).
    fn log_xattrs(&mut self, ino: u64, replace: bool) -> Result<()> {
        let (xs, xe) = full_range(ino, item_type::XATTR_ITEM);
        if replace {
            self.log_delete_range(xs, xe)?;
        }
        self.log_copy_range(xs, xe)
    }

    /// Makes the log's extents of `[start, end)` equal the fs tree's,
    /// widening the range over extents that stick out of it.
    ///
    /// A file's extents do not overlap one another, in the fs tree and in
    /// the log alike (this function keeps it so: it replaces every log
    /// extent touching the range by the fs tree's extents covering it), so
    /// only the last extent starting at or before `lo` can reach into the
    /// range from below. Each scan starts there, not at offset 0: a file
    /// appended to and fsynced 4 KiB at a time would otherwise rescan all
    /// its extents, twice, on every fsync.
    fn log_extent_range(&mut self, ino: u64, start: u64, end: u64) -> Result<()> {
        let (mut lo, mut hi) = (start, end);
        loop {
            let (before_lo, before_hi) = (lo, hi);
            let log_from = match self.own_log() {
                Some(log) => self.extent_reaching_from_below(log, ino, lo)?,
                None => lo,
            };
            for (key, data) in self.log_items(
                Key::new(ino, item_type::EXTENT_DATA, log_from),
                Key::new(ino, item_type::EXTENT_DATA, hi.saturating_sub(1)),
            )? {
                let e = decode_item(&key, FileExtent::decode_at(&key, &data))?;
                if key.offset + e.len() > lo {
                    self.log_delete(&key)?;
                    lo = lo.min(key.offset);
                    hi = hi.max(key.offset + e.len());
                }
            }
            let fs_from = self.extent_reaching_from_below(&self.root.tree, ino, lo)?;
            for (key, data) in self.fs.forest.collect_range(
                &self.root.tree,
                Key::new(ino, item_type::EXTENT_DATA, fs_from),
                Key::new(ino, item_type::EXTENT_DATA, hi.saturating_sub(1)),
            )? {
                let e = decode_item(&key, FileExtent::decode_at(&key, &data))?;
                if key.offset + e.len() > lo {
                    lo = lo.min(key.offset);
                    hi = hi.max(key.offset + e.len());
                    self.log_put(key, data)?;
                }
            }
            if (lo, hi) == (before_lo, before_hi) {
                return Ok(());
            }
        }
    }

    /// The file offset of `ino`'s last extent in `tree` starting at or
    /// before `offset` (the only one that can cover `offset`), or `offset`
    /// itself when there is none.
    fn extent_reaching_from_below(&self, tree: &TreeRoot, ino: u64, offset: u64) -> Result<u64> {
        let probe = Key::new(ino, item_type::EXTENT_DATA, offset);
        Ok(match self.fs.forest.last_at_or_before(tree, &probe)? {
            Some((key, _)) if key.objectid == ino && key.item_type == item_type::EXTENT_DATA => {
                key.offset
            }
            _ => offset,
        })
    }

    /// Logs a directory and, as btrfs does, every directory created in
    /// this transaction below it through new entries, with their entries:
    /// `mkdir -p d/x/y; ln foo d/x/y/l; fsync d` persists `d/x/y/l`. (The
    /// inodes those entries name are logged in exists mode; their other
    /// names in new subdirectories then have a parent at replay.)
    ///
    /// The walk follows every new subdirectory the directory gained in the
    /// transaction, not only those added since its last log: one logged
    /// earlier (by an earlier fsync, or as an entry added to a logged
    /// directory) may have gained entries since, and so may its own new
    /// subdirectories (`mkdir d; sync; touch d/f; fsync d; mkdir d/x; touch
    /// d/x/q; fsync d` must keep `d/x/q`). Each is logged again only if it
    /// changed since its last log.
    fn log_dir(&mut self, dir: u64) -> Result<()> {
        let transid = self.fs.forest.transid();
        let mut todo = vec![dir];
        let mut seen = std::collections::HashSet::new();
        while let Some(d) = todo.pop() {
            if !seen.insert(d) {
                continue;
            }
            let inode = self.inode(d)?;
            let unchanged = inode.log.state_logged_trans == transid
                && inode.log.logged_change_seq == inode.change_seq;
            if d == dir || !unchanged {
                self.log_one_dir(d)?;
            }
            let new_subdirs: Vec<u64> = self
                .root
                .delayed
                .txn_changes(d)
                .map(|c| {
                    c.insertions
                        .values()
                        .filter(|e| e.file_type == FileType::Directory)
                        .map(|e| e.ino)
                        .collect()
                })
                .unwrap_or_default();
            for sub in new_subdirs {
                if self.is_new(sub)? {
                    todo.push(sub);
                }
            }
        }
        Ok(())
    }

    /// Logs one directory: its item and names, and its entry changes in
    /// this transaction straight from the delayed dir-index record (seed
    /// 003: nothing is flushed into the fs tree for this). Only the changes
    /// since the directory was last logged are written.
    fn log_one_dir(&mut self, dir: u64) -> Result<()> {
        let transid = self.fs.forest.transid();
        let first_this_trans = self.inode(dir)?.log.state_logged_trans != transid;
        let item = self.inode(dir)?.item.clone();
        self.log_inode_item(dir, item)?;
        self.log_xattrs(dir, !first_this_trans)?;
        // Only the indexes changed since the last log are looked up: the
        // transaction's record of the directory holds every entry created
        // in it (10,000 in seed 003), and copying it per fsync made a
        // directory's fsync cost grow with the directory.
        let unlogged: Vec<(u64, Option<DirEntry>, bool)> =
            if self.fs.options.ablation.flush_delayed_dir_on_log {
                self.unlogged_entries_from_tree(dir)?
            } else {
                self.unlogged_entries(dir)
            };
        let mut added = Vec::new();
        for (index, inserted, deleted) in unlogged {
            if let Some(entry) = inserted {
                self.log_put(Key::new(dir, item_type::DIR_INDEX, index), entry.encode())?;
                added.push(entry.ino);
            } else {
                self.log_delete(&Key::new(dir, item_type::DIR_INDEX, index))?;
                if deleted {
                    self.log_put(Key::new(dir, item_type::DIR_LOG_INDEX, index), Vec::new())?;
                    // Replay drops this committed name: the inode takes its
                    // other (or new, for a rename out) names along.
                    if let Some(ino) = self.root.delayed.removed_inode(dir, index) {
                        if self.inode(ino).is_ok_and(|i| i.item.nlink > 0) {
                            added.push(ino);
                        }
                    }
                }
            }
        }
        // Each new entry's inode must exist at replay, and lose any name it
        // had before (a rename into this directory).
        for ino in added {
            self.log_exists(ino)?;
        }
        let seq = self.inode(dir)?.change_seq;
        let filling = self.fs.log.filling;
        let inode = self.inode(dir)?;
        inode.log.state_logged_trans = transid;
        inode.log.logged_change_seq = seq;
        // A subdirectory logged along with its parent is durable with the
        // same log transaction: its own fsync, finding it unchanged, waits
        // for that one.
        inode.log.logged_in = filling;
        self.fs.log_stats.dir_logs += 1;
        self.log_names(dir)
    }

    /// The indexes of `dir` changed since its last log, each with the
    /// entry to add (from the transaction's record) and whether it removed
    /// a committed entry. Forgets them.
    fn unlogged_entries(&mut self, dir: u64) -> Vec<(u64, Option<DirEntry>, bool)> {
        let indexes = self.root.delayed.take_unlogged(dir);
        let changes = self.root.delayed.txn_changes(dir);
        indexes
            .into_iter()
            .map(|index| {
                let inserted = changes.and_then(|c| c.insertions.get(&index)).cloned();
                let deleted = changes.is_some_and(|c| c.deletions.contains(&index));
                (index, inserted, deleted)
            })
            .collect()
    }

    /// [`Self::unlogged_entries`] as before seed 003 (docs/ABLATION.md):
    /// the directory's delayed items are flushed into the fs tree, and each
    /// changed index is looked up there; an index the tree lacks was
    /// removed.
    fn unlogged_entries_from_tree(
        &mut self,
        dir: u64,
    ) -> Result<Vec<(u64, Option<DirEntry>, bool)>> {
        self.flush_delayed_dir(dir)?;
        let indexes = self.root.delayed.take_unlogged(dir);
        let mut entries = Vec::with_capacity(indexes.len());
        for index in indexes {
            let key = Key::new(dir, item_type::DIR_INDEX, index);
            let inserted = match self.fs.forest.get(&self.root.tree, &key)? {
                Some(data) => Some(decode_item(&key, DirEntry::decode(&data))?),
                None => None,
            };
            let deleted = self
                .root
                .delayed
                .txn_changes(dir)
                .is_some_and(|c| c.deletions.contains(&index));
            entries.push((index, inserted, deleted));
        }
        Ok(entries)
    }

    /// The logging half of fsync: what must be logged for `ino`, logged.
    pub(crate) fn log_for_fsync(&mut self, ino: u64) -> Result<LogOutcome> {
        let started = Instant::now();
        let outcome = self.log_for_fsync_timed(ino);
        self.fs.log_stats.logging_nanos += started.elapsed().as_nanos() as u64;
        outcome
    }

    fn log_for_fsync_timed(&mut self, ino: u64) -> Result<LogOutcome> {
        let transid = self.fs.forest.transid();
        if let Some(reason) = self.fs.log.force_commit {
            self.count_fallback(reason);
            return Ok(LogOutcome::NeedCommit);
        }
        if self.root.is_deleted() {
            // A deleted subvolume's inode, still open: the deletion is in
            // the last sealed commit (in the running transaction it forced
            // the commit above), which the caller waits for, and nothing
            // of this tree will ever be seen again. A log of it would name
            // a root that is not live (replay refuses such a log), and a
            // commit would only write a tree the cleaner drops.
            self.fs.log_stats.noop_fsyncs += 1;
            return Ok(LogOutcome::Nothing);
        }
        if self.created_after_log_base() {
            self.count_fallback(FallbackReason::Subvolume);
            return Ok(LogOutcome::NeedCommit);
        }
        let inode = self.inode(ino)?;
        if inode.log.removed_committed_dir_trans == transid {
            self.count_fallback(FallbackReason::RemovedDirectory);
            return Ok(LogOutcome::NeedCommit);
        }
        let inode = self.inode(ino)?;
        let has_pages = !inode.pages.is_empty();
        let changed_in_trans = inode.item.transid >= transid || has_pages;
        if inode.item.nlink == 0 && changed_in_trans {
            return self.log_unlinked(ino);
        }
        if inode.item.nlink == 0 || !changed_in_trans {
            // Unlinked in an earlier transaction (an orphan the last
            // commit holds), or already committed.
            self.fs.log_stats.noop_fsyncs += 1;
            return Ok(LogOutcome::Nothing);
        }
        let unchanged = inode.log.state_logged_trans == transid
            && inode.log.logged_change_seq == inode.change_seq
            && !has_pages;
        let is_dir = inode.item.file_type() == FileType::Directory;
        // A file whose names changed brings its directories' changes since
        // its last log (see `log_dirs_of_changed_names`), even unchanged.
        if unchanged && (is_dir || !self.names_changed_in_trans(ino)?) {
            // Logged and unchanged since: durable once that log is.
            return Ok(LogOutcome::Logged(self.inode(ino)?.log.logged_in));
        }
        if self.ancestor_renamed(ino)? {
            self.count_fallback(FallbackReason::RenamedAncestor);
            return Ok(LogOutcome::NeedCommit);
        }
        if is_dir {
            self.log_dir(ino)?;
        } else {
            // fsync wrote the data back without the state lock before it
            // came here; what a racing write left unpublished only the
            // commit writes (docs/DELALLOC.md, "Writeback without the
            // state lock"; fsync retries first, so this is rare and not
            // counted as a fallback).
            if self.has_unpublished_data(ino)? {
                return Ok(LogOutcome::NeedCommit);
            }
            self.log_file(ino)?;
            if let Some(reason) = self.log_dirs_of_changed_names(ino)? {
                self.count_fallback(reason);
                return Ok(LogOutcome::NeedCommit);
            }
        }
        if let Some(reason) = self.log_new_ancestors(ino)? {
            self.count_fallback(reason);
            return Ok(LogOutcome::NeedCommit);
        }
        let filling = self.fs.log.filling;
        self.inode(ino)?.log.logged_in = filling;
        self.fs.log.filling_dirty = true;
        self.fs.log_stats.logged_fsyncs += 1;
        Ok(LogOutcome::Logged(filling))
    }

    /// fsync of an inode with no name left (open, unlinked in this
    /// transaction). Replay must not bring back a name it lost: a
    /// committed one (the log holds no name of it, so replay would keep
    /// those: generic/764), or one logged earlier in this transaction
    /// (the hooks updated the log, but only a log sync makes that
    /// durable). An inode that lost no name the last commit or the log
    /// holds (new and never logged, or unlinked before the last commit,
    /// an orphan there) has nothing to log.
    fn log_unlinked(&mut self, ino: u64) -> Result<LogOutcome> {
        let names_logged = self.inode(ino)?.log.names_logged_trans == self.fs.forest.transid();
        let lost_committed_name = !self.root.delayed.committed_names_removed(ino).is_empty();
        if !names_logged && !lost_committed_name {
            self.fs.log_stats.noop_fsyncs += 1;
            return Ok(LogOutcome::Nothing);
        }
        // Its names (none: `LOG_UNLINKED`), and the inodes now holding
        // names it gave up.
        self.log_names(ino)?;
        let filling = self.fs.log.filling;
        self.inode(ino)?.log.logged_in = filling;
        self.fs.log.filling_dirty = true;
        self.fs.log_stats.logged_fsyncs += 1;
        Ok(LogOutcome::Logged(filling))
    }

    /// Whether the file gained a name by a link or lost a committed one in
    /// this transaction: its fsync then logs those names' directories.
    fn names_changed_in_trans(&mut self, ino: u64) -> Result<bool> {
        let transid = self.fs.forest.transid();
        Ok(self.inode(ino)?.log.linked_trans == transid
            || !self.root.delayed.committed_names_removed(ino).is_empty())
    }

    /// Logs, after a file, the directories whose entries replay changes
    /// along with its names, as btrfs logs a file's parents
    /// (`btrfs_log_all_parents`), so that their other changes in this
    /// transaction are not half replayed:
    /// - after a link, every directory it has a name in: `ln d/foo
    ///   d/foo_link; ln d/bar d/bar_link; fsync d/bar` keeps `foo_link`
    ///   (generic/104), and entries moved into the directory move
    ///   (generic/343). btrfs commits instead;
    /// - every directory it lost a committed name in: replay removes that
    ///   name, and `unlink b/foo_link; mv b/bar c/; fsync a/foo` must not
    ///   leave `bar` in `b` (generic/336). btrfs commits here, since `bar`
    ///   was renamed out of `b`; birch logs `bar`'s new name with `b`.
    ///
    /// Returns why the log cannot express it, if it cannot.
    fn log_dirs_of_changed_names(&mut self, ino: u64) -> Result<Option<FallbackReason>> {
        let transid = self.fs.forest.transid();
        let mut dirs: Vec<u64> = self
            .root
            .delayed
            .committed_names_removed(ino)
            .iter()
            .map(|(dir, _)| *dir)
            .collect();
        if self.inode(ino)?.log.linked_trans == transid {
            dirs.extend(self.parents_of(ino)?);
        }
        dirs.sort_unstable();
        dirs.dedup();
        for dir in dirs {
            // A directory removed since is gone (or an orphan) at replay
            // as well.
            let inode = match self.inode(dir) {
                Ok(inode) => inode,
                Err(crate::Error::NotFound) => continue,
                Err(e) => return Err(e),
            };
            if inode.item.nlink == 0 || inode.item.file_type() != FileType::Directory {
                continue;
            }
            if inode.log.removed_committed_dir_trans == transid {
                return Ok(Some(FallbackReason::RemovedDirectory));
            }
            if self.ancestor_renamed(dir)? {
                return Ok(Some(FallbackReason::RenamedAncestor));
            }
            self.log_dir(dir)?;
            if let Some(reason) = self.log_new_ancestors(dir)? {
                return Ok(Some(reason));
            }
        }
        Ok(None)
    }

    /// Whether this subvolume was created after the commit the log is
    /// relative to: replay could not find its root item, and a log naming
    /// an unknown root is discarded whole (docs/SNAPSHOTS.md (e)).
    fn created_after_log_base(&self) -> bool {
        self.root
            .item
            .is_some_and(|item| item.otransid > self.committed_generation())
    }

    pub(crate) fn count_fallback(&mut self, reason: FallbackReason) {
        match reason {
            FallbackReason::AncestorChain => self.fs.log_stats.fallback_ancestor_chain += 1,
            FallbackReason::RemovedDirectory => self.fs.log_stats.fallback_removed_directory += 1,
            FallbackReason::RenamedAncestor => self.fs.log_stats.fallback_renamed_ancestor += 1,
            FallbackReason::Subvolume => self.fs.log_stats.fallback_subvolume += 1,
        }
    }

    // ----- keeping logged inodes current (seed 000) -----

    /// `ino` gained or lost a name. If its names are in the log, the log
    /// gets the new set at once — without a log sync, and without marking
    /// any ancestor as logged, so a later fsync of a parent still logs it.
    pub(crate) fn log_names_changed(&mut self, ino: u64) -> Result<()> {
        if self.own_log().is_none()
            || self.inode(ino)?.log.names_logged_trans != self.fs.forest.transid()
        {
            return Ok(());
        }
        self.log_names(ino)?;
        // The logged state must not be older than the logged names in a
        // way a workload can see: `setfattr -x user.a f; ln f f_link`
        // after an fsync of `f` must not replay `f_link` with `user.a`
        // (generic/066; btrfs logs the inode's xattrs with its new name).
        let transid = self.fs.forest.transid();
        if self.inode(ino)?.log.state_logged_trans == transid {
            self.log_xattrs(ino, true)?;
        }
        // A chain too deep is found again (and committed) by the next
        // fsync of this inode.
        let too_deep = self.log_new_ancestors(ino)?.is_some();
        if self.fs.options.ablation.sync_log_on_new_name {
            // Seed 000 switched off: the request syncs the log (or commits)
            // before it returns (docs/ABLATION.md).
            self.fs.log.filling_dirty = true;
            self.fs.log.new_name_sync = Some(if too_deep || self.fs.log.force_commit.is_some() {
                NewNameSync::Commit
            } else {
                NewNameSync::Log(self.fs.log.filling)
            });
        }
        Ok(())
    }

    /// Entry `index` naming `ino` was added to `dir`. If the directory's
    /// entries are in the log, the addition goes there at once (with the
    /// inode's names), so the log never holds a removal without the entry
    /// that replaced it (rename over an entry of a logged directory).
    pub(crate) fn log_entry_added(&mut self, dir: u64, index: u64, entry: &DirEntry) -> Result<()> {
        if self.own_log().is_none()
            || self.inode(dir)?.log.state_logged_trans != self.fs.forest.transid()
        {
            return Ok(());
        }
        self.log_put(Key::new(dir, item_type::DIR_INDEX, index), entry.encode())?;
        self.root.delayed.mark_logged(dir, index);
        self.log_exists(entry.ino)
    }

    /// Entry `index` was removed from `dir`. If the directory's entries are
    /// in the log, the removal goes there at once: otherwise a log synced
    /// later by another fsync would bring the entry back at replay (and a
    /// renamed inode would end up with both names).
    /// Returns whether the directory is logged.
    pub(crate) fn log_entry_removed(
        &mut self,
        dir: u64,
        index: u64,
        committed: bool,
    ) -> Result<bool> {
        if self.own_log().is_none()
            || self.inode(dir)?.log.state_logged_trans != self.fs.forest.transid()
        {
            return Ok(false);
        }
        self.log_delete(&Key::new(dir, item_type::DIR_INDEX, index))?;
        if committed {
            self.log_put(Key::new(dir, item_type::DIR_LOG_INDEX, index), Vec::new())?;
        }
        self.root.delayed.mark_logged(dir, index);
        Ok(true)
    }

    /// `dir` (a directory) is about to be removed from `parent`.
    pub(crate) fn note_rmdir(&mut self, parent: u64, dir: u64) -> Result<()> {
        if self.is_new(dir)? {
            return Ok(());
        }
        let transid = self.fs.forest.transid();
        self.inode(parent)?.log.removed_committed_dir_trans = transid;
        if self.inode(parent)?.log.state_logged_trans == transid {
            self.fs.log.force_commit = Some(FallbackReason::RemovedDirectory);
        }
        Ok(())
    }

    /// An inode is being destroyed: its logged items go too, so a later log
    /// sync does not bring it back.
    pub(crate) fn forget_logged_inode(&mut self, ino: u64) -> Result<()> {
        let transid = self.fs.forest.transid();
        let logged = self.root.inodes.get(&ino).is_some_and(|i| {
            i.log.names_logged_trans == transid || i.log.state_logged_trans == transid
        });
        if logged && self.own_log().is_some() {
            self.log_delete_range(Key::new(ino, 0, 0), Key::new(ino, u8::MAX, u64::MAX))?;
            // A committed inode keeps its committed names at replay unless
            // the log says they are gone (it may have been logged under a
            // new name that a later change took from it).
            if !self.is_new(ino)? {
                self.log_put(Key::new(ino, item_type::LOG_UNLINKED, 0), Vec::new())?;
            }
        }
        Ok(())
    }
}

/// A log transaction ready to be written.
pub(crate) struct SealedLog {
    pub id: u64,
    /// The commit this log is relative to.
    pub base_generation: u64,
    pub root: TreeRoot,
    pub nodes: std::sync::Arc<std::collections::HashMap<u64, std::sync::Arc<crate::format::Node>>>,
    /// Log nodes that become free once this log's superblock is durable.
    pub released: Vec<(u64, u64)>,
}

/// The log across roots: sealing it for a log sync, dropping it at a commit.
impl<D: BlockDevice> FsState<D> {
    /// Seals the filling log transaction for writing: records each
    /// subvolume's log tree root in the log root tree (`(LOG, ROOT_ITEM,
    /// id)`) and hands over the changed log nodes of all of them, for one
    /// log sync (fsyncs in several subvolumes share it). Returns `None`
    /// when nothing was logged.
    pub(crate) fn seal_log(&mut self) -> Result<Option<SealedLog>> {
        let id = self.info.log.filling;
        self.info.log.filling += 1;
        if !std::mem::take(&mut self.info.log.filling_dirty) {
            return Ok(None);
        }
        let mut trees = self.info.log.trees.take().expect("something was logged");
        let sealed = self.record_log_trees(&mut trees);
        let root = trees.root;
        self.info.log.trees = Some(trees);
        sealed?;
        let nodes = self.info.forest.seal_log_nodes();
        if nodes.is_empty() {
            // Every fsync since the last sync logged items the log already
            // held as they are (and every log tree's item is unchanged):
            // the log syncs before this one (done: log syncs are serial)
            // made all of it durable. Blocks the log released stay pinned
            // for the next seal.
            return Ok(None);
        }
        let released = self.info.forest.alloc_mut().take_log_pinned();
        Ok(Some(SealedLog {
            id,
            base_generation: self.top().committed_generation(),
            root,
            nodes,
            released,
        }))
    }

    /// Points the log root tree at every subvolume's log tree. An item
    /// already pointing at an unchanged log is left alone (no node is
    /// copied for it).
    fn record_log_trees(&mut self, trees: &mut LogTrees) -> Result<()> {
        for (subvol, log) in &trees.logs {
            let key = Key::new(tree_id::LOG, item_type::ROOT_ITEM, *subvol);
            let item = RootItem {
                bytenr: log.bytenr,
                generation: log.generation,
                level: log.level,
            }
            .encode();
            if self.info.forest.get(&trees.root, &key)?.as_ref() != Some(&item) {
                self.info.forest.put(&mut trees.root, key, item)?;
            }
        }
        Ok(())
    }

    /// Drops the log (a commit makes its content durable): its written
    /// nodes stay pinned until the commit is. Returns the transaction's
    /// change records, which the caller frees outside the state lock.
    pub(crate) fn drop_log(&mut self) -> Result<RetiredRecords> {
        if let Some(trees) = self.info.log.trees.take() {
            for log in trees.logs.values() {
                self.info.forest.drop_tree(log)?;
            }
            self.info.forest.drop_tree(&trees.root)?;
        }
        self.info.log.filling_dirty = false;
        self.info.log.force_commit = None;
        // Every root's records of this transaction's changes are durable
        // with the commit.
        for root in self.subvols.others.values_mut() {
            root.delayed.take_txn_changes();
        }
        Ok(self.subvols.top.delayed.take_txn_changes())
    }
}
