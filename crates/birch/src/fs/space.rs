//! Space reservation for delayed allocation: what buffered writes and
//! pending changes have been promised, tickets for writers that must wait,
//! page-bounded reclaim, and the background flusher. docs/DELALLOC.md is the
//! design.
//!
//! Reservations are *derived* from state the engine keeps anyway (dirty
//! pages, runs of dirty pages, delayed items, delayed extent refs), so a
//! change never has to hand "its" reservation back: when the work is done
//! the derived amount shrinks by itself. A change only has to check, before
//! it runs and under the same lock, that what it may add fits:
//!
//! ```text
//! reserved  = dirty pages + delalloc metadata + transaction metadata + granted
//! available = free − reserved − global reserve     (urgent changes: + global reserve)
//! ```

use super::info::FsInfo;
use super::root::RootCtx;
use super::space_info::{
    prealloc_need, Need, Refusal, BACKGROUND_BATCH_PAGES, DELALLOC_EXTENT_ITEMS, GROWTH_PER_ITEM,
    MAX_FRUITLESS_REQUESTS, MAX_RECLAIM_PAGES, META_ITEM, MIN_RECLAIM_PAGES, NEW_FILE_ITEMS,
    TXN_FIXED_NODES,
};
use super::state::FsState;
use super::transaction::{shut_down_error, Shared};
use crate::alloc::TransactionSpace;
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::format::SECTOR_SIZE;
use crate::lock_order::RankedGuard;
use std::time::{Duration, Instant};

const PAGE: u64 = SECTOR_SIZE;

pub use super::types::SpaceUsage;

/// Room for more outstanding extents ([`RootCtx::extent_room`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExtentRoom {
    pub(crate) ordinary: u64,
    pub(crate) with_reserve: u64,
}

impl<D: BlockDevice> FsState<D> {
    /// Delayed items pending in every loaded root.
    pub(crate) fn delayed_items(&self) -> u64 {
        self.subvols.iter().map(|r| r.delayed.len() as u64).sum()
    }

    /// What one changed item may cost a transaction (see
    /// [`FsInfo::meta_item`]).
    pub(crate) fn meta_item(&self) -> u64 {
        self.info.meta_item()
    }

    pub(crate) fn delalloc_metadata(&self) -> u64 {
        self.info.delalloc_metadata()
    }

    pub(crate) fn transaction_metadata(&self) -> u64 {
        self.info.transaction_metadata(self.delayed_items())
    }

    /// What the pending work will leave allocated once committed: the new
    /// items' bytes (at half-full leaves). The copies of existing nodes the
    /// worst-case estimates allow for are transient: a commit frees the
    /// old copies.
    fn settled_metadata(&self) -> u64 {
        let items = self.info.space.runs * DELALLOC_EXTENT_ITEMS
            + self.delayed_items()
            + self.info.forest.alloc().delayed_ref_count() as u64;
        2 * items * GROWTH_PER_ITEM * self.meta_item() / META_ITEM
    }

    pub(crate) fn space_available(&self, urgent: bool) -> i64 {
        self.info.space_available(urgent, self.delayed_items())
    }

    /// Takes `bytes` now if they fit and no older ticket waits (an urgent
    /// change may pass tickets, out of the global reserve).
    fn space_try_reserve(&mut self, bytes: u64, urgent: bool) -> bool {
        if bytes == 0 {
            return true;
        }
        if !urgent && !self.info.space.tickets.is_empty() {
            return false;
        }
        if self.space_available(urgent) >= bytes as i64 {
            self.info.space.granted += bytes;
            return true;
        }
        false
    }

    /// Grants queued tickets, in order, while they fit. Returns whether any
    /// was served.
    pub(crate) fn grant_tickets(&mut self) -> bool {
        let mut served = false;
        while let Some(t) = self.info.space.tickets.front() {
            if self.space_available(t.urgent) < t.bytes as i64 {
                break;
            }
            self.info.space.serve_front(Ok(()));
            served = true;
        }
        served
    }

    /// How much the queued tickets lack.
    fn space_shortfall(&self) -> u64 {
        let Some(head) = self.info.space.tickets.front() else {
            return 0;
        };
        let wanted: u64 = self.info.space.tickets.iter().map(|t| t.bytes).sum();
        (wanted as i64 - self.space_available(head.urgent)).max(PAGE as i64) as u64
    }

