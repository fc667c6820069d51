//! Conversions between engine values and FUSE's.

use birch::format::{FileType, Timespec};
use birch::fs::Attr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How FUSE's node ids map to the engine's (external) inode numbers.
/// FUSE calls the mount's root directory 1: that is the root directory of
/// the subvolume mounted (`subvol=`, `subvolid=`, else the default one;
/// docs/SNAPSHOTS.md (g)), engine number `root`. Every other node id is
/// the engine's number itself; no engine number is 1 (they start at 256),
/// so the map is one to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeIds {
    root: u64,
}

impl NodeIds {
    /// The map for a mount of the subvolume whose root directory is
    /// engine inode `root`.
    pub fn new(root: u64) -> NodeIds {
        NodeIds { root }
    }

    /// The engine number of the mount's root directory.
    pub fn root(self) -> u64 {
        self.root
    }

    pub fn to_engine(self, fuse_ino: u64) -> u64 {
        if fuse_ino == fuser::INodeNo::ROOT.0 {
            self.root
        } else {
            fuse_ino
        }
    }

    pub fn to_fuse(self, engine_ino: u64) -> fuser::INodeNo {
        fuser::INodeNo(if engine_ino == self.root {
            fuser::INodeNo::ROOT.0
        } else {
            engine_ino
        })
    }

    /// The generation the kernel gets with an inode, and puts in its file
    /// handles: the engine's (the transaction that created the inode), so
    /// a number reused in a later mount, after the inode that had it was
    /// deleted, never matches an old handle. FUSE wants 0 for the root
    /// (the kernel made it with 0 and would call it stale otherwise). The
    /// kernel keeps 32 bits: transactions would have to pass 2^32 to wrap.
    pub fn generation(self, a: &Attr) -> fuser::Generation {
        fuser::Generation(if a.ino == self.root { 0 } else { a.generation })
    }

    pub fn attr(self, a: &Attr) -> fuser::FileAttr {
        fuser::FileAttr {
            ino: self.to_fuse(a.ino),
            ..to_fuse_attr(a)
        }
    }
}

pub fn to_system_time(t: Timespec) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs())
            + Duration::from_nanos(u64::from(t.nsec))
    }
}

/// A time the kernel sent in a request, as fuser 0.18 hands it over. For
/// times before the epoch fuser builds `EPOCH - (|sec| s + nsec ns)` from the
/// kernel's `(sec, nsec)` (adding the nanoseconds the wrong way), so the
/// kernel's fields are recovered from the distance to the epoch directly.
/// (Its reply encoding is correct, so [`to_system_time`] needs no such care.)
pub fn from_request_time(t: SystemTime) -> Timespec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timespec {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        },
        Err(e) => Timespec {
            sec: -(e.duration().as_secs() as i64),
            nsec: e.duration().subsec_nanos(),
        },
    }
}

pub fn to_fuse_type(t: FileType) -> fuser::FileType {
    match t {
        FileType::Regular => fuser::FileType::RegularFile,
        FileType::Directory => fuser::FileType::Directory,
        FileType::CharDevice => fuser::FileType::CharDevice,
        FileType::BlockDevice => fuser::FileType::BlockDevice,
        FileType::Fifo => fuser::FileType::NamedPipe,
        FileType::Socket => fuser::FileType::Socket,
        FileType::Symlink => fuser::FileType::Symlink,
    }
}

/// `a` for FUSE, its number unmapped: [`NodeIds::attr`] maps it.
fn to_fuse_attr(a: &Attr) -> fuser::FileAttr {
    fuser::FileAttr {
        ino: fuser::INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: to_system_time(a.atime),
        mtime: to_system_time(a.mtime),
        ctime: to_system_time(a.ctime),
        crtime: to_system_time(a.crtime),
        kind: to_fuse_type(a.file_type),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        flags: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use birch::format::ROOT_DIR_INO;
    use birch::fs::InoSpace;

    #[test]
    fn reply_times_include_times_before_the_epoch() {
        assert_eq!(
            to_system_time(Timespec {
                sec: 1_700_000_000,
                nsec: 123
            }),
            UNIX_EPOCH + Duration::new(1_700_000_000, 123)
        );
        // -5 s + 0.25 s = 4.75 s before the epoch.
        assert_eq!(
            to_system_time(Timespec {
                sec: -5,
                nsec: 250_000_000
            }),
            UNIX_EPOCH - Duration::new(4, 750_000_000)
        );
    }

    #[test]
    fn request_times_before_the_epoch_keep_the_kernels_fields() {
        // What fuser 0.18 builds for the kernel's (sec -1000, nsec 1).
        let from_fuser = UNIX_EPOCH - Duration::new(1000, 1);
        assert_eq!(
            from_request_time(from_fuser),
            Timespec {
                sec: -1000,
                nsec: 1
            }
        );
        assert_eq!(
            from_request_time(UNIX_EPOCH + Duration::new(5, 7)),
            Timespec { sec: 5, nsec: 7 }
        );
    }

    #[test]
    fn root_maps_both_ways() {
        let top = NodeIds::new(ROOT_DIR_INO);
        assert_eq!(top.to_engine(1), ROOT_DIR_INO);
        assert_eq!(top.to_fuse(ROOT_DIR_INO).0, 1);
        assert_eq!(top.to_engine(300), 300);
        // A mount of subvolume 257: its root directory is node 1, and
        // tree 5's root directory (not reachable from it) keeps its number.
        let sv = NodeIds::new(InoSpace::join(257, ROOT_DIR_INO));
        assert_eq!(sv.to_engine(1), InoSpace::join(257, ROOT_DIR_INO));
        assert_eq!(sv.to_fuse(InoSpace::join(257, ROOT_DIR_INO)).0, 1);
        assert_eq!(sv.to_fuse(ROOT_DIR_INO).0, ROOT_DIR_INO);
        assert_eq!(sv.to_engine(ROOT_DIR_INO), ROOT_DIR_INO);
    }
}
