//! `birch scrub IMAGE`: reads every copy of every tree node of an image that
//! nothing else has open, verifies each, and rewrites a bad copy from a good
//! one (docs/DUP.md). Tree nodes only: birch keeps no data checksums, so
//! file data cannot be verified.

use crate::btree::{copy_name, read_node_copies, NodeExpectation};
use crate::device::BlockDevice;
use crate::error::Result;
use crate::format::tree_name;
use crate::format::{item_type, tree_id, Node, NodeBody, RootItem, Superblock};
use crate::fs::read_superblock;
use std::collections::HashSet;
use std::fmt;

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
    /// failed, and per root item that does not decode.
    pub unrepaired: Vec<String>,
}

impl ScrubReport {
    /// Whether every node has a good copy in place on every mirror now.
    pub fn is_clean(&self) -> bool {
        self.unrepaired.is_empty()
    }
}

impl fmt::Display for ScrubReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in &self.repaired {
            writeln!(f, "repaired: {line}")?;
        }
        for line in &self.unrepaired {
            writeln!(f, "unrepaired: {line}")?;
        }
        writeln!(
            f,
            "scrubbed {} tree nodes ({} copies, metadata {}): {} repaired, {} unrepaired",
            self.nodes,
            self.copies,
            self.profile,
            self.repaired.len(),
            self.unrepaired.len()
        )?;
        writeln!(f, "file data not verified: birch keeps no data checksums")
    }
}

/// Scrubs every tree the superblock reaches: the root tree, each tree its
/// root items name, and the log root tree with its log trees. The device
/// must not be in use by a mounted filesystem (a rewrite could land on a
/// block it has since reused). Fails only if no superblock is valid.
pub fn scrub_device<D: BlockDevice + ?Sized>(dev: &D) -> Result<ScrubReport> {
    let sb = read_superblock(dev)?;
    let profile = sb.metadata_profile;
    let mut report = ScrubReport {
        profile: profile.name(),
        ..Default::default()
    };
    // (block, what its parent promises; None: only its own header counts,
    // as for the log root, whose generation is the log's business)
    let mut stack: Vec<(u64, u64, u8, Option<u64>)> = vec![(
        sb.root_tree_bytenr,
        tree_id::ROOT,
        sb.root_tree_level,
        Some(sb.generation),
    )];
    if sb.log_root_bytenr != 0 {
        stack.push((
            sb.log_root_bytenr,
            tree_id::LOG_ROOT,
            sb.log_root_level,
            None,
        ));
    }
    let mut seen = HashSet::new();
    while let Some((bytenr, tree, level, generation)) = stack.pop() {
        if !seen.insert(bytenr) {
            continue;
        }
        let expect = generation.map(|generation| NodeExpectation {
            tree,
            level,
            generation,
        });
        let Some(node) = scrub_node(dev, &sb, bytenr, tree, expect, &mut report) else {
            continue;
        };
        match &node.body {
            NodeBody::Internal(ptrs) => stack.extend(ptrs.iter().map(|p| {
                (
                    p.blockptr,
                    tree,
                    node.level.saturating_sub(1),
                    Some(p.generation),
                )
            })),
            NodeBody::Leaf(items) if tree == tree_id::ROOT || tree == tree_id::LOG_ROOT => {
                for item in items
                    .iter()
                    .filter(|i| i.key.item_type == item_type::ROOT_ITEM)
                {
                    let child = if tree == tree_id::LOG_ROOT {
                        tree_id::LOG
                    } else {
                        item.key.objectid
                    };
                    match RootItem::decode(&item.data) {
                        Ok(root) => {
                            stack.push((root.bytenr, child, root.level, Some(root.generation)))
                        }
                        Err(e) => report.unrepaired.push(format!(
                            "block {bytenr} of tree {}: root item {}: {e} (its tree was not scrubbed)",
                            tree_name(tree),
                            item.key
                        )),
                    }
                }
            }
            NodeBody::Leaf(_) => {}
        }
    }
    Ok(report)
}

/// Reads every copy of node `bytenr` of `tree` and rewrites each bad one
/// from a good one. Returns the node, or `None` when no copy is good (the
/// report says so).
fn scrub_node<D: BlockDevice + ?Sized>(
    dev: &D,
    sb: &Superblock,
    bytenr: u64,
    tree: u64,
    expect: Option<NodeExpectation>,
    report: &mut ScrubReport,
) -> Option<Node> {
    report.nodes += 1;
    let mut good = None;
    let mut bad = Vec::new();
    for copy in read_node_copies(dev, &sb.fsid, sb.metadata_profile, bytenr, expect) {
        report.copies += 1;
        match copy.result {
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
        match dev.write_at(&raw, offset) {
            Ok(()) => report.repaired.push(line),
            Err(e) => report
                .unrepaired
                .push(format!("{line}; rewriting it failed: {e}")),
        }
    }
    Some(node)
}
