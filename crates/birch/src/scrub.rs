//! `birch scrub IMAGE|MOUNTPOINT`: reads every copy of every tree node,
//! verifies each, and rewrites a bad copy from a good one (docs/DUP.md);
//! then reads every data extent and verifies each block against its
//! checksum (docs/DATA-CHECKSUMS.md). Data has one copy: a bad block is
//! reported by path and file offset, unrepaired. Extents without checksums
//! (images without the feature, preallocated extents) are counted as not
//! verified.
//!
//! The walk (`scrub_trees`) serves both an image nothing else has open
//! ([`scrub_device`]) and a mounted filesystem, whose engine calls it on
//! its own device with its durable superblock while no commit can run
//! (`scrub::scrub_filesystem`).

use crate::btree::{copy_name, read_node_copies, NodeExpectation};
use crate::device::BlockDevice;
use crate::error::{Corruption, Error, Result};
use crate::format::tree_name;
use crate::format::{
    block_csum, decode_csums_at, decode_inode_extrefs, decode_inode_refs, item_type, tree_id,
    FileExtent, ItemError, Key, KeyPtr, LeafItem, Node, NodeBody, RootItem, SubvolRootItem,
    Superblock, ROOT_DIR_INO, SECTOR_SIZE, SUBVOL_ROOT_ITEM_SIZE,
};
use crate::fs::log_choice::choose_log;
use crate::fs::{read_superblock, Filesystem};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;

/// Largest read of data scrub issues (and so holds in memory).
const DATA_READ_BYTES: u64 = 1 << 20;

/// What a scrub found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubReport {
    /// The metadata profile (`single` or `dup`).
    pub profile: &'static str,
    /// Nodes reached, and node copies read.
    pub nodes: u64,
    pub copies: u64,
    /// One line per bad copy rewritten from the good one.
    pub repaired: Vec<String>,
    /// One line per node with no good copy, per bad copy whose rewrite
    /// failed (or was not allowed: a read-only mount), per root item that
    /// does not decode, and per bad data block.
    pub unrepaired: Vec<String>,
    /// Lines left out of `repaired` and `unrepaired` to keep a report
    /// short (a mounted scrub's reply has a bounded size); they count in
    /// the summary all the same.
    pub repaired_not_listed: u64,
    pub unrepaired_not_listed: u64,
    /// Data extents read, and their blocks verified against a checksum and
    /// read without one (no checksums on the image, or a preallocated
    /// extent never written).
    pub data_extents: u64,
    pub data_blocks_verified: u64,
    pub data_blocks_not_verified: u64,
    /// Blocks that failed their checksum or could not be read (each also a
    /// line of `unrepaired`).
    pub data_blocks_bad: u64,
}

/// How far a scrub is: tree nodes scrubbed, and bytes of data extents
/// read of all (the total is known, and non-zero, once the node walk is
/// done).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScrubProgress {
    pub nodes_done: u64,
    pub data_bytes_done: u64,
    pub data_bytes_total: u64,
}

impl ScrubReport {
    /// Whether nothing was left unrepaired: every node has a good copy in
    /// place on every mirror, and every verified data block matched.
    pub fn is_clean(&self) -> bool {
        self.unrepaired.is_empty() && self.unrepaired_not_listed == 0
    }

    pub fn repaired_count(&self) -> u64 {
        self.repaired.len() as u64 + self.repaired_not_listed
    }

    pub fn unrepaired_count(&self) -> u64 {
        self.unrepaired.len() as u64 + self.unrepaired_not_listed
    }
}

/// What a scrub may write and which trees it reaches.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ScrubScope<'a> {
    /// Also scrub the log root tree and its log trees. Only where no log
    /// sync can run: a mounted filesystem's log syncs free and reuse log
    /// blocks while the scrub walks.
    pub walk_log: bool,
    /// Why bad copies must not be rewritten (a read-only mount), if so.
    pub no_repair: Option<&'a str>,
}

