//! Pass `tree-structure`: walks every tree once, validating each node and
//! its place in the tree, and decodes every leaf item into the records the
//! later passes use (decode failures are faults of pass `items`).
//! Pass `items`: per-item rules on those records.

use super::{
    pass_id, Checker, EntryRec, ExtentKind, ExtentRec, FileExtentKind, FileExtentRec, InodeRec,
    Loc, NodeRec, PassStatus, RefRec, TreeSummary,
};
use crate::btree::{copy_name, read_node_copies, NodeExpectation};
use crate::error::Error;
use crate::format::node::MAX_LEVEL;
use crate::format::{
    decode_dir_items, decode_inode_extrefs, decode_inode_refs, decode_xattrs, extref_hash,
    item_type, item_type_name, name_hash, tree_id, DirEntry, ExtentItem, FileExtent, InodeItem,
    Key, LeafItem, MetadataProfile, NodeBody, RootItem, EXTENT_CSUM_OBJECTID, FIRST_DIR_INDEX,
    NODE_SIZE, ORPHAN_OBJECTID, ROOT_DIR_INO,
};
use crate::print::{name, tree_name};
use std::collections::HashSet;

/// What a tree's leaves hold, and so how they are collected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Root,
    Extent,
    Fs,
    LogRoot,
    Log,
    Csum,
    /// A tree this version does not know: structure only.
    Other,
}

struct Target {
    tree: u64,
    bytenr: u64,
    level: u8,
    /// What the pointer to the root promises (None: not checked).
    generation: Option<u64>,
    kind: Kind,
    /// For a log tree: the subvolume it logs.
    subvolume: Option<u64>,
}

struct Frame {
    bytenr: u64,
    level: u8,
    generation: Option<u64>,
    /// The parent's key for this child, and the parent's next key.
    low: Option<Key>,
    high: Option<Key>,
    /// Where the pointer to this node is (parent block, slot).
    parent: Option<(u64, usize)>,
}

pub(super) fn run(c: &mut Checker<'_>) -> PassStatus {
    let Some(sb) = c.sb.clone() else {
        return PassStatus::Skipped("no valid superblock".into());
    };
    c.walk(Target {
        tree: tree_id::ROOT,
        bytenr: sb.root_tree_bytenr,
        level: sb.root_tree_level,
        generation: Some(sb.generation),
        kind: Kind::Root,
        subvolume: None,
    });

    if c.tree_readable(tree_id::ROOT) {
        for id in [tree_id::EXTENT, tree_id::FS] {
            if !c.roots.contains_key(&id) {
                c.fault_key(
                    tree_id::ROOT,
                    Key::new(id, item_type::ROOT_ITEM, 0),
                    format!("missing root item for the {} tree", tree_name(id)),
                );
            }
        }
    }
    let roots: Vec<(u64, RootItem, Loc)> = c
        .roots
        .iter()
        .map(|(&id, (item, loc))| (id, *item, *loc))
        .collect();
    for (id, item, loc) in roots {
        let kind = match id {
            tree_id::EXTENT => Kind::Extent,
            tree_id::FS => Kind::Fs,
            tree_id::CSUM => Kind::Csum,
            tree_id::ROOT | tree_id::LOG | tree_id::LOG_ROOT => {
                c.fault_at(
                    &loc,
                    format!(
                        "the root tree may not hold a root item for {}",
                        tree_name(id)
                    ),
                );
                continue;
            }
            _ => {
                c.warn_at(
                    &loc,
                    format!("tree {id} is not known to this version: checked for structure only"),
                );
                Kind::Other
            }
        };
        if item.generation > sb.generation {
            c.fault_at(
                &loc,
                format!(
                    "root item generation {} is newer than the superblock generation {}",
                    item.generation, sb.generation
                ),
            );
        }
        c.walk(Target {
            tree: id,
            bytenr: item.bytenr,
            level: item.level,
            generation: Some(item.generation),
            kind,
            subvolume: None,
        });
    }

    if sb.log_root_bytenr != 0 {
        // The log root's generation is the log transaction's business (the
        // tree-log defines it); owner and level are checked.
        c.walk(Target {
            tree: tree_id::LOG_ROOT,
            bytenr: sb.log_root_bytenr,
            level: sb.log_root_level,
            generation: None,
            kind: Kind::LogRoot,
            subvolume: None,
        });
        let logs: Vec<(u64, RootItem, Loc)> = c
            .log_roots
            .iter()
            .map(|(&sub, (item, loc))| (sub, *item, *loc))
            .collect();
        for (sub, item, loc) in logs {
            if sub != tree_id::FS {
                c.fault_at(&loc, format!("log of unknown subvolume {sub}"));
                continue;
            }
            c.walk(Target {
                tree: tree_id::LOG,
                bytenr: item.bytenr,
                level: item.level,
                generation: Some(item.generation),
                kind: Kind::Log,
                subvolume: Some(sub),
            });
        }
    }

    // Nodes are NODE_SIZE long but only sector aligned: two distinct
    // blocks may still overlap.
    let mut starts: Vec<(u64, u64)> = c.nodes.iter().map(|(&b, n)| (b, n.tree)).collect();
    starts.sort_unstable();
    for w in starts.windows(2) {
        if w[1].0 < w[0].0.saturating_add(NODE_SIZE as u64) {
            c.fault_block(
                Some(w[1].1),
                w[1].0,
                None,
                format!(
                    "node overlaps node {} of tree {}",
                    w[0].0,
                    tree_name(w[0].1)
                ),
            );
        }
    }
    PassStatus::Ran
}

