//! Reading nodes from the device, validated, through the cache; under DUP
//! metadata (docs/DUP.md) every cache miss reads both copies, serves a good
//! one and rewrites a bad one from it (read repair).

use super::cache::NodeCache;
use crate::device::BlockDevice;
use crate::error::{Corruption, Error, Result};
use crate::format::{tree_id, MetadataProfile, Node, NODE_SIZE};
use crate::lock_order::{allow_io_under_state_lock, holds_state_lock, LockRank, RankedMutex};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// What a parent (or a root item) promises about a child node.
#[derive(Debug, Clone, Copy)]
pub struct NodeExpectation {
    pub tree: u64,
    pub level: u8,
    pub generation: u64,
}

/// A node a read-only request or a change's warm-up needed and did not
/// find in the cache ([`deferring_misses`], [`deferring_all_misses`]).
#[derive(Debug, Clone, Copy)]
pub struct NodeMiss {
    pub bytenr: u64,
    pub expect: NodeExpectation,
}

/// The misses a [`deferring_misses`] or [`deferring_all_misses`] scope
/// noted so far, and how many it keeps.
struct Deferred {
    misses: Vec<NodeMiss>,
    limit: usize,
}

thread_local! {
    /// `Some` while this thread runs inside a deferring scope.
    static DEFERRED: RefCell<Option<Deferred>> = const { RefCell::new(None) };
}

/// Runs `f` with node cache misses deferred: a miss on this thread does
/// not read, it fails with [`Error::NodeNotCached`] and is returned here
/// (the first one), whatever `f` made of the error. For read-only
/// requests under the state lock (docs/SNAPSHOTS.md (f)): the caller
/// drops the lock, reads the node with [`NodeStore::load_missed`] and runs
/// `f` again; a result that comes with a miss is not an answer.
pub fn deferring_misses<T>(f: impl FnOnce() -> T) -> (T, Option<NodeMiss>) {
    let (out, misses) = deferring_all_misses(1, f);
    (out, misses.into_iter().next())
}

/// As [`deferring_misses`], but notes every distinct miss (up to `limit`):
/// for a change's warm-up, whose walk goes on past a miss to the paths
/// that do not depend on the missing node, so that one pass without the
/// lock reads all their misses (docs/SNAPSHOTS.md (f) item 3).
pub fn deferring_all_misses<T>(limit: usize, f: impl FnOnce() -> T) -> (T, Vec<NodeMiss>) {
    /// Puts back what was deferred before, also when `f` panics: a later
    /// change on this thread must read its misses.
    struct Restore(Option<Deferred>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let before = self.0.take();
            DEFERRED.with(|d| *d.borrow_mut() = before);
        }
    }
    let mine = Deferred {
        misses: Vec::new(),
        limit,
    };
    let restore = Restore(DEFERRED.with(|d| d.borrow_mut().replace(mine)));
    let out = f();
    let misses = DEFERRED.with(|d| {
        d.borrow_mut()
            .as_mut()
            .map(|d| std::mem::take(&mut d.misses))
            .unwrap_or_default()
    });
    drop(restore);
    (out, misses)
}

/// Inside a deferring scope: notes the miss (a new one, while there is
/// room) and says so.
fn defer_miss(miss: NodeMiss) -> bool {
    DEFERRED.with(|d| match d.borrow_mut().as_mut() {
        None => false,
        Some(d) => {
            if d.misses.len() < d.limit && d.misses.iter().all(|m| m.bytenr != miss.bytenr) {
                d.misses.push(miss);
            }
            true
        }
    })
}

/// Node cache misses read from the device since mount, by whether the
/// reading thread held the state lock (docs/SNAPSHOTS.md (f)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeReadStats {
    /// Read under the state lock (the "node cache miss" exemption).
    pub locked: u64,
    /// Read without it: a deferred miss, a commit's or a scrub's read.
    pub unlocked: u64,
}

/// Counters of bad metadata copies found by reads since mount.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RepairStats {
    /// Copies that failed validation (or could not be read) while another
    /// copy of the same node was good.
    pub metadata_bad_copies: u64,
    /// Of those, copies rewritten from the good copy.
    pub metadata_repairs: u64,
    /// Node reads where no copy was good (the read failed).
    pub metadata_unrepairable: u64,
}

