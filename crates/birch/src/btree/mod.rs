//! The copy-on-write B-tree.
//!
//! A [`Forest`] holds every tree's nodes as the running transaction sees
//! them: clean nodes come from the [`NodeStore`] (disk + cache), nodes the
//! transaction changed live in `dirty` until commit writes them, and nodes
//! of a commit still being written live in `committing`. A node is copied
//! at most once per transaction: the copy gets a fresh block and the
//! running transid, and later changes in the same transaction modify the
//! copy in place. The old block is freed (pinned) through the allocator.
//!
//! Nodes of [`TreeKind::Shareable`] trees may be shared between trees (a
//! snapshot, [`Forest::copy_root`]): each has a reference count, the parent
//! nodes pointing at it plus 1 if a root item names it, kept in the extent
//! tree and the allocator's delayed refs. Copying a shared node leaves it
//! in place for its other sharers and gives each of its children one more
//! reference; a block is freed exactly when its count reaches 0
//! (docs/SNAPSHOTS.md (b), invariants S1-S4 and S13).
//!
//! Tree invariants (checked by `check` and by `Forest::verify_tree` in tests):
//! keys strictly increase within a node and across the tree; every internal
//! pointer's key equals the first key of its child; children are one level
//! down, owned by the same tree (or, in subvolume trees, by a subvolume),
//! and carry the generation the pointer records; only a root may be
//! empty; no node overflows.

mod cache;
#[cfg(test)]
mod model_tests;
mod store;

pub use store::{
    copy_name, deferring_all_misses, deferring_misses, read_node_copies, read_node_uncached,
    NodeExpectation, NodeStore,
};

use crate::alloc::{Allocator, TransactionSpace};
use crate::device::BlockDevice;
use crate::error::{Corruption, Error, Result};
use crate::format::{item_type, tree_id, ExtentItem, Key, KeyPtr, LeafItem, Node, NodeBody};
use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;
use std::sync::Arc;

use crate::format::node::{BODY_SIZE, MAX_ITEM_DATA};

/// Called by [`Forest::scan`] on each item; `Break` stops the scan.
pub type ItemVisitor<'a> = dyn FnMut(&Key, &[u8]) -> Result<ControlFlow<()>> + 'a;

/// Where a tree's root node is, as the running transaction sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeRoot {
    pub id: u64,
    pub bytenr: u64,
    pub level: u8,
    pub generation: u64,
    /// The last transaction in which this tree was the source or the
    /// result of a snapshot (0: never, and always for trees that are not
    /// [`TreeKind::Shareable`]). Only its nodes of generation
    /// `<= last_snapshot` may be shared (S3).
    pub last_snapshot: u64,
}

impl TreeRoot {
    /// What the root node must be (owner, level, generation) to be read.
    pub fn expectation(&self) -> NodeExpectation {
        NodeExpectation {
            tree: self.id,
            level: self.level,
            generation: self.generation,
        }
    }
}

/// One change of a batch applied by `Forest::apply_sorted`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Insert a new item; one already there is left and reported.
    Insert(Vec<u8>),
    /// Insert the item, or replace the data of the one with its key.
    Put(Vec<u8>),
    /// Remove the item with its key; a missing one is reported.
    Delete,
}

/// One step of a root-to-leaf path: the node and the slot taken in it
/// (for a leaf, the item's position or insertion point).
#[derive(Debug, Clone, Copy)]
struct PathStep {
    bytenr: u64,
    slot: usize,
}

/// Counters the B-tree keeps about its own work.
#[derive(Debug, Default, Clone, Copy)]
pub struct TreeStats {
    pub nodes_cowed: u64,
    pub splits: u64,
    pub merges: u64,
}

/// How one tree's nodes are written and their blocks accounted: the one
/// thing that differs between the trees of a forest. Which trees are of
/// which kind is the forest's owner's choice ([`Forest::with_tree_kinds`]);
/// the B-tree knows no tree ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeKind {
    /// Written by the transaction commit; its blocks are recorded in the
    /// extent tree (through the allocator's delayed refs).
    Committed,
    /// Written ahead of the commit by a log sync ([`Forest::seal_log_nodes`]);
    /// its blocks are never recorded in the extent tree and live only until
    /// the next commit (the fsync log, docs/TREE-LOG.md).
    Logged,
    /// Committed like [`TreeKind::Committed`], and its nodes may be shared
    /// with other shareable trees (subvolumes and their snapshots): they
    /// are reference counted (docs/SNAPSHOTS.md (b)).
    Shareable,
}

/// A data extent reference held by a leaf item: counted once per leaf
/// however many trees share the leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataRef {
    pub bytenr: u64,
    pub num_bytes: u64,
    pub owner: u64,
}

/// What one [`Forest::drop_tree_step`] left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropStep {
    /// The budget ran out: every pointer whose subtree ends at or before
    /// this key is released; the rest, and the root node, are not.
    Paused(Key),
    /// Every node is released, the root node freed.
    Done,
}

/// A bounded drop's position and budget.
struct DropWalk {
    progress: Key,
    visits: usize,
    budget: usize,
}

pub struct Forest<D> {
    store: Arc<NodeStore<D>>,
    dirty: HashMap<u64, Arc<Node>>,
    /// The members of `dirty` that belong to [`TreeKind::Logged`] trees:
    /// they are written by log syncs, not by the commit.
    log_dirty: HashSet<u64>,
    committing: Arc<HashMap<u64, Arc<Node>>>,
    /// Log nodes sealed by a log sync whose write is in flight.
    log_writing: Arc<HashMap<u64, Arc<Node>>>,
    alloc: Allocator,
    transid: u64,
    pub stats: TreeStats,
    tree_kind: fn(u64) -> TreeKind,
    /// Which leaf items of shareable trees hold a data extent reference.
    leaf_refs: fn(&LeafItem) -> Option<DataRef>,
    /// The extent tree, where the counts of shared nodes are read
    /// ([`Self::set_refs_root`]).
    refs_root: Option<TreeRoot>,
}

/// Largest i such that `ptrs[i].key <= key`, or 0.
fn child_slot(ptrs: &[KeyPtr], key: &Key) -> usize {
    match ptrs.binary_search_by(|p| p.key.cmp(key)) {
        Ok(i) => i,
        Err(0) => 0,
        Err(i) => i - 1,
    }
}