impl Checker<'_> {
    fn walk(&mut self, t: Target) {
        let sb_generation = self.sb.as_ref().map_or(0, |sb| sb.generation);
        let is_log = Self::is_log_tree(t.tree);
        let mut summary = TreeSummary {
            id: t.tree,
            subvolume: t.subvolume,
            root: t.bytenr,
            level: t.level,
            ..Default::default()
        };
        let mut root_read = false;
        let mut stack = vec![Frame {
            bytenr: t.bytenr,
            level: t.level,
            generation: t.generation,
            low: None,
            high: None,
            parent: None,
        }];
        while let Some(f) = stack.pop() {
            let pointer = |f: &Frame| match f.parent {
                Some((block, slot)) => format!("pointer in block {block} slot {slot}"),
                None => "tree root".to_string(),
            };
            if let Some(prev) = self.nodes.get(&f.bytenr).copied() {
                let reason = if prev.tree != t.tree {
                    format!(
                        "block belongs to tree {} but is reached from tree {} ({})",
                        tree_name(prev.tree),
                        tree_name(t.tree),
                        pointer(&f)
                    )
                } else {
                    format!(
                        "block reached twice ({}): a cycle or a shared child",
                        pointer(&f)
                    )
                };
                self.fault_block(Some(t.tree), f.bytenr, None, reason);
                continue;
            }
            let expect = f.generation.map(|generation| NodeExpectation {
                tree: t.tree,
                level: f.level,
                generation,
            });
            // Under DUP every copy is verified and each bad one is a
            // fault of its own; the walk goes on with a good copy.
            let profile = self
                .sb
                .as_ref()
                .map_or(MetadataProfile::Single, |sb| sb.metadata_profile);
            let copies = read_node_copies(
                self.dev,
                &self.report.summary.fsid,
                profile,
                f.bytenr,
                expect,
            );
            let mut good = None;
            for copy in copies {
                let context = pointer(&f);
                match copy.result {
                    Ok((n, _)) => good = good.or(Some(n)),
                    Err(Error::Corrupt(mut corruption)) => {
                        if profile.mirror_offset().is_some() && copy.index == 0 {
                            corruption.reason = format!(
                                "{} at {}: {}",
                                copy_name(copy.index),
                                copy.offset,
                                corruption.reason
                            );
                        }
                        self.fault_corruption(corruption, Some(context));
                    }
                    Err(e) => {
                        let which = if profile.mirror_offset().is_some() {
                            format!(" ({} at {})", copy_name(copy.index), copy.offset)
                        } else {
                            String::new()
                        };
                        self.fault_block(
                            Some(t.tree),
                            f.bytenr,
                            None,
                            format!("cannot read node{which}: {e} ({context})"),
                        );
                    }
                }
            }
            let Some(node) = good else {
                continue;
            };
            if expect.is_none() && (node.owner != t.tree || node.level != f.level) {
                let context = pointer(&f);
                self.fault_block(
                    Some(t.tree),
                    f.bytenr,
                    None,
                    format!(
                        "owner {} level {} but expected {} level {} ({context})",
                        tree_name(node.owner),
                        node.level,
                        tree_name(t.tree),
                        f.level
                    ),
                );
                continue;
            }
            self.nodes.insert(
                f.bytenr,
                NodeRec {
                    tree: t.tree,
                    level: node.level,
                    generation: node.generation,
                },
            );
            if f.parent.is_none() {
                root_read = true;
            }
            summary.nodes += 1;
            if !is_log && node.generation > sb_generation {
                self.fault_block(Some(t.tree), f.bytenr, None, format!("node generation {} is newer than the superblock generation {sb_generation}", node.generation));
            }
            let n = node.nritems();
            if n == 0 && f.parent.is_some() {
                self.fault_block(
                    Some(t.tree),
                    f.bytenr,
                    None,
                    format!("empty non-root node ({})", pointer(&f)),
                );
            }
            if let (Some(low), Some(first)) = (f.low, node.first_key()) {
                if first != low {
                    self.fault_block(
                        Some(t.tree),
                        f.bytenr,
                        Some(0),
                        format!(
                            "first key {first} differs from the parent's key {low} ({})",
                            pointer(&f)
                        ),
                    );
                }
            }
            let last = match &node.body {
                NodeBody::Leaf(items) => items.last().map(|i| i.key),
                NodeBody::Internal(ptrs) => ptrs.last().map(|p| p.key),
            };
            if let (Some(high), Some(last)) = (f.high, last) {
                if last >= high {
                    self.fault_block(
                        Some(t.tree),
                        f.bytenr,
                        Some(n - 1),
                        format!(
                            "key {last} is not below the parent's next key {high} ({})",
                            pointer(&f)
                        ),
                    );
                }
            }
            match &node.body {
                NodeBody::Leaf(items) => {
                    summary.leaves += 1;
                    summary.items += items.len() as u64;
                    for (slot, item) in items.iter().enumerate() {
                        let loc = Loc {
                            tree: t.tree,
                            block: f.bytenr,
                            slot: slot as u32,
                            key: item.key,
                        };
                        match t.kind {
                            Kind::Root => self.collect_root_item(&loc, item),
                            Kind::LogRoot => self.collect_log_root_item(&loc, item),
                            Kind::Extent => self.collect_extent_item(&loc, item),
                            Kind::Fs => self.collect_fs_item(&loc, item, false),
                            Kind::Log => self.collect_fs_item(&loc, item, true),
                            Kind::Csum => self.collect_csum_item(&loc, item, false),
                            Kind::Other => {}
                        }
                    }
                }
                NodeBody::Internal(ptrs) => {
                    // Decode guarantees level >= 1 here; levels strictly
                    // decrease, so the walk is at most MAX_LEVEL deep.
                    let child_level = node.level.saturating_sub(1);
                    for (i, p) in ptrs.iter().enumerate().rev() {
                        stack.push(Frame {
                            bytenr: p.blockptr,
                            level: child_level,
                            generation: Some(p.generation),
                            low: Some(p.key),
                            high: ptrs.get(i + 1).map(|n| n.key).or(f.high),
                            parent: Some((f.bytenr, i)),
                        });
                    }
                }
            }
        }
        self.readable.insert(
            t.tree,
            root_read || self.readable.get(&t.tree).copied().unwrap_or(false),
        );
        if is_log {
            self.report.summary.log_nodes += summary.nodes;
        }
        self.report.summary.trees.push(summary);
    }

    /// A fault of pass `items`, raised while collecting.
    fn item_fault(&mut self, loc: &Loc, reason: impl Into<String>) {
        self.fault_at_as(pass_id::ITEMS, loc, reason);
    }

    fn wrong_type(&mut self, loc: &Loc, tree: &str) {
        let t = loc.key.item_type;
        self.item_fault(
            loc,
            format!(
                "item type {} ({t}) does not belong in {tree}",
                item_type_name(t)
            ),
        );
    }

    fn collect_root_item(&mut self, loc: &Loc, item: &LeafItem) {
        if item.key.item_type != item_type::ROOT_ITEM {
            return self.wrong_type(loc, "the root tree");
        }
        if item.key.offset != 0 {
            return self.item_fault(loc, "root item key offset must be 0");
        }
        match RootItem::decode(&item.data) {
            Ok(r) => {
                if r.level > MAX_LEVEL {
                    self.item_fault(
                        loc,
                        format!("root item level {} exceeds {MAX_LEVEL}", r.level),
                    );
                } else {
                    self.roots.insert(item.key.objectid, (r, *loc));
                }
            }
            Err(e) => self.item_fault(loc, e.to_string()),
        }
    }

    fn collect_log_root_item(&mut self, loc: &Loc, item: &LeafItem) {
        if item.key.item_type != item_type::ROOT_ITEM || item.key.objectid != tree_id::LOG {
            return self.item_fault(
                loc,
                format!(
                    "the log root tree holds only ({} ROOT_ITEM subvolume) items",
                    tree_id::LOG
                ),
            );
        }
        match RootItem::decode(&item.data) {
            Ok(r) if r.level > MAX_LEVEL => self.item_fault(
                loc,
                format!("root item level {} exceeds {MAX_LEVEL}", r.level),
            ),
            Ok(r) => {
                self.log_roots.insert(item.key.offset, (r, *loc));
            }
            Err(e) => self.item_fault(loc, e.to_string()),
        }
    }

    fn collect_extent_item(&mut self, loc: &Loc, item: &LeafItem) {
        let key = item.key;
        let (len, kind) = match key.item_type {
            item_type::EXTENT_ITEM => (key.offset, ExtentKind::Data),
            item_type::METADATA_ITEM => {
                if key.offset > u64::from(MAX_LEVEL) {
                    self.item_fault(
                        loc,
                        format!("metadata item level {} exceeds {MAX_LEVEL}", key.offset),
                    );
                }
                (NODE_SIZE as u64, ExtentKind::Metadata { level: key.offset })
            }
            _ => return self.wrong_type(loc, "the extent tree"),
        };
        let decoded = match ExtentItem::decode(&item.data) {
            Ok(e) => Some(e),
            Err(e) => {
                self.item_fault(loc, e.to_string());
                None
            }
        };
        match kind {
            ExtentKind::Data => {
                self.report.summary.data_extents += 1;
                self.report.summary.data_extent_bytes =
                    self.report.summary.data_extent_bytes.saturating_add(len);
            }
            ExtentKind::Metadata { .. } | ExtentKind::Mirror => {
                self.report.summary.metadata_extents += 1
            }
        }
        self.extents.push(ExtentRec {
            bytenr: key.objectid,
            len,
            kind,
            item: decoded,
            loc: *loc,
        });
    }

    /// Collects an fs tree item (or, for a log tree, only decodes it).
    fn collect_fs_item(&mut self, loc: &Loc, item: &LeafItem, log: bool) {
        use item_type::*;
        let key = item.key;
        let data = &item.data[..];
        if log && key.objectid == EXTENT_CSUM_OBJECTID {
            return self.collect_csum_item(loc, item, true);
        }
        if key.objectid == ORPHAN_OBJECTID {
            if key.item_type != ORPHAN_ITEM {
                return self.item_fault(
                    loc,
                    format!("objectid {ORPHAN_OBJECTID} holds only ORPHAN_ITEMs"),
                );
            }
            if !log {
                self.fs.orphans.push((key.offset, *loc));
                self.report.summary.orphans += 1;
            }
            return;
        }
        if !log && !self.fs.objectids.contains_key(&key.objectid) {
            self.fs.objectids.insert(key.objectid, *loc);
            if key.objectid < ROOT_DIR_INO {
                self.item_fault(
                    loc,
                    format!(
                        "objectid {} is below the first inode number {ROOT_DIR_INO}",
                        key.objectid
                    ),
                );
            }
        }
        match key.item_type {
            INODE_ITEM => match InodeItem::decode(data) {
                Ok(inode) => {
                    if key.offset != 0 {
                        self.item_fault(loc, "inode item key offset must be 0");
                    } else if !log {
                        self.fs.inodes.insert(
                            key.objectid,
                            InodeRec {
                                item: inode,
                                loc: *loc,
                            },
                        );
                    }
                }
                Err(e) => self.item_fault(loc, e.to_string()),
            },
            INODE_REF => match decode_inode_refs(data) {
                Ok(entries) if !log => {
                    for e in entries {
                        self.fs.refs.push(RefRec {
                            ino: key.objectid,
                            parent: key.offset,
                            index: e.index,
                            name: e.name,
                            loc: *loc,
                        });
                    }
                }
                Ok(_) => {}
                Err(e) => self.item_fault(loc, e.to_string()),
            },
            INODE_EXTREF => match decode_inode_extrefs(data) {
                Ok(entries) => {
                    for e in entries {
                        let hash = extref_hash(e.parent, &e.name);
                        if hash != key.offset {
                            self.fault_at_as(
                                pass_id::NAMESPACE,
                                loc,
                                format!(
                                    "INODE_EXTREF name {:?} in {} hashes to {hash:#x}, not the key's {:#x}",
                                    String::from_utf8_lossy(&e.name),
                                    e.parent,
                                    key.offset
                                ),
                            );
                        } else if !log {
                            self.fs.refs.push(RefRec {
                                ino: key.objectid,
                                parent: e.parent,
                                index: e.index,
                                name: e.name,
                                loc: *loc,
                            });
                        }
                    }
                }
                Err(e) => self.item_fault(loc, e.to_string()),
            },
            DIR_ITEM => match decode_dir_items(data) {
                Ok(entries) => {
                    let mut seen = HashSet::new();
                    for e in entries {
                        let hash = name_hash(&e.name);
                        if hash != key.offset {
                            self.fault_at_as(
                                pass_id::NAMESPACE,
                                loc,
                                format!(
                                    "dir item name \"{}\" hashes to {hash}, not the key offset",
                                    name(&e.name)
                                ),
                            );
                        }
                        if !seen.insert(e.name.clone()) {
                            self.fault_at_as(
                                pass_id::NAMESPACE,
                                loc,
                                format!("dir item holds the name \"{}\" twice", name(&e.name)),
                            );
                            continue;
                        }
                        if log {
                            continue;
                        }
                        let dkey = (key.objectid, e.name.clone());
                        if self.fs.dir_items.contains_key(&dkey) {
                            self.fault_at_as(
                                pass_id::NAMESPACE,
                                loc,
                                format!("name \"{}\" has more than one dir item", name(&e.name)),
                            );
                            continue;
                        }
                        self.fs.dir_items.insert(
                            dkey,
                            EntryRec {
                                ino: e.ino,
                                file_type: e.file_type,
                                name: e.name,
                                loc: *loc,
                            },
                        );
                    }
                }
                Err(e) => self.item_fault(loc, e.to_string()),
            },
            DIR_INDEX => match DirEntry::decode(data) {
                Ok(e) => {
                    if key.offset < FIRST_DIR_INDEX {
                        self.fault_at_as(
                            pass_id::NAMESPACE,
                            loc,
                            format!(
                                "dir index {} is below the first index {FIRST_DIR_INDEX}",
                                key.offset
                            ),
                        );
                    }
                    if !log {
                        self.fs.dir_index.insert(
                            (key.objectid, key.offset),
                            EntryRec {
                                ino: e.ino,
                                file_type: e.file_type,
                                name: e.name,
                                loc: *loc,
                            },
                        );
                    }
                }
                Err(e) => self.item_fault(loc, e.to_string()),
            },
            XATTR_ITEM => match decode_xattrs(data) {
                Ok(xattrs) => {
                    let mut seen = HashSet::new();
                    for x in xattrs {
                        let hash = name_hash(&x.name);
                        if hash != key.offset {
                            self.fault_at_as(
                                pass_id::NAMESPACE,
                                loc,
                                format!(
                                    "xattr name \"{}\" hashes to {hash}, not the key offset",
                                    name(&x.name)
                                ),
                            );
                        }
                        if !seen.insert(x.name.clone()) {
                            self.fault_at_as(
                                pass_id::NAMESPACE,
                                loc,
                                format!("xattr item holds the name \"{}\" twice", name(&x.name)),
                            );
                        }
                        if !log {
                            self.report.summary.xattrs += 1;
                        }
                    }
                }
                Err(e) => self.item_fault(loc, e.to_string()),
            },
            EXTENT_DATA => match FileExtent::decode(data) {
                Ok(e) if !log => {
                    let kind = match &e {
                        FileExtent::Inline { data } => FileExtentKind::Inline {
                            len: data.len() as u64,
                        },
                        FileExtent::Regular { .. } => FileExtentKind::Regular(
                            e.disk_ref().expect("regular extent has a disk ref"),
                        ),
                        FileExtent::Prealloc { .. } => FileExtentKind::Prealloc(
                            e.disk_ref().expect("prealloc extent has a disk ref"),
                        ),
                    };
                    self.report.summary.file_extent_items += 1;
                    self.fs.file_extents.push(FileExtentRec {
                        ino: key.objectid,
                        file_offset: key.offset,
                        kind,
                        loc: *loc,
                    });
                }
                Ok(_) => {}
                Err(e) => self.item_fault(loc, e.to_string()),
            },
            DIR_LOG_INDEX | LOG_FULL_EXTENTS | LOG_UNLINKED if log => {}
            ORPHAN_ITEM => self.item_fault(
                loc,
                format!("orphan items live under objectid {ORPHAN_OBJECTID}"),
            ),
            _ => self.wrong_type(loc, if log { "a log tree" } else { "the fs tree" }),
        }
    }
}

/// Pass `items`: rules on single items that need the superblock.
pub(super) fn run_items(c: &mut Checker<'_>) -> PassStatus {
    let Some(sb) = c.sb.clone() else {
        return PassStatus::Skipped("no valid superblock".into());
    };
    let g = sb.generation;
    let bad: Vec<(Loc, String)> =
        c.fs.inodes
            .values()
            .filter_map(|r| {
                if r.item.generation > g || r.item.transid > g {
                    Some((
                        r.loc,
                        format!(
                        "inode generation {} / transid {} newer than the superblock generation {g}",
                        r.item.generation, r.item.transid
                    ),
                    ))
                } else {
                    None
                }
            })
            .chain(c.extents.iter().filter_map(|e| match e.item {
                Some(item) if item.generation > g => Some((
                    e.loc,
                    format!(
                        "extent item generation {} newer than the superblock generation {g}",
                        item.generation
                    ),
                )),
                _ => None,
            }))
            .collect();
    for (loc, reason) in bad {
        c.fault_at(&loc, reason);
    }
    PassStatus::Ran
}
