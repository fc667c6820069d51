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

use super::transaction::{shut_down_error, Shared};
use super::FsState;
use crate::alloc::TransactionSpace;
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::format::{MetadataProfile, MAX_EXTENT_BYTES, NODE_SIZE, SECTOR_SIZE};
use crate::lock_order::RankedGuard;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

pub use super::types::{SpaceStats, SpaceUsage};

const PAGE: u64 = SECTOR_SIZE;
/// Worst-case metadata one changed item costs a transaction: a copy of the
/// leaf it lives in (under DUP twice that: the leaf and its mirror, see
/// [`FsState::meta_item`]).
pub(crate) const META_ITEM: u64 = NODE_SIZE as u64;
/// Items one run of dirty pages becomes: a file extent item and an extent
/// item.
const DELALLOC_EXTENT_ITEMS: u64 = 2;
/// Most bytes one new item adds to a leaf (header plus the largest item the
/// engine batches: a dir index with a 255-byte name).
const GROWTH_PER_ITEM: u64 = 320;
/// Nodes every commit may copy whatever it holds: root items, new levels.
const TXN_FIXED_NODES: u64 = 16;
/// Items statfs leaves for creating the file that a fallocate of all the
/// available space goes to: what a create reserves (`Filesystem::mknod`).
const NEW_FILE_ITEMS: u64 = 6;
/// Bounds of one reclaim request, in pages.
pub(crate) const MIN_RECLAIM_PAGES: u64 = 16;
pub(crate) const MAX_RECLAIM_PAGES: u64 = 4096;
/// Reclaim requests in a row that gave nothing back before reclaim commits.
const MAX_FRUITLESS_REQUESTS: u32 = 4;
/// Pages the flusher writes back per state-lock hold when dirty memory is
/// above the background threshold.
pub(crate) const BACKGROUND_BATCH_PAGES: u64 = 256;
/// Largest piece of a write reserved (and accepted) at once.
pub(crate) const WRITE_CHUNK: u64 = 1 << 20;

/// What a change may add to the reservations, stated before it runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Need {
    /// Data pages, in bytes.
    pub bytes: u64,
    /// Changed items, each costing [`FsState::meta_item`].
    pub items: u64,
    /// May use the global reserve (changes that free space: unlink, rmdir,
    /// truncate, punch, fsync), and may pass queued tickets.
    pub urgent: bool,
}

impl Need {
    pub const NONE: Need = Need {
        bytes: 0,
        items: 0,
        urgent: false,
    };

    pub fn items(n: u64) -> Need {
        Need {
            bytes: 0,
            items: n,
            urgent: false,
        }
    }

    pub fn urgent_items(n: u64) -> Need {
        Need {
            items: n,
            urgent: true,
            ..Need::NONE
        }
    }

    /// The bytes to reserve when one item costs `meta_item`.
    pub fn total(self, meta_item: u64) -> u64 {
        self.bytes + self.items * meta_item
    }

    pub fn plus_bytes(self, bytes: u64) -> Need {
        Need {
            bytes: self.bytes + bytes,
            ..self
        }
    }
}

/// What preallocating `holes` bytes may add: the bytes, a page (an inline
/// file's page 0), and per extent a file extent item and an extent item.
/// statfs subtracts the same from what it calls available, so one
/// fallocate can take all of it.
pub(crate) fn prealloc_need(holes: u64) -> Need {
    let extents = holes.div_ceil(MAX_EXTENT_BYTES) + 1;
    Need::items(2 * extents + 1).plus_bytes(holes + PAGE)
}

/// Delalloc bookkeeping of one inode with dirty pages.
#[derive(Debug, Clone, Copy)]
struct DirtyInode {
    /// Runs of contiguous dirty pages (outstanding extents).
    runs: u64,
    /// Position in the dirty queue: when the inode became dirty.
    seq: u64,
    /// Where the next page-bounded writeback of this inode starts.
    cursor: u64,
}

/// Why a ticket was not granted.
#[derive(Debug, Clone)]
enum Refusal {
    NoSpace,
    ReadOnly,
    Io(String),
}

impl Refusal {
    fn to_error(&self) -> Error {
        match self {
            Refusal::NoSpace => Error::NoSpace,
            Refusal::ReadOnly => Error::ReadOnly,
            Refusal::Io(why) => Error::Io(std::io::Error::other(why.clone())),
        }
    }
}

