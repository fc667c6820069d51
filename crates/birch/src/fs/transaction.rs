//! Commit coordination: the locks every request and commit share
//! ([`Shared`]; the order they are taken in is docs/ARCHITECTURE.md "Lock
//! order"), the
//! commit that seals the running transaction under the state lock and
//! writes it without, and the background worker that commits on an
//! interval. The log sync that shares these locks is in log_sync.rs.

use super::commit;
use super::delayed_items::RetiredRecords;
use super::state::FsState;
use crate::alloc::TransactionSpace;
use crate::btree::NodeStore;
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::format::SECTOR_SIZE;
use crate::lock_order::{HoldHistogram, RankedCondvar, RankedGuard, RankedMutex};
use std::sync::{Arc, LockResult, PoisonError, WaitTimeoutResult};
use std::time::Instant;

/// Pages a commit writes back per state-lock hold before it seals.
const COMMIT_WRITEBACK_BATCH_PAGES: u64 = 256;

/// Delayed items the background worker writes into the trees per
/// state-lock hold.
const DELAYED_FLUSH_BATCH_ITEMS: u64 = 1024;

/// Why a commit runs: what it must do even when nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// Make changes durable: nothing changed, nothing to write.
    Durability,
    /// Give space back (reclaim, ENOSPC retry): also release the space held
    /// for the previous commit, which takes a commit of its own.
    Space,
}

/// Where log syncs and commits stand; see docs/TREE-LOG.md "Log sync".
#[derive(Debug, Default)]
pub(super) struct SyncProgress {
    /// A log sync is being written (at most one at a time).
    pub(super) log_writing: bool,
    /// A commit is sealing: no log sync may start.
    pub(super) commit_sealing: bool,
    /// Every log transaction up to this one is durable.
    pub(super) durable_log: u64,
    /// Log transactions up to this one are part of the commit in flight.
    pub(super) commit_covering: Option<u64>,
    /// Generation of the last durable commit.
    pub(super) durable_generation: u64,
    /// Set when a log sync failed: later fsyncs report it.
    pub(super) failed: Option<String>,
}

pub(super) struct Shared<D> {
    pub(super) state: RankedMutex<FsState<D>>,
    /// Serializes commits; held across a commit's unlocked I/O.
    pub(super) commit_lock: RankedMutex<()>,
    pub(super) sync: RankedMutex<SyncProgress>,
    pub(super) sync_changed: RankedCondvar,
    /// Held while writing and flushing a superblock, by commits and log
    /// syncs alike, so their superblocks reach the disk in order.
    pub(super) superblock_lock: RankedMutex<()>,
    pub(super) store: Arc<NodeStore<Arc<D>>>,
    pub(super) worker_stop: RankedMutex<bool>,
    pub(super) worker_wake: RankedCondvar,
    /// With the state lock: space came back (tickets served, dirty memory
    /// went down).
    pub(super) space_cv: RankedCondvar,
    /// With the state lock: wakes the flusher.
    pub(super) flusher_wake: RankedCondvar,
    /// With the state lock: a writeback batch was published (fsync waits
    /// for its file's writeback in flight).
    pub(super) writeback_done: RankedCondvar,
    /// One reclaimer at a time.
    pub(super) reclaim_lock: RankedMutex<()>,
    /// How long each request held the state lock (`FsStats`).
    pub(super) state_hold: HoldHistogram,
}

/// Why the filesystem failed when an operation panicked inside the engine.
pub(super) const PANIC_FAILURE: &str =
    "internal error: an operation panicked inside birch (a bug in birch)";

impl<D: BlockDevice> Shared<D> {
    /// Fails with EIO once a panic inside the engine poisoned one of the
    /// locks a change or a sync takes besides the state (the commit, sync
    /// progress and superblock locks): every later change and sync fails
    /// instead of panicking in turn, and the filesystem is failed (reads
    /// go on). The state lock itself is recovered instead
    /// ([`lock_state`](Self::lock_state)).
    pub(super) fn check_not_poisoned(&self) -> Result<()> {
        if self.commit_lock.is_poisoned()
            || self.sync.is_poisoned()
            || self.superblock_lock.is_poisoned()
        {
            self.lock_state()
                .info
                .failed
                .get_or_insert_with(|| PANIC_FAILURE.into());
            return Err(Error::Io(std::io::Error::other(format!(
                "{PANIC_FAILURE}; the filesystem is read-only"
            ))));
        }
        Ok(())
    }

