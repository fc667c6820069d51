//! Pass `extent-refs`: the extent tree against what references it.

use super::{Checker, ExtentKind, ExtentRec, FaultId, Loc, NodeRec, PassStatus};
use crate::format::tree_name;
use crate::format::{
    item_type, tree_id, Key, Superblock, FIRST_ALLOCATABLE_BYTE, NODE_SIZE, SECTOR_SIZE,
};
use std::collections::HashMap;

/// Pass `extent-refs`: one function per invariant, in this order.
pub(super) fn run(c: &mut Checker<'_>) -> PassStatus {
    let Some(sb) = c.sb.clone() else {
        return PassStatus::Skipped("no valid superblock".into());
    };
    if !c.tree_readable(tree_id::EXTENT) {
        return PassStatus::Skipped("the extent tree could not be read".into());
    }
    let mut extents = std::mem::take(&mut c.extents);
    add_dup_mirrors(c, &sb, &mut extents);
    extents.sort_by_key(|e| (e.bytenr, e.len));
    check_extent_shapes(c, &sb, &extents);
    check_metadata_refs(c, &extents);
    check_shared_generations(c);
    if c.tree_readable(tree_id::FS) {
        check_data_refs(c, &extents);
    }
    check_log_nodes(c, &sb, &extents);
    // The nodes count as bytes only via the extent tree; keep it for later.
    c.extents = extents;
    PassStatus::Ran
}

/// Every node reached, in block order.
fn sorted_nodes(c: &Checker<'_>) -> Vec<(u64, NodeRec)> {
    let mut nodes: Vec<(u64, NodeRec)> = c.nodes.iter().map(|(&b, n)| (b, *n)).collect();
    nodes.sort_unstable_by_key(|&(b, _)| b);
    nodes
}

/// Under DUP a node's mirror is in use as much as the node: it counts for
/// overlaps, bytes_used and free space. No node may lie in the mirror half.
fn add_dup_mirrors(c: &mut Checker<'_>, sb: &Superblock, extents: &mut Vec<ExtentRec>) {
    let profile = sb.metadata_profile;
    if let (Some(mirror_start), Some(offset)) = (profile.primary_end(), profile.mirror_offset()) {
        let mut mirrors = Vec::new();
        for e in extents
            .iter()
            .filter(|e| matches!(e.kind, ExtentKind::Metadata { .. }))
        {
            if e.bytenr.saturating_add(e.len) > mirror_start {
                c.fault_at(FaultId::NodeInMirrorHalf,
                    &e.loc,
                    format!(
                        "node {} lies in the DUP mirror half (from {mirror_start}): its mirror would be past {}",
                        e.bytenr,
                        mirror_start + offset
                    ),
                );
            }
            mirrors.push(ExtentRec {
                bytenr: e.bytenr.saturating_add(offset),
                len: e.len,
                kind: ExtentKind::Mirror,
                item: None,
                loc: e.loc,
            });
        }
        extents.extend(mirrors);
    }
}

/// Each extent is non-empty, aligned, in range and overlaps none; the
/// extents cover bytes_used. Computes the space summary.
fn check_extent_shapes(c: &mut Checker<'_>, sb: &Superblock, extents: &[ExtentRec]) {
    let total = sb.total_bytes;
    let mut used: u64 = 0;
    let mut covered: u64 = 0;
    let mut cover_end = FIRST_ALLOCATABLE_BYTE;
    let mut prev: Option<(u64, u64)> = None; // (end, bytenr) of the furthest-reaching extent so far
    for e in extents {
        let end = e.bytenr.checked_add(e.len);
        if e.len == 0 {
            c.fault_at(FaultId::ExtentEmpty, &e.loc, "extent of length 0");
        }
        if !e.bytenr.is_multiple_of(SECTOR_SIZE) || !e.len.is_multiple_of(SECTOR_SIZE) {
            c.fault_at(
                FaultId::ExtentUnaligned,
                &e.loc,
                format!(
                    "extent {}+{} is not {SECTOR_SIZE}-byte aligned",
                    e.bytenr, e.len
                ),
            );
        }
        if e.bytenr < FIRST_ALLOCATABLE_BYTE || end.is_none_or(|end| end > total) {
            c.fault_at(FaultId::ExtentOutOfRange, &e.loc, format!("extent {}+{} lies outside the allocatable range [{FIRST_ALLOCATABLE_BYTE}, {total})", e.bytenr, e.len));
        }
        let end = end.unwrap_or(u64::MAX);
        if let Some((prev_end, prev_start)) = prev {
            if e.bytenr < prev_end {
                c.fault_at(FaultId::ExtentOverlap, &e.loc, format!("extent {}+{} overlaps the extent at {prev_start} (which ends at {prev_end})", e.bytenr, e.len));
            }
        }
        if prev.is_none_or(|(p, _)| end > p) {
            prev = Some((end, e.bytenr));
        }
        used = used.saturating_add(e.len);
        let (s, t) = (e.bytenr.max(cover_end), end.min(total));
        if t > s {
            covered += t - s;
            cover_end = t;
        }
    }
    let allocatable = total.saturating_sub(FIRST_ALLOCATABLE_BYTE);
    c.report.summary.bytes_used_counted = used;
    c.report.summary.free_bytes = allocatable.saturating_sub(covered);
    if used != sb.bytes_used {
        c.fault_tree(
            FaultId::BytesUsedMismatch,
            Some(tree_id::EXTENT),
            format!(
                "superblock bytes_used {} but the extent items cover {used} bytes",
                sb.bytes_used
            ),
        );
    }
}

