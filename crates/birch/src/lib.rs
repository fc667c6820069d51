//! birch: a copy-on-write B-tree filesystem engine.
//!
//! The engine is a library with no FUSE or CLI dependency. Reading order:
//! [`device`] (the storage seam) -> [`format`] (bytes on disk) -> [`btree`]
//! (copy-on-write trees) -> [`alloc`] (space) -> [`fs`] (transactions,
//! delayed items, inodes, directories, files) -> [`check`] (fsck).
//! docs/ARCHITECTURE.md draws the request path.

pub mod alloc;
pub mod btree;
pub mod check;
pub mod device;
pub mod error;
pub mod format;
pub mod fs;
pub mod print;
pub mod scrub;

pub use error::{Corruption, Error, Result};