    /// The most a commit (and the one after it, for held space) can give
    /// back: what is pinned, held or committing, the data extents pending
    /// extent-tree changes may free, and the running
    /// transaction's worst-case metadata beyond the part every transaction
    /// reserves again. A shortfall larger than what this grew by since
    /// the filesystem was last found full is not worth a commit.
    fn commit_could_return(&self) -> u64 {
        let alloc = self.info.forest.alloc();
        let fixed = TXN_FIXED_NODES * self.meta_item();
        alloc.pinned_bytes()
            + alloc.delayed_free_bytes()
            + alloc.log_pinned_bytes()
            + alloc.held_bytes()
            + self.info.space.committing_pinned
            + self.transaction_metadata().saturating_sub(fixed)
    }

    /// Whether a full reclaim cycle found the filesystem full and what a
    /// commit could give back has not grown by `shortfall` since.
    fn commit_cannot_cover(&self, shortfall: u64) -> bool {
        self.info
            .space
            .full_at
            .is_some_and(|full_at| self.commit_could_return().saturating_sub(full_at) < shortfall)
    }

    /// Pages a reclaim request writes back for a shortfall of `bytes`: as
    /// many as give back that much on average, within bounds.
    fn reclaim_pages_for(&self, bytes: u64) -> u64 {
        let dirty_pages = self.info.dirty_page_bytes / PAGE;
        let per_page = (self.delalloc_metadata() / dirty_pages.max(1)).max(1);
        bytes
            .div_ceil(per_page)
            .clamp(MIN_RECLAIM_PAGES, MAX_RECLAIM_PAGES)
            .min(dirty_pages)
    }

    /// Dirty memory above which the flusher writes back.
    fn background_threshold(&self) -> u64 {
        self.info.options.dirty_limit_bytes / 2
    }

    /// The commit being prepared will unpin these bytes once durable.
    pub(crate) fn note_committing_pinned(&mut self, bytes: u64) {
        self.info.space.committing_pinned = bytes;
    }

    pub(crate) fn space_usage(&self) -> SpaceUsage {
        let alloc = self.info.forest.alloc();
        SpaceUsage {
            total: alloc.total_bytes(),
            free: alloc.free_bytes(),
            pinned: alloc.pinned_bytes()
                + alloc.log_pinned_bytes()
                + alloc.held_bytes()
                + self.info.space.committing_pinned,
            dirty_data: self.info.dirty_page_bytes,
            delalloc_metadata: self.delalloc_metadata(),
            transaction_metadata: self.transaction_metadata(),
            granted: self.info.space.granted,
            settled_metadata: self.settled_metadata(),
            global_reserve: self.info.space.global_reserve,
            available: self.space_available(false),
            tickets_waiting: self.info.space.tickets.len() as u64,
        }
    }

    /// statfs: free space a user can trust — what can still be written once
    /// reclaim has done its work. Pinned space counts as free (a reclaim
    /// commit returns it to a writer that needs it); dirty data and granted
    /// space count in full, metadata reservations at what they will leave
    /// allocated (their worst-case node copies are transient: reclaim turns
    /// them into real usage before any writer gets ENOSPC). Available
    /// (`f_bavail`) is what one new file can take: without the global
    /// reserve, the nodes every transaction reserves, what creating the
    /// file may copy, and what a fallocate of the rest reserves for its
    /// extents (generic/103).
    pub(crate) fn statfs(&self) -> super::StatFs {
        let u = self.space_usage();
        let reserved = u.dirty_data + u.granted + u.settled_metadata;
        let free = (u.free + u.pinned).saturating_sub(reserved);
        let meta_item = self.meta_item();
        let fixed = TXN_FIXED_NODES * meta_item;
        // A commit holds the nodes it copied for the commit before it, so
        // of the space held, up to the fixed part never comes back to a
        // writer: each reclaim commit holds its own copies in its place.
        let churn = self.info.forest.alloc().held_bytes().min(fixed);
        let writable = free
            .saturating_sub(u.global_reserve)
            .saturating_sub(fixed)
            .saturating_sub(churn)
            .saturating_sub(NEW_FILE_ITEMS * meta_item);
        // Counting the extents of `writable` itself over-counts by at most
        // one: what is left fits its own fallocate.
        let one_file = writable.saturating_sub(prealloc_need(writable).total(meta_item) - writable);
        super::StatFs {
            block_size: SECTOR_SIZE as u32,
            blocks: u.total / SECTOR_SIZE,
            blocks_free: free / SECTOR_SIZE,
            blocks_available: one_file / SECTOR_SIZE,
            files: u64::from(u32::MAX),
            files_free: u64::from(u32::MAX).saturating_sub(self.subvols.top.next_ino),
            name_max: crate::format::NAME_MAX as u32,
        }
    }
}