pub struct NodeStore<D> {
    dev: D,
    fsid: [u8; 16],
    profile: MetadataProfile,
    cache: RankedMutex<NodeCache>,
    /// Whether a bad copy is rewritten: not on a read-only mount, whose
    /// device must not change.
    repair_writes: AtomicBool,
    bad_copies: AtomicU64,
    repairs: AtomicU64,
    unrepairable: AtomicU64,
    reads_locked: AtomicU64,
    reads_unlocked: AtomicU64,
    /// Checksums a log being replayed must have, from the superblock's
    /// manifest (docs/LOG-FLUSH.md): a copy with another one is bad even
    /// if its header is what the parent promises (a stale log node of the
    /// same transaction). Never held with the cache lock.
    manifest: RankedMutex<HashMap<u64, u32>>,
}

impl<D: BlockDevice> NodeStore<D> {
    pub fn new(dev: D, fsid: [u8; 16], profile: MetadataProfile, cache_nodes: usize) -> Self {
        NodeStore {
            dev,
            fsid,
            profile,
            cache: RankedMutex::new(LockRank::NodeCache, NodeCache::new(cache_nodes)),
            repair_writes: AtomicBool::new(false),
            bad_copies: AtomicU64::new(0),
            repairs: AtomicU64::new(0),
            unrepairable: AtomicU64::new(0),
            reads_locked: AtomicU64::new(0),
            reads_unlocked: AtomicU64::new(0),
            manifest: RankedMutex::new(LockRank::NodeCache, HashMap::new()),
        }
    }

    /// Sets the checksums the blocks of a log being replayed must have
    /// (empty: none); nodes of those blocks read before are read again.
    pub fn expect_checksums(&self, checksums: HashMap<u64, u32>) {
        let new: Vec<u64> = checksums.keys().copied().collect();
        let old = std::mem::replace(
            &mut *self.manifest.lock().expect("manifest lock poisoned"),
            checksums,
        );
        let mut cache = self.cache.lock().expect("cache lock poisoned");
        for bytenr in old.keys().chain(&new) {
            cache.remove(*bytenr);
        }
    }

    pub fn device(&self) -> &D {
        &self.dev
    }

    pub fn fsid(&self) -> &[u8; 16] {
        &self.fsid
    }

    pub fn profile(&self) -> MetadataProfile {
        self.profile
    }

    /// Clean nodes cached now, and at most.
    pub fn cache_size(&self) -> (usize, usize) {
        let cache = self.cache.lock().expect("cache lock poisoned");
        (cache.len(), cache.capacity())
    }

    /// Evicts cached nodes down to `target` (an idle mount's share).
    pub fn shrink_cache(&self, target: usize) {
        self.cache
            .lock()
            .expect("cache lock poisoned")
            .shrink_to(target);
    }

    /// Allows (or stops) rewriting bad copies found by reads.
    pub fn set_repair_writes(&self, allowed: bool) {
        self.repair_writes.store(allowed, Ordering::Relaxed);
    }

    pub fn repair_stats(&self) -> RepairStats {
        RepairStats {
            metadata_bad_copies: self.bad_copies.load(Ordering::Relaxed),
            metadata_repairs: self.repairs.load(Ordering::Relaxed),
            metadata_unrepairable: self.unrepairable.load(Ordering::Relaxed),
        }
    }

    /// Node cache misses read since mount, under the state lock or not.
    pub fn read_stats(&self) -> NodeReadStats {
        NodeReadStats {
            locked: self.reads_locked.load(Ordering::Relaxed),
            unlocked: self.reads_unlocked.load(Ordering::Relaxed),
        }
    }

    /// The cached node at `bytenr`, if it is what the parent promises.
    fn cached(&self, bytenr: u64, expect: NodeExpectation) -> Option<Arc<Node>> {
        let node = self
            .cache
            .lock()
            .expect("cache lock poisoned")
            .get(bytenr)?;
        // A cached copy of a block since freed and rewritten would not
        // match what the parent promises: it is a miss.
        (tree_id::may_reach(expect.tree, node.owner)
            && node.level == expect.level
            && node.generation == expect.generation)
            .then_some(node)
    }

    /// Reads the node at `bytenr` and checks it is what the parent said.
    /// Inside [`deferring_misses`] a miss fails with
    /// [`Error::NodeNotCached`] instead of reading.
    pub fn read(&self, bytenr: u64, expect: NodeExpectation) -> Result<Arc<Node>> {
        if let Some(node) = self.cached(bytenr, expect) {
            return Ok(node);
        }
        if defer_miss(NodeMiss { bytenr, expect }) {
            return Err(Error::NodeNotCached);
        }
        // Debt (docs/SNAPSHOTS.md (f) item 3): a change reads what its
        // warm-up did not (evicted since, or not walked) under the state
        // lock, and so do release, forget and the commit's seal.
        let _exemption = allow_io_under_state_lock("node cache miss");
        self.load(bytenr, expect)
    }

