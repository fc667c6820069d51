//! The state of one cached inode: its item, dirty pages and what the log
//! knows of it. A leaf: the operations on the cache are in inode.rs.

use crate::format::InodeItem;
use std::collections::BTreeMap;

/// One cached inode (`Root::inodes`).
pub(crate) struct Inode {
    pub item: InodeItem,
    pub open_count: u32,
    /// Directories: the next dir index to hand out, once computed.
    pub next_index: Option<u64>,
    /// Regular files: dirty pages by page index (SECTOR_SIZE bytes each).
    pub pages: BTreeMap<u64, Box<[u8]>>,
    /// Counts changes, so an fsync can tell whether anything changed since
    /// the inode was last logged.
    pub change_seq: u64,
    pub log: InodeLog,
}

/// What the log knows of one inode in the running transaction.
#[derive(Debug, Clone, Default)]
pub(crate) struct InodeLog {
    /// Transaction in which the log holds this inode's names; from then on
    /// every name change is applied to the log too (invariant L1).
    pub names_logged_trans: u64,
    /// Transaction in which the log holds the inode's own state (a file's
    /// item, xattrs and extents; a directory's entry changes).
    pub state_logged_trans: u64,
    /// `change_seq` when the state was logged: an fsync finding it
    /// unchanged has nothing to log.
    pub logged_change_seq: u64,
    /// Log transaction that last logged this inode's state.
    pub logged_in: u64,
    /// Transaction the ranges below belong to.
    pub ranges_trans: u64,
    /// File ranges written back since the last log (fast fsync logs these).
    pub dirty_ranges: Vec<(u64, u64)>,
    /// Fast logging cannot express the changes (extents were dropped, or
    /// the inode was loaded from disk mid-transaction): log everything.
    pub full_sync: bool,
    /// Transaction in which a committed subdirectory of this directory was
    /// removed (the log cannot express that: see `RemovedDirectory`).
    pub removed_committed_dir_trans: u64,
    /// Transaction in which this inode was moved by a rename.
    pub renamed_trans: u64,
    /// Transaction in which this inode gained a name by a link: its fsync
    /// then logs the directories it has names in (generic/104, 343).
    pub linked_trans: u64,
}
