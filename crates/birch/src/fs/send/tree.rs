//! Reading the two read-only trees of a send (docs/SEND.md "Design:
//! send", 1): a node reader that counts what it reads, a cursor (a stack
//! of (node, slot)), the comparison of two trees that skips every subtree
//! they share (btrfs's `btrfs_compare_trees`), and the items of one key
//! range.

use crate::btree::{NodeExpectation, TreeRoot};
use crate::error::{Corruption, Error, Result};
use crate::format::{Key, Node, NodeBody};
use std::cmp::Ordering;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Nodes a send keeps at hand besides the engine's cache: enough for the
/// paths of both trees down to the leaves it is working in, so the
/// lookups of one inode after the comparison found it read nothing new.
const RECENT_NODES: usize = 64;

/// Where the nodes of the trees come from: the engine's node store,
/// read without the state lock (the trees are read-only and held).
pub(crate) trait NodeSource {
    fn read_node(&self, bytenr: u64, expect: NodeExpectation) -> Result<Arc<Node>>;
}

/// Reads nodes for one send, counting each one fetched from the engine
/// (`SendStats::nodes_read`); the last [`RECENT_NODES`] are kept.
pub(crate) struct NodeReader<'a> {
    source: &'a dyn NodeSource,
    recent: HashMap<u64, Arc<Node>>,
    order: VecDeque<u64>,
    pub(crate) nodes_read: u64,
}

impl<'a> NodeReader<'a> {
    pub(crate) fn new(source: &'a dyn NodeSource) -> Self {
        NodeReader {
            source,
            recent: HashMap::new(),
            order: VecDeque::new(),
            nodes_read: 0,
        }
    }

    fn read(&mut self, bytenr: u64, expect: NodeExpectation) -> Result<Arc<Node>> {
        if let Some(node) = self.recent.get(&bytenr) {
            if node.generation == expect.generation && node.level == expect.level {
                return Ok(node.clone());
            }
        }
        let node = self.source.read_node(bytenr, expect)?;
        self.nodes_read += 1;
        if self.order.len() == RECENT_NODES {
            if let Some(old) = self.order.pop_front() {
                self.recent.remove(&old);
            }
        }
        if self.recent.insert(bytenr, node.clone()).is_none() {
            self.order.push_back(bytenr);
        }
        Ok(node)
    }
}

/// A position in one tree: the nodes from the root down to the current
/// one, each with its slot. Empty once past the last item.
pub(crate) struct Cursor {
    tree: u64,
    stack: Vec<(Arc<Node>, usize)>,
}

fn node_len(node: &Node) -> usize {
    match &node.body {
        NodeBody::Leaf(items) => items.len(),
        NodeBody::Internal(ptrs) => ptrs.len(),
    }
}

impl Cursor {
    /// At the first slot of `root`'s root node; `None` is an empty tree
    /// (the parent of a full send).
    pub(crate) fn new(reader: &mut NodeReader, root: Option<&TreeRoot>) -> Result<Cursor> {
        let mut cursor = Cursor {
            tree: root.map_or(0, |r| r.id),
            stack: Vec::new(),
        };
        if let Some(root) = root {
            let node = reader.read(root.bytenr, root.expectation())?;
            if node_len(&node) > 0 {
                cursor.stack.push((node, 0));
            }
        }
        Ok(cursor)
    }

    /// The level of the current slot; `None` past the end.
    fn level(&self) -> Option<u8> {
        self.stack.last().map(|(n, _)| n.level)
    }

    fn key(&self) -> Option<Key> {
        let (node, slot) = self.stack.last()?;
        Some(match &node.body {
            NodeBody::Leaf(items) => items[*slot].key,
            NodeBody::Internal(ptrs) => ptrs[*slot].key,
        })
    }

    /// The item at a leaf slot.
    fn item(&self) -> Option<(&Key, &[u8])> {
        let (node, slot) = self.stack.last()?;
        match &node.body {
            NodeBody::Leaf(items) => Some((&items[*slot].key, &items[*slot].data)),
            NodeBody::Internal(_) => None,
        }
    }

    /// The pointer at an internal slot: (blockptr, generation).
    fn pointer(&self) -> Option<(u64, u64)> {
        let (node, slot) = self.stack.last()?;
        match &node.body {
            NodeBody::Internal(ptrs) => Some((ptrs[*slot].blockptr, ptrs[*slot].generation)),
            NodeBody::Leaf(_) => None,
        }
    }

