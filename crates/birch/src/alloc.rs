//! Space allocation.
//!
//! In memory: the free ranges of the device, the ranges *pinned* by the
//! running transaction (freed in it, so still referenced by the last durable
//! commit), and the *delayed refs*: extent-tree changes (new extents,
//! reference count deltas, freed extents) batched until commit, when they
//! are applied to the extent tree in one pass. On disk the extent tree is
//! the record of every allocated byte; the free map is rebuilt from it at
//! mount.
//!
//! Invariants (docs/ALLOCATION.md):
//! - a byte is in exactly one of: free, pinned (this or the committing
//!   transaction), or referenced by an extent item / a delayed ref;
//! - nothing referenced by the last durable superblock is ever free;
//! - pinned space becomes free only after the commit that freed it is
//!   durable, and then stays held until the next commit is durable too, so
//!   the previous commit (the newest backup root) stays intact.

use crate::error::{Corruption, Error, Result};
use crate::format::{item_type, ExtentItem, Key, MetadataProfile, NODE_SIZE, SECTOR_SIZE};
use crate::lock_order::{LockRank, RankedMutex};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

/// Under DUP, when node pairs are short: the most a data extent breaks
/// at once. The bytes across from the ones it takes are left unpaired, for
/// the next extent; what the last one leaves is lost to metadata.
const PAIR_BREAK_BYTES: u64 = 1 << 20;

/// What an extent holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtentKind {
    /// A tree node of tree `owner` at `level`.
    Metadata { owner: u64, level: u8 },
    /// File data of inode `owner`.
    Data { owner: u64 },
}

/// A pending change to one extent item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DelayedRef {
    pub num_bytes: u64,
    pub kind: ExtentKind,
    /// Allocated in this transaction: no extent item exists yet.
    pub created: bool,
    /// Net change of the reference count.
    pub ref_delta: i64,
    /// A node the forest freed in this transaction: its count reached 0
    /// (docs/SNAPSHOTS.md, S13). Always false for data.
    pub freed: bool,
}

/// What applying one delayed ref does to its extent item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtentItemChange {
    Keep,
    Insert(ExtentItem),
    Update(ExtentItem),
    Delete,
}

/// The outcome of [`DelayedRef::apply`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefApplied {
    pub change: ExtentItemChange,
    /// A data extent lost its last reference: its space is released.
    pub frees_data: bool,
}

impl DelayedRef {
    /// The key of the extent item this ref changes.
    pub fn item_key(&self, bytenr: u64) -> Key {
        match self.kind {
            ExtentKind::Metadata { level, .. } => {
                Key::new(bytenr, item_type::METADATA_ITEM, u64::from(level))
            }
            ExtentKind::Data { .. } => Key::new(bytenr, item_type::EXTENT_ITEM, self.num_bytes),
        }
    }

    /// Whether [`Self::apply`] needs the extent item as it is. A node freed
    /// with no other change of its count in the transaction (every node of
    /// a tree nothing shares) is deleted without reading its item: its
    /// count was 1, by the forest's sharedness test (S3), and reading the
    /// item of each of a commit's thousands of freed nodes would lengthen
    /// the seal.
    pub fn reads_item(&self) -> bool {
        !self.created
            && (self.ref_delta != 0 || self.freed)
            && !(self.freed && self.ref_delta == -1)
    }

    /// The change of the extent item (`current`: as it is, when
    /// [`Self::reads_item`]) and whether a data extent is released. An
    /// error names what is inconsistent: a count below zero, a node whose
    /// count reached 0 that the forest did not free or the reverse (S13).
    pub fn apply(
        &self,
        current: Option<ExtentItem>,
        transid: u64,
    ) -> std::result::Result<RefApplied, String> {
        let keep = |change| RefApplied {
            change,
            frees_data: false,
        };
        let is_data = matches!(self.kind, ExtentKind::Data { .. });
        let owner = match self.kind {
            ExtentKind::Metadata { owner, .. } | ExtentKind::Data { owner } => owner,
        };
        if self.created {
            if self.ref_delta > 0 {
                return Ok(keep(ExtentItemChange::Insert(ExtentItem {
                    refs: self.ref_delta as u64,
                    generation: transid,
                    owner,
                })));
            }
            if self.ref_delta < 0 || !is_data {
                return Err(format!(
                    "new extent ends its transaction with reference count {}",
                    self.ref_delta
                ));
            }
            // A data extent allocated and left unreferenced.
            return Ok(RefApplied {
                change: ExtentItemChange::Keep,
                frees_data: true,
            });
        }
        if !self.reads_item() {
            return Ok(keep(if self.freed {
                ExtentItemChange::Delete
            } else {
                ExtentItemChange::Keep
            }));
        }
        let Some(mut item) = current else {
            return Err("the extent item to update does not exist".into());
        };
        let refs = i128::from(item.refs) + i128::from(self.ref_delta);
        if refs < 0 {
            return Err(format!(
                "reference count {} would drop below zero (change {})",
                item.refs, self.ref_delta
            ));
        }
        if !is_data && (refs == 0) != self.freed {
            return Err(if self.freed {
                format!("node freed with {refs} references left")
            } else {
                "node's reference count reached 0 but it was not freed".to_string()
            });
        }
        if refs == 0 {
            return Ok(RefApplied {
                change: ExtentItemChange::Delete,
                frees_data: is_data,
            });
        }
        item.refs = refs as u64;
        Ok(keep(ExtentItemChange::Update(item)))
    }
}

/// A corruption error about the node at `bytenr` of tree `tree`: what the
/// pointers read from disk say disagrees with the reference counts.
fn node_corrupt(tree: u64, bytenr: u64, reason: impl Into<String>) -> Error {
    Error::corrupt(Corruption::at_block(
        Some(tree),
        bytenr,
        None,
        reason.into(),
    ))
}

/// Free space as a map of `start -> length`, kept coalesced.
#[derive(Debug, Default, Clone)]
pub struct FreeSpace {
    ranges: BTreeMap<u64, u64>,
    free_bytes: u64,
}