#[derive(Debug)]
struct Ticket {
    id: u64,
    bytes: u64,
    urgent: bool,
    queued: Instant,
}

/// The space accounting of a mounted filesystem (lives in `FsState`).
#[derive(Debug)]
pub(crate) struct SpaceInfo {
    global_reserve: u64,
    dirty: HashMap<u64, DirtyInode>,
    /// Inodes with dirty pages, oldest first.
    queue: BTreeMap<u64, u64>,
    next_seq: u64,
    /// Sum of `runs` over `dirty`.
    runs: u64,
    /// Granted to writers (tickets, or a change about to run) and not used yet.
    granted: u64,
    /// Space the commit in flight will unpin once durable.
    committing_pinned: u64,
    /// Set when a ticket failed after a full reclaim cycle: what a commit
    /// could then have given back ([`FsState::commit_could_return`]).
    /// Until that has grown by a ticket's shortfall (space freed since), a
    /// commit cannot satisfy the ticket and it fails without one.
    full_at: Option<u64>,
    tickets: VecDeque<Ticket>,
    /// Outcome of tickets no longer queued, until their writer looks.
    resolved: HashMap<u64, std::result::Result<u64, Refusal>>,
    next_ticket: u64,
    last_served: u64,
    /// Writers waiting for dirty memory to drop under the limit.
    throttled: u64,
    pub flusher_running: bool,
    pub flusher_stop: bool,
    pub stats: SpaceStats,
}

impl SpaceInfo {
    pub fn new(total_bytes: u64, profile: MetadataProfile) -> SpaceInfo {
        SpaceInfo {
            global_reserve: global_reserve_for(total_bytes, profile),
            dirty: HashMap::new(),
            queue: BTreeMap::new(),
            next_seq: 1,
            runs: 0,
            granted: 0,
            committing_pinned: 0,
            full_at: None,
            tickets: VecDeque::new(),
            resolved: HashMap::new(),
            next_ticket: 1,
            last_served: 0,
            throttled: 0,
            flusher_running: false,
            flusher_stop: false,
            stats: SpaceStats::default(),
        }
    }

    /// Inodes with dirty pages, oldest first.
    pub fn dirty_inodes(&self) -> Vec<u64> {
        self.queue.values().copied().collect()
    }

    pub fn oldest_dirty_inode(&self) -> Option<u64> {
        self.queue.values().next().copied()
    }

    pub fn has_dirty(&self, ino: u64) -> bool {
        self.dirty.contains_key(&ino)
    }

    pub fn cursor(&self, ino: u64) -> u64 {
        self.dirty.get(&ino).map_or(0, |d| d.cursor)
    }

    pub fn set_cursor(&mut self, ino: u64, cursor: u64) {
        if let Some(d) = self.dirty.get_mut(&ino) {
            d.cursor = cursor;
        }
    }

    #[cfg(debug_assertions)]
    pub fn runs_of(&self, ino: u64) -> u64 {
        self.dirty.get(&ino).map_or(0, |d| d.runs)
    }

    /// A page became dirty; `left`/`right`: its neighbours are dirty.
    pub fn page_added(&mut self, ino: u64, left: bool, right: bool) {
        let seq = self.next_seq;
        let d = self.dirty.entry(ino).or_insert_with(|| DirtyInode {
            runs: 0,
            seq,
            cursor: 0,
        });
        if d.seq == seq {
            self.next_seq += 1;
            self.queue.insert(seq, ino);
        }
        // A lone page starts a run; one between two runs joins them.
        let before = d.runs;
        d.runs = d.runs + 1 - u64::from(left) - u64::from(right);
        self.runs = self.runs + d.runs - before;
    }

    /// A dirty page went away (written back or dropped); `left`/`right`:
    /// its neighbours are still dirty; `now_clean`: it was the last one.
    pub fn page_removed(&mut self, ino: u64, left: bool, right: bool, now_clean: bool) {
        let d = self
            .dirty
            .get_mut(&ino)
            .unwrap_or_else(|| panic!("dirty page of inode {ino} not accounted"));
        let before = d.runs;
        d.runs = d.runs + u64::from(left) + u64::from(right) - 1;
        self.runs = self.runs + d.runs - before;
        if now_clean {
            debug_assert_eq!(d.runs, 0, "inode {ino} clean with runs left");
            let seq = d.seq;
            self.dirty.remove(&ino);
            self.queue.remove(&seq);
        }
    }

