//! The B-tree against a `BTreeMap` model: random inserts, replacements,
//! deletes, lookups and range scans across many transactions, with the
//! structural invariants verified after every step. The node cache is tiny,
//! so committed nodes are evicted and re-read (decoded and validated) from
//! the device. Failures print `seed=N`; `BIRCH_SEED=N` replays one.

use super::{Change, DataRef, DropStep, Forest, NodeExpectation, NodeStore, TreeKind, TreeRoot};
use crate::alloc::{Allocator, ExtentItemChange, FreeSpace, TransactionSpace};
use crate::device::{BlockDevice, MemoryDevice};
use crate::format::node::MAX_ITEM_DATA;
use crate::format::{
    item_type, ExtentItem, Key, LeafItem, MetadataProfile, NodeBody, FIRST_ALLOCATABLE_BYTE,
    NODE_SIZE,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;

const DEVICE_BYTES: u64 = 256 << 20;

fn new_forest() -> Forest<Arc<MemoryDevice>> {
    let dev = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let mut free = FreeSpace::default();
    free.add(
        FIRST_ALLOCATABLE_BYTE,
        DEVICE_BYTES - FIRST_ALLOCATABLE_BYTE,
    );
    // One copy per node: this test writes nodes itself, primaries only.
    let profile = MetadataProfile::Single;
    let store = Arc::new(NodeStore::new(dev, [9; 16], profile, 8));
    Forest::new(store, Allocator::new(free, 0, DEVICE_BYTES, profile), 1)
}

/// Writes the transaction's nodes and releases what it freed, as a commit
/// does (without an extent tree: this test is about the B-tree alone).
fn commit(forest: &mut Forest<Arc<MemoryDevice>>) {
    forest.alloc_mut().take_delayed_refs();
    let pinned = forest.alloc_mut().take_pinned();
    let nodes = forest.begin_commit();
    for node in nodes.values() {
        forest
            .store()
            .device()
            .write_at(&node.encode(&[9; 16]), node.bytenr)
            .unwrap();
    }
    forest.end_commit();
    forest.alloc_mut().unpin(pinned);
}

fn random_key(rng: &mut ChaCha8Rng, key_space: u64) -> Key {
    Key::new(
        rng.gen_range(0..key_space),
        rng.gen_range(0..3),
        rng.gen_range(0..4),
    )
}

fn random_value(rng: &mut ChaCha8Rng) -> Vec<u8> {
    let len = match rng.gen_range(0..100) {
        0 => rng.gen_range(4000..=MAX_ITEM_DATA),
        1..=10 => rng.gen_range(500..3000),
        _ => rng.gen_range(0..120),
    };
    (0..len).map(|_| rng.gen()).collect()
}

/// A sorted batch of changes for `Forest::apply_sorted`: up to a few
/// hundred keys from a window of the key space (narrow windows give dense
/// runs that fill and split leaves, wide ones scattered single changes),
/// deletions biased toward present keys.
fn random_batch(
    rng: &mut ChaCha8Rng,
    model: &BTreeMap<Key, Vec<u8>>,
    key_space: u64,
) -> Vec<(Key, Change)> {
    let width = rng.gen_range(1..=key_space);
    let base = rng.gen_range(0..=key_space - width);
    let count = rng.gen_range(1..400);
    let mut batch = BTreeMap::new();
    for _ in 0..count {
        let key = Key::new(
            base + rng.gen_range(0..width),
            rng.gen_range(0..3),
            rng.gen_range(0..4),
        );
        let key = match model.range(key..).next() {
            Some((present, _)) if rng.gen_bool(0.5) => *present,
            _ => key,
        };
        let change = match rng.gen_range(0..3) {
            0 => Change::Insert(random_value(rng)),
            1 => Change::Put(random_value(rng)),
            _ => Change::Delete,
        };
        batch.insert(key, change);
    }
    batch.into_iter().collect()
}

/// Runs `steps` random operations; walks the whole tree to verify its
/// invariants every `verify_every` steps.
///
/// Long because it is one loop with one short arm per operation, each
/// applying it to the tree and the model and comparing at once; split up,
/// every arm would take the tree, the model and the generator as
/// arguments and the comparison would read further from the operation.
fn run(seed: u64, steps: usize, key_space: u64, verify_every: usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut forest = new_forest();
    let mut root: TreeRoot = forest.create_tree(5).unwrap();
    let mut model: BTreeMap<Key, Vec<u8>> = BTreeMap::new();
    for step in 0..steps {
        let ctx = format!("seed={seed} step={step}");
        match rng.gen_range(0..100) {
            0..=39 => {
                let (k, v) = (random_key(&mut rng, key_space), random_value(&mut rng));
                let result = forest.insert(&mut root, k, v.clone());
                if let std::collections::btree_map::Entry::Vacant(e) = model.entry(k) {
                    result.unwrap_or_else(|e| panic!("{ctx}: insert {k}: {e}"));
                    e.insert(v);
                } else {
                    assert!(
                        matches!(result, Err(crate::Error::Exists)),
                        "{ctx}: insert of present key {k}"
                    );
                }
            }
            40..=54 => {
                let (k, v) = (random_key(&mut rng, key_space), random_value(&mut rng));
                forest
                    .put(&mut root, k, v.clone())
                    .unwrap_or_else(|e| panic!("{ctx}: put {k}: {e}"));
                model.insert(k, v);
            }
            55..=84 => {
                // Delete, biased toward keys that exist.
                let k = match model.keys().nth(rng.gen_range(0..model.len().max(1))) {
                    Some(k) if rng.gen_bool(0.9) => *k,
                    _ => random_key(&mut rng, key_space),
                };
                let got = forest
                    .delete(&mut root, &k)
                    .unwrap_or_else(|e| panic!("{ctx}: delete {k}: {e}"));
                assert_eq!(got, model.remove(&k), "{ctx}: delete {k}");
            }
            85..=92 => {
                let k = random_key(&mut rng, key_space);
                assert_eq!(
                    forest.get(&root, &k).unwrap(),
                    model.get(&k).cloned(),
                    "{ctx}: get {k}"
                );
                let before = forest.last_at_or_before(&root, &k).unwrap();
                assert_eq!(
                    before,
                    model.range(..=k).next_back().map(|(k, v)| (*k, v.clone())),
                    "{ctx}: last_at_or_before {k}"
                );
            }
            93..=95 => {
                let (a, b) = (
                    random_key(&mut rng, key_space),
                    random_key(&mut rng, key_space),
                );
                let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
                let limit = rng.gen_range(1..50);
                let mut got = Vec::new();
                forest
                    .scan(&root, lo, hi, &mut |k, v| {
                        got.push((*k, v.to_vec()));
                        Ok(if got.len() >= limit {
                            ControlFlow::Break(())
                        } else {
                            ControlFlow::Continue(())
                        })
                    })
                    .unwrap();
                let want: Vec<_> = model
                    .range(lo..=hi)
                    .take(limit)
                    .map(|(k, v)| (*k, v.clone()))
                    .collect();
                assert_eq!(got, want, "{ctx}: scan {lo}..={hi} limit {limit}");
            }
            96..=97 => {
                let changes = random_batch(&mut rng, &model, key_space);
                let refused = forest
                    .apply_sorted(&mut root, changes.clone())
                    .unwrap_or_else(|e| panic!("{ctx}: batch: {e}"));
                let mut want_refused = Vec::new();
                for (k, change) in changes {
                    match change {
                        Change::Insert(_) if model.contains_key(&k) => want_refused.push(k),
                        Change::Insert(v) | Change::Put(v) => {
                            model.insert(k, v);
                        }
                        Change::Delete => {
                            if model.remove(&k).is_none() {
                                want_refused.push(k);
                            }
                        }
                    }
                }
                assert_eq!(refused, want_refused, "{ctx}: batch refused");
            }
            _ => commit(&mut forest),
        }
        if step % verify_every == 0 {
            let count = forest
                .verify_tree(&root)
                .unwrap_or_else(|e| panic!("{ctx}: invariant broken: {e}"));
            assert_eq!(count, model.len(), "{ctx}: item count");
        }
    }
    commit(&mut forest);
    let all = forest.collect_range(&root, Key::MIN, Key::MAX).unwrap();
    assert_eq!(
        all,
        model.into_iter().collect::<Vec<_>>(),
        "seed={seed}: final contents"
    );
    // Drop everything: the tree collapses back to one empty leaf.
    for (k, _) in all {
        forest.delete(&mut root, &k).unwrap();
    }
    assert_eq!(
        root.level, 0,
        "seed={seed}: empty tree keeps height {}",
        root.level
    );
    forest.verify_tree(&root).unwrap();
}

fn seeds(default: std::ops::Range<u64>) -> Vec<u64> {
    match std::env::var("BIRCH_SEED") {
        Ok(s) => vec![s.parse().expect("BIRCH_SEED must be a number")],
        Err(_) => default.collect(),
    }
}

#[test]
fn btree_matches_model_small_key_space() {
    // Few keys: constant collisions, replacements, splits and merges of
    // the same nodes.
    for seed in seeds(0..20) {
        run(seed, 3000, 300, 1);
    }
}

#[test]
fn btree_matches_model_deep_trees() {
    // Many keys: trees three levels deep, with internal splits and merges.
    for seed in seeds(100..103) {
        run(seed, 60_000, 1_000_000, 997);
    }
}

#[test]
fn a_node_is_copied_at_most_once_per_transaction() {
    let mut forest = new_forest();
    let mut root = forest.create_tree(5).unwrap();
    for i in 0..2000u64 {
        forest
            .insert(&mut root, Key::new(i, 1, 0), vec![0; 50])
            .unwrap();
    }
    commit(&mut forest);
    let before = forest.stats.nodes_cowed;
    forest
        .put(&mut root, Key::new(7, 1, 0), vec![1; 50])
        .unwrap();
    let first = forest.stats.nodes_cowed - before;
    assert_eq!(
        first,
        u64::from(root.level) + 1,
        "one copy per level on the first change"
    );
    forest
        .put(&mut root, Key::new(8, 1, 0), vec![1; 50])
        .unwrap();
    assert_eq!(
        forest.stats.nodes_cowed - before,
        first,
        "the same path is not copied again in the same transaction"
    );
}

#[test]
fn a_batch_far_larger_than_a_leaf_fills_and_empties_a_tree() {
    // A commit appends every new node's extent item at the end of the
    // extent tree in one batch: tens of thousands of keys past the last
    // leaf, which must split as it goes rather than all at once.
    let mut forest = new_forest();
    let mut root = forest.create_tree(5).unwrap();
    let keys: Vec<Key> = (0..200_000u64).map(|i| Key::new(i, 1, 0)).collect();
    let inserts = keys.iter().map(|k| (*k, Change::Insert(vec![7; 100])));
    let refused = forest.apply_sorted(&mut root, inserts.collect()).unwrap();
    assert!(refused.is_empty());
    assert_eq!(forest.verify_tree(&root).unwrap(), keys.len());
    assert!(root.level >= 2, "200,000 items make a tree of height 3");
    commit(&mut forest);
    let mut deletes: Vec<(Key, Change)> = keys.iter().map(|k| (*k, Change::Delete)).collect();
    deletes.push((Key::new(300_000, 1, 0), Change::Delete));
    let refused = forest.apply_sorted(&mut root, deletes).unwrap();
    assert_eq!(
        refused,
        vec![Key::new(300_000, 1, 0)],
        "only the absent key"
    );
    assert_eq!(forest.verify_tree(&root).unwrap(), 0);
    assert_eq!(root.level, 0, "an emptied tree collapses to one leaf");
}

// ----- shared trees: snapshots and their reference counts -----

/// Item type whose items hold a data extent reference: 8 bytes, the
/// extent's address (every test extent is one sector long).
const DATA_REF_TYPE: u8 = 1;
const DATA_EXTENT_BYTES: u64 = 4096;

/// Subvolume ids are shareable, the extent tree is committed: as the fs
/// layer's `tree_kind`.
fn shared_tree_kind(tree: u64) -> TreeKind {
    if crate::format::tree_id::is_subvolume(tree) {
        TreeKind::Shareable
    } else {
        TreeKind::Committed
    }
}

fn data_ref_of(item: &LeafItem) -> Option<DataRef> {
    (item.key.item_type == DATA_REF_TYPE).then(|| DataRef {
        bytenr: u64::from_le_bytes(item.data[..8].try_into().expect("8-byte data ref")),
        num_bytes: DATA_EXTENT_BYTES,
        owner: item.key.objectid,
    })
}

fn data_ref_value(bytenr: u64) -> Vec<u8> {
    bytenr.to_le_bytes().to_vec()
}

/// A forest of shareable trees with an extent tree that records their
/// counts, committed as the fs layer commits (delayed refs applied with
/// [`crate::alloc::DelayedRef::apply`] until the extent tree settles).
struct Shared {
    forest: Forest<Arc<MemoryDevice>>,
    extent: TreeRoot,
    /// Live trees and their models.
    trees: Vec<(TreeRoot, BTreeMap<Key, Vec<u8>>)>,
    next_id: u64,
    /// Data extents that may still hold references.
    data: std::collections::BTreeSet<u64>,
}

impl Shared {
    fn new() -> Shared {
        let forest = new_forest()
            .with_tree_kinds(shared_tree_kind)
            .with_leaf_refs(data_ref_of);
        let mut shared = Shared {
            forest,
            extent: TreeRoot {
                id: 0,
                bytenr: 0,
                level: 0,
                generation: 0,
                last_snapshot: 0,
            },
            trees: Vec::new(),
            next_id: crate::format::tree_id::FIRST_SUBVOL,
            data: Default::default(),
        };
        shared.extent = shared
            .forest
            .create_tree(crate::format::tree_id::EXTENT)
            .unwrap();
        let fs = shared
            .forest
            .create_tree(crate::format::tree_id::FS)
            .unwrap();
        shared.trees.push((fs, BTreeMap::new()));
        shared.commit("setup");
        shared
    }

    /// Applies the delayed refs to the extent tree until it stops
    /// changing, writes the transaction's nodes, releases what it freed.
    fn commit(&mut self, ctx: &str) {
        let transid = self.forest.transid();
        loop {
            let refs = self.forest.alloc_mut().take_delayed_refs();
            if refs.is_empty() {
                break;
            }
            let mut changes = Vec::new();
            for (bytenr, r) in refs {
                let key = r.item_key(bytenr);
                let current = r.reads_item().then(|| {
                    let data = self.forest.get(&self.extent, &key).unwrap();
                    let data = data.unwrap_or_else(|| panic!("{ctx}: no extent item {key}"));
                    ExtentItem::decode(&data).unwrap()
                });
                let applied = r
                    .apply(current, transid)
                    .unwrap_or_else(|e| panic!("{ctx}: {key}: {e}"));
                let change = match applied.change {
                    ExtentItemChange::Keep => None,
                    ExtentItemChange::Insert(item) => Some(Change::Insert(item.encode())),
                    ExtentItemChange::Update(item) => Some(Change::Put(item.encode())),
                    ExtentItemChange::Delete => Some(Change::Delete),
                };
                changes.extend(change.map(|c| (key, c)));
                if applied.frees_data {
                    self.forest.alloc_mut().extent_released(bytenr, r.num_bytes);
                }
            }
            let refused = self.forest.apply_sorted(&mut self.extent, changes).unwrap();
            assert!(refused.is_empty(), "{ctx}: refused {refused:?}");
            self.forest.set_refs_root(self.extent);
        }
        let pinned = self.forest.alloc_mut().take_pinned();
        let nodes = self.forest.begin_commit();
        for node in nodes.values() {
            let dev = self.forest.store().device();
            dev.write_at(&node.encode(&[9; 16]), node.bytenr).unwrap();
        }
        self.forest.end_commit();
        self.forest.alloc_mut().unpin(pinned);
    }

    /// The count of the extent at `bytenr` (`key`): its item's refs plus
    /// the pending change.
    fn recorded_refs(&self, bytenr: u64, key: Key) -> i64 {
        let (created, delta) = self.forest.alloc.pending_ref_delta(bytenr);
        let item = if created {
            0
        } else {
            self.forest
                .get(&self.extent, &key)
                .unwrap()
                .map_or(0, |d| ExtentItem::decode(&d).unwrap().refs as i64)
        };
        item + delta
    }

    /// Recomputes every count from scratch: each node's distinct parents
    /// (+1 for a root), each data extent's items counted once per leaf;
    /// compares them with the extent tree and delayed refs, and each tree
    /// with its model. After a commit, also that the extent tree records
    /// exactly the reachable nodes: none freed early, none leaked.
    fn verify(&self, ctx: &str, committed: bool) {
        let mut node_refs: BTreeMap<u64, (u8, u64)> = BTreeMap::new();
        let mut data_refs: BTreeMap<u64, i64> = BTreeMap::new();
        for (root, model) in &self.trees {
            let count = self
                .forest
                .verify_tree(root)
                .unwrap_or_else(|e| panic!("{ctx}: tree {} broken: {e}", root.id));
            assert_eq!(count, model.len(), "{ctx}: tree {} item count", root.id);
            let all = self.forest.collect_range(root, Key::MIN, Key::MAX).unwrap();
            assert!(
                all.iter().map(|(k, v)| (k, v)).eq(model.iter()),
                "{ctx}: tree {} differs from its model",
                root.id
            );
            node_refs.entry(root.bytenr).or_insert((root.level, 0)).1 += 1;
            let mut stack = vec![(root.bytenr, root.expectation())];
            while let Some((bytenr, expect)) = stack.pop() {
                let node = self.forest.node(bytenr, expect).unwrap();
                match &node.body {
                    NodeBody::Leaf(items) => {
                        for r in items.iter().filter_map(data_ref_of) {
                            *data_refs.entry(r.bytenr).or_default() += 1;
                        }
                    }
                    NodeBody::Internal(ptrs) => {
                        for p in ptrs {
                            let child = node_refs.entry(p.blockptr).or_insert((node.level - 1, 0));
                            child.1 += 1;
                            // A child seen before is shared: its subtree
                            // is counted once.
                            if child.1 == 1 {
                                let expect = NodeExpectation {
                                    tree: root.id,
                                    level: node.level - 1,
                                    generation: p.generation,
                                };
                                stack.push((p.blockptr, expect));
                            }
                        }
                    }
                }
            }
        }
        for (root, _) in &self.trees {
            assert_eq!(
                node_refs[&root.bytenr].1, 1,
                "{ctx}: the root node of tree {} is shared (S4)",
                root.id
            );
        }
        for (&bytenr, &(level, want)) in &node_refs {
            let got = self.forest.refs(bytenr, level).unwrap();
            assert_eq!(got, want, "{ctx}: refs of node {bytenr} (level {level})");
        }
        for &bytenr in self.data.iter().chain(data_refs.keys()) {
            let key = Key::new(bytenr, item_type::EXTENT_ITEM, DATA_EXTENT_BYTES);
            let want = data_refs.get(&bytenr).copied().unwrap_or(0);
            assert_eq!(
                self.recorded_refs(bytenr, key),
                want,
                "{ctx}: refs of data extent {bytenr}"
            );
        }
        if committed {
            let mut recorded = BTreeMap::new();
            let items = self
                .forest
                .collect_range(&self.extent, Key::MIN, Key::MAX)
                .unwrap();
            for (key, data) in items {
                if key.item_type == item_type::METADATA_ITEM {
                    recorded.insert(key.objectid, ExtentItem::decode(&data).unwrap().refs);
                }
            }
            let extent_nodes = self.forest.tree_blocks(&self.extent).unwrap();
            let mut want: BTreeMap<u64, u64> =
                node_refs.iter().map(|(&b, &(_, r))| (b, r)).collect();
            want.extend(extent_nodes.into_iter().map(|b| (b, 1)));
            assert_eq!(recorded, want, "{ctx}: metadata items after the commit");
        }
    }

    /// A new data extent with no references yet.
    fn new_data_extent(&mut self) -> u64 {
        let (bytenr, len) = self
            .forest
            .alloc_mut()
            .alloc_data(DATA_EXTENT_BYTES, 257, 0)
            .unwrap();
        assert_eq!(len, DATA_EXTENT_BYTES);
        self.data.insert(bytenr);
        bytenr
    }

    fn data_ref_change(&mut self, value: &[u8], delta: i64) {
        let bytenr = u64::from_le_bytes(value[..8].try_into().unwrap());
        self.forest
            .alloc_mut()
            .add_data_ref(bytenr, DATA_EXTENT_BYTES, 257, delta);
    }

    /// Forgets the data extents the last commit released.
    fn forget_released_data(&mut self) {
        let extent = self.extent;
        let forest = &self.forest;
        self.data.retain(|&b| {
            let key = Key::new(b, item_type::EXTENT_ITEM, DATA_EXTENT_BYTES);
            forest.get(&extent, &key).unwrap().is_some()
        });
    }
}

/// Runs `steps` random changes over a tree and its snapshots (and theirs),
/// recomputing every count after each step.
///
/// Long because it is one loop with one short arm per operation (change
/// an item, a batch, snapshot, drop, commit) that applies it to the trees,
/// the models and the data references together; split up, each arm would
/// take all of them as arguments.
fn run_shared(seed: u64, steps: usize, key_space: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut s = Shared::new();
    for step in 0..steps {
        let ctx = format!("seed={seed} step={step} (replay: BIRCH_SEED={seed})");
        let t = rng.gen_range(0..s.trees.len());
        let mut committed = false;
        match rng.gen_range(0..100) {
            0..=44 => {
                // Insert or replace; a data reference to a new extent or,
                // as a reflink does, to one this tree already uses.
                let mut k = random_key(&mut rng, key_space);
                let v = if rng.gen_bool(0.4) {
                    k.item_type = DATA_REF_TYPE;
                    let reused = s.trees[t]
                        .1
                        .iter()
                        .filter(|(k, _)| k.item_type == DATA_REF_TYPE)
                        .map(|(_, v)| v.clone())
                        .nth(rng.gen_range(0..8));
                    let v = match reused {
                        Some(v) if rng.gen_bool(0.5) => v,
                        _ => data_ref_value(s.new_data_extent()),
                    };
                    s.data_ref_change(&v, 1);
                    v
                } else {
                    k.item_type = [0, 2][rng.gen_range(0..2)];
                    random_value(&mut rng)
                };
                let (root, model) = &mut s.trees[t];
                s.forest
                    .put(root, k, v.clone())
                    .unwrap_or_else(|e| panic!("{ctx}: put {k}: {e}"));
                if let Some(old) = model.insert(k, v) {
                    if k.item_type == DATA_REF_TYPE {
                        s.data_ref_change(&old, -1);
                    }
                }
            }
            45..=79 => {
                let (root, model) = &mut s.trees[t];
                let k = match model.keys().nth(rng.gen_range(0..model.len().max(1))) {
                    Some(k) if rng.gen_bool(0.9) => *k,
                    _ => random_key(&mut rng, key_space),
                };
                let got = s
                    .forest
                    .delete(root, &k)
                    .unwrap_or_else(|e| panic!("{ctx}: delete {k}: {e}"));
                let want = model.remove(&k);
                assert_eq!(got, want, "{ctx}: delete {k}");
                if let (Some(old), DATA_REF_TYPE) = (want, k.item_type) {
                    s.data_ref_change(&old, -1);
                }
            }
            80..=84 => {
                // A batch of plain items (no data references).
                let (root, model) = &mut s.trees[t];
                let changes: Vec<(Key, Change)> = random_batch(&mut rng, model, key_space)
                    .into_iter()
                    .filter(|(k, _)| k.item_type != DATA_REF_TYPE)
                    .collect();
                s.forest
                    .apply_sorted(root, changes.clone())
                    .unwrap_or_else(|e| panic!("{ctx}: batch: {e}"));
                for (k, change) in changes {
                    match change {
                        Change::Insert(v) => {
                            model.entry(k).or_insert(v);
                        }
                        Change::Put(v) => {
                            model.insert(k, v);
                        }
                        Change::Delete => {
                            model.remove(&k);
                        }
                    }
                }
            }
            85..=89 if s.trees.len() < 6 => {
                let id = s.next_id;
                s.next_id += 1;
                let (root, model) = &mut s.trees[t];
                let copy = s
                    .forest
                    .copy_root(root, id)
                    .unwrap_or_else(|e| panic!("{ctx}: snapshot of {}: {e}", root.id));
                let model = model.clone();
                s.trees.push((copy, model));
            }
            90..=92 if s.trees.len() > 1 => {
                let (root, model) = s.trees.swap_remove(t);
                s.forest
                    .drop_tree(&root)
                    .unwrap_or_else(|e| panic!("{ctx}: drop of {}: {e}", root.id));
                drop(model);
            }
            _ => {
                s.commit(&ctx);
                s.forget_released_data();
                committed = true;
            }
        }
        s.verify(&ctx, committed);
    }
    // Drop every snapshot: what remains is the first tree's alone.
    while s.trees.len() > 1 {
        let (root, _) = s.trees.pop().unwrap();
        s.forest.drop_tree(&root).unwrap();
    }
    s.commit(&format!("seed={seed} end"));
    s.forget_released_data();
    s.verify(&format!("seed={seed} end"), true);
}

#[test]
fn shared_trees_match_their_model_and_counts() {
    // A small key space: few leaves, so snapshots share most of them and
    // every change copies shared nodes.
    for seed in seeds(0..12) {
        run_shared(seed, 800, 400);
    }
    // Trees three levels deep: shared internal nodes.
    for seed in seeds(1000..1002) {
        run_shared(seed, 1500, 1_000_000);
    }
}

/// Fills tree 5 over several leaves and internal nodes, snapshots it as
/// 256, changes some of each, and drops 256: exactly the blocks and data
/// extents only 256 held become free.
#[test]
fn dropping_a_copy_frees_exactly_the_blocks_only_it_held() {
    drop_copy_and_compare(|s, snap| {
        s.forest.drop_tree(snap).unwrap();
        s.commit("dropped");
    });
}

/// The same drop in bounded steps, each committed with its progress, as
/// the cleaner does (docs/SNAPSHOTS.md (d)): the same blocks become free.
#[test]
fn dropping_a_copy_in_steps_frees_exactly_the_blocks_only_it_held() {
    drop_copy_and_compare(|s, snap| {
        let steps = drop_in_steps(s, snap, 5, |_| {});
        assert!(steps > 10, "several steps ({steps})");
    });
}

/// Drops `snap` `budget` nodes at a time, committing after each step (the
/// progress passed on as the root item carries it) and running `between`
/// after each; returns the number of steps.
fn drop_in_steps(
    s: &mut Shared,
    snap: &TreeRoot,
    budget: usize,
    mut between: impl FnMut(&mut Shared),
) -> usize {
    let mut progress = Key::MIN;
    let mut steps = 0;
    loop {
        steps += 1;
        let step = s.forest.drop_tree_step(snap, progress, budget).unwrap();
        s.commit("drop step");
        match step {
            DropStep::Done => return steps,
            DropStep::Paused(p) => {
                assert!(p > progress, "a step makes progress");
                progress = p;
            }
        }
        between(s);
    }
}

/// A snapshot is dropped in steps while its source keeps changing (the
/// Forest-level `delete_snapshot_after_source_changed` of docs/SNAPSHOTS.md
/// (i)): the source CoWs nodes it shares with the dead copy between the
/// steps, so the drop meets counts that went from 2 to 1 under it. At the
/// end the counts recomputed from the source alone match the extent tree
/// exactly (no leak, nothing freed twice) and the source is intact.
#[test]
fn delete_snapshot_after_source_changed() {
    let mut s = Shared::new();
    let (mut fs, mut model) = s.trees.pop().unwrap();
    for i in 0..3000u64 {
        let bytenr = s.new_data_extent();
        let mut value = data_ref_value(bytenr);
        value.resize(4000, 0);
        s.data_ref_change(&value, 1);
        let key = Key::new(i, DATA_REF_TYPE, 0);
        s.forest.put(&mut fs, key, value.clone()).unwrap();
        model.insert(key, value);
    }
    assert!(fs.level >= 2, "deep enough to share internal nodes");
    s.trees.push((fs, model));
    s.commit("filled");
    let (fs, _) = &mut s.trees[0];
    let snap = s.forest.copy_root(fs, 256).unwrap();
    s.commit("snapshot");
    // The source rewrites a quarter of its items before the drop starts
    // (the rest stays shared) ...
    for i in (0..750u64).step_by(2) {
        rewrite_source_item(&mut s, i);
    }
    s.commit("source changed");
    // ... and keeps changing between the drop's steps, from the far end
    // inwards, so that it copies nodes the drop has not reached yet.
    let mut next = 2999u64;
    let steps = drop_in_steps(&mut s, &snap, 7, |s| {
        for _ in 0..4 {
            rewrite_source_item(s, next);
            next = next.checked_sub(37).unwrap_or(2998);
        }
    });
    assert!(steps > 10, "several steps ({steps})");
    s.forget_released_data();
    s.verify("dropped", true);
}

/// Replaces item `i` of tree 5 with a reference to a new data extent.
fn rewrite_source_item(s: &mut Shared, i: u64) {
    let bytenr = s.new_data_extent();
    let mut value = data_ref_value(bytenr);
    value.resize(4000, 0);
    s.data_ref_change(&value, 1);
    let key = Key::new(i, DATA_REF_TYPE, 0);
    let (fs, model) = &mut s.trees[0];
    s.forest.put(fs, key, value.clone()).unwrap();
    if let Some(old) = model.insert(key, value) {
        s.data_ref_change(&old, -1);
    }
}

/// Fills tree 5, snapshots it, changes both, drops the copy with `drop`
/// (which commits), and checks that exactly the blocks and data extents
/// only the copy held became free.
fn drop_copy_and_compare(drop: impl FnOnce(&mut Shared, &TreeRoot)) {
    let mut s = Shared::new();
    let (mut fs, mut model) = s.trees.pop().unwrap();
    for i in 0..10_000u64 {
        let bytenr = s.new_data_extent();
        // Large items: few per leaf, so the tree is three levels deep.
        let mut value = data_ref_value(bytenr);
        value.resize(1000, 0);
        s.data_ref_change(&value, 1);
        let key = Key::new(i, DATA_REF_TYPE, 0);
        s.forest.put(&mut fs, key, value.clone()).unwrap();
        model.insert(key, value);
    }
    assert!(fs.level >= 2, "deep enough to share internal nodes");
    s.trees.push((fs, model));
    s.commit("filled");
    let (fs, model) = &mut s.trees[0];
    let mut snap = s.forest.copy_root(fs, 256).unwrap();
    let mut snap_model = model.clone();
    s.commit("snapshot");
    // Each tree deletes a few items of its own: each gets nodes of its own.
    for i in (0..10_000u64).step_by(1500) {
        let key = Key::new(i, DATA_REF_TYPE, 0);
        let (fs, model) = &mut s.trees[0];
        s.forest.delete(fs, &key).unwrap();
        let old = model.remove(&key).unwrap();
        s.data_ref_change(&old, -1);
        let key = Key::new(i + 1, DATA_REF_TYPE, 0);
        s.forest.delete(&mut snap, &key).unwrap();
        let old = snap_model.remove(&key).unwrap();
        s.data_ref_change(&old, -1);
    }
    s.trees.push((snap, snap_model));
    s.commit("changed");
    s.forget_released_data();
    s.verify("changed", true);
    let blocks_of = |s: &Shared, root: &TreeRoot| -> std::collections::BTreeSet<u64> {
        s.forest.tree_blocks(root).unwrap().into_iter().collect()
    };
    let data_of = |model: &BTreeMap<Key, Vec<u8>>| -> std::collections::BTreeSet<u64> {
        model
            .values()
            .map(|v| u64::from_le_bytes(v[..8].try_into().unwrap()))
            .collect()
    };
    let (fs_blocks, fs_data) = (blocks_of(&s, &s.trees[0].0), data_of(&s.trees[0].1));
    let (snap, snap_model) = s.trees.pop().unwrap();
    let (snap_blocks, snap_data) = (blocks_of(&s, &snap), data_of(&snap_model));
    let only_snap: Vec<u64> = snap_blocks.difference(&fs_blocks).copied().collect();
    let only_snap_data: Vec<u64> = snap_data.difference(&fs_data).copied().collect();
    assert!(!only_snap.is_empty() && !only_snap_data.is_empty());
    assert!(
        fs_blocks.intersection(&snap_blocks).count() > only_snap.len(),
        "mostly shared"
    );
    let free_before = s.forest.alloc().free_bytes();
    let extent_nodes_before = s.forest.tree_blocks(&s.extent).unwrap().len() as u64;
    drop(&mut s, &snap);
    s.forget_released_data();
    s.verify("dropped", true);
    let node = NODE_SIZE as u64;
    for &b in &only_snap {
        assert!(
            s.forest.alloc().is_free(b, node),
            "node {b} only the copy held is free"
        );
    }
    for &b in &fs_blocks {
        assert!(
            !s.forest.alloc().is_free(b, node),
            "node {b} of tree 5 is kept"
        );
    }
    for &b in &only_snap_data {
        assert!(
            s.forest.alloc().is_free(b, DATA_EXTENT_BYTES),
            "data {b} only the copy used is free"
        );
    }
    for &b in &fs_data {
        assert!(
            !s.forest.alloc().is_free(b, DATA_EXTENT_BYTES),
            "data {b} of tree 5 is kept"
        );
    }
    // Nothing else was freed: the free space grew by exactly those, less
    // the nodes the extent tree grew by.
    let extent_nodes_after = s.forest.tree_blocks(&s.extent).unwrap().len() as u64;
    let freed = only_snap.len() as u64 * node + only_snap_data.len() as u64 * DATA_EXTENT_BYTES;
    assert_eq!(
        s.forest.alloc().free_bytes() + extent_nodes_after * node,
        free_before + freed + extent_nodes_before * node
    );
}

/// A copy whose root is left with one child that it still shares (its
/// other leaf emptied by a batch) makes that child its root: the child is
/// copied first, since a root node is never shared (S4).
#[test]
fn a_copy_collapsing_onto_a_shared_child_copies_it() {
    let mut s = Shared::new();
    let (fs, model) = &mut s.trees[0];
    for i in 0..20u64 {
        let key = Key::new(i, 0, 0);
        s.forest.put(fs, key, vec![7; 1000]).unwrap();
        model.insert(key, vec![7; 1000]);
    }
    let ptrs = s.forest.node(fs.bytenr, fs.expectation()).unwrap();
    assert_eq!(ptrs.key_ptrs().len(), 2, "two leaves under the root");
    let second_leaf_start = ptrs.key_ptrs()[1].key;
    s.commit("filled");
    let (fs, model) = &mut s.trees[0];
    let copy = s.forest.copy_root(fs, 256).unwrap();
    let copy_model = model.clone();
    s.trees.push((copy, copy_model));
    s.commit("snapshot");
    let (copy, copy_model) = &mut s.trees[1];
    let deletes: Vec<(Key, Change)> = copy_model
        .range(second_leaf_start..)
        .map(|(k, _)| (*k, Change::Delete))
        .collect();
    s.forest.apply_sorted(copy, deletes).unwrap();
    copy_model.retain(|k, _| *k < second_leaf_start);
    assert_eq!(copy.level, 0, "the copy collapsed onto its first leaf");
    s.verify("collapsed", false);
    // Changing the copy's new root leaves tree 5 as it was.
    let (copy, copy_model) = &mut s.trees[1];
    s.forest.put(copy, Key::new(0, 0, 0), vec![8; 10]).unwrap();
    copy_model.insert(Key::new(0, 0, 0), vec![8; 10]);
    s.verify("changed", false);
    s.commit("end");
    s.verify("end", true);
}