/// One metadata item per node of the root, extent, fs (and other non-log)
/// trees, agreeing with the node, and none for anything else.
fn check_metadata_refs(c: &mut Checker<'_>, extents: &[ExtentRec]) {
    let mut metadata: HashMap<u64, usize> = HashMap::new();
    for (i, e) in extents.iter().enumerate() {
        if matches!(e.kind, ExtentKind::Metadata { .. }) {
            metadata.insert(e.bytenr, i);
        }
    }
    let mut matched = vec![false; extents.len()];
    let nodes = sorted_nodes(c);
    let all_trees_read = c.tree_readable(tree_id::ROOT) && c.tree_readable(tree_id::FS);
    for &(bytenr, node) in &nodes {
        if Checker::is_log_tree(node.tree) {
            continue;
        }
        let Some(&i) = metadata.get(&bytenr) else {
            let key = Key::new(bytenr, item_type::METADATA_ITEM, u64::from(node.level));
            c.fault_key(
                FaultId::NodeWithoutMetadataItem,
                tree_id::EXTENT,
                key,
                format!(
                    "node {bytenr} of tree {} (level {}) has no metadata item",
                    tree_name(node.tree),
                    node.level
                ),
            );
            continue;
        };
        matched[i] = true;
        let e = &extents[i];
        if let ExtentKind::Metadata { level } = e.kind {
            if level != u64::from(node.level) {
                c.fault_at(
                    FaultId::MetadataLevel,
                    &e.loc,
                    format!(
                        "metadata item says level {level} but node {bytenr} is level {}",
                        node.level
                    ),
                );
            }
        }
        if let Some(item) = e.item {
            if item.owner != node.owner {
                c.fault_at(
                    FaultId::MetadataOwner,
                    &e.loc,
                    format!(
                        "metadata item owner {} but node {bytenr} is owned by tree {}",
                        tree_name(item.owner),
                        tree_name(node.owner)
                    ),
                );
            }
            let pointers = c.node_refs.get(&bytenr).copied().unwrap_or(0);
            if item.refs != pointers {
                c.fault_at(
                    FaultId::MetadataRefs,
                    &e.loc,
                    format!(
                        "metadata item refs {} but {pointers} pointer{} reach node {bytenr} \
                         (from distinct parent nodes and root items)",
                        item.refs,
                        if pointers == 1 { "" } else { "s" }
                    ),
                );
            }
        }
    }
    if all_trees_read {
        for (i, e) in extents.iter().enumerate() {
            if matches!(e.kind, ExtentKind::Metadata { .. }) && !matched[i] {
                let (id, what) = match c.nodes.get(&e.bytenr) {
                    Some(n) => (
                        FaultId::MetadataUntrackedTree,
                        format!(
                            "block {} is a node of {}, which is not tracked in the extent tree",
                            e.bytenr,
                            tree_name(n.tree)
                        ),
                    ),
                    None => (
                        FaultId::MetadataLeaked,
                        format!(
                            "no tree reaches block {} (leaked metadata extent)",
                            e.bytenr
                        ),
                    ),
                };
                c.fault_at(id, &e.loc, what);
            }
        }
    }
}

/// S3: a node more than one pointer reaches is not newer than the last
/// snapshot of any subvolume reaching it directly (the tree whose walk
/// read it, or one whose pointer found it read already). Else a CoW in
/// that subvolume would take the node for its own (generation newer than
/// the last snapshot) and change it in place under the other tree.
fn check_shared_generations(c: &mut Checker<'_>) {
    let mut reached: Vec<(u64, u64)> = c.shared_reached.iter().copied().collect();
    reached.extend(
        c.shared_reached
            .iter()
            .filter_map(|&(bytenr, _)| c.nodes.get(&bytenr).map(|n| (bytenr, n.tree))),
    );
    reached.sort_unstable();
    reached.dedup();
    for (bytenr, tree) in reached {
        let Some(node) = c.nodes.get(&bytenr).copied() else {
            continue;
        };
        let pointers = c.node_refs.get(&bytenr).copied().unwrap_or(0);
        let last_snapshot = match c.subvols.root_items.get(&tree) {
            Some((Some(item), _)) => item.last_snapshot,
            // A short root item is its own fault (root-item-short).
            _ => continue,
        };
        if pointers > 1 && node.generation > last_snapshot {
            c.fault_block(
                FaultId::SharedNodeAfterLastSnapshot,
                Some(tree),
                bytenr,
                None,
                format!(
                    "node {bytenr} has {pointers} pointers but generation {} is newer than the last snapshot ({last_snapshot}) of {}, which reaches it: a CoW there would change it in place",
                    node.generation,
                    tree_name(tree)
                ),
            );
        }
    }
}