impl FreeSpace {
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().map(|(&s, &l)| (s, l))
    }

    /// Returns `[start, start+len)` to the free map. Panics if any of it is
    /// already free: a double free is a bug that would corrupt the image.
    pub fn add(&mut self, start: u64, len: u64) {
        assert!(
            len > 0 && start.is_multiple_of(SECTOR_SIZE) && len.is_multiple_of(SECTOR_SIZE),
            "unaligned free {start}+{len}"
        );
        let end = start + len;
        let mut new_start = start;
        let mut new_end = end;
        if let Some((&ps, &pl)) = self.ranges.range(..=start).next_back() {
            assert!(
                ps + pl <= start,
                "double free: {start}+{len} overlaps free {ps}+{pl}"
            );
            if ps + pl == start {
                new_start = ps;
                self.ranges.remove(&ps);
            }
        }
        if let Some((&ns, &nl)) = self.ranges.range(start..).next() {
            assert!(
                ns >= end,
                "double free: {start}+{len} overlaps free {ns}+{nl}"
            );
            if ns == end {
                new_end = ns + nl;
                self.ranges.remove(&ns);
            }
        }
        self.ranges.insert(new_start, new_end - new_start);
        self.free_bytes += len;
    }

    /// Takes `[start, start+len)` out of the free map; it must be free and
    /// on sectors (an unaligned extent could not be written).
    pub fn remove(&mut self, start: u64, len: u64) {
        assert!(
            len > 0 && start.is_multiple_of(SECTOR_SIZE) && len.is_multiple_of(SECTOR_SIZE),
            "unaligned allocation {start}+{len}"
        );
        let (&fs, &fl) = self
            .ranges
            .range(..=start)
            .next_back()
            .unwrap_or_else(|| panic!("allocating non-free {start}+{len}"));
        assert!(
            fs + fl >= start + len,
            "allocating non-free {start}+{len} (free run {fs}+{fl})"
        );
        self.ranges.remove(&fs);
        if fs < start {
            self.ranges.insert(fs, start - fs);
        }
        if start + len < fs + fl {
            self.ranges.insert(start + len, fs + fl - start - len);
        }
        self.free_bytes -= len;
    }

    /// Whether all of `[start, start+len)` is free.
    pub fn is_free(&self, start: u64, len: u64) -> bool {
        // A range past the end of the address space (a hostile log's
        // extent) is not free, and must not overflow.
        let Some(end) = start.checked_add(len) else {
            return false;
        };
        self.ranges
            .range(..=start)
            .next_back()
            .is_some_and(|(&s, &l)| s + l >= end)
    }

    /// Whether no byte of `[start, start+len)` is free.
    pub fn is_in_use(&self, start: u64, len: u64) -> bool {
        let Some(end) = start.checked_add(len) else {
            return false;
        };
        let before = self.ranges.range(..=start).next_back();
        let after = self.ranges.range(start..).next();
        before.is_none_or(|(&s, &l)| s.saturating_add(l) <= start)
            && after.is_none_or(|(&s, _)| s >= end)
    }

    /// First free run of at least `len` bytes at or after `hint`, wrapping
    /// around once.
    fn find(&self, len: u64, hint: u64) -> Option<u64> {
        let fits = |(&s, &l): (&u64, &u64)| {
            let start = s.max(hint);
            (start >= s && s + l >= start + len).then_some(start)
        };
        if let Some((&s, &l)) = self.ranges.range(..=hint).next_back() {
            if s + l >= hint + len {
                return Some(hint);
            }
        }
        self.ranges
            .range(hint..)
            .find_map(fits)
            .or_else(|| self.ranges.iter().find(|(_, &l)| l >= len).map(|(&s, _)| s))
    }

    /// The free runs overlapping `[lo, hi)`, clipped to it, in order.
    fn runs_within(&self, lo: u64, hi: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        // An empty window (a cursor past the node half) has no runs.
        let hi = hi.max(lo);
        let before = self
            .ranges
            .range(..lo)
            .next_back()
            .filter(|(&s, &l)| s + l > lo);
        before
            .into_iter()
            .chain(self.ranges.range(lo..hi))
            .map(move |(&s, &l)| (s.max(lo), (s + l).min(hi)))
            .filter(|(s, e)| s < e)
    }

    /// First `start` in `[lo, hi)` such that `[start, start+len)` and
    /// `[start+offset, start+offset+len)` are both free (a DUP node and its
    /// mirror), with `start + len <= hi`.
    fn find_pair_in(&self, len: u64, lo: u64, hi: u64, offset: u64) -> Option<u64> {
        self.runs_within(lo, hi).find_map(|(s, e)| {
            self.runs_within(s + offset, e + offset)
                .map(|(us, ue)| (us - offset, ue - offset))
                .find(|(ps, pe)| pe - ps >= len)
                .map(|(ps, _)| ps)
        })
    }

    /// A DUP node's place: the first free pair at or after `hint` below
    /// `limit` (the mirror half's start), wrapping around once.
    fn find_pair(&self, len: u64, hint: u64, limit: u64, offset: u64) -> Option<u64> {
        self.find_pair_in(len, hint, limit, offset)
            .or_else(|| self.find_pair_in(len, 0, limit, offset))
    }

    /// First free run of at least `len` bytes at or after `hint` (wrapping
    /// once) whose bytes cannot hold a DUP node pair: their counterpart in
    /// the other half (`± offset`, halves split at `mid`, nothing paired at
    /// or beyond `mid + offset`) is in use. Data taken from such runs first
    /// leaves the pairs to metadata.
    fn find_unpaired(&self, len: u64, hint: u64, mid: u64, offset: u64) -> Option<u64> {
        let unpaired_in = |lo: u64, hi: u64| {
            self.runs_within(lo, hi).find_map(|(s, e)| {
                // Pieces of the run on one side of `mid` and of the end of
                // the paired halves, each with its counterpart shift.
                let pieces = [
                    (s, e.min(mid), Some(offset as i128)),
                    (s.max(mid), e.min(mid + offset), Some(-(offset as i128))),
                    (s.max(mid + offset), e, None),
                ];
                pieces
                    .into_iter()
                    .filter(|(ps, pe, _)| ps < pe)
                    .find_map(|(ps, pe, shift)| {
                        let Some(shift) = shift else {
                            return (pe - ps >= len).then_some(ps);
                        };
                        let moved = |x: u64| (x as i128 + shift) as u64;
                        let back = |x: u64| (x as i128 - shift) as u64;
                        // Gaps between the free runs of the counterpart.
                        let mut cursor = ps;
                        for (cs, ce) in self.runs_within(moved(ps), moved(pe)) {
                            if back(cs) - cursor >= len {
                                return Some(cursor);
                            }
                            cursor = back(ce);
                        }
                        (pe - cursor >= len).then_some(cursor)
                    })
            })
        };
        unpaired_in(hint, u64::MAX).or_else(|| unpaired_in(0, u64::MAX))
    }

    /// Bytes of the node half `[.., mid)` that could still hold DUP node
    /// pairs: free here and `offset` further on, in pieces of at least a
    /// node (a smaller piece holds no node).
    fn pair_bytes(&self, mid: u64, offset: u64) -> u64 {
        let node = NODE_SIZE as u64;
        self.runs_within(0, mid)
            .flat_map(|(s, e)| {
                self.runs_within(s + offset, e + offset)
                    .map(|(ms, me)| (me - ms) / node * node)
            })
            .sum()
    }

    /// The longest unpaired free run, down to `min` bytes, of at most
    /// `len`: the piece a data extent takes when it must not break pairs.
    fn longest_unpaired(
        &self,
        len: u64,
        min: u64,
        hint: u64,
        mid: u64,
        offset: u64,
    ) -> Option<(u64, u64)> {
        let mut want = len;
        while want >= min {
            if let Some(start) = self.find_unpaired(want, hint, mid, offset) {
                return Some((start, want));
            }
            want = (want / 2) / min * min;
        }
        None
    }

    /// Longest free run (for carving a data extent when no run is big enough).
    fn largest(&self) -> Option<(u64, u64)> {
        self.ranges
            .iter()
            .max_by_key(|(_, &l)| l)
            .map(|(&s, &l)| (s, l))
    }
}

