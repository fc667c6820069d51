//! The space accounting's state: what changes need, the dirty-inode queue,
//! tickets. A leaf: reservation and reclaim are in space.rs
//! (docs/DELALLOC.md).

use super::types::SpaceStats;
use crate::error::Error;
use crate::format::{MetadataProfile, MAX_EXTENT_BYTES, NODE_SIZE, SECTOR_SIZE};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Instant;

const PAGE: u64 = SECTOR_SIZE;
/// Worst-case metadata one changed item costs a transaction: a copy of the
/// leaf it lives in (under DUP twice that: the leaf and its mirror, see
/// `FsInfo::meta_item`).
pub(crate) const META_ITEM: u64 = NODE_SIZE as u64;
/// Items one run of dirty pages becomes: a file extent item and an extent
/// item.
pub(super) const DELALLOC_EXTENT_ITEMS: u64 = 2;
/// Most bytes one new item adds to a leaf (header plus the largest item the
/// engine batches: a dir index with a 255-byte name).
pub(super) const GROWTH_PER_ITEM: u64 = 320;
/// Nodes every commit may copy whatever it holds: root items, new levels.
pub(super) const TXN_FIXED_NODES: u64 = 16;
/// Items statfs leaves for creating the file that a fallocate of all the
/// available space goes to: what a create reserves (`Filesystem::mknod`).
pub(super) const NEW_FILE_ITEMS: u64 = 6;
/// Bounds of one reclaim request, in pages.
pub(crate) const MIN_RECLAIM_PAGES: u64 = 16;
pub(crate) const MAX_RECLAIM_PAGES: u64 = 4096;
/// Reclaim requests in a row that gave nothing back before reclaim commits.
pub(super) const MAX_FRUITLESS_REQUESTS: u32 = 4;
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
    /// Changed items, each costing `FsInfo::meta_item`.
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
pub(super) struct DirtyInode {
    /// Runs of contiguous dirty pages (outstanding extents).
    pub(super) runs: u64,
    /// Position in the dirty queue: when the inode became dirty.
    pub(super) seq: u64,
    /// Where the next page-bounded writeback of this inode starts.
    pub(super) cursor: u64,
}

/// Why a ticket was not granted.
#[derive(Debug, Clone)]
pub(super) enum Refusal {
    NoSpace,
    ReadOnly,
    Io(String),
}

impl Refusal {
    pub(super) fn to_error(&self) -> Error {
        match self {
            Refusal::NoSpace => Error::NoSpace,
            Refusal::ReadOnly => Error::ReadOnly,
            Refusal::Io(why) => Error::Io(std::io::Error::other(why.clone())),
        }
    }
}

#[derive(Debug)]
pub(super) struct Ticket {
    pub(super) id: u64,
    pub(super) bytes: u64,
    pub(super) urgent: bool,
    pub(super) queued: Instant,
}

/// The space accounting of a mounted filesystem (lives in `FsState`).
#[derive(Debug)]
pub(crate) struct SpaceInfo {
    pub(super) global_reserve: u64,
    pub(super) dirty: HashMap<u64, DirtyInode>,
    /// Inodes with dirty pages, oldest first.
    pub(super) queue: BTreeMap<u64, u64>,
    pub(super) next_seq: u64,
    /// Sum of `runs` over `dirty`.
    pub(super) runs: u64,
    /// Granted to writers (tickets, or a change about to run) and not used yet.
    pub(super) granted: u64,
    /// Space the commit in flight will unpin once durable.
    pub(super) committing_pinned: u64,
    /// Set when a ticket failed after a full reclaim cycle: what a commit
    /// could then have given back (`FsState::commit_could_return`).
    /// Until that has grown by a ticket's shortfall (space freed since), a
    /// commit cannot satisfy the ticket and it fails without one.
    pub(super) full_at: Option<u64>,
    pub(super) tickets: VecDeque<Ticket>,
    /// Outcome of tickets no longer queued, until their writer looks.
    pub(super) resolved: HashMap<u64, std::result::Result<u64, Refusal>>,
    pub(super) next_ticket: u64,
    pub(super) last_served: u64,
    /// Writers waiting for dirty memory to drop under the limit.
    pub(super) throttled: u64,
    pub flusher_running: bool,
    pub flusher_stop: bool,
    pub stats: SpaceStats,
}

impl SpaceInfo {
    /// The id of the oldest ticket waiting, if any.
    pub(super) fn front_ticket(&self) -> Option<u64> {
        self.tickets.front().map(|t| t.id)
    }

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

    /// The oldest dirty inode `skip` does not refuse (inodes with a
    /// writeback in flight are skipped: one at a time per inode).
    pub fn oldest_dirty_inode_except(&self, skip: impl Fn(u64) -> bool) -> Option<u64> {
        self.queue.values().copied().find(|&ino| !skip(ino))
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

    /// Runs of dirty pages (outstanding extents) of inode `ino` (its
    /// external number).
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

    pub(super) fn release(&mut self, bytes: u64) {
        self.granted = self
            .granted
            .checked_sub(bytes)
            .expect("released more space than was granted");
    }

    pub(super) fn enqueue(&mut self, bytes: u64, urgent: bool) -> u64 {
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
    pub(super) fn serve_front(&mut self, outcome: std::result::Result<(), Refusal>) {
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
    pub(super) fn note_reclaim_request(&mut self, pages: u64) {
        let s = &mut self.stats;
        s.reclaim_requests += 1;
        s.reclaim_pages += pages;
        s.reclaim_pages_max = s.reclaim_pages_max.max(pages);
    }

    pub(super) fn fail_all(&mut self, why: Refusal) {
        while !self.tickets.is_empty() {
            self.serve_front(Err(why.clone()));
        }
    }
}

/// btrfs-like global reserve: kept back from ordinary reservations so that
/// a full filesystem can still be emptied and commit.
/// Under DUP every node it stands for costs twice the space.
pub(super) fn global_reserve_for(total: u64, profile: MetadataProfile) -> u64 {
    (total / 32).clamp(4 << 20, 512 << 20) * profile.node_footprint() / NODE_SIZE as u64
}
