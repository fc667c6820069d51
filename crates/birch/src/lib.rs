//! birch: a copy-on-write B-tree filesystem engine.
//!
//! The engine is a library with no FUSE or CLI dependency. Its modules are
//! layers, each importing only those before it (tests/layers.rs holds
//! that): [`format`](mod@format) (bytes on disk) -> [`error`], [`device`] (the storage
//! seam) -> [`btree`] (copy-on-write trees), [`alloc`] (space) -> [`fs`]
//! (transactions, delayed items, inodes, directories, files) -> [`check`]
//! (fsck), [`print`](mod@print), [`scrub`]. docs/ARCHITECTURE.md draws the request
//! path.

pub mod alloc;
pub mod btree;
pub mod check;
pub mod device;
pub mod error;
pub mod format;
pub mod fs;
mod lock_order;
pub mod print;
pub mod scrub;

pub use error::{Corruption, Error, Result};