/// The data reads in flight without the state lock, by the epoch each was
/// planned in (docs/SNAPSHOTS.md (f), "How device I/O leaves the state
/// lock"): the allocator's epoch counts durable commits, and space a
/// commit releases in epoch `e` returns to the free map only when no read
/// planned before `e` is still reading, so a read never finds its extent
/// reused by newer data.
pub struct ReaderEpochs {
    /// Epoch -> reads of it in flight.
    active: RankedMutex<BTreeMap<u64, usize>>,
}

impl std::fmt::Debug for ReaderEpochs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReaderEpochs")
            .field("oldest", &self.oldest())
            .finish()
    }
}

impl ReaderEpochs {
    fn oldest(&self) -> Option<u64> {
        let active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        active.keys().next().copied()
    }
}

/// One data read registered in its epoch ([`TransactionSpace::start_read`]);
/// dropping it (the read done, or failed) unregisters it.
#[derive(Debug)]
pub struct ReaderTicket {
    epochs: Arc<ReaderEpochs>,
    epoch: u64,
}

impl Drop for ReaderTicket {
    fn drop(&mut self) {
        let mut active = self.epochs.active.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = active.get_mut(&self.epoch) {
            *count -= 1;
            if *count == 0 {
                active.remove(&self.epoch);
            }
        }
    }
}

/// The allocator of one filesystem.
#[derive(Debug)]
pub struct Allocator {
    free: FreeSpace,
    /// Freed in the running transaction.
    pinned: Vec<(u64, u64)>,
    /// Log nodes a durable log superblock may still reference.
    log_pinned: Vec<(u64, u64)>,
    /// Freed by the newest durable commit: the commit before it (its first
    /// older backup root) still references them, so they are not reused
    /// until the next commit is durable (docs/BACKUP-ROOTS.md).
    held: Vec<(u64, u64)>,
    /// Released by a durable commit, tagged with the epoch it ended, but
    /// kept from the free map while a read planned in an older epoch is in
    /// flight (see [`ReaderEpochs`]).
    unread_wait: Vec<(u64, u64, u64)>,
    /// Tree nodes freed (by [`Self::free_node`]) whose blocks are not back
    /// in the free map yet: pinned, held or waiting for readers. A pointer
    /// read from disk that reaches one is a second pointer to a node
    /// counted once; freeing it again would free its block twice.
    released_nodes: HashSet<u64>,
    /// Durable commits since mount: the reader epoch.
    epoch: u64,
    readers: Arc<ReaderEpochs>,
    delayed_refs: BTreeMap<u64, DelayedRef>,
    /// Next-fit cursors: metadata and data are laid out in separate runs so
    /// data extents stay contiguous.
    metadata_cursor: u64,
    data_cursor: u64,
    /// Bytes the extent tree records plus the net delayed refs.
    bytes_used: u64,
    /// The part of `bytes_used` that holds tree nodes (log nodes excluded):
    /// the most a transaction can copy (docs/DELALLOC.md).
    metadata_bytes: u64,
    total_bytes: u64,
    /// DUP: every node is allocated with its mirror (docs/DUP.md).
    profile: MetadataProfile,
}

impl Allocator {
    pub fn new(
        free: FreeSpace,
        bytes_used: u64,
        total_bytes: u64,
        profile: MetadataProfile,
    ) -> Allocator {
        let first = free.ranges().next().map(|(s, _)| s).unwrap_or(0);
        Allocator {
            profile,
            free,
            pinned: Vec::new(),
            log_pinned: Vec::new(),
            held: Vec::new(),
            unread_wait: Vec::new(),
            released_nodes: HashSet::new(),
            epoch: 0,
            readers: Arc::new(ReaderEpochs {
                active: RankedMutex::new(LockRank::Epochs, BTreeMap::new()),
            }),
            delayed_refs: BTreeMap::new(),
            metadata_cursor: first,
            // A quarter in, on a sector: data extents start where the
            // cursor is, and O_DIRECT refuses unaligned writes (for 3 of 4
            // device sizes the plain quarter is not on one).
            data_cursor: first + total_bytes.saturating_sub(first) / 4 / SECTOR_SIZE * SECTOR_SIZE,
            bytes_used,
            metadata_bytes: 0,
            total_bytes,
        }
    }

    /// Sets the node bytes in use (counted from the extent tree at mount).
    pub fn set_metadata_bytes(&mut self, bytes: u64) {
        self.metadata_bytes = bytes;
    }

    #[cfg(test)]
    pub fn free_space(&self) -> &FreeSpace {
        &self.free
    }

    /// Takes a node's block (and under DUP its mirror) out of the free map.
    fn take_node_space(&mut self) -> Result<u64> {
        let len = NODE_SIZE as u64;
        let start = match (self.profile.primary_end(), self.profile.mirror_offset()) {
            (Some(limit), Some(offset)) => {
                self.free
                    .find_pair(len, self.metadata_cursor, limit, offset)
            }
            _ => self.free.find(len, self.metadata_cursor),
        }
        .ok_or(Error::NoSpace)?;
        self.free.remove(start, len);
        if let Some(mirror) = self.profile.mirror_of(start) {
            self.free.remove(mirror, len);
        }
        self.metadata_cursor = start + len;
        Ok(start)
    }