    fn release(&mut self, bytes: u64) {
        self.granted = self
            .granted
            .checked_sub(bytes)
            .expect("released more space than was granted");
    }

    fn enqueue(&mut self, bytes: u64, urgent: bool) -> u64 {
        let id = self.next_ticket;
        self.next_ticket += 1;
        self.tickets.push_back(Ticket {
            id,
            bytes,
            urgent,
            queued: Instant::now(),
        });
        self.stats.tickets_queued += 1;
        id
    }

    /// Records the outcome of the ticket at the front of the queue.
    fn serve_front(&mut self, outcome: std::result::Result<(), Refusal>) {
        let t = self.tickets.pop_front().expect("a ticket to serve");
        if t.id < self.last_served {
            self.stats.tickets_out_of_order += 1;
        }
        self.last_served = t.id;
        let waited = t.queued.elapsed().as_micros() as u64;
        self.stats.ticket_wait_total_us += waited;
        self.stats.ticket_wait_max_us = self.stats.ticket_wait_max_us.max(waited);
        let outcome = match outcome {
            Ok(()) => {
                self.granted += t.bytes;
                self.stats.tickets_granted += 1;
                Ok(t.bytes)
            }
            Err(r) => {
                self.stats.tickets_failed += 1;
                Err(r)
            }
        };
        self.resolved.insert(t.id, outcome);
    }

    /// A reclaim request wrote back `pages`.
    fn note_reclaim_request(&mut self, pages: u64) {
        let s = &mut self.stats;
        s.reclaim_requests += 1;
        s.reclaim_pages += pages;
        s.reclaim_pages_max = s.reclaim_pages_max.max(pages);
    }

    fn fail_all(&mut self, why: Refusal) {
        while !self.tickets.is_empty() {
            self.serve_front(Err(why.clone()));
        }
    }
}

/// btrfs-like global reserve: kept back from ordinary reservations so that
/// a full filesystem can still be emptied and commit.
/// Under DUP every node it stands for costs twice the space.
fn global_reserve_for(total: u64, profile: MetadataProfile) -> u64 {
    (total / 32).clamp(4 << 20, 512 << 20) * profile.node_footprint() / NODE_SIZE as u64
}

impl<D: BlockDevice> FsState<D> {
    /// What one changed item may cost a transaction: a copy of its leaf,
    /// on every copy the metadata profile keeps (docs/DUP.md).
    pub(crate) fn meta_item(&self) -> u64 {
        self.forest.alloc().profile().node_footprint()
    }

    /// Metadata reserved for the extents dirty data will become.
    pub(crate) fn delalloc_metadata(&self) -> u64 {
        self.space.runs * DELALLOC_EXTENT_ITEMS * self.meta_item()
    }

    /// Worst case of the nodes the running transaction may still copy for
    /// work already queued: a leaf per pending item, but never more than
    /// every node not yet copied in this transaction plus what the new items
    /// can add.
    pub(crate) fn transaction_metadata(&self) -> u64 {
        let items = self.delayed.len() as u64 + self.forest.alloc().delayed_ref_count() as u64;
        let meta_item = self.meta_item();
        let per_item = items * meta_item;
        let copied = self.forest.dirty_node_count() as u64 * meta_item;
        let growth = (2 * items * GROWTH_PER_ITEM).div_ceil(META_ITEM) * meta_item;
        let cap = self.forest.alloc().metadata_bytes().saturating_sub(copied) + growth;
        per_item.min(cap) + TXN_FIXED_NODES * meta_item
    }

    /// What the pending work will leave allocated once committed: the new
    /// items' bytes (at half-full leaves). The copies of existing nodes the
    /// worst-case estimates allow for are transient: a commit frees the
    /// old copies.
    fn settled_metadata(&self) -> u64 {
        let items = self.space.runs * DELALLOC_EXTENT_ITEMS
            + self.delayed.len() as u64
            + self.forest.alloc().delayed_ref_count() as u64;
        2 * items * GROWTH_PER_ITEM * self.meta_item() / META_ITEM
    }

    /// Node space the accounting has promised (both copies under DUP):
    /// the metadata reservations and the global reserve. Data allocation
    /// leaves that much room for node pairs (`TransactionSpace::alloc_data`).
    pub(crate) fn nodes_promised(&self) -> u64 {
        self.delalloc_metadata() + self.transaction_metadata() + self.space.global_reserve
    }

