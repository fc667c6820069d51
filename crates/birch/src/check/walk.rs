//! Pass `tree-structure`: walks every tree once, validating each node and
//! its place in the tree, and decodes every leaf item into the records the
//! later passes use (decode failures are faults of pass `items`).
//! Pass `items`: per-item rules on those records.

use super::node_read::read_copy;
use super::{
    Checker, EntryRec, ExtentKind, ExtentRec, FaultId, FileExtentKind, FileExtentRec,
    InlineDecompression, InodeRec, Loc, NodeRec, PassStatus, RefRec, TreeSummary,
};
use crate::btree::{copy_name, NodeExpectation};
use crate::format::node::MAX_LEVEL;
use crate::format::tree_name;
use crate::format::{
    extref_hash, item_type, name_hash, tree_id, verify_decompression, Acl, DirEntry, ExtentItem,
    FileExtent, InodeExtrefEntry, Item, ItemType, Key, LeafItem, LogRootRef, MetadataProfile, Node,
    NodeBody, RootItem, Superblock, TreeKind, Xattr, ACL_ACCESS_XATTR, ACL_DEFAULT_XATTR,
    FIRST_DIR_INDEX, MAX_SUBVOL_INO, NODE_SIZE, ORPHAN_OBJECTID, ROOT_DIR_INO,
};
use crate::fs::inode_flags;
use crate::fs::log_choice::choose_log;
use crate::print::name;
use std::collections::HashSet;