/// The reservation arithmetic, over the fs-wide state and the number of
/// delayed items pending (`delayed_items`): the roots' share of the
/// running transaction's metadata, which the caller counts.
impl<D: BlockDevice> FsInfo<D> {
    /// What one changed item may cost a transaction: a copy of its leaf,
    /// on every copy the metadata profile keeps (docs/DUP.md).
    pub(crate) fn meta_item(&self) -> u64 {
        self.forest.alloc().profile().node_footprint()
    }

    /// Metadata reserved for the extents dirty data will become, and for
    /// those of writebacks in flight (published after the lock was let go).
    pub(crate) fn delalloc_metadata(&self) -> u64 {
        (self.space.runs + self.writebacks.extents()) * DELALLOC_EXTENT_ITEMS * self.meta_item()
    }

    /// Worst case of the nodes the running transaction may still copy for
    /// work already queued: a leaf per pending item, but never more than
    /// every node not yet copied in this transaction plus what the new items
    /// can add.
    fn transaction_metadata(&self, delayed_items: u64) -> u64 {
        let items = delayed_items + self.forest.alloc().delayed_ref_count() as u64;
        let meta_item = self.meta_item();
        let per_item = items * meta_item;
        let copied = self.forest.dirty_node_count() as u64 * meta_item;
        let growth = (2 * items * GROWTH_PER_ITEM).div_ceil(META_ITEM) * meta_item;
        let cap = self.forest.alloc().metadata_bytes().saturating_sub(copied) + growth;
        per_item.min(cap) + TXN_FIXED_NODES * meta_item
    }

    /// Node space the accounting has promised (both copies under DUP):
    /// the metadata reservations and the global reserve. Data allocation
    /// leaves that much room for node pairs (`TransactionSpace::alloc_data`).
    fn nodes_promised(&self, delayed_items: u64) -> u64 {
        self.delalloc_metadata()
            + self.transaction_metadata(delayed_items)
            + self.space.global_reserve
    }

    fn space_reserved(&self, delayed_items: u64) -> u64 {
        self.dirty_page_bytes
            + self.delalloc_metadata()
            + self.transaction_metadata(delayed_items)
            + self.space.granted
    }

    /// What a change may still reserve (negative: over-committed).
    fn space_available(&self, urgent: bool, delayed_items: u64) -> i64 {
        let reserve = if urgent { 0 } else { self.space.global_reserve };
        self.forest.alloc().free_bytes() as i64
            - self.space_reserved(delayed_items) as i64
            - reserve as i64
    }
}

/// The reservation checks per-root operations make. The delayed items
/// counted are this root's: right while it is the only root (step 6 of
/// docs/SNAPSHOTS.md (j) makes `FsInfo` keep the count over every root).
impl<D: BlockDevice> RootCtx<'_, D> {
    /// See [`FsInfo::nodes_promised`].
    pub(crate) fn nodes_promised(&self) -> u64 {
        self.fs.nodes_promised(self.root.delayed.len() as u64)
    }

    /// How many more outstanding extents (each `DELALLOC_EXTENT_ITEMS`
    /// items) the reservations have room for right now, while `unallocated`
    /// bytes of pages a writeback took out of the dirty set still wait for
    /// their allocation (taking them out released their page reservation;
    /// the allocation will take the same bytes of free space). `ordinary`:
    /// without the global reserve, and none while tickets wait (room taken
    /// now would overtake them); `with_reserve`: out of the global reserve
    /// too, as urgent changes may. docs/COMPRESSION.md, "Metadata for
    /// compressed chunks".
    pub(crate) fn extent_room(&self, unallocated: u64) -> ExtentRoom {
        let delayed = self.root.delayed.len() as u64;
        let per_extent = (DELALLOC_EXTENT_ITEMS * self.fs.meta_item()) as i64;
        let room = |urgent: bool| {
            let bytes = self.fs.space_available(urgent, delayed) - unallocated as i64;
            (bytes.max(0) / per_extent) as u64
        };
        ExtentRoom {
            ordinary: if self.fs.space.tickets.is_empty() {
                room(false)
            } else {
                0
            },
            with_reserve: room(true),
        }
    }

    /// Fails with ENOSPC unless `bytes` fit without the global reserve's
    /// last part. Changes reserve through `Filesystem::change_with` before
    /// they run; this only refuses when the filesystem is over-committed
    /// past the global reserve.
    pub(crate) fn ensure_space(&self, bytes: u64) -> Result<()> {
        if self
            .fs
            .space_available(true, self.root.delayed.len() as u64)
            < bytes as i64
        {
            return Err(Error::NoSpace);
        }
        Ok(())
    }
}

