//! Data checksums in the running transaction (docs/DATA-CHECKSUMS.md): a
//! new extent's checksums go into the checksum tree when it is written, a
//! freed extent's go when the commit frees it (fs/commit.rs), reads verify
//! them, the log carries those of extents it logs, and replay puts those
//! back.

use super::decode::decode_item;
use super::info::FsInfo;
use crate::btree::{Change, Forest, TreeRoot};
use crate::device::BlockDevice;
use crate::error::{Corruption, Error, Result};
use crate::format::{
    block_csum, csum_item_span, csum_key, decode_csums_at, encode_csums, item_type, tree_id,
    CompressedRef, DiskRef, FileExtent, Key, CSUMS_PER_ITEM, EXTENT_CSUM_OBJECTID, SECTOR_SIZE,
};
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;

/// Bytes of data one full checksum item covers.
const ITEM_SPAN: u64 = CSUMS_PER_ITEM * SECTOR_SIZE;

fn corrupt(tree: u64, reason: String) -> Error {
    Error::corrupt(Corruption {
        tree: Some(tree),
        block: None,
        slot: None,
        reason,
    })
}

/// Records the checksums of `data`, just written as the new extent at
/// `bytenr`: one item per `CSUMS_PER_ITEM` blocks, from the extent's start.
pub(super) fn insert_extent_csums<D: BlockDevice>(
    forest: &mut Forest<D>,
    root: &mut TreeRoot,
    bytenr: u64,
    data: &[u8],
) -> Result<()> {
    for (i, run) in data.chunks(ITEM_SPAN as usize).enumerate() {
        forest.put(
            root,
            csum_key(bytenr + i as u64 * ITEM_SPAN),
            encode_csums(run),
        )?;
    }
    Ok(())
}

/// Deletes the checksums of the extents `(bytenr, len)` being freed
/// (in address order, disjoint), in one sorted batch. (Items never span
/// two extents, so every item starting inside an extent is wholly its.)
pub(super) fn delete_extents_csums<D: BlockDevice>(
    forest: &mut Forest<D>,
    root: &mut TreeRoot,
    extents: &[(u64, u64)],
) -> Result<()> {
    let mut doomed = Vec::new();
    for &(bytenr, len) in extents {
        forest.scan(
            root,
            csum_key(bytenr),
            csum_key(bytenr + len - 1),
            &mut |key, _| {
                doomed.push((*key, Change::Delete));
                Ok(ControlFlow::Continue(()))
            },
        )?;
    }
    let refused = forest.apply_sorted(root, doomed)?;
    assert!(refused.is_empty(), "scanned checksum items vanished");
    Ok(())
}

/// The checksum of each block of `[start, end)` (sector aligned) that the
/// tree `root` records, `None` where no item covers the block.
pub(crate) fn lookup_csums<D: BlockDevice>(
    forest: &Forest<D>,
    root: &TreeRoot,
    start: u64,
    end: u64,
) -> Result<Vec<Option<u32>>> {
    let mut out = vec![None; ((end - start) / SECTOR_SIZE) as usize];
    let mut fill = |key: &Key, data: &[u8]| -> Result<()> {
        let sums = decode_csums_at(key, data)
            .map_err(|e| corrupt(root.id, format!("checksum item {key}: {e}")))?;
        for (i, sum) in sums.into_iter().enumerate() {
            let at = key.offset + i as u64 * SECTOR_SIZE;
            if (start..end).contains(&at) {
                out[((at - start) / SECTOR_SIZE) as usize] = Some(sum);
            }
        }
        Ok(())
    };
    // Only the last item starting before `start` can reach into the range.
    if let Some((key, data)) = forest.last_at_or_before(root, &csum_key(start))? {
        if key.objectid == EXTENT_CSUM_OBJECTID
            && key.item_type == item_type::EXTENT_CSUM
            && key.offset < start
        {
            fill(&key, &data)?;
        }
    }
    for (key, data) in forest.collect_range(root, csum_key(start), csum_key(end - 1))? {
        fill(&key, &data)?;
    }
    Ok(out)
}

/// The first block of `data` (read from `disk_bytenr`) whose checksum is
/// not the one recorded: its index, and what was recorded (`None`: no
/// checksum at all).
pub(crate) fn first_bad_block(data: &[u8], sums: &[Option<u32>]) -> Option<(usize, Option<u32>)> {
    data.chunks(SECTOR_SIZE as usize)
        .zip(sums)
        .enumerate()
        .find(|(_, (block, sum))| **sum != Some(block_csum(block)))
        .map(|(i, (_, sum))| (i, *sum))
}