    /// The device ranges one node occupies: its block, and under DUP its
    /// mirror.
    fn node_ranges(&self, bytenr: u64) -> impl Iterator<Item = (u64, u64)> {
        let len = NODE_SIZE as u64;
        std::iter::once((bytenr, len)).chain(self.profile.mirror_of(bytenr).map(|m| (m, len)))
    }

    /// Allocates one tree node.
    pub fn alloc_node(&mut self, owner: u64, level: u8) -> Result<u64> {
        let len = NODE_SIZE as u64;
        let start = self.take_node_space()?;
        self.bytes_used += self.profile.node_footprint();
        self.metadata_bytes += self.profile.node_footprint();
        let prev = self.delayed_refs.insert(
            start,
            DelayedRef {
                num_bytes: len,
                kind: ExtentKind::Metadata { owner, level },
                created: true,
                ref_delta: 1,
                freed: false,
            },
        );
        if let Some(prev) = prev {
            // A pointer read from disk named this free block (its count
            // changed this transaction) before it was allocated.
            self.delayed_refs.insert(start, prev);
            return Err(node_corrupt(
                owner,
                start,
                "a free block is referenced by a tree (its count changed in this transaction before it was allocated)",
            ));
        }
        Ok(start)
    }

    /// The pending change of the node at `bytenr`, started empty: a node
    /// already in the extent tree whose count this transaction changes.
    fn node_ref_entry(&mut self, bytenr: u64, owner: u64, level: u8) -> &mut DelayedRef {
        self.delayed_refs.entry(bytenr).or_insert(DelayedRef {
            num_bytes: NODE_SIZE as u64,
            kind: ExtentKind::Metadata { owner, level },
            created: false,
            ref_delta: 0,
            freed: false,
        })
    }

    /// Frees a tree node: the forest found its reference count reaching 0
    /// (for a node of a tree nothing shares, its one pointer went away).
    /// Its space is pinned until this transaction's commit is durable.
    ///
    /// A node freed twice, a node made in this transaction freed while it
    /// has references left, or one whose block is already free means that
    /// more pointers reach it than its count says (a hostile or damaged
    /// image: two parents pointing at an unshared node): a corruption
    /// error naming the block, with nothing changed, so the transaction
    /// aborts cleanly.
    pub fn free_node(&mut self, bytenr: u64, owner: u64, level: u8) -> Result<()> {
        if self.released_nodes.contains(&bytenr) {
            return Err(node_corrupt(
                owner,
                bytenr,
                "node freed twice: more pointers reach it than its reference count",
            ));
        }
        if let Some(entry) = self.delayed_refs.get(&bytenr) {
            if entry.created && entry.ref_delta != 1 {
                return Err(node_corrupt(
                    owner,
                    bytenr,
                    format!(
                        "node made in this transaction freed with {} references left",
                        entry.ref_delta - 1
                    ),
                ));
            }
        }
        if self
            .node_ranges(bytenr)
            .any(|(start, len)| !self.free.is_in_use(start, len))
        {
            return Err(node_corrupt(
                owner,
                bytenr,
                "node freed while its block is free in the extent tree",
            ));
        }
        let footprint = self.profile.node_footprint();
        let Some(bytes_used) = self.bytes_used.checked_sub(footprint) else {
            return Err(node_corrupt(
                owner,
                bytenr,
                format!(
                    "node freed while bytes_used is {} (less than one node)",
                    self.bytes_used
                ),
            ));
        };
        let entry = self.node_ref_entry(bytenr, owner, level);
        entry.ref_delta -= 1;
        entry.freed = true;
        if entry.created {
            // Never in the extent tree: nothing for the commit to do.
            self.delayed_refs.remove(&bytenr);
        }
        self.bytes_used = bytes_used;
        self.metadata_bytes = self.metadata_bytes.saturating_sub(footprint);
        let ranges: Vec<_> = self.node_ranges(bytenr).collect();
        self.pinned.extend(ranges);
        self.released_nodes.insert(bytenr);
        Ok(())
    }

    /// Records `delta` more pointers to the node at `bytenr` (a copy of a
    /// shared parent, or a parent's copy made by a snapshot, points at it
    /// too; or one of its sharers let go of it). The forest frees a node
    /// with [`Self::free_node`] instead when its count reaches 0. A
    /// pointer to a node already freed, or to a data extent, is a
    /// corruption error (pointers read from disk disagree with the counts).
    pub fn add_node_ref(&mut self, bytenr: u64, owner: u64, level: u8, delta: i64) -> Result<()> {
        let what = match self.delayed_refs.get(&bytenr) {
            _ if self.released_nodes.contains(&bytenr) => Some("a node already freed"),
            Some(entry) if !matches!(entry.kind, ExtentKind::Metadata { .. }) => {
                Some("a data extent")
            }
            _ => None,
        };
        if let Some(what) = what {
            return Err(node_corrupt(
                owner,
                bytenr,
                format!("a tree pointer reaches {what}: its reference count cannot change"),
            ));
        }
        self.node_ref_entry(bytenr, owner, level).ref_delta += delta;
        Ok(())
    }

    /// [`TransactionSpace::add_data_ref`] for the data references of a
    /// leaf read from disk (a shared leaf copied or dropped): a reference
    /// to a node, or with another length than the pending change of the
    /// extent has, is a corruption error, not an assertion.
    pub fn add_leaf_data_ref(
        &mut self,
        bytenr: u64,
        num_bytes: u64,
        owner: u64,
        delta: i64,
    ) -> Result<()> {
        if let Some(entry) = self.delayed_refs.get(&bytenr) {
            if entry.num_bytes != num_bytes || !matches!(entry.kind, ExtentKind::Data { .. }) {
                return Err(Error::corrupt(Corruption::at_block(
                    None,
                    bytenr,
                    None,
                    format!(
                        "file extent references {num_bytes} bytes at {bytenr}, but this transaction counts it as an extent of {} bytes{}",
                        entry.num_bytes,
                        if matches!(entry.kind, ExtentKind::Data { .. }) {
                            ""
                        } else {
                            " (a tree node)"
                        }
                    ),
                )));
            }
        }
        self.add_data_ref(bytenr, num_bytes, owner, delta);
        Ok(())
    }

