//! Pass `data` (`birch check --verify-data`, docs/CHECK.md "Verifying the
//! data"): every data extent a subvolume tree references is read once,
//! however many file extent items share it (reflinks, snapshots, the
//! pieces a punch or truncate leaves); each block with a checksum must
//! match it, and a compressed extent whose blocks match must decompress
//! with its algorithm to exactly the length its items record. The
//! `btrfs check --check-data-csum` of birch, plus what compression adds.
//!
//! Bounded: a regular extent is read in pieces of at most [`READ_PIECE`]
//! bytes; a compressed one is kept whole, which decoding bounds to less
//! than `MAX_COMPRESSED_RAM`, and decompression allocates at most
//! `MAX_COMPRESSED_RAM + 1` bytes whatever the item says.

use super::csums::CsumValues;
use super::{Checker, DataVerified, FaultId, FileExtentKind, Loc, PassStatus};
use crate::format::{
    block_csum, tree_id, verify_decompression, CompressedRef, DecompressFault, SECTOR_SIZE,
};
use std::collections::BTreeMap;

/// Most bytes read at once.
const READ_PIECE: u64 = 1 << 20;

/// One disk extent to read, and what the items pointing at it say.
struct Target {
    /// The first item pointing at it, which its faults name (tree,
    /// inode and file offset are its key).
    loc: Loc,
    /// How many items point at it.
    items: u64,
    /// The compressions its compressed items record (one, unless they
    /// disagree), each with the first item recording it.
    compressions: Vec<(CompressedRef, Loc)>,
}

/// What reading one extent found.
#[derive(Default)]
struct BlockCheck {
    /// Blocks whose checksum does not match.
    bad: u64,
    /// The first of them: (block, stored, computed).
    first_bad: Option<(u64, u32, u32)>,
}

pub(super) fn run(c: &mut Checker<'_>) -> PassStatus {
    let Some(sb) = c.sb.clone() else {
        return PassStatus::Skipped("no valid superblock".into());
    };
    if c.fs.is_empty() {
        return PassStatus::Skipped("no subvolume tree could be read".into());
    }
    let checksums = sb.data_checksums && c.tree_readable(tree_id::CSUM);
    let values = std::mem::take(&mut c.csums.values);
    let targets = targets(c);
    let mut verified = DataVerified::default();
    for (&(bytenr, len), target) in &targets {
        verify_extent(c, &values, checksums, bytenr, len, target, &mut verified);
    }
    report_inline_decompressions(c, &mut verified);
    c.report.summary.data_verified = Some(verified);
    if sb.data_checksums && !checksums {
        return PassStatus::Skipped(
            "the checksum tree could not be read: compressed extents decompressed, checksums not compared"
                .into(),
        );
    }
    PassStatus::Ran
}

/// The disk extents the subvolume trees reference, by (bytenr, length),
/// each once.
fn targets(c: &Checker<'_>) -> BTreeMap<(u64, u64), Target> {
    let mut out: BTreeMap<(u64, u64), Target> = BTreeMap::new();
    for fe in c.all_file_extents() {
        let Some(d) = fe.kind.disk() else { continue };
        let t = out
            .entry((d.disk_bytenr, d.disk_num_bytes))
            .or_insert(Target {
                loc: fe.loc,
                items: 0,
                compressions: Vec::new(),
            });
        t.items += 1;
        if let FileExtentKind::Compressed(_, cr) = fe.kind {
            if !t.compressions.iter().any(|(known, _)| *known == cr) {
                t.compressions.push((cr, fe.loc));
            }
        }
    }
    out
}