/// A data extent's refs equal the file extent items pointing into it;
/// every file extent has its extent item, of the same length.
fn check_data_refs(c: &mut Checker<'_>, extents: &[ExtentRec]) {
    let mut data: HashMap<u64, usize> = HashMap::new();
    for (i, e) in extents.iter().enumerate() {
        if e.kind == ExtentKind::Data {
            data.insert(e.bytenr, i);
        }
    }
    let mut counted: HashMap<usize, (u64, Vec<u64>)> = HashMap::new();
    let mut bad: Vec<(Loc, FaultId, String)> = Vec::new();
    for fe in c.all_file_extents() {
        let Some(d) = fe.kind.disk() else {
            continue;
        };
        match data.get(&d.disk_bytenr) {
            None => bad.push((
                fe.loc,
                FaultId::FileExtentWithoutExtentItem,
                format!(
                    "file extent points to disk extent {}+{}, which has no extent item",
                    d.disk_bytenr, d.disk_num_bytes
                ),
            )),
            Some(&i) if extents[i].len != d.disk_num_bytes => bad.push((
                fe.loc,
                FaultId::FileExtentLength,
                format!(
                    "file extent says disk extent {} is {} bytes but its extent item says {}",
                    d.disk_bytenr, d.disk_num_bytes, extents[i].len
                ),
            )),
            Some(&i) => {
                let entry = counted.entry(i).or_default();
                entry.0 += 1;
                if !entry.1.contains(&fe.ino) {
                    entry.1.push(fe.ino);
                }
            }
        }
    }
    for (loc, id, reason) in bad {
        c.fault_at(id, &loc, reason);
    }
    for (i, e) in extents.iter().enumerate() {
        if e.kind != ExtentKind::Data {
            continue;
        }
        let (refs, inos) = counted.get(&i).cloned().unwrap_or_default();
        if refs == 0 {
            c.fault_at(
                FaultId::DataExtentLeaked,
                &e.loc,
                format!(
                    "no file extent points to data extent {}+{} (leaked extent)",
                    e.bytenr, e.len
                ),
            );
            continue;
        }
        if let Some(item) = e.item {
            if item.refs != refs {
                c.fault_at(
                    FaultId::DataExtentRefs,
                    &e.loc,
                    format!(
                        "extent item refs {} but {refs} file extent item{} point to it",
                        item.refs,
                        if refs == 1 { "" } else { "s" }
                    ),
                );
            }
            if !inos.contains(&item.owner) {
                c.warn_at(
                    FaultId::DataExtentOwner,
                    &e.loc,
                    format!(
                        "extent item owner is inode {} but it is referenced by inode {}",
                        item.owner, inos[0]
                    ),
                );
            }
        }
    }
}

/// Log tree nodes (and their DUP mirrors) lie outside every extent and in
/// the allocatable range.
fn check_log_nodes(c: &mut Checker<'_>, sb: &Superblock, extents: &[ExtentRec]) {
    // Log tree nodes live outside every extent.
    let profile = sb.metadata_profile;
    let total = sb.total_bytes;
    for (bytenr, node) in sorted_nodes(c) {
        if !Checker::is_log_tree(node.tree) {
            continue;
        }
        // The node and, under DUP, its mirror.
        for (copy, start) in std::iter::once(bytenr)
            .chain(profile.mirror_of(bytenr))
            .enumerate()
        {
            let which = if copy == 0 {
                "log tree node"
            } else {
                "mirror of log tree node"
            };
            let end = start.saturating_add(NODE_SIZE as u64);
            // The last extent starting before `end`, and any earlier one that
            // reaches past `start`: extents do not overlap (or were reported),
            // so checking the nearest one and its predecessor suffices.
            let idx = extents.partition_point(|e| e.bytenr < end);
            for e in extents[..idx].iter().rev().take(2) {
                if e.bytenr.saturating_add(e.len) > start {
                    c.fault_block(
                        FaultId::LogNodeOverlap,
                        Some(node.tree),
                        bytenr,
                        None,
                        format!(
                            "{which} overlaps the extent {}+{} recorded at {} slot {}",
                            e.bytenr, e.len, e.loc.block, e.loc.slot
                        ),
                    );
                    break;
                }
            }
            if start < FIRST_ALLOCATABLE_BYTE || end > total {
                c.fault_block(FaultId::LogNodeOutOfRange, Some(node.tree), bytenr, None, format!("{which} lies outside the allocatable range [{FIRST_ALLOCATABLE_BYTE}, {total})"));
            }
        }
    }
}
