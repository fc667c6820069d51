//! B-tree node layout (NODE_SIZE bytes):
//!
//! ```text
//! 0   csum     u32   crc32c of bytes 4..NODE_SIZE
//! 4   magic    u32   "BNOD"
//! 8   bytenr   u64   where this node lives (guards against misdirected writes)
//! 16  generation u64 transaction that wrote it
//! 24  owner    u64   tree id
//! 32  nritems  u32
//! 36  level    u8    0 = leaf
//! 37  pad      [3]
//! 40  fsid     [16]  filesystem id (rejects stale nodes of an earlier mkfs)
//! 56  reserved [8]
//! 64  body
//! ```
//! Leaf body: `nritems` headers of (key 17, data_offset u32, data_size u32)
//! growing forward; item data packed from the end of the node backwards.
//! `data_offset` is relative to the body start.
//! Internal body: `nritems` of (key 17, blockptr u64, generation u64).

use super::bytes::{put_u32, put_u64, Reader};
use super::{Key, NODE_MAGIC, NODE_SIZE};
use std::fmt;

pub const HEADER_SIZE: usize = 64;
pub const BODY_SIZE: usize = NODE_SIZE - HEADER_SIZE;
pub const LEAF_ITEM_HEADER_SIZE: usize = Key::ENCODED_SIZE + 8;
pub const KEY_PTR_SIZE: usize = Key::ENCODED_SIZE + 16;
/// Most pointers an internal node holds.
pub const MAX_KEY_PTRS: usize = BODY_SIZE / KEY_PTR_SIZE;
/// Largest item payload: one item alone fills a leaf.
pub const MAX_ITEM_DATA: usize = BODY_SIZE - LEAF_ITEM_HEADER_SIZE;
/// Deepest tree accepted (level of the root). 8 levels of 494-way nodes
/// address far more than any device.
pub const MAX_LEVEL: u8 = 8;

#[derive(Clone, PartialEq, Eq)]
pub struct LeafItem {
    pub key: Key,
    pub data: Vec<u8>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct KeyPtr {
    pub key: Key,
    pub blockptr: u64,
    pub generation: u64,
}

#[derive(Clone, PartialEq, Eq)]
pub enum NodeBody {
    Leaf(Vec<LeafItem>),
    Internal(Vec<KeyPtr>),
}

/// A decoded node. `level` is 0 exactly when the body is a leaf.
#[derive(Clone, PartialEq, Eq)]
pub struct Node {
    pub bytenr: u64,
    pub generation: u64,
    pub owner: u64,
    pub level: u8,
    pub body: NodeBody,
}

/// What is wrong with a node read from disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeError {
    BadChecksum { stored: u32, computed: u32 },
    BadMagic { found: u32 },
    WrongBytenr { found: u64 },
    WrongFsid,
    BadLevel { level: u8 },
    TooManyItems { nritems: u32 },
    ItemOutOfBounds { slot: usize },
    KeysOutOfOrder { slot: usize, prev: Key, key: Key },
    BadPointer { slot: usize, blockptr: u64 },
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeError::BadChecksum { stored, computed } => write!(
                f,
                "checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
            ),
            NodeError::BadMagic { found } => write!(f, "bad node magic {found:#010x}"),
            NodeError::WrongBytenr { found } => write!(f, "node header names block {found}"),
            NodeError::WrongFsid => write!(f, "node belongs to another filesystem (fsid mismatch)"),
            NodeError::BadLevel { level } => write!(f, "invalid level {level}"),
            NodeError::TooManyItems { nritems } => {
                write!(f, "item count {nritems} does not fit a node")
            }
            NodeError::ItemOutOfBounds { slot } => {
                write!(f, "slot={slot}: item data outside the node or overlapping")
            }
            NodeError::KeysOutOfOrder { slot, prev, key } => {
                write!(f, "slot={slot}: invalid key order, {prev} then {key}")
            }
            NodeError::BadPointer { slot, blockptr } => write!(
                f,
                "slot={slot}: child pointer {blockptr} is not node aligned"
            ),
        }
    }
}

impl Node {
    pub fn is_leaf(&self) -> bool {
        self.level == 0
    }

    pub fn nritems(&self) -> usize {
        match &self.body {
            NodeBody::Leaf(items) => items.len(),
            NodeBody::Internal(ptrs) => ptrs.len(),
        }
    }

    pub fn first_key(&self) -> Option<Key> {
        match &self.body {
            NodeBody::Leaf(items) => items.first().map(|i| i.key),
            NodeBody::Internal(ptrs) => ptrs.first().map(|p| p.key),
        }
    }

    pub fn leaf_items(&self) -> &[LeafItem] {
        match &self.body {
            NodeBody::Leaf(items) => items,
            NodeBody::Internal(_) => {
                panic!("node {} at level {} is not a leaf", self.bytenr, self.level)
            }
        }
    }

