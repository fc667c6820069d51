//! The log's state in the running transaction and its counters. A leaf:
//! logging is in tree_log.rs, the log sync in log_sync.rs.

use crate::btree::TreeRoot;
use std::collections::BTreeMap;
use std::time::Duration;

/// Why an fsync could not be answered by the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallbackReason {
    /// A directory chain of new ancestors too deep to log.
    AncestorChain,
    /// A committed directory was removed from a directory whose changes
    /// are (or are being) logged. Replay would drop its entry, but the
    /// removed directory's own earlier removals were never logged, so it
    /// could come back nameless with entries. Crash case:
    /// `mkdir p/d; touch p/d/x; sync; rm p/d/x; rmdir p/d; fsync p; <cut>`.
    RemovedDirectory,
    /// A directory on the way from the inode up to the root was renamed in
    /// this transaction. The inode's new names would replay under the
    /// directory's old name (or, for an exchange, clash with its partner's).
    /// Crash case: `mkdir a d; sync; mv --exchange a d; mkdir a/b; fsync a/b;
    /// <cut>` must show `a/b`.
    RenamedAncestor,
    /// A subvolume link was added or removed in this transaction (a log
    /// never holds one: replay could not restore the ROOT_REF pair), or
    /// the inode's subvolume was created in it (its root item is not in
    /// the log's base commit). docs/SNAPSHOTS.md (e).
    Subvolume,
}

impl FallbackReason {
    pub fn name(self) -> &'static str {
        match self {
            FallbackReason::AncestorChain => "ancestor-chain",
            FallbackReason::RemovedDirectory => "removed-directory",
            FallbackReason::RenamedAncestor => "renamed-ancestor",
            FallbackReason::Subvolume => "subvolume",
        }
    }
}

/// The log trees of the running transaction: the log root tree and, by
/// subvolume id, the log tree of each subvolume logged in it (the log
/// root tree's `(LOG, ROOT_ITEM, id)` items point at them once sealed).
#[derive(Debug, Clone)]
pub(crate) struct LogTrees {
    pub logs: BTreeMap<u64, TreeRoot>,
    pub root: TreeRoot,
}

/// The running transaction's log.
#[derive(Debug, Default)]
pub(crate) struct LogState {
    pub trees: Option<LogTrees>,
    /// The log transaction being filled (numbers never repeat).
    pub filling: u64,
    /// Something was logged into `filling`.
    pub filling_dirty: bool,
    /// Every fsync until the next commit must commit instead.
    pub force_commit: Option<FallbackReason>,
    /// Seed 000 switched off (`Ablation::sync_log_on_new_name`): what the
    /// link or rename that changed a logged inode's names makes durable
    /// before it returns: cleared by a link or rename before it changes
    /// names, taken by it after (under the same hold of the state lock).
    pub new_name_sync: Option<NewNameSync>,
}

/// What a link or rename of a logged inode waits for when seed 000 is
/// switched off (docs/ABLATION.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NewNameSync {
    /// A sync of this log transaction.
    Log(u64),
    /// A commit: the log cannot be synced as it is (`force_commit`, or a
    /// chain of new ancestors too deep to log).
    Commit,
}

/// Counters of the fsync path. `birch stats` shows each through its line in
/// crates/birch-fuse/src/stats.rs (a new field needs one there).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    /// fsyncs answered by the log.
    pub logged_fsyncs: u64,
    /// fsyncs that found everything already durable.
    pub noop_fsyncs: u64,
    pub full_logs: u64,
    pub fast_logs: u64,
    pub dir_logs: u64,
    /// Log syncs written (superblock included).
    pub log_syncs: u64,
    /// Log syncs whose base commit was superseded: no superblock written.
    pub log_syncs_superseded: u64,
    pub fallback_ancestor_chain: u64,
    pub fallback_removed_directory: u64,
    pub fallback_renamed_ancestor: u64,
    pub fallback_subvolume: u64,
    /// Inodes logged because a logged inode took a name they held in the
    /// last commit, or they took one it gave up (docs/TREE-LOG.md, "Name
    /// conflicts").
    pub name_conflict_logs: u64,
    /// Time spent logging inodes (seed 003's figure), data writeback of
    /// the fsynced file included.
    pub logging_nanos: u64,
    /// Time in `Filesystem::fsync` from entry to durable, every phase below
    /// and waits for other syncs included: the engine's share of an fsync
    /// request (docs/FUSE.md, "Where an fsync's time goes").
    pub fsync_nanos: u64,
    /// Log syncs: writing the sealed log's nodes.
    pub log_write_nanos: u64,
    /// Log syncs: the flush that makes data and log nodes durable.
    pub log_nodes_flush_nanos: u64,
    /// Log syncs: waiting for the commit the log is based on (seed 002).
    pub log_base_wait_nanos: u64,
    /// Log syncs: the superblock write and its flush.
    pub log_superblock_nanos: u64,
}

impl LogStats {
    pub fn logging_time(&self) -> Duration {
        Duration::from_nanos(self.logging_nanos)
    }
}
