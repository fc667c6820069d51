//! Engine errors. Each maps to the errno a kernel filesystem would return.

use std::fmt;
use std::io;

/// Where on disk something is wrong, in the one format every report uses:
/// `corrupt node: tree=5 block=30621696 slot=3: invalid key order`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corruption {
    pub tree: Option<u64>,
    pub block: Option<u64>,
    pub slot: Option<usize>,
    pub reason: String,
}

impl Corruption {
    pub fn at_block(
        tree: Option<u64>,
        block: u64,
        slot: Option<usize>,
        reason: impl Into<String>,
    ) -> Corruption {
        Corruption {
            tree,
            block: Some(block),
            slot,
            reason: reason.into(),
        }
    }

    pub fn general(reason: impl Into<String>) -> Corruption {
        Corruption {
            tree: None,
            block: None,
            slot: None,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.block.is_some() {
            "corrupt node:"
        } else {
            "corrupt"
        })?;
        if let Some(tree) = self.tree {
            write!(f, " tree={}", crate::format::tree_name(tree))?;
        }
        if let Some(block) = self.block {
            write!(f, " block={block}")?;
        }
        if let Some(slot) = self.slot {
            write!(f, " slot={slot}")?;
        }
        write!(f, ": {}", self.reason)
    }
}

#[derive(Debug)]
pub enum Error {
    NotFound,
    Exists,
    NotDir,
    IsDir,
    NotEmpty,
    NameTooLong,
    /// EINVAL, with what was invalid.
    InvalidArgument(&'static str),
    NoSpace,
    TooManyLinks,
    /// No such xattr (ENODATA).
    NoData,
    /// A buffer too small or a value too large (ERANGE / E2BIG).
    Range,
    FileTooBig,
    ReadOnly,
    /// A read-only open cannot become read-write: its device was opened
    /// read-only (EROFS).
    DeviceReadOnly,
    NotPermitted,
    /// EPERM with why: a send refused a subvolume that is not read-only,
    /// or a delete or `ro=false` refused one a send holds.
    Refused(String),
    /// ENAMETOOLONG with what was too long (a path a send would write).
    PathTooLong(String),
    /// A rename or link between two subvolumes (EXDEV).
    CrossDevice,
    /// SEEK_DATA / SEEK_HOLE past the end of the file (ENXIO).
    NoSuchOffset,
    /// A mode or request the filesystem does not implement (EOPNOTSUPP).
    NotSupported(&'static str),
    /// Directory `dir` has handed out its last dir index (EOVERFLOW, as
    /// btrfs answers for an exhausted index counter): only a crafted image
    /// gets there.
    DirIndexesExhausted {
        dir: u64,
    },
    /// The device failed; the filesystem has gone read-only.
    Io(io::Error),
    Corrupt(Corruption),
    /// A data block failed its checksum (EIO): the read is refused, the
    /// filesystem stays as it was (docs/DATA-CHECKSUMS.md). Names the
    /// inode, file offset and disk bytenr.
    BadData(String),
    /// Internal, never returned by a public call: a read-only request met
    /// a tree node that is not cached, and ends to read it without the
    /// state lock and run again (docs/SNAPSHOTS.md (f)). EIO if it ever
    /// escaped.
    NodeNotCached,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound => libc::ENOENT,
            Error::Exists => libc::EEXIST,
            Error::NotDir => libc::ENOTDIR,
            Error::IsDir => libc::EISDIR,
            Error::NotEmpty => libc::ENOTEMPTY,
            Error::NameTooLong => libc::ENAMETOOLONG,
            Error::InvalidArgument(_) => libc::EINVAL,
            Error::NoSpace => libc::ENOSPC,
            Error::TooManyLinks => libc::EMLINK,
            Error::NoData => libc::ENODATA,
            Error::Range => libc::ERANGE,
            Error::FileTooBig => libc::EFBIG,
            Error::ReadOnly | Error::DeviceReadOnly => libc::EROFS,
            Error::NotPermitted | Error::Refused(_) => libc::EPERM,
            Error::PathTooLong(_) => libc::ENAMETOOLONG,
            Error::CrossDevice => libc::EXDEV,
            Error::NoSuchOffset => libc::ENXIO,
            Error::NotSupported(_) => libc::EOPNOTSUPP,
            Error::DirIndexesExhausted { .. } => libc::EOVERFLOW,
            Error::Io(_) | Error::Corrupt(_) | Error::BadData(_) | Error::NodeNotCached => {
                libc::EIO
            }
        }
    }

    pub(crate) fn corrupt(c: Corruption) -> Error {
        Error::Corrupt(c)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotFound => f.write_str("no such file or directory"),
            Error::Exists => f.write_str("file exists"),
            Error::NotDir => f.write_str("not a directory"),
            Error::IsDir => f.write_str("is a directory"),
            Error::NotEmpty => f.write_str("directory not empty"),
            Error::NameTooLong => f.write_str("file name too long"),
            Error::InvalidArgument(what) => write!(f, "invalid argument: {what}"),
            Error::NoSpace => f.write_str("no space left on device"),
            Error::TooManyLinks => f.write_str("too many links"),
            Error::NoData => f.write_str("no such attribute"),
            Error::Range => f.write_str("value out of range"),
            Error::FileTooBig => f.write_str("file too large"),
            Error::ReadOnly => f.write_str("read-only filesystem"),
            Error::DeviceReadOnly => {
                f.write_str("the device was opened read-only (it is not writable here)")
            }
            Error::NotPermitted => f.write_str("operation not permitted"),
            Error::Refused(why) => write!(f, "operation not permitted: {why}"),
            Error::PathTooLong(what) => write!(f, "path too long: {what}"),
            Error::CrossDevice => f.write_str("rename or link across subvolumes"),
            Error::NoSuchOffset => f.write_str("no such offset (no more data or holes)"),
            Error::NotSupported(what) => write!(f, "not supported: {what}"),
            Error::DirIndexesExhausted { dir } => write!(
                f,
                "directory {dir} has no dir index left (its last one is near 2^64)"
            ),
            Error::Io(e) => write!(f, "I/O error: {e}"),
            Error::Corrupt(c) => c.fmt(f),
            Error::BadData(what) => write!(f, "bad data: {what}"),
            Error::NodeNotCached => {
                f.write_str("internal: a read-only request needed an uncached tree node")
            }
        }
    }
}

impl std::error::Error for Error {}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}