impl fmt::Display for ScrubReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in &self.repaired {
            writeln!(f, "repaired: {line}")?;
        }
        if self.repaired_not_listed > 0 {
            writeln!(f, "repaired: … and {} more", self.repaired_not_listed)?;
        }
        for line in &self.unrepaired {
            writeln!(f, "unrepaired: {line}")?;
        }
        if self.unrepaired_not_listed > 0 {
            writeln!(f, "unrepaired: … and {} more", self.unrepaired_not_listed)?;
        }
        writeln!(
            f,
            "scrubbed {} tree nodes ({} copies, metadata {}): {} repaired, {} unrepaired",
            self.nodes,
            self.copies,
            self.profile,
            self.repaired_count(),
            self.unrepaired_count()
        )?;
        writeln!(
            f,
            "scrubbed {} data extents: {} blocks verified, {} bad (not repairable: one copy), {} not verified (no checksums)",
            self.data_extents,
            self.data_blocks_verified,
            self.data_blocks_bad,
            self.data_blocks_not_verified
        )
    }
}

/// Scrubs every tree the superblock reaches: the root tree, each tree its
/// root items name, and the log root tree with its log trees; then every
/// data extent of the extent tree. The device must not be in use by a
/// mounted filesystem (a rewrite could land on a block it has since
/// reused). Fails only if no superblock is valid.
pub fn scrub_device<D: BlockDevice + ?Sized>(dev: &D) -> Result<ScrubReport> {
    scrub_device_with_progress(dev, &mut |_| {})
}

/// [`scrub_device`], calling `progress` as the scrub goes.
pub fn scrub_device_with_progress<D: BlockDevice + ?Sized>(
    dev: &D,
    progress: &mut dyn FnMut(ScrubProgress),
) -> Result<ScrubReport> {
    let sb = read_superblock(dev)?;
    let scope = ScrubScope {
        walk_log: true,
        no_repair: None,
    };
    Ok(scrub_trees(dev, &sb, scope, progress))
}

/// Scrubs the durable commit of an open filesystem in place (docs/DUP.md,
/// "Scrub"): every copy of every node of its trees is read and verified, a
/// bad copy is rewritten from the good one (not on a read-only
/// filesystem), then every data extent is verified against its checksums.
/// Commits wait meanwhile ([`Filesystem::with_durable_commit`] says why
/// that makes the rewrites safe). The log is not scrubbed: log syncs keep
/// freeing and reusing its blocks, and a mount replays it with read
/// repair. Progress shows in the filesystem's `scrub_nodes` and
/// `scrub_data_bytes` counters as it goes.
pub fn scrub_filesystem<D: BlockDevice>(fs: &Filesystem<D>) -> Result<ScrubReport> {
    fs.with_durable_commit(|dev, superblock, no_rewrite| {
        let scope = ScrubScope {
            walk_log: false,
            no_repair: no_rewrite,
        };
        let mut counted = ScrubProgress::default();
        let report = scrub_trees(dev, superblock, scope, &mut |now| {
            fs.count_scrub_progress(
                now.nodes_done - counted.nodes_done,
                now.data_bytes_done - counted.data_bytes_done,
            );
            counted = now;
        });
        if !report.repaired.is_empty() {
            dev.flush().map_err(|e| {
                Error::Io(std::io::Error::new(
                    e.kind(),
                    format!("scrub: flush after the repairs: {e}"),
                ))
            })?;
        }
        Ok(report)
    })?
}

