//! Pass `data-csums` (docs/DATA-CHECKSUMS.md): on an image with data
//! checksums, the checksum tree covers every block of every data extent a
//! Regular file extent points into, covers nothing else (no free space, no
//! tree node), and its items do not overlap; log checksum items are well
//! formed and do not overlap one another. Items are collected by the
//! `tree-structure` walk ([`Checker::collect_csum_item`]).

use super::{Checker, ExtentKind, FaultId, FileExtentKind, Loc, PassStatus};
use crate::format::tree_name;
use crate::format::{tree_id, TreeKind, EXTENT_CSUM_OBJECTID, SECTOR_SIZE};
use std::collections::BTreeMap;

/// One checksum item: the data it covers, and where it is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CsumRec {
    pub start: u64,
    pub len: u64,
    pub loc: Loc,
}

/// The checksum items the walk found.
#[derive(Debug, Default)]
pub(crate) struct CsumRecords {
    /// Of the checksum tree, in key order.
    pub items: Vec<CsumRec>,
    /// Of the log trees, one tree after another, each in key order.
    pub log_items: Vec<CsumRec>,
    /// With `--verify-data` only: the checksum tree's checksums, what the
    /// `data` pass compares the blocks it reads with.
    pub values: CsumValues,
}

/// The checksums of the checksum tree's items, by the start of the item
/// holding them (4 bytes per data block).
#[derive(Debug, Default)]
pub(crate) struct CsumValues(BTreeMap<u64, Vec<u32>>);

impl CsumValues {
    /// The recorded checksum of the data block at `block`, if an item
    /// covers it (of overlapping items, which `csum-overlap` reports, the
    /// one starting last).
    pub fn value_of(&self, block: u64) -> Option<u32> {
        let (&start, sums) = self.0.range(..=block).next_back()?;
        let index = usize::try_from((block - start) / SECTOR_SIZE).ok()?;
        sums.get(index).copied()
    }
}

impl Checker<'_> {
    /// The key rules of a checksum item: objectid `EXTENT_CSUM_OBJECTID`,
    /// a sector-aligned start. False when it is not to be decoded.
    pub(super) fn check_csum_key(&mut self, loc: &Loc) -> bool {
        let key = loc.key;
        if key.objectid != EXTENT_CSUM_OBJECTID {
            self.fault_at(
                FaultId::CsumKey,
                loc,
                format!("EXTENT_CSUM items live under objectid {EXTENT_CSUM_OBJECTID}"),
            );
            return false;
        }
        if !key.offset.is_multiple_of(SECTOR_SIZE) {
            self.fault_at(
                FaultId::CsumUnaligned,
                loc,
                format!("checksum item start {} is not sector aligned", key.offset),
            );
            return false;
        }
        true
    }

    /// Keeps a decoded checksum item, of the checksum tree or (for
    /// `TreeKind::Log`) of a log tree; its values only for `--verify-data`.
    /// An item whose range would end past 2^64 is a fault and is not kept
    /// (the passes below add `start + len`).
    pub(super) fn record_csums(&mut self, kind: TreeKind, loc: &Loc, sums: Vec<u32>) {
        let count = sums.len();
        let len = (count as u64).saturating_mul(SECTOR_SIZE);
        if loc.key.offset.checked_add(len).is_none() {
            self.fault_at(
                FaultId::CsumKey,
                loc,
                format!(
                    "checksum item at {} with {count} checksums covers bytes past 2^64",
                    loc.key.offset
                ),
            );
            return;
        }
        let rec = CsumRec {
            start: loc.key.offset,
            len,
            loc: *loc,
        };
        if kind == TreeKind::Log {
            self.csums.log_items.push(rec);
        } else {
            self.csums.items.push(rec);
            if self.options.verify_data {
                self.csums.values.0.insert(loc.key.offset, sums);
            }
        }
    }
}