    /// The pending change of the count of the extent at `bytenr`: whether
    /// it was allocated in this transaction (then the change is its whole
    /// count) and by how much its count changed.
    pub fn pending_ref_delta(&self, bytenr: u64) -> (bool, i64) {
        self.delayed_refs
            .get(&bytenr)
            .map_or((false, 0), |r| (r.created, r.ref_delta))
    }

    /// At mount: holds `[start, start+len)`, free in the mounted commit but
    /// used by the commit before it, until the next commit is durable.
    /// Returns false (and holds nothing) unless it is a whole number of
    /// sectors, all of it free: the range comes from an older commit's
    /// extent tree, which nothing else has validated.
    pub fn hold_free_range(&mut self, start: u64, len: u64) -> bool {
        let whole_sectors = len > 0
            && start.is_multiple_of(SECTOR_SIZE)
            && len.is_multiple_of(SECTOR_SIZE)
            && start.checked_add(len).is_some();
        if !whole_sectors || !self.free.is_free(start, len) {
            return false;
        }
        self.free.remove(start, len);
        self.held.push((start, len));
        true
    }

    /// Returns to the free map the released ranges no read in flight may
    /// still read: those released in an epoch no older than the oldest
    /// read's (a read planned after the release never names them).
    fn free_unread(&mut self) {
        if self.unread_wait.is_empty() {
            return;
        }
        let oldest = self.readers.oldest().unwrap_or(u64::MAX);
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.unread_wait)
            .into_iter()
            .partition(|&(epoch, _, _)| epoch <= oldest);
        self.unread_wait = waiting;
        for (_, start, len) in ready {
            self.released_nodes.remove(&start);
            self.free.add(start, len);
        }
    }

    /// Allocates a log tree node. Log nodes live only until the next
    /// commit and are never recorded in the extent tree.
    pub fn alloc_log_node(&mut self) -> Result<u64> {
        self.take_node_space()
    }

    /// Frees a log node. One that no log sync has written is free at once;
    /// one a durable superblock may reference waits for the next log sync
    /// or commit ([`Self::take_log_pinned`]).
    pub fn free_log_node(&mut self, bytenr: u64, written: bool) {
        let ranges: Vec<_> = self.node_ranges(bytenr).collect();
        for (start, len) in ranges {
            if written {
                self.log_pinned.push((start, len));
            } else {
                self.free.add(start, len);
            }
        }
    }
}

/// The allocator as the layers above the B-tree use it: data extents and
/// their references, the commit's delayed refs and pinned ranges, the log's
/// blocks at replay, and the counters. Tree nodes' blocks are not in it:
/// only the [`Forest`](crate::btree::Forest) allocates and frees those
/// (`alloc_node`, `free_node` and their log twins), and it hands its
/// allocator out only as this ([`Forest::alloc`](crate::btree::Forest::alloc)).
pub trait TransactionSpace {
    fn profile(&self) -> MetadataProfile;

    /// Bytes held by tree nodes (log trees excluded; DUP: both copies).
    fn metadata_bytes(&self) -> u64;

    /// Number of extents with a pending extent-tree change.
    fn delayed_ref_count(&self) -> usize;

    /// The most the pending delayed refs can free at the commit: the data
    /// extents of earlier transactions that lost references in this one.
    fn delayed_free_bytes(&self) -> u64;

    fn free_bytes(&self) -> u64;

    fn pinned_bytes(&self) -> u64;

    /// Space held for the previous commit (see [`Self::commit_durable`]),
    /// or for data reads in flight (see [`ReaderEpochs`]).
    fn held_bytes(&self) -> u64;

    /// Freed log nodes waiting for the next log sync or commit.
    fn log_pinned_bytes(&self) -> u64;

    fn bytes_used(&self) -> u64;

    fn total_bytes(&self) -> u64;

    /// Whether `[start, start+len)` is all free.
    fn is_free(&self, start: u64, len: u64) -> bool;

    /// Allocates a data extent of up to `len` bytes (sector multiple);
    /// returns `(bytenr, allocated_len)`, shorter than asked when free space
    /// is fragmented. Its reference count starts at zero: each file extent
    /// item that points into it adds one with [`Self::add_data_ref`].
    ///
    /// Under DUP, `keep_for_nodes` is the node space (both copies) the
    /// space accounting has promised: data breaks free node pairs only
    /// while that many stay, and otherwise takes shorter unpaired pieces,
    /// so that free bytes the accounting counts for metadata can really
    /// hold nodes (a commit that finds no pair fails the filesystem).
    fn alloc_data(&mut self, len: u64, owner: u64, keep_for_nodes: u64) -> Result<(u64, u64)>;

    /// Records one more (delta = 1) or one fewer (delta = -1) file extent
    /// item pointing into the data extent at `bytenr`.
    fn add_data_ref(&mut self, bytenr: u64, num_bytes: u64, owner: u64, delta: i64);

    /// Records one fewer file extent item pointing into the data extent at
    /// `bytenr`, for an item deleted with nothing to replace it (unlike an
    /// extent split, whose count passes through zero). Returns true when
    /// that released an extent allocated in this transaction: its space
    /// is pinned now rather than at the commit, and the caller deletes its
    /// checksums now, so the commit has nothing left to do for it.
    fn drop_data_ref(&mut self, bytenr: u64, num_bytes: u64, owner: u64) -> bool;

    /// Shrinks the data extent at `bytenr`, allocated in this transaction
    /// with `len` bytes and not referenced yet, to its first `keep` bytes
    /// (a compressed writeback needs fewer than it allocated): the rest is
    /// released, pinned like any extent freed in its own transaction.
    fn shrink_new_data(&mut self, bytenr: u64, len: u64, keep: u64);

    /// Takes the pending extent changes, lowest bytenr first.
    fn take_delayed_refs(&mut self) -> Vec<(u64, DelayedRef)>;

    /// The extent items the pending changes will change, lowest first:
    /// what a commit's warm-up reads before its seal applies them.
    fn delayed_item_keys(&self) -> Vec<Key>;

    fn has_delayed_refs(&self) -> bool;

    /// A data extent lost its last reference (its delayed ref applied, or
    /// [`Self::drop_data_ref`]): pin its space.
    fn extent_released(&mut self, bytenr: u64, len: u64);

    /// Called when a commit starts: the pinned ranges it will release once
    /// durable.
    fn take_pinned(&mut self) -> Vec<(u64, u64)>;

    /// Called once a commit is durable, with the ranges it freed (taken
    /// by [`Self::take_pinned`]): those are held, because the commit before
    /// it, now the newest backup root, still references them; what the
    /// previous commit freed, referenced only by older backups, is free.
    fn commit_durable(&mut self, freed: Vec<(u64, u64)>);

