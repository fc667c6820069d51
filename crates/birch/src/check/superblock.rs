//! Pass `superblock`: both copies, the current one, sizes.

use super::{Checker, FaultId, PassStatus};
use crate::device::BlockDevice;
use crate::format::{
    Superblock, SuperblockError, FIRST_ALLOCATABLE_BYTE, NODE_SIZE, SECTOR_SIZE,
    SUPERBLOCK_OFFSETS, SUPERBLOCK_SIZE,
};
use std::fmt;

/// One superblock copy as read from the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuperblockCopy {
    /// Where the copy lives (one of SUPERBLOCK_OFFSETS).
    pub bytenr: u64,
    /// The decoded copy, or why it is not valid.
    pub superblock: Result<Superblock, SuperblockCopyError>,
}

/// Why a superblock copy is not valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SuperblockCopyError {
    /// The device ends before the copy.
    PastDeviceEnd { device_bytes: u64 },
    /// Reading it failed.
    Unreadable(String),
    /// It does not decode.
    Invalid(SuperblockError),
}

impl SuperblockCopyError {
    pub fn fault_id(&self) -> FaultId {
        match self {
            SuperblockCopyError::PastDeviceEnd { .. } => FaultId::SuperblockPastDeviceEnd,
            SuperblockCopyError::Unreadable(_) => FaultId::SuperblockUnreadable,
            SuperblockCopyError::Invalid(e) => match e {
                SuperblockError::BadMagic => FaultId::SuperblockMagic,
                SuperblockError::BadChecksum { .. } => FaultId::SuperblockChecksum,
                SuperblockError::WrongBytenr { .. } => FaultId::SuperblockLocation,
                SuperblockError::Unsupported(_) => FaultId::SuperblockUnsupported,
            },
        }
    }
}

impl fmt::Display for SuperblockCopyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SuperblockCopyError::PastDeviceEnd { device_bytes } => {
                write!(f, "device ends at {device_bytes} bytes, before this copy")
            }
            SuperblockCopyError::Unreadable(e) => write!(f, "read error: {e}"),
            SuperblockCopyError::Invalid(e) => e.fmt(f),
        }
    }
}

/// Reads every superblock copy; never fails (a copy that cannot be read is
/// an `Err` naming why).
pub fn read_superblock_copies<D: BlockDevice + ?Sized>(dev: &D) -> Vec<SuperblockCopy> {
    SUPERBLOCK_OFFSETS
        .iter()
        .map(|&bytenr| {
            let size = dev.size_bytes();
            let superblock = if bytenr.saturating_add(SUPERBLOCK_SIZE as u64) > size {
                Err(SuperblockCopyError::PastDeviceEnd { device_bytes: size })
            } else {
                let mut buf = vec![0u8; SUPERBLOCK_SIZE];
                match dev.read_at(&mut buf, bytenr) {
                    Ok(()) => {
                        Superblock::decode(&buf, bytenr).map_err(SuperblockCopyError::Invalid)
                    }
                    Err(e) => Err(SuperblockCopyError::Unreadable(e.to_string())),
                }
            };
            SuperblockCopy { bytenr, superblock }
        })
        .collect()
}

/// The valid copy with the highest generation (the first on a tie).
pub fn newest_valid_copy(copies: &[SuperblockCopy]) -> Option<&SuperblockCopy> {
    let mut best: Option<&SuperblockCopy> = None;
    for c in copies {
        if let Ok(sb) = &c.superblock {
            if best
                .and_then(|b| b.superblock.as_ref().ok())
                .is_none_or(|b| {
                    (sb.generation, sb.log_generation) > (b.generation, b.log_generation)
                })
            {
                best = Some(c);
            }
        }
    }
    best
}

