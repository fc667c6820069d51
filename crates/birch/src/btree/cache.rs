//! A bounded cache of clean (on-disk) nodes, evicted with the CLOCK
//! second-chance policy.

use crate::format::Node;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

pub struct NodeCache {
    entries: HashMap<u64, (Arc<Node>, bool)>,
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
        while self.entries.len() > self.capacity {
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

    /// Forgets a block that was freed: its bytes may be reused.
    pub fn remove(&mut self, bytenr: u64) {
        self.entries.remove(&bytenr);
    }
}
