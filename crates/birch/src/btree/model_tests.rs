//! The B-tree against a `BTreeMap` model: random inserts, replacements,
//! deletes, lookups and range scans across many transactions, with the
//! structural invariants verified after every step. The node cache is tiny,
//! so committed nodes are evicted and re-read (decoded and validated) from
//! the device. Failures print `seed=N`; `BIRCH_SEED=N` replays one.

use super::{Change, Forest, NodeStore, TreeRoot};
use crate::alloc::{Allocator, FreeSpace, TransactionSpace};
use crate::device::{BlockDevice, MemoryDevice};
use crate::format::node::MAX_ITEM_DATA;
use crate::format::{Key, MetadataProfile, FIRST_ALLOCATABLE_BYTE};
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