pub(super) fn run(c: &mut Checker<'_>) -> PassStatus {
    let copies = read_superblock_copies(c.dev);
    let Some(current) = newest_valid_copy(&copies).cloned() else {
        for copy in &copies {
            if let Err(why) = &copy.superblock {
                let reason = format!("superblock copy at {}: {why}", copy.bytenr);
                c.fault_tree(why.fault_id(), None, reason);
            }
        }
        return PassStatus::Ran;
    };
    let sb = current
        .superblock
        .clone()
        .expect("newest_valid_copy returns a valid copy");
    for copy in &copies {
        if copy.bytenr == current.bytenr {
            continue;
        }
        match &copy.superblock {
            Err(why) => c.warn_tree(why.fault_id(), None, format!("superblock copy at {}: {why} (using the copy at {}, generation {})", copy.bytenr, current.bytenr, sb.generation)),
            Ok(other) if other.fsid != sb.fsid => c.warn_tree(
                FaultId::SuperblockOtherFilesystem,
                None,
                format!("superblock copy at {} belongs to another filesystem (fsid {}; using the copy at {})", copy.bytenr, crate::print::fsid(&other.fsid), current.bytenr),
            ),
            Ok(other) if other.generation < sb.generation => {
                c.warn_tree(FaultId::SuperblockStale, None, format!("superblock copy at {} is stale: generation {} (using the copy at {}, generation {})", copy.bytenr, other.generation, current.bytenr, sb.generation))
            }
            // A cut between the two copies of a log sync's superblock: the
            // other copy points at the previous log (or none), and may
            // lack INCOMPAT_COMPRESSION, which the log sync of the first
            // compressed extent sets (docs/COMPRESSION.md, C1).
            Ok(other) if other.generation == sb.generation && other.log_generation < sb.log_generation && (sb.compression || !other.compression) && Superblock { log_root_bytenr: sb.log_root_bytenr, log_root_level: sb.log_root_level, log_generation: sb.log_generation, log_manifest: sb.log_manifest.clone(), compression: sb.compression, ..other.clone() } == sb => c.warn_tree(
                FaultId::SuperblockOlderLog,
                None,
                format!("superblock copy at {} points at an older log (log generation {}; using the copy at {}, log generation {})", copy.bytenr, other.log_generation, current.bytenr, sb.log_generation),
            ),
            Ok(other) if *other != sb => c.fault_tree(FaultId::SuperblockCopiesDiffer, None, format!("superblock copies at {} and {} have the same generation {} but differ", current.bytenr, copy.bytenr, sb.generation)),
            Ok(_) => {}
        }
    }

    let dev_size = c.dev.size_bytes();
    if sb.total_bytes > dev_size {
        c.fault_tree(FaultId::FilesystemPastDeviceEnd, None, format!("superblock says the filesystem is {} bytes but the device has only {dev_size} (truncated image?)", sb.total_bytes));
    }
    if !sb.total_bytes.is_multiple_of(SECTOR_SIZE)
        || sb.total_bytes < FIRST_ALLOCATABLE_BYTE + NODE_SIZE as u64
    {
        c.fault_tree(
            FaultId::TotalBytesInvalid,
            None,
            format!(
                "superblock total_bytes {} is not a sector multiple of at least {}",
                sb.total_bytes,
                FIRST_ALLOCATABLE_BYTE + NODE_SIZE as u64
            ),
        );
    }
    if sb.bytes_used > sb.total_bytes {
        c.fault_tree(
            FaultId::BytesUsedExceedsTotal,
            None,
            format!(
                "superblock bytes_used {} exceeds total_bytes {}",
                sb.bytes_used, sb.total_bytes
            ),
        );
    }
    if sb.log_root_bytenr == 0 && (sb.log_root_level != 0 || sb.log_generation != 0) {
        c.warn_tree(
            FaultId::LogFieldsWithoutLog,
            None,
            format!(
                "no log root but log_root_level {} / log_generation {} are set",
                sb.log_root_level, sb.log_generation
            ),
        );
    }

    check_backup_roots(c, &sb);

    let s = &mut c.report.summary;
    s.superblock_copy = Some(current.bytenr);
    s.fsid = sb.fsid;
    s.generation = sb.generation;
    s.total_bytes = sb.total_bytes;
    s.bytes_used_recorded = sb.bytes_used;
    s.metadata_profile = sb.metadata_profile;
    c.sb = Some(sb);
    PassStatus::Ran
}

/// The backup-root slots (docs/BACKUP-ROOTS.md): filled slots first, in
/// strictly decreasing generation, none newer than the superblock, and a
/// slot of the superblock's own generation records its roots. Whether the
/// older commits are still readable is not checked: only the previous one
/// is guaranteed, and a mount tells by trying.
fn check_backup_roots(c: &mut Checker<'_>, sb: &Superblock) {
    let mut newer: Option<u64> = None;
    let mut seen_empty = false;
    for (slot, backup) in sb.backup_roots.iter().enumerate() {
        if backup.is_empty() {
            seen_empty = true;
            continue;
        }
        let out_of_order = seen_empty
            || backup.generation > sb.generation
            || newer.is_some_and(|g| backup.generation >= g);
        if out_of_order {
            c.fault_tree(
                FaultId::BackupRootOrder,
                None,
                format!(
                    "backup root slot {slot} (generation {}) is out of order: filled slots \
                     come first, newest first, none newer than the superblock's generation {}",
                    backup.generation, sb.generation
                ),
            );
        }
        if backup.generation == sb.generation
            && (
                backup.root_tree_bytenr,
                backup.root_tree_level,
                backup.bytes_used,
            ) != (sb.root_tree_bytenr, sb.root_tree_level, sb.bytes_used)
        {
            c.fault_tree(
                FaultId::BackupRootMismatch,
                None,
                format!(
                    "backup root slot {slot} records generation {} with root tree {} level {} \
                     and bytes_used {}, the superblock {} level {} and {}",
                    backup.generation,
                    backup.root_tree_bytenr,
                    backup.root_tree_level,
                    backup.bytes_used,
                    sb.root_tree_bytenr,
                    sb.root_tree_level,
                    sb.bytes_used
                ),
            );
        }
        newer = Some(backup.generation);
    }
}