    /// Reads a node a read-only request missed ([`deferring_misses`]) into
    /// the cache, unless it is there by now. The caller holds no state lock
    /// but a reader ticket taken under it while the node was in its tree,
    /// which keeps the block from reuse until this returns.
    pub fn load_missed(&self, miss: NodeMiss) -> Result<()> {
        if self.cached(miss.bytenr, miss.expect).is_none() {
            self.load(miss.bytenr, miss.expect)?;
        }
        Ok(())
    }

    /// Reads (and repairs) a node from the device into the cache.
    fn load(&self, bytenr: u64, expect: NodeExpectation) -> Result<Arc<Node>> {
        let counter = if holds_state_lock() {
            &self.reads_locked
        } else {
            &self.reads_unlocked
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let node = Arc::new(self.read_and_repair(bytenr, expect)?);
        self.cache
            .lock()
            .expect("cache lock poisoned")
            .insert(node.clone());
        Ok(node)
    }

    /// Reads every copy; serves the first good one and rewrites the bad
    /// ones from its bytes. Both copies are read even when the first is
    /// good so that a damaged mirror is found while the primary still
    /// holds, not when it is the last copy left.
    fn read_and_repair(&self, bytenr: u64, expect: NodeExpectation) -> Result<Node> {
        let listed = self
            .manifest
            .lock()
            .expect("manifest lock poisoned")
            .get(&bytenr)
            .copied();
        let mut good = None;
        let mut bad = Vec::new();
        for copy in read_node_copies(&self.dev, &self.fsid, self.profile, bytenr, Some(expect)) {
            match copy
                .result
                .and_then(|ok| stale_check(bytenr, expect, listed, ok))
            {
                Ok(ok) => good = good.or(Some(ok)),
                Err(e) => bad.push((copy.index, copy.offset, e)),
            }
        }
        let tree = crate::format::tree_name(expect.tree);
        let Some((node, raw)) = good else {
            self.unrepairable.fetch_add(1, Ordering::Relaxed);
            let mut errors = bad.into_iter();
            let (_, _, mut error) = errors.next().expect("a node has at least one copy");
            if let Error::Corrupt(c) = &mut error {
                for (_, offset, other) in errors {
                    match other {
                        Error::Corrupt(m) => c.reason = format!("{}; {}", c.reason, m.reason),
                        io => c.reason = format!("{}; mirror copy at {offset}: {io}", c.reason),
                    }
                }
            }
            eprintln!("birch: metadata block {bytenr} of tree {tree}: no good copy: {error}");
            return Err(error);
        };
        for (index, offset, error) in bad {
            self.repair_copy(bytenr, &tree, index, offset, &error, &raw);
        }
        Ok(node)
    }

    /// Counts, logs and (unless read-only) rewrites one bad copy.
    fn repair_copy(
        &self,
        bytenr: u64,
        tree: &str,
        index: usize,
        offset: u64,
        error: &Error,
        good_bytes: &[u8],
    ) {
        self.bad_copies.fetch_add(1, Ordering::Relaxed);
        let which = copy_name(index);
        if !self.repair_writes.load(Ordering::Relaxed) {
            eprintln!(
                "birch: metadata block {bytenr} of tree {tree}: {which} at {offset} is bad \
                 ({error}); served the other copy, not rewritten (read-only)"
            );
            return;
        }
        match self.dev.write_at(good_bytes, offset) {
            Ok(()) => {
                self.repairs.fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "birch: metadata block {bytenr} of tree {tree}: repaired {which} at {offset} \
                     from the other copy ({error})"
                );
            }
            Err(e) => eprintln!(
                "birch: metadata block {bytenr} of tree {tree}: {which} at {offset} is bad \
                 ({error}); rewriting it failed: {e}"
            ),
        }
    }

    /// Puts a node just written by a commit into the cache.
    pub fn cache_written(&self, node: Arc<Node>) {
        self.cache.lock().expect("cache lock poisoned").insert(node);
    }

    pub fn forget(&self, bytenr: u64) {
        self.cache
            .lock()
            .expect("cache lock poisoned")
            .remove(bytenr);
    }
}