/// Scrubs the trees `sb` names (the log's only if `scope.walk_log`), then
/// the data extents of its extent tree. The caller guarantees that no
/// block those trees use is freed and reused while this runs.
pub(crate) fn scrub_trees<D: BlockDevice + ?Sized>(
    dev: &D,
    sb: &Superblock,
    scope: ScrubScope<'_>,
    progress: &mut dyn FnMut(ScrubProgress),
) -> ScrubReport {
    let profile = sb.metadata_profile;
    let mut report = ScrubReport {
        profile: profile.name(),
        ..Default::default()
    };
    let mut stack = vec![Visit {
        bytenr: sb.root_tree_bytenr,
        tree: tree_id::ROOT,
        level: sb.root_tree_level,
        generation: Some(sb.generation),
        high: None,
        dropped_to: None,
    }];
    let manifest = if scope.walk_log {
        log_start(dev, sb, &mut stack, &mut report)
    } else {
        HashMap::new()
    };
    // Snapshots share subtrees: a node is read once, through whichever
    // tree reaches it first (its header's owner need not be that tree,
    // `tree_id::may_reach` allows it).
    let mut seen = HashSet::new();
    let mut data = DataMaps::default();
    while let Some(visit) = stack.pop() {
        let (bytenr, tree) = (visit.bytenr, visit.tree);
        if !seen.insert(bytenr) {
            continue;
        }
        let expect = visit.generation.map(|generation| NodeExpectation {
            tree,
            level: visit.level,
            generation,
        });
        report.nodes += 1;
        progress(ScrubProgress {
            nodes_done: report.nodes,
            ..Default::default()
        });
        let listed = manifest.get(&bytenr).copied();
        let Some(node) = scrub_node(dev, sb, (bytenr, listed), tree, expect, scope, &mut report)
        else {
            continue;
        };
        match &node.body {
            NodeBody::Internal(ptrs) => {
                push_children(&mut stack, &mut data, &visit, node.level, ptrs)
            }
            NodeBody::Leaf(items) if tree == tree_id::ROOT || tree == tree_id::LOG_ROOT => {
                for item in items
                    .iter()
                    .filter(|i| i.key.item_type == item_type::ROOT_ITEM)
                {
                    match root_visit(tree, item) {
                        Ok(visit) => {
                            data.pointer(visit.tree, None, visit.bytenr);
                            stack.push(visit);
                        }
                        Err(e) => report.unrepaired.push(format!(
                            "block {bytenr} of tree {}: root item {}: {e} (its tree was not scrubbed)",
                            tree_name(tree),
                            item.key
                        )),
                    }
                }
            }
            NodeBody::Leaf(items) => data.collect(tree, bytenr, items),
        }
    }
    scrub_data(dev, &data, &mut report, progress);
    report
}

/// A node to scrub and what the pointer to it promises.
struct Visit {
    bytenr: u64,
    tree: u64,
    level: u8,
    /// None: only its own header counts, as for the log root, whose
    /// generation is the log's business.
    generation: Option<u64>,
    /// The parent's next key: every key of this subtree is below it
    /// (None: the tree's right edge).
    high: Option<Key>,
    /// For a deleted subvolume being dropped: its `drop_progress`. A
    /// pointer whose subtree's upper bound is at or below it was released
    /// (docs/SNAPSHOTS.md (d)) and is not followed.
    dropped_to: Option<Key>,
}

/// The log a mount would replay (docs/LOG-FLUSH.md): queues its root and
/// returns the checksums the superblock's manifest lists for its last
/// sync's nodes, by which they are judged.
fn log_start<D: BlockDevice + ?Sized>(
    dev: &D,
    sb: &Superblock,
    stack: &mut Vec<Visit>,
    report: &mut ScrubReport,
) -> HashMap<u64, u32> {
    match choose_log(dev, sb) {
        Ok(choice) => {
            if let Some(log) = choice.log {
                stack.push(Visit {
                    bytenr: log.bytenr,
                    tree: tree_id::LOG_ROOT,
                    level: log.level,
                    generation: None,
                    high: None,
                    dropped_to: None,
                });
            }
            choice.manifest_checksums
        }
        Err(e) => {
            report
                .unrepaired
                .push(format!("fsync log: {e} (not scrubbed)"));
            HashMap::new()
        }
    }
}

/// Queues the children of internal node `parent` (at `level`, what its
/// header says), but for the pointers a
/// drop in progress has released; notes the pointers for `DataMaps`.
fn push_children(
    stack: &mut Vec<Visit>,
    data: &mut DataMaps,
    parent: &Visit,
    level: u8,
    ptrs: &[KeyPtr],
) {
    for (i, p) in ptrs.iter().enumerate() {
        let high = ptrs.get(i + 1).map(|next| next.key).or(parent.high);
        // Released by the cleaner: the child was decremented or freed,
        // and its block may since hold anything.
        if matches!((high, parent.dropped_to), (Some(h), Some(done)) if h <= done) {
            continue;
        }
        data.pointer(parent.tree, Some(parent.bytenr), p.blockptr);
        stack.push(Visit {
            bytenr: p.blockptr,
            tree: parent.tree,
            level: level.saturating_sub(1),
            generation: Some(p.generation),
            high,
            dropped_to: parent.dropped_to,
        });
    }
}