/// How a failed block reads in a message: what the tree recorded against
/// what the block holds.
pub(crate) fn mismatch(recorded: Option<u32>, block: &[u8]) -> String {
    match recorded {
        Some(sum) => format!(
            "checksum {sum:#010x} recorded, the block has {:#010x}",
            block_csum(block)
        ),
        None => "no checksum recorded for the block".to_string(),
    }
}

impl<D: BlockDevice> FsInfo<D> {
    /// Counts `data`, the new extent at `bytenr` (written without the
    /// state lock, or to be written so as an unwritten extent), and on a
    /// checksum image records its checksums in the same transaction.
    pub(super) fn record_data_extent(&mut self, bytenr: u64, data: &[u8]) -> Result<()> {
        self.stats.data_bytes_written += data.len() as u64;
        if let Some(root) = self.roots.csum.as_mut() {
            insert_extent_csums(&mut self.forest, root, bytenr, data)?;
        }
        Ok(())
    }

    /// Plans the read of `len` bytes from `disk_bytenr` (file offset
    /// `file_offset`, both sector aligned) into `at` of a buffer: with the
    /// checksums to verify them against on a checksum image, looked up now,
    /// under the state lock, so that [`read_planned`] needs no tree.
    pub(super) fn plan_data_read(
        &self,
        file_offset: u64,
        disk_bytenr: u64,
        at: usize,
        len: usize,
    ) -> Result<ExtentRead> {
        if let Some(unwritten) = self.unwritten.covering(disk_bytenr, len) {
            // Not on the device yet: the bytes in memory are the data.
            return Ok(ExtentRead {
                at,
                len,
                file_offset,
                disk_bytenr,
                sums: None,
                unwritten: Some(unwritten),
                compressed: None,
            });
        }
        let sums = match self.roots.csum {
            Some(root) => Some(lookup_csums(
                &self.forest,
                &root,
                disk_bytenr,
                disk_bytenr + len as u64,
            )?),
            None => None,
        };
        Ok(ExtentRead {
            at,
            len,
            file_offset,
            disk_bytenr,
            sums,
            unwritten: None,
            compressed: None,
        })
    }

    /// Plans the read of `len` bytes of a compressed extent's data (file
    /// offset `file_offset`), from `from` bytes into what it decompresses
    /// to, into `at` of a buffer:
    /// the whole disk extent is read (and verified: its checksums cover
    /// the compressed bytes) and decompressed (docs/COMPRESSION.md).
    pub(super) fn plan_compressed_read(
        &self,
        file_offset: u64,
        disk: DiskRef,
        compressed: CompressedRef,
        from: u64,
        (at, len): (usize, usize),
    ) -> Result<ExtentRead> {
        let mut read = self.plan_data_read(
            file_offset,
            disk.disk_bytenr,
            0,
            disk.disk_num_bytes as usize,
        )?;
        read.at = at;
        read.len = len;
        read.compressed = Some(CompressedRead {
            compressed,
            disk_len: disk.disk_num_bytes as usize,
            from: from as usize,
            inline: false,
        });
        Ok(read)
    }

    /// The checksum items to log with the file extent item `key`/`data`:
    /// those of its extent when the extent was written in this transaction
    /// (no extent item in the extent tree yet), which the committed
    /// checksum tree does not have. Extents of earlier commits need none.
    pub(super) fn csums_to_log(&self, key: &Key, data: &[u8]) -> Result<Vec<(Key, Vec<u8>)>> {
        let Some(root) = self.roots.csum else {
            return Ok(Vec::new());
        };
        let extent = decode_item(key, FileExtent::decode_at(key, data))?;
        let (FileExtent::Regular { .. } | FileExtent::Compressed { .. }, Some(disk)) =
            (&extent, extent.disk_ref())
        else {
            return Ok(Vec::new());
        };
        let extent_key = Key::new(
            disk.disk_bytenr,
            item_type::EXTENT_ITEM,
            disk.disk_num_bytes,
        );
        if self.forest.get(&self.roots.extent, &extent_key)?.is_some() {
            return Ok(Vec::new());
        }
        self.forest.collect_range(
            &root,
            csum_key(disk.disk_bytenr),
            csum_key(disk.disk_bytenr + disk.disk_num_bytes - 1),
        )
    }

