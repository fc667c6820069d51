//! Transaction commit: the one protocol that makes changes durable.
//!
//! ```text
//! in batches, the lock    write back the pages dirty at the start, 256 per
//!   dropped between:        lock hold (so requests are not stalled behind
//!                           all of them at once)
//! under the state lock:   write back dirty pages left: extents allocated and published,
//!                           their data kept in memory as unwritten (no device I/O)
//!                         flush delayed dir-index items and inode updates into the fs tree
//!                         apply delayed extent refs to the extent tree, update root items,
//!                           repeat until nothing changes (each pass may copy more nodes)
//!                         hand the dirty nodes to the commit; transaction T+1 starts
//! without the lock:       write T's unwritten data and every node of T; FLUSH;
//!                           write both superblocks; FLUSH
//! under the state lock:   hold the space T freed, release what T-1 freed;
//!                         T's nodes become clean cache entries, its data is read from disk
//! ```
//! A crash before the superblock write leaves the previous superblock, whose
//! trees were never overwritten (T only wrote blocks that were free in T-1);
//! a crash after it leaves T. Space T freed stays pinned until T's second
//! flush and then held until T+1's: so T+1 cannot overwrite anything T-1
//! still references, and T-1, T's first older backup root, stays mountable
//! while T is the newest commit (docs/BACKUP-ROOTS.md).

use super::in_flight::DataWrites;
use super::info::Roots;
use super::root::SubvolRecord;
use crate::alloc::{DelayedRef, ExtentItemChange, TransactionSpace};
use crate::btree::{Change, Forest, TreeRoot};
use crate::device::BlockDevice;
use crate::error::{Corruption, Error, Result};
use crate::format::{
    item_type, tree_id, BackupRoot, ExtentItem, Key, MetadataProfile, Node, RootItem, Superblock,
    BACKUP_ROOT_COUNT, NODE_SIZE, SUPERBLOCK_OFFSETS, SUPERBLOCK_SIZE,
};
use std::collections::HashMap;
use std::sync::Arc;

/// Everything a commit writes once the state lock is released.
pub(crate) struct PreparedCommit {
    pub nodes: Arc<HashMap<u64, Arc<Node>>>,
    pub superblock: Superblock,
    /// Space the transaction freed: the previous commit (this one's
    /// first older backup root) still uses it, so it is held until the
    /// commit after this one is durable (docs/BACKUP-ROOTS.md).
    pub pinned: Vec<(u64, u64)>,
    /// Log nodes the superblock no longer points at: free once this commit
    /// is durable.
    pub log_released: Vec<(u64, u64)>,
    /// Data extents the sealed trees point at whose bytes are not on the
    /// device yet (the seal's writeback, reflink's settle): written before
    /// the first flush (docs/DELALLOC.md, "The seal's writeback").
    pub data: DataWrites,
}

/// Applies delayed extent refs and root items until the trees stop
/// changing, then ends the transaction. `subvols` are the loaded
/// subvolumes' fs trees (tree 5 among them): the seal only reads them.
pub(crate) fn seal_transaction<D: BlockDevice>(
    forest: &mut Forest<D>,
    roots: &mut Roots,
    subvols: &[SubvolRecord],
    template: &Superblock,
) -> Result<PreparedCommit> {
    let transid = forest.transid();
    let mut passes = 0;
    loop {
        passes += 1;
        assert!(
            passes < 64,
            "extent tree did not settle after {passes} passes"
        );
        apply_delayed_refs(forest, roots, transid)?;
        // Root items are written every pass; the first write copies the
        // root tree's path, so its root always carries this transid.
        for (id, item) in recorded(roots, subvols) {
            let key = Key::new(id, item_type::ROOT_ITEM, 0);
            if forest.get(&roots.root, &key)?.as_deref() != Some(&item[..]) || passes == 1 {
                forest.put(&mut roots.root, key, item)?;
            }
        }
        if !forest.alloc().has_delayed_refs() && root_items_current(forest, roots, subvols)? {
            break;
        }
    }
    debug_assert_eq!(roots.root.generation, transid);
    // This commit's roots go in front; the oldest slot falls off.
    let mut backup_roots = [BackupRoot::EMPTY; BACKUP_ROOT_COUNT];
    backup_roots[0] = BackupRoot {
        generation: transid,
        root_tree_bytenr: roots.root.bytenr,
        root_tree_level: roots.root.level,
        extent_root: root_item(&roots.extent),
        fs_root: root_item(top_tree(subvols)?),
        bytes_used: forest.alloc().bytes_used(),
    };
    backup_roots[1..].copy_from_slice(&template.backup_roots[..BACKUP_ROOT_COUNT - 1]);
    let superblock = Superblock {
        generation: transid,
        root_tree_bytenr: roots.root.bytenr,
        root_tree_level: roots.root.level,
        bytes_used: forest.alloc().bytes_used(),
        log_root_bytenr: 0,
        log_root_level: 0,
        log_generation: 0,
        log_manifest: None,
        backup_roots,
        ..template.clone()
    };
    let pinned = forest.alloc_mut().take_pinned();
    // The dropped log's written nodes: free once this commit (whose
    // superblock no longer points at the log) is durable. No commit's
    // trees use them, so no backup root needs them kept.
    let log_released = forest.alloc_mut().take_log_pinned();
    let nodes = forest.begin_commit();
    Ok(PreparedCommit {
        nodes,
        superblock,
        pinned,
        log_released,
        data: DataWrites::new(),
    })
}