    pub(crate) fn space_reserved(&self) -> u64 {
        self.dirty_page_bytes
            + self.delalloc_metadata()
            + self.transaction_metadata()
            + self.space.granted
    }

    /// What a change may still reserve (negative: over-committed).
    pub(crate) fn space_available(&self, urgent: bool) -> i64 {
        let reserve = if urgent { 0 } else { self.space.global_reserve };
        self.forest.alloc().free_bytes() as i64 - self.space_reserved() as i64 - reserve as i64
    }

    /// Fails with ENOSPC unless `bytes` fit without the global reserve's
    /// last part. Changes reserve through `Filesystem::change_with` before
    /// they run; this only refuses when the filesystem is over-committed
    /// past the global reserve.
    pub(crate) fn ensure_space(&self, bytes: u64) -> Result<()> {
        if self.space_available(true) < bytes as i64 {
            return Err(Error::NoSpace);
        }
        Ok(())
    }

    /// Takes `bytes` now if they fit and no older ticket waits (an urgent
    /// change may pass tickets, out of the global reserve).
    fn space_try_reserve(&mut self, bytes: u64, urgent: bool) -> bool {
        if bytes == 0 {
            return true;
        }
        if !urgent && !self.space.tickets.is_empty() {
            return false;
        }
        if self.space_available(urgent) >= bytes as i64 {
            self.space.granted += bytes;
            return true;
        }
        false
    }

    /// Grants queued tickets, in order, while they fit. Returns whether any
    /// was served.
    pub(crate) fn grant_tickets(&mut self) -> bool {
        let mut served = false;
        while let Some(t) = self.space.tickets.front() {
            if self.space_available(t.urgent) < t.bytes as i64 {
                break;
            }
            self.space.serve_front(Ok(()));
            served = true;
        }
        served
    }

    /// How much the queued tickets lack.
    fn space_shortfall(&self) -> u64 {
        let Some(head) = self.space.tickets.front() else {
            return 0;
        };
        let wanted: u64 = self.space.tickets.iter().map(|t| t.bytes).sum();
        (wanted as i64 - self.space_available(head.urgent)).max(PAGE as i64) as u64
    }

    /// The most a commit (and the one after it, for held space) can give
    /// back: what is pinned, held or committing, the data extents pending
    /// extent-tree changes may free, and the running
    /// transaction's worst-case metadata beyond the part every transaction
    /// reserves again. A shortfall larger than what this grew by since
    /// the filesystem was last found full is not worth a commit.
    fn commit_could_return(&self) -> u64 {
        let alloc = self.forest.alloc();
        let fixed = TXN_FIXED_NODES * self.meta_item();
        alloc.pinned_bytes()
            + alloc.delayed_free_bytes()
            + alloc.log_pinned_bytes()
            + alloc.held_bytes()
            + self.space.committing_pinned
            + self.transaction_metadata().saturating_sub(fixed)
    }

    /// Whether a full reclaim cycle found the filesystem full and what a
    /// commit could give back has not grown by `shortfall` since.
    fn commit_cannot_cover(&self, shortfall: u64) -> bool {
        self.space
            .full_at
            .is_some_and(|full_at| self.commit_could_return().saturating_sub(full_at) < shortfall)
    }

    /// Pages a reclaim request writes back for a shortfall of `bytes`: as
    /// many as give back that much on average, within bounds.
    fn reclaim_pages_for(&self, bytes: u64) -> u64 {
        let dirty_pages = self.dirty_page_bytes / PAGE;
        let per_page = (self.delalloc_metadata() / dirty_pages.max(1)).max(1);
        bytes
            .div_ceil(per_page)
            .clamp(MIN_RECLAIM_PAGES, MAX_RECLAIM_PAGES)
            .min(dirty_pages)
    }

    /// Dirty memory above which the flusher writes back.
    fn background_threshold(&self) -> u64 {
        self.options.dirty_limit_bytes / 2
    }

    /// The commit being prepared will unpin these bytes once durable.
    pub(crate) fn note_committing_pinned(&mut self, bytes: u64) {
        self.space.committing_pinned = bytes;
    }