    /// Replay: puts the log's checksum items into the checksum tree, those
    /// lying inside an extent a logged file extent names (`extents`:
    /// bytenr -> length). Others belong to extents rewritten and freed
    /// after an earlier fsync logged them; they must not cover free space.
    /// Returns the keys of the items put back.
    pub(super) fn replay_csums(
        &mut self,
        items: Vec<(Key, Vec<u8>)>,
        extents: &BTreeMap<u64, u64>,
    ) -> Result<Vec<Key>> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let Some(root) = self.roots.csum.as_mut() else {
            return Err(corrupt(
                tree_id::LOG,
                "the log holds checksum items but the image has no data checksums".into(),
            ));
        };
        let mut replayed = Vec::new();
        for (key, data) in items {
            decode_csums_at(&key, &data)
                .map_err(|e| corrupt(tree_id::LOG, format!("checksum item {key}: {e}")))?;
            let end = key.offset + csum_item_span(data.len());
            let inside = extents
                .range(..=key.offset)
                .next_back()
                .is_some_and(|(&bytenr, &len)| end <= bytenr + len);
            if inside {
                self.forest.put(root, key, data)?;
                replayed.push(key);
            }
        }
        Ok(replayed)
    }
}

/// Plans the read of `len` bytes of a compressed inline extent's data (its
/// item's `compressed` bytes, decompressing to `ram_bytes`), from `from`
/// into `at` of a buffer: nothing is read from the device, and the
/// decompression happens where the plan is executed, without the state
/// lock for a file read (docs/COMPRESSION.md, "Compressed inline
/// extents").
pub(super) fn plan_inline_compressed_read(
    compressed: &[u8],
    ram_bytes: u64,
    compression: crate::format::Compression,
    from: u64,
    (at, len): (usize, usize),
) -> ExtentRead {
    ExtentRead {
        at,
        len,
        file_offset: 0,
        disk_bytenr: 0,
        sums: None,
        unwritten: Some((Arc::from(compressed), 0)),
        compressed: Some(CompressedRead {
            compressed: CompressedRef {
                compression,
                compressed_len: compressed.len() as u64,
                ram_bytes,
            },
            disk_len: compressed.len(),
            from: from as usize,
            inline: true,
        }),
    }
}

/// One extent's part of a planned file read ([`FsInfo::plan_data_read`]).
#[derive(Debug)]
pub(crate) struct ExtentRead {
    /// Where in the read's buffer it goes, and how many bytes.
    at: usize,
    len: usize,
    file_offset: u64,
    disk_bytenr: u64,
    /// The recorded checksum of each block; `None` on an image without
    /// data checksums.
    sums: Option<Vec<Option<u32>>>,
    /// The extent's bytes and where this read starts in them, when its
    /// data is not written yet (`Unwritten`): copied, not read.
    unwritten: Option<(Arc<[u8]>, usize)>,
    /// A compressed extent: the whole disk extent is read and verified,
    /// then decompressed, and `len` bytes from `from` are the read's.
    compressed: Option<CompressedRead>,
}

impl ExtentRead {
    /// Where in the read's buffer its bytes go.
    pub(crate) fn span(&self) -> std::ops::Range<usize> {
        self.at..self.at + self.len
    }

    /// Whether the read goes to the device (not an unwritten extent's
    /// bytes in memory).
    pub(crate) fn on_device(&self) -> bool {
        self.unwritten.is_none()
    }

    /// Whether `other` reads the same bytes of the same extent into the
    /// same place: a page planned twice whose reads all agree holds the
    /// same data, as long as the extents were not reused in between
    /// (docs/SNAPSHOTS.md (f) item 5).
    pub(crate) fn same_source(&self, other: &ExtentRead) -> bool {
        let compressed = |r: &ExtentRead| {
            r.compressed
                .as_ref()
                .map(|c| (c.compressed, c.disk_len, c.from))
        };
        (self.at, self.len, self.disk_bytenr) == (other.at, other.len, other.disk_bytenr)
            && compressed(self) == compressed(other)
    }
}