/// The tree a ROOT_ITEM of the root tree (or of the log root tree, whose
/// items name log trees) leads to.
fn root_visit(tree: u64, item: &LeafItem) -> std::result::Result<Visit, ItemError> {
    // A subvolume's long item (INCOMPAT_SUBVOLUMES) or the short form.
    let (root, dropped_to) = if item.data.len() == SUBVOL_ROOT_ITEM_SIZE {
        let long = SubvolRootItem::decode(&item.data)?;
        let dropping = long.refs == 0 && long.drop_progress != Key::MIN;
        (long.root, dropping.then_some(long.drop_progress))
    } else {
        (RootItem::decode(&item.data)?, None)
    };
    Ok(Visit {
        bytenr: root.bytenr,
        tree: if tree == tree_id::LOG_ROOT {
            tree_id::LOG
        } else {
            item.key.objectid
        },
        level: root.level,
        generation: Some(root.generation),
        high: None,
        dropped_to,
    })
}

/// Reads every copy of node `bytenr` of `tree` and rewrites each bad one
/// from a good one (unless `scope.no_repair` says why not). A copy whose
/// checksum is not the one the log manifest lists for the block (`listed`)
/// is bad. Returns the node, or `None` when no copy is good (the report
/// says so).
fn scrub_node<D: BlockDevice + ?Sized>(
    dev: &D,
    sb: &Superblock,
    (bytenr, listed): (u64, Option<u32>),
    tree: u64,
    expect: Option<NodeExpectation>,
    scope: ScrubScope<'_>,
    report: &mut ScrubReport,
) -> Option<Node> {
    let mut good = None;
    let mut bad = Vec::new();
    for copy in read_node_copies(dev, &sb.fsid, sb.metadata_profile, bytenr, expect) {
        report.copies += 1;
        let result = copy.result.and_then(|(node, raw)| {
            let stored = u32::from_le_bytes(raw[0..4].try_into().expect("4 bytes"));
            match listed {
                Some(want) if want != stored => Err(Error::corrupt(Corruption::at_block(
                    Some(tree),
                    bytenr,
                    None,
                    format!(
                        "checksum {stored:#010x}, the superblock's log manifest lists {want:#010x}"
                    ),
                ))),
                _ => Ok((node, raw)),
            }
        });
        match result {
            Ok(ok) => good = good.or(Some(ok)),
            Err(e) => bad.push((copy.index, copy.offset, e)),
        }
    }
    let Some((node, raw)) = good else {
        let reasons: Vec<String> = bad.iter().map(|(_, _, e)| e.to_string()).collect();
        report.unrepaired.push(format!(
            "block {bytenr} of tree {}: no good copy: {}",
            tree_name(tree),
            reasons.join("; ")
        ));
        return None;
    };
    for (index, offset, error) in bad {
        let which = copy_name(index);
        let line = format!(
            "block {bytenr} of tree {}: {which} at {offset}: {error}",
            tree_name(tree)
        );
        if let Some(why) = scope.no_repair {
            report
                .unrepaired
                .push(format!("{line}; not rewritten: {why}"));
            continue;
        }
        match dev.write_at(&raw, offset) {
            Ok(()) => report.repaired.push(line),
            Err(e) => report
                .unrepaired
                .push(format!("{line}; rewriting it failed: {e}")),
        }
    }
    Some(node)
}

/// A file extent of a subvolume tree's leaf: which disk bytes it maps to
/// which file bytes.
struct FileUse {
    /// A compressed extent: any of its disk blocks is all of its range.
    compressed: bool,
    disk_bytenr: u64,
    offset: u64,
    len: u64,
    ino: u64,
    file_offset: u64,
    /// The leaf holding the item (reached by every tree that shares it).
    leaf: u64,
}