    pub(crate) fn space_usage(&self) -> SpaceUsage {
        let alloc = self.forest.alloc();
        SpaceUsage {
            total: alloc.total_bytes(),
            free: alloc.free_bytes(),
            pinned: alloc.pinned_bytes()
                + alloc.log_pinned_bytes()
                + alloc.held_bytes()
                + self.space.committing_pinned,
            dirty_data: self.dirty_page_bytes,
            delalloc_metadata: self.delalloc_metadata(),
            transaction_metadata: self.transaction_metadata(),
            granted: self.space.granted,
            settled_metadata: self.settled_metadata(),
            global_reserve: self.space.global_reserve,
            available: self.space_available(false),
            tickets_waiting: self.space.tickets.len() as u64,
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
        let churn = self.forest.alloc().held_bytes().min(fixed);
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
            files_free: u64::from(u32::MAX).saturating_sub(self.next_ino),
            name_max: crate::format::NAME_MAX as u32,
        }
    }
}

impl<D: BlockDevice> Shared<D> {
    /// After anything that may have given space back: grant what fits and
    /// wake whoever waits (ticket holders, throttled writers).
    pub(super) fn space_changed(&self, state: &mut FsState<D>) {
        // What a commit could give back is measured from its lowest point
        // since the filesystem was found full: space freed and then reused
        // (a commit in between released it) does not count twice.
        if let Some(full_at) = state.space.full_at {
            state.space.full_at = Some(full_at.min(state.commit_could_return()));
        }
        let served = !state.space.tickets.is_empty() && state.grant_tickets();
        if served || state.space.throttled > 0 || !state.space.resolved.is_empty() {
            self.space_cv.notify_all();
        }
    }
}

