//! Public value types of the filesystem API.

use crate::format::{FileType, InodeItem, Timespec, SECTOR_SIZE};
use std::time::Duration;

/// Attributes of one inode, as `stat` reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    /// 512-byte blocks in use.
    pub blocks: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub crtime: Timespec,
    pub file_type: FileType,
    /// Permission bits (no file type bits).
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    /// Inode generation: with `ino`, unique for the life of the filesystem.
    pub generation: u64,
}

impl Attr {
    pub(crate) fn from_item(ino: u64, item: &InodeItem, extra_bytes: u64) -> Attr {
        Attr {
            ino,
            size: item.size,
            blocks: (item.nbytes + extra_bytes).div_ceil(512),
            atime: item.atime,
            mtime: item.mtime,
            ctime: item.ctime,
            crtime: item.otime,
            file_type: item.file_type(),
            perm: (item.mode & 0o7777) as u16,
            nlink: item.nlink,
            uid: item.uid,
            gid: item.gid,
            rdev: item.rdev as u32,
            blksize: SECTOR_SIZE as u32,
            generation: item.generation,
        }
    }
}

/// A time to set: a given instant, or "now".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    Now,
    At(Timespec),
}

/// The attributes `setattr` changes; `None` leaves one alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// Permission bits (and suid/sgid/sticky); the file type is kept.
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    pub ctime: Option<Timespec>,
}

/// One directory entry as `readdir` returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirListEntry {
    pub ino: u64,
    /// Pass this as `offset` to continue after this entry. Stable: it is
    /// the entry's dir index, which never changes while the entry exists.
    pub next_offset: u64,
    pub file_type: FileType,
    pub name: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    pub block_size: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    pub blocks_available: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_max: u32,
}

/// `renameat2` flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// RENAME_NOREPLACE: fail with EEXIST if the target exists.
    pub no_replace: bool,
    /// RENAME_EXCHANGE: atomically swap the two names.
    pub exchange: bool,
}

/// `setxattr` flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum XattrSetMode {
    #[default]
    CreateOrReplace,
    /// XATTR_CREATE: fail with EEXIST if it exists.
    Create,
    /// XATTR_REPLACE: fail with ENODATA if it does not exist.
    Replace,
}

#[derive(Debug, Clone, Default)]
pub struct MkfsOptions {
    /// Filesystem id; random when `None`.
    pub fsid: Option<[u8; 16]>,
}

#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Commit at least this often while there are changes; `None` disables
    /// the background worker (commits then happen only on sync, fsync,
    /// memory pressure and close — what deterministic tests want).
    pub commit_interval: Option<Duration>,
    /// Clean nodes kept in memory.
    pub cache_nodes: usize,
    /// Dirty file data held in memory before writers force a commit.
    pub dirty_limit_bytes: u64,
    /// Delayed dir-index items and inode updates held before the
    /// background worker flushes them into the tree.
    pub delayed_items_limit: usize,
    /// Refuse every change (EROFS) and never write to the device.
    pub read_only: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            commit_interval: Some(Duration::from_secs(30)),
            cache_nodes: 16 * 1024,
            dirty_limit_bytes: 256 * 1024 * 1024,
            delayed_items_limit: 16 * 1024,
            read_only: false,
        }
    }
}

impl MountOptions {
    /// No background worker: every commit is caused by an API call.
    pub fn deterministic() -> Self {
        MountOptions {
            commit_interval: None,
            ..Default::default()
        }
    }
}

/// Counters of work done since mount.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsStats {
    pub commits: u64,
    pub delayed_item_flushes: u64,
    pub delayed_items_flushed: u64,
    pub data_bytes_written: u64,
    pub nodes_written: u64,
    pub fsyncs: u64,
}

/// `fallocate` modes birch implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallocateMode {
    /// Mode 0: reserve space and grow the file to cover the range.
    Allocate,
    /// FALLOC_FL_KEEP_SIZE: reserve space, leave the size alone.
    AllocateKeepSize,
    /// FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE: drop the range's data.
    PunchHole,
}

/// `lseek` whence values that look at the file's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeekWhence {
    Data,
    Hole,
}
