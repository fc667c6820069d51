//! Pass `file-extents`: each inode's EXTENT_DATA items.

use super::{
    Checker, FaultId, FileExtentKind, FileExtentRec, FsRecords, InodeRec, Loc, PassStatus,
};
use crate::format::{FileType, MAX_INLINE_DATA, MAX_INLINE_RAM, SECTOR_SIZE, SYMLINK_MAX};
use crate::print::file_type_name;
use std::collections::HashMap;

/// A fault found, kept to be reported in key order.
type Found = Vec<(Loc, FaultId, String)>;

/// Pass `file-extents`: each inode's extents, by the rules of its type.
pub(super) fn run(c: &mut Checker<'_>) -> PassStatus {
    super::namespace::for_each_fs_tree(c, check_tree)
}

/// One subvolume tree's inodes and their extents.
fn check_tree(c: &mut Checker<'_>, fs: &FsRecords) {
    let mut by_ino: HashMap<u64, Vec<&FileExtentRec>> = HashMap::new();
    for fe in &fs.file_extents {
        by_ino.entry(fe.ino).or_default().push(fe);
    }
    let mut faults: Found = Vec::new();
    let compression = c.sb.as_ref().is_some_and(|sb| sb.compression);
    for fe in &fs.file_extents {
        let compressed = matches!(
            fe.kind,
            FileExtentKind::Compressed(..)
                | FileExtentKind::Inline {
                    compression: Some(_),
                    ..
                }
        );
        if compressed && !compression {
            faults.push((
                fe.loc,
                FaultId::CompressedWithoutFeature,
                "compressed file extent on an image without INCOMPAT_COMPRESSION".into(),
            ));
        }
    }
    for (&ino, inode) in &fs.inodes {
        let mut extents = by_ino.remove(&ino).unwrap_or_default();
        extents.sort_by_key(|fe| fe.file_offset);
        let Some(ft) = FileType::from_mode(inode.item.mode) else {
            continue;
        };
        check_nbytes(inode, &extents, &mut faults);
        match ft {
            FileType::Regular => check_regular_extents(inode, &extents, &mut faults),
            FileType::Symlink => check_symlink_extents(inode, &extents, &mut faults),
            other => check_no_extents(other, &extents, &mut faults),
        }
    }
    // Extents of inodes without an INODE_ITEM are reported by `namespace`.
    faults.sort_by_key(|(loc, _, _)| (loc.key, loc.block, loc.slot));
    for (loc, id, reason) in faults {
        c.fault_at(id, &loc, reason);
    }
}

/// nbytes is the sum of what the extents add (`FileExtent::nbytes`: their
/// lengths, a compressed extent's share of its disk extent).
fn check_nbytes(inode: &InodeRec, extents: &[&FileExtentRec], faults: &mut Found) {
    let item = &inode.item;
    let mut nbytes: u64 = 0;
    for fe in extents {
        nbytes = nbytes.saturating_add(fe.kind.nbytes());
    }
    if nbytes != item.nbytes {
        faults.push((
            inode.loc,
            FaultId::Nbytes,
            format!(
                "nbytes {} but the file extents hold {nbytes} bytes",
                item.nbytes
            ),
        ));
    }
}

/// A symlink's target is one inline extent at offset 0, of the inode's
/// size and within the limit.
fn check_symlink_extents(inode: &InodeRec, extents: &[&FileExtentRec], faults: &mut Found) {
    let item = &inode.item;
    match extents {
        [] => faults.push((
            inode.loc,
            FaultId::SymlinkWithoutExtent,
            "symlink has no inline extent holding its target".into(),
        )),
        [fe] => match fe.kind {
            FileExtentKind::Inline {
                len,
                compression: None,
            } if fe.file_offset == 0 => {
                if len != item.size {
                    faults.push((
                        fe.loc,
                        FaultId::SymlinkTargetSize,
                        format!(
                            "symlink target is {len} bytes but the inode size is {}",
                            item.size
                        ),
                    ));
                }
                if len > SYMLINK_MAX as u64 {
                    faults.push((
                        fe.loc,
                        FaultId::SymlinkTargetTooLong,
                        format!("symlink target of {len} bytes exceeds {SYMLINK_MAX}"),
                    ));
                }
            }
            _ => faults.push((
                fe.loc,
                FaultId::SymlinkExtentNotInline,
                "a symlink's only extent must be inline at offset 0".into(),
            )),
        },
        [_, rest @ ..] => {
            for fe in rest {
                faults.push((
                    fe.loc,
                    FaultId::SymlinkExtraExtent,
                    "symlink has more than one extent".into(),
                ));
            }
        }
    }
}