impl<D: BlockDevice> Shared<D> {
    /// After anything that may have given space back: grant what fits and
    /// wake whoever waits (ticket holders, throttled writers).
    pub(super) fn space_changed(&self, state: &mut FsState<D>) {
        // What a commit could give back is measured from its lowest point
        // since the filesystem was found full: space freed and then reused
        // (a commit in between released it) does not count twice.
        if let Some(full_at) = state.info.space.full_at {
            state.info.space.full_at = Some(full_at.min(state.commit_could_return()));
        }
        let served = !state.info.space.tickets.is_empty() && state.grant_tickets();
        if served || state.info.space.throttled > 0 || !state.info.space.resolved.is_empty() {
            self.space_cv.notify_all();
        }
    }
}

impl<D: BlockDevice + 'static> Shared<D> {
    /// Keeps the state locked (`state`, taken by the caller) once `need`
    /// fits the reservations, waiting on a ticket when it does not. The
    /// change must run under the returned guard: from then on what it
    /// adds is counted by the derived reservations.
    pub(super) fn reserve<'a>(
        &'a self,
        mut state: RankedGuard<'a, FsState<D>>,
        need: &dyn Fn(&mut FsState<D>) -> Result<Need>,
    ) -> Result<RankedGuard<'a, FsState<D>>> {
        let mut held = 0u64;
        loop {
            if state.info.shut_down {
                state.info.space.release(held);
                return Err(shut_down_error());
            }
            if state.info.failed.is_some() || state.info.options.read_only {
                state.info.space.release(held);
                return Err(Error::ReadOnly);
            }
            let n = match need(&mut state) {
                Ok(n) => n,
                Err(e) => {
                    state.info.space.release(held);
                    self.space_changed(&mut state);
                    return Err(e);
                }
            };
            let wanted = n.total(state.meta_item());
            if wanted <= held {
                state.info.space.release(held);
                return Ok(state);
            }
            if state.space_try_reserve(wanted - held, n.urgent) {
                state.info.space.release(wanted);
                return Ok(state);
            }
            let id = state.info.space.enqueue(wanted - held, n.urgent);
            self.flusher_wake.notify_all();
            let (s, outcome) = self.wait_ticket(state, id);
            state = s;
            match outcome {
                Ok(bytes) => held += bytes,
                Err(refusal) => {
                    state.info.space.release(held);
                    self.space_changed(&mut state);
                    return Err(refusal.to_error());
                }
            }
        }
    }

    /// Sleeps until ticket `id` is served. Without a flusher the waiter
    /// reclaims itself (one reclaimer at a time; it serves every ticket).
    fn wait_ticket<'a>(
        &'a self,
        mut state: RankedGuard<'a, FsState<D>>,
        id: u64,
    ) -> (
        RankedGuard<'a, FsState<D>>,
        std::result::Result<u64, Refusal>,
    ) {
        loop {
            if let Some(outcome) = state.info.space.resolved.remove(&id) {
                return (state, outcome);
            }
            if state.info.failed.is_some() {
                let why = if state.info.shut_down {
                    Refusal::Io("the filesystem was shut down".into())
                } else {
                    Refusal::ReadOnly
                };
                state.info.space.fail_all(why);
                self.space_cv.notify_all();
                continue;
            }
            if state.info.space.flusher_running {
                self.flusher_wake.notify_all();
                state = self.recover_timed_wait(
                    self.space_cv
                        .wait_timeout(state, Duration::from_millis(100)),
                );
                continue;
            }
            match self.reclaim_lock.try_lock() {
                Ok(only) => {
                    drop(state);
                    self.reclaim_locked();
                    drop(only);
                    state = self.lock_state();
                }
                Err(_) => {
                    state = self.recover_timed_wait(
                        self.space_cv.wait_timeout(state, Duration::from_millis(10)),
                    );
                }
            }
        }
    }

    /// Reclaims space for the queued tickets (docs/DELALLOC.md "Reclaim").
    pub(super) fn reclaim(&self) {
        let _only = self.reclaim_lock.lock().expect("reclaim lock poisoned");
        self.reclaim_locked();
    }

    /// Serves the queued tickets by escalating: page-bounded writeback, a
    /// commit, a second commit while space is held for the first, the
    /// cleaner while deleted subvolumes remain, and only then ENOSPC.
    ///
    /// Long because the escalation is one loop over the front ticket
    /// whose state (the commits made for it, fruitless writeback rounds)
    /// every step reads and resets; split into steps, that state and the
    /// lock guard would travel through every call.
    fn reclaim_locked(&self) {
        // Writeback requests in a row that gave nothing back (the oldest
        // pages belonged to long runs); each doubles the next request.
        let mut fruitless = 0u32;
        // The ticket the commits below were made for, and how many: one
        // full cycle per ticket (a commit, and a second one while space is
        // held for the previous commit: only that one releases it), then
        // ENOSPC — never a commit after commit that each give back a few
        // nodes.
        let mut committed_for: Option<(u64, u32)> = None;
        loop {
            let mut state = self.lock_state();
            self.space_changed(&mut state);
            let Some(head) = state.info.space.tickets.front() else {
                return;
            };
            let urgent = head.urgent;
            if state.info.failed.is_some() || state.info.options.read_only {
                state.info.space.fail_all(Refusal::ReadOnly);
                self.space_cv.notify_all();
                return;
            }
            // 1. Page-bounded writeback: it gives back the delalloc metadata
            //    (and the data pages of files that go inline) — when that
            //    can cover the shortfall. It is tried before a commit, which
            //    writes back every dirty page.
            let shortfall = state.space_shortfall();
            if state.info.dirty_page_bytes > 0
                && state.delalloc_metadata() >= shortfall
                && fruitless < MAX_FRUITLESS_REQUESTS
            {
                let pages = (state.reclaim_pages_for(shortfall) << fruitless)
                    .min(MAX_RECLAIM_PAGES)
                    .min(state.info.dirty_page_bytes / PAGE);
                let before = state.space_available(urgent);
                let (back, written) = if state.info.options.ablation.reclaim_whole_inodes {
                    // Seed 004 switched off: as many whole inodes as it
                    // would have written pages (docs/ABLATION.md).
                    self.writeback_oldest_inodes(state, pages)
                } else {
                    self.writeback_oldest(state, pages)
                };
                state = back;
                match written {
                    Ok(n) => state.info.space.note_reclaim_request(n),
                    Err(e) => {
                        state.info.failed = Some(e.to_string());
                        state.info.space.fail_all(Refusal::Io(e.to_string()));
                        self.space_cv.notify_all();
                        return;
                    }
                }
                self.space_changed(&mut state);
                if state.info.space.tickets.is_empty() {
                    return;
                }
                if state.space_available(urgent) > before {
                    fruitless = 0;
                } else {
                    fruitless += 1;
                }
                continue;
            }
            fruitless = 0;
            let head_id = state.info.space.front_ticket().unwrap_or(0);
            // Found full before, and not enough freed since for a commit
            // to cover this ticket: ENOSPC without another commit.
            let cannot_cover = committed_for.is_none_or(|(id, _)| id != head_id)
                && state.commit_cannot_cover(shortfall);
            if cannot_cover && !state.subvols.dead.is_empty() {
                drop(state);
                if !self.clean_for_space() {
                    return;
                }
                committed_for = None;
                continue;
            }
            if cannot_cover {
                state.info.space.stats.enospc_without_commit += 1;
                state.info.space.serve_front(Err(Refusal::NoSpace));
                self.space_cv.notify_all();
                continue;
            }
            // 2. Commit: the transaction's worst-case metadata becomes what
            //    it really used, and space pinned by earlier frees returns.
            let commits = committed_for
                .filter(|&(id, _)| id == head_id)
                .map_or(1, |(_, n)| n + 1);
            committed_for = Some((head_id, commits));
            state.info.space.stats.reclaim_commits += 1;
            drop(state);
            let committed = self.commit_for_space();
            let mut state = self.lock_state();
            if let Err(e) = committed {
                state.info.space.fail_all(Refusal::Io(e.to_string()));
                self.space_cv.notify_all();
                return;
            }
            self.space_changed(&mut state);
            if state.info.space.front_ticket() != Some(head_id) {
                // The commit satisfied the ticket it was made for.
                state.info.space.full_at = None;
                continue;
            }
            // 3. The cycle did not satisfy the ticket: truly full for it,
            //    unless the next commit releases held space.
            if commits < 2 && state.info.forest.alloc().held_bytes() > 0 {
                continue;
            }
            // 4. Deleted subvolumes give their space back as the cleaner
            //    drops them (docs/SNAPSHOTS.md (d)): before any ENOSPC.
            if !state.subvols.dead.is_empty() {
                drop(state);
                if !self.clean_for_space() {
                    return;
                }
                committed_for = None;
                continue;
            }
            state.info.space.full_at = Some(state.commit_could_return());
            state.info.space.serve_front(Err(Refusal::NoSpace));
            self.space_cv.notify_all();
        }
    }

    /// Runs one transaction of the cleaner for a reclaim; on failure the
    /// tickets fail with the error and false is returned.
    fn clean_for_space(&self) -> bool {
        match self.clean_one_transaction() {
            Ok(_) => true,
            Err(e) => {
                let mut state = self.lock_state();
                state.info.space.fail_all(Refusal::Io(e.to_string()));
                self.space_cv.notify_all();
                false
            }
        }
    }

    /// A writer found dirty memory over the limit: wait for the flusher to
    /// bring it down, or (without a flusher) write back the oldest pages
    /// until it is at three quarters of the limit. Never commits.
    pub(super) fn balance_dirty(&self) {
        let mut state = self.lock_state();
        let limit = state.info.options.dirty_limit_bytes;
        if state.info.dirty_page_bytes <= limit || state.info.failed.is_some() {
            return;
        }
        let started = Instant::now();
        state.info.space.stats.throttled_writes += 1;
        if state.info.space.flusher_running {
            state.info.space.throttled += 1;
            while state.info.dirty_page_bytes > limit
                && state.info.failed.is_none()
                && state.info.space.flusher_running
            {
                self.flusher_wake.notify_all();
                state = self.recover_timed_wait(
                    self.space_cv
                        .wait_timeout(state, Duration::from_millis(100)),
                );
            }
            state.info.space.throttled -= 1;
        } else {
            let target = limit / 4 * 3;
            while state.info.dirty_page_bytes > target {
                let want = (state.info.dirty_page_bytes - target).div_ceil(PAGE);
                let (back, written) = self.writeback_oldest(state, want);
                state = back;
                match written {
                    Ok(0) => break,
                    Ok(n) => state.info.space.stats.throttle_pages += n,
                    Err(e) => {
                        state.info.failed = Some(e.to_string());
                        break;
                    }
                }
            }
            self.space_changed(&mut state);
        }
        let waited = started.elapsed().as_micros() as u64;
        let s = &mut state.info.space.stats;
        s.throttle_wait_max_us = s.throttle_wait_max_us.max(waited);
    }
}