fn leaf_slot(items: &[LeafItem], key: &Key) -> std::result::Result<usize, usize> {
    items.binary_search_by(|i| i.key.cmp(key))
}

impl<D: BlockDevice> Forest<D> {
    pub fn new(store: Arc<NodeStore<D>>, alloc: Allocator, transid: u64) -> Self {
        Forest {
            store,
            dirty: HashMap::new(),
            log_dirty: HashSet::new(),
            committing: Arc::new(HashMap::new()),
            log_writing: Arc::new(HashMap::new()),
            alloc,
            transid,
            stats: TreeStats::default(),
            tree_kind: |_| TreeKind::Committed,
            leaf_refs: |_| None,
            refs_root: None,
        }
    }

    /// Sets which trees are [`TreeKind::Logged`] or [`TreeKind::Shareable`]
    /// (by default every tree is [`TreeKind::Committed`]).
    pub fn with_tree_kinds(self, tree_kind: fn(u64) -> TreeKind) -> Self {
        Forest { tree_kind, ..self }
    }

    /// Sets which leaf items of shareable trees hold data extent
    /// references (by default none does): copying a shared leaf adds one
    /// to each, dropping a leaf's last reference removes one from each.
    pub fn with_leaf_refs(self, leaf_refs: fn(&LeafItem) -> Option<DataRef>) -> Self {
        Forest { leaf_refs, ..self }
    }

    /// Sets the extent tree whose `METADATA_ITEM`s hold the counts of
    /// shared nodes. It changes only while a commit applies its delayed
    /// refs, when no shareable tree is written; the owner installs it at
    /// mount and after each application.
    pub fn set_refs_root(&mut self, extent: TreeRoot) {
        self.refs_root = Some(extent);
    }

    pub fn transid(&self) -> u64 {
        self.transid
    }

    pub fn store(&self) -> &Arc<NodeStore<D>> {
        &self.store
    }

    /// The allocator, for its counters.
    pub fn alloc(&self) -> &impl TransactionSpace {
        &self.alloc
    }

    /// The allocator, for what a transaction does with space besides tree
    /// nodes (whose blocks only the forest allocates and frees).
    pub fn alloc_mut(&mut self) -> &mut impl TransactionSpace {
        &mut self.alloc
    }

    /// Replaces the allocator: a mount rebuilds it from the extent tree it
    /// read through this forest.
    pub fn set_alloc(&mut self, alloc: Allocator) {
        self.alloc = alloc;
    }

    pub fn dirty_node_count(&self) -> usize {
        self.dirty.len()
    }

    /// Reads a node as the running transaction sees it.
    pub fn node(&self, bytenr: u64, expect: NodeExpectation) -> Result<Arc<Node>> {
        if let Some(n) = self
            .dirty
            .get(&bytenr)
            .or_else(|| self.committing.get(&bytenr))
            .or_else(|| self.log_writing.get(&bytenr))
        {
            if !tree_id::may_reach(expect.tree, n.owner)
                || n.level != expect.level
                || n.generation != expect.generation
            {
                return Err(Error::corrupt(Corruption::at_block(
                    Some(expect.tree),
                    bytenr,
                    None,
                    format!("in-memory node (owner {}, level {}, gen {}) does not match its parent {:?}", n.owner, n.level, n.generation, expect),
                )));
            }
            return Ok(n.clone());
        }
        self.store.read(bytenr, expect)
    }

    fn node_mut(&mut self, bytenr: u64) -> &mut Node {
        Arc::make_mut(
            self.dirty
                .get_mut(&bytenr)
                .unwrap_or_else(|| panic!("node {bytenr} changed without being copied first")),
        )
    }

    /// The reference count of the node at `bytenr` (`level`): its
    /// `METADATA_ITEM`'s refs plus the pending delayed change.
    pub fn refs(&self, bytenr: u64, level: u8) -> Result<u64> {
        let (created, delta) = self.alloc.pending_ref_delta(bytenr);
        let extent = self
            .refs_root
            .expect("counts of shared nodes asked before the extent tree was installed");
        let corrupt = |reason: String| {
            Error::corrupt(Corruption::at_block(Some(extent.id), bytenr, None, reason))
        };
        let item_refs = if created {
            0
        } else {
            let key = Key::new(bytenr, item_type::METADATA_ITEM, u64::from(level));
            let data = self
                .get(&extent, &key)?
                .ok_or_else(|| corrupt(format!("shareable node has no {key}")))?;
            ExtentItem::decode(&data)
                .map_err(|e| corrupt(format!("{key}: {e}")))?
                .refs
        };
        let refs = i128::from(item_refs) + i128::from(delta);
        if refs < 1 {
            return Err(corrupt(format!(
                "node reached from a tree has reference count {refs} \
                 (item {item_refs}, pending change {delta})"
            )));
        }
        Ok(refs as u64)
    }

    /// Whether a node of `root`'s tree with `generation` may be shared
    /// (btrfs's `btrfs_block_can_be_shared`): never a root node, and only
    /// one no newer than the tree's last snapshot (S3). Every other node is
    /// exclusive, and changing it needs no count.
    fn may_be_shared(&self, root: &TreeRoot, generation: u64, is_root: bool) -> bool {
        (self.tree_kind)(root.id) == TreeKind::Shareable
            && !is_root
            && generation <= root.last_snapshot
    }

    /// The node's reference count if it may be shared, else 1.
    fn count_if_shared(
        &self,
        root: &TreeRoot,
        bytenr: u64,
        expect: NodeExpectation,
        is_root: bool,
    ) -> Result<u64> {
        if self.may_be_shared(root, expect.generation, is_root) {
            self.refs(bytenr, expect.level)
        } else {
            Ok(1)
        }
    }