/// Directories and special files have no extents.
fn check_no_extents(file_type: FileType, extents: &[&FileExtentRec], faults: &mut Found) {
    for fe in extents {
        faults.push((
            fe.loc,
            FaultId::ExtentsOnNonFile,
            format!("a {} has no file extents", file_type_name(file_type)),
        ));
    }
}

/// A regular file's extents: inline only alone at offset 0 and within the
/// limits, others aligned and (unless preallocated) below the size, none
/// overlapping.
fn check_regular_extents(inode: &InodeRec, extents: &[&FileExtentRec], faults: &mut Found) {
    let item = &inode.item;
    let size_end = item.size.div_ceil(SECTOR_SIZE).saturating_mul(SECTOR_SIZE);
    let mut prev_end: Option<u64> = None;
    for fe in extents {
        match fe.kind {
            FileExtentKind::Inline { len, compression } => {
                if fe.file_offset != 0 {
                    faults.push((
                        fe.loc,
                        FaultId::InlineOffset,
                        format!(
                            "inline extent at file offset {} (only offset 0 may be inline)",
                            fe.file_offset
                        ),
                    ));
                }
                if extents.len() > 1 {
                    faults.push((
                        fe.loc,
                        FaultId::InlineNotAlone,
                        "inline extent is not the file's only extent".into(),
                    ));
                }
                // A compressed one holds up to a page of data in at most
                // MAX_INLINE_DATA bytes (checked at decode).
                let limit = match compression {
                    Some(_) => MAX_INLINE_RAM,
                    None => MAX_INLINE_DATA as u64,
                };
                if len > limit {
                    faults.push((
                        fe.loc,
                        FaultId::InlineTooLong,
                        format!("inline extent of {len} bytes exceeds {limit}"),
                    ));
                }
                if len > item.size {
                    faults.push((
                        fe.loc,
                        FaultId::InlinePastEof,
                        format!(
                            "inline extent of {len} bytes is longer than the file ({} bytes)",
                            item.size
                        ),
                    ));
                }
            }
            FileExtentKind::Regular(_)
            | FileExtentKind::Prealloc(_)
            | FileExtentKind::Compressed(..) => {
                if !fe.file_offset.is_multiple_of(SECTOR_SIZE) {
                    faults.push((
                        fe.loc,
                        FaultId::FileOffsetUnaligned,
                        format!(
                            "file offset {} is not {SECTOR_SIZE}-byte aligned",
                            fe.file_offset
                        ),
                    ));
                }
                if !matches!(fe.kind, FileExtentKind::Prealloc(_)) && fe.file_offset >= size_end {
                    faults.push((
                        fe.loc,
                        FaultId::RegularPastEof,
                        format!(
                            "regular extent at file offset {} lies beyond the file size {}",
                            fe.file_offset, item.size
                        ),
                    ));
                }
            }
        }
        let len = match fe.kind {
            FileExtentKind::Inline { len, .. } => len,
            FileExtentKind::Regular(d)
            | FileExtentKind::Prealloc(d)
            | FileExtentKind::Compressed(d, _) => d.num_bytes,
        };
        if let Some(end) = prev_end {
            if fe.file_offset < end {
                faults.push((fe.loc, FaultId::FileExtentOverlap, format!("extent at file offset {} overlaps the previous extent, which ends at {end}", fe.file_offset)));
            }
        }
        let end = fe.file_offset.checked_add(len);
        if end.is_none() {
            faults.push((
                fe.loc,
                FaultId::FileExtentOverflow,
                format!("extent at file offset {} + {len} overflows", fe.file_offset),
            ));
        }
        prev_end = Some(end.unwrap_or(u64::MAX).max(prev_end.unwrap_or(0)));
    }
}