impl<D: BlockDevice + 'static> Shared<D> {
    /// Locks the state once `need` fits the reservations, waiting on a
    /// ticket when it does not. The change must run under the returned
    /// guard: from then on what it adds is counted by the derived
    /// reservations.
    pub(super) fn reserve(
        &self,
        need: &dyn Fn(&mut FsState<D>) -> Result<Need>,
    ) -> Result<RankedGuard<'_, FsState<D>>> {
        let mut state = self.lock_state();
        let mut held = 0u64;
        loop {
            if state.shut_down {
                state.space.release(held);
                return Err(shut_down_error());
            }
            if state.failed.is_some() || state.options.read_only {
                state.space.release(held);
                return Err(Error::ReadOnly);
            }
            let n = match need(&mut state) {
                Ok(n) => n,
                Err(e) => {
                    state.space.release(held);
                    self.space_changed(&mut state);
                    return Err(e);
                }
            };
            let wanted = n.total(state.meta_item());
            if wanted <= held {
                state.space.release(held);
                return Ok(state);
            }
            if state.space_try_reserve(wanted - held, n.urgent) {
                state.space.release(wanted);
                return Ok(state);
            }
            let id = state.space.enqueue(wanted - held, n.urgent);
            self.flusher_wake.notify_all();
            let (s, outcome) = self.wait_ticket(state, id);
            state = s;
            match outcome {
                Ok(bytes) => held += bytes,
                Err(refusal) => {
                    state.space.release(held);
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
            if let Some(outcome) = state.space.resolved.remove(&id) {
                return (state, outcome);
            }
            if state.failed.is_some() {
                let why = if state.shut_down {
                    Refusal::Io("the filesystem was shut down".into())
                } else {
                    Refusal::ReadOnly
                };
                state.space.fail_all(why);
                self.space_cv.notify_all();
                continue;
            }
            if state.space.flusher_running {
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
            let Some(head) = state.space.tickets.front() else {
                return;
            };
            let urgent = head.urgent;
            if state.failed.is_some() || state.options.read_only {
                state.space.fail_all(Refusal::ReadOnly);
                self.space_cv.notify_all();
                return;
            }
            // 1. Page-bounded writeback: it gives back the delalloc metadata
            //    (and the data pages of files that go inline) — when that
            //    can cover the shortfall. It is tried before a commit, which
            //    writes back every dirty page.
            let shortfall = state.space_shortfall();
            if state.dirty_page_bytes > 0
                && state.delalloc_metadata() >= shortfall
                && fruitless < MAX_FRUITLESS_REQUESTS
            {
                let pages = (state.reclaim_pages_for(shortfall) << fruitless)
                    .min(MAX_RECLAIM_PAGES)
                    .min(state.dirty_page_bytes / PAGE);
                let before = state.space_available(urgent);
                match state.writeback_oldest(pages) {
                    Ok(n) => state.space.note_reclaim_request(n),
                    Err(e) => {
                        state.failed = Some(e.to_string());
                        state.space.fail_all(Refusal::Io(e.to_string()));
                        self.space_cv.notify_all();
                        return;
                    }
                }
                self.space_changed(&mut state);
                if state.space.tickets.is_empty() {
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
            let head_id = state.space.tickets.front().map_or(0, |t| t.id);
            // Found full before, and not enough freed since for a commit
            // to cover this ticket: ENOSPC without another commit.
            if committed_for.is_none_or(|(id, _)| id != head_id)
                && state.commit_cannot_cover(shortfall)
            {
                state.space.stats.enospc_without_commit += 1;
                state.space.serve_front(Err(Refusal::NoSpace));
                self.space_cv.notify_all();
                continue;
            }
            // 2. Commit: the transaction's worst-case metadata becomes what
            //    it really used, and space pinned by earlier frees returns.
            let commits = committed_for
                .filter(|&(id, _)| id == head_id)
                .map_or(1, |(_, n)| n + 1);
            committed_for = Some((head_id, commits));
            state.space.stats.reclaim_commits += 1;
            drop(state);
            let committed = self.commit_for_space();
            let mut state = self.lock_state();
            if let Err(e) = committed {
                state.space.fail_all(Refusal::Io(e.to_string()));
                self.space_cv.notify_all();
                return;
            }
            self.space_changed(&mut state);
            if state.space.tickets.front().is_none_or(|t| t.id != head_id) {
                // The commit satisfied the ticket it was made for.
                state.space.full_at = None;
                continue;
            }
            // 3. The cycle did not satisfy the ticket: truly full for it,
            //    unless the next commit releases held space.
            if commits < 2 && state.forest.alloc().held_bytes() > 0 {
                continue;
            }
            state.space.full_at = Some(state.commit_could_return());
            state.space.serve_front(Err(Refusal::NoSpace));
            self.space_cv.notify_all();
        }
    }

    /// A writer found dirty memory over the limit: wait for the flusher to
    /// bring it down, or (without a flusher) write back the oldest pages
    /// until it is at three quarters of the limit. Never commits.
    pub(super) fn balance_dirty(&self) {
        let mut state = self.lock_state();
        let limit = state.options.dirty_limit_bytes;
        if state.dirty_page_bytes <= limit || state.failed.is_some() {
            return;
        }
        let started = Instant::now();
        state.space.stats.throttled_writes += 1;
        if state.space.flusher_running {
            state.space.throttled += 1;
            while state.dirty_page_bytes > limit
                && state.failed.is_none()
                && state.space.flusher_running
            {
                self.flusher_wake.notify_all();
                state = self.recover_timed_wait(
                    self.space_cv
                        .wait_timeout(state, Duration::from_millis(100)),
                );
            }
            state.space.throttled -= 1;
        } else {
            let target = limit / 4 * 3;
            while state.dirty_page_bytes > target {
                let want = (state.dirty_page_bytes - target).div_ceil(PAGE);
                match state.writeback_oldest(want) {
                    Ok(0) => break,
                    Ok(n) => state.space.stats.throttle_pages += n,
                    Err(e) => {
                        state.failed = Some(e.to_string());
                        break;
                    }
                }
            }
            self.space_changed(&mut state);
        }
        let waited = started.elapsed().as_micros() as u64;
        let s = &mut state.space.stats;
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
            state.space.flusher_running = false;
            self.0.space_cv.notify_all();
        }
    }
    let _gone = Gone(&shared);
    loop {
        let work = {
            let mut state = shared.lock_state();
            loop {
                if state.space.flusher_stop {
                    return;
                }
                if !state.space.tickets.is_empty() {
                    break Work::Reclaim;
                }
                if state.failed.is_none()
                    && !state.options.read_only
                    && state.dirty_page_bytes > state.background_threshold()
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
                    .dirty_page_bytes
                    .saturating_sub(state.background_threshold());
                let pages = over.div_ceil(PAGE).clamp(1, BACKGROUND_BATCH_PAGES);
                match state.writeback_oldest(pages) {
                    Ok(n) => state.space.stats.background_pages += n,
                    Err(e) => state.failed = Some(e.to_string()),
                }
                shared.space_changed(&mut state);
            }
        }
    }
}