    /// Makes `bytenr` writable in this transaction, copying it if it is not
    /// already this transaction's copy, or if it is shared (a snapshot made
    /// in this transaction shares even this transaction's copies, whose
    /// generation is then `<= last_snapshot`). Returns the writable block.
    fn cow(
        &mut self,
        root: &TreeRoot,
        bytenr: u64,
        expect: NodeExpectation,
        is_root: bool,
    ) -> Result<u64> {
        let refs = self.count_if_shared(root, bytenr, expect, is_root)?;
        if refs == 1 && self.dirty.contains_key(&bytenr) {
            return Ok(bytenr);
        }
        let old = self.node(bytenr, expect)?;
        let new_bytenr = self.allocate_block(root.id, expect.level)?;
        self.release_copied(root.id, &old, refs)?;
        // Once the cache has forgotten the old block, a node nothing else
        // holds (no commit or log sync writing it) is taken over as it is:
        // a copy costs one allocation per leaf item, on every first change
        // of a node in a transaction or after a log sync.
        let mut copy = Arc::try_unwrap(old).unwrap_or_else(|shared| (*shared).clone());
        copy.bytenr = new_bytenr;
        copy.generation = self.transid;
        copy.owner = root.id;
        self.dirty.insert(new_bytenr, Arc::new(copy));
        self.stats.nodes_cowed += 1;
        Ok(new_bytenr)
    }

    /// Tree `tree` lets go of `old` (count `refs`) after copying its
    /// pointers into a node of its own. An exclusive node is freed: its
    /// children change parent, their counts stay. A shared one stays for
    /// its other sharers with one reference fewer, and each of its
    /// children gains the copy as a parent (btrfs's `update_ref_for_cow`).
    fn release_copied(&mut self, tree: u64, old: &Node, refs: u64) -> Result<()> {
        if refs > 1 {
            self.alloc
                .add_node_ref(old.bytenr, old.owner, old.level, -1)?;
            self.add_child_refs(tree, old, 1)
        } else {
            self.free_block(old.bytenr, tree, old.level)
        }
    }

    /// Adds `delta` to the count of everything `node` points at: its
    /// children, or for a leaf the data extents its items reference.
    fn add_child_refs(&mut self, tree: u64, node: &Node, delta: i64) -> Result<()> {
        let child_level = node.level.saturating_sub(1);
        match &node.body {
            NodeBody::Internal(ptrs) => {
                for p in ptrs {
                    self.alloc
                        .add_node_ref(p.blockptr, tree, child_level, delta)?;
                }
            }
            NodeBody::Leaf(items) => {
                for r in items.iter().filter_map(self.leaf_refs) {
                    self.alloc
                        .add_leaf_data_ref(r.bytenr, r.num_bytes, r.owner, delta)?;
                }
            }
        }
        Ok(())
    }

    /// A snapshot of `src` as tree `new_id` (btrfs's `btrfs_copy_root`): a
    /// new root node with the contents of `src`'s, so both trees share
    /// everything below it, each child gaining one reference. Costs one
    /// node and one count change per pointer, whatever the tree's size.
    /// Both trees' `last_snapshot` becomes this transaction.
    pub fn copy_root(&mut self, src: &mut TreeRoot, new_id: u64) -> Result<TreeRoot> {
        assert!(
            (self.tree_kind)(src.id) == TreeKind::Shareable
                && (self.tree_kind)(new_id) == TreeKind::Shareable,
            "snapshot of tree {} as {new_id}: both must be shareable",
            src.id
        );
        let node = self.node(src.bytenr, src.expectation())?;
        let bytenr = self.new_node(new_id, src.level, node.body.clone())?;
        self.add_child_refs(new_id, &node, 1)?;
        src.last_snapshot = self.transid;
        Ok(TreeRoot {
            id: new_id,
            bytenr,
            level: src.level,
            generation: self.transid,
            last_snapshot: self.transid,
        })
    }

    /// A new block for a node of `tree`: a logged tree's blocks are not
    /// recorded in the extent tree.
    fn allocate_block(&mut self, tree: u64, level: u8) -> Result<u64> {
        match (self.tree_kind)(tree) {
            TreeKind::Committed | TreeKind::Shareable => self.alloc.alloc_node(tree, level),
            TreeKind::Logged => {
                let bytenr = self.alloc.alloc_log_node()?;
                self.log_dirty.insert(bytenr);
                Ok(bytenr)
            }
        }
    }

    /// Frees the node at `bytenr`. A node the counts say is already free
    /// (two pointers on disk reach a node counted once) is a corruption
    /// error, before anything changes.
    fn free_block(&mut self, bytenr: u64, tree: u64, level: u8) -> Result<()> {
        match (self.tree_kind)(tree) {
            TreeKind::Committed | TreeKind::Shareable => {
                self.alloc.free_node(bytenr, tree, level)?;
            }
            TreeKind::Logged => {
                // Never written by a log sync: nothing durable can point at it.
                let written = !self.log_dirty.remove(&bytenr);
                self.alloc.free_log_node(bytenr, written);
            }
        }
        self.dirty.remove(&bytenr);
        self.store.forget(bytenr);
        Ok(())
    }

    fn new_node(&mut self, tree: u64, level: u8, body: NodeBody) -> Result<u64> {
        let bytenr = self.allocate_block(tree, level)?;
        self.dirty.insert(
            bytenr,
            Arc::new(Node {
                bytenr,
                generation: self.transid,
                owner: tree,
                level,
                body,
            }),
        );
        Ok(bytenr)
    }

    /// Creates an empty tree (a root leaf with no items).
    pub fn create_tree(&mut self, id: u64) -> Result<TreeRoot> {
        let bytenr = self.new_node(id, 0, NodeBody::Leaf(Vec::new()))?;
        Ok(TreeRoot {
            id,
            bytenr,
            level: 0,
            generation: self.transid,
            last_snapshot: 0,
        })
    }

    /// Frees every node of a tree (e.g. a log tree after commit). In a
    /// shareable tree, a node other trees share loses this tree's
    /// reference and is not descended; the others are freed, and the data
    /// references of the freed leaves dropped.
    pub fn drop_tree(&mut self, root: &TreeRoot) -> Result<()> {
        let shareable = (self.tree_kind)(root.id) == TreeKind::Shareable;
        let mut stack = vec![(root.bytenr, root.expectation())];
        while let Some((bytenr, expect)) = stack.pop() {
            if shareable {
                let is_root = bytenr == root.bytenr;
                let refs = self.count_if_shared(root, bytenr, expect, is_root)?;
                let node = self.node(bytenr, expect)?;
                if refs > 1 {
                    self.alloc
                        .add_node_ref(bytenr, node.owner, node.level, -1)?;
                    continue;
                }
                if node.is_leaf() {
                    self.add_child_refs(root.id, &node, -1)?;
                }
            }
            // A leaf is freed by its address: reading it (from the device,
            // once the cache forgot it) only to drop it held the state lock
            // for 10-20 ms when a commit dropped a log grown by 30 s of
            // dbench, and every request waited.
            if expect.level > 0 {
                let node = self.node(bytenr, expect)?;
                if let NodeBody::Internal(ptrs) = &node.body {
                    for p in ptrs {
                        stack.push((
                            p.blockptr,
                            NodeExpectation {
                                tree: expect.tree,
                                level: expect.level - 1,
                                generation: p.generation,
                            },
                        ));
                    }
                }
            }
            self.free_block(bytenr, expect.tree, expect.level)?;
        }
        Ok(())
    }