fn root_item(tree: &TreeRoot) -> RootItem {
    RootItem {
        bytenr: tree.bytenr,
        generation: tree.generation,
        level: tree.level,
    }
}

/// Every root item a commit records, by tree id: the fs-wide trees' (short
/// form) and the subvolumes'.
fn recorded(roots: &Roots, subvols: &[SubvolRecord]) -> Vec<(u64, Vec<u8>)> {
    let mut items: Vec<(u64, Vec<u8>)> = roots
        .recorded()
        .iter()
        .map(|t| (t.id, root_item(t).encode()))
        .collect();
    items.extend(subvols.iter().map(|s| (s.tree.id, s.encode())));
    items
}

/// The top-level subvolume's tree, which backup roots record.
fn top_tree(subvols: &[SubvolRecord]) -> Result<&TreeRoot> {
    subvols
        .iter()
        .map(|s| &s.tree)
        .find(|t| t.id == tree_id::FS)
        .ok_or(Error::InvalidArgument(
            "a commit without the top-level subvolume's tree",
        ))
}

fn root_items_current<D: BlockDevice>(
    forest: &Forest<D>,
    roots: &Roots,
    subvols: &[SubvolRecord],
) -> Result<bool> {
    for (id, item) in recorded(roots, subvols) {
        if forest
            .get(&roots.root, &Key::new(id, item_type::ROOT_ITEM, 0))?
            .as_deref()
            != Some(&item[..])
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Applies the delayed refs taken so far to the extent tree, and deletes
/// the checksums of the data extents they free (in the same transaction),
/// each tree in one sorted batch ([`Forest::apply_sorted`]).
fn apply_delayed_refs<D: BlockDevice>(
    forest: &mut Forest<D>,
    roots: &mut Roots,
    transid: u64,
) -> Result<()> {
    let refs = forest.alloc_mut().take_delayed_refs();
    let mut changes = Vec::with_capacity(refs.len());
    let mut freed_data = Vec::new();
    for (bytenr, delayed) in refs {
        let outcome = extent_change(forest, &roots.extent, bytenr, delayed, transid)?;
        changes.extend(outcome.item);
        if let Some(len) = outcome.frees {
            forest.alloc_mut().extent_released(bytenr, len);
            freed_data.push((bytenr, len));
        }
    }
    // Each bytenr has one delayed ref and one extent item key: in order.
    let refused = forest.apply_sorted(&mut roots.extent, changes)?;
    // Counts of shared nodes are read from the extent tree as it is now.
    forest.set_refs_root(roots.extent);
    if let Some(key) = refused.first() {
        return Err(extent_corruption(format!(
            "extent item {key}: a new extent's item already exists, \
             or a freed extent's item does not"
        )));
    }
    if let Some(csum) = roots.csum.as_mut() {
        super::csum::delete_extents_csums(forest, csum, &freed_data)?;
    }
    Ok(())
}

/// A fault found in the extent tree while applying delayed refs.
fn extent_corruption(reason: String) -> Error {
    Error::corrupt(Corruption {
        tree: Some(tree_id::EXTENT),
        block: None,
        slot: None,
        reason,
    })
}

/// What one delayed ref does.
struct RefOutcome {
    /// The change to the extent tree (read as it was before the batch).
    item: Option<(Key, Change)>,
    /// The length of the data extent it frees, if it frees one.
    frees: Option<u64>,
}

/// What one delayed ref changes in the extent tree and frees
/// ([`DelayedRef::apply`]; counts of shared nodes, docs/SNAPSHOTS.md (b)).
fn extent_change<D: BlockDevice>(
    forest: &Forest<D>,
    extent_root: &TreeRoot,
    bytenr: u64,
    r: DelayedRef,
    transid: u64,
) -> Result<RefOutcome> {
    let key = r.item_key(bytenr);
    let current = if r.reads_item() {
        let data = forest.get(extent_root, &key)?.ok_or_else(|| {
            extent_corruption(format!("extent item {key} to update does not exist"))
        })?;
        Some(ExtentItem::decode(&data).map_err(|e| extent_corruption(format!("{key}: {e}")))?)
    } else {
        None
    };
    let applied = r
        .apply(current, transid)
        .map_err(|e| extent_corruption(format!("{key}: {e}")))?;
    let item = match applied.change {
        ExtentItemChange::Keep => None,
        // A present (or missing) item is reported by the batch.
        ExtentItemChange::Insert(item) => Some((key, Change::Insert(item.encode()))),
        ExtentItemChange::Update(item) => Some((key, Change::Put(item.encode()))),
        ExtentItemChange::Delete => Some((key, Change::Delete)),
    };
    Ok(RefOutcome {
        item,
        frees: applied.frees_data.then_some(r.num_bytes),
    })
}

/// Writes a sealed transaction: data, nodes, barrier, superblocks, barrier.
pub(crate) fn write_commit<D: BlockDevice + ?Sized>(
    dev: &D,
    prepared: &PreparedCommit,
) -> Result<u64> {
    write_data(dev, &prepared.data)?;
    let written = write_nodes(
        dev,
        &prepared.nodes,
        &prepared.superblock.fsid,
        prepared.superblock.metadata_profile,
    )?;
    dev.flush()?;
    write_superblocks(dev, &prepared.superblock)?;
    Ok(written)
}

/// Writes data extents planned under the state lock (no barrier: the
/// caller's flush makes them durable before anything that points at them).
pub(crate) fn write_data<D: BlockDevice + ?Sized>(dev: &D, data: &DataWrites) -> Result<()> {
    let writes: Vec<(u64, &[u8])> = data
        .iter()
        .map(|(bytenr, bytes)| (*bytenr, &bytes[..]))
        .collect();
    dev.write_batch(&writes)?;
    Ok(())
}

/// Writes nodes to their blocks (adjacent ones in one write), and under
/// DUP each run again at its mirror; no barrier: the caller's flush covers
/// both copies. The runs and their mirrors go to the device in batches it
/// may keep in flight together ([`BlockDevice::write_batch`]), at most
/// [`NODE_BATCH_BYTES`] encoded at a time so a large commit does not hold
/// all its nodes twice in memory.
pub(crate) fn write_nodes<D: BlockDevice + ?Sized>(
    dev: &D,
    nodes: &HashMap<u64, Arc<Node>>,
    fsid: &[u8; 16],
    profile: MetadataProfile,
) -> Result<u64> {
    let mut nodes: Vec<&Arc<Node>> = nodes.values().collect();
    nodes.sort_by_key(|n| n.bytenr);
    let mut runs = RunBatch::default();
    for node in &nodes {
        runs.add(node.bytenr, &node.encode(fsid));
        if runs.bytes >= NODE_BATCH_BYTES {
            runs.write(dev, profile)?;
        }
    }
    runs.write(dev, profile)?;
    Ok(nodes.len() as u64)
}

/// Encoded node bytes [`write_nodes`] hands the device in one batch.
const NODE_BATCH_BYTES: usize = 16 << 20;

/// Longest run of adjacent nodes written with one call.
const MAX_RUN_BYTES: usize = 64 * NODE_SIZE;

/// Runs of adjacent encoded nodes waiting to be written.
#[derive(Default)]
struct RunBatch {
    runs: Vec<(u64, Vec<u8>)>,
    bytes: usize,
}

impl RunBatch {
    /// Appends a node at `bytenr` (callers go in address order).
    fn add(&mut self, bytenr: u64, encoded: &[u8]) {
        match self.runs.last_mut() {
            Some((start, run))
                if *start + run.len() as u64 == bytenr && run.len() < MAX_RUN_BYTES =>
            {
                run.extend_from_slice(encoded)
            }
            _ => self.runs.push((bytenr, encoded.to_vec())),
        }
        self.bytes += encoded.len();
    }

    /// The device writes of the runs: each run, and under DUP each again
    /// at its mirror (nodes are allocated with their mirrors at a fixed
    /// distance, so a run of adjacent nodes has an adjacent run of
    /// mirrors).
    fn writes(&self, profile: MetadataProfile) -> Vec<(u64, &[u8])> {
        let primaries = self
            .runs
            .iter()
            .map(|(start, run)| (*start, run.as_slice()));
        let mirrors = self.runs.iter().filter_map(|(start, run)| {
            profile
                .mirror_of(*start)
                .map(|mirror| (mirror, run.as_slice()))
        });
        primaries.chain(mirrors).collect()
    }

    /// Writes the runs (and mirrors) in one batch and empties the batch.
    fn write<D: BlockDevice + ?Sized>(&mut self, dev: &D, profile: MetadataProfile) -> Result<()> {
        dev.write_batch(&self.writes(profile))?;
        self.runs.clear();
        self.bytes = 0;
        Ok(())
    }
}

/// A log sync's nodes encoded for one batch (a one-flush log sync writes
/// them with its superblocks, docs/LOG-FLUSH.md), with each node's
/// checksum for the superblock's manifest.
pub(crate) struct EncodedNodes {
    runs: RunBatch,
    /// (bytenr, header checksum) of every node, in address order.
    pub checksums: Vec<(u64, u32)>,
}

impl EncodedNodes {
    pub(crate) fn new(nodes: &HashMap<u64, Arc<Node>>, fsid: &[u8; 16]) -> EncodedNodes {
        let mut nodes: Vec<&Arc<Node>> = nodes.values().collect();
        nodes.sort_by_key(|n| n.bytenr);
        let mut runs = RunBatch::default();
        let mut checksums = Vec::with_capacity(nodes.len());
        for node in nodes {
            let encoded = node.encode(fsid);
            let csum = u32::from_le_bytes(encoded[0..4].try_into().expect("4 bytes"));
            checksums.push((node.bytenr, csum));
            runs.add(node.bytenr, &encoded);
        }
        EncodedNodes { runs, checksums }
    }

    /// The device writes of the nodes and, under DUP, their mirrors.
    pub(crate) fn writes(&self, profile: MetadataProfile) -> Vec<(u64, &[u8])> {
        self.runs.writes(profile)
    }
}

/// The two superblock copies of `sb`, each encoded for its offset.
pub(crate) fn superblock_copies(sb: &Superblock) -> Vec<(u64, Vec<u8>)> {
    SUPERBLOCK_OFFSETS
        .iter()
        .map(|&offset| (offset, sb.encode(offset)))
        .collect()
}

/// Writes both superblock copies and flushes.
pub(crate) fn write_superblocks<D: BlockDevice + ?Sized>(dev: &D, sb: &Superblock) -> Result<()> {
    let copies = superblock_copies(sb);
    let writes: Vec<(u64, &[u8])> = copies
        .iter()
        .map(|(offset, bytes)| (*offset, bytes.as_slice()))
        .collect();
    dev.write_batch(&writes)?;
    dev.flush()?;
    Ok(())
}

/// Reads both superblock copies and returns the valid one with the highest
/// generation, or an error naming what is wrong with each.
pub fn read_superblock<D: BlockDevice + ?Sized>(dev: &D) -> Result<Superblock> {
    let mut best: Option<Superblock> = None;
    let mut problems = Vec::new();
    for offset in SUPERBLOCK_OFFSETS {
        let mut buf = vec![0u8; SUPERBLOCK_SIZE];
        if let Err(e) = dev.read_at(&mut buf, offset) {
            problems.push(format!("superblock at {offset}: {e}"));
            continue;
        }
        match Superblock::decode(&buf, offset) {
            Ok(sb) => {
                // Log syncs rewrite the superblock without a new
                // generation: among equals, the later log wins.
                if best.as_ref().is_none_or(|b| {
                    (sb.generation, sb.log_generation) > (b.generation, b.log_generation)
                }) {
                    best = Some(sb);
                }
            }
            Err(e) => problems.push(format!("superblock at {offset}: {e}")),
        }
    }
    match best {
        Some(sb) if sb.total_bytes > dev.size_bytes() => Err(Error::corrupt(Corruption::general(format!(
            "superblock says the filesystem is {} bytes but the device has only {} (truncated image?)",
            sb.total_bytes,
            dev.size_bytes()
        )))),
        Some(sb) => Ok(sb),
        None => Err(Error::corrupt(Corruption::general(format!("not a birch filesystem: {}", problems.join("; "))))),
    }
}