    pub fn leaf_items_mut(&mut self) -> &mut Vec<LeafItem> {
        match &mut self.body {
            NodeBody::Leaf(items) => items,
            NodeBody::Internal(_) => {
                panic!("node {} at level {} is not a leaf", self.bytenr, self.level)
            }
        }
    }

    pub fn key_ptrs(&self) -> &[KeyPtr] {
        match &self.body {
            NodeBody::Internal(ptrs) => ptrs,
            NodeBody::Leaf(_) => panic!("node {} is a leaf, not an internal node", self.bytenr),
        }
    }

    pub fn key_ptrs_mut(&mut self) -> &mut Vec<KeyPtr> {
        match &mut self.body {
            NodeBody::Internal(ptrs) => ptrs,
            NodeBody::Leaf(_) => panic!("node {} is a leaf, not an internal node", self.bytenr),
        }
    }

    /// Bytes of the body in use.
    pub fn used_bytes(&self) -> usize {
        match &self.body {
            NodeBody::Leaf(items) => items
                .iter()
                .map(|i| LEAF_ITEM_HEADER_SIZE + i.data.len())
                .sum(),
            NodeBody::Internal(ptrs) => ptrs.len() * KEY_PTR_SIZE,
        }
    }

    pub fn fits(&self) -> bool {
        self.used_bytes() <= BODY_SIZE
    }

    pub fn encode(&self, fsid: &[u8; 16]) -> Vec<u8> {
        assert!(
            self.fits(),
            "encoding node {} that overflows: {} bytes",
            self.bytenr,
            self.used_bytes()
        );
        let mut out = Vec::with_capacity(NODE_SIZE);
        put_u32(&mut out, 0);
        put_u32(&mut out, NODE_MAGIC);
        put_u64(&mut out, self.bytenr);
        put_u64(&mut out, self.generation);
        put_u64(&mut out, self.owner);
        put_u32(&mut out, self.nritems() as u32);
        out.push(self.level);
        out.extend_from_slice(&[0; 3]);
        out.extend_from_slice(fsid);
        out.extend_from_slice(&[0; 8]);
        debug_assert_eq!(out.len(), HEADER_SIZE);
        match &self.body {
            NodeBody::Leaf(items) => {
                let mut data_end = BODY_SIZE;
                for item in items {
                    data_end -= item.data.len();
                    item.key.encode(&mut out);
                    put_u32(&mut out, data_end as u32);
                    put_u32(&mut out, item.data.len() as u32);
                }
                out.resize(NODE_SIZE, 0);
                let mut data_end = NODE_SIZE;
                for item in items {
                    let start = data_end - item.data.len();
                    out[start..data_end].copy_from_slice(&item.data);
                    data_end = start;
                }
            }
            NodeBody::Internal(ptrs) => {
                for p in ptrs {
                    p.key.encode(&mut out);
                    put_u64(&mut out, p.blockptr);
                    put_u64(&mut out, p.generation);
                }
                out.resize(NODE_SIZE, 0);
            }
        }
        let csum = crc32c::crc32c(&out[4..]);
        out[0..4].copy_from_slice(&csum.to_le_bytes());
        out
    }

    /// Decodes and validates a node read from `expected_bytenr`.
    pub fn decode(bytes: &[u8], expected_bytenr: u64, fsid: &[u8; 16]) -> Result<Node, NodeError> {
        assert_eq!(
            bytes.len(),
            NODE_SIZE,
            "node buffer must be NODE_SIZE bytes"
        );
        let stored = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
        let computed = crc32c::crc32c(&bytes[4..]);
        if stored != computed {
            return Err(NodeError::BadChecksum { stored, computed });
        }
        let mut r = Reader::new(&bytes[4..HEADER_SIZE]);
        let short = |_| NodeError::ItemOutOfBounds { slot: 0 };
        let magic = r.u32().map_err(short)?;
        if magic != NODE_MAGIC {
            return Err(NodeError::BadMagic { found: magic });
        }
        let bytenr = r.u64().map_err(short)?;
        if bytenr != expected_bytenr {
            return Err(NodeError::WrongBytenr { found: bytenr });
        }
        let generation = r.u64().map_err(short)?;
        let owner = r.u64().map_err(short)?;
        let nritems = r.u32().map_err(short)?;
        let level = r.u8().map_err(short)?;
        if &bytes[40..56] != fsid {
            return Err(NodeError::WrongFsid);
        }
        if level > MAX_LEVEL {
            return Err(NodeError::BadLevel { level });
        }
        let body = &bytes[HEADER_SIZE..];
        let body = if level == 0 {
            NodeBody::Leaf(decode_leaf(body, nritems)?)
        } else {
            NodeBody::Internal(decode_internal(body, nritems)?)
        };
        Ok(Node {
            bytenr,
            generation,
            owner,
            level,
            body,
        })
    }
}