    /// One bounded step of dropping the dead shareable tree `root`
    /// (docs/SNAPSHOTS.md (d), btrfs's `btrfs_drop_snapshot` with counts):
    /// visits at most `budget` nodes depth first in key order, starting
    /// right of `progress`. A pointer whose subtree's upper bound (the next
    /// pointer's key, or the parent's bound) is `<= progress` was released
    /// by an earlier step and is skipped; every other pointer is released
    /// now: a shared child loses one reference and is not descended, an
    /// exclusive leaf drops its data references and is freed, an exclusive
    /// internal node is freed once its last child is released. The tree
    /// must not change between steps (a dead root never does), and the
    /// returned progress must be committed with the frees it stands for.
    pub fn drop_tree_step(
        &mut self,
        root: &TreeRoot,
        progress: Key,
        budget: usize,
    ) -> Result<DropStep> {
        let mut walk = DropWalk {
            progress,
            visits: 0,
            budget,
        };
        let node = self.node(root.bytenr, root.expectation())?;
        if node.is_leaf() {
            self.add_child_refs(root.id, &node, -1)?;
        } else if !self.drop_children(root, &node, None, &mut walk)? {
            return Ok(DropStep::Paused(walk.progress));
        }
        self.free_block(root.bytenr, root.id, root.level)?;
        Ok(DropStep::Done)
    }

    /// Releases the pointers of internal node `node` (of dead tree `root`,
    /// upper bound `upper`, None: the end of the key space) right of the
    /// walk's progress; false when the budget ran out first.
    fn drop_children(
        &mut self,
        root: &TreeRoot,
        node: &Node,
        upper: Option<Key>,
        walk: &mut DropWalk,
    ) -> Result<bool> {
        let ptrs = node.key_ptrs();
        let child_level = node.level.checked_sub(1).ok_or_else(|| {
            Error::corrupt(Corruption::at_block(
                Some(root.id),
                node.bytenr,
                None,
                "internal node at level 0".to_string(),
            ))
        })?;
        for (i, p) in ptrs.iter().enumerate() {
            let child_upper = ptrs.get(i + 1).map(|n| n.key).or(upper);
            if child_upper.is_some_and(|u| u <= walk.progress) {
                continue;
            }
            if walk.visits >= walk.budget {
                return Ok(false);
            }
            walk.visits += 1;
            let expect = NodeExpectation {
                tree: root.id,
                level: child_level,
                generation: p.generation,
            };
            if self.count_if_shared(root, p.blockptr, expect, false)? > 1 {
                // Shared: the other trees keep the subtree, unread.
                self.alloc
                    .add_node_ref(p.blockptr, root.id, child_level, -1)?;
            } else {
                let child = self.node(p.blockptr, expect)?;
                if child.is_leaf() {
                    self.add_child_refs(root.id, &child, -1)?;
                } else if !self.drop_children(root, &child, child_upper, walk)? {
                    return Ok(false);
                }
                self.free_block(p.blockptr, root.id, child_level)?;
            }
            if let Some(u) = child_upper {
                walk.progress = u;
            }
        }
        Ok(true)
    }

    /// Every node of a tree (for replay to reserve a log's blocks).
    pub fn tree_blocks(&self, root: &TreeRoot) -> Result<Vec<u64>> {
        let mut blocks = Vec::new();
        let mut stack = vec![(root.bytenr, root.expectation())];
        while let Some((bytenr, expect)) = stack.pop() {
            let node = self.node(bytenr, expect)?;
            if let NodeBody::Internal(ptrs) = &node.body {
                for p in ptrs {
                    stack.push((
                        p.blockptr,
                        NodeExpectation {
                            tree: expect.tree,
                            level: expect.level - 1,
                            generation: p.generation,
                        },
                    ));
                }
            }
            blocks.push(bytenr);
        }
        Ok(blocks)
    }

    // ----- reads -----

    /// The data of the item with exactly `key`.
    pub fn get(&self, root: &TreeRoot, key: &Key) -> Result<Option<Vec<u8>>> {
        let mut bytenr = root.bytenr;
        let mut expect = root.expectation();
        loop {
            let node = self.node(bytenr, expect)?;
            match &node.body {
                NodeBody::Leaf(items) => {
                    return Ok(leaf_slot(items, key).ok().map(|i| items[i].data.clone()))
                }
                NodeBody::Internal(ptrs) => {
                    let p = ptrs[child_slot(ptrs, key)];
                    bytenr = p.blockptr;
                    expect = NodeExpectation {
                        tree: root.id,
                        level: expect.level - 1,
                        generation: p.generation,
                    };
                }
            }
        }
    }

    /// Calls `f` on every item with `start <= key <= end`, in key order,
    /// until it returns `Break`.
    pub fn scan(&self, root: &TreeRoot, start: Key, end: Key, f: &mut ItemVisitor) -> Result<()> {
        self.scan_node(root.bytenr, root.expectation(), &start, &end, f)
            .map(|_| ())
    }