/// The background flusher: reclaims for tickets, and keeps dirty memory
/// under half the limit by writing back the oldest pages in small batches.
pub(super) fn flusher<D: BlockDevice + 'static>(shared: std::sync::Arc<Shared<D>>) {
    enum Work {
        Reclaim,
        Background,
    }
    /// However the flusher ends (a panic included), waiters stop counting
    /// on it and reclaim for themselves.
    struct Gone<'a, D: BlockDevice>(&'a Shared<D>);
    impl<D: BlockDevice> Drop for Gone<'_, D> {
        fn drop(&mut self) {
            let mut state = match self.0.state.lock() {
                Ok(state) => state,
                Err(poisoned) => poisoned.into_inner(),
            };
            state.info.space.flusher_running = false;
            self.0.space_cv.notify_all();
        }
    }
    let _gone = Gone(&shared);
    loop {
        let work = {
            let mut state = shared.lock_state();
            loop {
                if state.info.space.flusher_stop {
                    return;
                }
                if !state.info.space.tickets.is_empty() {
                    break Work::Reclaim;
                }
                if state.info.failed.is_none()
                    && !state.info.options.read_only
                    && state.info.dirty_page_bytes > state.background_threshold()
                {
                    break Work::Background;
                }
                state = shared.recover_timed_wait(
                    shared
                        .flusher_wake
                        .wait_timeout(state, Duration::from_millis(500)),
                );
            }
        };
        match work {
            Work::Reclaim => shared.reclaim(),
            Work::Background => {
                let mut state = shared.lock_state();
                let over = state
                    .info
                    .dirty_page_bytes
                    .saturating_sub(state.background_threshold());
                let pages = over.div_ceil(PAGE).clamp(1, BACKGROUND_BATCH_PAGES);
                let (back, written) = shared.writeback_oldest(state, pages);
                state = back;
                match written {
                    Ok(n) => state.info.space.stats.background_pages += n,
                    Err(e) => state.info.failed = Some(e.to_string()),
                }
                shared.space_changed(&mut state);
            }
        }
    }
}