    /// The state, also after a panic left its lock poisoned: the panic
    /// may have left it half changed, so it is marked failed (nothing of
    /// it is written from then on, changes are EROFS) and the poison is
    /// cleared; reads are served from it (docs/IO-ERRORS.md, "Panics").
    pub(super) fn lock_state(&self) -> RankedGuard<'_, FsState<D>> {
        self.recover_state(self.state.lock())
    }

    /// [`lock_state`](Self::lock_state) for a guard a condition variable
    /// wait gave back.
    pub(super) fn recover_state<'a>(
        &'a self,
        locked: LockResult<RankedGuard<'a, FsState<D>>>,
    ) -> RankedGuard<'a, FsState<D>> {
        locked.unwrap_or_else(|poisoned| {
            let mut state = poisoned.into_inner();
            state
                .info
                .failed
                .get_or_insert_with(|| PANIC_FAILURE.into());
            self.state.clear_poison();
            state
        })
    }

    /// [`recover_state`](Self::recover_state) for a timed wait.
    pub(super) fn recover_timed_wait<'a>(
        &'a self,
        waited: LockResult<(RankedGuard<'a, FsState<D>>, WaitTimeoutResult)>,
    ) -> RankedGuard<'a, FsState<D>> {
        match waited {
            Ok((state, _)) => state,
            Err(poisoned) => {
                let (state, _) = poisoned.into_inner();
                self.recover_state(Err(PoisonError::new(state)))
            }
        }
    }

    pub(super) fn lock_sync(&self) -> RankedGuard<'_, SyncProgress> {
        self.sync.lock().expect("sync progress lock poisoned")
    }

    /// Seals the running transaction, writes it without the state lock, then
    /// releases what it freed. The log of the running transaction is
    /// dropped: the commit makes its content durable.
    pub(super) fn commit(&self) -> Result<()> {
        self.commit_with(Purpose::Durability)
    }

    /// A commit to get space back: unlike [`Self::commit`] it also runs
    /// when nothing changed but space is held for the previous commit,
    /// which only a commit releases.
    pub(super) fn commit_for_space(&self) -> Result<()> {
        self.commit_with(Purpose::Space)
    }

    /// Waits until no log write is in flight (one uses blocks the commit
    /// would release), then marks the commit as sealing.
    fn begin_sealing(&self) {
        let mut sync = self.lock_sync();
        while sync.log_writing {
            sync = self
                .sync_changed
                .wait(sync)
                .expect("sync progress lock poisoned");
        }
        sync.commit_sealing = true;
    }

    fn commit_with(&self, purpose: Purpose) -> Result<()> {
        let _commit = self.commit_lock.lock().expect("commit lock poisoned");
        self.write_back_before_seal()?;
        self.begin_sealing();
        // What the seal retired, freed once the state lock is released.
        let mut retired = None;
        let sealed = (|| {
            // What the seal looks up is read first, without the lock.
            let (mut state, warmed) = self.lock_warmed(&|s| s.warm_seal());
            if state.info.options.read_only {
                return Ok(None);
            }
            if let Some(why) = &state.info.failed {
                return Err(Error::Io(std::io::Error::other(format!(
                    "filesystem is read-only after an earlier failure: {why}"
                ))));
            }
            let covering = state.info.log.filling;
            let generation = state.info.forest.transid();
            // A node the warm-up failed to read fails the commit as the
            // seal's own read of it would have.
            match warmed.and_then(|()| state.prepare_commit(purpose, &mut retired)) {
                Ok(p) => Ok(p.map(|p| (p, covering))),
                Err(e) => {
                    let e = io_step(e, &format!("commit of generation {generation}"));
                    state.info.failed = Some(e.to_string());
                    Err(e)
                }
            }
        })();
        drop(retired);
        {
            let mut sync = self.lock_sync();
            sync.commit_sealing = false;
            if let Ok(Some((_, covering))) = &sealed {
                sync.commit_covering = Some(*covering);
            }
            self.sync_changed.notify_all();
        }
        let Some((prepared, covering)) = sealed? else {
            return Ok(());
        };
        let dev = self.store.device().as_ref();
        let written = commit::write_data(dev, &prepared.data)
            .and_then(|()| {
                commit::write_nodes(
                    dev,
                    &prepared.nodes,
                    &prepared.superblock.fsid,
                    prepared.superblock.metadata_profile,
                )
            })
            .and_then(|n| {
                dev.flush()?;
                let _superblock = self
                    .superblock_lock
                    .lock()
                    .expect("superblock lock poisoned");
                commit::write_superblocks(dev, &prepared.superblock)?;
                Ok(n)
            })
            .map_err(|e| {
                let step = format!("commit of generation {}", prepared.superblock.generation);
                io_step(e, &step)
            });
        let generation = prepared.superblock.generation;
        let result = {
            let mut state = self.lock_state();
            match written {
                Ok(nodes) => {
                    state.finish_commit(prepared, nodes);
                    self.space_changed(&mut state);
                    Ok(())
                }
                Err(e) => {
                    state.info.failed = Some(e.to_string());
                    Err(e)
                }
            }
        };
        let mut sync = self.lock_sync();
        sync.commit_covering = None;
        match &result {
            Ok(()) => {
                sync.durable_log = sync.durable_log.max(covering);
                sync.durable_generation = generation;
            }
            Err(e) => sync.failed = Some(e.to_string()),
        }
        self.sync_changed.notify_all();
        result
    }

    /// The background worker's flush of delayed items: what is pending
    /// now, [`DELAYED_FLUSH_BATCH_ITEMS`] per state-lock hold, so that no
    /// request waits behind the whole flush (16,384 items flushed in one
    /// hold were the slowest directory fsyncs of seed 003: docs/FUSE.md,
    /// "The directory fsync's tail"). btrfs likewise flushes delayed items
    /// from workers a few delayed nodes at a time. Bounded by what was
    /// pending at the start, like the commit's early writeback.
    fn flush_delayed_in_batches(&self) {
        // What the flush looks up is read first, without the lock, once:
        // the batches after the first find it cached (a node evicted in
        // between is read under the lock, counted).
        let (mut state, warmed_up) = self.lock_warmed(&|s| s.warm_delayed_items());
        if let Err(e) = warmed_up {
            state.info.failed.get_or_insert_with(|| e.to_string());
            return;
        }
        let mut left = state.delayed_items();
        let mut warmed = Some(state);
        while left > 0 {
            {
                let mut state = warmed.take().unwrap_or_else(|| self.lock_state());
                if state.info.failed.is_some() {
                    return;
                }
                let limit = left.min(DELAYED_FLUSH_BATCH_ITEMS);
                match state.flush_delayed_batch(limit) {
                    Ok(0) => return,
                    Ok(written) => left = left.saturating_sub(written),
                    Err(e) => {
                        state.info.failed = Some(e.to_string());
                        return;
                    }
                }
            }
            // The mutex is not fair: let the requests queued on it in
            // before taking it again.
            std::thread::yield_now();
        }
    }

    /// Writes back the pages dirty when the commit began, a batch per
    /// state-lock hold (each written without the lock), so that the seal
    /// (which publishes whatever is still dirty under the lock and writes
    /// it after) finds little left: it plans every page it finds under
    /// the lock, and holds their bytes in memory until its write is done
    /// (a 30 s commit under dbench once stalled requests for 300 ms).
    /// btrfs likewise starts delalloc writeback before its critical
    /// section. Bounded by what was dirty at the start, so writers that
    /// dirty pages as fast as they are written cannot hold the commit back.
    fn write_back_before_seal(&self) -> Result<()> {
        let mut left = self.lock_state().info.dirty_page_bytes / SECTOR_SIZE;
        while left > 0 {
            {
                let mut state = self.lock_state();
                if state.info.failed.is_some() || state.info.options.read_only {
                    return Ok(());
                }
                let (back, written) =
                    self.writeback_oldest(state, left.min(COMMIT_WRITEBACK_BATCH_PAGES));
                state = back;
                let written = match written {
                    Ok(n) => n,
                    Err(e) => {
                        let generation = state.info.forest.transid();
                        let e = io_step(e, &format!("commit of generation {generation}"));
                        state.info.failed = Some(e.to_string());
                        return Err(e);
                    }
                };
                state.info.space.stats.commit_pages += written;
                self.space_changed(&mut state);
                if written == 0 {
                    return Ok(());
                }
                left = left.saturating_sub(written);
            }
            // The mutex is not fair: let the requests queued on it in
            // before taking it again.
            std::thread::yield_now();
        }
        Ok(())
    }
}