/// A copy whose checksum is not the one the log manifest lists for its
/// block is not the node the log means (docs/LOG-FLUSH.md).
fn stale_check(
    bytenr: u64,
    expect: NodeExpectation,
    listed: Option<u32>,
    (node, raw): (Node, Vec<u8>),
) -> Result<(Node, Vec<u8>)> {
    let stored = u32::from_le_bytes(raw[0..4].try_into().expect("4 bytes"));
    match listed {
        Some(want) if stored != want => Err(Error::corrupt(Corruption::at_block(
            Some(expect.tree),
            bytenr,
            None,
            format!(
                "checksum {stored:#010x}, the superblock's log manifest lists {want:#010x} \
                 (a write of the last log sync that did not reach the disk)"
            ),
        ))),
        _ => Ok((node, raw)),
    }
}

/// One copy of a node as read from the device.
pub struct NodeCopy {
    /// 0: the block itself; 1: its DUP mirror.
    pub index: usize,
    /// Where on the device this copy lives.
    pub offset: u64,
    /// The decoded node and its raw bytes, or what is wrong with the copy.
    pub result: Result<(Node, Vec<u8>)>,
}

/// How reports name copy `index` of a node.
pub fn copy_name(index: usize) -> &'static str {
    if index == 0 {
        "primary copy"
    } else {
        "mirror copy"
    }
}

/// Reads and validates every copy of the node at `bytenr`: the block, and
/// under DUP its mirror (a byte-for-byte copy, so it too names `bytenr` in
/// its header). An error for the mirror says it is about the mirror.
pub fn read_node_copies<D: BlockDevice + ?Sized>(
    dev: &D,
    fsid: &[u8; 16],
    profile: MetadataProfile,
    bytenr: u64,
    expect: Option<NodeExpectation>,
) -> Vec<NodeCopy> {
    let mut copies = vec![NodeCopy {
        index: 0,
        offset: bytenr,
        result: read_copy(dev, fsid, bytenr, bytenr, expect),
    }];
    if let Some(mirror) = profile.mirror_of(bytenr) {
        let mut result = read_copy(dev, fsid, bytenr, mirror, expect);
        if let Err(Error::Corrupt(c)) = &mut result {
            c.reason = format!("mirror copy at {mirror}: {}", c.reason);
        }
        copies.push(NodeCopy {
            index: 1,
            offset: mirror,
            result,
        });
    }
    copies
}

/// Reads and validates one node without a cache (used by `check` and `dump`
/// as well). With `expect`, also checks owner, level and generation.
pub fn read_node_uncached<D: BlockDevice + ?Sized>(
    dev: &D,
    fsid: &[u8; 16],
    bytenr: u64,
    expect: Option<NodeExpectation>,
) -> Result<Node> {
    read_copy(dev, fsid, bytenr, bytenr, expect).map(|(node, _)| node)
}

/// Reads the copy at `offset` of the node at `bytenr` and validates it as
/// that node.
fn read_copy<D: BlockDevice + ?Sized>(
    dev: &D,
    fsid: &[u8; 16],
    bytenr: u64,
    offset: u64,
    expect: Option<NodeExpectation>,
) -> Result<(Node, Vec<u8>)> {
    let tree = expect.map(|e| e.tree);
    let corrupt = |reason: String| Error::corrupt(Corruption::at_block(tree, bytenr, None, reason));
    if !offset.is_multiple_of(crate::format::SECTOR_SIZE)
        || offset
            .checked_add(NODE_SIZE as u64)
            .is_none_or(|end| end > dev.size_bytes())
    {
        return Err(corrupt(format!(
            "block pointer outside the device ({} bytes) or unaligned",
            dev.size_bytes()
        )));
    }
    let mut buf = vec![0u8; NODE_SIZE];
    dev.read_at(&mut buf, offset)?;
    let node = Node::decode(&buf, bytenr, fsid).map_err(|e| {
        let slot = match &e {
            crate::format::NodeError::ItemOutOfBounds { slot }
            | crate::format::NodeError::KeysOutOfOrder { slot, .. }
            | crate::format::NodeError::BadPointer { slot, .. } => Some(*slot),
            _ => None,
        };
        Error::corrupt(Corruption::at_block(tree, bytenr, slot, e.to_string()))
    })?;
    if let Some(e) = expect {
        if !tree_id::may_reach(e.tree, node.owner) {
            return Err(corrupt(format!(
                "owner {} but reached from tree {}",
                node.owner, e.tree
            )));
        }
        if node.level != e.level {
            return Err(corrupt(format!(
                "level {} but parent expects {}",
                node.level, e.level
            )));
        }
        if node.generation != e.generation {
            return Err(corrupt(format!(
                "generation {} but parent expects {} (lost or misdirected write)",
                node.generation, e.generation
            )));
        }
    }
    Ok((node, buf))
}