    fn scan_node(
        &self,
        bytenr: u64,
        expect: NodeExpectation,
        start: &Key,
        end: &Key,
        f: &mut ItemVisitor,
    ) -> Result<ControlFlow<()>> {
        let node = self.node(bytenr, expect)?;
        match &node.body {
            NodeBody::Leaf(items) => {
                let first = leaf_slot(items, start).unwrap_or_else(|i| i);
                for item in &items[first..] {
                    if item.key > *end {
                        return Ok(ControlFlow::Break(()));
                    }
                    if f(&item.key, &item.data)?.is_break() {
                        return Ok(ControlFlow::Break(()));
                    }
                }
                Ok(ControlFlow::Continue(()))
            }
            NodeBody::Internal(ptrs) => {
                for p in &ptrs[child_slot(ptrs, start)..] {
                    if p.key > *end {
                        return Ok(ControlFlow::Break(()));
                    }
                    let child = NodeExpectation {
                        tree: expect.tree,
                        level: expect.level - 1,
                        generation: p.generation,
                    };
                    if self.scan_node(p.blockptr, child, start, end, f)?.is_break() {
                        return Ok(ControlFlow::Break(()));
                    }
                }
                Ok(ControlFlow::Continue(()))
            }
        }
    }

    /// All items with `start <= key <= end`.
    pub fn collect_range(
        &self,
        root: &TreeRoot,
        start: Key,
        end: Key,
    ) -> Result<Vec<(Key, Vec<u8>)>> {
        let mut out = Vec::new();
        self.scan(root, start, end, &mut |k, d| {
            out.push((*k, d.to_vec()));
            Ok(ControlFlow::Continue(()))
        })?;
        Ok(out)
    }

    /// The item with the largest key `<= key`, if any.
    pub fn last_at_or_before(&self, root: &TreeRoot, key: &Key) -> Result<Option<(Key, Vec<u8>)>> {
        self.last_in_node(root.bytenr, root.expectation(), key)
    }

    fn last_in_node(
        &self,
        bytenr: u64,
        expect: NodeExpectation,
        key: &Key,
    ) -> Result<Option<(Key, Vec<u8>)>> {
        let node = self.node(bytenr, expect)?;
        match &node.body {
            NodeBody::Leaf(items) => {
                let idx = match leaf_slot(items, key) {
                    Ok(i) => Some(i),
                    Err(0) => None,
                    Err(i) => Some(i - 1),
                };
                Ok(idx.map(|i| (items[i].key, items[i].data.clone())))
            }
            NodeBody::Internal(ptrs) => {
                // The child whose range holds `key` may contain nothing <= key
                // only if key precedes the whole tree; then nothing does.
                let slot = child_slot(ptrs, key);
                for p in ptrs[..=slot].iter().rev() {
                    let child = NodeExpectation {
                        tree: expect.tree,
                        level: expect.level - 1,
                        generation: p.generation,
                    };
                    if let Some(found) = self.last_in_node(p.blockptr, child, key)? {
                        return Ok(Some(found));
                    }
                }
                Ok(None)
            }
        }
    }

    /// Reads what a change of the item at `key` will read, as the tree is
    /// now, and changes nothing: a change's *warm-up* (docs/SNAPSHOTS.md
    /// (f) item 3), run with misses deferred so that they are read without
    /// the state lock before the change runs. That is the path from the
    /// root to the leaf holding `key` (what `cow_path` copies); beside each
    /// node on it below half full, the sibling `rebalance` merges it with
    /// after a removal (the left one, else the right); and in a tree whose
    /// nodes may be shared, the extent tree's count of each node on the
    /// path that may be (`cow` looks it up). A change that still finds a
    /// node missing (evicted since, or a merge this did not foresee) reads
    /// it itself: this only fills the cache. Returns the leaf's upper
    /// bound: the smallest key that belongs to a leaf to its right
    /// (`None`: the leaf is the last).
    pub fn warm_path(&self, root: &TreeRoot, key: &Key) -> Result<Option<Key>> {
        let mut bytenr = root.bytenr;
        let mut expect = root.expectation();
        let mut is_root = true;
        let mut upper = None;
        loop {
            let node = self.node(bytenr, expect)?;
            // A count, a sibling: looked at whatever becomes of them (in
            // a warm-up a miss is noted and the walk goes on).
            let _ = self.count_if_shared(root, bytenr, expect, is_root);
            let NodeBody::Internal(ptrs) = &node.body else {
                return Ok(upper);
            };
            let slot = child_slot(ptrs, key);
            if let Some(next) = ptrs.get(slot + 1) {
                upper = Some(next.key);
            }
            let child_expect = |p: &KeyPtr| NodeExpectation {
                tree: root.id,
                level: expect.level - 1,
                generation: p.generation,
            };
            let child = ptrs[slot];
            if self
                .node(child.blockptr, child_expect(&child))?
                .used_bytes()
                < BODY_SIZE / 2
            {
                let sibling = match slot.checked_sub(1) {
                    Some(left) => Some(ptrs[left]),
                    None => ptrs.get(slot + 1).copied(),
                };
                if let Some(s) = sibling {
                    let _ = self.node(s.blockptr, child_expect(&s)).and_then(|_| {
                        self.count_if_shared(root, s.blockptr, child_expect(&s), false)
                    });
                }
            }
            bytenr = child.blockptr;
            expect = child_expect(&child);
            is_root = false;
        }
    }

    /// [`warm_path`](Self::warm_path) for each of `keys` (ascending),
    /// walking each leaf once: a key below the upper bound of the leaf the
    /// last walk reached lies in that leaf. A walk that fails (a miss a
    /// warm-up noted) ends only that key's walk; the next key walks again.
    pub fn warm_sorted(&self, root: &TreeRoot, keys: &[Key]) {
        let mut bound: Option<Option<Key>> = None;
        for key in keys {
            match bound {
                // The walk reached the last leaf: it holds the rest.
                Some(None) => return,
                Some(Some(upper)) if *key < upper => continue,
                _ => bound = self.warm_path(root, key).ok(),
            }
        }
    }

    // ----- writes -----

    /// Copies the root-to-leaf path toward `key` into this transaction.
    fn cow_path(&mut self, root: &mut TreeRoot, key: &Key) -> Result<Vec<PathStep>> {
        Ok(self.cow_path_bounded(root, key)?.0)
    }