    /// Registers a data read about to leave the state lock with the extents
    /// it planned: none of them returns to the free map until the ticket
    /// drops. Also frees what earlier reads kept that no read waits for now.
    fn start_read(&mut self) -> ReaderTicket;

    /// The reader epoch: durable commits since mount. While it stays the
    /// same, no space freed since it was read has returned to the free map
    /// (it is pinned until a commit is durable), so an extent the trees
    /// pointed at then and point at now was not reused in between.
    fn read_epoch(&self) -> u64;

    /// Returns ranges to the free map: log nodes no durable superblock
    /// references any more.
    fn unpin(&mut self, ranges: Vec<(u64, u64)>);

    /// Log nodes freed since the last log sync: free once the next log
    /// superblock (or commit) is durable.
    fn take_log_pinned(&mut self) -> Vec<(u64, u64)>;

    /// Claims a data extent that a log being replayed references but the
    /// extent tree does not record: it becomes a new extent of this
    /// transaction with no references yet.
    fn claim_logged_extent(&mut self, bytenr: u64, len: u64, owner: u64);

    /// Takes a block of a log being replayed out of the free map; it is
    /// released (as a written log node) once the replay's commit is durable.
    /// Fails if the block is not free: the log would overlap live data.
    fn reserve_log_block(&mut self, start: u64) -> bool;
}

impl TransactionSpace for Allocator {
    fn profile(&self) -> MetadataProfile {
        self.profile
    }

    fn metadata_bytes(&self) -> u64 {
        self.metadata_bytes
    }

    fn delayed_ref_count(&self) -> usize {
        self.delayed_refs.len()
    }

    fn delayed_free_bytes(&self) -> u64 {
        self.delayed_refs
            .values()
            .filter(|r| !r.created && r.ref_delta < 0 && matches!(r.kind, ExtentKind::Data { .. }))
            .map(|r| r.num_bytes)
            .sum()
    }

    fn free_bytes(&self) -> u64 {
        self.free.free_bytes()
    }

    fn pinned_bytes(&self) -> u64 {
        self.pinned.iter().map(|&(_, l)| l).sum()
    }

    fn held_bytes(&self) -> u64 {
        self.held.iter().map(|&(_, l)| l).sum::<u64>()
            + self.unread_wait.iter().map(|&(_, _, l)| l).sum::<u64>()
    }

    fn log_pinned_bytes(&self) -> u64 {
        self.log_pinned.iter().map(|&(_, l)| l).sum()
    }

    fn bytes_used(&self) -> u64 {
        self.bytes_used
    }

    fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    fn is_free(&self, start: u64, len: u64) -> bool {
        self.free.is_free(start, len)
    }

    fn alloc_data(&mut self, len: u64, owner: u64, keep_for_nodes: u64) -> Result<(u64, u64)> {
        assert!(len > 0 && len.is_multiple_of(SECTOR_SIZE));
        let mut len = len;
        let unpaired = match (self.profile.primary_end(), self.profile.mirror_offset()) {
            (Some(mid), Some(offset)) => {
                let cursor = self.data_cursor;
                self.free
                    .find_unpaired(len, cursor, mid, offset)
                    .map(|start| (start, len))
                    .or_else(|| {
                        // Breaking pairs would leave the nodes promised
                        // too few places: take a shorter unpaired piece,
                        // and when there is none break pairs a little at a
                        // time (the next extent takes the bytes across
                        // from them; the last one may leave them unused).
                        let pairs = 2 * self.free.pair_bytes(mid, offset);
                        if pairs >= keep_for_nodes.saturating_add(2 * len) {
                            return None;
                        }
                        len = len.min(PAIR_BREAK_BYTES);
                        self.free
                            .longest_unpaired(len, SECTOR_SIZE, cursor, mid, offset)
                    })
            }
            _ => None,
        };
        let found = unpaired.or_else(|| self.free.find(len, self.data_cursor).map(|s| (s, len)));
        let (start, len) = match found {
            Some(found) => found,
            None => {
                let (start, run) = self.free.largest().ok_or(Error::NoSpace)?;
                (start, run.min(len))
            }
        };
        self.free.remove(start, len);
        self.data_cursor = start + len;
        self.bytes_used += len;
        let prev = self.delayed_refs.insert(
            start,
            DelayedRef {
                num_bytes: len,
                kind: ExtentKind::Data { owner },
                created: true,
                ref_delta: 0,
                freed: false,
            },
        );
        if let Some(prev) = prev {
            // A file extent read from disk named this free range before
            // it was allocated.
            self.delayed_refs.insert(start, prev);
            return Err(Error::corrupt(Corruption::at_block(
                None,
                start,
                None,
                "a free data range is referenced (its count changed in this transaction before it was allocated)",
            )));
        }
        Ok((start, len))
    }

    fn add_data_ref(&mut self, bytenr: u64, num_bytes: u64, owner: u64, delta: i64) {
        let entry = self.delayed_refs.entry(bytenr).or_insert(DelayedRef {
            num_bytes,
            kind: ExtentKind::Data { owner },
            created: false,
            ref_delta: 0,
            freed: false,
        });
        assert_eq!(
            entry.num_bytes, num_bytes,
            "data extent {bytenr} referenced with two lengths"
        );
        // A count passing through zero mid-transaction (an extent split:
        // one item removed, two added) is not a release: the commit applies
        // the net change, and frees a new extent that ended with none.
        entry.ref_delta += delta;
    }

    fn drop_data_ref(&mut self, bytenr: u64, num_bytes: u64, owner: u64) -> bool {
        self.add_data_ref(bytenr, num_bytes, owner, -1);
        let entry = self.delayed_refs[&bytenr];
        if !(entry.created && entry.ref_delta == 0) {
            return false;
        }
        self.delayed_refs.remove(&bytenr);
        self.extent_released(bytenr, num_bytes);
        true
    }

    fn shrink_new_data(&mut self, bytenr: u64, len: u64, keep: u64) {
        assert!(keep > 0 && keep < len && keep.is_multiple_of(SECTOR_SIZE));
        let entry = self
            .delayed_refs
            .get_mut(&bytenr)
            .expect("a new data extent has its delayed ref");
        assert!(
            entry.created && entry.ref_delta == 0 && entry.num_bytes == len,
            "data extent {bytenr} shrunk after it was referenced"
        );
        entry.num_bytes = keep;
        self.extent_released(bytenr + keep, len - keep);
    }

