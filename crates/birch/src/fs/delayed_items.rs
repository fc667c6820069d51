//! The delayed items of one root: pending dir-index changes and dirty inode
//! items, and the transaction's record of them the tree-log reads. A leaf:
//! the flush into the fs tree is in delayed.rs.

use crate::format::DirEntry;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Pending DIR_INDEX changes of one directory.
#[derive(Debug, Default, Clone)]
pub(crate) struct DelayedDir {
    /// Index -> entry to insert.
    pub insertions: BTreeMap<u64, DirEntry>,
    /// Indexes whose tree item is to be deleted.
    pub deletions: BTreeSet<u64>,
}

/// Pending items taken to be written into the tree ([`DelayedItems::take_batch`]).
#[derive(Debug, Default)]
pub(crate) struct PendingBatch {
    /// Dir-index changes, by directory, directories ascending.
    pub dirs: Vec<(u64, DelayedDir)>,
    /// Inodes whose item is to be written, ascending.
    pub inodes: Vec<u64>,
}

impl PendingBatch {
    /// Items in the batch.
    pub fn len(&self) -> usize {
        self.dirs
            .iter()
            .map(|(_, d)| d.insertions.len() + d.deletions.len())
            .sum::<usize>()
            + self.inodes.len()
    }
}

/// The first `n` entries of a map, taken out of it.
fn take_first_entries<V>(map: &mut BTreeMap<u64, V>, n: usize) -> BTreeMap<u64, V> {
    match map.keys().nth(n).copied() {
        Some(split) => {
            let rest = map.split_off(&split);
            std::mem::replace(map, rest)
        }
        None => std::mem::take(map),
    }
}

/// The first `n` members of a set, taken out of it.
fn take_first_members(set: &mut BTreeSet<u64>, n: usize) -> BTreeSet<u64> {
    match set.iter().nth(n).copied() {
        Some(split) => {
            let rest = set.split_off(&split);
            std::mem::replace(set, rest)
        }
        None => std::mem::take(set),
    }
}

/// Records a commit retired, kept only to be dropped outside the state
/// lock.
pub(crate) type RetiredRecords = Box<dyn Send>;

#[derive(Debug, Default)]
pub(crate) struct DelayedItems {
    pub(super) dirs: HashMap<u64, DelayedDir>,
    /// Every dir-index change of the running transaction, per directory,
    /// kept after a flush applies it to the tree: the tree-log logs a
    /// directory from this record (seed 003) and never flushes for it.
    pub(super) txn_changes: HashMap<u64, DelayedDir>,
    /// Per directory, the indexes changed since its last log.
    pub(super) unlogged: HashMap<u64, BTreeSet<u64>>,
    /// Per directory, the inode each committed entry removed in this
    /// transaction named.
    pub(super) txn_removed: HashMap<u64, BTreeMap<u64, u64>>,
    /// The same removals by name: `(dir, name)` -> the inode that held it
    /// in the last commit. A committed directory has each name once, so
    /// this is a function.
    pub(super) removed_by_name: HashMap<(u64, Vec<u8>), u64>,
    /// The same removals by inode: the committed names each inode lost in
    /// this transaction.
    pub(super) removed_names: HashMap<u64, Vec<(u64, Vec<u8>)>>,
    /// Inodes whose in-memory item is newer than the tree's.
    pub(super) inodes: BTreeSet<u64>,
    pub(super) dir_items: usize,
}

impl DelayedItems {
    pub fn insert_index(&mut self, dir: u64, index: u64, entry: DirEntry) {
        self.txn_changes
            .entry(dir)
            .or_default()
            .insertions
            .insert(index, entry.clone());
        self.unlogged.entry(dir).or_default().insert(index);
        let d = self.dirs.entry(dir).or_default();
        let prev = d.insertions.insert(index, entry);
        assert!(prev.is_none(), "dir {dir} index {index} inserted twice");
        self.dir_items += 1;
    }

    /// Deletes an index: cancels a pending insertion, or records a
    /// deletion of the tree's item. Returns whether the entry was in the
    /// committed tree (not added in this transaction).
    pub fn delete_index(&mut self, dir: u64, index: u64, ino: u64, name: &[u8]) -> bool {
        let t = self.txn_changes.entry(dir).or_default();
        let committed = t.insertions.remove(&index).is_none();
        if committed {
            t.deletions.insert(index);
            self.txn_removed.entry(dir).or_default().insert(index, ino);
            self.removed_by_name.insert((dir, name.to_vec()), ino);
            self.removed_names
                .entry(ino)
                .or_default()
                .push((dir, name.to_vec()));
        }
        self.unlogged.entry(dir).or_default().insert(index);
        let d = self.dirs.entry(dir).or_default();
        if d.insertions.remove(&index).is_some() {
            self.dir_items -= 1;
        } else {
            assert!(
                d.deletions.insert(index),
                "dir {dir} index {index} deleted twice"
            );
            self.dir_items += 1;
        }
        if d.insertions.is_empty() && d.deletions.is_empty() {
            self.dirs.remove(&dir);
        }
        committed
    }