/// Reads the extent `[bytenr, bytenr + len)` once, compares each block
/// that has a checksum, and decompresses it for each compression its
/// items record when its blocks match.
fn verify_extent(
    c: &mut Checker<'_>,
    values: &CsumValues,
    checksums: bool,
    bytenr: u64,
    len: u64,
    t: &Target,
    verified: &mut DataVerified,
) {
    let what = describe(bytenr, len, t);
    let end = bytenr.checked_add(len);
    let aligned = bytenr.is_multiple_of(SECTOR_SIZE) && len.is_multiple_of(SECTOR_SIZE);
    let Some(end) = end.filter(|&e| len > 0 && aligned && e <= c.dev.size_bytes()) else {
        c.fault_at(
            FaultId::DataUnreadable,
            &t.loc,
            format!(
                "{what}: not read: empty, unaligned or past the end of the {}-byte device",
                c.dev.size_bytes()
            ),
        );
        return;
    };
    let has_checksums = checksums
        && (0..len / SECTOR_SIZE).any(|i| values.value_of(bytenr + i * SECTOR_SIZE).is_some());
    if !has_checksums && t.compressions.is_empty() {
        return; // nothing to compare (no checksums, e.g. preallocated)
    }
    // A compressed extent is kept whole for its decompression; decoding
    // bounded its length below MAX_COMPRESSED_RAM.
    let mut whole = Vec::new();
    let mut blocks = BlockCheck::default();
    let mut buf = Vec::new();
    let mut at = bytenr;
    while at < end {
        let n = (end - at).min(READ_PIECE);
        buf.resize(n as usize, 0);
        if let Err(e) = c.dev.read_at(&mut buf, at) {
            c.fault_at(
                FaultId::DataUnreadable,
                &t.loc,
                format!("{what}: reading {n} bytes at {at} failed: {e}"),
            );
            return;
        }
        if has_checksums {
            compare_blocks(values, at, &buf, &mut blocks);
        }
        if !t.compressions.is_empty() {
            whole.extend_from_slice(&buf);
        }
        at += n;
    }
    verified.extents += 1;
    verified.bytes += len;
    if let Some((block, stored, computed)) = blocks.first_bad {
        c.fault_at(
            FaultId::DataCsumMismatch,
            &t.loc,
            format!(
                "{what}: block {block}: checksum mismatch: stored {stored:#010x}, computed {computed:#010x} ({} of {} blocks bad{})",
                blocks.bad,
                len / SECTOR_SIZE,
                if t.compressions.is_empty() { "" } else { "; not decompressed" }
            ),
        );
        return;
    }
    for (cr, loc) in &t.compressions {
        verified.decompressed += 1;
        let src = usize::try_from(cr.compressed_len)
            .ok()
            .and_then(|l| whole.get(..l));
        let outcome = match src {
            Some(src) => verify_decompression(cr.compression, src, cr.ram_bytes),
            None => Err(DecompressFault::Codec(format!(
                "{} compressed bytes recorded on a disk extent of {len}",
                cr.compressed_len
            ))),
        };
        let (id, why) = match outcome {
            Ok(()) => continue,
            Err(e @ DecompressFault::Length(_)) => (FaultId::CompressedLength, e.to_string()),
            Err(e) => (FaultId::CompressedUndecodable, e.to_string()),
        };
        c.fault_at(
            id,
            loc,
            format!(
                "{what}: its {} bytes of {} should decompress to {}: {why}",
                cr.compressed_len, cr.compression, cr.ram_bytes
            ),
        );
    }
}

/// Reports what decompressing each compressed inline extent gave (the
/// walk did it, having the item's bytes): a codec error or a stream of
/// another length than the item's `ram_bytes`.
fn report_inline_decompressions(c: &mut Checker<'_>, verified: &mut DataVerified) {
    for d in std::mem::take(&mut c.inline_decompressions) {
        verified.inline_decompressed += 1;
        let (id, why) = match d.outcome {
            Ok(()) => continue,
            Err(e @ DecompressFault::Length(_)) => (FaultId::CompressedLength, e.to_string()),
            Err(e) => (FaultId::CompressedUndecodable, e.to_string()),
        };
        c.fault_at(
            id,
            &d.loc,
            format!(
                "compressed inline extent of inode {} at file offset {}: its {} bytes of {} should decompress to {}: {why}",
                d.loc.key.objectid, d.loc.key.offset, d.stored, d.compression, d.ram_bytes
            ),
        );
    }
}

/// Counts the blocks of `buf` (read at `at`) that do not match their
/// recorded checksum; blocks without one are not compared (`data-csums`
/// reports those a regular extent needs).
fn compare_blocks(values: &CsumValues, at: u64, buf: &[u8], out: &mut BlockCheck) {
    for (i, block) in buf.chunks_exact(SECTOR_SIZE as usize).enumerate() {
        let b = at + i as u64 * SECTOR_SIZE;
        let Some(stored) = values.value_of(b) else {
            continue;
        };
        let computed = block_csum(block);
        if stored != computed {
            out.bad += 1;
            out.first_bad.get_or_insert((b, stored, computed));
        }
    }
}

/// The extent and who references it, for a fault's reason.
fn describe(bytenr: u64, len: u64, t: &Target) -> String {
    format!(
        "data extent {bytenr}+{len} (inode {} file offset {}{})",
        t.loc.key.objectid,
        t.loc.key.offset,
        match t.items {
            1 => String::new(),
            n => format!(", one of {n} file extent items sharing it"),
        }
    )
}