pub(super) fn run(c: &mut Checker<'_>) -> PassStatus {
    let Some(sb) = c.sb.clone() else {
        return PassStatus::Skipped("no valid superblock".into());
    };
    let has_tree = c.roots.contains_key(&tree_id::CSUM);
    let log_items = std::mem::take(&mut c.csums.log_items);
    // One log tree per subvolume: each tree's items come in key order (the
    // walk faults keys out of order), so a start not above the previous
    // one begins the next tree. Two subvolumes' logs may both hold the
    // checksums of an extent their files share.
    for one_log in log_items.chunk_by(|a, b| a.start < b.start) {
        no_overlaps(c, one_log);
    }
    if !sb.data_checksums {
        if has_tree {
            let loc = c.roots[&tree_id::CSUM].1;
            c.fault_at(
                FaultId::CsumTreeWithoutFlag,
                &loc,
                "a checksum tree, but the superblock does not have the data checksums flag",
            );
        }
        if let Some(first) = log_items.first() {
            c.fault_at(
                FaultId::CsumLogWithoutFlag,
                &first.loc,
                "a log checksum item, but the superblock does not have the data checksums flag",
            );
        }
        return PassStatus::Ran;
    }
    if !has_tree {
        c.fault_tree(
            FaultId::CsumTreeMissing,
            Some(tree_id::ROOT),
            format!(
                "the superblock has the data checksums flag but the root tree has no root item for the {} tree",
                tree_name(tree_id::CSUM)
            ),
        );
        return PassStatus::Ran;
    }
    if !c.tree_readable(tree_id::CSUM) {
        return PassStatus::Skipped("the checksum tree could not be read".into());
    }
    let items = std::mem::take(&mut c.csums.items);
    no_overlaps(c, &items);
    if !c.tree_readable(tree_id::EXTENT) {
        return PassStatus::Skipped(
            "the extent tree could not be read: coverage not checked".into(),
        );
    }
    let data = data_extents(c);
    for item in &items {
        let end = item.start + item.len;
        let inside = data
            .range(..=item.start)
            .next_back()
            .is_some_and(|(&b, &(len, _))| end <= b + len);
        if !inside {
            c.fault_at(
                FaultId::CsumOutsideExtent,
                &item.loc,
                format!(
                    "checksums of [{}, {end}) do not lie within one data extent (they cover free space, a tree node or two extents)",
                    item.start
                ),
            );
        }
    }
    if !c.tree_readable(tree_id::FS) {
        return PassStatus::Ran;
    }
    let mut referenced: Vec<u64> = c
        .all_file_extents()
        .filter_map(|f| match f.kind {
            FileExtentKind::Regular(d) | FileExtentKind::Compressed(d, _) => Some(d.disk_bytenr),
            _ => None,
        })
        .collect();
    referenced.sort_unstable();
    referenced.dedup();
    for bytenr in referenced {
        let Some(&(len, loc)) = data.get(&bytenr) else {
            continue; // extent-refs reports a file extent without its extent
        };
        if let Some(gap) = first_gap(&items, bytenr, bytenr + len) {
            c.fault_at(
                FaultId::CsumMissing,
                &loc,
                format!(
                    "block {gap} of data extent [{bytenr}, {}) has no checksum",
                    bytenr + len
                ),
            );
        }
    }
    PassStatus::Ran
}

/// Data extents by start: (length, where). An extent ending past 2^64 is
/// the extents pass's fault to report (extent-out-of-range); it is left
/// out here, where its end is computed.
fn data_extents(c: &Checker<'_>) -> BTreeMap<u64, (u64, Loc)> {
    c.extents
        .iter()
        .filter(|e| e.kind == ExtentKind::Data && e.bytenr.checked_add(e.len).is_some())
        .map(|e| (e.bytenr, (e.len, e.loc)))
        .collect()
}

/// Faults each item that starts before the previous one ends.
fn no_overlaps(c: &mut Checker<'_>, items: &[CsumRec]) {
    for w in items.windows(2) {
        if w[1].start < w[0].start + w[0].len {
            c.fault_at(
                FaultId::CsumOverlap,
                &w[1].loc,
                format!(
                    "checksums of [{}, {}) overlap those of [{}, {})",
                    w[1].start,
                    w[1].start + w[1].len,
                    w[0].start,
                    w[0].start + w[0].len
                ),
            );
        }
    }
}

/// The first block of `[start, end)` no item covers (`items` in order).
fn first_gap(items: &[CsumRec], start: u64, end: u64) -> Option<u64> {
    let mut next = start;
    let first = items.partition_point(|i| i.start + i.len <= start);
    for item in &items[first..] {
        if item.start > next || next >= end {
            break;
        }
        next = next.max(item.start + item.len);
    }
    (next < end).then_some(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Key;

    fn rec(start: u64, len: u64) -> CsumRec {
        CsumRec {
            start,
            len,
            loc: Loc {
                tree: tree_id::CSUM,
                block: 0,
                slot: 0,
                key: Key::MIN,
            },
        }
    }

    #[test]
    fn first_gap_finds_uncovered_blocks() {
        let items = [rec(0, 8192), rec(8192, 4096), rec(20480, 4096)];
        assert_eq!(first_gap(&items, 0, 12288), None);
        assert_eq!(first_gap(&items, 4096, 12288), None);
        assert_eq!(first_gap(&items, 0, 16384), Some(12288));
        assert_eq!(first_gap(&items, 16384, 24576), Some(16384));
        assert_eq!(first_gap(&items, 20480, 24576), None);
        assert_eq!(first_gap(&[], 0, 4096), Some(0));
    }
}
