//! Operations that move or share a file's extents rather than its bytes:
//! `fallocate` COLLAPSE_RANGE and INSERT_RANGE (the extent items after an
//! offset are re-keyed), and `copy_file_range` as a reflink (the
//! destination's extent items point into the source's data extents, each
//! one a counted reference in the extent tree).
//!
//! Both rely on birch never writing a data extent in place: a later write
//! to either file goes to new space, so shared or moved extents stay what
//! they are. Every operation here drops or re-keys extents, which a fast
//! log cannot express as written ranges, so the next fsync logs the whole
//! extent list (`full_sync`).

use super::decode::decode_item;
use super::page_prefetch::{clone_edge_pages, ReadyPages};
use super::root::RootCtx;
use super::space_info::Need;
use crate::alloc::TransactionSpace;
use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::format::{item_type, DiskRef, FileExtent, Key, Timespec, MAX_FILE_SIZE, SECTOR_SIZE};
use std::ops::ControlFlow;
use std::sync::Arc;

const PAGE: u64 = SECTOR_SIZE;

impl<D: BlockDevice> RootCtx<'_, D> {
    /// Every file extent item of `ino` at or after `from`, in key order.
    fn extents_from(&self, ino: u64, from: u64) -> Result<Vec<(u64, FileExtent)>> {
        let mut out = Vec::new();
        let mut err = None;
        self.fs.forest.scan(
            &self.root.tree,
            Key::new(ino, item_type::EXTENT_DATA, from),
            Key::new(ino, item_type::EXTENT_DATA, u64::MAX),
            &mut |k, d| match decode_item(k, FileExtent::decode_at(k, d)) {
                Ok(e) => {
                    out.push((k.offset, e));
                    Ok(ControlFlow::Continue(()))
                }
                Err(e) => {
                    err = Some(e);
                    Ok(ControlFlow::Break(()))
                }
            },
        )?;
        match err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Moves one extent item from `from` to `to` (its data reference stays).
    fn rekey_extent(&mut self, ino: u64, from: u64, to: u64, extent: &FileExtent) -> Result<()> {
        self.fs.forest.delete(
            &mut self.root.tree,
            &Key::new(ino, item_type::EXTENT_DATA, from),
        )?;
        self.fs.forest.insert(
            &mut self.root.tree,
            Key::new(ino, item_type::EXTENT_DATA, to),
            extent.encode(),
        )
    }

    /// Brings every byte of the file into regular extents: dirty pages are
    /// written back, and an inline extent (only ever a file's one extent)
    /// becomes a regular one, so extents can be moved or shared around it.
    /// Neither writes: both are published as unwritten extents, whose
    /// bytes the next commit or log sync writes without the state lock
    /// (docs/DELALLOC.md, "The seal's writeback", "An inline extent made
    /// regular").
    fn settle_extents(&mut self, ino: u64) -> Result<()> {
        self.settle_dirty_pages(ino)?;
        if matches!(self.extents_overlapping(ino, 0, 1)?.first(), Some((0, e)) if e.is_inline()) {
            // Inline data is in the item: loading the page reads no device
            // (a compressed one is decompressed, a page's CPU work).
            let page = self.load_page(ino, 0)?;
            self.drop_extents(ino, 0, PAGE)?;
            let keep = self.nodes_promised();
            let (bytenr, got) = self.fs.forest.alloc_mut().alloc_data(PAGE, ino, keep)?;
            debug_assert_eq!(got, PAGE);
            // Checksums from the bytes in memory, in this transaction (U2:
            // the commit or log sync that makes the item durable writes
            // the extent before its flush).
            self.fs.record_data_extent(bytenr, &page)?;
            let transid = self.fs.forest.transid();
            self.fs.unwritten.add(bytenr, transid, Arc::from(&page[..]));
            self.fs.stats.inline_reflink_unwritten += 1;
            self.fs.spare_pages.give(page);
            self.insert_file_extent(
                ino,
                0,
                FileExtent::regular(DiskRef {
                    disk_bytenr: bytenr,
                    disk_num_bytes: PAGE,
                    offset: 0,
                    num_bytes: PAGE,
                }),
            )?;
            self.update_inode(ino, |i| i.nbytes += PAGE)?;
        }
        Ok(())
    }

    /// Splits the extent that straddles `at` (if any) into two items, so
    /// that `at` is an extent boundary.
    fn split_extent_at(&mut self, ino: u64, at: u64) -> Result<()> {
        for (file_offset, extent) in self.extents_overlapping(ino, at, at + 1)? {
            if file_offset >= at {
                continue;
            }
            let Some(disk) = extent.disk_ref() else {
                continue;
            };
            let rebuild = |d| extent.with_disk(d);
            self.fs.forest.delete(
                &mut self.root.tree,
                &Key::new(ino, item_type::EXTENT_DATA, file_offset),
            )?;
            self.fs
                .forest
                .alloc_mut()
                .add_data_ref(disk.disk_bytenr, disk.disk_num_bytes, ino, -1);
            let head = DiskRef {
                num_bytes: at - file_offset,
                ..disk
            };
            let tail = DiskRef {
                offset: disk.offset + (at - file_offset),
                num_bytes: disk.num_bytes - (at - file_offset),
                ..disk
            };
            let (head, tail) = (rebuild(head), rebuild(tail));
            // A compressed extent's pieces each count their share of it,
            // rounded up: the two may count more than the whole.
            let grown = head.nbytes() + tail.nbytes() - extent.nbytes();
            self.insert_file_extent(ino, file_offset, head)?;
            self.insert_file_extent(ino, at, tail)?;
            if grown > 0 {
                self.update_inode(ino, |i| i.nbytes += grown)?;
            }
        }
        Ok(())
    }

    /// The EINVAL rules ext4 and xfs apply to COLLAPSE_RANGE and
    /// INSERT_RANGE: block-aligned offset and length, a regular file.
    fn check_shift(&mut self, ino: u64, offset: u64, len: u64) -> Result<u64> {
        self.require_regular(ino)?;
        if !offset.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) || len == 0 {
            return Err(Error::InvalidArgument(
                "collapse/insert range must be block aligned",
            ));
        }
        Ok(self.inode(ino)?.item.size)
    }

    /// What a collapse or insert may add to the reservations: every extent
    /// item after `offset` is copied once, plus a split and the inode;
    /// dirty pages written back first already hold their reservation.
    pub(super) fn shift_need(&mut self, ino: u64, offset: u64) -> Result<Need> {
        self.require_regular(ino)?;
        let n = self.extents_from(ino, offset)?.len() as u64;
        Ok(Need::urgent_items(2 * n + 6).plus_bytes(PAGE))
    }

    /// FALLOC_FL_COLLAPSE_RANGE: `[offset, offset + len)` goes; the data
    /// after it moves down by `len`. The range must end before EOF.
    pub(super) fn collapse_range(&mut self, ino: u64, offset: u64, len: u64) -> Result<()> {
        let size = self.check_shift(ino, offset, len)?;
        let end = offset.checked_add(len).ok_or(Error::FileTooBig)?;
        if end >= size {
            return Err(Error::InvalidArgument("collapse range reaches EOF"));
        }
        self.settle_extents(ino)?;
        self.inode(ino)?.log.full_sync = true;
        self.drop_extents(ino, offset, end)?;
        // Ascending order: each item moves into space already emptied.
        for (file_offset, extent) in self.extents_from(ino, end)? {
            self.rekey_extent(ino, file_offset, file_offset - len, &extent)?;
        }
        let now = Timespec::now();
        self.update_inode(ino, |i| {
            i.size -= len;
            i.mtime = now;
            i.ctime = now;
        })
    }

    /// FALLOC_FL_INSERT_RANGE: a hole of `len` bytes appears at `offset`;
    /// the data from there moves up. The offset must be before EOF.
    pub(super) fn insert_range(&mut self, ino: u64, offset: u64, len: u64) -> Result<()> {
        let size = self.check_shift(ino, offset, len)?;
        if offset >= size {
            return Err(Error::InvalidArgument("insert range at or beyond EOF"));
        }
        if size.checked_add(len).is_none_or(|s| s > MAX_FILE_SIZE) {
            return Err(Error::FileTooBig);
        }
        self.settle_extents(ino)?;
        self.inode(ino)?.log.full_sync = true;
        self.split_extent_at(ino, offset)?;
        // Descending order: each item moves into space already emptied.
        for (file_offset, extent) in self.extents_from(ino, offset)?.into_iter().rev() {
            self.rekey_extent(ino, file_offset, file_offset + len, &extent)?;
        }
        let now = Timespec::now();
        self.update_inode(ino, |i| {
            i.size += len;
            i.mtime = now;
            i.ctime = now;
        })
    }

    /// The checks `copy_file_range` makes before any copying, and the
    /// length it will copy (clamped at the source's EOF).
    pub(crate) fn check_copy(
        &mut self,
        src: u64,
        src_offset: u64,
        dst: u64,
        dst_offset: u64,
        len: u64,
    ) -> Result<u64> {
        self.require_regular(src)?;
        self.require_regular(dst)?;
        let size = self.inode(src)?.item.size;
        let len = len.min(size.saturating_sub(src_offset));
        if len > 0 {
            self.check_write(dst, dst_offset, len)?;
        }
        if src == dst && src_offset < dst_offset + len && dst_offset < src_offset + len {
            return Err(Error::InvalidArgument(
                "copy_file_range within overlapping ranges",
            ));
        }
        Ok(len)
    }

    /// The pages a reflink copies as bytes (see
    /// [`clone_edge_pages`]), of the source and of the destination, for
    /// the length the source's size allows now.
    pub(crate) fn clone_edges(
        &mut self,
        (src, src_offset): (u64, u64),
        (dst, dst_offset): (u64, u64),
        len: u64,
    ) -> Result<(Vec<u64>, Vec<u64>)> {
        let len = self.check_copy(src, src_offset, dst, dst_offset, len)?;
        Ok(clone_edge_pages(src_offset, dst_offset, len))
    }

    /// What a reflink of `[src_offset, src_offset + len)` may add to the
    /// reservations: one destination item per source extent (plus the
    /// ones it replaces), the two partial edge pages, the inodes.
    pub(crate) fn clone_need(&mut self, src: u64, src_offset: u64, len: u64) -> Result<Need> {
        let n = self
            .extents_overlapping(src, src_offset, src_offset + len.max(1))?
            .len() as u64;
        Ok(Need::items(3 * n + 8).plus_bytes(3 * PAGE))
    }

    /// `len` bytes of the file at `offset` (within its size) as they are
    /// now, page by page: a reflink's unaligned edges. Pages on disk come
    /// from `ready` when it has them (read ahead without the state lock).
    fn read_range(
        &mut self,
        ino: u64,
        offset: u64,
        len: u64,
        ready: &ReadyPages,
    ) -> Result<Vec<u8>> {
        let end = offset.checked_add(len).ok_or(Error::FileTooBig)?;
        let mut out = Vec::with_capacity(len as usize);
        let mut at = offset;
        while at < end {
            let index = at / PAGE;
            let to = end.min((index + 1) * PAGE);
            let page = self.load_page_from(ino, index, ready)?;
            out.extend_from_slice(
                &page[(at - index * PAGE) as usize..(to - index * PAGE) as usize],
            );
            self.fs.spare_pages.give(page);
            at = to;
        }
        // A read of the source, as the byte copy's was.
        self.touch_atime(ino)?;
        Ok(out)
    }

    /// `copy_file_range` as a reflink. `src_offset` and `dst_offset` must
    /// lie at the same place within a page (the caller copies bytes
    /// otherwise). Whole pages share the source's data extents; the
    /// partial pages at either end are copied, their disk content taken
    /// from `ready` when it has it. Returns the bytes copied.
    pub(crate) fn clone_range(
        &mut self,
        (src, src_offset): (u64, u64),
        (dst, dst_offset): (u64, u64),
        len: u64,
        ready: &ReadyPages,
    ) -> Result<u64> {
        let len = self.check_copy(src, src_offset, dst, dst_offset, len)?;
        debug_assert_eq!(src_offset % PAGE, dst_offset % PAGE);
        if len == 0 {
            return Ok(0);
        }
        let share_start = src_offset.next_multiple_of(PAGE);
        let share_end = (src_offset + len) / PAGE * PAGE;
        if share_start >= share_end {
            let data = self.read_range(src, src_offset, len, ready)?;
            return self
                .write_file(dst, dst_offset, &data, ready)
                .map(|n| n as u64);
        }
        let shift = |o: u64| o - src_offset + dst_offset;
        // The source's bytes must all be in extents to be shared.
        self.settle_extents(src)?;
        // An inline destination goes out as a regular extent at its next
        // writeback (as for preallocation): no inline beside shared ones.
        if matches!(self.extents_overlapping(dst, 0, 1)?.first(), Some((0, e)) if e.is_inline()) {
            let page = self.load_page(dst, 0)?;
            self.put_dirty_page(dst, 0, page)?;
        }
        let (d0, d1) = (shift(share_start), shift(share_end));
        self.take_dirty_pages(dst, d0 / PAGE..d1 / PAGE)?;
        self.drop_extents(dst, d0, d1)?;
        let mut added = 0;
        for (file_offset, extent) in self.extents_overlapping(src, share_start, share_end)? {
            let from = file_offset.max(share_start);
            let to = (file_offset + extent.len()).min(share_end);
            match extent {
                FileExtent::Regular { .. } | FileExtent::Compressed { .. } => {
                    let disk = extent.disk_ref().expect("regular extent has a disk ref");
                    let shared = extent.with_disk(DiskRef {
                        offset: disk.offset + (from - file_offset),
                        num_bytes: to - from,
                        ..disk
                    });
                    added += shared.nbytes();
                    self.insert_file_extent(dst, shift(from), shared)?;
                }
                // Unwritten space reads as zeros: a hole says the same.
                FileExtent::Prealloc { .. } => {}
                FileExtent::Inline { .. } | FileExtent::InlineCompressed { .. } => {
                    unreachable!("settled source has no inline extent")
                }
            }
        }
        let now = Timespec::now();
        self.update_inode(dst, |i| {
            i.nbytes += added;
            i.size = i.size.max(d1);
            i.mtime = now;
            i.ctime = now;
        })?;
        self.inode(dst)?.log.full_sync = true;
        // The partial pages at either end are copied as bytes.
        if src_offset < share_start {
            let head = self.read_range(src, src_offset, share_start - src_offset, ready)?;
            self.write_file(dst, dst_offset, &head, ready)?;
        }
        if share_end < src_offset + len {
            let tail = self.read_range(src, share_end, src_offset + len - share_end, ready)?;
            self.write_file(dst, d1, &tail, ready)?;
        }
        Ok(len)
    }
}
