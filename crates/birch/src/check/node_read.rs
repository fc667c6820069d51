//! Reading one copy of a node for the check: every way it can fail is a
//! fault of its own id (the B-tree's reader, which the engine uses, folds
//! them into one corruption error).

use super::FaultId;
use crate::btree::NodeExpectation;
use crate::device::BlockDevice;
use crate::format::{Node, NodeError, NODE_SIZE, SECTOR_SIZE};

/// Why a node copy is not the node its pointer promises.
pub(super) struct BadCopy {
    pub id: FaultId,
    /// The offending entry, when one is.
    pub slot: Option<usize>,
    pub reason: String,
}

impl BadCopy {
    fn new(id: FaultId, reason: String) -> BadCopy {
        BadCopy {
            id,
            slot: None,
            reason,
        }
    }
}

/// Reads the copy at `offset` of the node at `bytenr` and validates it as
/// that node and, with `expect`, as what its parent's pointer promises;
/// with `listed` (the log manifest's checksum for the block), also that it
/// has that checksum.
pub(super) fn read_copy<D: BlockDevice + ?Sized>(
    dev: &D,
    fsid: &[u8; 16],
    bytenr: u64,
    offset: u64,
    expect: Option<NodeExpectation>,
    listed: Option<u32>,
) -> Result<Node, BadCopy> {
    if !offset.is_multiple_of(SECTOR_SIZE)
        || offset
            .checked_add(NODE_SIZE as u64)
            .is_none_or(|end| end > dev.size_bytes())
    {
        return Err(BadCopy::new(
            FaultId::NodeOutsideDevice,
            format!(
                "block pointer outside the device ({} bytes) or unaligned",
                dev.size_bytes()
            ),
        ));
    }
    let mut buf = vec![0u8; NODE_SIZE];
    dev.read_at(&mut buf, offset)
        .map_err(|e| BadCopy::new(FaultId::NodeUnreadable, format!("cannot read node: {e}")))?;
    let node = Node::decode(&buf, bytenr, fsid).map_err(|e| node_error(&e))?;
    let stored = u32::from_le_bytes(buf[0..4].try_into().expect("4 bytes"));
    if let Some(want) = listed.filter(|&want| want != stored) {
        return Err(BadCopy::new(
            FaultId::LogNodeCopyIncomplete,
            format!(
                "checksum {stored:#010x}, the superblock's log manifest lists {want:#010x} \
                 (a write of the last log sync that did not reach the disk)"
            ),
        ));
    }
    if let Some(e) = expect {
        if !crate::format::tree_id::may_reach(e.tree, node.owner) {
            return Err(BadCopy::new(
                FaultId::NodeOwner,
                format!("owner {} but reached from tree {}", node.owner, e.tree),
            ));
        }
        if node.level != e.level {
            return Err(BadCopy::new(
                FaultId::NodeLevel,
                format!("level {} but parent expects {}", node.level, e.level),
            ));
        }
        if node.generation != e.generation {
            return Err(BadCopy::new(
                FaultId::NodeGeneration,
                format!(
                    "generation {} but parent expects {} (lost or misdirected write)",
                    node.generation, e.generation
                ),
            ));
        }
    }
    Ok(node)
}

/// A decode failure as a fault: its id, its slot, and its text without the
/// slot (the fault's location names it).
fn node_error(e: &NodeError) -> BadCopy {
    let (id, slot) = match e {
        NodeError::BadChecksum { .. } => (FaultId::NodeChecksum, None),
        NodeError::BadMagic { .. } => (FaultId::NodeMagic, None),
        NodeError::WrongBytenr { .. } => (FaultId::NodeBytenr, None),
        NodeError::WrongFsid => (FaultId::NodeFsid, None),
        NodeError::BadLevel { .. } => (FaultId::NodeLevelInvalid, None),
        NodeError::TooManyItems { .. } => (FaultId::NodeItemCount, None),
        NodeError::ItemOutOfBounds { slot } => (FaultId::NodeItemBounds, Some(*slot)),
        NodeError::KeysOutOfOrder { slot, .. } => (FaultId::NodeKeyOrder, Some(*slot)),
        NodeError::BadPointer { slot, .. } => (FaultId::NodeChildPointer, Some(*slot)),
    };
    let text = e.to_string();
    let reason = match slot {
        Some(slot) => text
            .strip_prefix(&format!("slot={slot}: "))
            .map_or(text.clone(), str::to_string),
        None => text,
    };
    BadCopy { id, slot, reason }
}