/// Names the commit or log sync a device error interrupted, so that the
/// reason the filesystem turned read-only says what failed.
pub(super) fn io_step(e: Error, step: &str) -> Error {
    match e {
        Error::Io(io) => Error::Io(std::io::Error::new(io.kind(), format!("{step}: {io}"))),
        other => other,
    }
}

pub(super) fn shut_down_error() -> Error {
    Error::Io(std::io::Error::other("the filesystem was shut down"))
}

/// Commits every `commit_interval` while there are changes, flushes
/// delayed items early when too many accumulate, and runs the cleaner
/// (cleaner.rs) while deleted subvolumes remain.
pub(super) fn background_worker<D: BlockDevice + 'static>(shared: Arc<Shared<D>>) {
    let interval = shared
        .state
        .lock()
        .expect("state lock")
        .info
        .options
        .commit_interval
        .expect("worker runs only with an interval");
    let tick = interval.min(std::time::Duration::from_millis(500));
    let mut last_commit = Instant::now();
    // Deleted subvolumes remain to be dropped: the next round starts at
    // once (each round is one bounded transaction of the cleaner's).
    let mut cleaning = false;
    loop {
        {
            let stop = shared.worker_stop.lock().expect("worker lock poisoned");
            let wait = if cleaning {
                std::time::Duration::ZERO
            } else {
                tick
            };
            let (stop, _) = shared
                .worker_wake
                .wait_timeout(stop, wait)
                .expect("worker lock poisoned");
            if *stop {
                break;
            }
        }
        // The limit is on the items pending in every loaded root, and
        // every root flushes: a subvolume's items would otherwise wait
        // for the commit, however many there are.
        let flush_delayed = {
            let state = shared.lock_state();
            state.info.failed.is_none()
                && state.delayed_items() > state.info.options.delayed_items_limit as u64
        };
        if flush_delayed {
            shared.flush_delayed_in_batches();
        }
        if last_commit.elapsed() >= interval {
            if let Err(e) = shared.commit() {
                eprintln!("birch: periodic commit failed: {e}");
            }
            last_commit = Instant::now();
        }
        cleaning = match shared.clean_one_transaction() {
            Ok(more) => more,
            Err(e) => {
                eprintln!("birch: dropping a deleted subvolume failed: {e}");
                false
            }
        };
    }
}