    /// As `cow_path`, and also the leaf's upper bound: the smallest key
    /// that belongs to a leaf to its right (`None`: the leaf is the last).
    fn cow_path_bounded(
        &mut self,
        root: &mut TreeRoot,
        key: &Key,
    ) -> Result<(Vec<PathStep>, Option<Key>)> {
        let new_root = self.cow(root, root.bytenr, root.expectation(), true)?;
        root.bytenr = new_root;
        root.generation = self.transid;
        let mut path = Vec::with_capacity(root.level as usize + 1);
        let mut bytenr = new_root;
        let mut level = root.level;
        let mut upper = None;
        loop {
            // Copy out what is needed before touching the node mutably: a
            // live Arc clone would make `Arc::make_mut` deep-copy it.
            let (slot, p) = match &self.dirty[&bytenr].body {
                NodeBody::Leaf(items) => {
                    let slot = leaf_slot(items, key).unwrap_or_else(|i| i);
                    path.push(PathStep { bytenr, slot });
                    return Ok((path, upper));
                }
                NodeBody::Internal(ptrs) => {
                    let slot = child_slot(ptrs, key);
                    if let Some(next) = ptrs.get(slot + 1) {
                        upper = Some(next.key);
                    }
                    (slot, ptrs[slot])
                }
            };
            let expect = NodeExpectation {
                tree: root.id,
                level: level - 1,
                generation: p.generation,
            };
            let child = self.cow(root, p.blockptr, expect, false)?;
            if child != p.blockptr {
                let transid = self.transid;
                let ptr = &mut self.node_mut(bytenr).key_ptrs_mut()[slot];
                ptr.blockptr = child;
                ptr.generation = transid;
            }
            path.push(PathStep { bytenr, slot });
            bytenr = child;
            level -= 1;
        }
    }

    /// Inserts a new item; `Err(Exists)` if the key is present.
    pub fn insert(&mut self, root: &mut TreeRoot, key: Key, data: Vec<u8>) -> Result<()> {
        if self.get(root, &key)?.is_some() {
            return Err(Error::Exists);
        }
        self.put(root, key, data)
    }

    /// Inserts an item or replaces the data of an existing one.
    pub fn put(&mut self, root: &mut TreeRoot, key: Key, data: Vec<u8>) -> Result<()> {
        assert!(
            data.len() <= MAX_ITEM_DATA,
            "item {key} of {} bytes exceeds the largest item",
            data.len()
        );
        let path = self.cow_path(root, &key)?;
        let leaf = path.last().expect("path has a leaf");
        let slot = leaf.slot;
        let items = self.node_mut(leaf.bytenr).leaf_items_mut();
        if items.get(slot).is_some_and(|i| i.key == key) {
            items[slot].data = data;
        } else {
            items.insert(slot, LeafItem { key, data });
            if slot == 0 {
                self.fix_low_keys(&path, path.len() - 1);
            }
        }
        self.split_if_needed(root, &path, path.len() - 1)
    }

    /// Removes the item with `key`, returning its data.
    pub fn delete(&mut self, root: &mut TreeRoot, key: &Key) -> Result<Option<Vec<u8>>> {
        if self.get(root, key)?.is_none() {
            return Ok(None);
        }
        let path = self.cow_path(root, key)?;
        let leaf = *path.last().expect("path has a leaf");
        let items = self.node_mut(leaf.bytenr).leaf_items_mut();
        assert_eq!(items[leaf.slot].key, *key);
        let removed = items.remove(leaf.slot);
        if leaf.slot == 0 && !items.is_empty() {
            self.fix_low_keys(&path, path.len() - 1);
        }
        self.rebalance(root, &path, path.len() - 1)?;
        Ok(Some(removed.data))
    }

    /// Applies `changes` (keys strictly ascending) as one pass over the
    /// leaves they fall in: each leaf's path is copied once and the leaf
    /// rebalanced or split once, for all its changes, instead of once per
    /// item. A commit applies tens of thousands of extent and checksum
    /// changes this way while requests wait for the state lock. Returns
    /// the keys of the changes that did not apply: inserts that found an
    /// item, deletions that found none.
    pub fn apply_sorted(
        &mut self,
        root: &mut TreeRoot,
        changes: Vec<(Key, Change)>,
    ) -> Result<Vec<Key>> {
        assert!(
            changes.windows(2).all(|w| w[0].0 < w[1].0),
            "batch of tree {} is not in strictly ascending key order",
            root.id
        );
        let mut refused = Vec::new();
        let mut changes = changes.into_iter().peekable();
        while let Some((first_key, _)) = changes.peek() {
            let (path, upper) = self.cow_path_bounded(root, first_key)?;
            let depth = path.len() - 1;
            let items = self.node_mut(path[depth].bytenr).leaf_items_mut();
            let low_key = items.first().map(|i| i.key);
            let mut used: usize = items.iter().map(leaf_item_size).sum();
            // Merged into a new list rather than inserted and removed in
            // place: a leaf holds hundreds of small items (checksums,
            // extent items), and shifting them for each change made a
            // batch quadratic in the leaf's size.
            let mut old = std::mem::take(items).into_iter().peekable();
            let mut merged = Vec::with_capacity(old.len());
            // A leaf takes changes until it overflows by at most one item,
            // so that one split into two leaves always makes it fit.
            while let Some((key, _)) = changes.peek() {
                if upper.is_some_and(|u| *key >= u) || used > BODY_SIZE {
                    break;
                }
                let (key, change) = changes.next().expect("peeked");
                while let Some(before) = old.next_if(|i| i.key < key) {
                    merged.push(before);
                }
                match (old.next_if(|i| i.key == key), change) {
                    (Some(present), Change::Insert(_)) => {
                        refused.push(key);
                        merged.push(present);
                    }
                    (None, Change::Delete) => refused.push(key),
                    (Some(present), Change::Delete) => used -= leaf_item_size(&present),
                    (present, Change::Put(data) | Change::Insert(data)) => {
                        assert!(data.len() <= MAX_ITEM_DATA, "item {key} too large");
                        let item = LeafItem { key, data };
                        used = used + leaf_item_size(&item)
                            - present.as_ref().map_or(0, leaf_item_size);
                        merged.push(item);
                    }
                }
            }
            merged.extend(old);
            *items = merged;
            if items.first().map(|i| i.key) != low_key && !items.is_empty() {
                self.fix_low_keys(&path, depth);
            }
            if used > BODY_SIZE {
                self.split_if_needed(root, &path, depth)?;
            } else {
                self.rebalance(root, &path, depth)?;
            }
        }
        Ok(refused)
    }