/// The part of an [`ExtentRead`] only a compressed extent has.
#[derive(Debug)]
struct CompressedRead {
    compressed: CompressedRef,
    /// Bytes of the disk extent (`disk_num_bytes`).
    disk_len: usize,
    /// Where the read's bytes start in the decompressed data.
    from: usize,
    /// A compressed inline extent: its bytes are the item's (in
    /// `unwritten`), it has no disk bytenr.
    inline: bool,
}

/// Reads the planned extents of file `ino` into `buf` and verifies each
/// block on a checksum image: a block that fails is never returned; the
/// read fails with [`Error::BadData`], logged with where it is (the caller
/// counts it in `FsStats::data_csum_errors`). Needs no lock: the plan
/// carries everything, and the reader epoch its caller holds keeps the
/// extents from being reused meanwhile.
pub(crate) fn read_planned<Dev: BlockDevice + ?Sized>(
    dev: &Dev,
    ino: u64,
    reads: &[ExtentRead],
    buf: &mut [u8],
) -> Result<()> {
    for read in reads {
        let dst = &mut buf[read.at..read.at + read.len];
        if let Some(c) = &read.compressed {
            read_compressed(dev, ino, read, c, dst)?;
            continue;
        }
        if let Some((bytes, at)) = &read.unwritten {
            dst.copy_from_slice(&bytes[*at..*at + read.len]);
            continue;
        }
        dev.read_at(dst, read.disk_bytenr)?;
        let Some(sums) = &read.sums else {
            continue;
        };
        let Some((i, recorded)) = first_bad_block(dst, sums) else {
            continue;
        };
        let at = i as u64 * SECTOR_SIZE;
        let block = &dst[at as usize..(at + SECTOR_SIZE) as usize];
        let what = format!(
            "inode {ino} file offset {} disk bytenr {}: {}",
            read.file_offset + at,
            read.disk_bytenr + at,
            mismatch(recorded, block)
        );
        eprintln!("birch: data checksum error: {what}");
        return Err(Error::BadData(what));
    }
    Ok(())
}

/// One compressed extent's part of [`read_planned`]: reads the disk extent
/// (or copies it, unwritten), verifies it against its checksums, and
/// decompresses it into `dst`. Damaged compressed data (an algorithm that
/// fails, a length that does not match) is a corruption naming the extent;
/// a checksum mismatch is [`Error::BadData`], as for any extent.
fn read_compressed<Dev: BlockDevice + ?Sized>(
    dev: &Dev,
    ino: u64,
    read: &ExtentRead,
    c: &CompressedRead,
    dst: &mut [u8],
) -> Result<()> {
    let mut disk = vec![0u8; c.disk_len];
    match &read.unwritten {
        Some((bytes, at)) => disk.copy_from_slice(&bytes[*at..*at + c.disk_len]),
        None => dev.read_at(&mut disk, read.disk_bytenr)?,
    }
    let where_ = |what: String| match c.inline {
        true => format!(
            "inode {ino} file offset {} compressed inline extent: {what}",
            read.file_offset
        ),
        false => format!(
            "inode {ino} file offset {} disk bytenr {}: {what}",
            read.file_offset, read.disk_bytenr
        ),
    };
    if let Some(sums) = &read.sums {
        if let Some((i, recorded)) = first_bad_block(&disk, sums) {
            let at = i as u64 * SECTOR_SIZE;
            let block = &disk[at as usize..(at + SECTOR_SIZE) as usize];
            let what = format!(
                "inode {ino} compressed extent at file offset {} disk bytenr {}: {}",
                read.file_offset,
                read.disk_bytenr + at,
                mismatch(recorded, block)
            );
            eprintln!("birch: data checksum error: {what}");
            return Err(Error::BadData(what));
        }
    }
    // The item's decode bounded both lengths (at most MAX_COMPRESSED_RAM,
    // compressed_len within the disk extent; an inline one's at most
    // MAX_INLINE_RAM, its compressed bytes all of the item's).
    let mut ram = vec![0u8; c.compressed.ram_bytes as usize];
    let src = &disk[..c.compressed.compressed_len as usize];
    crate::format::compression::decompress(c.compressed.compression, src, &mut ram).map_err(
        |e| {
            Error::corrupt(Corruption {
                tree: None,
                block: None,
                slot: None,
                reason: where_(format!("compressed data does not decompress: {e}")),
            })
        },
    )?;
    dst.copy_from_slice(&ram[c.from..c.from + dst.len()]);
    Ok(())
}
