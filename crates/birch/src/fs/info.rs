//! The fs-wide half of the engine's state (`FsInfo`, btrfs's
//! `btrfs_fs_info`): the forest of tree nodes and the allocator, the
//! shared trees' roots, the superblock, dirty-page and space accounting,
//! the log's transaction, counters, and the mount's condition. The
//! per-subvolume half is `Root` (root.rs); docs/SNAPSHOTS.md, "The engine
//! split", says which operation may touch which.

use super::in_flight::{Unwritten, Writebacks};
use super::log_state::{LogState, LogStats};
use super::space_info::SpaceInfo;
use super::spare_pages::SparePages;
use super::types::{BackupRootUsed, FsStats, MountOptions, ReplayOutcome};
use crate::btree::{Forest, TreeRoot};
use crate::error::Error;
use crate::format::Superblock;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Fs-wide state, behind the state lock (inside `FsState`).
pub(crate) struct FsInfo<D> {
    pub(super) forest: Forest<Arc<D>>,
    pub(super) roots: Roots,
    /// The last superblock written (the durable state).
    pub(super) superblock: Superblock,
    /// Bytes held in dirty pages of all inodes.
    pub(super) dirty_page_bytes: u64,
    /// Writebacks whose data is being written without the state lock.
    pub(super) writebacks: Writebacks,
    /// Extents in the trees whose data the next commit or log sync
    /// writes (the seal's writeback, reflink's settle).
    pub(super) unwritten: Unwritten,
    /// Page buffers written back, for the next writes to reuse.
    pub(super) spare_pages: SparePages,
    /// What `release_memory` shrinks the node cache to, and how often it ran.
    pub(super) idle_cache_nodes: usize,
    pub(super) memory_releases: u64,
    /// Reservations, the dirty-inode queue, tickets (docs/DELALLOC.md).
    pub(super) space: SpaceInfo,
    pub(super) stats: FsStats,
    pub(super) log: LogState,
    pub(super) log_stats: LogStats,
    /// Set when a write or flush failed: the filesystem is read-only from
    /// then on, and says why.
    pub(super) failed: Option<String>,
    /// `Filesystem::shut_down` ran: every call fails with EIO.
    pub(super) shut_down: bool,
    /// What the mount did with the log it found, if any.
    pub(super) replay: Option<ReplayOutcome>,
    /// Set when the newest commit could not be read and an older one was
    /// mounted (`Rescue::UseBackupRoot`).
    pub(super) backup_root_used: Option<BackupRootUsed>,
    pub(super) options: MountOptions,
    /// Snapshots asked for in the running transaction, made by its seal in
    /// this order (docs/SNAPSHOTS.md (c)).
    pub(super) pending_snapshots: Vec<PendingSnapshot>,
    /// Snapshots a seal could not make (their destination changed since
    /// they were asked for), by id, until the caller collects the reason.
    pub(super) refused_snapshots: BTreeMap<u64, Error>,
    /// Set while a log is replayed: a directory's times come from its
    /// logged inode item (or stay as committed), so the names replay adds
    /// and removes leave them alone, as btrfs's `BTRFS_FS_LOG_RECOVERING`.
    pub(super) replaying_log: bool,
    /// Subvolumes a send is reading (as the snapshot or the parent), with
    /// how many sends: they cannot be deleted or made writable until the
    /// sends end (docs/SEND.md "Design: send"; btrfs's `send_in_progress`).
    pub(super) sending: BTreeMap<u64, u32>,
}

/// A snapshot waiting for the seal of the running transaction: its id is
/// reserved, its destination was valid when it was asked for.
#[derive(Debug, Clone)]
pub(crate) struct PendingSnapshot {
    pub id: u64,
    /// The subvolume copied.
    pub source: u64,
    /// The subvolume and directory (its inode number there) of the link.
    pub dest_root: u64,
    pub dest_dir: u64,
    pub name: Vec<u8>,
    pub readonly: bool,
}

/// The fs-wide trees a commit records: the root tree's root goes in the
/// superblock, the others in root items. Each subvolume's fs tree lives in
/// its `Root` (root.rs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Roots {
    pub root: TreeRoot,
    pub extent: TreeRoot,
    /// The checksum tree, on images with data checksums
    /// (docs/DATA-CHECKSUMS.md).
    pub csum: Option<TreeRoot>,
}

impl Roots {
    /// The fs-wide trees recorded by root items in the root tree.
    pub(super) fn recorded(&self) -> Vec<TreeRoot> {
        std::iter::once(self.extent).chain(self.csum).collect()
    }
}

impl<D> FsInfo<D> {
    /// EPERM while a send reads subvolume `id`: `what` (a delete, making
    /// it writable) would change a tree the send walks without the state
    /// lock.
    pub(super) fn refuse_during_send(&self, id: u64, what: &str) -> crate::error::Result<()> {
        if self.sending.get(&id).is_some_and(|&n| n > 0) {
            return Err(Error::Refused(format!(
                "cannot {what} subvolume {id} during send"
            )));
        }
        Ok(())
    }
}