struct Target {
    tree: u64,
    bytenr: u64,
    level: u8,
    /// What the pointer to the root promises (None: not checked).
    generation: Option<u64>,
    /// What its leaves may hold (None: a tree this version does not know,
    /// checked for structure only).
    kind: Option<TreeKind>,
    /// For a log tree: the subvolume it logs.
    subvolume: Option<u64>,
    /// For a dead subvolume being dropped: its `drop_progress`. A pointer
    /// whose subtree's upper bound is at or below it was released by the
    /// cleaner (docs/SNAPSHOTS.md (d)), and is not followed or counted.
    dropped_to: Option<Key>,
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

impl Frame {
    /// The pointer that led here, as fault reasons name it.
    fn pointer(&self) -> String {
        match self.parent {
            Some((block, slot)) => format!("pointer in block {block} slot {slot}"),
            None => "tree root".to_string(),
        }
    }
}

/// Pass `tree-structure`: the root tree, the trees its root items name,
/// the log trees; then node overlaps across all of them.
pub(super) fn run(c: &mut Checker<'_>) -> PassStatus {
    let Some(sb) = c.sb.clone() else {
        return PassStatus::Skipped("no valid superblock".into());
    };
    c.walk(Target {
        tree: tree_id::ROOT,
        bytenr: sb.root_tree_bytenr,
        level: sb.root_tree_level,
        generation: Some(sb.generation),
        kind: Some(TreeKind::Root),
        subvolume: None,
        dropped_to: None,
    });

    walk_named_trees(c, &sb);
    if let Some(log) = chosen_log(c, &sb) {
        walk_log_trees(c, &sb.with_log(Some(log)));
    }
    check_node_overlaps(c);
    PassStatus::Ran
}

/// The extent and fs trees have root items; every tree a root item names
/// is walked (an unknown one for structure only).
fn walk_named_trees(c: &mut Checker<'_>, sb: &Superblock) {
    if c.tree_readable(tree_id::ROOT) {
        for id in [tree_id::EXTENT, tree_id::FS] {
            if !c.roots.contains_key(&id) {
                c.fault_key(
                    FaultId::RootItemMissing,
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
            tree_id::EXTENT => Some(TreeKind::Extent),
            id if tree_id::is_subvolume(id) => Some(TreeKind::Fs),
            tree_id::CSUM => Some(TreeKind::Csum),
            tree_id::ROOT | tree_id::LOG | tree_id::LOG_ROOT => {
                c.fault_at(
                    FaultId::RootItemForbidden,
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
                    FaultId::UnknownTree,
                    &loc,
                    format!("tree {id} is not known to this version: checked for structure only"),
                );
                None
            }
        };
        if item.generation > sb.generation {
            c.fault_at(
                FaultId::RootItemGenerationNewer,
                &loc,
                format!(
                    "root item generation {} is newer than the superblock generation {}",
                    item.generation, sb.generation
                ),
            );
        }
        let dropped_to = match c.subvols.root_items.get(&id) {
            Some((Some(r), _)) if r.refs == 0 && r.drop_progress != Key::MIN => {
                Some(r.drop_progress)
            }
            _ => None,
        };
        c.walk(Target {
            tree: id,
            bytenr: item.bytenr,
            level: item.level,
            generation: Some(item.generation),
            kind,
            subvolume: None,
            dropped_to,
        });
    }
}

/// The log a mount would replay (docs/LOG-FLUSH.md): the newest, or when
/// its one-flush sync did not reach the disk whole (a warning) the one
/// before it. When neither validates, a fault, and the newest is checked
/// to show what is wrong with it.
fn chosen_log(c: &mut Checker<'_>, sb: &Superblock) -> Option<LogRootRef> {
    match choose_log(c.dev, sb) {
        Ok(choice) => {
            if let Some(why) = choice.newest_rejected {
                let what = match choice.log {
                    Some(log) => format!(
                        "checking the log before it (log generation {})",
                        log.log_generation
                    ),
                    None => "the last commit had no log".to_string(),
                };
                let id = FaultId::LogIncomplete;
                c.warn_tree(id, Some(tree_id::LOG_ROOT), format!("{why}; {what}"));
            }
            c.log_manifest = choice.manifest_checksums;
            choice.log
        }
        Err(e) => {
            c.fault_tree(FaultId::LogUnusable, Some(tree_id::LOG_ROOT), e.to_string());
            sb.log_root()
        }
    }
}

/// The log root tree and each log tree it names.
fn walk_log_trees(c: &mut Checker<'_>, sb: &Superblock) {
    // The log root's generation is the log transaction's business (the
    // tree-log defines it); owner and level are checked.
    c.walk(Target {
        tree: tree_id::LOG_ROOT,
        bytenr: sb.log_root_bytenr,
        level: sb.log_root_level,
        generation: None,
        kind: Some(TreeKind::LogRoot),
        subvolume: None,
        dropped_to: None,
    });
    let logs: Vec<(u64, RootItem, Loc)> = c
        .log_roots
        .iter()
        .map(|(&sub, (item, loc))| (sub, *item, *loc))
        .collect();
    for (sub, item, loc) in logs {
        // S10: a log of a live subvolume (only 5 without the flag).
        if !(sub == tree_id::FS || sb.subvolumes && c.subvols.is_live(sub)) {
            c.fault_at(
                FaultId::LogOfUnknownSubvolume,
                &loc,
                format!("log of unknown subvolume {sub}"),
            );
            continue;
        }
        c.walk(Target {
            tree: tree_id::LOG,
            bytenr: item.bytenr,
            level: item.level,
            generation: Some(item.generation),
            kind: Some(TreeKind::Log),
            subvolume: Some(sub),
            dropped_to: None,
        });
    }
}

fn node_last_key(node: &Node) -> Option<Key> {
    match &node.body {
        NodeBody::Leaf(items) => items.last().map(|i| i.key),
        NodeBody::Internal(ptrs) => ptrs.last().map(|p| p.key),
    }
}

/// Nodes are NODE_SIZE long but only sector aligned: two distinct blocks
/// may still overlap.
fn check_node_overlaps(c: &mut Checker<'_>) {
    let mut starts: Vec<(u64, u64)> = c.nodes.iter().map(|(&b, n)| (b, n.tree)).collect();
    starts.sort_unstable();
    for w in starts.windows(2) {
        if w[1].0 < w[0].0.saturating_add(NODE_SIZE as u64) {
            c.fault_block(
                FaultId::NodeOverlap,
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
}

impl Checker<'_> {
    /// Walks one tree depth first from its root: each node reached once
    /// ([`Self::reach_node`]), checked in its place ([`Self::check_node_place`]),
    /// its leaf items collected ([`Self::collect_item`]).
    fn walk(&mut self, t: Target) {
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
            let Some(node) = self.reach_node(&t, &f) else {
                continue;
            };
            root_read |= f.parent.is_none();
            summary.nodes += 1;
            self.check_node_place(&t, &f, &node);
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
                        if let Some(kind) = t.kind {
                            self.collect_item(kind, &loc, item);
                        }
                    }
                }
                NodeBody::Internal(ptrs) => {
                    // Decode guarantees level >= 1 here; levels strictly
                    // decrease, so the walk is at most MAX_LEVEL deep.
                    let child_level = node.level.saturating_sub(1);
                    for (i, p) in ptrs.iter().enumerate().rev() {
                        let high = ptrs.get(i + 1).map(|n| n.key).or(f.high);
                        if let (Some(high), Some(done)) = (high, t.dropped_to) {
                            if high <= done {
                                continue;
                            }
                        }
                        stack.push(Frame {
                            bytenr: p.blockptr,
                            level: child_level,
                            generation: Some(p.generation),
                            low: Some(p.key),
                            high,
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
        if Self::is_log_tree(t.tree) {
            self.report.summary.log_nodes += summary.nodes;
        }
        self.report.summary.trees.push(summary);
    }

    /// The node `f` points at, when the walk has not reached its block
    /// before and a copy of it is what the pointer promises (each failure
    /// a fault); the node is recorded as reached.
    fn reach_node(&mut self, t: &Target, f: &Frame) -> Option<Node> {
        if let Some(prev) = self.nodes.get(&f.bytenr).copied() {
            let subvolumes = tree_id::is_subvolume(prev.tree) && tree_id::is_subvolume(t.tree);
            if subvolumes && prev.tree != t.tree {
                self.reach_shared(t, f, &prev);
                return None;
            }
            let (id, reason) = if prev.tree != t.tree {
                let reason = format!(
                    "block belongs to tree {} but is reached from tree {} ({})",
                    tree_name(prev.tree),
                    tree_name(t.tree),
                    f.pointer()
                );
                (FaultId::NodeCrossTree, reason)
            } else {
                let reason = format!(
                    "block reached twice ({}): a cycle or a shared child",
                    f.pointer()
                );
                (FaultId::NodeReachedTwice, reason)
            };
            self.fault_block(id, Some(t.tree), f.bytenr, None, reason);
            return None;
        }
        let expect = f.generation.map(|generation| NodeExpectation {
            tree: t.tree,
            level: f.level,
            generation,
        });
        let node = self.read_node(t.tree, f, expect)?;
        if expect.is_none() && (node.owner != t.tree || node.level != f.level) {
            let id = if node.owner != t.tree {
                FaultId::NodeOwner
            } else {
                FaultId::NodeLevel
            };
            let reason = format!(
                "owner {} level {} but expected {} level {} ({})",
                tree_name(node.owner),
                node.level,
                tree_name(t.tree),
                f.level,
                f.pointer()
            );
            self.fault_block(id, Some(t.tree), f.bytenr, None, reason);
            return None;
        }
        let rec = NodeRec {
            tree: t.tree,
            owner: node.owner,
            level: node.level,
            generation: node.generation,
            first_key: node.first_key(),
            last_key: node_last_key(&node),
            is_root: f.parent.is_none(),
        };
        self.nodes.insert(f.bytenr, rec);
        self.node_refs.insert(f.bytenr, 1);
        Some(node)
    }

    /// A node of subvolume `prev.tree` reached again from subvolume
    /// `t.tree`: shared (docs/SNAPSHOTS.md (b)). It is not read again;
    /// the pointer must agree with what the first walk recorded, and
    /// counts as one more parent (S1). Never a root (S4).
    fn reach_shared(&mut self, t: &Target, f: &Frame, prev: &NodeRec) {
        let fault = |c: &mut Self, id: FaultId, reason: String| {
            c.fault_block(id, Some(t.tree), f.bytenr, None, reason);
        };
        if f.parent.is_none() || prev.is_root {
            let reason = format!(
                "the root node of tree {} is also a node of tree {} ({}): root nodes are never shared",
                tree_name(if prev.is_root { prev.tree } else { t.tree }),
                tree_name(if prev.is_root { t.tree } else { prev.tree }),
                f.pointer()
            );
            return fault(self, FaultId::RootNodeShared, reason);
        }
        if !self.shared_reached.insert((f.bytenr, t.tree)) {
            let reason = format!(
                "block reached twice ({}): a cycle or a shared child",
                f.pointer()
            );
            return fault(self, FaultId::NodeReachedTwice, reason);
        }
        let shared = format!("shared node of {} ({})", tree_name(prev.tree), f.pointer());
        if f.level != prev.level {
            let reason = format!(
                "{shared}: level {} but parent expects {}",
                prev.level, f.level
            );
            return fault(self, FaultId::NodeLevel, reason);
        }
        if let Some(generation) = f.generation.filter(|&g| g != prev.generation) {
            let reason = format!(
                "{shared}: generation {} but parent expects {generation}",
                prev.generation
            );
            return fault(self, FaultId::NodeGeneration, reason);
        }
        if let (Some(low), Some(first)) = (f.low, prev.first_key) {
            if first != low {
                let reason =
                    format!("{shared}: first key {first} differs from the parent's key {low}");
                return fault(self, FaultId::NodeFirstKey, reason);
            }
        }
        if let (Some(high), Some(last)) = (f.high, prev.last_key) {
            if last >= high {
                let reason =
                    format!("{shared}: key {last} is not below the parent's next key {high}");
                return fault(self, FaultId::NodeLastKey, reason);
            }
        }
        *self.node_refs.entry(f.bytenr).or_default() += 1;
        if let Some(kind) = t.kind {
            self.record_shared_subtree(t, f, kind);
        }
    }

    /// Records the items of shared subtree `f`, first walked as part of
    /// another subvolume, for subvolume `t.tree` too: each subvolume's
    /// namespace, link counts and file extents are checked on its own
    /// (S7). The first walk checked these nodes and counted them, so the
    /// faults and counts of this second reading are dropped
    /// (`recording_shared_copy`), and its file extents are marked so that
    /// the data-extent count takes each leaf once (S2).
    fn record_shared_subtree(&mut self, t: &Target, f: &Frame, kind: TreeKind) {
        let was = std::mem::replace(&mut self.recording_shared_copy, true);
        let mut stack = vec![(f.bytenr, f.level, f.generation)];
        while let Some((bytenr, level, generation)) = stack.pop() {
            let Some(prev) = self.nodes.get(&bytenr).copied() else {
                // Not read by the first walk (a fault it reported).
                continue;
            };
            let expect = generation.map(|generation| NodeExpectation {
                tree: prev.tree,
                level,
                generation,
            });
            let frame = Frame {
                bytenr,
                level,
                generation,
                low: None,
                high: None,
                parent: None,
            };
            let Some(node) = self.read_node(prev.tree, &frame, expect) else {
                continue;
            };
            match &node.body {
                NodeBody::Leaf(items) => {
                    for (slot, item) in items.iter().enumerate() {
                        let loc = Loc {
                            tree: t.tree,
                            block: bytenr,
                            slot: slot as u32,
                            key: item.key,
                        };
                        self.collect_item(kind, &loc, item);
                    }
                }
                NodeBody::Internal(ptrs) => {
                    let child_level = node.level.saturating_sub(1);
                    for p in ptrs.iter().rev() {
                        stack.push((p.blockptr, child_level, Some(p.generation)));
                    }
                }
            }
        }
        self.recording_shared_copy = was;
    }

    /// Reads the node `f` points at. Under DUP every copy is verified and
    /// each bad one is a fault of its own; the walk goes on with a good
    /// copy.
    fn read_node(&mut self, tree: u64, f: &Frame, expect: Option<NodeExpectation>) -> Option<Node> {
        let profile = self
            .sb
            .as_ref()
            .map_or(MetadataProfile::Single, |sb| sb.metadata_profile);
        let fsid = self.report.summary.fsid;
        let copies = std::iter::once(f.bytenr).chain(profile.mirror_of(f.bytenr));
        let listed = self.log_manifest.get(&f.bytenr).copied();
        let mut good = None;
        let mut bad_copies = Vec::new();
        for (index, offset) in copies.enumerate() {
            match read_copy(self.dev, &fsid, f.bytenr, offset, expect, listed) {
                Ok(node) => good = good.or(Some(node)),
                Err(bad) => {
                    let which = match profile.mirror_offset() {
                        Some(_) => format!("{} at {offset}: ", copy_name(index)),
                        None => String::new(),
                    };
                    let reason = format!("{which}{} ({})", bad.reason, f.pointer());
                    bad_copies.push((bad, reason));
                }
            }
        }
        for (bad, reason) in bad_copies {
            // A copy the last (one-flush) log sync wrote but that did not
            // reach the disk, beside a good one: a crash state, which the
            // mount's read repair rewrites, not damage.
            if listed.is_some() && good.is_some() {
                let id = FaultId::LogNodeCopyIncomplete;
                self.warn_block(id, Some(tree), f.bytenr, reason);
            } else {
                self.fault_block(bad.id, Some(tree), f.bytenr, bad.slot, reason);
            }
        }
        good
    }

    /// The rules on a node's place in its tree: not newer than the
    /// superblock (log trees aside: a log sync writes newer ones), not
    /// empty below the root, its keys within its parent's range for it.
    fn check_node_place(&mut self, t: &Target, f: &Frame, node: &Node) {
        let sb_generation = self.sb.as_ref().map_or(0, |sb| sb.generation);
        if !Self::is_log_tree(t.tree) && node.generation > sb_generation {
            let reason = format!(
                "node generation {} is newer than the superblock generation {sb_generation}",
                node.generation
            );
            self.fault_block(
                FaultId::NodeGenerationNewer,
                Some(t.tree),
                f.bytenr,
                None,
                reason,
            );
        }
        let n = node.nritems();
        if n == 0 && f.parent.is_some() {
            let reason = format!("empty non-root node ({})", f.pointer());
            self.fault_block(FaultId::NodeEmpty, Some(t.tree), f.bytenr, None, reason);
        }
        if let (Some(low), Some(first)) = (f.low, node.first_key()) {
            if first != low {
                let reason = format!(
                    "first key {first} differs from the parent's key {low} ({})",
                    f.pointer()
                );
                self.fault_block(
                    FaultId::NodeFirstKey,
                    Some(t.tree),
                    f.bytenr,
                    Some(0),
                    reason,
                );
            }
        }
        if let (Some(high), Some(last)) = (f.high, node_last_key(node)) {
            if last >= high {
                let reason = format!(
                    "key {last} is not below the parent's next key {high} ({})",
                    f.pointer()
                );
                let slot = Some(n - 1);
                self.fault_block(FaultId::NodeLastKey, Some(t.tree), f.bytenr, slot, reason);
            }
        }
    }

    /// Collects one leaf item of a tree of `kind`: its type must be known
    /// and at home there, its key must follow the type's rules, and its
    /// payload must decode; then [`Self::record_item`] keeps what the
    /// later passes need.
    fn collect_item(&mut self, kind: TreeKind, loc: &Loc, leaf: &LeafItem) {
        let key = leaf.key;
        let item_type = ItemType::of(&key);
        if matches!(kind, TreeKind::Fs | TreeKind::Log)
            && item_type != Ok(ItemType::ExtentCsum)
            && !self.collect_objectid(loc, item_type == Ok(ItemType::OrphanItem), kind)
        {
            return;
        }
        let item_type = match item_type {
            Ok(t) if t.may_live_in(kind) => t,
            Ok(t) => {
                let code = t.code();
                return self.fault_at(
                    FaultId::ItemWrongTree,
                    loc,
                    format!(
                        "item type {} ({code}) does not belong in {}",
                        t.name(),
                        tree_kind_name(kind)
                    ),
                );
            }
            Err(unknown) => {
                return self.fault_at(
                    FaultId::ItemTypeUnknown,
                    loc,
                    format!("{unknown} in {}", tree_kind_name(kind)),
                )
            }
        };
        if !self.check_key(kind, item_type, loc) {
            return;
        }
        match Item::decode(item_type, &leaf.data) {
            Ok(item) => self.record_item(kind, loc, item),
            Err(e) => {
                self.fault_at(FaultId::ItemUndecodable, loc, e.to_string());
                // The key alone says what space an extent item covers: a
                // damaged payload still counts for extent-refs.
                if let Some(len) = item_type.extent_len(&key) {
                    self.record_extent(loc, item_type, len, None);
                }
            }
        }
    }

    /// The objectid rules of fs and log tree items (`ORPHAN_OBJECTID` holds
    /// only orphan items; other objectids are inode numbers); notes the
    /// first item of each objectid. False when the item is not to be
    /// looked at further.
    fn collect_objectid(&mut self, loc: &Loc, is_orphan_item: bool, kind: TreeKind) -> bool {
        let objectid = loc.key.objectid;
        if objectid == ORPHAN_OBJECTID {
            if !is_orphan_item {
                self.fault_at(
                    FaultId::OrphanObjectidMisuse,
                    loc,
                    format!("objectid {ORPHAN_OBJECTID} holds only ORPHAN_ITEMs"),
                );
                return false;
            }
            return true;
        }
        if kind == TreeKind::Fs {
            let objectids = &mut self.fs_records(loc.tree).objectids;
            if objectids.contains_key(&objectid) {
                return true;
            }
            objectids.insert(objectid, *loc);
            if objectid < ROOT_DIR_INO {
                self.fault_at(
                    FaultId::ObjectidReserved,
                    loc,
                    format!("objectid {objectid} is below the first inode number {ROOT_DIR_INO}"),
                );
            } else if objectid >= MAX_SUBVOL_INO {
                // Inode numbers above it cannot be told apart from another
                // subvolume's once the id takes the high bits (S7).
                self.fault_at(
                    FaultId::InoOutOfRange,
                    loc,
                    format!("objectid {objectid} is not below the inode number limit {MAX_SUBVOL_INO} (2^40)"),
                );
            }
        }
        true
    }

    /// The rules on the key of an item of `item_type` that do not need
    /// its payload. False when the item is not to be decoded.
    fn check_key(&mut self, kind: TreeKind, item_type: ItemType, loc: &Loc) -> bool {
        let key = loc.key;
        match item_type {
            ItemType::RootItem if kind == TreeKind::LogRoot && key.objectid != tree_id::LOG => {
                self.fault_at(
                    FaultId::LogRootItemKey,
                    loc,
                    format!(
                        "the log root tree holds only ({} ROOT_ITEM subvolume) items",
                        tree_id::LOG
                    ),
                );
                false
            }
            ItemType::RootItem if kind == TreeKind::Root && key.offset != 0 => {
                self.fault_at(
                    FaultId::ItemKeyOffset,
                    loc,
                    "root item key offset must be 0",
                );
                false
            }
            ItemType::OrphanItem if key.objectid != ORPHAN_OBJECTID => {
                self.fault_at(
                    FaultId::OrphanItemMisplaced,
                    loc,
                    format!("orphan items live under objectid {ORPHAN_OBJECTID}"),
                );
                false
            }
            ItemType::ExtentCsum => self.check_csum_key(loc),
            ItemType::MetadataItem => {
                if key.offset > u64::from(MAX_LEVEL) {
                    self.fault_at(
                        FaultId::ItemLevelTooHigh,
                        loc,
                        format!("metadata item level {} exceeds {MAX_LEVEL}", key.offset),
                    );
                }
                true
            }
            ItemType::InodeItem
            | ItemType::InodeRef
            | ItemType::InodeExtref
            | ItemType::XattrItem
            | ItemType::OrphanItem
            | ItemType::DirLogIndex
            | ItemType::LogFullExtents
            | ItemType::LogUnlinked
            | ItemType::DirItem
            | ItemType::DirIndex
            | ItemType::ExtentData
            | ItemType::RootItem
            | ItemType::RootBackref
            | ItemType::RootRef
            | ItemType::ExtentItem => true,
        }
    }

    /// Keeps what the later passes need of a decoded item, and checks the
    /// rules that need its payload. A log tree's items are only checked:
    /// the semantic passes look at the committed subvolume trees, each
    /// kept apart ([`Checker::fs_records`]).
    /// Long because it is the one match over every item kind, each arm
    /// short.
    fn record_item(&mut self, kind: TreeKind, loc: &Loc, item: Item) {
        let key = loc.key;
        let fs = kind == TreeKind::Fs;
        match item {
            Item::Inode(inode) => {
                if key.offset != 0 {
                    self.fault_at(
                        FaultId::ItemKeyOffset,
                        loc,
                        "inode item key offset must be 0",
                    );
                } else if fs {
                    let rec = InodeRec {
                        item: inode,
                        loc: *loc,
                    };
                    self.fs_records(loc.tree).inodes.insert(key.objectid, rec);
                }
            }
            Item::InodeRefs(entries) => {
                if fs {
                    self.fs_records(loc.tree)
                        .refs
                        .extend(entries.into_iter().map(|e| RefRec {
                            ino: key.objectid,
                            parent: key.offset,
                            index: e.index,
                            name: e.name,
                            loc: *loc,
                        }));
                }
            }
            Item::InodeExtrefs(entries) => self.record_extrefs(loc, entries, fs),
            Item::DirItems(entries) if kind == TreeKind::Root => {
                self.record_default_subvol(loc, entries)
            }
            Item::DirItems(entries) => self.record_dir_items(loc, entries, fs),
            Item::DirIndex(e) if e.subvolume => {
                self.check_dir_index_key(loc);
                self.record_link(loc, Some(key.offset), e);
            }
            Item::DirIndex(e) => {
                self.check_dir_index_key(loc);
                if fs {
                    let rec = EntryRec {
                        ino: e.ino,
                        file_type: e.file_type,
                        name: e.name,
                        loc: *loc,
                    };
                    self.fs_records(loc.tree)
                        .dir_index
                        .insert((key.objectid, key.offset), rec);
                }
            }
            Item::Xattrs(xattrs) => self.record_xattrs(loc, xattrs, fs),
            Item::FileExtent(e) => {
                if kind == TreeKind::Fs {
                    self.record_file_extent(loc, &e);
                }
            }
            Item::Orphan if kind == TreeKind::Root => {
                self.subvols.orphan_roots.insert(key.offset, *loc);
            }
            Item::Orphan => {
                if fs {
                    self.fs_records(loc.tree).orphans.push((key.offset, *loc));
                    self.report.summary.orphans += 1;
                }
            }
            Item::DirLogIndex | Item::LogFullExtents | Item::LogUnlinked => {}
            Item::Csums(sums) => self.record_csums(kind, loc, sums),
            Item::Root(r) => {
                if r.level > MAX_LEVEL {
                    self.fault_at(
                        FaultId::ItemLevelTooHigh,
                        loc,
                        format!("root item level {} exceeds {MAX_LEVEL}", r.level),
                    );
                } else if kind == TreeKind::LogRoot {
                    self.log_roots.insert(key.offset, (r, *loc));
                } else {
                    self.roots.insert(key.objectid, (r, *loc));
                    self.subvols.root_items.insert(key.objectid, (None, *loc));
                }
            }
            Item::SubvolRoot(r) => {
                if r.root.level > MAX_LEVEL {
                    self.fault_at(
                        FaultId::ItemLevelTooHigh,
                        loc,
                        format!("root item level {} exceeds {MAX_LEVEL}", r.root.level),
                    );
                } else if kind == TreeKind::LogRoot {
                    self.fault_at(
                        FaultId::RootItemFields,
                        loc,
                        "the log root tree holds short root items only",
                    );
                } else {
                    self.roots.insert(key.objectid, (r.root, *loc));
                    self.subvols
                        .root_items
                        .insert(key.objectid, (Some(r), *loc));
                }
            }
            Item::RootRef(r) => {
                let pair = (key.objectid, key.offset);
                self.subvols.refs.insert(pair, (r, *loc));
            }
            Item::RootBackref(r) => {
                let pair = (key.objectid, key.offset);
                self.subvols.backrefs.insert(pair, (r, *loc));
            }
            Item::DataExtent(e) => {
                self.record_extent(loc, ItemType::ExtentItem, key.offset, Some(e))
            }
            Item::MetadataExtent(e) => {
                self.record_extent(loc, ItemType::MetadataItem, NODE_SIZE as u64, Some(e))
            }
        }
    }

    fn record_file_extent(&mut self, loc: &Loc, e: &FileExtent) {
        let kind = match e {
            FileExtent::Inline { data } => FileExtentKind::Inline {
                len: data.len() as u64,
                compression: None,
            },
            FileExtent::InlineCompressed {
                compressed,
                ram_bytes,
                compression,
            } => {
                // Its data is in the item, here now: pass `data` reports
                // what decompressing it gave (docs/CHECK.md).
                if self.options.verify_data && !self.recording_shared_copy {
                    let outcome = verify_decompression(*compression, compressed, *ram_bytes);
                    self.inline_decompressions.push(InlineDecompression {
                        loc: *loc,
                        compression: *compression,
                        stored: compressed.len() as u64,
                        ram_bytes: *ram_bytes,
                        outcome,
                    });
                }
                FileExtentKind::Inline {
                    len: *ram_bytes,
                    compression: Some(*compression),
                }
            }
            FileExtent::Regular { .. } => {
                FileExtentKind::Regular(e.disk_ref().expect("regular extent has a disk ref"))
            }
            FileExtent::Prealloc { .. } => {
                FileExtentKind::Prealloc(e.disk_ref().expect("prealloc extent has a disk ref"))
            }
            FileExtent::Compressed { .. } => FileExtentKind::Compressed(
                e.disk_ref().expect("compressed extent has a disk ref"),
                e.compressed_ref()
                    .expect("compressed extent has its compression"),
            ),
        };
        if !self.recording_shared_copy {
            self.report.summary.file_extent_items += 1;
            if matches!(kind, FileExtentKind::Compressed(..)) {
                self.report.summary.compressed_extent_items += 1;
            }
            if matches!(
                kind,
                FileExtentKind::Inline {
                    compression: Some(_),
                    ..
                }
            ) {
                self.report.summary.compressed_inline_items += 1;
            }
        }
        let rec = FileExtentRec {
            ino: loc.key.objectid,
            file_offset: loc.key.offset,
            kind,
            loc: *loc,
            in_shared_copy: self.recording_shared_copy,
        };
        self.fs_records(loc.tree).file_extents.push(rec);
    }

    /// A DIR_INDEX key's index lies where listings can reach it.
    fn check_dir_index_key(&mut self, loc: &Loc) {
        let index = loc.key.offset;
        if index < FIRST_DIR_INDEX || index == u64::MAX {
            self.fault_at(
                FaultId::DirIndexReserved,
                loc,
                format!(
                    "dir index {index} is outside [{FIRST_DIR_INDEX}, 2^64-1) (u64::MAX is reserved: nothing can be listed after it)"
                ),
            );
        }
    }

    fn record_extent(
        &mut self,
        loc: &Loc,
        item_type: ItemType,
        len: u64,
        item: Option<ExtentItem>,
    ) {
        let kind = if item_type == ItemType::MetadataItem {
            self.report.summary.metadata_extents += 1;
            ExtentKind::Metadata {
                level: loc.key.offset,
            }
        } else {
            self.report.summary.data_extents += 1;
            self.report.summary.data_extent_bytes =
                self.report.summary.data_extent_bytes.saturating_add(len);
            ExtentKind::Data
        };
        self.extents.push(ExtentRec {
            bytenr: loc.key.objectid,
            len,
            kind,
            item,
            loc: *loc,
        });
    }

    fn record_extrefs(&mut self, loc: &Loc, entries: Vec<InodeExtrefEntry>, fs: bool) {
        let key = loc.key;
        for e in entries {
            let hash = extref_hash(e.parent, &e.name);
            if hash != key.offset {
                self.fault_at(
                    FaultId::ExtrefHash,
                    loc,
                    format!(
                        "INODE_EXTREF name {:?} in {} hashes to {hash:#x}, not the key's {:#x}",
                        String::from_utf8_lossy(&e.name),
                        e.parent,
                        key.offset
                    ),
                );
            } else if fs {
                self.fs_records(loc.tree).refs.push(RefRec {
                    ino: key.objectid,
                    parent: e.parent,
                    index: e.index,
                    name: e.name,
                    loc: *loc,
                });
            }
        }
    }

    fn record_dir_items(&mut self, loc: &Loc, entries: Vec<DirEntry>, fs: bool) {
        let key = loc.key;
        let mut seen = HashSet::new();
        for e in entries {
            let hash = name_hash(&e.name);
            if hash != key.offset {
                self.fault_at(
                    FaultId::DirItemHash,
                    loc,
                    format!(
                        "dir item name \"{}\" hashes to {hash}, not the key offset",
                        name(&e.name)
                    ),
                );
            }
            if !seen.insert(e.name.clone()) {
                self.fault_at(
                    FaultId::DirItemNameTwice,
                    loc,
                    format!("dir item holds the name \"{}\" twice", name(&e.name)),
                );
                continue;
            }
            if e.subvolume {
                self.record_link(loc, None, e);
                continue;
            }
            if !fs {
                continue;
            }
            let dkey = (key.objectid, e.name.clone());
            if self.fs_records(loc.tree).dir_items.contains_key(&dkey) {
                self.fault_at(
                    FaultId::DirItemTwice,
                    loc,
                    format!("name \"{}\" has more than one dir item", name(&e.name)),
                );
                continue;
            }
            self.fs_records(loc.tree).dir_items.insert(
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

    fn record_xattrs(&mut self, loc: &Loc, xattrs: Vec<Xattr>, fs: bool) {
        let key = loc.key;
        let mut seen = HashSet::new();
        for x in xattrs {
            let hash = name_hash(&x.name);
            if hash != key.offset {
                self.fault_at(
                    FaultId::XattrHash,
                    loc,
                    format!(
                        "xattr name \"{}\" hashes to {hash}, not the key offset",
                        name(&x.name)
                    ),
                );
            }
            if !seen.insert(x.name.clone()) {
                self.fault_at(
                    FaultId::XattrNameTwice,
                    loc,
                    format!("xattr item holds the name \"{}\" twice", name(&x.name)),
                );
            }
            if x.name == ACL_ACCESS_XATTR || x.name == ACL_DEFAULT_XATTR {
                if let Err(why) = Acl::decode(&x.value) {
                    self.fault_at(
                        FaultId::AclMalformed,
                        loc,
                        format!("{}: {why}", name(&x.name)),
                    );
                }
            }
            if fs {
                self.report.summary.xattrs += 1;
            }
        }
    }
}

/// A tree kind as fault reasons name it.
fn tree_kind_name(kind: TreeKind) -> &'static str {
    match kind {
        TreeKind::Root => "the root tree",
        TreeKind::Extent => "the extent tree",
        TreeKind::Fs => "the fs tree",
        TreeKind::LogRoot => "the log root tree",
        TreeKind::Log => "a log tree",
        TreeKind::Csum => "the checksum tree",
    }
}

/// Pass `items`: rules on single items that need the superblock.
pub(super) fn run_items(c: &mut Checker<'_>) -> PassStatus {
    let Some(sb) = c.sb.clone() else {
        return PassStatus::Skipped("no valid superblock".into());
    };
    let g = sb.generation;
    let inodes =
        c.fs.values()
            .flat_map(|fs| fs.inodes.values())
            .filter(|r| r.item.generation > g || r.item.transid > g)
            .map(|r| {
                let reason = format!(
                    "inode generation {} / transid {} newer than the superblock generation {g}",
                    r.item.generation, r.item.transid
                );
                (r.loc, FaultId::InodeGenerationNewer, reason)
            });
    let flags =
        c.fs.values()
            .flat_map(|fs| fs.inodes.values())
            .filter(|r| r.item.flags & !u64::from(inode_flags::SUPPORTED) != 0)
            .map(|r| {
                let reason = format!(
                    "inode flags {:#x} have bits birch never sets ({:#x})",
                    r.item.flags,
                    r.item.flags & !u64::from(inode_flags::SUPPORTED)
                );
                (r.loc, FaultId::InodeFlagsUnknown, reason)
            });
    let extents = c.extents.iter().filter_map(|e| match e.item {
        Some(item) if item.generation > g => {
            let reason = format!(
                "extent item generation {} newer than the superblock generation {g}",
                item.generation
            );
            Some((e.loc, FaultId::ExtentGenerationNewer, reason))
        }
        _ => None,
    });
    let bad: Vec<(Loc, FaultId, String)> = inodes.chain(flags).chain(extents).collect();
    for (loc, id, reason) in bad {
        c.fault_at(id, &loc, reason);
    }
    PassStatus::Ran
}