    /// Moves on: into the child of the current pointer when `descend`,
    /// else to the next slot, up through every node that ends.
    fn advance(&mut self, reader: &mut NodeReader, descend: bool) -> Result<()> {
        let Some((node, slot)) = self.stack.last() else {
            return Ok(());
        };
        if descend {
            if let NodeBody::Internal(ptrs) = &node.body {
                let ptr = ptrs[*slot];
                let expect = NodeExpectation {
                    tree: self.tree,
                    level: node.level - 1,
                    generation: ptr.generation,
                };
                let child = reader.read(ptr.blockptr, expect)?;
                if node_len(&child) == 0 {
                    return Err(Error::corrupt(Corruption::at_block(
                        Some(self.tree),
                        ptr.blockptr,
                        None,
                        "an empty node below an internal node",
                    )));
                }
                self.stack.push((child, 0));
                return Ok(());
            }
        }
        while let Some((node, slot)) = self.stack.last_mut() {
            *slot += 1;
            if *slot < node_len(node) {
                return Ok(());
            }
            self.stack.pop();
        }
        Ok(())
    }

    /// At the first item at or after `key` (past the end if none).
    pub(crate) fn seek(reader: &mut NodeReader, root: &TreeRoot, key: &Key) -> Result<Cursor> {
        let mut cursor = Cursor::new(reader, Some(root))?;
        while let Some((node, slot)) = cursor.stack.last_mut() {
            match &node.body {
                NodeBody::Internal(ptrs) => {
                    // The last pointer whose subtree starts at or before
                    // `key`, else the first.
                    *slot = ptrs.partition_point(|p| p.key <= *key).saturating_sub(1);
                    cursor.advance(reader, true)?;
                }
                NodeBody::Leaf(items) => {
                    let first = items.partition_point(|i| i.key < *key);
                    if first < items.len() {
                        *slot = first;
                    } else {
                        *slot = items.len() - 1;
                        cursor.next_item(reader)?;
                    }
                    return Ok(cursor);
                }
            }
        }
        Ok(cursor)
    }

    /// To the next item, down through the pointers that follow.
    pub(crate) fn next_item(&mut self, reader: &mut NodeReader) -> Result<()> {
        self.advance(reader, false)?;
        while self.level().is_some_and(|l| l > 0) {
            self.advance(reader, true)?;
        }
        Ok(())
    }

    /// The current item, if any.
    pub(crate) fn current(&self) -> Option<(&Key, &[u8])> {
        self.item()
    }
}

/// Every item with a key in `first..=last`, in key order.
pub(crate) fn items_in(
    reader: &mut NodeReader,
    root: &TreeRoot,
    first: Key,
    last: Key,
) -> Result<Vec<(Key, Vec<u8>)>> {
    let mut cursor = Cursor::seek(reader, root, &first)?;
    let mut out = Vec::new();
    while let Some((key, data)) = cursor.current() {
        if *key > last {
            break;
        }
        out.push((*key, data.to_vec()));
        cursor.next_item(reader)?;
    }
    Ok(out)
}

/// Walks `new` and `old` together and calls `changed` with the key of
/// every item that is in one tree only or differs between them, in key
/// order. Where both cursors stand on pointers of one level with the same
/// key and the same block (and generation), the subtree is the same in
/// both and neither descends: the work follows the change, not the size.
/// `old` `None` compares with an empty tree (a full send).
pub(crate) fn compare_trees(
    reader: &mut NodeReader,
    new: &TreeRoot,
    old: Option<&TreeRoot>,
    changed: &mut dyn FnMut(&Key) -> Result<()>,
) -> Result<()> {
    let mut n = Cursor::new(reader, Some(new))?;
    let mut o = Cursor::new(reader, old)?;
    loop {
        match (n.level(), o.level()) {
            (None, None) => return Ok(()),
            (Some(nl), None) => {
                if nl == 0 {
                    changed(&n.key().expect("positioned"))?;
                }
                n.advance(reader, true)?;
            }
            (None, Some(ol)) => {
                if ol == 0 {
                    changed(&o.key().expect("positioned"))?;
                }
                o.advance(reader, true)?;
            }
            (Some(0), Some(0)) => {
                let (nk, nd) = n.item().expect("leaf");
                let (ok, od) = o.item().expect("leaf");
                match nk.cmp(ok) {
                    Ordering::Less => {
                        changed(&nk.clone())?;
                        n.advance(reader, false)?;
                    }
                    Ordering::Greater => {
                        changed(&ok.clone())?;
                        o.advance(reader, false)?;
                    }
                    Ordering::Equal => {
                        if nd != od {
                            changed(&nk.clone())?;
                        }
                        n.advance(reader, false)?;
                        o.advance(reader, false)?;
                    }
                }
            }
            (Some(nl), Some(ol)) if nl == ol => {
                let (nk, ok) = (n.key().expect("positioned"), o.key().expect("positioned"));
                match nk.cmp(&ok) {
                    Ordering::Less => n.advance(reader, true)?,
                    Ordering::Greater => o.advance(reader, true)?,
                    Ordering::Equal => {
                        let shared = n.pointer() == o.pointer();
                        n.advance(reader, !shared)?;
                        o.advance(reader, !shared)?;
                    }
                }
            }
            (Some(nl), Some(ol)) => {
                if nl > ol {
                    n.advance(reader, true)?;
                } else {
                    o.advance(reader, true)?;
                }
            }
        }
    }
}