impl<D: BlockDevice> FsState<D> {
    /// After a change met an I/O error or corruption: what is in memory
    /// may be half changed and must never be committed, so the
    /// filesystem turns read-only, keeping the first reason.
    pub(super) fn fail_on_device_error<T>(&mut self, result: &Result<T>) {
        if let Err(e @ (Error::Io(_) | Error::Corrupt(_))) = result {
            self.info.failed.get_or_insert_with(|| e.to_string());
        }
    }

    /// Seals the running transaction for a commit. The records it retires
    /// go to `retired`, for the caller to free after releasing the lock.
    fn prepare_commit(
        &mut self,
        purpose: Purpose,
        retired: &mut Option<RetiredRecords>,
    ) -> Result<Option<commit::PreparedCommit>> {
        self.writeback_all()?;
        // Every unwritten extent is in this transaction's trees (those of
        // earlier ones were written by their commits).
        let data = self.info.unwritten.writes(0, self.info.forest.transid());
        self.for_each_root(|mut root| root.flush_delayed_items())?;
        if !self.info.pending_snapshots.is_empty() {
            // Before the log's drop, so the links' entries are changes of
            // this transaction, which the drop retires unlogged.
            self.make_pending_snapshots()?;
            self.for_each_root(|mut root| root.flush_delayed_items())?;
        }
        *retired = Some(self.drop_log()?);
        // A superblock that points at a log (one replay applied or threw
        // away) is superseded even when nothing else changed, and so is
        // one newer than the commit in memory (a rescue mount fell back to
        // an older commit: the first commit makes the rollback durable).
        let device_holds_other_commit =
            self.info.superblock.generation + 1 != self.info.forest.transid();
        let releases_held = purpose == Purpose::Space && self.info.forest.alloc().held_bytes() > 0;
        if self.info.forest.dirty_node_count() == 0
            && !self.info.forest.alloc().has_delayed_refs()
            && self.info.superblock.log_root_bytenr == 0
            && !device_holds_other_commit
            && !releases_held
        {
            debug_assert!(data.is_empty(), "unwritten extents but nothing to commit");
            return Ok(None);
        }
        self.stamp_changed_subvolumes();
        let subvols = self.subvols.records();
        // Tree 5's root item in the long form (the first subvolume made
        // it so) and INCOMPAT_SUBVOLUMES go to disk in the same commit.
        let mut template = self.info.superblock.clone();
        template.subvolumes |= self.subvols.top.item.is_some();
        let mut prepared = commit::seal_transaction(
            &mut self.info.forest,
            &mut self.info.roots,
            &subvols,
            &template,
        )?;
        prepared.data = data;
        self.note_committing_pinned(
            prepared
                .pinned
                .iter()
                .chain(&prepared.log_released)
                .map(|&(_, l)| l)
                .sum(),
        );
        // The next transaction's log transactions get new numbers: the
        // commit covers every one up to the current.
        self.info.log.filling += 1;
        Ok(Some(prepared))
    }