    fn take_delayed_refs(&mut self) -> Vec<(u64, DelayedRef)> {
        std::mem::take(&mut self.delayed_refs).into_iter().collect()
    }

    fn delayed_item_keys(&self) -> Vec<Key> {
        (self.delayed_refs.iter())
            .map(|(&bytenr, r)| r.item_key(bytenr))
            .collect()
    }

    fn has_delayed_refs(&self) -> bool {
        !self.delayed_refs.is_empty()
    }

    fn extent_released(&mut self, bytenr: u64, len: u64) {
        self.bytes_used -= len;
        self.pinned.push((bytenr, len));
    }

    fn take_pinned(&mut self) -> Vec<(u64, u64)> {
        std::mem::take(&mut self.pinned)
    }

    fn commit_durable(&mut self, freed: Vec<(u64, u64)>) {
        let released = std::mem::replace(&mut self.held, freed);
        self.epoch += 1;
        let epoch = self.epoch;
        self.unread_wait
            .extend(released.into_iter().map(|(start, len)| (epoch, start, len)));
        self.free_unread();
    }

    fn start_read(&mut self) -> ReaderTicket {
        self.free_unread();
        let mut active = self
            .readers
            .active
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *active.entry(self.epoch).or_insert(0) += 1;
        ReaderTicket {
            epochs: self.readers.clone(),
            epoch: self.epoch,
        }
    }

    fn read_epoch(&self) -> u64 {
        self.epoch
    }

    fn unpin(&mut self, ranges: Vec<(u64, u64)>) {
        for (start, len) in ranges {
            self.released_nodes.remove(&start);
            self.free.add(start, len);
        }
    }

    fn take_log_pinned(&mut self) -> Vec<(u64, u64)> {
        std::mem::take(&mut self.log_pinned)
    }

    fn claim_logged_extent(&mut self, bytenr: u64, len: u64, owner: u64) {
        self.free.remove(bytenr, len);
        self.bytes_used += len;
        let prev = self.delayed_refs.insert(
            bytenr,
            DelayedRef {
                num_bytes: len,
                kind: ExtentKind::Data { owner },
                created: true,
                ref_delta: 0,
                freed: false,
            },
        );
        assert!(prev.is_none(), "logged extent {bytenr} claimed twice");
    }

