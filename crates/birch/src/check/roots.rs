//! Finding every tree's root and nodes from a superblock, for `birch dump`
//! and tests (the check itself finds them while walking, see `walk.rs`).

use crate::btree::{read_node_uncached, NodeExpectation};
use crate::device::BlockDevice;
use crate::format::{item_type, tree_id, Node, NodeBody, RootItem, Superblock};
use std::collections::HashSet;

/// Where one tree's root is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeRootRef {
    pub tree: u64,
    /// For a log tree: the subvolume it logs.
    pub subvolume: Option<u64>,
    pub bytenr: u64,
    pub level: u8,
    /// What the pointer promises (None: not known, e.g. the log root).
    pub generation: Option<u64>,
}

/// Every tree the superblock leads to: the root tree, the trees its root
/// items name, the log root tree and the log trees it names. Problems
/// reading the root trees are returned as messages, never a panic.
pub fn tree_roots<D: BlockDevice + ?Sized>(
    dev: &D,
    sb: &Superblock,
) -> (Vec<TreeRootRef>, Vec<String>) {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    let root = TreeRootRef {
        tree: tree_id::ROOT,
        subvolume: None,
        bytenr: sb.root_tree_bytenr,
        level: sb.root_tree_level,
        generation: Some(sb.generation),
    };
    out.push(root);
    for (key, item) in root_items(dev, &sb.fsid, root, &mut problems) {
        if key.0 != tree_id::ROOT {
            out.push(TreeRootRef {
                tree: key.0,
                subvolume: None,
                bytenr: item.bytenr,
                level: item.level,
                generation: Some(item.generation),
            });
        }
    }
    if sb.log_root_bytenr != 0 {
        let log_root = TreeRootRef {
            tree: tree_id::LOG_ROOT,
            subvolume: None,
            bytenr: sb.log_root_bytenr,
            level: sb.log_root_level,
            generation: None,
        };
        out.push(log_root);
        for (key, item) in root_items(dev, &sb.fsid, log_root, &mut problems) {
            out.push(TreeRootRef {
                tree: key.0,
                subvolume: Some(key.1),
                bytenr: item.bytenr,
                level: item.level,
                generation: Some(item.generation),
            });
        }
    }
    (out, problems)
}

/// Every node of the tree `root` leads to, depth first, each read from
/// its primary copy and validated as what its parent's pointer promises
/// (owner: the tree, or for a subvolume tree a node it shares with
/// another subvolume; level; generation). A node that does not read is left out,
/// with a message in the second list, and so is what is below it; a
/// node reached twice is visited once. For tools and tests that look at
/// an image's trees without opening it (`birch check` reads every copy
/// itself).
pub fn tree_nodes<D: BlockDevice + ?Sized>(
    dev: &D,
    fsid: &[u8; 16],
    root: TreeRootRef,
) -> (Vec<(u64, Node)>, Vec<String>) {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    let mut seen = HashSet::new();
    let mut stack = vec![(root.bytenr, root.level, root.generation)];
    while let Some((bytenr, level, generation)) = stack.pop() {
        if !seen.insert(bytenr) {
            continue;
        }
        let expect = generation.map(|generation| NodeExpectation {
            tree: root.tree,
            level,
            generation,
        });
        let node = match read_node_uncached(dev, fsid, bytenr, expect) {
            Ok(n) if tree_id::may_reach(root.tree, n.owner) && n.level == level => n,
            Ok(n) => {
                problems.push(format!(
                    "block {bytenr}: owner {} level {} but expected {} level {level}",
                    crate::format::tree_name(n.owner),
                    n.level,
                    crate::format::tree_name(root.tree)
                ));
                continue;
            }
            Err(e) => {
                problems.push(e.to_string());
                continue;
            }
        };
        if let NodeBody::Internal(ptrs) = &node.body {
            for p in ptrs.iter().rev() {
                stack.push((p.blockptr, level.saturating_sub(1), Some(p.generation)));
            }
        }
        out.push((bytenr, node));
    }
    (out, problems)
}

/// The decodable ROOT_ITEMs of a root tree, as ((objectid, offset), item).
fn root_items<D: BlockDevice + ?Sized>(
    dev: &D,
    fsid: &[u8; 16],
    root: TreeRootRef,
    problems: &mut Vec<String>,
) -> Vec<((u64, u64), RootItem)> {
    let (nodes, mut unread) = tree_nodes(dev, fsid, root);
    problems.append(&mut unread);
    let mut out = Vec::new();
    for (_, node) in nodes {
        let NodeBody::Leaf(items) = &node.body else {
            continue;
        };
        for i in items
            .iter()
            .filter(|i| i.key.item_type == item_type::ROOT_ITEM)
        {
            match RootItem::decode_either(&i.data) {
                Ok(r) => out.push(((i.key.objectid, i.key.offset), r)),
                Err(e) => problems.push(format!("root item {}: {e}", i.key)),
            }
        }
    }
    out
}