    /// Writes up to `limit` pending delayed items into the trees, the
    /// roots in turn; returns how many it wrote.
    fn flush_delayed_batch(&mut self, limit: u64) -> Result<u64> {
        let mut written = 0u64;
        self.for_each_root(|mut root| {
            let room = usize::try_from(limit - written).unwrap_or(usize::MAX);
            written += root.flush_delayed_batch(room)? as u64;
            Ok(())
        })?;
        Ok(written)
    }

    /// Sets `ctransid` = T in the root item of every subvolume whose tree
    /// changed in transaction T, as btrfs does on every change of a
    /// subvolume (send/receive compares it). A tree changed in T has its
    /// root node copied in T, so its generation is T; S8 (otransid <=
    /// ctransid <= generation) holds since generation is T too. Runs once
    /// the seal has flushed every delayed item into the trees.
    fn stamp_changed_subvolumes(&mut self) {
        let transid = self.info.forest.transid();
        for root in self.subvols.iter_mut() {
            if root.tree.generation == transid {
                if let Some(item) = root.item.as_mut() {
                    item.ctransid = transid;
                }
            }
        }
    }

    fn finish_commit(&mut self, prepared: commit::PreparedCommit, nodes_written: u64) {
        // On the device now: reads find the bytes there.
        self.info.unwritten.written(&prepared.data);
        self.info.forest.end_commit();
        self.info.forest.alloc_mut().commit_durable(prepared.pinned);
        self.info.forest.alloc_mut().unpin(prepared.log_released);
        self.note_committing_pinned(0);
        self.info.superblock = prepared.superblock;
        self.info.stats.commits += 1;
        self.info.stats.nodes_written += nodes_written;
        let evicted = self.for_each_root(|mut root| {
            root.evict_clean_inodes();
            Ok(())
        });
        debug_assert!(evicted.is_ok());
    }
}