    fn reserve_log_block(&mut self, start: u64) -> bool {
        let ranges: Vec<_> = self.node_ranges(start).collect();
        let in_primary_half = self
            .profile
            .primary_end()
            .is_none_or(|limit| start + NODE_SIZE as u64 <= limit);
        if !in_primary_half || !ranges.iter().all(|&(s, l)| self.free.is_free(s, l)) {
            return false;
        }
        for (s, l) in ranges {
            self.free.remove(s, l);
            self.log_pinned.push((s, l));
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_past_the_address_space_is_not_free() {
        let mut free = FreeSpace::default();
        free.add(1 << 20, 1 << 20);
        assert!(free.is_free(1 << 20, 4096));
        assert!(!free.is_free(u64::MAX - 4095, 8192));
        assert!(!free.is_free(1 << 20, u64::MAX));
    }

    #[test]
    fn free_space_coalesces_and_splits() {
        let mut f = FreeSpace::default();
        f.add(4096, 4096);
        f.add(12288, 4096);
        f.add(8192, 4096);
        assert_eq!(f.ranges().collect::<Vec<_>>(), vec![(4096, 12288)]);
        f.remove(8192, 4096);
        assert_eq!(
            f.ranges().collect::<Vec<_>>(),
            vec![(4096, 4096), (12288, 4096)]
        );
        assert_eq!(f.free_bytes(), 8192);
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn double_free_is_caught() {
        let mut f = FreeSpace::default();
        f.add(4096, 8192);
        f.add(8192, 4096);
    }

    /// Counts that disagree with the pointers of a hostile image are
    /// corruption errors naming the block, and change nothing.
    #[test]
    fn count_mismatches_are_corruption_errors() {
        let mut free = FreeSpace::default();
        free.add(1 << 20, 1 << 20);
        let mut a = Allocator::new(free, 1 << 20, 2 << 20, MetadataProfile::Single);
        let on_disk = (1 << 20) - NODE_SIZE as u64;
        let corrupt_at = |r: Result<()>, block: u64, why: &str| match r {
            Err(Error::Corrupt(c)) => {
                assert_eq!(c.block, Some(block), "{c}");
                assert!(c.reason.contains(why), "{c}");
            }
            other => panic!("expected a corruption error, got {other:?}"),
        };
        a.free_node(on_disk, 5, 0).unwrap();
        let used = a.bytes_used();
        corrupt_at(a.free_node(on_disk, 5, 0), on_disk, "freed twice");
        corrupt_at(a.add_node_ref(on_disk, 5, 0, 1), on_disk, "already freed");
        assert_eq!(a.bytes_used(), used, "nothing changed");
        // In a later transaction, while the block is pinned or held.
        a.take_delayed_refs();
        let pinned = a.take_pinned();
        corrupt_at(a.free_node(on_disk, 5, 0), on_disk, "freed twice");
        a.commit_durable(pinned);
        corrupt_at(a.free_node(on_disk, 5, 0), on_disk, "freed twice");
        corrupt_at(a.add_node_ref(on_disk, 5, 0, -1), on_disk, "already freed");
        a.commit_durable(Vec::new());
        assert!(a.free_space().is_free(on_disk, NODE_SIZE as u64));
        // A node whose block the extent tree says is free.
        corrupt_at(
            a.free_node(1 << 20, 5, 0),
            1 << 20,
            "free in the extent tree",
        );
        // A pointer to a free block, then the block allocated.
        a.add_node_ref(1 << 20, 5, 0, 1).unwrap();
        match a.alloc_node(5, 0) {
            Err(Error::Corrupt(c)) => assert_eq!(c.block, Some(1 << 20), "{c}"),
            other => panic!("expected a corruption error, got {other:?}"),
        }
        // A node made in this transaction, with a second pointer to it.
        let mut free = FreeSpace::default();
        free.add(1 << 20, 1 << 20);
        let mut a = Allocator::new(free, 0, 2 << 20, MetadataProfile::Single);
        let n = a.alloc_node(5, 0).unwrap();
        a.add_node_ref(n, 5, 0, 1).unwrap();
        corrupt_at(a.free_node(n, 5, 0), n, "references left");
        a.add_node_ref(n, 5, 0, -1).unwrap();
        a.free_node(n, 5, 0).unwrap();
    }

    #[test]
    fn freed_nodes_stay_unusable_until_the_next_commit_is_durable() {
        let mut free = FreeSpace::default();
        free.add(1 << 20, 1 << 20);
        let mut a = Allocator::new(free, 0, 2 << 20, MetadataProfile::Single);
        let n = a.alloc_node(5, 0).unwrap();
        a.take_delayed_refs();
        a.free_node(n, 5, 0).unwrap();
        let pinned = a.take_pinned();
        assert_eq!(pinned, vec![(n, NODE_SIZE as u64)]);
        assert_eq!(a.free_bytes(), (1 << 20) - NODE_SIZE as u64);
        // Durable: held for the previous commit, still not free.
        a.commit_durable(pinned);
        assert_eq!(a.held_bytes(), NODE_SIZE as u64);
        assert_eq!(a.free_bytes(), (1 << 20) - NODE_SIZE as u64);
        // Nothing else is free: the held node is not handed out.
        let rest = a.free_bytes() / NODE_SIZE as u64;
        for _ in 0..rest {
            assert_ne!(a.alloc_node(5, 0).unwrap(), n);
        }
        assert!(matches!(a.alloc_node(5, 0), Err(Error::NoSpace)));
        a.take_delayed_refs();
        // The next commit durable: free.
        a.commit_durable(Vec::new());
        assert_eq!(a.held_bytes(), 0);
        assert_eq!(a.free_bytes(), NODE_SIZE as u64);
        assert_eq!(a.alloc_node(5, 0).unwrap(), n);
    }

    #[test]
    fn a_node_count_and_its_free_must_agree_at_the_commit() {
        // S13: the commit's change of a node's item is an error, not a
        // panic, when the forest's frees and the counts disagree.
        let node = |delta, freed| DelayedRef {
            num_bytes: NODE_SIZE as u64,
            kind: ExtentKind::Metadata { owner: 5, level: 0 },
            created: false,
            ref_delta: delta,
            freed,
        };
        let item = |refs| {
            Some(ExtentItem {
                refs,
                generation: 3,
                owner: 5,
            })
        };
        let change = |r: DelayedRef, refs| r.apply(item(refs), 9).map(|a| a.change);
        // A sharer let go: 2 -> 1, kept.
        assert!(node(-1, false).reads_item());
        assert!(matches!(
            change(node(-1, false), 2),
            Ok(ExtentItemChange::Update(ExtentItem { refs: 1, .. }))
        ));
        // Its count reached 0 but the forest did not free it.
        let err = change(node(-1, false), 1).unwrap_err();
        assert!(err.contains("not freed"), "{err}");
        // Freed with references left (read: the count changed otherwise too).
        let err = change(node(-2, true), 3).unwrap_err();
        assert!(err.contains("freed with 1 references left"), "{err}");
        // Below zero.
        assert!(change(node(-3, true), 2)
            .unwrap_err()
            .contains("below zero"));
        // Shared by a snapshot and then freed by both sharers: deleted.
        assert_eq!(change(node(-2, true), 2), Ok(ExtentItemChange::Delete));
        // An unshared node's free is deleted unread.
        assert!(!node(-1, true).reads_item());
        assert_eq!(
            node(-1, true).apply(None, 9).map(|a| a.change),
            Ok(ExtentItemChange::Delete)
        );
        // A node made in this transaction and shared by a snapshot in it.
        let created = DelayedRef {
            created: true,
            ref_delta: 2,
            ..node(0, false)
        };
        assert!(matches!(
            created.apply(None, 9).map(|a| a.change),
            Ok(ExtentItemChange::Insert(ExtentItem {
                refs: 2,
                generation: 9,
                ..
            }))
        ));
    }

    /// Every device size puts data on sectors: the data cursor starts a
    /// quarter in, which for most sizes is not a multiple of 4 KiB (an
    /// 8 GiB loop device's first data write failed O_DIRECT's alignment).
    #[test]
    fn data_starts_on_a_sector_whatever_the_device_size() {
        let first = crate::format::FIRST_ALLOCATABLE_BYTE;
        for sectors in [2048u64, 2049, 2050, 2051, 2101070] {
            let total = first + sectors * SECTOR_SIZE;
            for profile in [MetadataProfile::Single, MetadataProfile::dup_for(total)] {
                let mut free = FreeSpace::default();
                free.add(first, total - first);
                let mut a = Allocator::new(free, 0, total, profile);
                let (start, len) = a.alloc_data(5 * SECTOR_SIZE, 257, 0).unwrap();
                assert!(
                    start.is_multiple_of(SECTOR_SIZE) && len == 5 * SECTOR_SIZE,
                    "{sectors} sectors, {profile:?}: data at {start}+{len}"
                );
            }
        }
    }

    #[test]
    #[should_panic(expected = "unaligned allocation")]
    fn an_unaligned_allocation_is_caught() {
        let mut f = FreeSpace::default();
        f.add(4096, 8192);
        f.remove(6144, 4096);
    }

    #[test]
    fn dup_nodes_take_their_mirror_and_data_prefers_unpaired_space() {
        let first = crate::format::FIRST_ALLOCATABLE_BYTE;
        let total = first + (8 << 20);
        let profile = MetadataProfile::dup_for(total);
        let offset = profile.mirror_offset().unwrap();
        let mut free = FreeSpace::default();
        free.add(first, total - first);
        let mut a = Allocator::new(free, 0, total, profile);
        let n = a.alloc_node(5, 0).unwrap();
        assert_eq!(n, first);
        assert!(!a.free_space().is_free(n + offset, NODE_SIZE as u64));
        assert_eq!(a.bytes_used(), 2 * NODE_SIZE as u64);
        // The first data extent breaks pairs; the next one takes the
        // now unpaired mirror-half bytes across from it.
        let (d1, l1) = a.alloc_data(65536, 257, 0).unwrap();
        let (d2, _) = a.alloc_data(65536, 257, 0).unwrap();
        assert_eq!(l1, 65536);
        assert_eq!(d2, d1 + offset);
        let n2 = a.alloc_node(5, 0).unwrap();
        assert!(n2 + (NODE_SIZE as u64) <= first + offset);
        a.take_delayed_refs();
        a.free_node(n, 5, 0).unwrap();
        assert_eq!(
            a.take_pinned(),
            vec![(n, NODE_SIZE as u64), (n + offset, NODE_SIZE as u64)]
        );
    }
}