    /// After the first key of `path[depth]` changed, rewrites the keys that
    /// point at it from above.
    fn fix_low_keys(&mut self, path: &[PathStep], depth: usize) {
        let mut depth = depth;
        while depth > 0 {
            let Some(first) = self.dirty[&path[depth].bytenr].first_key() else {
                return;
            };
            let parent = path[depth - 1];
            self.node_mut(parent.bytenr).key_ptrs_mut()[parent.slot].key = first;
            if parent.slot != 0 {
                return;
            }
            depth -= 1;
        }
    }

    fn split_if_needed(
        &mut self,
        root: &mut TreeRoot,
        path: &[PathStep],
        depth: usize,
    ) -> Result<()> {
        let bytenr = path[depth].bytenr;
        if self.dirty[&bytenr].fits() {
            return Ok(());
        }
        self.stats.splits += 1;
        let level = self.dirty[&bytenr].level;
        let body = std::mem::replace(&mut self.node_mut(bytenr).body, NodeBody::Leaf(Vec::new()));
        let pieces: Vec<NodeBody> = match body {
            NodeBody::Leaf(items) => split_leaf_items(items)
                .into_iter()
                .map(NodeBody::Leaf)
                .collect(),
            NodeBody::Internal(mut ptrs) => {
                let right = ptrs.split_off(ptrs.len() / 2);
                vec![NodeBody::Internal(ptrs), NodeBody::Internal(right)]
            }
        };
        let mut pieces = pieces.into_iter();
        self.node_mut(bytenr).body = pieces.next().expect("split yields pieces");
        let mut new_ptrs = Vec::new();
        for body in pieces {
            let first = match &body {
                NodeBody::Leaf(items) => items[0].key,
                NodeBody::Internal(ptrs) => ptrs[0].key,
            };
            let new_bytenr = self.new_node(root.id, level, body)?;
            new_ptrs.push(KeyPtr {
                key: first,
                blockptr: new_bytenr,
                generation: self.transid,
            });
        }
        if depth == 0 {
            let first = self.dirty[&bytenr]
                .first_key()
                .expect("split node is not empty");
            let mut ptrs = vec![KeyPtr {
                key: first,
                blockptr: bytenr,
                generation: self.transid,
            }];
            ptrs.extend(new_ptrs);
            let new_root = self.new_node(root.id, level + 1, NodeBody::Internal(ptrs))?;
            root.bytenr = new_root;
            root.level = level + 1;
            root.generation = self.transid;
            return Ok(());
        }
        let parent = path[depth - 1];
        let ptrs = self.node_mut(parent.bytenr).key_ptrs_mut();
        for (i, p) in new_ptrs.into_iter().enumerate() {
            ptrs.insert(parent.slot + 1 + i, p);
        }
        self.split_if_needed(root, path, depth - 1)
    }

    /// Collapses an internal root with a single child onto the child, and
    /// an internal root left empty into an empty leaf.
    fn shrink_root(&mut self, root: &mut TreeRoot, node: Arc<Node>) -> Result<()> {
        let mut node = node;
        while !node.is_leaf() && node.nritems() == 1 {
            let p = node.key_ptrs()[0];
            let child_expect = NodeExpectation {
                tree: root.id,
                level: node.level - 1,
                generation: p.generation,
            };
            // A root node is never shared (S4): a shared child is
            // copied before it becomes the root.
            let child = if self.count_if_shared(root, p.blockptr, child_expect, false)? > 1 {
                let copy = self.cow(root, p.blockptr, child_expect, false)?;
                self.dirty[&copy].clone()
            } else {
                self.node(p.blockptr, child_expect)?
            };
            self.free_block(node.bytenr, root.id, node.level)?;
            *root = TreeRoot {
                bytenr: child.bytenr,
                level: child.level,
                generation: child.generation,
                ..*root
            };
            node = child;
        }
        if !node.is_leaf() && node.nritems() == 0 {
            self.free_block(node.bytenr, root.id, node.level)?;
            *root = TreeRoot {
                last_snapshot: root.last_snapshot,
                ..self.create_tree(root.id)?
            };
        }
        Ok(())
    }

    /// After a removal from `path[depth]`, merges it with a sibling if it
    /// got small, removes it if empty, and shrinks the root.
    fn rebalance(&mut self, root: &mut TreeRoot, path: &[PathStep], depth: usize) -> Result<()> {
        let bytenr = path[depth].bytenr;
        let node = self.dirty[&bytenr].clone();
        if depth == 0 {
            return self.shrink_root(root, node);
        }
        let parent = path[depth - 1];
        let (level, nritems, used) = (node.level, node.nritems(), node.used_bytes());
        drop(node);
        if nritems == 0 {
            self.free_block(bytenr, root.id, level)?;
            let ptrs = self.node_mut(parent.bytenr).key_ptrs_mut();
            ptrs.remove(parent.slot);
            if parent.slot == 0 && !ptrs.is_empty() {
                self.fix_low_keys(path, depth - 1);
            }
            return self.rebalance(root, path, depth - 1);
        }
        if used >= BODY_SIZE / 4 {
            return Ok(());
        }
        let (left_ptr, right_ptr) = {
            let ptrs = self.dirty[&parent.bytenr].key_ptrs();
            (
                parent.slot.checked_sub(1).map(|i| ptrs[i]),
                ptrs.get(parent.slot + 1).copied(),
            )
        };
        let sibling_expect = |p: &KeyPtr| NodeExpectation {
            tree: root.id,
            level,
            generation: p.generation,
        };
        if let Some(left_ptr) = left_ptr {
            // Merge this node into its left sibling.
            if self
                .node(left_ptr.blockptr, sibling_expect(&left_ptr))?
                .used_bytes()
                + used
                > BODY_SIZE
            {
                return Ok(());
            }
            let left_bytenr =
                self.cow(root, left_ptr.blockptr, sibling_expect(&left_ptr), false)?;
            let body =
                std::mem::replace(&mut self.node_mut(bytenr).body, NodeBody::Leaf(Vec::new()));
            append_body(self.node_mut(left_bytenr), body);
            self.free_block(bytenr, root.id, level)?;
            let transid = self.transid;
            let pptrs = self.node_mut(parent.bytenr).key_ptrs_mut();
            pptrs[parent.slot - 1].blockptr = left_bytenr;
            pptrs[parent.slot - 1].generation = transid;
            pptrs.remove(parent.slot);
        } else if let Some(right_ptr) = right_ptr {
            // Merge the right sibling into this node.
            let right = self.node(right_ptr.blockptr, sibling_expect(&right_ptr))?;
            if right.used_bytes() + used > BODY_SIZE {
                return Ok(());
            }
            let refs =
                self.count_if_shared(root, right_ptr.blockptr, sibling_expect(&right_ptr), false)?;
            append_body(self.node_mut(bytenr), right.body.clone());
            self.release_copied(root.id, &right, refs)?;
            drop(right);
            self.node_mut(parent.bytenr)
                .key_ptrs_mut()
                .remove(parent.slot + 1);
        } else {
            return Ok(());
        }
        self.stats.merges += 1;
        self.rebalance(root, path, depth - 1)
    }

