//! A bounded cache of clean (on-disk) nodes, evicted with the CLOCK
//! second-chance policy, and shrunk to a smaller idle target on request
//! (docs/MEMORY.md).

use crate::format::Node;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

pub struct NodeCache {
    entries: HashMap<u64, (Arc<Node>, bool)>,
    /// The CLOCK hand's order. Blocks removed (freed) leave their number
    /// here until the hand passes it or `compact_clock` drops it.
    clock: VecDeque<u64>,
    capacity: usize,
}

impl NodeCache {
    pub fn new(capacity: usize) -> NodeCache {
        assert!(capacity > 0);
        NodeCache {
            entries: HashMap::new(),
            clock: VecDeque::new(),
            capacity,
        }
    }

    pub fn get(&mut self, bytenr: u64) -> Option<Arc<Node>> {
        let (node, referenced) = self.entries.get_mut(&bytenr)?;
        *referenced = true;
        Some(node.clone())
    }

    pub fn insert(&mut self, node: Arc<Node>) {
        let bytenr = node.bytenr;
        if self.entries.insert(bytenr, (node, false)).is_some() {
            return;
        }
        self.clock.push_back(bytenr);
        self.evict_to(self.capacity);
        // Copy-on-write frees (removes) a cached block for nearly every
        // one it inserts, so the cache can stay under its capacity while
        // the hand never moves: without this the numbers of freed blocks
        // piled up in `clock` for as long as the mount lived.
        if self.clock.len() > 2 * self.entries.len() + 64 {
            self.compact_clock();
        }
    }

    /// Forgets a block that was freed: its bytes may be reused.
    pub fn remove(&mut self, bytenr: u64) {
        self.entries.remove(&bytenr);
    }

    /// Nodes held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Nodes held at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Evicts (second chance first, as when full) down to `target` nodes
    /// and gives the bookkeeping's spare room back to the allocator.
    pub fn shrink_to(&mut self, target: usize) {
        self.evict_to(target);
        self.compact_clock();
        self.entries.shrink_to_fit();
        self.clock.shrink_to_fit();
    }

    fn evict_to(&mut self, target: usize) {
        while self.entries.len() > target {
            let Some(victim) = self.clock.pop_front() else {
                break;
            };
            match self.entries.get_mut(&victim) {
                Some((_, referenced)) if *referenced => {
                    *referenced = false;
                    self.clock.push_back(victim);
                }
                Some(_) => {
                    self.entries.remove(&victim);
                }
                None => {}
            }
        }
    }

    /// Drops the numbers of blocks no longer cached from the hand's order,
    /// and repeats of one (a block freed, reused and cached again).
    fn compact_clock(&mut self) {
        let mut seen = HashSet::with_capacity(self.entries.len());
        let entries = &self.entries;
        self.clock
            .retain(|bytenr| entries.contains_key(bytenr) && seen.insert(*bytenr));
    }

    #[cfg(test)]
    fn clock_len(&self) -> usize {
        self.clock.len()
    }
}

#[cfg(test)]
mod tests {
    use super::NodeCache;
    use crate::format::{Node, NodeBody};
    use std::sync::Arc;

    fn node(bytenr: u64) -> Arc<Node> {
        Arc::new(Node {
            bytenr,
            generation: 1,
            owner: 5,
            level: 0,
            body: NodeBody::Leaf(Vec::new()),
        })
    }

    /// Copy-on-write's pattern: each new block cached, the old one freed.
    /// The hand's order stays about as long as the cache.
    #[test]
    fn freed_blocks_do_not_pile_up_in_the_clock() {
        let mut cache = NodeCache::new(100);
        for bytenr in 0..100_000u64 {
            cache.insert(node(bytenr));
            if bytenr >= 10 {
                cache.remove(bytenr - 10);
            }
        }
        assert_eq!(cache.len(), 10);
        assert!(cache.clock_len() <= 2 * 10 + 64, "{}", cache.clock_len());
    }

    #[test]
    fn shrink_keeps_the_target_and_referenced_nodes_last() {
        let mut cache = NodeCache::new(1000);
        for bytenr in 0..1000u64 {
            cache.insert(node(bytenr));
        }
        for bytenr in 990..1000u64 {
            cache.get(bytenr);
        }
        cache.shrink_to(10);
        assert_eq!(cache.len(), 10);
        assert_eq!(cache.clock_len(), 10);
        for bytenr in 990..1000u64 {
            assert!(cache.get(bytenr).is_some(), "{bytenr} was referenced");
        }
        assert_eq!(cache.capacity(), 1000);
    }
}
