//! Reading nodes from the device, validated, through the cache.

use super::cache::NodeCache;
use crate::device::BlockDevice;
use crate::error::{Corruption, Error, Result};
use crate::format::{Node, NODE_SIZE};
use std::sync::{Arc, Mutex};

/// What a parent (or a root item) promises about a child node.
#[derive(Debug, Clone, Copy)]
pub struct NodeExpectation {
    pub tree: u64,
    pub level: u8,
    pub generation: u64,
}

pub struct NodeStore<D> {
    dev: D,
    fsid: [u8; 16],
    cache: Mutex<NodeCache>,
}

impl<D: BlockDevice> NodeStore<D> {
    pub fn new(dev: D, fsid: [u8; 16], cache_nodes: usize) -> Self {
        NodeStore {
            dev,
            fsid,
            cache: Mutex::new(NodeCache::new(cache_nodes)),
        }
    }

    pub fn device(&self) -> &D {
        &self.dev
    }

    pub fn fsid(&self) -> &[u8; 16] {
        &self.fsid
    }

    /// Reads the node at `bytenr` and checks it is what the parent said.
    pub fn read(&self, bytenr: u64, expect: NodeExpectation) -> Result<Arc<Node>> {
        if let Some(node) = self.cache.lock().expect("cache lock poisoned").get(bytenr) {
            // A cached copy of a block since freed and rewritten would not
            // match what the parent promises: fall through to the disk.
            if node.owner == expect.tree
                && node.level == expect.level
                && node.generation == expect.generation
            {
                return Ok(node);
            }
        }
        let node = Arc::new(read_node_uncached(
            &self.dev,
            &self.fsid,
            bytenr,
            Some(expect),
        )?);
        self.cache
            .lock()
            .expect("cache lock poisoned")
            .insert(node.clone());
        Ok(node)
    }

    /// Puts a node just written by a commit into the cache.
    pub fn cache_written(&self, node: Arc<Node>) {
        self.cache.lock().expect("cache lock poisoned").insert(node);
    }

    pub fn forget(&self, bytenr: u64) {
        self.cache
            .lock()
            .expect("cache lock poisoned")
            .remove(bytenr);
    }
}

/// Reads and validates one node without a cache (used by `check` and `dump`
/// as well). With `expect`, also checks owner, level and generation.
pub fn read_node_uncached<D: BlockDevice + ?Sized>(
    dev: &D,
    fsid: &[u8; 16],
    bytenr: u64,
    expect: Option<NodeExpectation>,
) -> Result<Node> {
    let tree = expect.map(|e| e.tree);
    let corrupt = |reason: String| Error::corrupt(Corruption::at_block(tree, bytenr, None, reason));
    if !bytenr.is_multiple_of(crate::format::SECTOR_SIZE)
        || bytenr
            .checked_add(NODE_SIZE as u64)
            .is_none_or(|end| end > dev.size_bytes())
    {
        return Err(corrupt(format!(
            "block pointer outside the device ({} bytes) or unaligned",
            dev.size_bytes()
        )));
    }
    let mut buf = vec![0u8; NODE_SIZE];
    dev.read_at(&mut buf, bytenr)?;
    let node = Node::decode(&buf, bytenr, fsid).map_err(|e| {
        let slot = match &e {
            crate::format::NodeError::ItemOutOfBounds { slot }
            | crate::format::NodeError::KeysOutOfOrder { slot, .. }
            | crate::format::NodeError::BadPointer { slot, .. } => Some(*slot),
            _ => None,
        };
        Error::corrupt(Corruption::at_block(tree, bytenr, slot, e.to_string()))
    })?;
    if let Some(e) = expect {
        if node.owner != e.tree {
            return Err(corrupt(format!(
                "owner {} but reached from tree {}",
                node.owner, e.tree
            )));
        }
        if node.level != e.level {
            return Err(corrupt(format!(
                "level {} but parent expects {}",
                node.level, e.level
            )));
        }
        if node.generation != e.generation {
            return Err(corrupt(format!(
                "generation {} but parent expects {} (lost or misdirected write)",
                node.generation, e.generation
            )));
        }
    }
    Ok(node)
}
