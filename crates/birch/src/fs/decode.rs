//! Items read from the fs tree are decoded with validation; a failure is
//! a corruption report naming the item. Every fs module reading items uses
//! this, so it sits apart from all of them (it was in inode.rs, which made
//! tree_log.rs and inode.rs import each other).

use crate::error::{Corruption, Error, Result};
use crate::format::{tree_id, ItemError, Key};

/// Turns an item decode failure into a corruption report naming the key.
pub(crate) fn decode_item<T>(key: &Key, result: std::result::Result<T, ItemError>) -> Result<T> {
    result.map_err(|e| {
        Error::corrupt(Corruption {
            tree: Some(tree_id::FS),
            block: None,
            slot: None,
            reason: format!("item {key}: {e}"),
        })
    })
}