/// What the data scrub needs from the trees, gathered by the node walk.
/// Each node is read once, so a leaf shared by snapshots is collected
/// once; which subvolumes reach it is answered from the pointers the walk
/// saw (`parents`, `roots`), without reading anything again.
#[derive(Default)]
struct DataMaps {
    /// Data extents: bytenr -> length.
    extents: BTreeMap<u64, u64>,
    /// Checksum items: start -> checksums.
    csums: BTreeMap<u64, Vec<u32>>,
    /// Regular and preallocated file extents of every subvolume tree.
    file_extents: Vec<FileUse>,
    /// One name of each inode per leaf: ino -> (leaf, parent, name).
    names: HashMap<u64, Vec<(u64, u64, Vec<u8>)>>,
    /// Subvolume tree nodes -> the nodes pointing at them (several for a
    /// node shared by snapshots).
    parents: HashMap<u64, Vec<u64>>,
    /// Subvolume root nodes -> the subvolumes whose root item names them.
    roots: HashMap<u64, Vec<u64>>,
}

impl DataMaps {
    /// Notes that `tree` reaches node `child` through `parent` (None: its
    /// root item), for the subvolume trees whose files `users_of` names.
    fn pointer(&mut self, tree: u64, parent: Option<u64>, child: u64) {
        if !tree_id::is_subvolume(tree) {
            return;
        }
        match parent {
            Some(parent) => self.parents.entry(child).or_default().push(parent),
            None => self.roots.entry(child).or_default().push(tree),
        }
    }

    /// Takes what it needs from leaf `leaf` of `tree` (items that do not
    /// decode are `birch check`'s business; the scrub skips them).
    fn collect(&mut self, tree: u64, leaf: u64, items: &[LeafItem]) {
        for item in items {
            let key = item.key;
            match (tree, key.item_type) {
                (tree_id::EXTENT, item_type::EXTENT_ITEM) => {
                    self.extents.insert(key.objectid, key.offset);
                }
                (tree_id::CSUM, item_type::EXTENT_CSUM) => {
                    if let Ok(sums) = decode_csums_at(&key, &item.data) {
                        self.csums.insert(key.offset, sums);
                    }
                }
                (tree, item_type::EXTENT_DATA) if tree_id::is_subvolume(tree) => {
                    let extent = FileExtent::decode_at(&key, &item.data).ok();
                    if let Some((e, d)) = extent.and_then(|e| e.disk_ref().map(|d| (e, d))) {
                        // A compressed extent's file bytes come from all
                        // of its disk extent: a bad block hits the item's
                        // whole range (reported at its first byte).
                        let compressed = e.compressed_ref().is_some();
                        let (offset, len) = match compressed {
                            true => (0, d.disk_num_bytes),
                            false => (d.offset, d.num_bytes),
                        };
                        self.file_extents.push(FileUse {
                            compressed,
                            disk_bytenr: d.disk_bytenr,
                            offset,
                            len,
                            ino: key.objectid,
                            file_offset: key.offset,
                            leaf,
                        });
                    }
                }
                (tree, item_type::INODE_REF) if tree_id::is_subvolume(tree) => {
                    if let Some(r) = decode_inode_refs(&item.data)
                        .ok()
                        .and_then(|r| r.into_iter().next())
                    {
                        self.name(key.objectid, leaf, key.offset, r.name);
                    }
                }
                (tree, item_type::INODE_EXTREF) if tree_id::is_subvolume(tree) => {
                    if let Some(r) = decode_inode_extrefs(&item.data)
                        .ok()
                        .and_then(|r| r.into_iter().next())
                    {
                        self.name(key.objectid, leaf, r.parent, r.name);
                    }
                }
                _ => {}
            }
        }
    }

    /// Records a name of `ino` found in `leaf`, the first the leaf holds.
    fn name(&mut self, ino: u64, leaf: u64, parent: u64, name: Vec<u8>) {
        let names = self.names.entry(ino).or_default();
        if !names.iter().any(|&(at, _, _)| at == leaf) {
            names.push((leaf, parent, name));
        }
    }

    /// The checksum recorded for the block at `bytenr`.
    fn csum_of(&self, bytenr: u64) -> Option<u32> {
        let (&start, sums) = self.csums.range(..=bytenr).next_back()?;
        sums.get(((bytenr - start) / SECTOR_SIZE) as usize).copied()
    }