    // ----- commit support -----

    /// Ends the running transaction's changes: hands over its dirty nodes
    /// (to be written) and starts transaction `transid + 1`.
    pub fn begin_commit(&mut self) -> Arc<HashMap<u64, Arc<Node>>> {
        assert!(
            self.log_dirty.is_empty(),
            "commit sealed while {} log nodes are unwritten",
            self.log_dirty.len()
        );
        let dirty = Arc::new(std::mem::take(&mut self.dirty));
        self.committing = dirty.clone();
        self.transid += 1;
        dirty
    }

    /// The committed nodes are on disk: serve them from the cache.
    pub fn end_commit(&mut self) {
        let written = std::mem::take(&mut self.committing);
        for node in written.values() {
            self.store.cache_written(node.clone());
        }
    }

    /// Hands the log trees' changed nodes to a log sync; later changes copy
    /// them again, so the log they form stays intact on disk.
    pub fn seal_log_nodes(&mut self) -> Arc<HashMap<u64, Arc<Node>>> {
        assert!(
            self.log_writing.is_empty(),
            "a log sync was sealed while another is being written"
        );
        let nodes: HashMap<u64, Arc<Node>> = self
            .log_dirty
            .drain()
            .map(|b| (b, self.dirty.remove(&b).expect("log dirty node is dirty")))
            .collect();
        self.log_writing = Arc::new(nodes);
        self.log_writing.clone()
    }

    /// The sealed log nodes are on disk: serve them from the cache.
    pub fn end_log_write(&mut self) {
        for node in std::mem::take(&mut self.log_writing).values() {
            self.store.cache_written(node.clone());
        }
    }

    /// Walks a whole tree and asserts the structural invariants (tests).
    #[cfg(test)]
    pub fn verify_tree(&self, root: &TreeRoot) -> Result<usize> {
        let mut count = 0;
        self.verify_node(
            root.bytenr,
            root.expectation(),
            None,
            None,
            true,
            &mut count,
        )?;
        Ok(count)
    }

    #[cfg(test)]
    fn verify_node(
        &self,
        bytenr: u64,
        expect: NodeExpectation,
        low: Option<Key>,
        high: Option<Key>,
        is_root: bool,
        count: &mut usize,
    ) -> Result<()> {
        let node = self.node(bytenr, expect)?;
        let fail = |reason: String| {
            Err(Error::corrupt(Corruption::at_block(
                Some(expect.tree),
                bytenr,
                None,
                reason,
            )))
        };
        if !node.fits() {
            return fail(format!("node overflows: {} bytes", node.used_bytes()));
        }
        if !is_root && node.nritems() == 0 {
            return fail("empty non-root node".into());
        }
        if let (Some(low), Some(first)) = (low, node.first_key()) {
            if first != low {
                return fail(format!("first key {first} differs from parent key {low}"));
            }
        }
        match &node.body {
            NodeBody::Leaf(items) => {
                for w in items.windows(2) {
                    if w[0].key >= w[1].key {
                        return fail(format!("keys out of order: {} then {}", w[0].key, w[1].key));
                    }
                }
                if let (Some(high), Some(last)) = (high, items.last()) {
                    if last.key >= high {
                        return fail(format!(
                            "key {} not below the next parent key {high}",
                            last.key
                        ));
                    }
                }
                *count += items.len();
            }
            NodeBody::Internal(ptrs) => {
                for (i, p) in ptrs.iter().enumerate() {
                    let next = ptrs.get(i + 1).map(|n| n.key).or(high);
                    let child = NodeExpectation {
                        tree: expect.tree,
                        level: expect.level - 1,
                        generation: p.generation,
                    };
                    self.verify_node(p.blockptr, child, Some(p.key), next, false, count)?;
                }
            }
        }
        Ok(())
    }
}

fn append_body(dst: &mut Node, src: NodeBody) {
    match (&mut dst.body, src) {
        (NodeBody::Leaf(a), NodeBody::Leaf(b)) => a.extend(b),
        (NodeBody::Internal(a), NodeBody::Internal(b)) => a.extend(b),
        _ => panic!("merging nodes of different levels"),
    }
}

/// The bytes an item takes in a leaf's body: its header and its data.
fn leaf_item_size(item: &LeafItem) -> usize {
    crate::format::node::LEAF_ITEM_HEADER_SIZE + item.data.len()
}

/// Splits an overfull leaf's items into pieces that each fit: two balanced
/// halves when possible, otherwise greedy packing (a very large item may
/// need a piece of its own).
fn split_leaf_items(items: Vec<LeafItem>) -> Vec<Vec<LeafItem>> {
    let sizes: Vec<usize> = items.iter().map(leaf_item_size).collect();
    let total: usize = sizes.iter().sum();
    let mut prefix = 0;
    let mut best: Option<(usize, usize)> = None;
    for (k, size) in sizes.iter().enumerate().take(sizes.len() - 1) {
        prefix += size;
        let (left, right) = (prefix, total - prefix);
        if left <= BODY_SIZE && right <= BODY_SIZE {
            let imbalance = left.abs_diff(right);
            if best.is_none_or(|(_, b)| imbalance < b) {
                best = Some((k + 1, imbalance));
            }
        }
    }
    if let Some((k, _)) = best {
        let mut items = items;
        let right = items.split_off(k);
        return vec![items, right];
    }
    let mut pieces = vec![Vec::new()];
    let mut used = 0;
    for (item, size) in items.into_iter().zip(sizes) {
        if used + size > BODY_SIZE {
            pieces.push(Vec::new());
            used = 0;
        }
        used += size;
        pieces.last_mut().expect("at least one piece").push(item);
    }
    pieces
}