    /// Takes one directory's pending changes (to write them into the
    /// tree now).
    pub fn take_dir(&mut self, dir: u64) -> Option<DelayedDir> {
        let d = self.dirs.remove(&dir)?;
        self.dir_items -= d.insertions.len() + d.deletions.len();
        Some(d)
    }

    /// Takes up to `limit` pending items to write into the tree now:
    /// dir-index changes first (directories in inode order, each
    /// directory's deletions, then its insertions, in index order), then
    /// inode updates in inode order. What is left stays pending, so the
    /// tree and the batches together still hold every change, as readdir,
    /// lookups of the next index and the next flush expect.
    pub fn take_batch(&mut self, limit: usize) -> PendingBatch {
        let mut left = limit;
        let mut batch = PendingBatch::default();
        let mut dirs: Vec<u64> = self.dirs.keys().copied().collect();
        dirs.sort_unstable();
        for dir in dirs {
            if left == 0 {
                break;
            }
            let d = self.dirs.get_mut(&dir).expect("listed above");
            let deletions = take_first_members(&mut d.deletions, left);
            left -= deletions.len();
            let insertions = take_first_entries(&mut d.insertions, left);
            left -= insertions.len();
            if d.insertions.is_empty() && d.deletions.is_empty() {
                self.dirs.remove(&dir);
            }
            self.dir_items -= deletions.len() + insertions.len();
            batch.dirs.push((
                dir,
                DelayedDir {
                    insertions,
                    deletions,
                },
            ));
        }
        batch.inodes = take_first_members(&mut self.inodes, left)
            .into_iter()
            .collect();
        batch
    }

    /// Takes one inode off the dirty set; returns whether it was on it.
    pub fn take_inode(&mut self, ino: u64) -> bool {
        self.inodes.remove(&ino)
    }

    pub fn dir(&self, dir: u64) -> Option<&DelayedDir> {
        self.dirs.get(&dir)
    }

    /// Drops everything pending for an inode that is being destroyed.
    /// The running transaction's dir-index changes of `dir`.
    pub fn txn_changes(&self, dir: u64) -> Option<&DelayedDir> {
        self.txn_changes.get(&dir)
    }

    /// A commit made the transaction's changes durable: takes their
    /// records, for the caller to free once it has released the state
    /// lock. After 30 s of dbench they are tens of thousands of small
    /// allocations, and freeing them under the lock took 7 ms.
    pub fn take_txn_changes(&mut self) -> RetiredRecords {
        Box::new((
            std::mem::take(&mut self.txn_changes),
            std::mem::take(&mut self.unlogged),
            std::mem::take(&mut self.txn_removed),
            std::mem::take(&mut self.removed_by_name),
            std::mem::take(&mut self.removed_names),
        ))
    }

    /// The indexes of `dir` changed since it was last logged; forgets them.
    pub fn take_unlogged(&mut self, dir: u64) -> BTreeSet<u64> {
        self.unlogged.remove(&dir).unwrap_or_default()
    }

    /// The inode that committed entry `index` of `dir`, removed in this
    /// transaction, named.
    pub fn removed_inode(&self, dir: u64, index: u64) -> Option<u64> {
        self.txn_removed.get(&dir)?.get(&index).copied()
    }

    /// The inode that held `name` in `dir` in the last commit, if this
    /// transaction removed that entry.
    pub fn committed_owner_removed(&self, dir: u64, name: &[u8]) -> Option<u64> {
        self.removed_by_name.get(&(dir, name.to_vec())).copied()
    }

    /// The `(dir, name)` pairs `ino` had in the last commit and lost in
    /// this transaction.
    pub fn committed_names_removed(&self, ino: u64) -> &[(u64, Vec<u8>)] {
        self.removed_names.get(&ino).map_or(&[], Vec::as_slice)
    }

    /// Marks one index of `dir` as reflected in the log.
    pub fn mark_logged(&mut self, dir: u64, index: u64) {
        if let Some(set) = self.unlogged.get_mut(&dir) {
            set.remove(&index);
        }
    }

    pub fn forget_inode(&mut self, ino: u64) {
        self.txn_changes.remove(&ino);
        self.txn_removed.remove(&ino);
        // `removed_by_name` entries of a destroyed directory stay until the
        // commit: they are only looked up for names of live inodes in a live
        // directory, and inode numbers are not reused.
        self.removed_names.remove(&ino);
        self.unlogged.remove(&ino);
        if let Some(d) = self.dirs.remove(&ino) {
            self.dir_items -= d.insertions.len() + d.deletions.len();
        }
        self.inodes.remove(&ino);
    }

    pub fn inode_changed(&mut self, ino: u64) {
        self.inodes.insert(ino);
    }

    pub fn is_inode_dirty(&self, ino: u64) -> bool {
        self.inodes.contains(&ino)
    }

    pub fn has_pending_dir(&self, ino: u64) -> bool {
        self.dirs.contains_key(&ino)
    }

    /// Number of pending items (dir-index changes plus inode updates).
    pub fn len(&self) -> usize {
        self.dir_items + self.inodes.len()
    }
}