    /// The subvolumes whose trees reach `node`, from the pointers the walk
    /// recorded (each node visited once, so a cycle cannot loop).
    fn subvolumes_reaching(&self, node: u64) -> BTreeSet<u64> {
        let mut found = BTreeSet::new();
        let mut seen = HashSet::new();
        let mut stack = vec![node];
        while let Some(at) = stack.pop() {
            if !seen.insert(at) {
                continue;
            }
            found.extend(self.roots.get(&at).into_iter().flatten());
            stack.extend(self.parents.get(&at).into_iter().flatten());
        }
        found
    }

    /// A path of `ino` in subvolume `tree` from its root directory (`?`
    /// where no name of it is in a leaf `tree` reaches), bounded against
    /// cycles.
    fn path_of(&self, tree: u64, mut ino: u64) -> String {
        let mut parts = Vec::new();
        while ino != ROOT_DIR_INO && parts.len() < 256 {
            let name = self.names.get(&ino).and_then(|names| {
                names
                    .iter()
                    .find(|(leaf, _, _)| self.subvolumes_reaching(*leaf).contains(&tree))
            });
            match name {
                Some((_, parent, name)) => {
                    parts.push(String::from_utf8_lossy(name).into_owned());
                    ino = *parent;
                }
                None => {
                    parts.push(format!("?(inode {ino})"));
                    break;
                }
            }
        }
        parts.reverse();
        format!("/{}", parts.join("/"))
    }

    /// Where the disk block at `bytenr` is used: "PATH offset N (inode I)"
    /// for every file extent reaching it, in every subvolume sharing the
    /// extent's leaf (PATH from the subvolume's root directory, after
    /// "subvolume ID " for a subvolume other than 5).
    fn users_of(&self, bytenr: u64) -> Vec<String> {
        let mut users = Vec::new();
        for f in &self.file_extents {
            let start = f.disk_bytenr.saturating_add(f.offset);
            if !(start..start.saturating_add(f.len)).contains(&bytenr) {
                continue;
            }
            let at = match f.compressed {
                true => f.file_offset,
                false => f.file_offset.saturating_add(bytenr - start),
            };
            for tree in self.subvolumes_reaching(f.leaf) {
                let subvolume = if tree == tree_id::FS {
                    String::new()
                } else {
                    format!("subvolume {tree} ")
                };
                users.push(format!(
                    "{subvolume}{} offset {at} (inode {})",
                    self.path_of(tree, f.ino),
                    f.ino
                ));
            }
        }
        users
    }
}

/// Reads every data extent and verifies each block that has a checksum.
fn scrub_data<D: BlockDevice + ?Sized>(
    dev: &D,
    data: &DataMaps,
    report: &mut ScrubReport,
    progress: &mut dyn FnMut(ScrubProgress),
) {
    let total: u64 = data.extents.values().sum();
    let mut done = 0;
    let mut buf = Vec::new();
    for (&bytenr, &len) in &data.extents {
        report.data_extents += 1;
        let mut at = bytenr;
        while at < bytenr + len {
            let chunk = DATA_READ_BYTES.min(bytenr + len - at);
            buf.resize(chunk as usize, 0);
            let read = dev.read_at(&mut buf, at);
            for (i, block) in buf.chunks(SECTOR_SIZE as usize).enumerate() {
                let block_bytenr = at + i as u64 * SECTOR_SIZE;
                let Some(sum) = data.csum_of(block_bytenr) else {
                    report.data_blocks_not_verified += 1;
                    continue;
                };
                let problem = match &read {
                    Err(e) => format!("read failed: {e}"),
                    Ok(()) if block_csum(block) != sum => format!(
                        "checksum {sum:#010x} recorded, the block has {:#010x}",
                        block_csum(block)
                    ),
                    Ok(()) => {
                        report.data_blocks_verified += 1;
                        continue;
                    }
                };
                report.data_blocks_bad += 1;
                let users = data.users_of(block_bytenr);
                let whose = if users.is_empty() {
                    "no file uses it".to_string()
                } else {
                    users.join(", ")
                };
                report
                    .unrepaired
                    .push(format!("data block {block_bytenr}: {problem}: {whose}"));
            }
            at += chunk;
            done += chunk;
            progress(ScrubProgress {
                nodes_done: report.nodes,
                data_bytes_done: done,
                data_bytes_total: total,
            });
        }
    }
}
