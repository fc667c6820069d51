//! birch: a copy-on-write B-tree filesystem engine.
//!
//! The engine is a library with no FUSE or CLI dependency. An embedder
//! needs three things, all at the crate root: a [`BlockDevice`] to store
//! the filesystem on (an image file or block device, [`FileDevice`], or
//! memory, [`MemoryDevice`]), [`Filesystem::mkfs`] to format it, and a
//! [`Filesystem`] to use it: POSIX operations on inode numbers, `fsync`
//! answered by a per-filesystem log tree, `sync` by a commit.
//!
//! ```
//! use birch::{Filesystem, MemoryDevice, MkfsOptions, MountOptions};
//! use std::sync::Arc;
//!
//! # fn main() -> birch::Result<()> {
//! let dev = Arc::new(MemoryDevice::new(64 << 20));
//! Filesystem::mkfs(dev.as_ref(), &MkfsOptions::default())?;
//! let fs = Filesystem::open(dev.clone(), MountOptions::default())?;
//! let file = fs.create(fs.root_ino(), b"hello", 0o644, 0, 0)?;
//! fs.write_file(file.ino, 0, b"durable once fsync returns")?;
//! fs.fsync(file.ino, false)?;
//! fs.close()?;
//!
//! // Opened again (after a crash, the log would be replayed here).
//! let fs = Filesystem::open(dev, MountOptions::default())?;
//! let found = fs.lookup(fs.root_ino(), b"hello")?;
//! assert_eq!(fs.read_file(found.ino, 0, 64)?, b"durable once fsync returns");
//! # fs.close()
//! # }
//! ```
//!
//! Tools build on the public modules below the API: [`format`](mod@format)
//! (the on-disk format, for dumps and fuzzers), [`device`] (the storage
//! seam, with the recording and faulty devices crash and I/O-error tests
//! use), [`check`] (fsck), [`print`](mod@print) (what `birch dump`
//! prints) and [`scrub`]. The B-tree and the allocator are internal.
//!
//! The modules are layers, each importing only those before it
//! (tests/layers.rs holds that): `format` -> [`error`], `device` ->
//! `btree` (copy-on-write trees), `alloc` (space) -> [`fs`] (transactions,
//! delayed items, inodes, directories, files) -> `check`, `print`,
//! `scrub`. docs/ARCHITECTURE.md draws the request path.

pub(crate) mod alloc;
pub(crate) mod btree;
pub mod check;
pub mod device;
pub mod error;
pub mod format;
pub mod fs;
mod lock_order;
pub mod print;
pub mod scrub;

pub use device::{BlockDevice, FileDevice, MemoryDevice};
pub use error::{Corruption, Error, Result};
pub use fs::{
    Ablation, Attr, CompressOption, DataChecksums, FallocateMode, Filesystem, MetadataCopies,
    MkfsOptions, MountOptions, RenameFlags, SetAttr, SetTime, WhiteoutOwner, XattrSetMode,
};