/// The items of a leaf node's body holding `nritems`.
fn decode_leaf(body: &[u8], nritems: u32) -> Result<Vec<LeafItem>, NodeError> {
    if nritems as usize > BODY_SIZE / LEAF_ITEM_HEADER_SIZE {
        return Err(NodeError::TooManyItems { nritems });
    }
    let headers_end = nritems as usize * LEAF_ITEM_HEADER_SIZE;
    let mut r = Reader::new(&body[..headers_end]);
    let mut items: Vec<LeafItem> = Vec::with_capacity(nritems as usize);
    // Item data must lie after the headers, inside the body, and be
    // packed backwards without overlap, in slot order.
    let mut prev_start = BODY_SIZE;
    for slot in 0..nritems as usize {
        let key = Key::decode(&mut r).map_err(|_| NodeError::ItemOutOfBounds { slot })?;
        let offset = r.u32().map_err(|_| NodeError::ItemOutOfBounds { slot })? as usize;
        let size = r.u32().map_err(|_| NodeError::ItemOutOfBounds { slot })? as usize;
        let end = offset.checked_add(size);
        if offset < headers_end || end.is_none_or(|end| end > prev_start) {
            return Err(NodeError::ItemOutOfBounds { slot });
        }
        prev_start = offset;
        if let Some(prev) = items.last() {
            if prev.key >= key {
                return Err(NodeError::KeysOutOfOrder {
                    slot,
                    prev: prev.key,
                    key,
                });
            }
        }
        items.push(LeafItem {
            key,
            data: body[offset..offset + size].to_vec(),
        });
    }
    Ok(items)
}

/// The pointers of an internal node's body holding `nritems`.
fn decode_internal(body: &[u8], nritems: u32) -> Result<Vec<KeyPtr>, NodeError> {
    if nritems as usize > MAX_KEY_PTRS || nritems == 0 {
        return Err(NodeError::TooManyItems { nritems });
    }
    let mut r = Reader::new(&body[..nritems as usize * KEY_PTR_SIZE]);
    let mut ptrs: Vec<KeyPtr> = Vec::with_capacity(nritems as usize);
    for slot in 0..nritems as usize {
        let bad = |_| NodeError::ItemOutOfBounds { slot };
        let key = Key::decode(&mut r).map_err(bad)?;
        let blockptr = r.u64().map_err(bad)?;
        let generation = r.u64().map_err(bad)?;
        if blockptr == 0 || blockptr % super::SECTOR_SIZE != 0 {
            return Err(NodeError::BadPointer { slot, blockptr });
        }
        if let Some(prev) = ptrs.last() {
            if prev.key >= key {
                return Err(NodeError::KeysOutOfOrder {
                    slot,
                    prev: prev.key,
                    key,
                });
            }
        }
        ptrs.push(KeyPtr {
            key,
            blockptr,
            generation,
        });
    }
    Ok(ptrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf() -> Node {
        Node {
            bytenr: 1 << 20,
            generation: 3,
            owner: 5,
            level: 0,
            body: NodeBody::Leaf(vec![
                LeafItem {
                    key: Key::new(256, 1, 0),
                    data: vec![1, 2, 3],
                },
                LeafItem {
                    key: Key::new(256, 12, 256),
                    data: vec![],
                },
                LeafItem {
                    key: Key::new(257, 1, 0),
                    data: vec![9; 100],
                },
            ]),
        }
    }

    #[test]
    fn node_round_trips() {
        let fsid = [7; 16];
        let n = leaf();
        let bytes = n.encode(&fsid);
        let back = Node::decode(&bytes, n.bytenr, &fsid).unwrap();
        assert!(back == n);
        let internal = Node {
            bytenr: 2 << 20,
            generation: 4,
            owner: 1,
            level: 1,
            body: NodeBody::Internal(vec![
                KeyPtr {
                    key: Key::new(1, 1, 0),
                    blockptr: 1 << 20,
                    generation: 3,
                },
                KeyPtr {
                    key: Key::new(9, 1, 0),
                    blockptr: 3 << 20,
                    generation: 4,
                },
            ]),
        };
        let bytes = internal.encode(&fsid);
        assert!(Node::decode(&bytes, internal.bytenr, &fsid).unwrap() == internal);
    }

    #[test]
    fn corrupt_nodes_are_rejected_with_a_reason() {
        let fsid = [7; 16];
        let n = leaf();
        let mut bytes = n.encode(&fsid);
        bytes[100] ^= 1;
        assert!(matches!(
            Node::decode(&bytes, n.bytenr, &fsid),
            Err(NodeError::BadChecksum { .. })
        ));
        let bytes = n.encode(&fsid);
        assert_eq!(
            Node::decode(&bytes, n.bytenr + 4096, &fsid).err(),
            Some(NodeError::WrongBytenr { found: n.bytenr })
        );
        assert_eq!(
            Node::decode(&bytes, n.bytenr, &[0; 16]).err(),
            Some(NodeError::WrongFsid)
        );
    }
}
